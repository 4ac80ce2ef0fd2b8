//! The v1 client protocol, without I/O: what clients may send, what the server
//! answers, and the rules for channel names.
//!
//! Owns: parsing client operations, encoding server frames as JSON text, channel
//! name validation. Invariants: a server frame is valid JSON; a payload that is
//! already JSON is embedded as-is and never re-encoded per subscriber. Must never
//! touch sockets, clocks or tenant state.

pub mod deflate;
pub mod sse;
pub mod ws;

use serde::Deserialize;
use std::fmt::Write as _;

/// Longest channel name the protocol accepts.
pub const MAX_CHANNEL_LEN: usize = 128;

/// Why a channel name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelNameError {
    #[error("channel name is empty")]
    Empty,
    #[error("channel name is longer than {MAX_CHANNEL_LEN} characters")]
    TooLong,
    #[error("channel name contains {0:?}; allowed are A-Z a-z 0-9 _ . : @ -")]
    BadChar(char),
}

/// Checks a channel name against `[A-Za-z0-9_.:@-]{1,128}`.
pub fn validate_channel(name: &str) -> Result<(), ChannelNameError> {
    if name.is_empty() {
        return Err(ChannelNameError::Empty);
    }
    if name.len() > MAX_CHANNEL_LEN {
        return Err(ChannelNameError::TooLong);
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '@' | '-')))
    {
        Some(c) => Err(ChannelNameError::BadChar(c)),
        None => Ok(()),
    }
}

/// Tenant ids follow a stricter rule than channels because they appear in URLs
/// and metric labels: 1–64 chars of `[a-z0-9_-]`.
pub fn validate_tenant_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// One operation sent by a client over WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    Sub {
        ch: String,
        since: Option<u64>,
        epoch: Option<u64>,
        id: Option<u64>,
    },
    Unsub {
        ch: String,
        id: Option<u64>,
    },
    Ping {
        id: Option<u64>,
    },
}

/// A client frame that could not be understood, with the error code sent back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub msg: String,
}

/// Error codes carried by `{"op":"err"}` frames; clients branch on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    UnknownOp,
    BadChannel,
    Forbidden,
    TooManySubscriptions,
    NotSubscribed,
    /// The tenant's plugin failed; the request failed closed.
    PluginError,
    /// The tenant's plugin threads and their queue are full; try again.
    PluginBusy,
    /// The connection sent more operations than its budget allows.
    RateLimited,
    /// The tenant has as many channels as its subscribers may bring into being.
    TooManyChannels,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::BadChannel => "bad_channel",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TooManySubscriptions => "too_many_subscriptions",
            ErrorCode::NotSubscribed => "not_subscribed",
            ErrorCode::PluginError => "plugin_error",
            ErrorCode::PluginBusy => "plugin_busy",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::TooManyChannels => "too_many_channels",
        }
    }
}

#[derive(Deserialize)]
struct RawOp {
    op: Option<String>,
    ch: Option<String>,
    since: Option<u64>,
    epoch: Option<u64>,
    id: Option<u64>,
}

