# kubelift node script: tools-restore
# Puts back what tools-swap backed up in BACKUP_DIR (its tools-files
# list: cni/NAME into CNI_DIR, crictl over CRICTL), each renamed into
# place (atomic), and removes the programs it added (tools-added).
# Without the list, tools-swap changed nothing and nothing is put back
# ("nothing to restore"). Nothing restarts.
# Arguments: BACKUP_DIR CNI_DIR CRICTL
set -eu
b=$1
cnidir=$2
crictlbin=$3
if [ ! -f "$b/tools-files" ]; then
  echo "nothing to restore"
  exit 0
fi
# to NAME: where the listed NAME lives on the node.
to() {
  case "$1" in
    crictl) echo "$crictlbin" ;;
    cni/*/* | cni/.* | cni/) return 1 ;;
    cni/*) echo "$cnidir/${1#cni/}" ;;
    *) return 1 ;;
  esac
}
while IFS= read -r n; do
  if ! t=$(to "$n"); then
    echo "$b/tools-files lists $n" >&2
    exit 65
  fi
  cp -p "$b/$n" "$t.kubelift-old"
  mv -f "$t.kubelift-old" "$t"
done <"$b/tools-files"
while IFS= read -r n; do
  if ! t=$(to "$n"); then
    echo "$b/tools-added lists $n" >&2
    exit 65
  fi
  rm -f "$t"
done <"$b/tools-added"
