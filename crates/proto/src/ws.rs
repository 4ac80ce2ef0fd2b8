//! WebSocket framing (RFC 6455) without I/O.
//!
//! Owns: decoding frames from bytes a caller already holds, reassembling
//! fragmented messages, encoding frames, and the handshake accept key. It keeps
//! no buffers of its own between calls: an idle connection holds nothing here,
//! which is how a session stays under its memory budget. Must never read from
//! or write to a socket.

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use sha1::{Digest, Sha1};

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(client_key: &str) -> String {
    let mut h = Sha1::new();
    h.update(client_key.trim().as_bytes());
    h.update(GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    Continuation,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl OpCode {
    fn from_u8(b: u8) -> Option<OpCode> {
        Some(match b {
            0 => OpCode::Continuation,
            1 => OpCode::Text,
            2 => OpCode::Binary,
            8 => OpCode::Close,
            9 => OpCode::Ping,
            10 => OpCode::Pong,
            _ => return None,
        })
    }
    fn as_u8(self) -> u8 {
        match self {
            OpCode::Continuation => 0,
            OpCode::Text => 1,
            OpCode::Binary => 2,
            OpCode::Close => 8,
            OpCode::Ping => 9,
            OpCode::Pong => 10,
        }
    }
    pub fn is_control(self) -> bool {
        matches!(self, OpCode::Close | OpCode::Ping | OpCode::Pong)
    }
}

/// Why a byte stream is not acceptable WebSocket; each maps to a close code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooBig { size: u64, limit: usize },
    #[error("text message is not valid UTF-8")]
    BadUtf8,
    #[error("compressed message is not valid DEFLATE data")]
    BadDeflate,
}

impl FrameError {
    pub fn close_code(&self) -> u16 {
        match self {
            FrameError::Protocol(_) => close::PROTOCOL,
            FrameError::TooBig { .. } => close::TOO_BIG,
            FrameError::BadUtf8 | FrameError::BadDeflate => close::BAD_DATA,
        }
    }
}

/// Close codes Herald sends.
pub mod close {
    /// Whether a peer may put `code` in a close frame (RFC 6455 §7.4): the
    /// defined codes but 1004-1006 and 1015 (reserved, or only for APIs to
    /// report that there was none), and 3000-4999 (libraries, applications).
    pub fn may_be_sent(code: u16) -> bool {
        matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }

    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const PROTOCOL: u16 = 1002;
    pub const UNSUPPORTED: u16 = 1003;
    pub const BAD_DATA: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    /// The node restarts or drains: reconnect (RFC 6455 registry: Service Restart).
    pub const SERVICE_RESTART: u16 = 1012;
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The tenant was deleted or its access changed.
    pub const TENANT_GONE: u16 = 4000;
    /// The session's outbound queue overflowed under the `disconnect` policy.
    pub const SLOW_CONSUMER: u16 = 4001;
    /// What admitted the session changed (the tenant's plugin version, its
    /// config, its allowed origins): reconnect to be authorized again.
    pub const REAUTHORIZE: u16 = 4004;
    /// No frame arrived from the client within the heartbeat timeout.
    pub const HEARTBEAT_TIMEOUT: u16 = 4002;
    /// An operator disconnected the session (`POST …/disconnect`, the
    /// default code there); the client may reconnect.
    pub const DISCONNECTED: u16 = 4003;
}

/// A decoded frame header; the payload sits in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub fin: bool,
    pub opcode: OpCode,
    /// RSV1: the message this frame begins is compressed (permessage-deflate).
    pub compressed: bool,
    /// Payload range inside the buffer passed to [`decode_frame`].
    pub payload_start: usize,
    pub payload_len: usize,
}

impl FrameHead {
    /// Bytes consumed by this frame, header included.
    pub fn frame_len(&self) -> usize {
        self.payload_start + self.payload_len
    }
}

/// Which side's frames are being decoded: clients must mask, servers must not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Decoding frames a client sent (server side).
    FromClient,
    /// Decoding frames a server sent (client side, used by tests and bench).
    FromServer,
}

/// Decodes one frame at the start of `buf`, unmasking its payload in place.
/// Returns `Ok(None)` when more bytes are needed.
pub fn decode_frame(
    buf: &mut [u8],
    role: Role,
    max_payload: usize,
) -> Result<Option<FrameHead>, FrameError> {
    decode_frame_with(buf, role, max_payload, false)
}

