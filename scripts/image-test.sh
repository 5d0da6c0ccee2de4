#!/usr/bin/env bash
# The image's smoke test: the fleet run from IMAGE with `buildah run` pays an order
# (tests/e2e/image.rs, ignored in a plain test run). `make test` runs it on the dev profile's
# image, `make image` on the shipped one (fat LTO).   scripts/image-test.sh IMAGE
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
image=${1:?usage: scripts/image-test.sh IMAGE}
log="$run_dir/image-test.log"
ORDERFLEET_IMAGE="$image" "$root/scripts/with-env.sh" cargo nextest run -p orderfleet-tests --test e2e \
    --run-ignored only -E 'test(/^image::/)' --no-fail-fast 2>&1 | tee "$log"
grep -Eq "1 test run: 1 passed" "$log" || die "the image test did not run (renamed?)"
