# syntax=docker/dockerfile:1
# Sluice container image: `docker build -t sluice .` at the repository root.
#
#   docker run -d --name sluice -p 7777:7777 -v sluice-data:/var/lib/sluice sluice
#
# Configuration: /etc/sluice/sluice.toml (config/sluice.toml, every key with
# its default; mount your own over it), then SLUICE_<SECTION>__<KEY>
# environment variables, which win over the file. The image sets two of them:
# the listen address (all interfaces, port 7777) and the store path (the
# /var/lib/sluice volume). See docs/operating.md.

# --- build ---------------------------------------------------------------------
# Same Debian release as the runtime stage, so the binary's glibc matches. The
# slim Rust image has gcc and libc headers, which the vendored C of LMDB and
# secp256k1 need; nothing else is required.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary
# is copied out of the cached target directory, which is not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p sluice --bin sluice \
    && install -D -m 0755 target/release/sluice /out/sluice

# --- runtime -------------------------------------------------------------------
FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="A Nostr relay with adaptive throttling" \
      org.opencontainers.image.licenses="MIT"

# A fixed, unprivileged uid/gid: files on a bind-mounted store must be owned by
# 10001 (`chown -R 10001:10001 DIR`); a named volume gets it from the image.
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice \
       --no-create-home --shell /usr/sbin/nologin sluice \
    && install -d -o sluice -g sluice -m 0750 /var/lib/sluice \
    && install -d -m 0755 /etc/sluice

COPY --from=build /out/sluice /usr/local/bin/sluice
COPY config/sluice.toml /etc/sluice/sluice.toml

ENV SLUICE_SERVER__LISTEN=0.0.0.0:7777 \
    SLUICE_STORE__PATH=/var/lib/sluice

VOLUME ["/var/lib/sluice"]
EXPOSE 7777
USER sluice:sluice
WORKDIR /var/lib/sluice

# /healthz with no extra package: bash (in debian:bookworm-slim already) opens
# the TCP connection itself and sends a one-line HTTP/1.0 request; the check
# passes on a "200" status line. Installing curl would add a dozen libraries
# to the image only for this. The port follows SLUICE_SERVER__LISTEN.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${SLUICE_SERVER__LISTEN##*:} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && read -r -t 4 status <&3 && [[ $status == *' 200 '* ]]"]

# SIGTERM (docker stop) makes sluice answer pending EVENTs, close sessions,
# commit the writer's queue and close the store, then exit 0. Give it more
# than server.shutdown_grace_ms: `docker stop -t 30`, or stop_grace_period.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/sluice.toml"]
