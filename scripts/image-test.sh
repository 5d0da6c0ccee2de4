#!/usr/bin/env bash
# The image's smoke test: the fleet run from IMAGE with `buildah run` pays an order
# (tests/e2e/image.rs, ignored in a plain test run). `make test` runs it on the dev profile's
# image, `make image` on the shipped one (fat LTO).   scripts/image-test.sh IMAGE
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"
image=${1:?usage: scripts/image-test.sh IMAGE}
log="$run_dir/image-test.log"
need_nextest
# The test runs the image with buildah; an image Docker built is copied into buildah's store.
if docker_engine_answers && docker image inspect "$image" >/dev/null 2>&1; then
    buildah pull --quiet "docker-daemon:$image" >/dev/null
fi
buildah inspect --type image "$image" >/dev/null 2>&1 || die "no image $image: build it first (make image)"
# The whole workspace, as the suite builds it (its feature set): nothing is compiled again.
ORDERFLEET_IMAGE="$image" "$root/scripts/with-env.sh" cargo nextest run --workspace --exclude order-model \
    --run-ignored only -E 'test(/^image::/)' --no-fail-fast 2>&1 | tee "$log"
grep -Eq "1 test run: 1 passed" "$log" || die "the image test did not run (renamed?)"
