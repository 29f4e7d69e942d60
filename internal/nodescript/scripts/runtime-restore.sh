# kubelift node script: runtime-restore
# Puts back what runtime-swap backed up in BACKUP_DIR (its runtime-files
# list: containerd's programs into BINDIR, runc over RUNC_BINARY, the
# config over CONFIG), each renamed into place (atomic), removes the
# programs it added to BINDIR (runtime-added), then restarts UNIT. Without the list, runtime-swap changed nothing and nothing is
# put back ("nothing to restore").
# Arguments: BACKUP_DIR BINDIR RUNC_BINARY CONFIG UNIT
set -eu
b=$1
bindir=$2
runcbin=$3
config=$4
unit=$5
if [ ! -f "$b/runtime-files" ]; then
  echo "nothing to restore"
  exit 0
fi
while IFS= read -r n; do
  case "$n" in
    config.toml) to=$config ;;
    runc) to=$runcbin ;;
    */* | .* | '') echo "$b/runtime-files lists $n" >&2; exit 65 ;;
    *) to=$bindir/$n ;;
  esac
  cp -p "$b/$n" "$to.kubelift-old"
  mv -f "$to.kubelift-old" "$to"
done <"$b/runtime-files"
while IFS= read -r n; do
  case "$n" in
    */* | .* | '') echo "$b/runtime-added lists $n" >&2; exit 65 ;;
  esac
  rm -f "$bindir/$n"
done <"$b/runtime-added"
systemctl restart "$unit"
