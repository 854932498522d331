# One image with every binary; docker-compose.yml picks the one to run with `command`.
#
# Needs BuildKit for the cache mounts (`RUN --mount=type=cache`), which its built-in
# Dockerfile frontend supports: the default builder since Docker 23, `DOCKER_BUILDKIT=1` before.
# No `# syntax=` line: that would make every build pull a frontend image from a registry.

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The cache mounts keep the crates.io download and the target directory between builds,
# so a source change recompiles our crates only (no cargo-chef needed). Binaries are
# copied out because a cache mount is not part of the image, and stripped of their debug
# info there (the release profile keeps line tables for profiling on a host: in the image
# they were 301 MB of 434); symbols stay, so a panic's backtrace still names functions.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p gateway -p seckill-api -p order-service -p seckill-loadtest \
    && mkdir -p /out \
    && cp target/release/gateway target/release/seckill-api target/release/order-service \
          target/release/seckill-loadtest target/release/seckill-token /out/ \
    && strip --strip-debug /out/*

FROM debian:bookworm-slim
# ca-certificates for outbound TLS a deployment may add; curl for the healthchecks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin seckill
COPY --from=builder /out/ /usr/local/bin/
USER seckill
ENV SECKILL_LOG_FORMAT=json
EXPOSE 8080 8081 8082
CMD ["gateway"]
