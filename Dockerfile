# Builds the `herald` binary and a small runtime image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p herald-host

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/herald /usr/local/bin/herald
# Not root: a user of its own, owning only its data dir (made 0700).
RUN useradd --system --uid 10001 --home-dir /var/lib/herald --shell /usr/sbin/nologin herald \
    && install -d -o herald -g herald -m 0700 /var/lib/herald
USER herald
ENV HERALD_LISTEN=0.0.0.0:8080 HERALD_DATA_DIR=/var/lib/herald
VOLUME /var/lib/herald
EXPOSE 8080
ENTRYPOINT ["herald"]
CMD ["serve"]
