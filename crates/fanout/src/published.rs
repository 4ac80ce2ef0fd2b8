//! A published message's frames: one per wire format, encoded once and
//! shared by every subscriber it serves, and its compressed frame, made once
//! per message and audience (`Published::ws_deflated`).

use crate::queue::Wire;
use bytes::Bytes;
use herald_proto as proto;
use std::sync::Arc;

/// Which sessions a frame is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serves {
    /// Sessions of this audience: the plugin tagged the variant.
    Audience(Arc<str>),
    /// Every session without a variant of its own.
    Rest,
    /// The untagged variant, for these audiences only: they were sent a
    /// position the rest were not, so their `prev` differs.
    Listed(Box<[Arc<str>]>),
}

/// One frame of one message of one channel, encoded once for each wire format.
#[derive(Debug)]
pub struct Published {
    pub ch: Arc<str>,
    pub epoch: u64,
    pub seq: u64,
    /// The previous position the sessions this frame serves were sent.
    pub prev: u64,
    /// Conflation key given by the publisher.
    pub key: Option<Arc<str>>,
    pub serves: Serves,
    /// Publish time, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The complete WebSocket text frame.
    pub ws: Bytes,
    /// The SSE event body without its `id:` line.
    pub sse: Bytes,
    /// The WebSocket frame compressed (permessage-deflate, the largest
    /// window), made by the first session that sends it and shared by every
    /// other: one compression per message and audience.
    pub deflated: std::sync::OnceLock<Bytes>,
}

impl Published {
    /// The compressed frame for a session that agreed to a window of
    /// `window_bits`, and whether this call made it (a compression, not a
    /// share). The largest window, which every client but a rare one asks
    /// for, is made once and kept; another is made for the session alone.
    pub fn ws_deflated(&self, window_bits: u8) -> (Bytes, bool) {
        if window_bits < proto::deflate::MAX_WINDOW_BITS {
            return (deflate_frame(&self.ws, window_bits), true);
        }
        if let Some(b) = self.deflated.get() {
            return (b.clone(), false);
        }
        let mut made = false;
        let b = self.deflated.get_or_init(|| {
            made = true;
            deflate_frame(&self.ws, window_bits)
        });
        (b.clone(), made)
    }

    pub fn wire_bytes(&self, wire: Wire) -> &Bytes {
        match wire {
            Wire::Ws => &self.ws,
            Wire::Sse => &self.sse,
        }
    }

    #[cfg(test)]
    pub(crate) fn for_test(ch: &str, seq: u64, key: Option<&str>, size: usize) -> Published {
        Published {
            ch: ch.into(),
            epoch: 1,
            seq,
            prev: seq.saturating_sub(1),
            key: key.map(Into::into),
            serves: Serves::Rest,
            at_ms: 0,
            ws: Bytes::from(vec![b'x'; size]),
            sse: Bytes::from(vec![b'x'; size]),
            deflated: std::sync::OnceLock::new(),
        }
    }
}

/// A plain server frame's message compressed into a frame with RSV1 set
/// (the plain frame again if the compressor could not finish it).
pub fn deflate_frame(frame: &[u8], window_bits: u8) -> Bytes {
    let opcode = match frame.first().map(|b| b & 0x0f) {
        Some(2) => proto::ws::OpCode::Binary,
        _ => proto::ws::OpCode::Text,
    };
    let mut out = Vec::new();
    if !proto::deflate::compress(
        proto::ws::server_frame_payload(frame),
        window_bits,
        &mut out,
    ) {
        // The compressor did not finish the message: it goes as it is.
        return Bytes::copy_from_slice(frame);
    }
    proto::ws::encode_compressed_frame(opcode, &out)
}

impl Published {
    /// The message as a JSON object (`{"op":"msg","ch",…}`): the text of
    /// its WebSocket frame (server frames are unmasked).
    pub fn json(&self) -> &[u8] {
        let len7 = self.ws.get(1).map_or(0, |b| b & 0x7f);
        let start = match len7 {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        self.ws.get(start..).unwrap_or_default()
    }
}
