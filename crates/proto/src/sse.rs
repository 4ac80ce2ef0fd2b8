//! Server-Sent Events encoding without I/O.
//!
//! Owns: turning a JSON frame into an SSE event, and the `id:` format that
//! carries a session's per-channel positions so `Last-Event-ID` can resume every
//! channel of the stream. The id lists `epoch:seq` for each channel in the order
//! of the request's `ch` parameters, e.g. `id: 7:42,9:17`. Must never touch I/O.

use bytes::{BufMut, Bytes, BytesMut};
use std::fmt::Write as _;

/// Encodes `event: <op>` plus `data:` lines for one JSON frame, without the
/// terminating blank line so a per-session `id:` line can follow. JSON may
/// contain raw line breaks as whitespace (a pretty-printed payload); SSE ends
/// a line at CR, LF or CRLF, so each line, by any of them, becomes its own
/// `data:` line, which the client joins back with `\n`: no payload can start
/// a line the client would read as another field.
pub fn encode_event_body(op: &str, json: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(json.len() + op.len() + 16);
    out.put_slice(b"event: ");
    out.put_slice(op.as_bytes());
    out.put_u8(b'\n');
    let mut rest = json;
    loop {
        let (line, next) = match rest.find(['\r', '\n']) {
            Some(i) if rest[i..].starts_with("\r\n") => (&rest[..i], Some(&rest[i + 2..])),
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        out.put_slice(b"data: ");
        out.put_slice(line.as_bytes());
        out.put_u8(b'\n');
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
    out.freeze()
}

/// A complete event without an id (control events: gap, status, err).
pub fn encode_event(op: &str, json: &str) -> Bytes {
    let body = encode_event_body(op, json);
    let mut out = BytesMut::with_capacity(body.len() + 1);
    out.put_slice(&body);
    out.put_u8(b'\n');
    out.freeze()
}

/// The comment line that keeps proxies from closing an idle stream.
pub const HEARTBEAT: &[u8] = b":\n\n";

/// Appends `id: e:s,e:s\n\n` for the given positions.
pub fn write_id_line(out: &mut BytesMut, positions: &[(u64, u64)]) {
    let mut s = String::with_capacity(8 + positions.len() * 12);
    s.push_str("id: ");
    for (i, (epoch, seq)) in positions.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{epoch}:{seq}");
    }
    s.push_str("\n\n");
    out.put_slice(s.as_bytes());
}

/// Parses a `Last-Event-ID` value written by [`write_id_line`]. Returns `None`
/// for anything malformed or with a different channel count, so a client with
/// a stale or foreign id simply starts live.
pub fn parse_last_event_id(value: &str, channels: usize) -> Option<Vec<(u64, u64)>> {
    let out: Option<Vec<(u64, u64)>> = value
        .trim()
        .split(',')
        .map(|part| {
            let (e, s) = part.split_once(':')?;
            Some((e.parse().ok()?, s.parse().ok()?))
        })
        .collect();
    out.filter(|v| v.len() == channels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_line_json_becomes_several_data_lines() {
        let b = encode_event_body("msg", "{\n \"a\": 1\r\n}");
        assert_eq!(&b[..], b"event: msg\ndata: {\ndata:  \"a\": 1\ndata: }\n");
    }

    /// An SSE line ends at CR, LF or CRLF: a lone CR inside a payload (JSON
    /// allows it as whitespace between tokens) must not start a line the
    /// client reads as another field.
    #[test]
    fn a_lone_cr_in_a_payload_cannot_break_the_event() {
        let json = "{\"a\":1,\r\"b\":2,\r\n\"c\":3}";
        let b = encode_event_body("msg", json);
        assert_eq!(
            &b[..],
            b"event: msg\ndata: {\"a\":1,\ndata: \"b\":2,\ndata: \"c\":3}\n"
        );
        // Read back as a client does (every line a field; data lines joined
        // with LF): the payload is the same JSON, whitespace aside.
        let text = std::str::from_utf8(&b).unwrap();
        let lines: Vec<&str> = text.split(['\r', '\n']).filter(|l| !l.is_empty()).collect();
        assert!(
            lines[1..].iter().all(|l| l.starts_with("data: ")),
            "{lines:?}"
        );
        let data: Vec<&str> = lines[1..].iter().map(|l| &l[6..]).collect();
        let v: serde_json::Value = serde_json::from_str(&data.join("\n")).unwrap();
        assert_eq!(v, serde_json::json!({"a":1,"b":2,"c":3}));
    }

    #[test]
    fn ids_roundtrip() {
        let mut out = BytesMut::new();
        write_id_line(&mut out, &[(7, 42), (9, 0)]);
        assert_eq!(&out[..], b"id: 7:42,9:0\n\n");
        assert_eq!(
            parse_last_event_id("7:42,9:0", 2),
            Some(vec![(7, 42), (9, 0)])
        );
        assert_eq!(parse_last_event_id("7:42", 2), None);
        assert_eq!(parse_last_event_id("x:1", 1), None);
        assert_eq!(parse_last_event_id("", 1), None);
    }
}
