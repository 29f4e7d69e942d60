# kubelift node script: pull-file
# Fetches a file from the private registry itself: the blob at URL, as
# the registry serves a layer, with the Authorization header read from
# stdin; the registry's CA is the one the node's containerd or docker
# trusts for REGISTRY_HOST, else the system's. The blob is the file
# (CODEC none) or its zstd copy (CODEC zstd, BLOB_SIZE bytes), fetched
# to a temporary name in VERSION_DIR, one per blob, going on from what a
# cut-off pull left there (from the start when the registry cannot serve
# the rest), and decoded, no further than about SIZE bytes (ulimit -f).
# The file's size and sha256
# are checked against the signed ones before it is renamed to NAME. A
# blob cut short stays (exit 75); a file that is whole but wrong is
# removed (exit 65); a registry the node cannot reach exits 69, one that
# answers with an error 66.
# Arguments: VERSION_DIR NAME SHA256 SIZE URL REGISTRY_HOST CODEC BLOB_SIZE
set -eu
umask 022
dir=$1
dst=$1/$2
want=$3
tmp=$1/.$2.$want.kubelift-partial
sumfile=$1/.$2.kubelift-sum
size=$4
url=$5
host=$6
codec=$7
blobsize=$8
case $codec in
none) blob=$tmp ;;
zstd) blob=$tmp.zst ;;
*) echo "unknown codec $codec" >&2; exit 64 ;;
esac
# sha256 of the file $1: OpenSSL's where the node has it (it uses the
# CPU's SHA instructions: several times coreutils' speed), else sha256sum's.
sha256_of() {
  s=$(openssl dgst -sha256 -r <"$1" 2>/dev/null | cut -d ' ' -f 1) || s=
  case $s in *[!0-9a-f]*) s= ;; esac
  if [ "${#s}" -ne 64 ]; then s=$(sha256sum <"$1" | cut -d ' ' -f 1); fi
  printf '%s\n' "$s"
}
# Staging is background work: the node's workloads come first. This
# process and what it starts (the decoder, the sums) take the lowest CPU
# priority and the lowest best-effort I/O level: they slow only while
# something else wants the machine. Where the kernel groups the CPU by
# session (autogroup: a root-cgroup session weighs as much as a cgroup
# of pods), the session takes nice 19 too, when it is this script's own
# (an SSH session's: its leader is this shell or its parent), never a
# caller's. A node without the tools or the rights stages as before.
yield_to_workloads() {
  renice -n 19 -p $$ >/dev/null 2>&1 || :
  ionice -c 2 -n 7 -p $$ >/dev/null 2>&1 || :
  sid=$(cut -d ' ' -f 6 "/proc/$$/stat" 2>/dev/null) || sid=
  if [ -n "$sid" ] && { [ "$sid" = "$$" ] || [ "$sid" = "$PPID" ]; }; then
    { echo 19 >/proc/self/autogroup; } 2>/dev/null || :
  fi
}
yield_to_workloads
mkdir -p "$dir"
hdr=$(cat)
set --
for f in "/etc/containerd/certs.d/$host/ca.crt" "/etc/docker/certs.d/$host/ca.crt"; do
  if [ -f "$f" ]; then set -- --cacert "$f"; break; fi
done
# The blob is never let grow past its recorded size (a registry may serve
# more): curl refuses a larger announced length (--max-filesize, exit 63),
# and the file size limit stops one that is not announced.
fetch() {
  rc=0
  printf '%s\n' "$hdr" | (ulimit -f "$((blobsize / 512 + 1))" 2>/dev/null || :
    exec curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 --max-filesize "$blobsize" -H @- -C - -o "$blob" "$@" "$url") || rc=$?
}
have=0
if [ -f "$blob" ]; then have=$(wc -c <"$blob" | tr -d ' '); fi
if [ "$have" -gt "$blobsize" ]; then rm -f "$blob"; have=0; fi
if [ "$have" -lt "$blobsize" ]; then
  fetch "$@"
  if [ "$rc" = 33 ] || { [ "$rc" = 22 ] && [ "$have" -gt 0 ]; }; then
    # The registry cannot serve the rest: from the start, once.
    rm -f "$blob"
    fetch "$@"
  fi
  if [ -f "$blob" ] && [ "$(wc -c <"$blob" | tr -d ' ')" -gt "$blobsize" ]; then
    rm -f "$blob"; echo "$url: more than the $blobsize bytes recorded" >&2; exit 65
  fi
  case $rc in
  0) ;;
  6|7|28|35|51|60|77) echo "curl exit $rc: the registry cannot be reached (or is not trusted) from this node" >&2; exit 69 ;;
  22) echo "the registry refused $url (curl exit 22: an HTTP error)" >&2; exit 66 ;;
  63) rm -f "$blob"; echo "$url: larger than the $blobsize bytes recorded (curl exit 63)" >&2; exit 65 ;;
  *) echo "curl exit $rc fetching $url: cut off, the next stage goes on" >&2; exit 75 ;;
  esac
fi
got=$(wc -c <"$blob" | tr -d ' ')
if [ "$got" -lt "$blobsize" ]; then echo "cut off at $got of $blobsize bytes: the next stage goes on from there" >&2; exit 75; fi
if [ "$got" -gt "$blobsize" ]; then rm -f "$blob"; echo "$url: $got bytes, $blobsize recorded" >&2; exit 65; fi
if [ "$codec" = zstd ]; then
  (ulimit -f "$((size / 512 + 2))" 2>/dev/null || :; exec zstd -dcq "$blob") >"$tmp" || true
  rm -f "$blob"
fi
got=$(wc -c <"$tmp" | tr -d ' ')
sum=$(sha256_of "$tmp")
# A file is refused (and removed) only when sha256sum agrees: OpenSSL's
# sum alone may accept one.
if [ "$sum" != "$want" ]; then sum=$(sha256sum <"$tmp" | cut -d ' ' -f 1); fi
if [ "$got" != "$size" ] || [ "$sum" != "$want" ]; then rm -f "$tmp"; echo "sha256 $sum ($got bytes) on the node, signed $want ($size bytes)" >&2; exit 65; fi
chmod 0755 "$tmp"
mv -f "$tmp" "$dst"
# The checked sum beside it, for list-staged (written after the file, so
# no newer file can pass for this one).
printf '%s\n' "$want" >"$tmp.sum"
mv -f "$tmp.sum" "$sumfile"
