# kubelift node script: backup
# Copies a component's binary to BACKUP_DIR/NAME once, when it runs
# version FROM (exit 66 when it runs another: that is not the old binary),
# and, given the kubelet's root directory, the files named after it (its
# checkpoint files, an earlier upgrade's hash-skip file) first: those are
# taken only by the call that takes the binary, so a resumed run never
# takes for old what the run before it wrote.
# Arguments: BACKUP_DIR NAME BINARY FROM [KUBELET_ROOT FILE...]
set -eu
b=$1
name=$2
bin=$3
from=$4
shift 4
mkdir -p "$b"
if [ -e "$b/$name" ]; then
  exit 0
fi
v=$("$bin" --version 2>&1 | head -n 1)
case "$v" in
  *" $from") ;;
  *) echo "$bin is $v, not $from: no backup of the old binary can be taken" >&2; exit 66 ;;
esac
if [ $# -gt 0 ]; then
  root=$1
  shift
  for f in "$@"; do
    rm -f "$b/$f"
    if [ -f "$root/$f" ]; then
      cp -p "$root/$f" "$b/.$f.partial"
      mv -f "$b/.$f.partial" "$b/$f"
    fi
  done
fi
cp -p "$bin" "$b/.$name.partial"
mv -f "$b/.$name.partial" "$b/$name"
