//! A Herald plugin in Rust: tokens from the tenant config, subscriptions
//! to `public.*` and the subject's own `user.<subject>.*`, and a transform
//! that passes records through with their key as the conflation key.
//! Build with `bash build.sh`; try it with
//! `herald plugin test target/plugin.wasm --records records.jsonl`.

use herald_sdk::{ConnectRequest, Denial, Level, Output, Record, Session};
use serde_json::Value;
use std::sync::OnceLock;

struct MyPlugin;

/// The tenant config, parsed once per instance (a config change loads
/// the plugin again).
fn config() -> &'static Value {
    static CONFIG: OnceLock<Value> = OnceLock::new();
    CONFIG.get_or_init(|| serde_json::from_str(&herald_sdk::config()).unwrap_or(Value::Null))
}

fn deny(code: &str, message: &str) -> Denial {
    Denial {
        code: code.into(),
        message: message.into(),
    }
}

herald_sdk::plugin! {
    impl Plugin for MyPlugin {
        const NAME: &'static str = "my-herald-plugin";
        const VERSION: &'static str = "0.1.0";

        // Config: {"tokens": {"<token>": "<subject>"}}
        fn authorize_connect(req: ConnectRequest) -> Result<Session, Denial> {
            let token = req.credentials.ok_or_else(|| deny("missing_token", "a token is required"))?;
            let subject = config()["tokens"][token.as_str()]
                .as_str()
                .ok_or_else(|| deny("invalid_token", "unknown token"))?;
            // The host's log, under the tenant's name (`herald plugin test` shows it).
            herald_sdk::log(Level::Info, &format!("connect: {subject}"));
            Ok(Session {
                subject: subject.into(),
                audience: None,
                attributes: Vec::new(),
            })
        }

        fn authorize_subscribe(session: Session, channel: String) -> Result<(), Denial> {
            let own = format!("user.{}.", session.subject);
            if channel.starts_with("public.") || channel.starts_with(&own) {
                Ok(())
            } else {
                Err(deny("forbidden", "not your channel"))
            }
        }

        fn transform(r: &Record<'_>, out: &mut Output) {
            let key = r.key.and_then(|k| std::str::from_utf8(k).ok());
            out.push_full(r.channel.unwrap_or("public.default"), r.value, key, None);
        }
    }
}
