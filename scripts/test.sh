#!/usr/bin/env bash
# `make test`: `make up`, then every check CI runs, in order of cost. Fails on the first
# failure. Each step prints its seconds, and the run ends with all of them (docs/build.md gives
# what each costs, cold and warm).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
timed test

# The tools besides cargo install (the first time on a machine) while the workspace builds.
in_background tools "the tools' install (checkov, Schemathesis, hadolint, cargo-deny, cargo-machete, buildah)" \
    "$run_dir/tools.log" "$root/scripts/tools.sh"

ORDERFLEET_BUILD=tests "$root/scripts/up.sh"
set -a
# shellcheck disable=SC1090
source "$env_file"
set +a

await_background tools

step "cargo fmt --check"
cargo fmt --all --check

step "the docs name only tests, files and settings that exist; docs/spec.md is the shared contract"
python3 scripts/check-docs.py
python3 scripts/check-spec.py

step "no import loops; the domain's longest import chain within 6 modules (clippy keeps functions within 60 lines)"
python3 scripts/check-shape.py

step "end-to-end test names: at most 10 over 70 characters (one claim each; a second in the doc comment)"
python3 scripts/check-test-names.py

step "each metric declared once, in its crate's src/metrics.rs, and recorded by its declaration; the docs' table and infra/'s CloudWatch names are the declarations'"
python3 scripts/check-metrics.py

step "cfn-lint infra/*.yaml"
venv=$("$root/localstack/host.sh" venv)
"$venv/bin/cfn-lint" infra/*.yaml

step "checkov infra/ (every finding fixed, or skipped in the template with its reason)"
"$root/scripts/checkov.sh"

step "hadolint Dockerfile"
"$root/scripts/hadolint.sh"

step "systemd-analyze verify deploy/systemd/ (and its exposure score)"
"$root/scripts/systemd-verify.sh"

step "no production build carries the crash points (the failpoints feature)"
for package in order-intake outbox-relay stock-worker notification-worker fleetctl orderfleet-box; do
    if cargo tree --quiet -p "$package" -e features -i orderfleet-runtime | grep -q 'feature "failpoints"'; then
        die "$package's own build enables the failpoints feature (orderfleet-runtime's crash points)"
    fi
done

step "dependencies: advisories, duplicate versions, licenses, sources (cargo-deny)"
"$root/scripts/audit.sh"

step "no crate lists a dependency its code does not use (cargo-machete)"
"$root/scripts/machete.sh"

# One compile for both: clippy's, with the query macros online against the migrated schema.
step "cargo clippy --all-targets -- -D warnings, and the query data (.sqlx/) is what the migrated schema says of every statement"
"$root/scripts/sqlx-data.sh" check

step "schema.sql is today's schema, as the migrations leave it"
"$root/scripts/schema.sh" check

# Databases the end-to-end tests made and a failed run left behind (see tests/support).
psql -q -d "$DATABASE_URL" -At -c "SELECT datname FROM pg_database WHERE datname LIKE 'orderfleet\_test\_%'" |
    while read -r db; do psql -q -d "$DATABASE_URL" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"; done

# The processes' logs, one directory per test: the least-privilege check below reads this
# run's alone.
target_dir="$(cargo_target_dir)"
rm -rf "$target_dir/debug/e2e-logs"

step "the order protocol, model-checked: every interleaving of each scenario (crates/order-model)"
# One test at a time: each check uses every core. Each prints its states and time; the checks of
# the rules before four fixes print the counterexample they find.
cargo test -p order-model -- --nocapture --test-threads 1

# Each end-to-end test runs a fleet of its own, with up to about 70 PostgreSQL connections;
# as many tests run at once as the server allows, up to eight (.config/nextest.toml).
max_connections=$(psql -d "$DATABASE_URL" -At -c 'SHOW max_connections')
threads=$(((max_connections - 20) / 70))
((threads <= 8)) || threads=8
((threads >= 1)) || threads=1
step "cargo nextest run: unit and end-to-end tests, $threads at a time (PostgreSQL's max_connections is $max_connections)"
cargo nextest run --workspace --exclude order-model --test-threads "$threads" --no-fail-fast

cat "$target_dir/debug/e2e-logs/contract/schemathesis-summary.txt" >&2

step "the image (the dev profile's binary), and the fleet run from it paying an order (buildah run)"
# A tag of its own: the suite's image never takes the name of the one `make image` ships.
export IMAGE=${TEST_IMAGE:-localhost/orderfleet:test}
IMAGE_PROFILE=dev IMAGE_BUILDER=buildah "$root/scripts/image.sh"
"$root/scripts/image-test.sh" "$IMAGE"

step "least privilege: the AWS operations each binary called in this run against what its role grants"
"$venv/bin/python" scripts/least-privilege.py "$target_dir/debug/e2e-logs" infra/services.yaml infra/ec2.yaml
step_end
