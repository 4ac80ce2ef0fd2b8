#!/usr/bin/env bash
# Builds the JavaScript ticker plugin (npm registry: componentize-js, ~400 MB
# of node_modules; ~35 s). Not part of plugins/build.sh: only `bench plugin
# --also plugins/target/js/ticker_js.wasm` uses it.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error
node build.mjs
