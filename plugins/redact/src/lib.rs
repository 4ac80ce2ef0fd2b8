//! Two audiences from one transform call: subscribers with audience `pro`
//! get the full JSON payload, `basic` subscribers the same message with the
//! configured fields removed. The audience comes from the presented token.
//!
//! Tenant config: `{"tokens": {"<token>": "pro" | "basic"}, "redact_fields": ["bid", "ask"]}`.

use herald_sdk::{ConnectRequest, Denial, Output, Record, Session};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::OnceLock;

struct Redact;

#[derive(serde::Deserialize, Default)]
struct Config {
    #[serde(default)]
    tokens: HashMap<String, String>,
    #[serde(default)]
    redact_fields: Vec<String>,
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| serde_json::from_str(&herald_sdk::config()).unwrap_or_default())
}

herald_sdk::plugin! {
    impl Plugin for Redact {
        const NAME: &'static str = "redact";

        fn authorize_connect(req: ConnectRequest) -> Result<Session, Denial> {
            let token = req.credentials.unwrap_or_default();
            match config().tokens.get(&token).map(String::as_str) {
                Some(role @ ("pro" | "basic")) => Ok(Session {
                    subject: format!("{role}-user"),
                    audience: Some(role.to_string()),
                    attributes: Vec::new(),
                }),
                _ => Err(Denial {
                    code: "invalid_token".into(),
                    message: "unknown token".into(),
                }),
            }
        }

        fn transform(r: &Record<'_>, out: &mut Output) {
            let Some(ch) = r.channel else { return };
            let key = r.key.and_then(|k| std::str::from_utf8(k).ok());
            out.push_full(ch, r.value, key, Some("pro"));
            let redacted = match serde_json::from_slice::<Map<String, Value>>(r.value) {
                Ok(mut obj) => {
                    for f in &config().redact_fields {
                        obj.remove(f);
                    }
                    serde_json::to_vec(&obj).unwrap_or_default()
                }
                // Not an object: nothing can be selectively removed, so basic gets nothing.
                Err(_) => return,
            };
            out.push_full(ch, &redacted, key, Some("basic"));
        }
    }
}
