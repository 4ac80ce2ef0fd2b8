#!/usr/bin/env bash
# Publishes random ticks for a few symbols to the demo tenant, once a second each.
# Usage: HERALD_KEY=pk_… examples/ticker.sh [http://127.0.0.1:8080] [count]
set -euo pipefail
URL="${1:-http://127.0.0.1:8080}"
COUNT="${2:-60}"
: "${HERALD_KEY:?set HERALD_KEY to the publish key of the demo tenant}"
for ((i = 0; i < COUNT; i++)); do
    batch="["
    for sym in AAPL MSFT GOOG AMZN; do
        px=$(awk -v s="$RANDOM" 'BEGIN { printf "%.2f", 100 + s / 327.67 }')
        batch+="{\"ch\":\"ticks.$sym\",\"key\":\"$sym\",\"data\":{\"sym\":\"$sym\",\"px\":$px,\"i\":$i}},"
    done
    batch="${batch%,}]"
    curl -sS -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $HERALD_KEY" \
        -H 'Content-Type: application/json' -d "$batch" "$URL/v1/t/demo/publish"
    sleep 1
done
