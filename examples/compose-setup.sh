#!/bin/sh
# Creates the compose example's tenants: "ticks" fed by Kafka (channel from
# the record key) and "orders" fed by the outbox table. Both are public, so a
# browser can subscribe without a plugin. Idempotent: 409 means it exists.
set -eu
H="Authorization: Bearer $HERALD_ADMIN_TOKEN"
api() { curl -sS -H "$H" -H 'Content-Type: application/json' "$@"; echo; }
api -X POST "$HERALD_URL/admin/v1/tenants" -d '{"id":"ticks","access":"public","conflation":{"window_ms":100}}'
api -X PUT "$HERALD_URL/admin/v1/tenants/ticks/source" \
    -d '{"kind":"kafka","brokers":"kafka:9092","topics":["ticks"],"channel_from":"key"}'
api -X POST "$HERALD_URL/admin/v1/tenants" -d '{"id":"orders","access":"public"}'
api -X PUT "$HERALD_URL/admin/v1/tenants/orders/source" \
    -d '{"kind":"postgres_outbox","database_url":"postgres://herald:herald@postgres:5432/herald","table":"herald_outbox"}'
echo "tenants ready: ws://localhost:8080/v1/t/ticks/ws (ticks.AAPL …), ws://localhost:8080/v1/t/orders/ws (orders)"
