# kubelift node script: read-file
# Prints FILE whole to standard output: a node's file kubelift keeps a
# copy of elsewhere (the etcd snapshot, copied off the node it protects).
# Arguments: FILE
set -eu
exec cat -- "$1"
