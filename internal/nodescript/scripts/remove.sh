# kubelift node script: remove
# Removes FILE (nothing when it is not there).
# Arguments: FILE
set -eu
rm -f "$1"