/// [`decode_frame`] on a connection that agreed to permessage-deflate
/// (`deflate`): RSV1 may then mark the first frame of a data message.
pub fn decode_frame_with(
    buf: &mut [u8],
    role: Role,
    max_payload: usize,
    deflate: bool,
) -> Result<Option<FrameHead>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let b0 = buf[0];
    let b1 = buf[1];
    let allowed = if deflate { 0x40 } else { 0 };
    if b0 & 0x70 & !allowed != 0 {
        return Err(FrameError::Protocol(
            "reserved bits set without an extension",
        ));
    }
    let compressed = b0 & 0x40 != 0;
    let opcode = OpCode::from_u8(b0 & 0x0f).ok_or(FrameError::Protocol("unknown opcode"))?;
    if compressed && !matches!(opcode, OpCode::Text | OpCode::Binary) {
        return Err(FrameError::Protocol(
            "RSV1 on a control or continuation frame",
        ));
    }
    let fin = b0 & 0x80 != 0;
    let masked = b1 & 0x80 != 0;
    match (role, masked) {
        (Role::FromClient, false) => return Err(FrameError::Protocol("client frame not masked")),
        (Role::FromServer, true) => return Err(FrameError::Protocol("server frame masked")),
        _ => {}
    }
    let mut pos = 2;
    let len = match b1 & 0x7f {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            pos = 4;
            u64::from(u16::from_be_bytes([buf[2], buf[3]]))
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            pos = 10;
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    if opcode.is_control() && (len > 125 || !fin) {
        return Err(FrameError::Protocol(
            "control frame fragmented or longer than 125 bytes",
        ));
    }
    if len > max_payload as u64 {
        return Err(FrameError::TooBig {
            size: len,
            limit: max_payload,
        });
    }
    let len = len as usize;
    let mask = if masked {
        if buf.len() < pos + 4 {
            return Ok(None);
        }
        let m = [buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]];
        pos += 4;
        Some(m)
    } else {
        None
    };
    if buf.len() < pos + len {
        return Ok(None);
    }
    if let Some(m) = mask {
        for (i, b) in buf[pos..pos + len].iter_mut().enumerate() {
            *b ^= m[i & 3];
        }
    }
    Ok(Some(FrameHead {
        fin,
        opcode,
        compressed,
        payload_start: pos,
        payload_len: len,
    }))
}

/// A complete message or control frame, after reassembly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong,
    /// Close with the peer's code, if it sent one.
    Close(Option<u16>),
}

/// Reassembles fragmented data messages. Holds a buffer only while a
/// fragmented message is in flight.
#[derive(Debug, Default)]
pub struct Assembler {
    /// The message's opcode, whether it is compressed, its bytes so far.
    partial: Option<(OpCode, bool, Vec<u8>)>,
}

impl Assembler {
    /// True while a fragmented message has begun and not ended.
    pub fn in_progress(&self) -> bool {
        self.partial.is_some()
    }

    /// Feeds one decoded frame; returns a message when one is complete.
    pub fn push(
        &mut self,
        head: FrameHead,
        payload: &[u8],
        max_message: usize,
    ) -> Result<Option<Message>, FrameError> {
        match head.opcode {
            OpCode::Ping => Ok(Some(Message::Ping(payload.to_vec()))),
            OpCode::Pong => Ok(Some(Message::Pong)),
            OpCode::Close => {
                let code = match payload.len() {
                    0 => None,
                    1 => return Err(FrameError::Protocol("close payload of one byte")),
                    _ => Some(u16::from_be_bytes([payload[0], payload[1]])),
                };
                if code.is_some_and(|c| !close::may_be_sent(c)) {
                    return Err(FrameError::Protocol("close code that must not be sent"));
                }
                if payload.len() > 2 && std::str::from_utf8(&payload[2..]).is_err() {
                    return Err(FrameError::BadUtf8);
                }
                Ok(Some(Message::Close(code)))
            }
            OpCode::Continuation => {
                let Some((_, _, buf)) = self.partial.as_mut() else {
                    return Err(FrameError::Protocol(
                        "continuation without a started message",
                    ));
                };
                if buf.len() + payload.len() > max_message {
                    let size = (buf.len() + payload.len()) as u64;
                    self.partial = None;
                    return Err(FrameError::TooBig {
                        size,
                        limit: max_message,
                    });
                }
                buf.extend_from_slice(payload);
                if !head.fin {
                    return Ok(None);
                }
                let (op, compressed, buf) = self.partial.take().expect("checked above");
                finish(op, compressed, buf, max_message).map(Some)
            }
            OpCode::Text | OpCode::Binary => {
                if self.partial.is_some() {
                    return Err(FrameError::Protocol(
                        "new message before the previous one ended",
                    ));
                }
                if head.fin {
                    return finish(head.opcode, head.compressed, payload.to_vec(), max_message)
                        .map(Some);
                }
                self.partial = Some((head.opcode, head.compressed, payload.to_vec()));
                Ok(None)
            }
        }
    }
}

