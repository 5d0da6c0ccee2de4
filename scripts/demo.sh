#!/usr/bin/env bash
# `make demo`: the flash sale through the whole fleet (crates/fleet-harness/src/bin/demo.rs),
# against the stack `make up` brought up. Extra arguments go to the demo
# (make demo DEMO_ARGS="--orders 1000 --stock 100").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
export ORDERFLEET_RUN_DIR="$run_dir"
# The fleet as deployed: the optimized build (`make demo` builds it; up.sh).
bin_dir="$(cargo_target_dir)/release"
[[ -x "$bin_dir/orderfleet-demo" ]] || die "no optimized build in $bin_dir: run make demo"
# shellcheck disable=SC2086
exec env ORDERFLEET_BIN_DIR="$bin_dir" "$bin_dir/orderfleet-demo" ${DEMO_ARGS:-}
