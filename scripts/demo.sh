#!/usr/bin/env bash
# `make demo`: the flash sale through the whole fleet. The order pipeline's binaries are built
# in the next milestone (issue 3); until then this says so and fails rather than pretend.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
die "the order pipeline (order-intake, outbox-relay, workers, stripe-sim) is not built yet; 'make up' brings up the stack"
