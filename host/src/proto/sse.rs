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
/// contain raw newlines (a pretty-printed payload); each line becomes its own
/// `data:` line, which the client joins back with `\n`.
pub fn encode_event_body(op: &str, json: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(json.len() + op.len() + 16);
    out.put_slice(b"event: ");
    out.put_slice(op.as_bytes());
    out.put_u8(b'\n');
    for line in json.split('\n') {
        out.put_slice(b"data: ");
        out.put_slice(line.trim_end_matches('\r').as_bytes());
        out.put_u8(b'\n');
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
