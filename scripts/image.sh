#!/usr/bin/env bash
# `make image`: the fleet's one image (Dockerfile), every command in it.
#
#   scripts/image.sh                 build $IMAGE (default localhost/orderfleet:dev) from the
#                                    shipped binary (profile dist: fat LTO, stripped), and the
#                                    EC2 tarball beside it
#   IMAGE_PROFILE=dev                from the dev profile's binary instead (`make test`): the
#                                    same bin target, features and Cargo.lock, built with the
#                                    tests' dependencies and linked in seconds, so the suite
#                                    proves the image and not the linker
#   IMAGE_BUILDER=buildah|docker     choose (default: docker when its engine answers)
#   scripts/image.sh base            only install buildah and make the base (scripts/tools.sh)
#
# The fleet's one binary, orderfleet-box, is built here (without the test-only crash points)
# and staged, stripped, with the Dockerfile and a link for each command in a build context of
# their own, so the image holds nothing else from the repository; the same binary and links
# also go into a tarball for EC2. With a Docker engine, `docker build` from its registry's
# gcr.io/distroless/cc-debian12. Without one (these machines), buildah, and a base of the same
# three things (glibc, libgcc, the CA certificates) made once with mmdebstrap from Debian's
# mirrors (no container registry needed); both are installed with apt-get when missing and we
# are root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$root"

image=${IMAGE:-localhost/orderfleet:dev}
local_base=localhost/orderfleet-base:bookworm
commands=(order-intake outbox-relay stock-worker notification-worker fleetctl healthcheck)
started=$SECONDS

with_buildah() {
    if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
        [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null ||
            die "no Docker engine and no buildah: install one (Debian: sudo apt-get install buildah mmdebstrap)"
        say "installing buildah and mmdebstrap with apt-get"
        apt_install buildah mmdebstrap
    fi
    # Made again once a week, so Debian's security updates to glibc and the CA list reach
    # the image (the base is Debian's packages as they are the day it is made).
    local made
    made=$(buildah inspect --type image --format '{{index .Docker.Config.Labels "org.orderfleet.base.made"}}' \
        "$local_base" 2>/dev/null || true)
    if [[ ! "$made" =~ ^[0-9]+$ ]] || ((made < $(date +%s) - 7 * 86400)); then
        say "making $local_base with mmdebstrap (once a week, under a minute)"
        local rootfs cas container
        rootfs=$(mktemp -d)
        cas=$(mktemp -d)
        # What distroless's cc image holds, from Debian 12's own packages: the C library and
        # libgcc, extracted (no shell, no dpkg, no apt); and the CA bundle that
        # update-ca-certificates makes by default (every certificate of Debian's
        # ca-certificates, in one file), made from that package extracted on its own (its
        # dependencies, openssl and debconf, stay out of the image). nsswitch.conf as
        # distroless has it, so /etc/hosts is read before DNS.
        local excludes=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/man/*')
        mmdebstrap --quiet --variant=extract --include=libc6,libgcc-s1 "${excludes[@]}" bookworm "$rootfs"
        mmdebstrap --quiet --variant=extract --include=ca-certificates "${excludes[@]}" bookworm "$cas"
        mkdir -p "$rootfs/etc/ssl/certs"
        cat "$cas"/usr/share/ca-certificates/mozilla/*.crt >"$rootfs/etc/ssl/certs/ca-certificates.crt"
        rm -rf "$cas"
        [[ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ]] || die "no CA certificates in Debian's ca-certificates"
        printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
        container=$(buildah from scratch)
        buildah copy --quiet "$container" "$rootfs" / >/dev/null
        buildah config --label "org.orderfleet.base.made=$(date +%s)" "$container"
        buildah commit --quiet --rm "$container" "$local_base" >/dev/null
        rm -rf "$rootfs"
    fi
}

if [[ "${1:-}" == base ]]; then
    with_buildah
    exit 0
fi

profile=${IMAGE_PROFILE:-dist}
[[ "$profile" == dist || "$profile" == dev ]] || die "IMAGE_PROFILE is $profile; it is dist or dev"
say "building the fleet's one binary (cargo build --profile $profile --package orderfleet-box)"
# --package alone: the test crate stays out, so its failpoints feature is not unified in.
cargo build --quiet --profile "$profile" --package=orderfleet-box
release_dir=$(profile_dir "$profile")

context="$run_dir/image-context"
rm -rf "$context"
mkdir -p "$context/bin"
cp Dockerfile "$context/"
# Stripped (the dist profile strips already; the dev profile keeps line tables for backtraces).
install -m 0555 --strip "$release_dir/orderfleet-box" "$context/bin/"
for command in "${commands[@]}"; do ln -s orderfleet-box "$context/bin/$command"; done

# The same binary and links for EC2 (infra/ec2.yaml): a tarball of bin/, the systemd unit and
# the first-boot script, to upload to the bucket its ArtifactBucket names (ec2-bootstrap.sh
# installs the command it is given, through its link, as /usr/local/bin/<command>).
# A dev-profile tarball says so in its name: it is the suite's, never a release.
tarball="$run_dir/orderfleet-linux-x86_64$([[ "$profile" == dist ]] || echo "-$profile").tar.gz"
release=$(mktemp -d)
mkdir -p "$release/bin" "$release/deploy/systemd"
cp -P "$context/bin/"* "$release/bin/"
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
