# kubelift node script: tools-restore
# Puts back what tools-swap backed up in BACKUP_DIR (its tools-files
# list: cni/NAME into the CNI directory, crictl over crictl, where
# tools-paths says tools-swap found them), each renamed into place
# (atomic), and removes the programs it added (tools-added). Without the
# list, tools-swap changed nothing and nothing is put back ("nothing to
# restore"). Nothing restarts.
# Arguments: BACKUP_DIR
set -eu
b=$1
if [ ! -f "$b/tools-files" ]; then
  echo "nothing to restore"
  exit 0
fi
cnidir=$(sed -n 's/^cni //p' "$b/tools-paths" 2>/dev/null || :)
crictlbin=$(sed -n 's/^crictl //p' "$b/tools-paths" 2>/dev/null || :)
case "$cnidir" in /*) ;; *)
  echo "$b/tools-paths names no CNI directory (cni /PATH)" >&2
  exit 65
  ;;
esac
case "$crictlbin" in /*) ;; *)
  echo "$b/tools-paths names no crictl (crictl /PATH)" >&2
  exit 65
  ;;
esac
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
