# kubelift node script: put-file
# Writes standard input to FILE with permission MODE (octal), atomically:
# a temporary file beside it, synced, then renamed over it (agent mode's
# upload of a small file, a kubeadm UpgradeConfiguration).
# Arguments: FILE MODE
set -eu
case "$2" in
  [0-7][0-7][0-7] | [0-7][0-7][0-7][0-7]) ;;
  *) echo "mode $2: want octal digits" >&2; exit 64 ;;
esac
tmp="$1.kubelift-tmp"
rm -f "$tmp"
(umask 077 && cat >"$tmp")
chmod "$2" "$tmp"
sync "$tmp" 2>/dev/null || sync
mv -f "$tmp" "$1"
