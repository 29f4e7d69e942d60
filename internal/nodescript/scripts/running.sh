# kubelift node script: running
# Prints the first line of `--version` of the program UNIT's main process
# runs now; nothing when the unit does not run.
# Arguments: UNIT
set -eu
pid=$(systemctl show "$1" -p MainPID 2>/dev/null | sed -n 's/^MainPID=//p')
if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -e "/proc/$pid/exe" ]; then
  "/proc/$pid/exe" --version 2>&1 | head -n 1
fi
