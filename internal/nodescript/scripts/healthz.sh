# kubelift node script: healthz
# Prints the HTTP status of GET URL from the node itself, 000 when nothing
# answers, "none" without curl: a component's health endpoint, read
# before its swap and after.
# Arguments: URL
set -u
if command -v curl >/dev/null 2>&1; then
  curl -s -o /dev/null -m 2 -w '%{http_code}' "$1" || true
else
  echo none
fi
