#!/usr/bin/env bash
# `make up`: PostgreSQL, LocalStack with the messaging stack, the build, and the migrations.
# Idempotent: what already runs is reused; what `make up` starts, `make down` stops.
#
# What is built (ORDERFLEET_BUILD):
#   tests    (default; `make test`) the workspace's binaries and tests in the dev profile, as
#            one feature set: the binaries carry the test-only crash points (failpoints)
#   fleet    (`make demo`) the fleet's binaries alone in the same dev profile, as deployed: no
#            test crate, so no crash points. Most dependencies are built once for both
#            (docs/build.md says which the tests build again)
#   release  (`make bench`) the binaries alone, optimized (`--release`)
# The build runs in the background while PostgreSQL and LocalStack start: the one is CPU, the
# other mostly waiting (a first run installs LocalStack's virtualenv meanwhile).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
timed up

build=${ORDERFLEET_BUILD:-tests}
case "$build" in
tests) build_args=(--workspace --all-targets) profile=dev ;;
fleet) build_args=(--bins) profile=dev ;;
release) build_args=(--release --bins) profile=release ;;
*) die "ORDERFLEET_BUILD is $build; it is tests, fleet or release" ;;
esac

in_background build "cargo build ${build_args[*]}" "$run_dir/build.log" cargo build --quiet "${build_args[@]}"

if docker_engine_answers; then
    # Docker mode: compose runs both LocalStack and PostgreSQL.
    step "LocalStack and PostgreSQL (docker compose), the messaging stack"
    "$root/scripts/localstack.sh" up
    [[ -n "${DATABASE_URL:-}" ]] || export DATABASE_URL="postgres://orderfleet:orderfleet@127.0.0.1:5433/orderfleet"
    "$root/scripts/postgres.sh" up
else
    step "PostgreSQL"
    "$root/scripts/postgres.sh" up
    step "LocalStack and the messaging stack"
    "$root/scripts/localstack.sh" up
fi

# Local-only settings for stripe-sim and bearer tokens. The JWT secret is made here, per
# checkout, and never committed.
grep -q '^AUTH_JWT_SECRET=' "$env_file" 2>/dev/null ||
    set_env AUTH_JWT_SECRET "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
set_env STRIPE_SECRET_KEY sk_test_stripe_sim_placeholder
set_env STRIPE_API_BASE http://127.0.0.1:12111

await_background build
bin_dir=$(profile_dir "$profile")
# The binaries the tests run (ORDERFLEET_BIN_DIR): the debug build, whose last build was the
# tests' own when the tests were last built; the demo and the bench pass their own.
[[ "$build" != tests ]] || set_env ORDERFLEET_BIN_DIR "$bin_dir"

step "migrations (fleetctl migrate)"
"$root/scripts/with-env.sh" "$bin_dir/fleetctl" migrate
step_end
say "up: PostgreSQL, LocalStack (127.0.0.1:4566) and the messaging stack are ready; settings in ${env_file#"$root/"}"
