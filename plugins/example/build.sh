#!/usr/bin/env bash
# Builds the example plugin (SPEC.md) in Python, JavaScript and C into
# plugins/target/example/{python,js,c}.wasm, installing each toolchain from
# the package registries on first use (componentize-py from PyPI,
# componentize-js from npm, Debian's clang + wasi-libc). The Rust one is a
# member of the plugins workspace (plugins/build.sh). The host's conformance
# suite (host/tests/it/conformance.rs) runs all four.
#
# Cached by input: a language is built again only when a hash of what its
# build reads (its folder, the SDK of its language, the WIT, the build
# scripts that pin the toolchains) differs from the one recorded beside its
# component (<lang>.wasm.inputs), or the component is missing.
# HERALD_EXAMPLE_REBUILD=1 builds all three regardless.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$ROOT/plugins/target/example"
WIT="${HERALD_WIT:-$ROOT/sdk/wit}"

# The sha256 of every file under the given paths (names and contents),
# leaving out what builds write there (node_modules, .build).
inputs_hash() {
    {
        echo "wit=$WIT"
        find "$@" -type f -not -path '*/node_modules/*' -not -path '*/.build/*' -print0 \
            | sort -z | xargs -0 sha256sum
    } | sha256sum | cut -d' ' -f1
}

for lang in python js c; do
    start=$(date +%s)
    hash="$(inputs_hash "$HERE/$lang" "$ROOT/sdk/$lang" "$WIT")"
    stamp="$OUT/$lang.wasm.inputs"
    if [ "${HERALD_EXAMPLE_REBUILD:-0}" != 1 ] && [ -s "$OUT/$lang.wasm" ] \
        && [ "$(cat "$stamp" 2>/dev/null)" = "$hash" ]; then
        echo "example/$lang: inputs unchanged (${hash:0:12}), $OUT/$lang.wasm kept"
        continue
    fi
    rm -f "$stamp"
    bash "$HERE/$lang/build.sh"
    mkdir -p "$OUT"
    echo "$hash" > "$stamp"
    echo "example/$lang built in $(( $(date +%s) - start )) s"
done
