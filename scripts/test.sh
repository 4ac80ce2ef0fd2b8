#!/usr/bin/env bash
# Runs Herald's whole test suite on a fresh machine: adds the wasm target,
# starts a throwaway PostgreSQL cluster (initdb into a temp dir, as the
# postgres user, stopped again on exit), builds the plugin components, then
# runs the SDK's and every workspace test with the Postgres registry tests
# required rather than skipped (the browser test, schemathesis and the
# Autobahn testsuite against Herald's WebSocket session path included).
#
# Every step runs under `timeout` and prints how long it took; the end prints
# where the time went (also on failure). A step over its bound fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
PG_PORT="${HERALD_TEST_PG_PORT:-55432}"

log() { printf '\n== %s\n' "$*"; }

STEPS=()
summary() {
    if [ "${#STEPS[@]}" -gt 0 ]; then
        printf '\n== where the time went\n'
        printf '%s\n' "${STEPS[@]}"
    fi
}

# step NAME SECONDS COMMAND...: runs COMMAND under a bound, records its time.
step() {
    local name="$1" secs="$2"
    shift 2
    log "$name (at most ${secs} s)"
    local t0=$SECONDS rc=0
    timeout --kill-after=30 "$secs" "$@" || rc=$?
    local took=$((SECONDS - t0))
    if [ "$rc" -ne 0 ]; then
        local why="exit $rc"
        [ "$rc" -eq 124 ] && why="over its bound of ${secs} s"
        STEPS+=("$(printf '%6d s  %s  FAILED (%s)' "$took" "$name" "$why")")
        printf '\n== %s FAILED (%s) after %d s\n' "$name" "$why" "$took"
        exit 1
    fi
    STEPS+=("$(printf '%6d s  %s' "$took" "$name")")
    printf '== %s: %d s\n' "$name" "$took"
}

# The wasm components and the SDK's own tests build in one background lane
# beside the test build (cargo's build of the tests leaves about a third of
# the two cores idle in its long single-crate stretches): each is a step with
# its bound and time as above, its output kept in a log printed by
# `lane_join`, which fails the run if any of them failed.
LANE_DIR="$(mktemp -d /tmp/herald-lane.XXXXXX)"
LANE=()
lane_add() { LANE+=("$(printf '%s\t%s\t%s' "$1" "$2" "$3")"); }
lane_run() {
    local i=0 line name secs cmd rc t0
    for line in "${LANE[@]}"; do
        IFS=$'\t' read -r name secs cmd <<<"$line"
        t0=$SECONDS rc=0
        timeout --kill-after=30 "$secs" bash -c "$cmd" >"$LANE_DIR/$i.log" 2>&1 || rc=$?
        echo "$rc $((SECONDS - t0))" >"$LANE_DIR/$i.rc"
        [ "$rc" -ne 0 ] && break
        i=$((i + 1))
    done
}
lane_start() {
    log "started in the background, beside the next steps:"
    local line
    for line in "${LANE[@]}"; do printf '   %s (at most %s s)\n' "${line%%$'\t'*}" "$(cut -f2 <<<"$line")"; done
    lane_run &
    LANE_PID=$!
}
lane_join() {
    wait "$LANE_PID" || true
    local i=0 line name secs rc took failed=0
    for line in "${LANE[@]}"; do
        IFS=$'\t' read -r name secs _ <<<"$line"
        log "$name (ran in the background)"
        cat "$LANE_DIR/$i.log" 2>/dev/null || true
        if [ ! -f "$LANE_DIR/$i.rc" ]; then
            STEPS+=("$(printf '%6s    %s  NOT RUN (an earlier background step failed)' '-' "$name")")
            failed=1
        else
            read -r rc took <"$LANE_DIR/$i.rc"
            if [ "$rc" -ne 0 ]; then
                local why="exit $rc"
                [ "$rc" -eq 124 ] && why="over its bound of ${secs} s"
                STEPS+=("$(printf '%6d s  %s (background)  FAILED (%s)' "$took" "$name" "$why")")
                printf '\n== %s FAILED (%s) after %d s\n' "$name" "$why" "$took"
                failed=1
            else
                STEPS+=("$(printf '%6d s  %s (background)' "$took" "$name")")
                printf '== %s: %d s\n' "$name" "$took"
            fi
        fi
        i=$((i + 1))
    done
    [ "$failed" -eq 0 ] || exit 1
}

toolchain() {
    rustup target add wasm32-wasip2 >/dev/null 2>&1 || rustup target add wasm32-wasip2
    if ! pkg-config --exists openssl 2>/dev/null; then
        echo "installing OpenSSL headers (librdkafka is built with TLS for the Kafka source)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev pkg-config >/dev/null
    fi
    newest_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
    if [ ! -x "$PG_BIN/initdb" ] && [ ! -x "$(newest_pg_bin)/initdb" ]; then
        echo "installing PostgreSQL (initdb not found in $PG_BIN)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    if [ ! -x /usr/bin/chromium ]; then
        echo "installing Chromium from Debian (the browser test; nothing downloads a browser)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
}
export -f toolchain
export PG_BIN
step "toolchain (wasm target, OpenSSL headers, PostgreSQL, Chromium)" 900 bash -c toolchain

