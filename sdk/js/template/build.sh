#!/usr/bin/env bash
# Builds plugin.js into dist/plugin.wasm, from any directory. Needs Node 18+
# and npm; installs componentize-js and esbuild (pinned in package-lock.json,
# about 400 MB of node_modules) from the npm registry. Expects
# herald-plugin.js and wit/herald.wit beside it; set HERALD_WIT to build
# against another WIT folder (world `plugin`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# npm ci unless node_modules was installed from this very lock file.
if [ ! -f package-lock.json ]; then
  npm install --no-audit --no-fund --loglevel=error
elif [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ] \
    || [ package.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
node build.mjs
