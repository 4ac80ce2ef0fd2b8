//! Heartbeats: the node beats every session once per heartbeat (SSE
//! comments, WebSocket pings), a WebSocket client silent for two is closed
//! with 4002, one that answers pings never is.

use crate::helpers::*;
use futures_util::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn sse_sends_a_comment_every_heartbeat() {
    let mut opts = HostOptions::new();
    opts.config.heartbeat = Duration::from_millis(200);
    let h = spawn_with(opts).await;
    h.public_tenant("fd-sse-hb").await;
    let mut s = h.sse("fd-sse-hb", "ch=c", None).await;
    let start = Instant::now();
    let mut comments = 0;
    while comments < 3 {
        let line = s.next_line().await.expect("stream open");
        if line == ":" {
            comments += 1;
        }
    }
    // The node beats its sessions in parts spread over a heartbeat: the
    // first comment comes within one, the next ones one heartbeat apart.
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "three heartbeats came too fast: {:?}",
        start.elapsed()
    );
    h.stop().await;
}

const HB: Duration = Duration::from_millis(300);

#[tokio::test]
async fn ws_client_silent_for_two_heartbeats_is_closed_with_4002() {
    let mut opts = HostOptions::new();
    opts.config.heartbeat = HB;
    let h = spawn_with(opts).await;
    h.public_tenant("fd-ws-silent").await;
    // A raw socket never answers the pings.
    let mut s = raw_ws_session(h.addr, "fd-ws-silent").await;
    let silent_since = Instant::now();
    let mut got = Vec::new();
    let mut pings = 0;
    let code = tokio::time::timeout(HB * 3 + Duration::from_secs(1), async {
        loop {
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without a close frame");
            got.extend_from_slice(&buf[..n]);
            // Unmasked server frames with short payloads: opcode, length, payload.
            while got.len() >= 2 && got.len() >= 2 + (got[1] & 0x7f) as usize {
                let len = (got[1] & 0x7f) as usize;
                let frame: Vec<u8> = got.drain(..2 + len).collect();
                match frame[0] & 0x0f {
                    0x9 => pings += 1,
                    0x8 => return u16::from_be_bytes([frame[2], frame[3]]),
                    op => panic!("unexpected opcode {op}"),
                }
            }
        }
    })
    .await
    .expect("closed within three heartbeats");
    let silent = silent_since.elapsed();
    assert_eq!(code, 4002);
    // The client's clock started a moment after the server's.
    assert!(
        silent + Duration::from_millis(50) >= HB * 2,
        "closed after {silent:?} of silence"
    );
    assert!(pings >= 1, "pinged before being closed");
    assert_eq!(
        h.metric(
            "herald_sessions_closed_total{tenant=\"fd-ws-silent\",reason=\"heartbeat_timeout\"}"
        )
        .await,
        1.0
    );
    h.stop().await;
}

#[tokio::test]
async fn ws_client_answering_pings_is_never_closed() {
    let mut opts = HostOptions::new();
    opts.config.heartbeat = HB;
    let h = spawn_with(opts).await;
    let key = h.public_tenant("fd-ws-alive").await;
    let mut ws = h.ws("fd-ws-alive").await;
    // tungstenite answers every ping while it reads; the client sends nothing else.
    let mut pings = 0;
    tokio::time::timeout(HB * 20, async {
        while pings < 8 {
            match ws.s.next().await.expect("open").expect("frame") {
                tokio_tungstenite::tungstenite::Message::Ping(_) => pings += 1,
                other => panic!("unexpected frame {other:?}"),
            }
        }
    })
    .await
    .expect("eight pings within twenty heartbeats");
    // Eight heartbeats later the session still delivers.
    ws.sub("c", 1).await;
    h.publish("fd-ws-alive", &key, json!({"ch":"c","data":1}))
        .await;
    assert_eq!(ws.next().await["seq"], 1);
    h.stop().await;
}
