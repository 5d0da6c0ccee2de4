#!/usr/bin/env bash
# `make up`: PostgreSQL, LocalStack with the messaging stack, the build, and the migrations.
# Idempotent: what already runs is reused; what `make up` starts, `make down` stops.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if docker_engine_answers; then
    # Docker mode: compose runs both LocalStack and PostgreSQL.
    "$root/scripts/localstack.sh" up
    [[ -n "${DATABASE_URL:-}" ]] || export DATABASE_URL="postgres://orderfleet:orderfleet@127.0.0.1:5433/orderfleet"
    "$root/scripts/postgres.sh" up
else
    "$root/scripts/postgres.sh" up
    "$root/scripts/localstack.sh" up
fi

# Local-only settings for stripe-sim and bearer tokens. The JWT secret is made here, per
# checkout, and never committed.
grep -q '^AUTH_JWT_SECRET=' "$env_file" 2>/dev/null ||
    set_env AUTH_JWT_SECRET "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
set_env STRIPE_SECRET_KEY sk_test_stripe_sim_placeholder
set_env STRIPE_API_BASE http://127.0.0.1:12111

# ORDERFLEET_PROFILE=release (`make demo`, `make bench`): the binaries alone, optimized, as they
# are deployed (no test crate, so none carries the crash points); otherwise the debug build of
# the binaries and the tests, one feature set.
target_dir=$(cargo_target_dir)
if [[ "${ORDERFLEET_PROFILE:-debug}" == release ]]; then
    say "building the fleet optimized (cargo build --release; the first time takes several minutes)"
    cargo build --quiet --release --bins
    bin_dir="$target_dir/release"
else
    say "building the workspace (binaries and tests, one feature set)"
    cargo build --quiet --workspace --all-targets
    bin_dir="$target_dir/debug"
    # The tests' binaries (with the crash points); the optimized ones are found by the demo and
    # the bench themselves, so a test run never picks them up.
    set_env ORDERFLEET_BIN_DIR "$bin_dir"
fi
"$root/scripts/with-env.sh" "$bin_dir/fleetctl" migrate
say "up: PostgreSQL, LocalStack (127.0.0.1:4566) and the messaging stack are ready; settings in ${env_file#"$root/"}"
