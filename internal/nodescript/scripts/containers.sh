# kubelift node script: containers
# Prints the runtime's containers as JSON.
# Arguments: none
set -eu
crictl ps -o json
