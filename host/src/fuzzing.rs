//! The fuzz targets: every parser a remote party feeds, each as a function
//! of arbitrary bytes that must not panic and checks the parser's own
//! invariants. Run by the stable mutation harness in the test command
//! (`fuzz.rs`) and by cargo-fuzz (`fuzz/`, nightly, coverage-guided) for
//! longer runs. Compiled only for those (`cfg(test)` or `cfg(fuzzing)`).

use crate::plugin::batch;
use crate::proto::{self, sse, ws};
use crate::server::head;

/// WebSocket frames from a client, decoded and reassembled as a session does.
pub fn ws_frames(input: &[u8]) {
    let mut buf = input.to_vec();
    let mut asm = ws::Assembler::default();
    let mut used = 0;
    while let Ok(Some(h)) = ws::decode_frame(&mut buf[used..], ws::Role::FromClient, 1024) {
        assert!(h.payload_start <= h.frame_len() && used + h.frame_len() <= buf.len());
        let payload = buf[used + h.payload_start..used + h.frame_len()].to_vec();
        if asm.push(h, &payload, 1024).is_err() {
            break;
        }
        used += h.frame_len();
    }
}

/// A request head, routed, its query and a header read.
pub fn request_head(input: &[u8]) {
    if let Ok(Some(h)) = head::parse_head(input) {
        assert!(h.len <= input.len());
        let _ = head::route(&h);
        let _ = h.query_pairs();
        let _ = h.header("origin");
    }
}

/// A `Last-Event-ID` for 0-4 channels.
pub fn last_event_id(input: &[u8]) {
    let s = String::from_utf8_lossy(input);
    let channels = input.len() % 5;
    if let Some(v) = sse::parse_last_event_id(&s, channels) {
        assert_eq!(v.len(), channels);
    }
}

/// A client operation (a WebSocket text message).
pub fn client_op(input: &[u8]) {
    if let Ok(proto::ClientOp::Sub { ch, .. }) = proto::parse_client_op(input) {
        assert!(proto::validate_channel(&ch).is_ok());
    }
}

/// An HTTP publish body.
pub fn publish_body(input: &[u8]) {
    // The first byte says whether the tenant has a transform (a channel
    // may then be left out).
    let Some((&mode, body)) = input.split_first() else {
        return;
    };
    if let Ok((items, batch)) = crate::publish::read_items(body, 4096, mode & 1 == 0) {
        assert!(!items.is_empty() && (batch || items.len() == 1));
    }
}

/// An admin create-tenant body, checked as the live tenant would be.
pub fn admin_create(input: &[u8]) {
    let defaults = crate::tenant::TenantLimits::DEFAULT;
    let _ = crate::api::admin::record_from_create(&defaults, input, "00".repeat(32), 0);
}

/// A plugin's output batch: `[records, metas]`, then the metas as
/// little-endian u32s, then the data.
pub fn plugin_output(input: &[u8]) {
    let (Some(&records), Some(&metas)) = (input.first(), input.get(1)) else {
        return;
    };
    let rest = &input[2..];
    let n = (metas as usize * 4).min(rest.len() / 4 * 4);
    let meta: Vec<u32> = rest[..n]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    let data = rest[n..].to_vec();
    if let Ok(t) = batch::decode_outgoing(data, &meta, records as usize, 64) {
        for o in t.outputs.iter() {
            assert!((o.source as usize) < records as usize && o.payload.len() <= 64);
        }
    }
}
