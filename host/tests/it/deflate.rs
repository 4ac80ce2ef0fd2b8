//! permessage-deflate (RFC 7692) as clients see it: negotiated per
//! connection for a tenant that turned it on, a message compressed once per
//! message and audience and sent as the same bytes to every subscriber,
//! compressed client frames read under the message bound (a zip bomb is a
//! 1009, bad data a 1007), and a smaller window honoured.

use crate::helpers::*;
use herald::proto::deflate;
use herald::proto::ws::{self, OpCode, Role};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OFFER: &str = "permessage-deflate; client_max_window_bits";

/// A WebSocket client on a raw socket: it sends what a test builds and
/// shows each frame as it came (RSV1 included).
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Frame {
    compressed: bool,
    opcode: OpCode,
    /// The frame's bytes as they came off the wire.
    wire: Vec<u8>,
    /// Its payload, inflated if it came compressed.
    payload: Vec<u8>,
}

impl Frame {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.payload).unwrap()
    }
}

impl Raw {
    /// Connects with `extensions` offered; the 101 (or refusal) is returned.
    async fn connect(h: &Host, tenant: &str, extensions: Option<&str>) -> (Raw, RawResponse) {
        let mut s = TcpStream::connect(h.addr).await.unwrap();
        let extra = extensions
            .map(|e| format!("Sec-WebSocket-Extensions: {e}\r\n"))
            .unwrap_or_default();
        s.write_all(ws_upgrade_request(tenant, &extra).as_bytes())
            .await
            .unwrap();
        let r = read_response(&mut s).await;
        assert_eq!(r.status, 101, "{r:?}");
        (Raw { s, buf: Vec::new() }, r)
    }

    async fn send_frame(&mut self, first_byte: u8, payload: &[u8]) {
        let mut f = ws::encode_client_frame(OpCode::Binary, payload, [7, 1, 9, 3]).to_vec();
        f[0] = first_byte;
        self.s.write_all(&f).await.unwrap();
    }

    /// A text message, compressed (RSV1) or not.
    async fn send_text(&mut self, v: &Value, compressed: bool) {
        let text = v.to_string();
        if compressed {
            let mut z = Vec::new();
            assert!(deflate::compress(text.as_bytes(), 15, &mut z));
            self.send_frame(0xC1, &z).await;
        } else {
            self.send_frame(0x81, text.as_bytes()).await;
        }
    }

    async fn frame(&mut self) -> Frame {
        tokio::time::timeout(WAIT, async {
            loop {
                let mut copy = self.buf.clone();
                if let Some(h) =
                    ws::decode_frame_with(&mut copy, Role::FromServer, 64 << 20, true).unwrap()
                {
                    let wire: Vec<u8> = self.buf.drain(..h.frame_len()).collect();
                    let body = &wire[h.payload_start..];
                    let payload = if h.compressed {
                        deflate::inflate(body, 64 << 20).unwrap()
                    } else {
                        body.to_vec()
                    };
                    return Frame {
                        compressed: h.compressed,
                        opcode: h.opcode,
                        wire,
                        payload,
                    };
                }
                let mut b = [0u8; 65536];
                let n = self.s.read(&mut b).await.unwrap();
                assert!(n > 0, "the server closed the socket");
                self.buf.extend_from_slice(&b[..n]);
            }
        })
        .await
        .expect("a frame in time")
    }

    /// The next frame whose JSON `op` is `op` (pings are skipped).
    async fn next_op(&mut self, op: &str) -> Frame {
        loop {
            let f = self.frame().await;
            if f.opcode == OpCode::Text && f.json()["op"] == op {
                return f;
            }
            assert!(
                matches!(f.opcode, OpCode::Ping | OpCode::Text),
                "{op}: got {f:?}"
            );
        }
    }

    /// The close code the server ended with.
    async fn close_code(&mut self) -> u16 {
        loop {
            let f = self.frame().await;
            if f.opcode == OpCode::Close {
                return u16::from_be_bytes([f.payload[0], f.payload[1]]);
            }
        }
    }
}

/// A public tenant with `limits`; its publish key.
async fn tenant_with(h: &Host, id: &str, limits: Value) -> String {
    h.tenant(json!({"id": id, "access": "public", "limits": limits}))
        .await
}

/// A message body that compresses (repeated words) and is well past 64 bytes.
fn big(n: u64) -> Value {
    json!({"n": n, "text": "the quick brown fox jumps over the lazy dog ".repeat(30)})
}

