#!/usr/bin/env bash
# Builds every plugin component into plugins/target/wasm32-wasip2/release/*.wasm.
set -euo pipefail
cd "$(dirname "$0")"
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
cargo build --release --locked "$@"
ls -1 target/wasm32-wasip2/release/*.wasm
