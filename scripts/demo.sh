#!/usr/bin/env bash
# `make demo`: the flash sale through the whole fleet (crates/fleet-harness/src/bin/demo.rs),
# against the stack `make up` brought up. Extra arguments go to the demo
# (make demo DEMO_ARGS="--orders 1000 --stock 100").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
export ORDERFLEET_RUN_DIR="$run_dir"
# shellcheck disable=SC2086
exec "${ORDERFLEET_BIN_DIR:?run make up first}/orderfleet-demo" ${DEMO_ARGS:-}
