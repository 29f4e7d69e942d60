# kubelift node script: list-staged
# Prints "SHA256  NAME" for each file staged in VERSION_DIR (nothing when
# there is none), so that staging skips what is already there.
# Arguments: VERSION_DIR
set -u
if [ -d "$1" ]; then (cd "$1" && sha256sum -- * 2>/dev/null); fi
true
