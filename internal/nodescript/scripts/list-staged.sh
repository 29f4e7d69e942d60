# kubelift node script: list-staged
# Prints "SHA256  NAME" for each file staged in VERSION_DIR (nothing when
# there is none), so that staging skips what is already there: the sum
# staging wrote beside the file after checking it (.NAME.kubelift-sum),
# while the file is no newer than that; else the file hashed now (swap
# checks the sum again before it installs a file, and kubeadm's before it
# runs). Files named other than [A-Za-z0-9._-] and files that cannot be
# read are left out (staged again). Then, on
# lines of their own, what staging may use on this node:
#   ### partial NAME.SHA256 BYTES  what a stage that was cut off left
#                           of a file
#   ### zstd yes|no         whether zstd can decompress here
#   ### curl yes|no         whether curl can fetch from a registry here
#   ### registry CODE       the HTTP status of REGISTRY_URL/v2/ as this
#                           node sees it (000: not reachable), when given
# Arguments: VERSION_DIR [REGISTRY_URL REGISTRY_HOST]
set -u
export LC_ALL=C
if [ -d "$1" ]; then
  for f in "$1"/*; do
    [ -f "$f" ] || continue
    case ${f##*/} in *[!A-Za-z0-9._-]*) continue ;; esac
    s="$1/.${f##*/}.kubelift-sum" sum=
    if [ -f "$s" ] && [ -n "$(find "$f" ! -newer "$s" 2>/dev/null)" ]; then sum=$(cat "$s"); fi
    case $sum in *[!0-9a-f]*) sum= ;; esac
    [ "${#sum}" -eq 64 ] || sum=$(sha256sum <"$f" 2>/dev/null | cut -d ' ' -f 1)
    [ "${#sum}" -eq 64 ] && printf '%s  %s\n' "$sum" "${f##*/}"
  done
  for p in "$1"/.*.kubelift-partial; do
    [ -f "$p" ] || continue
    n=${p##*/.}
    printf '### partial %s %s\n' "${n%.kubelift-partial}" "$(wc -c <"$p" | tr -d ' ')"
  done
fi
if command -v zstd >/dev/null 2>&1; then echo '### zstd yes'; else echo '### zstd no'; fi
if command -v curl >/dev/null 2>&1; then echo '### curl yes'; else echo '### curl no'; fi
if [ $# -ge 3 ] && command -v curl >/dev/null 2>&1; then
  set -- "$2" "$3"
  ca=
  for f in "/etc/containerd/certs.d/$2/ca.crt" "/etc/docker/certs.d/$2/ca.crt"; do
    if [ -f "$f" ]; then ca=$f; break; fi
  done
  if [ -n "$ca" ]; then
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 --cacert "$ca" "$1/v2/" 2>/dev/null || true)
  else
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "$1/v2/" 2>/dev/null || true)
  fi
  printf '### registry %s\n' "${code:-000}"
fi
true
