# kubelift node script: start
# Starts UNIT when it does not run (systemctl start: nothing happens to a
# unit that runs), as a control-plane part found down after an upgrade or
# a rollback step: one whose unit has no Restart=, or gave up restarting.
# Arguments: UNIT
set -eu
systemctl start "$1"
