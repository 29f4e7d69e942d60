# kubelift node script: exists
# Prints yes when FILE exists, else no.
# Arguments: FILE
set -eu
if [ -e "$1" ]; then echo yes; else echo no; fi
