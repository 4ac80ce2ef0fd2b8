#!/usr/bin/env bash
# Builds the example plugin (SPEC.md) in Python, JavaScript and C into
# plugins/target/example/{python,js,c}.wasm, installing each toolchain from
# the package registries on first use (componentize-py from PyPI,
# componentize-js from npm, Debian's clang + wasi-libc). The Rust one is a
# member of the plugins workspace (plugins/build.sh). The host's conformance
# suite (host/tests/it/conformance.rs) runs all four.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for lang in python js c; do
    start=$(date +%s)
    bash "$HERE/$lang/build.sh"
    echo "example/$lang built in $(( $(date +%s) - start )) s"
done
