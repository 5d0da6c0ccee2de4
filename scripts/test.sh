#!/usr/bin/env bash
# `make test`: every check CI runs, in order of cost. Fails on the first failure.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

say "cargo fmt --check"
cargo fmt --all --check

say "the docs name only tests, files and settings that exist"
python3 scripts/check-docs.py

say "cfn-lint infra/*.yaml"
venv=$("$root/localstack/host.sh" venv)
"$venv/bin/cfn-lint" infra/*.yaml

say "checkov infra/ (every finding fixed, or skipped in the template with its reason)"
"$root/scripts/checkov.sh"

say "schemathesis, for the contract test (installed once per machine)"
"$root/scripts/schemathesis.sh" --version

say "hadolint Dockerfile"
"$root/scripts/hadolint.sh"

say "systemd-analyze verify deploy/systemd/ (and its exposure score)"
"$root/scripts/systemd-verify.sh"

say "no production build carries the crash points (the failpoints feature)"
for package in order-intake outbox-relay stock-worker notification-worker fleetctl orderfleet-box; do
    if cargo tree --quiet -p "$package" -e features -i orderfleet | grep -q 'feature "failpoints"'; then
        die "$package's own build enables orderfleet's failpoints feature"
    fi
done

say "dependencies: advisories, duplicate versions, licenses, sources (cargo-deny)"
"$root/scripts/audit.sh"

say "cargo clippy --all-targets -- -D warnings"
cargo clippy --quiet --workspace --all-targets -- -D warnings

# Databases the end-to-end tests made and a failed run left behind (see tests/support).
psql -q -d "$DATABASE_URL" -At -c "SELECT datname FROM pg_database WHERE datname LIKE 'orderfleet\_test\_%'" |
    while read -r db; do psql -q -d "$DATABASE_URL" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"; done

# The processes' logs, one directory per test: the least-privilege check below reads this
# run's alone.
target_dir="$(cargo_target_dir)"
rm -rf "$target_dir/debug/e2e-logs"

say "the order protocol, model-checked: every interleaving of each scenario (crates/order-model)"
# One test at a time: each check uses every core. Each prints its states and time; the checks of
# the rules before four fixes print the counterexample they find.
cargo test -p order-model -- --nocapture --test-threads 1

say "cargo test (unit and end-to-end, against PostgreSQL and LocalStack)"
cargo test --workspace --exclude order-model

cat "$target_dir/debug/e2e-logs/contract/schemathesis-summary.txt" >&2

say "the image (make image), and the fleet run from it paying an order (buildah run)"
export IMAGE=${IMAGE:-localhost/orderfleet:dev}
IMAGE_BUILDER=buildah "$root/scripts/image.sh"
ORDERFLEET_IMAGE="$IMAGE" cargo test -p orderfleet-tests --test e2e -- --ignored image:: 2>&1 | tee "$run_dir/image-test.log"
grep -q "test result: ok. 1 passed" "$run_dir/image-test.log" || die "the image test did not run (renamed?)"

say "least privilege: the AWS operations each binary called in this run against what its role grants"
"$venv/bin/python" scripts/least-privilege.py "$target_dir/debug/e2e-logs" infra/services.yaml infra/ec2.yaml
