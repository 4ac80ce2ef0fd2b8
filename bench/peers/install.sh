#!/usr/bin/env bash
# Installs what the peer servers need, only if missing (idempotent, quiet when
# everything is already there):
#   - Debian: nginx-light + libnginx-mod-nchan   (peer "nchan", see nchan.conf)
#   - PyPI:   websockets 15.x                      (peer "py_broadcast.py")
#   - npm:    @trufflesuite/uws-js-unofficial 20.30.0-unofficial.0
#             (uWebSockets.js v20.30 with prebuilt binaries; peer "uws_pubsub.js")
#             into $HERALD_UWS_DIR (default ${XDG_CACHE_HOME:-~/.cache}/herald/uws),
#             outside the repository; Debian's nodejs/npm first if node/npm are
#             missing.
# nginx is never left running as a system service: a temporary policy-rc.d
# forbids the package scripts from starting it during the install.
set -euo pipefail

DEB_PKGS=(nginx-light libnginx-mod-nchan)
PY_REQ='websockets==15.0.*'
PY_MAJOR=15
UWS_PKG='@trufflesuite/uws-js-unofficial'
UWS_VER='20.30.0-unofficial.0'
UWS_DIR="${HERALD_UWS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/herald/uws}"

installed=()

# The pinned uWS package is there and its native binary loads (the package
# silently falls back to a slow pure-JS `ws` emulation when the prebuilt binary
# for this platform / Node ABI is missing: that one has no SHARED_COMPRESSOR).
uws_ok() {
    UWS_USE_FALLBACK='' node -e '
        const dir = require("path").join(process.argv[1], "node_modules", process.argv[2]);
        if (require(dir + "/package.json").version !== process.argv[3]) process.exit(1);
        process.exit(typeof require(dir).SHARED_COMPRESSOR === "number" ? 0 : 1);
    ' "$UWS_DIR" "$UWS_PKG" "$UWS_VER"
}
need_uws=0
if ! uws_ok 2>/dev/null; then
    need_uws=1
fi

missing_debs=()
for p in "${DEB_PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing_debs+=("$p")
    fi
done
if ((need_uws)); then
    command -v node >/dev/null || missing_debs+=(nodejs)
    command -v npm >/dev/null || missing_debs+=(npm)
fi

if ((${#missing_debs[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "install.sh: need root to install ${missing_debs[*]}" >&2
        exit 1
    fi
    # Forbid service starts while installing (exit 101 = action not allowed).
    policy=/usr/sbin/policy-rc.d
    backup=""
    if [[ -e $policy ]]; then
        backup=$(mktemp /tmp/policy-rc.d.XXXXXX)
        cp -p "$policy" "$backup"
    fi
    restore_policy() {
        if [[ -n $backup ]]; then mv -f "$backup" "$policy"; else rm -f "$policy"; fi
    }
    trap restore_policy EXIT
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"

    export DEBIAN_FRONTEND=noninteractive
    apt_install() {
        apt-get install -y -qq --no-install-recommends "${missing_debs[@]}" >/tmp/peers-apt.log 2>&1
    }
    if ! apt_install; then
        apt-get update -qq >/dev/null
        if ! apt_install; then
            cat /tmp/peers-apt.log >&2
            exit 1
        fi
    fi
    restore_policy
    trap - EXIT
    installed+=("${missing_debs[@]}")
fi

if ! python3 -c "import websockets, sys; sys.exit(0 if int(websockets.__version__.split('.')[0]) == $PY_MAJOR else 1)" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$PY_REQ"
    installed+=("python:$PY_REQ")
fi

if ((need_uws)); then
    mkdir -p "$UWS_DIR"
    # A package.json pinning the exact version: a later `npm install` there
    # keeps it (instead of pruning an unsaved package).
    printf '{\n  "private": true,\n  "dependencies": { "%s": "%s" }\n}\n' \
        "$UWS_PKG" "$UWS_VER" >"$UWS_DIR/package.json"
    # --omit=optional: bufferutil/utf-8-validate only serve the JS fallback.
    if ! npm install --prefix "$UWS_DIR" --no-audit --no-fund --omit=optional \
        --loglevel=error >/tmp/peers-npm.log 2>&1; then
        cat /tmp/peers-npm.log >&2
        exit 1
    fi
    if ! uws_ok; then
        echo "install.sh: $UWS_PKG@$UWS_VER installed in $UWS_DIR but its native binary" \
            "does not load with node $(node --version) (ABI $(node -p process.versions.modules))" >&2
        exit 1
    fi
    installed+=("npm:$UWS_PKG@$UWS_VER($UWS_DIR)")
fi

if ((${#installed[@]})); then
    echo "peers/install.sh: installed ${installed[*]}"
fi
