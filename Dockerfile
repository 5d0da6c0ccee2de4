# One image for every orderfleet command: one binary, `orderfleet-box`, and each command's name
# a link to it (`order-intake`, the default, `outbox-relay`, `stock-worker`,
# `notification-worker`, `fleetctl …`, and `healthcheck`, the container's health check). The
# five commands share the AWS SDK, sqlx, OpenTelemetry and Tokio: as five executables they
# made the image 274 MB, as one about 60 MB (BENCHMARKS.md).
#
# The binary is built outside, by `make image` (scripts/image.sh): a release build, stripped,
# staged with this file and its links in a build context of their own. The base holds what
# the binary needs and nothing more: glibc, libgcc and the CA certificates; no shell, no
# package manager. The base is a build argument, so the same file builds on Docker
# (`gcr.io/distroless/cc-debian12`, the default; its `nonroot` tag, though the user below is ours) and here, where no registry is reachable
# (`--build-arg BASE=localhost/orderfleet-base:bookworm`: the same three, made by mmdebstrap
# from Debian's packages). The binary links glibc, so the base must be a glibc distribution
# as new as the build host (Debian 12).
ARG BASE=gcr.io/distroless/cc-debian12:nonroot
FROM ${BASE}

# The binary (mode 0555) and its links, as staged.
COPY bin/ /usr/local/bin/

# Nothing is written to the filesystem: logs go to stdout, state to PostgreSQL. The image
# runs with a read-only root filesystem and as this user (by number, so a platform can check
# it is not root without reading /etc/passwd, which this image need not have).
USER 10001:10001

# The defaults a container wants (each may be overridden): listen on every interface, JSON
# logs, metrics and /healthz on 9090.
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    INTAKE_LISTEN_ADDR=0.0.0.0:8080 \
    METRICS_LISTEN_ADDR=0.0.0.0:9090 \
    LOG_FORMAT=json
EXPOSE 8080 9090

# /healthz on METRICS_LISTEN_ADDR, which every long-running command serves.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/healthcheck"]

# Stop with SIGTERM, and allow more than SHUTDOWN_GRACE_SECONDS (20 s by default) before the
# kill: `docker stop` waits 10 s unless told otherwise, so `docker stop -t 30`; on ECS,
# `stopTimeout: 30` (infra/services.yaml).
STOPSIGNAL SIGTERM
CMD ["order-intake"]
