# kubelift node script: backup
# Copies a component's binary to BACKUP_DIR/NAME once, when it runs
# version FROM (exit 66 when it runs another: that is not the old binary),
# and, given the kubelet's root directory, its checkpoint files too.
# Arguments: BACKUP_DIR NAME BINARY FROM [KUBELET_ROOT CHECKPOINT...]
set -eu
b=$1
name=$2
bin=$3
from=$4
shift 4
mkdir -p "$b"
if [ ! -e "$b/$name" ]; then
  v=$("$bin" --version 2>&1 | head -n 1)
  case "$v" in
    *" $from") ;;
    *) echo "$bin is $v, not $from: no backup of the old binary can be taken" >&2; exit 66 ;;
  esac
  cp -p "$bin" "$b/.$name.partial"
  mv -f "$b/.$name.partial" "$b/$name"
fi
if [ $# -gt 0 ]; then
  root=$1
  shift
  for f in "$@"; do
    if [ -f "$root/$f" ] && [ ! -e "$b/$f" ]; then
      cp -p "$root/$f" "$b/.$f.partial"
      mv -f "$b/.$f.partial" "$b/$f"
    fi
  done
fi
