//! Ticker with latest-wins conflation: each JSON tick `{"sym":"AAPL","px":187.2}`
//! goes to the channel the source named (or `ticks.<SYM>`) with the symbol as
//! its conflation key, so inside a tenant's conflation window the host keeps
//! only the latest tick per symbol, without calling the plugin again.

use herald_sdk::{Level, Output, Record};
use serde_json::value::RawValue;

struct Ticker;

#[derive(serde::Deserialize)]
struct Tick<'a> {
    #[serde(borrow)]
    sym: &'a str,
    #[allow(dead_code)]
    #[serde(borrow, default)]
    px: Option<&'a RawValue>,
}

fn symbol_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

herald_sdk::plugin! {
    impl Plugin for Ticker {
        const NAME: &'static str = "ticker-conflate";

        fn transform(r: &Record<'_>, out: &mut Output) {
            let Ok(tick) = serde_json::from_slice::<Tick<'_>>(r.value) else {
                herald_sdk::log(Level::Debug, "dropping a record that is not a tick");
                return;
            };
            if !symbol_ok(tick.sym) {
                return;
            }
            match r.channel {
                Some(ch) => out.push_full(ch, r.value, Some(tick.sym), None),
                None => out.push_full(
                    &format!("ticks.{}", tick.sym),
                    r.value,
                    Some(tick.sym),
                    None,
                ),
            }
        }
    }
}
