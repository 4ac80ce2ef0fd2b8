#!/usr/bin/env bash
# Cost per call of the example plugin (plugins/example/SPEC.md) in each
# language, and of the typed encoding beside the flat one, measured in one
# run with `herald plugin test --repeat` (the server's own sandbox and call
# path, on one thread, no server). Prints medians and the ratio to Rust.
#
#   bash bench/plugin_languages.sh [herald binary] [repeat]
#
# Needs plugins/build.sh and plugins/example/build.sh to have run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERALD="${1:-$ROOT/target/release/herald}"
REPEAT="${2:-50}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
with open(f"{d}/ticks.jsonl", "w") as f:
    for i in range(512):
        v = {"sym": f"S{i % 50}", "px": f"{i}.25"}
        if i % 4 == 0:
            v["aud"] = "pro"
        f.write(json.dumps({"value": v}) + "\n")
with open(f"{d}/plain.jsonl", "w") as f:
    for i in range(512):
        f.write(json.dumps({"value": {"n": i, "px": i * 1.5}, "channel": "c", "key": f"k{i % 50}"}) + "\n")
PY
CONFIG='{"tokens":{"tok-alice":{"subject":"alice","audience":"pro"}}}'
declare -A PATHS=(
    [rust]="$ROOT/plugins/target/wasm32-wasip2/release/herald_example_rust.wasm"
    [python]="$ROOT/plugins/target/example/python.wasm"
    [js]="$ROOT/plugins/target/example/js.wasm"
    [c]="$ROOT/plugins/target/example/c.wasm"
)
run() { # component config records -> JSON report
    "$HERALD" plugin test "$1" --config "$2" --records "$3" --repeat "$REPEAT" \
        --connect '{"credentials":"tok-alice"}' --subscribe public.x \
        --deadline-ms 10000 --memory-mib 256 --json
}
for lang in rust python js c; do
    run "${PATHS[$lang]}" "$CONFIG" "$TMP/ticks.jsonl" > "$TMP/$lang.json"
done
run "$ROOT/plugins/target/wasm32-wasip2/release/fixture_passthrough.wasm" '{}' "$TMP/plain.jsonl" > "$TMP/flat.json"
run "$ROOT/plugins/target/wasm32-wasip2/release/fixture_passthrough.wasm" '{"typed":true}' "$TMP/plain.jsonl" > "$TMP/typed.json"

python3 - "$TMP" "$REPEAT" <<'PY'
import json, sys
d, repeat = sys.argv[1], sys.argv[2]
r = {k: json.load(open(f"{d}/{k}.json")) for k in ["rust", "python", "js", "c", "flat", "typed"]}
def row(name, j, base):
    t = j["transform"]
    per = t["ms"] * 1000 / t["records"]
    return (f"| {name} | {j['describe']['transform_encoding']} | {j['connect']['ms']*1000:.1f} | "
            f"{j['subscribe'][0]['ms']*1000:.1f} | {t['ms']:.2f} | {per:.2f} | "
            f"{t['ms']/base['transform']['ms']:.1f}x | {j['compile_ms']/1000:.1f} | {j['bytes']/1e6:.2f} |")
print(f"median of {repeat} calls each; transform: 512 records per call")
print("| plugin | transform | connect µs | subscribe µs | transform ms | µs/record | vs Rust | load s | MB |")
print("|---|---|---|---|---|---|---|---|---|")
for k in ["rust", "c", "js", "python"]:
    print(row(f"example ({k})", r[k], r["rust"]))
print(row("passthrough, flat", r["flat"], r["flat"]))
print(row("passthrough, typed", r["typed"], r["flat"]))
PY
