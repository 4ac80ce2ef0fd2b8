//! The example plugin of plugins/example/SPEC.md, in Rust: API-key tokens
//! from the tenant config, subscribe rules by channel prefix, and a
//! transform that shapes ticks into `{"sym","px"}` with the symbol as the
//! conflation key and an optional audience. Its hostile triggers (config
//! `"hostile": true`) are what the host's conformance suite runs against
//! every language.

use herald_sdk::{ConnectRequest, Denial, Output, Record, Session};
use serde_json::Value;
use std::hash::{BuildHasher, RandomState};
use std::time::{SystemTime, UNIX_EPOCH};

struct Example;

/// The tenant config, parsed once per instance (a config change loads the
/// plugin again, in new instances).
fn config() -> &'static Value {
    static CONFIG: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| serde_json::from_str(&herald_sdk::config()).unwrap_or(Value::Null))
}

fn hostile(c: &Value) -> bool {
    c.get("hostile") == Some(&Value::Bool(true))
}

fn deny(code: &str, message: &str) -> Denial {
    Denial {
        code: code.into(),
        message: message.into(),
    }
}

fn thrown() -> ! {
    panic!("herald-example: thrown on request")
}

fn forever() -> ! {
    let mut i = 0u64;
    loop {
        i = std::hint::black_box(i.wrapping_add(1));
    }
}

fn bomb() -> ! {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = vec![0u8; 1 << 20];
        block[0] = kept.len() as u8;
        kept.push(std::hint::black_box(block));
    }
}

fn px_ok(px: &str) -> bool {
    let digits = |s: &str, max: usize| {
        (1..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
    };
    let unsigned = px.strip_prefix('-').unwrap_or(px);
    match unsigned.split_once('.') {
        Some((int, frac)) => digits(int, 12) && digits(frac, 8),
        None => digits(unsigned, 12),
    }
}

fn aud_ok(a: &str) -> bool {
    (1..=64).contains(&a.len())
        && a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

herald_sdk::plugin! {
    impl Plugin for Example {
        const NAME: &'static str = "herald-example-rust";
        const VERSION: &'static str = "1.0.0";

        fn authorize_connect(req: ConnectRequest) -> Result<Session, Denial> {
            let c = config();
            let token = req.credentials.as_deref();
            if hostile(c) {
                match token {
                    Some("hostile-throw") => thrown(),
                    Some("hostile-loop") => forever(),
                    Some("hostile-print") => println!("herald-example: connect printed"),
                    _ => {}
                }
            }
            let Some(token) = token else {
                return Err(deny("missing_token", "a token is required"));
            };
            let entry = c.get("tokens").and_then(|t| t.as_object()).and_then(|t| t.get(token));
            let invalid = || deny("invalid_token", "unknown token");
            let entry = entry.and_then(Value::as_object).ok_or_else(invalid)?;
            let subject = entry.get("subject").and_then(Value::as_str).ok_or_else(invalid)?;
            let audience = match entry.get("audience") {
                None | Some(Value::Null) => None,
                Some(Value::String(a)) => Some(a.clone()),
                Some(_) => return Err(invalid()),
            };
            Ok(Session {
                subject: subject.into(),
                audience,
                attributes: vec![("transport".into(), req.transport)],
            })
        }

        fn authorize_subscribe(session: Session, channel: String) -> Result<(), Denial> {
            if channel.starts_with("public.") || channel.starts_with("ticks.") {
                return Ok(());
            }
            let own = format!("user.{}", session.subject);
            if channel == own || channel.starts_with(&format!("{own}.")) {
                return Ok(());
            }
            if channel.starts_with("user.") {
                return Err(deny("forbidden", "not your channel"));
            }
            Err(deny("unknown_channel", "no such channel"))
        }

        fn transform(r: &Record<'_>, out: &mut Output) {
            let Ok(Value::Object(v)) = serde_json::from_slice::<Value>(r.value) else {
                return;
            };
            let Some(sym) = v.get("sym").and_then(Value::as_str) else {
                return;
            };
            if !(1..=12).contains(&sym.len()) || !sym.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return;
            }
            let mut px = v.get("px").and_then(Value::as_str).map(str::to_string);
            if hostile(config()) {
                match sym {
                    "LOOP" => forever(),
                    "BOMB" => bomb(),
                    "THROW" => thrown(),
                    "BADKEY" => {
                        out.push_full("ticks.BADKEY", b"{}", Some(&"k".repeat(200)), None);
                        return;
                    }
                    "BADCHAN" => {
                        out.push("bad channel!", b"{}");
                        return;
                    }
                    "PRINT" => println!("herald-example: transform printed {}", r.index),
                    "TIME" => {
                        let ms = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis());
                        px = Some(ms.to_string());
                    }
                    "RAND" => {
                        px = Some(format!("{:016x}", RandomState::new().hash_one("herald")));
                    }
                    _ => {}
                }
            }
            let Some(px) = px else { return };
            let replaced = hostile(config()) && matches!(sym, "TIME" | "RAND");
            if !replaced && !px_ok(&px) {
                return;
            }
            let audience = match v.get("aud") {
                None | Some(Value::Null) => None,
                Some(Value::String(a)) if aud_ok(a) => Some(a.as_str()),
                Some(_) => return,
            };
            let upper = sym.to_ascii_uppercase();
            let default_channel = format!("ticks.{upper}");
            let channel = r.channel.filter(|c| !c.is_empty()).unwrap_or(&default_channel);
            let payload = format!(r#"{{"sym":"{upper}","px":"{px}"}}"#);
            out.push_full(channel, payload.as_bytes(), Some(&upper), audience);
        }
    }
}
