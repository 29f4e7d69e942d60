# kubelift node script: kubeadm-manifests
# Prints the static pod manifests NAME.yaml of MANIFESTS and of the
# newest 20 backups kubeadm made under TMP (kubeadm-backup-manifests-*,
# newest first, by the time in their names), each as a line "file PATH"
# and then a line of its content in base64; a file over 1 MiB is named
# with "toolarge" instead.
# Arguments: MANIFESTS TMP NAME...
set -eu
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
manifests=$1
tmp=$2
shift 2
show() {
  for name in "$@"; do
    f=$dir/$name.yaml
    [ -f "$f" ] || continue
    if [ "$(wc -c <"$f")" -gt 1048576 ]; then
      printf 'toolarge %s\n' "$f"
      continue
    fi
    printf 'file %s\n' "$f"
    base64 -w0 <"$f"
    echo
  done
}
dir=$manifests
show "$@"
if [ -d "$tmp" ]; then
  find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'kubeadm-backup-manifests-*' | sort -r | head -n 20 |
    while IFS= read -r dir; do
      show "$@"
    done
fi
