# kubelift node script: etcd-restore
# Puts back the etcd programs etcd-swap backed up into BACKUP_DIR (those
# BACKUP_DIR/etcd-files lists; those it added, etcd-added, removed) in
# PROGRAM_DIR, each by rename, and has UNIT restarted without waiting for
# it (--no-block, as etcd-swap: the engine waits for the member to
# answer, --ready-timeout). Without a backup it changes nothing and says
# "### none"; with the backed-up programs in place already and UNIT
# running, it restarts nothing and says "### same". Run again, it ends
# the same.
# Arguments: BACKUP_DIR PROGRAM_DIR UNIT
set -eu
b=$1
dir=$2
unit=$3
if [ ! -f "$b/etcd-files" ]; then
  echo '### none'
  exit 0
fi
# Put back already, and running: nothing to restart (a rollback run
# again). The engine waits for a restarted member to answer at its old
# version, which one that never stopped answers at once: were it
# restarted all the same, the next member's restart could overlap it.
same=1
while read -r p; do
  case $p in etcd | etcdctl | etcdutl) ;; *) continue ;; esac
  cmp -s "$b/$p" "$dir/$p" || same=
done <"$b/etcd-files"
if [ -f "$b/etcd-added" ]; then
  while read -r p; do
    case $p in etcd | etcdctl | etcdutl) [ ! -e "$dir/$p" ] || same= ;; esac
  done <"$b/etcd-added"
fi
if [ -n "$same" ] && systemctl is-active --quiet "$unit"; then
  echo '### same'
  exit 0
fi
while read -r p; do
  case $p in etcd | etcdctl | etcdutl) ;; *) continue ;; esac
  # apart, not joined by &&: set -e stops at either failing
  cp -p "$b/$p" "$dir/.$p.kubelift-restore"
  mv -f "$dir/.$p.kubelift-restore" "$dir/$p"
done <"$b/etcd-files"
if [ -f "$b/etcd-added" ]; then
  while read -r p; do
    case $p in etcd | etcdctl | etcdutl) rm -f "${dir:?}/$p" ;; esac
  done <"$b/etcd-added"
fi
systemctl restart --no-block "$unit"
