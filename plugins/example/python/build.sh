#!/usr/bin/env bash
# Builds the Python example plugin (SPEC.md beside ../) into
# plugins/target/example/python.wasm, from any working directory.
#
# The toolchain is componentize-py from PyPI (pinned in
# sdk/python/template/build.sh, which does the building: the same script
# `herald plugin new python` writes), installed on first use into
# plugins/target/example/python-venv. Cold: a few seconds of pip, then the
# build; warm: the build only, ~15 s of CPU (10-35 s on 2 busy cores).
# Writes an ~18.5 MB component.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
mkdir -p "$ROOT/plugins/target/example"
HERALD_PY_APP="$HERE/app.py" \
HERALD_PY_SDK="$ROOT/sdk/python/herald_plugin.py" \
HERALD_WIT="${HERALD_WIT:-$ROOT/sdk/wit}" \
HERALD_PY_OUT="$ROOT/plugins/target/example/python.wasm" \
HERALD_PY_VENV="$ROOT/plugins/target/example/python-venv" \
    bash "$ROOT/sdk/python/template/build.sh"
