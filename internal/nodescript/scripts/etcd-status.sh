# kubelift node script: etcd-status
# Prints what each etcd member says of itself (etcdctl endpoint status,
# JSON), asked with ETCDCTL, each member bounded to 5 s, with the API
# server's own client certificates (each may be empty: not given). A
# member that does not answer is left out of the JSON, and says why on
# stderr: the caller compares the answers with the members it knows.
# Arguments: ETCDCTL ENDPOINTS CACERT CERT KEY
set -eu
etcdctl=$1
endpoints=$2
ca=$3
cert=$4
key=$5
set -- --endpoints="$endpoints" --dial-timeout=3s --command-timeout=5s -w json
[ -z "$ca" ] || set -- "$@" --cacert="$ca"
[ -z "$cert" ] || set -- "$@" --cert="$cert"
[ -z "$key" ] || set -- "$@" --key="$key"
ETCDCTL_API=3 "$etcdctl" "$@" endpoint status || true
