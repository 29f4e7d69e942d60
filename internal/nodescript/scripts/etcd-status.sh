# kubelift node script: etcd-status
# Prints the cluster's members as the cluster lists them (etcdctl member
# list, JSON, after "### members") and what each member at ENDPOINTS says
# of itself (etcdctl endpoint status, JSON, after "### status"), asked
# with ETCDCTL, each bounded to 5 s, with the API server's own client
# certificates (each may be empty: not given). A member that does not
# answer is left out, and says why on stderr: the caller compares the
# answers with the members the cluster lists.
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
echo '### members'
ETCDCTL_API=3 "$etcdctl" "$@" member list || true
echo '### status'
ETCDCTL_API=3 "$etcdctl" "$@" endpoint status || true