/// A whole message: inflated (at most `max_message` bytes) if it came
/// compressed, checked as UTF-8 if it is text.
fn finish(
    op: OpCode,
    compressed: bool,
    buf: Vec<u8>,
    max_message: usize,
) -> Result<Message, FrameError> {
    let buf = if compressed {
        crate::deflate::inflate(&buf, max_message)?
    } else {
        buf
    };
    if op == OpCode::Text {
        if std::str::from_utf8(&buf).is_err() {
            return Err(FrameError::BadUtf8);
        }
        Ok(Message::Text(buf))
    } else {
        Ok(Message::Binary(buf))
    }
}

fn put_head(out: &mut BytesMut, opcode: OpCode, len: usize, masked: bool) {
    out.put_u8(0x80 | opcode.as_u8());
    let m = if masked { 0x80 } else { 0 };
    if len < 126 {
        out.put_u8(m | len as u8);
    } else if len <= u16::MAX as usize {
        out.put_u8(m | 126);
        out.put_u16(len as u16);
    } else {
        out.put_u8(m | 127);
        out.put_u64(len as u64);
    }
}

/// Encodes an unmasked server frame: done once per channel message and shared.
pub fn encode_frame(opcode: OpCode, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(payload.len() + 10);
    put_head(&mut out, opcode, payload.len(), false);
    out.extend_from_slice(payload);
    out.freeze()
}

/// Encodes an unmasked server frame whose payload is `compressed`, a message
/// compressed by [`crate::deflate::compress`] (RSV1 set).
pub fn encode_compressed_frame(opcode: OpCode, compressed: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(compressed.len() + 10);
    put_head(&mut out, opcode, compressed.len(), false);
    out[0] |= 0x40;
    out.extend_from_slice(compressed);
    out.freeze()
}

/// The payload of an unmasked frame `encode_frame` made.
pub fn server_frame_payload(frame: &[u8]) -> &[u8] {
    let start = match frame.get(1).map(|b| b & 0x7f) {
        Some(126) => 4,
        Some(127) => 10,
        Some(_) => 2,
        None => return &[],
    };
    frame.get(start..).unwrap_or(&[])
}

/// Encodes a masked client frame (tests and the load generator).
pub fn encode_client_frame(opcode: OpCode, payload: &[u8], mask: [u8; 4]) -> Bytes {
    let mut out = BytesMut::with_capacity(payload.len() + 14);
    put_head(&mut out, opcode, payload.len(), true);
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    out.freeze()
}

