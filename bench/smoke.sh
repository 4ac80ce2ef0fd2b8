#!/usr/bin/env bash
# Runs every scenario at tiny scale (50 connections, about a second of
# traffic); fails if a connection is refused or a frame is lost. Loopback only,
# nothing recorded. Takes a few seconds once the release builds exist.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p herald-host -p bench
bench=./target/release/bench
$bench idle --smoke --no-record --deadline-secs 30
$bench idle --smoke --transport sse --no-record --deadline-secs 30
$bench fanout --smoke --baseline raw --no-record --deadline-secs 30
$bench fanout --smoke --channels 10 --subs-per-conn 3 --batch 5 --no-record --deadline-secs 30
$bench plugin --smoke --no-record --deadline-secs 60
$bench ingest --source kafka --smoke --no-record --deadline-secs 60
