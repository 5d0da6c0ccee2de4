# One image for every orderfleet binary; each task or container runs one of them
# (`order-intake`, the default, `outbox-relay`, `stock-worker`, `notification-worker`,
# `fleetctl …`).
#
# The binaries are built outside, by `make image` (scripts/image.sh): a release build of the
# workspace's five fleet binaries, staged with this file and deploy/healthcheck.sh in a build
# context of their own. The base is a build argument, so the same file builds on Docker
# (`debian:bookworm-slim`, the default) and here, where no registry is reachable
# (`--build-arg BASE=localhost/debian:bookworm-slim`, made by mmdebstrap). The binaries link
# glibc, so the base must be a glibc distribution as new as the build host (Debian 12).
ARG BASE=debian:bookworm-slim
FROM ${BASE}

# CA certificates, for TLS to AWS, Stripe and PostgreSQL; nothing else is installed. Not
# pinned to a version (DL3008): Debian's security updates replace it, and a pinned version
# would stop building the day they do.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin orderfleet

# (--chmod needs BuildKit on Docker, its default builder since Docker 23.)
COPY --chmod=0555 bin/ /usr/local/bin/

# Nothing is written to the filesystem: logs go to stdout, state to PostgreSQL. The image
# runs with a read-only root filesystem and as this user (by number, so a platform can check
# it is not root without reading /etc/passwd).
USER 10001:10001

# The defaults a container wants (each may be overridden): listen on every interface, JSON
# logs, metrics and /healthz on 9090.
ENV INTAKE_LISTEN_ADDR=0.0.0.0:8080 \
    METRICS_LISTEN_ADDR=0.0.0.0:9090 \
    LOG_FORMAT=json
EXPOSE 8080 9090

# /healthz on METRICS_LISTEN_ADDR, which every long-running binary serves.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/healthcheck"]

# Stop with SIGTERM, and allow more than SHUTDOWN_GRACE_SECONDS (20 s by default) before the
# kill: `docker stop` waits 10 s unless told otherwise, so `docker stop -t 30`; on ECS,
# `stopTimeout: 30` (infra/services.yaml).
STOPSIGNAL SIGTERM
CMD ["order-intake"]
