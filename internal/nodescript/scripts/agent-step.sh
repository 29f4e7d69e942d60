# kubelift node script: agent-step
# Runs one agent-mode step on the host, as the transient unit its agent
# started (docs/agent-mode.md), from the copy DIR/step the agent wrote
# beside the step: DIR/cmd, the step's node script command,
# with DIR/stdin as its standard input, bounded by DEADLINE seconds
# (timeout: exit 124; 137 where it did not stop on TERM and was killed
# 10 s later), its standard output and
# error in DIR/out and DIR/err. DIR/began is written first, and the exit
# status last, into DIR/rc by rename: an agent (this one, or the next
# after a restart) reads a whole result or none, and tells a step that
# never began from one whose unit ended without a result.
# Arguments: DIR DEADLINE
set -u
d=$1
: >"$d/began"
rc=0
timeout -k 10 "$2" sh "$d/cmd" <"$d/stdin" >"$d/out" 2>"$d/err" || rc=$?
printf '%s\n' "$rc" >"$d/rc.tmp"
# On disk before rc names them: after a host crash, an rc beside an
# output cut short would be a result that lies.
sync "$d/out" "$d/err" "$d/rc.tmp" 2>/dev/null || sync
mv -f "$d/rc.tmp" "$d/rc"
