# kubelift node script: facts
# Prints, in "### " sections, what a node says of itself: the version
# and command line of each component's running unit, its unit files and
# the EnvironmentFiles they read, the failCgroupV1 and cgroupDriver lines
# of the running kubelet's configuration file, the hash era of the
# hash-skip file an earlier upgrade left, the files staged for the target
# (their checked sums), the free space below the stage directory, the
# cgroup file system, the runtime's containers, where containerd and runc
# run from and what the runtime says of itself over CRI.
# Arguments: VERSION_DIR STAGE_DIR COMPONENT...
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
vdir=$1
sdir=$2
shift 2
main_pid() {
  systemctl show "$1" -p MainPID 2>/dev/null | sed -n 's/^MainPID=//p'
}
for c in "$@"; do
  pid=$(main_pid "$c")
  # What the main process says is kept only when it is still the unit's
  # main process after: a unit restarting (crash-looping) is not running,
  # and its exiting process's answer is not a version.
  runs='' version='' cmdline=''
  if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -e "/proc/$pid/exe" ]; then
    version=$("/proc/$pid/exe" --version 2>&1 | head -n 1)
    cmdline=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)
    if [ "$(main_pid "$c")" = "$pid" ] && [ -e "/proc/$pid/exe" ]; then
      runs=yes
    fi
  fi
  if [ -n "$runs" ]; then
    echo "### version $c"; printf '%s\n' "$version"
    echo "### cmdline $c"; printf '%s\n' "$cmdline"; echo
    if [ "$c" = kubelet ]; then
      conf=$(printf '%s\n' "$cmdline" | sed -n -e 's/^--config=//p' -e '/^--config$/{n;p;}' | head -n 1)
      if [ -n "$conf" ] && [ -f "$conf" ]; then
        echo "### kubelet-config"; grep -E '^(failCgroupV1|cgroupDriver):' "$conf" || true
      fi
      # The hash-skip file an earlier upgrade left (hashskip.DefaultPath's
      # name in the kubelet's root directory): its schema version and the
      # hash era it keeps, one line.
      root=$(printf '%s\n' "$cmdline" | sed -n -e 's/^--root-dir=//p' -e '/^--root-dir$/{n;p;}' | head -n 1)
      skip=${root:-/var/lib/kubelet}/kubelift-hash-skip.json
      if [ -f "$skip" ]; then
        echo "### hash-skip"
        echo "$(sed -n 's/.*"schemaVersion": *\([0-9]*\).*/\1/p' "$skip" | head -n 1) $(sed -n 's/.*"oldHashEra": *"\([^"]*\)".*/\1/p' "$skip" | head -n 1)"
      fi
    fi
  fi
  for f in "/etc/systemd/system/$c.service" "/run/systemd/system/$c.service" "/lib/systemd/system/$c.service" "/usr/lib/systemd/system/$c.service" \
      /etc/systemd/system/"$c".service.d/*.conf /run/systemd/system/"$c".service.d/*.conf /lib/systemd/system/"$c".service.d/*.conf /usr/lib/systemd/system/"$c".service.d/*.conf; do
    [ -f "$f" ] || continue
    echo "### unit $c $f"; cat "$f"; echo
    # One EnvironmentFile= line may name several files: split into words.
    # shellcheck disable=SC2013
    for e in $(sed -n 's/^[[:space:]]*EnvironmentFile=-\{0,1\}//p' "$f"); do
      if [ -f "$e" ]; then echo "### env $c $e"; cat "$e"; echo; fi
    done
  done
done
# The staged files' sums: the one staging wrote beside each file once it
# had checked it, while the file is no newer (as list-staged reads them).
echo '### staged'
for f in "$vdir"/*; do
  [ -f "$f" ] || continue
  case ${f##*/} in *[!A-Za-z0-9._-]*) continue ;; esac
  s="$vdir/.${f##*/}.kubelift-sum" sum=
  if [ -f "$s" ] && [ -n "$(find "$f" ! -newer "$s" 2>/dev/null)" ]; then sum=$(cat "$s"); fi
  case $sum in *[!0-9a-f]*) sum= ;; esac
  [ "${#sum}" -eq 64 ] || sum=$(sha256sum <"$f" 2>/dev/null | cut -d ' ' -f 1)
  [ "${#sum}" -eq 64 ] && printf '%s  %s\n' "$sum" "${f##*/}"
done
d=$sdir
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo '### df'; df -Pk "$d" | tail -n 1
echo '### cgroupfs'; stat -fc %T /sys/fs/cgroup
echo '### crictl'; crictl ps -o json 2>&1 || echo '### crictl-failed'
# What the runtime says of itself over CRI: its name, version and CRI
# API version, and the cgroup driver it tells the kubelet (RuntimeConfig;
# a runtime that does not implement it answers Unimplemented).
# Where containerd runs from (its unit's main process; " (deleted)" once
# the file was renamed over), the config it reads (-c or --config; none:
# its default) and the runc and crictl on the PATH: where a runtime move
# puts the bundle's.
echo '### containerd'
pid=$(main_pid containerd)
if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -e "/proc/$pid/exe" ]; then
  printf 'binary %s\n' "$(readlink "/proc/$pid/exe" | sed 's/ (deleted)$//')"
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null |
    sed -n -e 's/^--config=/config /p' -e 's/^-c=/config /p' -e '/^--config$/{n;s/^/config /p;}' -e '/^-c$/{n;s/^/config /p;}' | head -n 1
fi
if r=$(command -v runc 2>/dev/null); then printf 'runc %s\n' "$r"; fi
if r=$(command -v crictl 2>/dev/null); then printf 'crictl %s\n' "$r"; fi
echo '### cri-version'; crictl version 2>&1 || echo '### cri-version-failed'
echo '### cri-config'; crictl runtime-config 2>&1 || echo '### cri-config-failed'
# The runtime's status and config (JSON): where it takes the CNI plugins
# from (cni.binDirs, or 1.x's cni.binDir), where a tools move puts the
# bundle's. crictl's warnings are left out of the JSON.
echo '### cri-info'; crictl info 2>/dev/null || echo '### cri-info-failed'
