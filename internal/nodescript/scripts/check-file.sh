# kubelift node script: check-file
# Checks that FILE's sha256 is SHA256 (exit 65 naming both when it is
# not): before kubelift runs a staged program that no swap installs
# (kubeadm), and that a copy it made of a node's file is whole.
# Arguments: FILE SHA256
set -eu
export LC_ALL=C
got=$(sha256sum <"$1" | cut -d ' ' -f 1)
if [ "$got" != "$2" ]; then
  echo "$1 has sha256 $got, not $2" >&2
  exit 65
fi
