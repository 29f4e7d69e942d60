# kubelift node script: etcd-swap
# Moves the node's etcd member to the bundle's etcd: checks the staged
# release archive's sha256 (exit 65), unpacks it beside the programs in
# PROGRAM_DIR (etcd's archive holds etcd-vX.Y.Z-linux-ARCH/ with etcd,
# etcdctl and etcdutl), backs up into BACKUP_DIR each of those programs
# the node has that no earlier run backed up (listed in
# BACKUP_DIR/etcd-files, written last, whole; the ones it adds in
# etcd-added), renames each new program over the old one (atomic) and
# has UNIT restarted without waiting for it (--no-block: a member with a
# large database may take longer to start than a node command may run;
# the engine waits for it to answer, --ready-timeout). etcd stops
# gracefully on the restart's SIGTERM: a leader hands its leadership to a
# peer first. A run cut off at any point runs
# again to the same end; what was backed up first is kept, so
# etcd-restore puts back what the node had before the first.
# Arguments: BACKUP_DIR ARCHIVE SHA256 PROGRAM_DIR UNIT
set -eu
b=$1
archive=$2
sum=$3
dir=$4
unit=$5
if ! echo "$sum  $archive" | sha256sum -c --quiet - >&2; then
  echo "$archive is not the staged archive the bundle signed" >&2
  exit 65
fi
new=$dir/.kubelift-etcd
rm -rf "$new"
mkdir -p "$new" "$b"
trap 'rm -rf "$new"' EXIT
tar -xzf "$archive" -C "$new" --strip-components=1 --no-same-owner
if [ ! -f "$new/etcd" ] || [ ! -x "$new/etcd" ]; then
  echo "$archive holds no etcd program" >&2
  exit 65
fi
# Each command on a line of its own: set -e does not stop at a failing
# command left of && (a backup that could not be written must stop the
# swap before the only copy of the old program is renamed over).
if [ ! -f "$b/etcd-files" ]; then
  : >"$b/.etcd-files"
  : >"$b/.etcd-added"
  for p in etcd etcdctl etcdutl; do
    [ -f "$new/$p" ] || continue
    if [ -f "$dir/$p" ]; then
      cp -p "$dir/$p" "$b/.$p.tmp"
      mv -f "$b/.$p.tmp" "$b/$p"
      echo "$p" >>"$b/.etcd-files"
    else
      echo "$p" >>"$b/.etcd-added"
    fi
  done
  mv -f "$b/.etcd-added" "$b/etcd-added"
  mv -f "$b/.etcd-files" "$b/etcd-files"
fi
for p in etcd etcdctl etcdutl; do
  [ -f "$new/$p" ] || continue
  chmod 0755 "$new/$p"
  mv -f "$new/$p" "$dir/$p"
done
systemctl restart --no-block "$unit"
