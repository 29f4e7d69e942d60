# kubelift node script: kubeadm-restore-manifest
# Puts the static pod manifest BACKUP (one kubeadm kept) in place of
# MANIFEST: MANIFEST is first copied into KEEP (made, 0700), then BACKUP
# copied beside MANIFEST under a hidden name (the kubelet ignores files
# that start with a dot) and renamed over it, so the kubelet sees the old
# manifest or the restored one, never half a file.
# Arguments: BACKUP MANIFEST KEEP
set -eu
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
backup=$1
manifest=$2
keep=$3
[ -f "$backup" ] || { echo "no manifest at $backup" >&2; exit 1; }
mkdir -p "$keep"
chmod 700 "$keep"
if [ -f "$manifest" ] && [ ! -f "$keep/$(basename "$manifest")" ]; then
  cp -p "$manifest" "$keep/"
fi
tmp=$(dirname "$manifest")/.$(basename "$manifest").kubelift-tmp
cp "$backup" "$tmp"
mv -f "$tmp" "$manifest"
