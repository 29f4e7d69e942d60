# kubelift node script: installed
# Prints the first line of `--version` of PROGRAM, the program a unit
# starts; nothing when there is none. (A unit that does not run still
# has a program: rollback reads it to tell whether it moved.)
# Arguments: PROGRAM
set -eu
if [ -f "$1" ] && [ -x "$1" ]; then
  "$1" --version 2>&1 | head -n 1
fi
