#!/usr/bin/env bash
# Installs the Autobahn testsuite (autobahntestsuite 0.8.2, PyPI) for Python
# 2.7 into a folder of its own ($AB_DIR, default ~/.cache/herald/...), once.
# Its `zope` is a namespace package (zope.interface ships no __init__.py; the
# .pth that would declare it is not read from a --target folder). Prints the
# command that runs `wstest`.
set -euo pipefail
AB_DIR="${AB_DIR:-$HOME/.cache/herald/autobahntestsuite-0.8.2}"
PY27="${HERALD_PYTHON27:-/root/.pyenv/versions/2.7.18/bin/python}"
if [ ! -x "$PY27" ]; then
    echo "Python 2.7 not found at $PY27 (set HERALD_PYTHON27)" >&2
    exit 1
fi
if [ ! -f "$AB_DIR/site/autobahntestsuite/__init__.py" ]; then
    rm -rf "$AB_DIR"
    mkdir -p "$AB_DIR"
    "$PY27" -m pip install -q --disable-pip-version-check --target "$AB_DIR/site" 'autobahntestsuite==0.8.2'
fi
if [ ! -f "$AB_DIR/site/zope/__init__.py" ]; then
    echo "__path__ = __import__('pkgutil').extend_path(__path__, __name__)" > "$AB_DIR/site/zope/__init__.py"
fi
cat > "$AB_DIR/wstest" <<RUN
#!/usr/bin/env bash
PYTHONPATH="$AB_DIR/site" PYTHONWARNINGS=ignore exec "$PY27" "$AB_DIR/site/bin/wstest" "\$@"
RUN
chmod +x "$AB_DIR/wstest"
"$AB_DIR/wstest" --autobahnversion >/dev/null
echo "$AB_DIR/wstest"
