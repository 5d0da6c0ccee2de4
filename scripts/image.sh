#!/usr/bin/env bash
# `make image`: the fleet's one image (Dockerfile), every binary in it.
#
#   scripts/image.sh                 build $IMAGE (default localhost/orderfleet:dev)
#   IMAGE_BUILDER=buildah|docker     choose (default: docker when its engine answers)
#
# The five fleet binaries are built here (release, without the test-only crash points) and
# staged with the Dockerfile and deploy/healthcheck.sh in a build context of their own, so the
# image holds nothing else from the repository; the same binaries also go into a tarball for
# EC2. With a Docker engine, `docker build` from its registry's debian:bookworm-slim. Without one (these machines), buildah, and a Debian base
# made once with mmdebstrap from Debian's mirrors (no container registry needed); both are
# installed with apt-get when missing and we are root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

image=${IMAGE:-localhost/orderfleet:dev}
local_base=localhost/debian:bookworm-slim
binaries=(order-intake outbox-relay stock-worker notification-worker fleetctl)
started=$SECONDS

with_buildah() {
    if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
        [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null ||
            die "no Docker engine and no buildah: install one (Debian: sudo apt-get install buildah mmdebstrap)"
        say "installing buildah and mmdebstrap with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah mmdebstrap >/dev/null ||
            { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah mmdebstrap >/dev/null; }
    fi
    if ! buildah inspect --type image "$local_base" >/dev/null 2>&1; then
        say "making $local_base with mmdebstrap (once per machine, about a minute)"
        local rootfs container
        rootfs=$(mktemp --suffix .tar)
        # As Docker's debian:bookworm-slim is made: no manuals, translations or docs but
        # the licenses, and no recommended packages.
        mmdebstrap --quiet --variant=minbase --aptopt='APT::Install-Recommends "false"' \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            bookworm "$rootfs"
        container=$(buildah from scratch)
        buildah add --quiet "$container" "$rootfs" / >/dev/null
        buildah config --cmd /bin/bash "$container"
        buildah commit --quiet --rm "$container" "$local_base" >/dev/null
        rm -f "$rootfs"
    fi
}

say "building the fleet's binaries (cargo build --profile dist: release, stripped)"
cargo build --quiet --profile dist "${binaries[@]/#/--package=}"
release_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/dist"

context="$run_dir/image-context"
rm -rf "$context"
mkdir -p "$context/bin"
cp Dockerfile "$context/"
cp deploy/healthcheck.sh "$context/bin/healthcheck"
for binary in "${binaries[@]}"; do cp "$release_dir/$binary" "$context/bin/"; done

# The same binaries for EC2 (infra/ec2.yaml): a tarball of bin/, the systemd unit and the
# first-boot script, to upload to the bucket its ArtifactBucket names.
tarball="$run_dir/orderfleet-linux-x86_64.tar.gz"
release=$(mktemp -d)
mkdir -p "$release/bin" "$release/deploy/systemd"
cp "$context/bin/"* "$release/bin/"
rm "$release/bin/healthcheck"
cp deploy/systemd/*.service deploy/systemd/*.conf "$release/deploy/systemd/"
cp deploy/ec2-bootstrap.sh "$release/deploy/"
tar -czf "$tarball" -C "$release" bin deploy
rm -rf "$release"
say "the EC2 release: $tarball ($(du -h "$tarball" | cut -f1))"

builder=${IMAGE_BUILDER:-$(docker_engine_answers && echo docker || echo buildah)}
if [[ "$builder" == docker ]]; then
    say "docker build -t $image"
    docker build --quiet -t "$image" "$context" >/dev/null
    size=$(docker image ls --format '{{.Size}}' "$image")
else
    with_buildah
    say "buildah bud -t $image (base $local_base)"
    # Docker's format, not OCI's: OCI images have no HEALTHCHECK.
    buildah bud --quiet --pull=never --isolation chroot --layers=false --format docker \
        --build-arg "BASE=$local_base" -t "$image" "$context" >/dev/null
    size=$(buildah images --format '{{.Size}}' "$image")
fi
say "built $image: $size, in $((SECONDS - started)) s"
