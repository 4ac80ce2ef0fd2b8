#!/usr/bin/env bash
# Issue 12: a restart with ten plugin tenants (five Python, five JavaScript
# example components; uploads compile in the background): when does the node
# listen, when does each tenant serve, when is it ready? Loopback only; stops
# the server it started, by its PID.
#   bash bench/restart_plugins.sh   (after plugins/example/build.sh and a release build)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
H="${HERALD:-$ROOT/target/release/herald}"
D=$(mktemp -d); PORT=18931; TOK=bench-admin-token-0123456789
U=http://127.0.0.1:$PORT
start() { $H serve --listen 127.0.0.1:$PORT --data-dir $D --admin-token $TOK --log warn > $D/log 2>&1 & echo $! > $D/pid; }
start; until curl -sf $U/healthz >/dev/null; do sleep 0.05; done
declare -A KEY
for i in $(seq 0 9); do
  lang=python; [ $((i % 2)) = 1 ] && lang=js
  t=t$i
  KEY[$t]=$(curl -sf -H "authorization: Bearer $TOK" -H 'content-type: application/json' $U/admin/v1/tenants \
     -d "{\"id\":\"$t\",\"access\":\"plugin\",\"config\":{\"tokens\":{}},\"limits\":{\"plugin_deadline_ms\":500,\"plugin_memory_bytes\":134217728}}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["publish_key"])')
  st=$(curl -s -H "authorization: Bearer $TOK" --data-binary @$ROOT/plugins/target/example/$lang.wasm $U/admin/v1/tenants/$t/plugins)
  url=$(echo "$st" | python3 -c 'import json,sys;print(json.load(sys.stdin).get("status_url",""))')
  while :; do v=$(curl -s -H "authorization: Bearer $TOK" $U$url); echo "$v" | grep -q '"stored"' && break; echo "$v" | grep -q failed && { echo "$v"; exit 1; }; sleep 0.2; done
  curl -sf -X POST -H "authorization: Bearer $TOK" $U/admin/v1/tenants/$t/plugins/1/activate >/dev/null
done
echo "10 tenants active; artifacts: $(ls $D/compiled | wc -l); RSS before restart: $(grep VmRSS /proc/$(cat $D/pid)/status)"
kill -TERM $(cat $D/pid); while kill -0 $(cat $D/pid) 2>/dev/null; do sleep 0.05; done
t0=$(date +%s%N); start
until curl -sf $U/healthz >/dev/null; do sleep 0.01; done
echo "listening after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
declare -A DONE; n=0
while [ $n -lt 10 ]; do
  for i in $(seq 0 9); do
    t=t$i; [ -n "${DONE[$t]:-}" ] && continue
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer ${KEY[$t]}" -H 'content-type: application/json' $U/v1/t/$t/publish -d '{"data":{"sym":"abc","px":"1"}}')
    if [ "$code" = 200 ]; then DONE[$t]=$(( ($(date +%s%N) - t0) / 1000000 )); n=$((n+1)); fi
  done
  sleep 0.01
done
for i in $(seq 0 9); do echo "t$i serves after ${DONE[t$i]} ms"; done
until curl -sf $U/readyz >/dev/null; do sleep 0.01; done
echo "ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms; RSS: $(grep VmRSS /proc/$(cat $D/pid)/status)"
kill -TERM $(cat $D/pid); wait 2>/dev/null || true; rm -rf $D
