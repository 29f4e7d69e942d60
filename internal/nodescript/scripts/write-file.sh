# kubelift node script: write-file
# Writes CONTENT and a newline to FILE atomically (a temporary file
# renamed over it).
# Arguments: FILE CONTENT
set -eu
printf '%s\n' "$2" >"$1.kubelift-tmp"
mv -f "$1.kubelift-tmp" "$1"