if [ ! -x "$PG_BIN/initdb" ]; then
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
fi
# The outbox tests start clusters of their own with the same binaries.
export PG_BIN

PG_DIR="$(mktemp -d /tmp/herald-pg.XXXXXX)"
PG_STARTED=0
cleanup() {
    local rc=$?
    if [ "$PG_STARTED" = 1 ]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PG_DIR"
    # A background step still running when the run ends early: its
    # `timeout` passes the signal on to what it runs.
    if [ -n "${LANE_PID:-}" ] && kill -0 "$LANE_PID" 2>/dev/null; then
        pkill -TERM -P "$LANE_PID" 2>/dev/null || true
        kill "$LANE_PID" 2>/dev/null || true
    fi
    rm -rf "$LANE_DIR"
    summary
    exit "$rc"
}
trap cleanup EXIT

# A throwaway cluster; a port some other process holds is skipped (the next
# of ten is tried), so a leftover server cannot fail the run.
start_pg() {
    chown postgres "$PG_DIR"
    runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
    local port
    for port in $(seq "$PG_PORT" $((PG_PORT + 9))); do
        if runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w -t 60 \
            -o "-p $port -k $PG_DIR -c listen_addresses=127.0.0.1" start >/dev/null; then
            echo "$port" > "$PG_DIR/port"
            runuser -u postgres -- "$PG_BIN/createdb" -h "$PG_DIR" -p "$port" herald_test
            return 0
        fi
        echo "port $port: PostgreSQL did not start ($(tail -1 "$PG_DIR/log" 2>/dev/null)); trying the next"
    done
    return 1
}
export -f start_pg
export PG_DIR PG_PORT
PG_STARTED=1
step "throwaway PostgreSQL on 127.0.0.1:$PG_PORT (or the next free port)" 180 bash -c start_pg
PG_PORT="$(cat "$PG_DIR/port")"
export HERALD_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/herald_test"
export HERALD_REQUIRE_POSTGRES=1

step "benchmark peers (nginx + nchan from Debian, Python websockets from PyPI, uWebSockets.js from npm) for the bench smoke runs" \
    900 bash bench/peers/install.sh

lane_add "plugins (wasm32-wasip2 components the integration tests load)" 1200 ./plugins/build.sh
lane_add "the example plugin in Python, JavaScript and C (the conformance suite's components)" \
    1200 ./plugins/example/build.sh
lane_add "sdk unit tests" 900 'cd sdk && cargo test --locked'

# npm ci, skipped while node_modules was installed from these very
# package.json and package-lock.json (their sha256 is kept beside it).
npm_ci_cached() {
    local hash
    hash="$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)"
    if [ -d node_modules ] && [ "$(cat node_modules/.herald-inputs 2>/dev/null)" = "$hash" ]; then
        echo "$(pwd): package.json and package-lock.json unchanged (${hash:0:12}), node_modules kept"
        return 0
    fi
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
    echo "$hash" > node_modules/.herald-inputs
}
export -f npm_ci_cached
step "browser test driver (playwright-core from npm)" 600 \
    bash -c 'cd clients/js/test && npm_ci_cached'
export HERALD_REQUIRE_BROWSER=1

ST_VENV="${HERALD_ST_VENV:-$HOME/.cache/herald/schemathesis-4.32.5}"
install_schemathesis() {
    if [ ! -x "$ST_VENV/bin/st" ]; then
        python3 -m venv "$ST_VENV"
        "$ST_VENV/bin/pip" install -q 'schemathesis==4.32.5'
    fi
}
export -f install_schemathesis
export ST_VENV
step "schemathesis (an API fuzzer, from PyPI) for the OpenAPI smoke run" 600 bash -c install_schemathesis
export HERALD_SCHEMATHESIS="$ST_VENV/bin/st" HERALD_REQUIRE_SCHEMATHESIS=1

export AB_DIR="${HERALD_AUTOBAHN_DIR:-$HOME/.cache/herald/autobahntestsuite-0.8.2}"
step "Autobahn testsuite 0.8.2 (PyPI) under Python 2.7" 900 bash scripts/autobahn-install.sh
# tests/it/autobahn.rs runs its fuzzing client against Herald's session path.
export HERALD_AUTOBAHN="$AB_DIR/wstest" HERALD_REQUIRE_AUTOBAHN=1


# cargo-nextest runs the workspace's tests, each in a process of its own,
# under the bounds and groups of .config/nextest.toml.
install_nextest() {
    cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest
}
export -f install_nextest
step "cargo-nextest (crates.io, when missing)" 1200 bash -c install_nextest

lane_start
step "build the tests" 2400 bash -c 'cargo nextest list --workspace --locked >/dev/null'
lane_join
step "every workspace test, one process each (unit, integration, layers, bench smoke, browser, schemathesis, Autobahn)" \
    3600 cargo nextest run --workspace --locked
echo "per-test durations: target/nextest/default/junit.xml"
