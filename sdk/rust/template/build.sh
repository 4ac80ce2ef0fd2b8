#!/usr/bin/env bash
# Builds this Herald plugin (Rust) into target/plugin.wasm, from any
# directory. Needs rustup (the wasm32-wasip2 target is added on first use);
# herald-sdk/ (the SDK) and its wit/ are beside this script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true
cargo build --release --target wasm32-wasip2
# Cargo builds into $CARGO_TARGET_DIR when it is set; the component goes
# to target/plugin.wasm here either way.
mkdir -p target
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/my_herald_plugin.wasm" target/plugin.wasm
echo "target/plugin.wasm: $(wc -c < target/plugin.wasm) bytes"
