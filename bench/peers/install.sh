#!/usr/bin/env bash
# Installs what the peer servers need, only if missing (idempotent, quiet when
# everything is already there):
#   - Debian: nginx-light + libnginx-mod-nchan   (peer "nchan", see nchan.conf)
#   - PyPI:   websockets 15.x                      (peer "py_broadcast.py")
# nginx is never left running as a system service: a temporary policy-rc.d
# forbids the package scripts from starting it during the install.
set -euo pipefail

DEB_PKGS=(nginx-light libnginx-mod-nchan)
PY_REQ='websockets==15.0.*'
PY_MAJOR=15

installed=()

missing_debs=()
for p in "${DEB_PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing_debs+=("$p")
    fi
done

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

if ((${#installed[@]})); then
    echo "peers/install.sh: installed ${installed[*]}"
fi