/// Parses one client text frame.
pub fn parse_client_op(text: &[u8]) -> Result<ClientOp, OpError> {
    let raw: RawOp = serde_json::from_slice(text).map_err(|e| OpError {
        id: None,
        code: ErrorCode::BadRequest,
        msg: format!("frame is not a valid operation object: {e}"),
    })?;
    let id = raw.id;
    let bad = |code, msg: String| OpError { id, code, msg };
    let channel = |ch: Option<String>| -> Result<String, OpError> {
        let ch = ch.ok_or_else(|| bad(ErrorCode::BadRequest, "field `ch` is required".into()))?;
        validate_channel(&ch).map_err(|e| bad(ErrorCode::BadChannel, e.to_string()))?;
        Ok(ch)
    };
    match raw.op.as_deref() {
        Some("sub") => Ok(ClientOp::Sub {
            ch: channel(raw.ch)?,
            since: raw.since,
            epoch: raw.epoch,
            id,
        }),
        Some("unsub") => Ok(ClientOp::Unsub {
            ch: channel(raw.ch)?,
            id,
        }),
        Some("ping") => Ok(ClientOp::Ping { id }),
        Some(other) => Err(bad(
            ErrorCode::UnknownOp,
            format!(
                "unknown op {:?}; expected sub, unsub or ping",
                truncate(other, 32)
            ),
        )),
        None => Err(bad(ErrorCode::BadRequest, "field `op` is required".into())),
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// How a payload travels inside a `msg` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// Valid JSON text, embedded as the value of `data`.
    Json,
    /// Arbitrary bytes, embedded as a base64 string with `"enc":"base64"`.
    Binary,
}

/// Encodes `{"op":"msg",...}` once per channel message.
pub fn encode_msg(ch: &str, seq: u64, prev: u64, payload: &[u8], kind: PayloadKind) -> String {
    let mut out = String::with_capacity(payload.len() + ch.len() + 64);
    out.push_str("{\"op\":\"msg\",\"ch\":");
    push_json_str(&mut out, ch);
    let _ = write!(out, ",\"seq\":{seq},\"prev\":{prev},\"data\":");
    match kind {
        PayloadKind::Json => {
            // The caller guarantees valid JSON; it is UTF-8 by definition.
            out.push_str(std::str::from_utf8(payload).unwrap_or("null"));
        }
        PayloadKind::Binary => {
            use base64::Engine as _;
            out.push('"');
            base64::engine::general_purpose::STANDARD.encode_string(payload, &mut out);
            out.push_str("\",\"enc\":\"base64\"");
        }
    }
    out.push('}');
    out
}

/// `{"op":"ack","id":7,"ch":"…","epoch":…,"seq":…}`; channel fields only for sub.
pub fn encode_ack(id: Option<u64>, sub: Option<(&str, u64, u64)>) -> String {
    let mut out = String::from("{\"op\":\"ack\"");
    if let Some(id) = id {
        let _ = write!(out, ",\"id\":{id}");
    }
    if let Some((ch, epoch, seq)) = sub {
        out.push_str(",\"ch\":");
        push_json_str(&mut out, ch);
        let _ = write!(out, ",\"epoch\":{epoch},\"seq\":{seq}");
    }
    out.push('}');
    out
}

/// `{"op":"err","id":…,"code":…,"msg":…}`.
pub fn encode_err(id: Option<u64>, code: ErrorCode, msg: &str) -> String {
    let mut out = String::from("{\"op\":\"err\"");
    if let Some(id) = id {
        let _ = write!(out, ",\"id\":{id}");
    }
    out.push_str(",\"code\":\"");
    out.push_str(code.as_str());
    out.push_str("\",\"msg\":");
    push_json_str(&mut out, msg);
    out.push('}');
    out
}

/// `{"op":"gap","ch":…,"from":…,"to":…}`: positions `from..=to` cannot be delivered.
pub fn encode_gap(ch: &str, from: u64, to: u64) -> String {
    let mut out = String::from("{\"op\":\"gap\",\"ch\":");
    push_json_str(&mut out, ch);
    let _ = write!(out, ",\"from\":{from},\"to\":{to}}}");
    out
}

/// `{"op":"status","source":…,"state":…,"since_ms":…}`.
pub fn encode_status(source: &str, state: &str, since_ms: u64) -> String {
    let mut out = String::from("{\"op\":\"status\",\"source\":");
    push_json_str(&mut out, source);
    out.push_str(",\"state\":");
    push_json_str(&mut out, state);
    let _ = write!(out, ",\"since_ms\":{since_ms}}}");
    out
}

/// `{"op":"pong","id":…}`, the answer to a client `ping`.
pub fn encode_pong(id: Option<u64>) -> String {
    match id {
        Some(id) => format!("{{\"op\":\"pong\",\"id\":{id}}}"),
        None => "{\"op\":\"pong\"}".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_rules() {
        assert!(validate_channel("ticks.AAPL").is_ok());
        assert!(validate_channel("a:b@c-d_e").is_ok());
        assert_eq!(validate_channel(""), Err(ChannelNameError::Empty));
        assert_eq!(
            validate_channel(&"a".repeat(129)),
            Err(ChannelNameError::TooLong)
        );
        assert!(validate_channel(&"a".repeat(128)).is_ok());
        assert_eq!(validate_channel("a b"), Err(ChannelNameError::BadChar(' ')));
        assert_eq!(validate_channel("é"), Err(ChannelNameError::BadChar('é')));
    }

    #[test]
    fn parses_ops() {
        assert_eq!(
            parse_client_op(br#"{"op":"sub","ch":"ticks.AAPL","since":41,"id":7}"#),
            Ok(ClientOp::Sub {
                ch: "ticks.AAPL".into(),
                since: Some(41),
                epoch: None,
                id: Some(7)
            })
        );
        assert_eq!(
            parse_client_op(br#"{"op":"unsub","ch":"x","id":8}"#),
            Ok(ClientOp::Unsub {
                ch: "x".into(),
                id: Some(8)
            })
        );
        assert_eq!(
            parse_client_op(br#"{"op":"ping"}"#),
            Ok(ClientOp::Ping { id: None })
        );
    }

    #[test]
    fn rejects_bad_ops_with_codes() {
        assert_eq!(
            parse_client_op(b"{nope").unwrap_err().code,
            ErrorCode::BadRequest
        );
        let e = parse_client_op(br#"{"op":"dance","id":3}"#).unwrap_err();
        assert_eq!((e.code, e.id), (ErrorCode::UnknownOp, Some(3)));
        let e = parse_client_op(br#"{"op":"sub","ch":"bad name","id":4}"#).unwrap_err();
        assert_eq!((e.code, e.id), (ErrorCode::BadChannel, Some(4)));
        assert_eq!(
            parse_client_op(br#"{"op":"sub"}"#).unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_client_op(br#"[1,2]"#).unwrap_err().code,
            ErrorCode::BadRequest
        );
    }

    #[test]
    fn frames_are_valid_json() {
        let m = encode_msg("a\"b", 2, 1, br#"{"x":[1,2]}"#, PayloadKind::Json);
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v["data"]["x"][1], 2);
        assert_eq!(v["ch"], "a\"b");
        let b = encode_msg("c", 3, 2, &[0, 255, 10], PayloadKind::Binary);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["enc"], "base64");
        assert_eq!(v["data"], "AP8K");
        for s in [
            encode_ack(Some(1), Some(("c", 9, 4))),
            encode_ack(None, None),
            encode_err(Some(2), ErrorCode::Forbidden, "no \n way"),
            encode_gap("c", 1, 5),
            encode_status("kafka", "stalled", 12),
            encode_pong(Some(3)),
        ] {
            serde_json::from_str::<serde_json::Value>(&s).unwrap();
        }
    }
}
