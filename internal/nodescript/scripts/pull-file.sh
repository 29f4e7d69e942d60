# kubelift node script: pull-file
# Fetches a file from the private registry itself (the blob at URL, as
# the registry serves a layer, with the Authorization header read from
# stdin; the registry's CA is the one the node's containerd or docker
# trusts for REGISTRY_HOST, else the system's), to a temporary name in
# VERSION_DIR, going on from what a cut-off pull left there; then checks
# its size and sha256 against the signed ones and renames it to NAME. A
# file cut short stays (exit 75); one that is whole but wrong is removed
# (exit 65); a registry the node cannot reach exits 69, one that
# answers with an error 66.
# Arguments: VERSION_DIR NAME SHA256 SIZE URL REGISTRY_HOST
set -eu
umask 022
dir=$1
dst=$1/$2
tmp=$1/.$2.kubelift-partial
want=$3
size=$4
url=$5
host=$6
mkdir -p "$dir"
set --
for f in "/etc/containerd/certs.d/$host/ca.crt" "/etc/docker/certs.d/$host/ca.crt"; do
  if [ -f "$f" ]; then set -- --cacert "$f"; break; fi
done
have=0
if [ -f "$tmp" ]; then have=$(wc -c <"$tmp" | tr -d ' '); fi
if [ "$have" -gt "$size" ]; then rm -f "$tmp"; have=0; fi
if [ "$have" -lt "$size" ]; then
  rc=0
  curl -fsSL --connect-timeout 10 -H @- -C - -o "$tmp" "$@" "$url" || rc=$?
  case $rc in
  0) ;;
  6|7|28|35|51|52|55|56|60|77) echo "curl exit $rc: the registry cannot be reached (or is not trusted) from this node" >&2; exit 69 ;;
  22) echo "the registry refused $url (curl exit 22: an HTTP error)" >&2; exit 66 ;;
  *) echo "curl exit $rc fetching $url" >&2; exit 75 ;;
  esac
fi
got=$(wc -c <"$tmp" | tr -d ' ')
if [ "$got" -lt "$size" ]; then echo "cut off at $got of $size bytes: the next stage goes on from there" >&2; exit 75; fi
sum=$(sha256sum <"$tmp" | cut -d ' ' -f 1)
if [ "$sum" != "$want" ]; then rm -f "$tmp"; echo "sha256 $sum on the node, signed $want" >&2; exit 65; fi
chmod 0755 "$tmp"
mv -f "$tmp" "$dst"
