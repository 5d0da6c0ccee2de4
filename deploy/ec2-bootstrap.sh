#!/bin/bash
# Installs one orderfleet binary on an EC2 instance as a systemd service; infra/ec2.yaml's
# user data runs it from the release tarball (`make image` leaves one in .run/):
#
#   deploy/ec2-bootstrap.sh BINARY SECRET_ARN REGION  (the common settings as KEY=VALUE lines on stdin)
#
# The binary goes to /usr/local/bin, the unit template to /etc/systemd/system; the common
# settings (queue URLs, topic, Stripe's base) to /etc/orderfleet/common.env; the binary's own
# secret set (a Secrets Manager secret holding a JSON object: DATABASE_URL for its database
# role, and STRIPE_SECRET_KEY or AUTH_JWT_SECRET where it needs them) to
# /etc/orderfleet/BINARY.env, readable by root alone (systemd reads it; the service runs as a
# dynamic user). Then orderfleet@BINARY is enabled and started. Safe to repeat.
set -euo pipefail
binary=$1 secret_arn=$2 region=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

case "$binary" in
    order-intake | outbox-relay | stock-worker | notification-worker) ;;
    *) echo "ec2-bootstrap: unknown binary $binary" >&2; exit 1 ;;
esac
install -m 0555 "$here/bin/$binary" /usr/local/bin/
install -m 0644 "$here/deploy/systemd/orderfleet@.service" /etc/systemd/system/
# An instance is disposable: when systemd gives up on its service, it powers off, and its
# Auto Scaling group (whose EC2 health check sees a stopped instance) replaces it.
install -d -m 0755 "/etc/systemd/system/orderfleet@$binary.service.d"
install -m 0644 "$here/deploy/systemd/ec2-failure-action.conf" "/etc/systemd/system/orderfleet@$binary.service.d/"
install -d -m 0700 /etc/orderfleet
umask 077
cat >/etc/orderfleet/common.env
aws secretsmanager get-secret-value --region "$region" --secret-id "$secret_arn" \
    --query SecretString --output text |
    python3 -c 'import json, sys
# Double-quoted, with backslashes and quotes escaped, as systemd reads an EnvironmentFile.
for key, value in json.load(sys.stdin).items():
    escaped = str(value).replace("\\", "\\\\").replace("\"", "\\\"")
    print(f"{key}=\"{escaped}\"")' >"/etc/orderfleet/$binary.env"
systemctl daemon-reload
systemctl enable "orderfleet@$binary.service"
# A restart, not a start: run again with a new release, the new binary takes over.
systemctl restart "orderfleet@$binary.service"