#[tokio::test]
async fn a_message_is_compressed_once_and_every_subscriber_gets_the_same_bytes() {
    let h = spawn_host().await;
    let key = tenant_with(&h, "z", json!({"deflate_min_bytes": 64})).await;
    let mut zs = Vec::new();
    for _ in 0..12 {
        let (mut c, r) = Raw::connect(&h, "z", Some(OFFER)).await;
        assert_eq!(
            r.header("sec-websocket-extensions"),
            Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover")
        );
        c.send_text(&json!({"op":"sub","ch":"c","id":1}), false)
            .await;
        c.next_op("ack").await;
        zs.push(c);
    }
    // A client that offered nothing is agreed nothing and gets plain frames.
    let (mut plain, r) = Raw::connect(&h, "z", None).await;
    assert_eq!(r.header("sec-websocket-extensions"), None);
    plain
        .send_text(&json!({"op":"sub","ch":"c","id":1}), false)
        .await;
    plain.next_op("ack").await;

    for n in 0..5 {
        let (status, body) = h
            .publish("z", &key, json!({"ch": "c", "data": big(n)}))
            .await;
        assert!(status < 300, "{body}");
    }
    // Below the tenant's size it goes as it is, to everyone.
    h.publish("z", &key, json!({"ch": "c", "data": {"n": 9}}))
        .await;

    let mut plain_msgs = Vec::new();
    for _ in 0..6 {
        let p = plain.next_op("msg").await;
        assert!(!p.compressed, "no compression was agreed");
        plain_msgs.push(p);
    }
    let mut first: Vec<Frame> = Vec::new();
    for (i, c) in zs.iter_mut().enumerate() {
        for n in 0..5 {
            let f = c.next_op("msg").await;
            assert!(f.compressed, "message {n} to client {i} is compressed");
            assert_eq!(f.json()["data"], big(n));
            let p = &plain_msgs[n as usize];
            assert_eq!(p.payload, f.payload, "the same message either way");
            if i == 0 {
                assert!(
                    f.wire.len() * 3 < p.wire.len(),
                    "compressed {} vs plain {} bytes",
                    f.wire.len(),
                    p.wire.len()
                );
                first.push(f);
            } else {
                assert_eq!(
                    f.wire, first[n as usize].wire,
                    "the same bytes for every subscriber"
                );
            }
        }
        let small = c.next_op("msg").await;
        assert!(!small.compressed, "under deflate_min_bytes: plain");
        assert_eq!(small.json()["data"], json!({"n": 9}));
        assert_eq!(small.wire, plain_msgs[5].wire);
    }
    assert_eq!(
        h.metric("herald_ws_deflated_total{tenant=\"z\"}").await,
        5.0,
        "one compression per message, not per subscriber"
    );
    h.stop().await;
}

#[tokio::test]
async fn compressed_client_frames_are_read_and_bounded() {
    let h = spawn_host().await;
    tenant_with(
        &h,
        "z",
        json!({"deflate_min_bytes": 64, "max_message_bytes": 4096}),
    )
    .await;
    h.public_tenant("off").await;

    // A compressed operation, whole and in fragments, is read as any other.
    let (mut c, _) = Raw::connect(&h, "z", Some(OFFER)).await;
    c.send_text(&json!({"op":"sub","ch":"c","id":1}), true)
        .await;
    assert_eq!(c.next_op("ack").await.json()["id"], 1);
    let mut z = Vec::new();
    assert!(deflate::compress(
        json!({"op":"ping","id":2}).to_string().as_bytes(),
        15,
        &mut z,
    ));
    let (a, b) = z.split_at(z.len() / 2);
    c.send_frame(0x41, a).await; // text, RSV1, not final
    c.send_frame(0x80, b).await; // final continuation
    assert_eq!(c.next_op("pong").await.json()["id"], 2);

    // A zip bomb: a few hundred bytes that inflate past max_message_bytes.
    let mut bomb = Vec::new();
    assert!(deflate::compress(&vec![b' '; 1 << 20], 15, &mut bomb));
    assert!(bomb.len() < 4096);
    c.send_frame(0xC1, &bomb).await;
    assert_eq!(c.close_code().await, 1009);

    // Bytes that are not DEFLATE: 1007.
    let (mut c, _) = Raw::connect(&h, "z", Some(OFFER)).await;
    c.send_frame(0xC1, &[0xff, 0xff, 0xff, 0xff]).await;
    assert_eq!(c.close_code().await, 1007);

    // RSV1 where nothing was agreed (no offer; a tenant without
    // compression, though offered): 1002, and no extension in the answer.
    let (mut c, _) = Raw::connect(&h, "z", None).await;
    c.send_frame(0xC1, &z).await;
    assert_eq!(c.close_code().await, 1002);
    let (mut c, r) = Raw::connect(&h, "off", Some(OFFER)).await;
    assert_eq!(r.header("sec-websocket-extensions"), None);
    c.send_frame(0xC1, &z).await;
    assert_eq!(c.close_code().await, 1002);
    h.stop().await;
}

#[tokio::test]
async fn a_smaller_window_asked_for_is_the_window_used() {
    let h = spawn_host().await;
    let key = tenant_with(&h, "z", json!({"deflate_min_bytes": 64})).await;
    let (mut c, r) = Raw::connect(
        &h,
        "z",
        Some("permessage-deflate; server_max_window_bits=7, permessage-deflate; server_max_window_bits=9"),
    )
    .await;
    assert_eq!(
        r.header("sec-websocket-extensions"),
        Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=9"),
        "the first offer it can take (7 bits is not a window)"
    );
    let (mut wide, _) = Raw::connect(&h, "z", Some(OFFER)).await;
    for x in [&mut c, &mut wide] {
        x.send_text(&json!({"op":"sub","ch":"c","id":1}), false)
            .await;
        x.next_op("ack").await;
    }
    let data: Vec<String> = (0..400).map(|i| format!("w{}", i % 97)).collect();
    h.publish("z", &key, json!({"ch": "c", "data": data})).await;
    let f = c.next_op("msg").await;
    let w = wide.next_op("msg").await;
    assert!(f.compressed && w.compressed);
    assert_eq!(f.payload, w.payload);
    // Exactly what compressing within 512 bytes makes (the unit tests
    // check that such a stream never refers further back), and not the
    // shared full-window frame.
    let mut want = Vec::new();
    assert!(deflate::compress(&f.payload, 9, &mut want));
    assert_eq!(
        f.wire,
        ws::encode_compressed_frame(OpCode::Text, &want).to_vec()
    );
    assert_ne!(f.wire, w.wire);
    h.stop().await;
}
