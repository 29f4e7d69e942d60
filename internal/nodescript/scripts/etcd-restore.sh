# kubelift node script: etcd-restore
# Puts back the etcd programs etcd-swap backed up into BACKUP_DIR (those
# BACKUP_DIR/etcd-files lists; those it added, etcd-added, removed) in
# PROGRAM_DIR, each by rename, and has UNIT restarted without waiting for
# it (--no-block, as etcd-swap: the engine waits for the member to
# answer, --ready-timeout). Without a backup it changes nothing and says
# "### none". Run again, it ends the same.
# Arguments: BACKUP_DIR PROGRAM_DIR UNIT
set -eu
b=$1
dir=$2
unit=$3
if [ ! -f "$b/etcd-files" ]; then
  echo '### none'
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
