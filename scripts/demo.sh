#!/usr/bin/env bash
# `make demo`: `make up` with the fleet's binaries as deployed (no crash points), then the
# flash sale through the whole fleet (crates/fleet-harness/src/bin/demo.rs). Extra arguments go
# to the demo (make demo DEMO_ARGS="--orders 1000 --stock 100"). Each step prints its seconds.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
timed demo
export ORDERFLEET_RUN_DIR="$run_dir"

# The dev profile (README.md, "The two commands"): the same build `make test` runs on, so the
# first run spends its minutes on the sale rather than on the optimizer. ORDERFLEET_BUILD=release
# runs the sale on the optimized build instead (its first build takes about eighteen minutes).
build=${ORDERFLEET_BUILD:-fleet}
case "$build" in
fleet) profile=dev ;;
release) profile=release ;;
*) die "ORDERFLEET_BUILD is $build; make demo runs fleet (the default) or release" ;;
esac
ORDERFLEET_BUILD=$build "$root/scripts/up.sh"
bin_dir=$(profile_dir "$profile")
step "the flash sale (orderfleet-demo)"
# shellcheck disable=SC2086
"$root/scripts/with-env.sh" env ORDERFLEET_BIN_DIR="$bin_dir" "$bin_dir/orderfleet-demo" ${DEMO_ARGS:-}
step_end
