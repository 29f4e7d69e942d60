# kubelift node script: kubeadm-etcd-snapshot
# Saves a snapshot of a kubeadm cluster's local etcd (a static pod) to
# SNAPSHOT: etcdctl runs inside the running etcd container with kubeadm's
# health-check client certificate from CERT_DIR, writes into etcd's data
# directory DATA_DIR (the one mount the container and the node share),
# and the snapshot is moved from there into place.
# Arguments: SNAPSHOT DATA_DIR CERT_DIR
set -eu
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
snap=$1
data=$2
pki=$3
id=$(crictl ps --name '^etcd$' --state running -q | head -n 1)
if [ -z "$id" ]; then
  echo "no running etcd container (crictl ps --name etcd)" >&2
  exit 1
fi
tmp=$data/kubelift-snapshot.db
rm -f "$tmp" "$tmp.part"
crictl exec "$id" etcdctl --endpoints=https://127.0.0.1:2379 --cacert="$pki/ca.crt" \
  --cert="$pki/healthcheck-client.crt" --key="$pki/healthcheck-client.key" snapshot save "$tmp" >&2
mkdir -p "$(dirname "$snap")"
mv "$tmp" "$snap.partial"
mv "$snap.partial" "$snap"
