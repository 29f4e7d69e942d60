# kubelift node script: stage-file
# Reads a file's bytes from OFFSET on, encoded with CODEC (zstd, gzip or
# none), on stdin and writes them to a temporary name in VERSION_DIR, one
# per file and sha256 (appending to what a stage cut off left there when
# OFFSET is not 0), writing no further than about SIZE bytes (ulimit -f:
# a stream that decodes to more is cut there); checks the whole file's
# size and sha256 against the signed ones and renames it to NAME: readers
# see no file or the whole one. A file cut short stays for the next stage
# to go on from (exit 75); one that is whole but wrong is removed (exit
# 65).
# Arguments: VERSION_DIR NAME SHA256 SIZE CODEC OFFSET
set -eu
umask 022
dir=$1
dst=$1/$2
want=$3
tmp=$1/.$2.$want.kubelift-partial
sumfile=$1/.$2.kubelift-sum
size=$4
codec=$5
offset=$6
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
if [ "$offset" = 0 ]; then
  : >"$tmp"
elif [ ! -f "$tmp" ] || [ "$(wc -c <"$tmp" | tr -d ' ')" != "$offset" ]; then
  echo "$tmp is not $offset bytes long: stage again from the start" >&2
  rm -f "$tmp"
  exit 75
fi
blocks=$((size / 512 + 2))
case $codec in
zstd) (ulimit -f "$blocks" 2>/dev/null || :; exec zstd -dcq) >>"$tmp" || true ;;
gzip) (ulimit -f "$blocks" 2>/dev/null || :; exec gzip -dc) >>"$tmp" || true ;;
none) (ulimit -f "$blocks" 2>/dev/null || :; exec cat) >>"$tmp" || true ;;
*) echo "unknown codec $codec" >&2; exit 64 ;;
esac
got=$(wc -c <"$tmp" | tr -d ' ')
if [ "$got" -lt "$size" ]; then echo "cut off at $got of $size bytes: the next stage goes on from there" >&2; exit 75; fi
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
