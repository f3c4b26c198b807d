# syntax=docker/dockerfile:1.7
# The engram server image: built in a Rust image, run from distroless (no
# shell, no package manager) as a non-root user, binding 0.0.0.0.
#
#   docker build -t engram .
#   docker run --rm engram token new --tenant default --admin   # a token and its line
#   docker run -p 50051:50051 -p 9090:9090 -e ENGRAM_TOKENS='<the line>' engram
#
# Without tokens the server refuses a non-loopback bind; ENGRAM_AUTH=none
# turns authentication off explicitly (a local try-out only).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Cache the registry and the build between image builds; copy the binary
# out of the cache mount so the next stage can see it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin engram \
 && cp target/release/engram /engram \
 && mkdir -p /data

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /engram /usr/local/bin/engram
# The embedded store's default home; mount a volume here, or point
# ENGRAM_DATABASE_URL at Postgres.
COPY --from=build --chown=65532:65532 /data /data
ENV ENGRAM_GRPC_ADDR=0.0.0.0:50051 \
    ENGRAM_HTTP_ADDR=0.0.0.0:9090 \
    ENGRAM_LOG_FORMAT=json \
    ENGRAM_DATABASE_URL=sqlite:///data/engram.db
USER 65532:65532
EXPOSE 50051 9090
# /readyz on loopback: unhealthy while the database is unreachable or the
# server shuts down. (Kubernetes ignores this and uses the chart's probes.)
HEALTHCHECK --interval=10s --timeout=6s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/engram", "health"]
VOLUME ["/data"]
ENTRYPOINT ["/usr/local/bin/engram"]
CMD ["serve"]
