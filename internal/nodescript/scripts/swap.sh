# kubelift node script: swap
# Checks the staged binary's sha256 once more, copies it beside BINARY and
# renames it over BINARY (atomic), then restarts UNIT, printing how long
# the restart took by the node's clock ("### restart BEGAN ENDED", its
# uptime in seconds before and after: the old process's stop is the
# component's, not kubelift's, time).
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
began=$(cut -d ' ' -f 1 /proc/uptime 2>/dev/null || :)
systemctl restart "$unit"
ended=$(cut -d ' ' -f 1 /proc/uptime 2>/dev/null || :)
if [ -n "$began" ] && [ -n "$ended" ]; then echo "### restart $began $ended"; fi
