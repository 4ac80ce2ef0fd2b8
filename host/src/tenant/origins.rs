//! A tenant's allowed origins: what it says of a request's `Origin`, the
//! CORS headers of its SSE answers, and the parsing of the stored list.

use super::TenantSettings;

/// What a tenant says of a request's `Origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginCheck {
    /// The tenant allows any origin.
    Any,
    /// The request names an origin the tenant lists (echoed in CORS).
    Allowed(String),
    /// The tenant lists origins and the request sent none (not a browser
    /// page: browsers always send one on WebSocket and cross-origin fetches).
    Absent,
    /// The request's origin is not one the tenant lists.
    Refused,
}

impl TenantSettings {
    pub fn check_origin(&self, origin: Option<&str>) -> OriginCheck {
        let Some(list) = &self.allowed_origins else {
            return OriginCheck::Any;
        };
        match origin {
            None => OriginCheck::Absent,
            Some(o) => {
                let o = o.trim().to_ascii_lowercase();
                if list.contains(&o) {
                    OriginCheck::Allowed(o)
                } else {
                    OriginCheck::Refused
                }
            }
        }
    }
}

/// Response headers as (name, value).
pub type Headers = Vec<(&'static str, String)>;

/// The CORS headers of an SSE response (or preflight) for a request from
/// `origin` to a tenant with `settings` (`None`: no such tenant, whose 404
/// any page may read). `Err` with the headers of a refusal when the tenant
/// does not allow the origin: no `Access-Control-Allow-Origin`, so the page
/// cannot read it.
pub fn cors_headers(
    settings: Option<&TenantSettings>,
    origin: Option<&str>,
) -> Result<Headers, Headers> {
    let any = || vec![("Access-Control-Allow-Origin", "*".to_string())];
    let Some(s) = settings else {
        return Ok(any());
    };
    let vary = ("Vary", "Origin".to_string());
    match s.check_origin(origin) {
        OriginCheck::Any => Ok(any()),
        OriginCheck::Allowed(o) => Ok(vec![
            ("Access-Control-Allow-Origin", o),
            ("Access-Control-Allow-Credentials", "true".to_string()),
            vary,
        ]),
        OriginCheck::Absent => Ok(vec![vary]),
        OriginCheck::Refused => Err(vec![vary]),
    }
}

/// Reads a tenant's `allowed_origins` (null, or an array of at most 100
/// origins of the form `http(s)://host[:port]`, no path), lowercased.
pub fn parse_origins(v: &serde_json::Value) -> Result<Option<Vec<String>>, String> {
    let items = match v {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Array(items) => items,
        _ => return Err("allowed_origins: must be an array of origins, or null for any".into()),
    };
    if items.len() > 100 {
        return Err("allowed_origins: at most 100 origins".into());
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Some(s) = item.as_str() else {
            return Err("allowed_origins: each must be a string".into());
        };
        let o = s.to_ascii_lowercase();
        let host = o
            .strip_prefix("https://")
            .or_else(|| o.strip_prefix("http://"))
            .ok_or_else(|| format!("allowed_origins: {s:?} must start with https:// or http://"))?;
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        if !valid {
            return Err(format!(
                "allowed_origins: {s:?} must be scheme://host[:port], without a path"
            ));
        }
        out.push(o);
    }
    Ok(Some(out))
}
