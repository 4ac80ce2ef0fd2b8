#!/usr/bin/env bash
# Builds the C example plugin (SPEC.md beside ../) into
# plugins/target/example/c.wasm, from any working directory.
#
# The toolchain comes from the package registries (Debian: clang, lld,
# wasi-libc, libclang-rt-*-dev-wasm32; npm: preview2-shim and the jco /
# jco-transpile tarballs), installed on first use by sdk/c/template/build.sh,
# which does the building (the same script `herald plugin new c` writes).
# The wit-bindgen output it compiles is checked in (sdk/c/bindings/, see its
# README for the command that regenerates it), so no Rust is needed.
# Cold (nothing installed): ~1 min, mostly apt. Warm: ~2 s.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
mkdir -p "$ROOT/plugins/target/example"
HERALD_C_SOURCES="$HERE/example.c" \
HERALD_C_SDK="$ROOT/sdk/c" \
HERALD_C_BINDINGS="$ROOT/sdk/c/bindings" \
HERALD_C_WIT="$ROOT/sdk/wit" \
HERALD_C_OUT="$ROOT/plugins/target/example/c.wasm" \
HERALD_C_TOOLS="$ROOT/plugins/target/example/c-tools" \
    bash "$ROOT/sdk/c/template/build.sh"
