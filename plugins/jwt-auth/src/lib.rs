//! HS256 JWT authorization. The client presents a token (bearer header,
//! `herald_token` cookie or `token` query parameter); the plugin verifies it
//! with the secret from the tenant config and maps its claims:
//! `sub` → subject, `role` → audience, `channels` (patterns) → what the
//! subject may subscribe to. Patterns may end in `*` (prefix match) and may
//! contain `{sub}`.
//!
//! Tenant config: `{"secret": "...", "default_channels": ["public.*"]}`.

use base64::Engine as _;
use herald_sdk::{ConnectRequest, Denial, Session};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::OnceLock;

struct JwtAuth;

#[derive(serde::Deserialize, Default)]
struct Config {
    #[serde(default)]
    secret: String,
    #[serde(default)]
    default_channels: Vec<String>,
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| serde_json::from_str(&herald_sdk::config()).unwrap_or_default())
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
}

#[derive(serde::Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    nbf: Option<u64>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    channels: Option<Vec<String>>,
}

fn deny(code: &str, message: &str) -> Denial {
    Denial {
        code: code.into(),
        message: message.into(),
    }
}

fn verify(token: &str, secret: &[u8], now_s: u64) -> Result<Claims, Denial> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(deny("invalid_token", "token is not a JWT"));
    };
    let header: Header = b64
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| deny("invalid_token", "bad JWT header"))?;
    if header.alg != "HS256" {
        return Err(deny("invalid_token", "only HS256 tokens are accepted"));
    }
    let sig = b64
        .decode(s)
        .map_err(|_| deny("invalid_token", "bad JWT signature encoding"))?;
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret).map_err(|_| deny("misconfigured", "bad secret"))?;
    mac.update(h.as_bytes());
    mac.update(b".");
    mac.update(p.as_bytes());
    mac.verify_slice(&sig)
        .map_err(|_| deny("invalid_token", "signature does not match"))?;
    let claims: Claims = b64
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| deny("invalid_token", "bad JWT claims"))?;
    if claims.exp.is_some_and(|exp| exp <= now_s) {
        return Err(deny("expired", "token has expired"));
    }
    if claims.nbf.is_some_and(|nbf| nbf > now_s) {
        return Err(deny("invalid_token", "token is not valid yet"));
    }
    Ok(claims)
}

fn matches(pattern: &str, subject: &str, channel: &str) -> bool {
    let p = pattern.replace("{sub}", subject);
    match p.strip_suffix('*') {
        Some(prefix) => channel.starts_with(prefix),
        None => channel == p,
    }
}

herald_sdk::plugin! {
    impl Plugin for JwtAuth {
        const NAME: &'static str = "jwt-auth";

        fn authorize_connect(req: ConnectRequest) -> Result<Session, Denial> {
            let cfg = config();
            if cfg.secret.is_empty() {
                return Err(deny("misconfigured", "tenant config has no `secret`"));
            }
            let token = req
                .credentials
                .ok_or_else(|| deny("missing_token", "no token presented"))?;
            let claims = verify(&token, cfg.secret.as_bytes(), herald_sdk::now_ms() / 1000)?;
            let channels = claims
                .channels
                .unwrap_or_else(|| cfg.default_channels.clone());
            Ok(Session {
                subject: claims.sub,
                audience: claims.role,
                attributes: vec![("channels".into(), channels.join("\n"))],
            })
        }

        fn authorize_subscribe(session: Session, channel: String) -> Result<(), Denial> {
            let patterns = session
                .attributes
                .iter()
                .find(|(k, _)| k == "channels")
                .map(|(_, v)| v.as_str())
                .unwrap_or("");
            if patterns
                .lines()
                .any(|p| matches(p, &session.subject, &channel))
            {
                Ok(())
            } else {
                Err(deny(
                    "forbidden",
                    &format!("{} may not subscribe to {channel}", session.subject),
                ))
            }
        }
    }
}
