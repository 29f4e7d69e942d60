# kubelift node script: put-file
# Writes standard input to FILE with permission MODE (octal, no setuid,
# setgid or sticky bit), atomically: a temporary file beside it (its
# directory made where missing), synced, then renamed over it (agent
# mode's upload of a small file: a kubeadm UpgradeConfiguration).
# Arguments: FILE MODE
set -eu
case "$2" in
  [0-7][0-7][0-7] | 0[0-7][0-7][0-7]) ;;
  *) echo "mode $2: want 3 octal digits (no setuid, setgid or sticky bit)" >&2; exit 64 ;;
esac
if [ -d "$1" ]; then
  echo "$1 is a directory" >&2
  exit 65
fi
dir=$(dirname -- "$1")
mkdir -p -- "$dir"
tmp=$(mktemp -- "$1.kubelift-XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
# dash runs no EXIT trap on a signal (timeout's TERM at the deadline)
trap 'exit 143' TERM INT HUP
cat >"$tmp"
chmod -- "$2" "$tmp"
sync -- "$tmp" 2>/dev/null || sync
mv -f -- "$tmp" "$1"
trap - EXIT TERM INT HUP
sync -- "$dir" 2>/dev/null || true
