#!/usr/bin/env bash
# `systemd-analyze verify` on every unit in deploy/systemd/ (with EC2's drop-in), for each
# binary the template runs, in `make test`. It runs against a throwaway root holding this machine's system units,
# the units, a stand-in executable per binary and empty settings files, so it needs neither a
# running systemd nor the binaries installed. systemd-analyze exits 0 on a misspelt key or a
# value it cannot parse (it warns and ignores the line), so any output fails the check.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

command -v systemd-analyze >/dev/null || die "systemd-analyze is needed (Debian: the systemd package)"
binaries=(order-intake outbox-relay stock-worker notification-worker)
fake_root=$(mktemp -d)
trap 'rm -rf "$fake_root"' EXIT
mkdir -p "$fake_root/usr/lib/systemd" "$fake_root/etc/systemd/system" "$fake_root/usr/local/bin" "$fake_root/etc/orderfleet"
cp -r /usr/lib/systemd/system "$fake_root/usr/lib/systemd/"
cp deploy/systemd/*.service "$fake_root/etc/systemd/system/"
touch "$fake_root/etc/orderfleet/common.env"
for binary in "${binaries[@]}"; do
    printf '#!/bin/sh\n' >"$fake_root/usr/local/bin/$binary"
    chmod +x "$fake_root/usr/local/bin/$binary"
    touch "$fake_root/etc/orderfleet/$binary.env"
    # As deploy/ec2-bootstrap.sh installs it on an instance.
    mkdir -p "$fake_root/etc/systemd/system/orderfleet@$binary.service.d"
    cp deploy/systemd/ec2-failure-action.conf "$fake_root/etc/systemd/system/orderfleet@$binary.service.d/"
done

failed=0
for binary in "${binaries[@]}"; do
    unit="orderfleet@$binary.service"
    if ! out=$(systemd-analyze verify --root="$fake_root" "$unit" 2>&1) || [[ -n "$out" ]]; then
        say "$unit:"$'\n'"$out"
        failed=1
    fi
done
((failed == 0)) || die "systemd-analyze verify found problems in deploy/systemd/"

# And the sandbox holds: systemd's own exposure score (0 locked down … 10 exposed) at most 2.
for binary in "${binaries[@]}"; do
    unit="orderfleet@$binary.service"
    systemd-analyze security --offline=true --root="$fake_root" --threshold=20 --no-pager "$unit" >/dev/null ||
        die "$unit: exposure above 2.0 ($(systemd-analyze security --offline=true --root="$fake_root" "$unit" 2>&1 | tail -n 1))"
done
exposure=$(systemd-analyze security --offline=true --root="$fake_root" "orderfleet@${binaries[0]}.service" 2>&1 | tail -n 1)
say "verified: ${binaries[*]/#/orderfleet@}; ${exposure#→ }"
