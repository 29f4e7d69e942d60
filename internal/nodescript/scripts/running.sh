# kubelift node script: running
# Prints the first line of `--version` of the program UNIT's main process
# runs now, and on a second line "pid PID"; nothing when the unit does
# not run, or when its main process
# changed or ended while the version was read (a unit restarting, or
# crash-looping, is not running: its exiting process's answer is not a
# version).
# Arguments: UNIT
set -eu
main_pid() {
  systemctl show "$1" -p MainPID 2>/dev/null | sed -n 's/^MainPID=//p'
}
pid=$(main_pid "$1")
if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -e "/proc/$pid/exe" ]; then
  v=$("/proc/$pid/exe" --version 2>&1 | head -n 1)
  if [ "$(main_pid "$1")" = "$pid" ] && [ -e "/proc/$pid/exe" ]; then
    printf '%s\npid %s\n' "$v" "$pid"
  fi
fi
