# kubelift node script: swap
# Checks the staged binary's sha256 once more, copies it beside BINARY and
# renames it over BINARY (atomic), then restarts UNIT.
# Arguments: STAGED SHA256 BINARY UNIT
set -eu
staged=$1
sum=$2
bin=$3
unit=$4
tmp=$(dirname "$bin")/.$unit.kubelift-new
echo "$sum  $staged" | sha256sum -c --quiet - >&2
cp "$staged" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$bin"
systemctl restart "$unit"
