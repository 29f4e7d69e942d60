# kubelift node script: tools-swap
# Moves the node's CNI plugins and crictl to the bundle's: checks each
# staged archive's sha256 (exit 65), unpacks the CNI plugins beside
# CNI_DIR and crictl beside CRICTL, and compares each program with the
# one in place. When every one is the same, it changes nothing and says
# "### same". Else it backs up, into BACKUP_DIR, each program it replaces
# that no earlier run backed up (listed in BACKUP_DIR/tools-files as
# cni/NAME or crictl; the ones it adds in tools-added; where they live in
# tools-paths; tools-files written last, each list whole), then renames
# each program that differs over the old one (atomic: a plugin the
# runtime starts meanwhile is the old or the new, whole). Nothing
# restarts: a CNI plugin runs only when a pod's network is set up or
# torn down, and crictl only when called. Files of the CNI archive that
# are not programs (its LICENSE, README.md) are left out. A run cut off
# at any point runs again to the same end; what was backed up first is
# kept, so tools-restore puts back what the node had before the first.
# Arguments: BACKUP_DIR CNI_ARCHIVE CNI_SHA256 CNI_DIR CRICTL_ARCHIVE CRICTL_SHA256 CRICTL
# (an ARCHIVE "-": the bundle carries none, and that tool stays.)
set -eu
b=$1
cni=$2
csum=$3
cnidir=$4
crictl=$5
ksum=$6
crictlbin=$7
# check ARCHIVE SHA256: the staged archive is the one the bundle signed.
check() {
  if [ "$1" != - ] && ! echo "$2  $1" | sha256sum -c --quiet - >&2; then
    echo "$1 is not the staged archive the bundle signed" >&2
    exit 65
  fi
}
check "$cni" "$csum"
check "$crictl" "$ksum"
newcni=$cnidir/.kubelift-tools
newcrictl=$(dirname "$crictlbin")/.kubelift-tools
cleanup() { rm -rf "$newcni" "$newcrictl"; }
cleanup
# differ NEW OLD: the program NEW is not byte for byte the one at OLD.
differ() { ! cmp -s "$1" "$2"; }
changes=0
if [ "$cni" != - ]; then
  mkdir -p "$cnidir" "$newcni"
  tar -xzf "$cni" -C "$newcni"
  for f in "$newcni"/*; do
    if [ ! -f "$f" ] || [ ! -x "$f" ]; then
      rm -rf "$f"
      continue
    fi
    if differ "$f" "$cnidir/${f##*/}"; then changes=$((changes + 1)); fi
  done
fi
if [ "$crictl" != - ]; then
  mkdir -p "$newcrictl"
  tar -xzf "$crictl" -C "$newcrictl"
  if [ ! -f "$newcrictl/crictl" ]; then
    echo "$crictl holds no crictl" >&2
    cleanup
    exit 65
  fi
  if differ "$newcrictl/crictl" "$crictlbin"; then changes=$((changes + 1)); fi
fi
if [ "$changes" = 0 ]; then
  cleanup
  echo "### same"
  exit 0
fi
mkdir -p "$b/cni"
if [ ! -f "$b/tools-paths" ]; then
  printf 'cni %s\ncrictl %s\n' "$cnidir" "$crictlbin" >"$b/.tools-paths.partial"
  mv -f "$b/.tools-paths.partial" "$b/tools-paths"
fi
# The lists as they stand, extended below and renamed back whole.
if [ -f "$b/tools-files" ]; then cp "$b/tools-files" "$b/.tools-files.partial"; else : >"$b/.tools-files.partial"; fi
if [ -f "$b/tools-added" ]; then cp "$b/tools-added" "$b/.tools-added.partial"; else : >"$b/.tools-added.partial"; fi
# keep OLD NAME: back OLD up as NAME, or list NAME as added, unless an
# earlier run did (its backup is what the node had first).
keep() {
  if grep -qxF "$2" "$b/.tools-files.partial" "$b/.tools-added.partial"; then
    return 0
  fi
  if [ -f "$1" ]; then
    cp -p "$1" "$b/.tools.partial"
    mv -f "$b/.tools.partial" "$b/$2"
    echo "$2" >>"$b/.tools-files.partial"
  else
    echo "$2" >>"$b/.tools-added.partial"
  fi
}
if [ "$cni" != - ]; then
  for f in "$newcni"/*; do
    if [ -f "$f" ] && differ "$f" "$cnidir/${f##*/}"; then keep "$cnidir/${f##*/}" "cni/${f##*/}"; fi
  done
fi
if [ "$crictl" != - ] && differ "$newcrictl/crictl" "$crictlbin"; then keep "$crictlbin" crictl; fi
mv -f "$b/.tools-added.partial" "$b/tools-added"
mv -f "$b/.tools-files.partial" "$b/tools-files"
if [ "$cni" != - ]; then
  for f in "$newcni"/*; do
    if [ -f "$f" ] && differ "$f" "$cnidir/${f##*/}"; then
      chmod 0755 "$f"
      mv -f "$f" "$cnidir/${f##*/}"
    fi
  done
fi
if [ "$crictl" != - ] && differ "$newcrictl/crictl" "$crictlbin"; then
  chmod 0755 "$newcrictl/crictl"
  mv -f "$newcrictl/crictl" "$crictlbin"
fi
cleanup
echo "### moved $changes"
