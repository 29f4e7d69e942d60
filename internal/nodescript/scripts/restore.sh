# kubelift node script: restore
# Puts the backed-up binary back over BINARY (atomic), and, given the
# kubelet's root directory, removes the hash-skip file and puts back the
# checkpoint files backed up (the hash-skip file among them when an
# earlier upgrade had left one); then restarts UNIT.
# Arguments: BACKUP_DIR BINARY UNIT [KUBELET_ROOT HASH_SKIP_FILE CHECKPOINT...]
set -eu
b=$1
bin=$2
unit=$3
shift 3
tmp=$(dirname "$bin")/.$unit.kubelift-old
cp -p "$b/$unit" "$tmp"
mv -f "$tmp" "$bin"
if [ $# -gt 0 ]; then
  root=$1
  skip=$2
  shift 2
  rm -f "$root/$skip"
  for f in "$@"; do
    if [ -f "$b/$f" ]; then
      cp -p "$b/$f" "$root/$f.kubelift-old"
      mv -f "$root/$f.kubelift-old" "$root/$f"
    fi
  done
fi
systemctl restart "$unit"