/// Encodes a close frame; the reason is cut to fit the 125-byte control limit.
pub fn encode_close(code: u16, reason: &str) -> Bytes {
    let mut r = reason.as_bytes();
    if r.len() > 123 {
        let mut cut = 123;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        r = &r[..cut];
    }
    let mut payload = Vec::with_capacity(2 + r.len());
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(r);
    encode_frame(OpCode::Close, &payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_accept_key() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    fn roundtrip(len: usize) {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut f = encode_client_frame(OpCode::Binary, &payload, [1, 2, 3, 4]).to_vec();
        // Every prefix is "need more".
        for cut in 0..f.len() {
            let mut part = f[..cut].to_vec();
            assert_eq!(
                decode_frame(&mut part, Role::FromClient, 1 << 20),
                Ok(None),
                "cut {cut}"
            );
        }
        let total = f.len();
        let head = decode_frame(&mut f, Role::FromClient, 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!(head.frame_len(), total);
        assert_eq!(&f[head.payload_start..head.frame_len()], &payload[..]);
    }

    /// A client's close frame with `payload`, through decode and reassembly.
    fn client_close(payload: &[u8]) -> Result<Option<Message>, FrameError> {
        let mut f = encode_client_frame(OpCode::Close, payload, [9, 8, 7, 6]).to_vec();
        let head = decode_frame(&mut f, Role::FromClient, 1 << 10)?.expect("whole frame");
        let body = f[head.payload_start..head.frame_len()].to_vec();
        Assembler::default().push(head, &body, 1 << 10)
    }

    /// RFC 6455 §7.4 and §8.1, as the Autobahn suite's close cases check them.
    #[test]
    fn close_frames_conform() {
        assert_eq!(client_close(b""), Ok(Some(Message::Close(None))));
        for ok in [
            1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999,
        ] {
            let mut p = ok.to_be_bytes().to_vec();
            p.extend_from_slice("bye ✓".as_bytes());
            assert_eq!(client_close(&p), Ok(Some(Message::Close(Some(ok)))), "{ok}");
        }
        // Codes a peer must never send fail the connection with 1002.
        for bad in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535] {
            let e = client_close(&bad.to_be_bytes()).unwrap_err();
            assert_eq!(e.close_code(), close::PROTOCOL, "{bad}");
        }
        assert_eq!(
            client_close(&[3]).unwrap_err().close_code(),
            close::PROTOCOL
        );
        // A reason that is not UTF-8 fails it with 1007.
        let mut p = 1000u16.to_be_bytes().to_vec();
        p.extend_from_slice(&[
            0xce, 0xba, 0xe1, 0xbd, 0xb9, 0xcf, 0x83, 0xce, 0xbc, 0xce, 0xb5, 0xed, 0xa0, 0x80,
        ]);
        assert_eq!(client_close(&p).unwrap_err().close_code(), close::BAD_DATA);
    }

    #[test]
    fn decodes_all_length_forms() {
        for len in [0, 1, 125, 126, 127, 65535, 65536, 70000] {
            roundtrip(len);
        }
    }

    #[test]
    fn server_frames_decode_on_client_side() {
        let mut f = encode_frame(OpCode::Text, b"hello").to_vec();
        let h = decode_frame(&mut f, Role::FromServer, 100)
            .unwrap()
            .unwrap();
        assert_eq!(&f[h.payload_start..h.frame_len()], b"hello");
        assert!(decode_frame(&mut f, Role::FromClient, 100).is_err());
    }

    #[test]
    fn rejects_bad_frames() {
        let mut unmasked = encode_frame(OpCode::Text, b"x").to_vec();
        assert!(matches!(
            decode_frame(&mut unmasked, Role::FromClient, 100),
            Err(FrameError::Protocol(_))
        ));
        let mut big = encode_client_frame(OpCode::Text, &[b'a'; 200], [0; 4]).to_vec();
        assert_eq!(
            decode_frame(&mut big, Role::FromClient, 100),
            Err(FrameError::TooBig {
                size: 200,
                limit: 100
            })
        );
        let mut rsv = vec![0xC1, 0x80, 0, 0, 0, 0];
        assert!(decode_frame(&mut rsv, Role::FromClient, 100).is_err());
        let mut op = vec![0x83, 0x80, 0, 0, 0, 0];
        assert!(decode_frame(&mut op, Role::FromClient, 100).is_err());
    }

    #[test]
    fn reassembles_fragments_and_checks_utf8() {
        let mut a = Assembler::default();
        let h = |fin, opcode, len| FrameHead {
            fin,
            opcode,
            compressed: false,
            payload_start: 0,
            payload_len: len,
        };
        assert_eq!(a.push(h(false, OpCode::Text, 3), b"hel", 100), Ok(None));
        assert_eq!(
            a.push(h(true, OpCode::Ping, 0), b"", 100),
            Ok(Some(Message::Ping(vec![])))
        );
        assert_eq!(
            a.push(h(true, OpCode::Continuation, 2), b"lo", 100),
            Ok(Some(Message::Text(b"hello".to_vec())))
        );
        assert!(a.push(h(true, OpCode::Continuation, 1), b"x", 100).is_err());
        assert_eq!(
            a.push(h(true, OpCode::Text, 2), &[0xff, 0xfe], 100),
            Err(FrameError::BadUtf8)
        );
        assert_eq!(
            a.push(h(false, OpCode::Text, 60), &[b'a'; 60], 100),
            Ok(None)
        );
        assert!(matches!(
            a.push(h(true, OpCode::Continuation, 60), &[b'a'; 60], 100),
            Err(FrameError::TooBig { .. })
        ));
    }

    #[test]
    fn close_reason_is_bounded() {
        let c = encode_close(1008, &"é".repeat(100));
        assert!(c.len() <= 127);
        let mut v = c.to_vec();
        let h = decode_frame(&mut v, Role::FromServer, 200)
            .unwrap()
            .unwrap();
        assert_eq!(
            &v[h.payload_start..h.payload_start + 2],
            &1008u16.to_be_bytes()
        );
        assert!(std::str::from_utf8(&v[h.payload_start + 2..h.frame_len()]).is_ok());
    }
}
