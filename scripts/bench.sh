#!/usr/bin/env bash
# `make bench`: the fleet, built optimized, against the stack `make up` brought up
# (crates/fleet-harness/src/bin/bench/). Arguments go to the benchmark:
#   make bench BENCH_ARGS="--orders 5000"      make bench BENCH_ARGS="--no-batching"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
release_dir=$(profile_dir release)
export ORDERFLEET_RUN_DIR="$run_dir"
# shellcheck disable=SC2086
exec "$root/scripts/with-env.sh" env ORDERFLEET_BIN_DIR="$release_dir" "$release_dir/orderfleet-bench" ${BENCH_ARGS:-}
