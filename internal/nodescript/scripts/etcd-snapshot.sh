# kubelift node script: etcd-snapshot
# Saves an etcd snapshot to SNAPSHOT with the API server's own etcd
# endpoint and client certificates (each may be empty: not given).
# Arguments: SNAPSHOT ENDPOINT CACERT CERT KEY
set -eu
snap=$1
endpoint=$2
ca=$3
cert=$4
key=$5
mkdir -p "$(dirname "$snap")"
set -- --endpoints="$endpoint"
[ -z "$ca" ] || set -- "$@" --cacert="$ca"
[ -z "$cert" ] || set -- "$@" --cert="$cert"
[ -z "$key" ] || set -- "$@" --key="$key"
ETCDCTL_API=3 etcdctl "$@" snapshot save "$snap" >&2
