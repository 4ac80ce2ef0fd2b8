#!/usr/bin/env bash
# Builds this Herald plugin (Python) into a WebAssembly component.
#
#   bash build.sh            -> target/plugin.wasm
#
# Expects beside it (`herald plugin new python` copies them in): app.py (the
# plugin: a module whose top level defines `Guest = herald_plugin.export(...)`),
# herald_plugin.py (the SDK) and wit/ (the contract, herald.wit). Each of those
# places can be moved with an environment variable (below); Herald's own
# plugins/example/python/build.sh builds through this script that way.
# Other *.py files beside app.py go in too, and so does vendor/ if present
# (pure-Python packages: `pip install --target vendor PKG`).
#
# Toolchain: componentize-py (PyPI, pinned below; it carries its own CPython
# for WebAssembly), installed on first use into a virtualenv beside the
# output. Needs python3 (3.10+) with venv. Cold: a few seconds of pip, then
# the build; a build is ~15 s of CPU (10-35 s on a busy 2-core machine).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
APP="${HERALD_PY_APP:-$HERE/app.py}"                     # the plugin module
SDK="${HERALD_PY_SDK:-$HERE/herald_plugin.py}"           # the SDK
WIT="${HERALD_WIT:-$HERE/wit}"                           # herald.wit (a file or its folder)
OUT="${HERALD_PY_OUT:-$HERE/target/plugin.wasm}"
VENV="${HERALD_PY_VENV:-$(dirname "$OUT")/python-venv}"  # componentize-py
PYTHON="${PYTHON:-python3}"

COMPONENTIZE_PY_VERSION=0.25.1

say() { echo "herald-python: $*" >&2; }

for f in "$APP" "$SDK"; do
    [ -f "$f" ] || { say "missing $f"; exit 1; }
done
[ -e "$WIT" ] || { say "missing $WIT (the folder with herald.wit)"; exit 1; }

# ---- 1. componentize-py (PyPI) ------------------------------------------------
CPY="$VENV/bin/componentize-py"
if [ "$("$CPY" --version 2>/dev/null)" != "componentize-py $COMPONENTIZE_PY_VERSION" ]; then
    say "installing componentize-py $COMPONENTIZE_PY_VERSION into $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || {
        say "'$PYTHON -m venv' failed: install python3-venv (Debian/Ubuntu) or set PYTHON"
        exit 1
    }
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "componentize-py==$COMPONENTIZE_PY_VERSION"
fi

# ---- 2. component ----------------------------------------------------------------
# The sources are staged in a folder of their own: componentize-py puts what
# its python path holds within reach of the app, and nothing else should be.
mkdir -p "$(dirname "$OUT")"
STAGE="$OUT.src"
rm -rf "$STAGE"
mkdir -p "$STAGE"
APP_DIR="$(cd "$(dirname "$APP")" && pwd)"
cp "$APP_DIR"/*.py "$STAGE/"
cp "$SDK" "$STAGE/herald_plugin.py"
MODULE="$(basename "$APP" .py)"
EXTRA=()
[ -d "$APP_DIR/vendor" ] && EXTRA=(-p "$APP_DIR/vendor")
# componentize-py generates the bindings (package wit_world) from the WIT
# world `plugin` as it builds; `componentize-py -d wit -w plugin bindings .`
# writes them out for an editor.
(
    cd "$STAGE"
    unset VIRTUAL_ENV
    "$CPY" -d "$WIT" -w plugin componentize "$MODULE" -p "$STAGE" ${EXTRA[@]+"${EXTRA[@]}"} -o "$OUT.tmp" >/dev/null
)
mv "$OUT.tmp" "$OUT"
rm -rf "$STAGE"
say "wrote $OUT ($(wc -c < "$OUT") bytes)"
