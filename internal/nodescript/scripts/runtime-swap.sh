# kubelift node script: runtime-swap
# Moves the node's containerd (and runc) in place: checks the staged
# release archive's and runc's sha256, unpacks the archive's bin/ beside
# BINDIR, backs up once (when BINDIR/containerd still runs version FROM;
# exit 66 when it runs another and no backup was taken) every program the
# archive replaces, runc and CONFIG into BACKUP_DIR, listing them in
# BACKUP_DIR/runtime-files (and the programs it adds in runtime-added,
# runtime-files written last); with MIGRATE "migrate", rewrites CONFIG with
# the new containerd's own `config migrate` (a major version's schema);
# renames each new program over the old one (atomic), then restarts UNIT,
# printing how long the restart took by the node's clock ("### restart
# BEGAN ENDED"). The containers belong to their shims, which keep
# running: the engine checks every task's PID after. A run cut off at any
# point runs again to the same end; the backup taken first is kept.
# Arguments: BACKUP_DIR ARCHIVE ARCHIVE_SHA256 RUNC RUNC_SHA256 RUNC_BINARY BINDIR CONFIG MIGRATE UNIT FROM
# (RUNC "-": the bundle carries no runc, and runc stays.)
set -eu
b=$1
archive=$2
asum=$3
runc=$4
rsum=$5
runcbin=$6
bindir=$7
config=$8
migrate=$9
shift 9
unit=$1
from=$2
if ! echo "$asum  $archive" | sha256sum -c --quiet - >&2; then
  echo "$archive is not the staged containerd release" >&2
  exit 65
fi
if [ "$runc" != - ] && ! echo "$rsum  $runc" | sha256sum -c --quiet - >&2; then
  echo "$runc is not the staged runc" >&2
  exit 65
fi
new=$bindir/.kubelift-runtime
rm -rf "$new"
mkdir -p "$new"
tar -xzf "$archive" -C "$new"
if [ ! -f "$new/bin/containerd" ]; then
  echo "$archive holds no bin/containerd" >&2
  rm -rf "$new"
  exit 65
fi
mkdir -p "$b"
if [ ! -f "$b/runtime-files" ]; then
  v=$("$bindir/containerd" --version 2>&1 | head -n 1)
  case "$v" in
    *" $from" | *" $from "*) ;;
    *)
      echo "$bindir/containerd is $v, not $from: no backup of the old runtime can be taken" >&2
      rm -rf "$new"
      exit 66
      ;;
  esac
  : >"$b/.runtime-files.partial"
  : >"$b/.runtime-added.partial"
  for f in "$new"/bin/*; do
    n=${f##*/}
    if [ -f "$bindir/$n" ]; then
      cp -p "$bindir/$n" "$b/.$n.partial"
      mv -f "$b/.$n.partial" "$b/$n"
      echo "$n" >>"$b/.runtime-files.partial"
    else
      echo "$n" >>"$b/.runtime-added.partial"
    fi
  done
  mv -f "$b/.runtime-added.partial" "$b/runtime-added"
  if [ "$runc" != - ] && [ -f "$runcbin" ]; then
    cp -p "$runcbin" "$b/.runc.partial"
    mv -f "$b/.runc.partial" "$b/runc"
    echo runc >>"$b/.runtime-files.partial"
  fi
  if [ -f "$config" ]; then
    cp -p "$config" "$b/.config.toml.partial"
    mv -f "$b/.config.toml.partial" "$b/config.toml"
    echo config.toml >>"$b/.runtime-files.partial"
  fi
  mv -f "$b/.runtime-files.partial" "$b/runtime-files"
fi
if [ "$migrate" = migrate ] && [ -f "$b/config.toml" ]; then
  # From the backup, so that a run cut off after the rewrite migrates
  # the user's config again, not its own output; with its mode (it may
  # hold a registry's credentials).
  cp -p "$b/config.toml" "$config.kubelift-new"
  "$new/bin/containerd" --config "$b/config.toml" config migrate >"$config.kubelift-new"
  mv -f "$config.kubelift-new" "$config"
fi
for f in "$new"/bin/*; do
  n=${f##*/}
  chmod 0755 "$f"
  mv -f "$f" "$bindir/$n"
done
if [ "$runc" != - ]; then
  cp "$runc" "$runcbin.kubelift-new"
  chmod 0755 "$runcbin.kubelift-new"
  mv -f "$runcbin.kubelift-new" "$runcbin"
fi
rm -rf "$new"
began=$(cut -d ' ' -f 1 /proc/uptime 2>/dev/null || :)
systemctl restart "$unit"
ended=$(cut -d ' ' -f 1 /proc/uptime 2>/dev/null || :)
if [ -n "$began" ] && [ -n "$ended" ]; then echo "### restart $began $ended"; fi
