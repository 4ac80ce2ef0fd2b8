#!/usr/bin/env bash
# Runs Herald's whole test suite on a fresh machine: adds the wasm target,
# starts a throwaway PostgreSQL cluster (initdb into a temp dir, as the
# postgres user, stopped again on exit), builds the plugin components, then
# runs the SDK's and every workspace test with the Postgres registry tests
# required rather than skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
PG_PORT="${HERALD_TEST_PG_PORT:-55432}"

log() { printf '\n== %s\n' "$*"; }

log "toolchain"
rustup target add wasm32-wasip2 >/dev/null 2>&1 || rustup target add wasm32-wasip2
if ! pkg-config --exists openssl 2>/dev/null; then
    log "installing OpenSSL headers (librdkafka is built with TLS for the Kafka source)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev pkg-config >/dev/null
fi

newest_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
if [ ! -x "$PG_BIN/initdb" ] && [ -x "$(newest_pg_bin)/initdb" ]; then
    PG_BIN="$(newest_pg_bin)"
fi
if [ ! -x "$PG_BIN/initdb" ]; then
    log "installing PostgreSQL (initdb not found in $PG_BIN)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    PG_BIN="$(newest_pg_bin)"
fi

# The outbox tests start clusters of their own with the same binaries.
export PG_BIN

PG_DIR="$(mktemp -d /tmp/herald-pg.XXXXXX)"
PG_STARTED=0
cleanup() {
    if [ "$PG_STARTED" = 1 ]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PG_DIR"
}
trap cleanup EXIT

log "throwaway PostgreSQL on 127.0.0.1:$PG_PORT"
chown postgres "$PG_DIR"
runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
    -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1" start >/dev/null
PG_STARTED=1
runuser -u postgres -- "$PG_BIN/createdb" -h "$PG_DIR" -p "$PG_PORT" herald_test
export HERALD_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/herald_test"
export HERALD_REQUIRE_POSTGRES=1

log "benchmark peers (nginx + nchan from Debian, Python websockets from PyPI) for the bench smoke runs"
bash bench/peers/install.sh

log "plugins (wasm32-wasip2 components the integration tests load)"
./plugins/build.sh

log "the example plugin in Python, JavaScript and C (the conformance suite's components)"
./plugins/example/build.sh

log "browser test toolchain (Chromium from Debian, playwright-core from npm; nothing downloads a browser)"
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
(cd clients/js/test && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
export HERALD_REQUIRE_BROWSER=1

log "schemathesis (an API fuzzer, from PyPI) for the OpenAPI smoke run"
ST_VENV="${HERALD_ST_VENV:-$HOME/.cache/herald/schemathesis-4.32.5}"
if [ ! -x "$ST_VENV/bin/st" ]; then
    python3 -m venv "$ST_VENV"
    "$ST_VENV/bin/pip" install -q 'schemathesis==4.32.5'
fi
export HERALD_SCHEMATHESIS="$ST_VENV/bin/st" HERALD_REQUIRE_SCHEMATHESIS=1

log "sdk unit tests"
(cd sdk && cargo test --locked)

log "cargo test"
cargo test --workspace --locked
