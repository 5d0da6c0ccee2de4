#!/bin/bash
# The image's health check: `GET /healthz` on METRICS_LISTEN_ADDR's port, answered 200.
# Bash's /dev/tcp keeps curl (and its libraries) out of the image.
set -euo pipefail
port=${METRICS_LISTEN_ADDR##*:}
exec 3<>"/dev/tcp/127.0.0.1/${port:-9090}"
printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
read -r -t 3 _ status _ <&3
[[ "$status" == 200 ]]
