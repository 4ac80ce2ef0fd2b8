//! Ticker with merging conflation: like ticker-conflate, but a window's ticks
//! of one symbol merge into one bar `{"sym","last","high","low","n"}` instead
//! of the latest tick winning. Declares the `merge` hook, so the host calls it
//! for every tick that meets an older one in the window.

use herald_sdk::{Output, Record};
use serde_json::{json, Value};

struct TickerMerge;

/// A tick or an already merged bar, as (sym, last, high, low, n).
fn bar(v: &Value) -> Option<(String, f64, f64, f64, u64)> {
    let sym = v.get("sym")?.as_str()?.to_string();
    if let Some(px) = v.get("px").and_then(Value::as_f64) {
        return Some((sym, px, px, px, 1));
    }
    Some((
        sym,
        v.get("last")?.as_f64()?,
        v.get("high")?.as_f64()?,
        v.get("low")?.as_f64()?,
        v.get("n")?.as_u64()?,
    ))
}

fn encode((sym, last, high, low, n): (String, f64, f64, f64, u64)) -> Vec<u8> {
    json!({"sym": sym, "last": last, "high": high, "low": low, "n": n})
        .to_string()
        .into_bytes()
}

herald_sdk::plugin! {
    impl Plugin for TickerMerge {
        const NAME: &'static str = "ticker-merge";

        fn transform(r: &Record<'_>, out: &mut Output) {
            let Some(b) = serde_json::from_slice::<Value>(r.value)
                .ok()
                .as_ref()
                .and_then(bar)
            else {
                return;
            };
            let ch = r
                .channel
                .map(str::to_string)
                .unwrap_or_else(|| format!("ticks.{}", b.0));
            let sym = b.0.clone();
            out.push_full(&ch, &encode(b), Some(&sym), None);
        }

        fn merge(_key: &str, older: &[u8], newer: &[u8]) -> Vec<u8> {
            let parse = |b: &[u8]| {
                serde_json::from_slice::<Value>(b)
                    .ok()
                    .as_ref()
                    .and_then(bar)
            };
            match (parse(older), parse(newer)) {
                (Some(o), Some(n)) => encode((n.0, n.1, o.2.max(n.2), o.3.min(n.3), o.4 + n.4)),
                _ => newer.to_vec(),
            }
        }
    }
}
