# kubelift node script: stage-file
# Reads a gzip stream on stdin, writes it to a temporary name in
# VERSION_DIR, checks its sha256 against the signed one (exit 65 when it
# differs) and renames it to NAME: readers see no file or the whole one.
# Arguments: VERSION_DIR NAME SHA256
set -eu
umask 022
dir=$1
dst=$1/$2
tmp=$1/.$2.kubelift-partial
want=$3
mkdir -p "$dir"
trap 'rm -f "$tmp"' EXIT
sum=$(gzip -dc | tee "$tmp" | sha256sum | cut -d ' ' -f 1)
[ -n "$sum" ]
if [ "$sum" != "$want" ]; then echo "sha256 $sum on the node, signed $want" >&2; exit 65; fi
chmod 0755 "$tmp"
mv -f "$tmp" "$dst"
trap - EXIT
