//! Slow consumers: each policy bounds the slow session's memory, counts what
//! it did, and never delays a healthy session.

use crate::helpers::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

const MESSAGES: u64 = 1600;
/// Small batches: a healthy reader drains between two publish requests, while
/// the whole flood (3.2 MB) is far more than a stalled socket and queue hold.
const BATCH: u64 = 10;

async fn flood(h: &Host, tenant: &str, key: &str, keyed: bool) {
    let pad = "p".repeat(2000);
    for batch in 0..(MESSAGES / BATCH) {
        let items: Vec<Value> = (0..BATCH)
            .map(|i| {
                let n = batch * BATCH + i;
                let mut m = json!({"ch":"c","data":{"n":n,"pad":pad}});
                if keyed {
                    m["key"] = json!(format!("k{}", n % 4));
                }
                m
            })
            .collect();
        let (s, v) = h.publish(tenant, key, Value::Array(items)).await;
        assert_eq!(s, 200, "{v}");
    }
}

async fn healthy_gets_everything(healthy: &mut Ws, started: Instant) {
    for seq in 1..=MESSAGES {
        let m = healthy.next().await;
        assert_eq!(
            (m["seq"].as_u64(), m["prev"].as_u64()),
            (Some(seq), Some(seq - 1))
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "healthy client was delayed: {:?}",
        started.elapsed()
    );
}

/// A host with `tenant` (of the calling test's own: the metrics recorder is
/// shared by every test of the binary), a stalled and a healthy subscriber.
async fn setup(tenant: &str, policy: &str) -> (Host, String, Ws, Ws) {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":tenant,"access":"public","limits":{"queue_bytes":131072,"max_message_bytes":8192,"slow_consumer":policy}}))
        .await;
    let slow = stalled_subscriber(&h, tenant).await;
    let mut healthy = h.ws(tenant).await;
    healthy.sub("c", 1).await;
    (h, key, slow, healthy)
}

/// The tenant's count of what its slow-consumer policy did (`action`).
async fn slow_count(h: &Host, tenant: &str, action: &str) -> f64 {
    h.metric(&format!(
        "herald_slow_consumer_total{{tenant=\"{tenant}\",action=\"{action}\"}}"
    ))
    .await
}

/// Reads what the slow client finally gets: (seqs seen, gaps seen).
async fn drain(ws: &mut Ws) -> (Vec<u64>, usize) {
    let mut seqs = Vec::new();
    let mut gaps = 0;
    let mut last = 0;
    while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_millis(1500), ws.s.next()).await
    {
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["op"] == "msg" {
                let (seq, prev) = (v["seq"].as_u64().unwrap(), v["prev"].as_u64().unwrap());
                assert!(seq > last, "order kept");
                if prev != last {
                    gaps += 1;
                }
                last = seq;
                seqs.push(seq);
            }
        }
    }
    (seqs, gaps)
}

#[tokio::test]
async fn disconnect_policy_closes_the_slow_reader_only() {
    let t = "slow-disconnect";
    let (h, key, mut slow, mut healthy) = setup(t, "disconnect").await;
    let before = slow_count(&h, t, "disconnected").await;
    let started = Instant::now();
    // The healthy client reads while the flood goes on.
    tokio::join!(
        flood(&h, t, &key, false),
        healthy_gets_everything(&mut healthy, started)
    );
    assert_eq!(
        slow_count(&h, t, "disconnected").await - before,
        1.0,
        "the slow reader, and only it, was disconnected"
    );
    // The slow reader's stream ends (its close frame may not fit in a full socket).
    let mut ended = false;
    for _ in 0..2000 {
        match tokio::time::timeout(WAIT, slow.s.next()).await {
            Ok(Some(Ok(Message::Close(f)))) => {
                if let Some(f) = f {
                    assert_eq!(u16::from(f.code), 4001);
                }
                ended = true;
                break;
            }
            Ok(Some(Ok(_))) => continue,
            Ok(None) | Ok(Some(Err(_))) => {
                ended = true;
                break;
            }
            Err(_) => break,
        }
    }
    assert!(ended, "slow session was closed");
    h.stop().await;
}

#[tokio::test]
async fn drop_oldest_policy_drops_and_shows_gaps() {
    let t = "slow-drop-oldest";
    let (h, key, mut slow, mut healthy) = setup(t, "drop-oldest").await;
    let before = slow_count(&h, t, "dropped").await;
    let started = Instant::now();
    // The healthy client reads while the flood goes on.
    tokio::join!(
        flood(&h, t, &key, false),
        healthy_gets_everything(&mut healthy, started)
    );
    let (seqs, gaps) = drain(&mut slow).await;
    // The healthy reader got everything: every drop counted is one the slow
    // reader misses, and every message it misses was counted.
    assert_eq!(
        slow_count(&h, t, "dropped").await - before,
        (MESSAGES - seqs.len() as u64) as f64,
        "drops counted"
    );
    assert_eq!(seqs.last(), Some(&MESSAGES), "the newest message arrives");
    assert!(
        gaps >= 1 && (seqs.len() as u64) < MESSAGES,
        "drops are visible as gaps: {} seen",
        seqs.len()
    );
    h.stop().await;
}

#[tokio::test]
async fn conflate_policy_keeps_latest_per_key() {
    let t = "slow-conflate";
    let (h, key, mut slow, mut healthy) = setup(t, "conflate").await;
    let before = slow_count(&h, t, "conflated").await;
    let started = Instant::now();
    tokio::join!(
        flood(&h, t, &key, true),
        healthy_gets_everything(&mut healthy, started)
    );
    let (seqs, _) = drain(&mut slow).await;
    // As for drops: what the slow reader misses is exactly what was counted.
    assert_eq!(
        slow_count(&h, t, "conflated").await - before,
        (MESSAGES - seqs.len() as u64) as f64,
        "conflations counted"
    );
    // The last message of every key (the last four seqs) survives conflation.
    for s in MESSAGES - 3..=MESSAGES {
        assert!(
            seqs.contains(&s),
            "latest of each key delivered: missing {s}"
        );
    }
    assert!((seqs.len() as u64) < MESSAGES);
    h.stop().await;
}

#[tokio::test]
async fn a_stalled_reader_holds_little_in_the_kernel() {
    // The default 64 KiB SO_SNDBUF: what the stalled client finally reads is
    // its queue (128 KiB) plus what the two sockets held, not megabytes of
    // kernel send buffer grown by autotuning (up to 4 MiB per socket).
    let t = "slow-kernel";
    let (h, key, mut slow, mut healthy) = setup(t, "drop-oldest").await;
    let started = Instant::now();
    // The healthy client reads while the flood goes on.
    tokio::join!(
        flood(&h, t, &key, false),
        healthy_gets_everything(&mut healthy, started)
    );
    let (seqs, _) = drain(&mut slow).await;
    // Each message is about 2 KB on the wire; 300 of them are 600 KB.
    assert!(
        seqs.len() < 300,
        "the stalled reader got {} messages: the kernel buffered far more than its send buffer",
        seqs.len()
    );
    assert_eq!(seqs.last(), Some(&MESSAGES), "the newest message arrives");
    h.stop().await;
}

/// Messages of a channel that then stays quiet, dropped from a slow reader's
/// queue by another channel's flood: no later message of that channel will
/// show the hole by its `prev`, so the reader is sent a `gap` for it.
#[tokio::test]
async fn a_drop_on_a_quiet_channel_is_a_gap_frame() {
    let t = "slow-quiet";
    let (h, key, mut slow, _healthy) = setup(t, "drop-oldest").await;
    slow.send(json!({"op":"sub","ch":"q","id":2})).await;
    // The socket and the queue fill up first, so q's messages wait in the
    // queue; the rest of the flood then pushes them out.
    flood(&h, t, &key, false).await;
    for n in 1..=5u64 {
        let (s, _) = h.publish(t, &key, json!({"ch":"q","data":{"n":n}})).await;
        assert_eq!(s, 200);
    }
    flood(&h, t, &key, false).await;
    let mut got = Vec::new();
    let mut gaps = Vec::new();
    while let Ok(Some(Ok(m))) =
        tokio::time::timeout(Duration::from_millis(1500), slow.s.next()).await
    {
        if let Message::Text(text) = m {
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["ch"] != "q" {
                continue;
            }
            match v["op"].as_str() {
                Some("msg") => got.push(v["seq"].as_u64().unwrap()),
                Some("gap") => gaps.push((v["from"].as_u64().unwrap(), v["to"].as_u64().unwrap())),
                _ => {}
            }
        }
    }
    assert!(
        got.len() < 5,
        "the flood should have pushed q's messages out: {got:?}"
    );
    for seq in 1..=5u64 {
        assert!(
            got.contains(&seq) || gaps.iter().any(|(a, b)| *a <= seq && seq <= *b),
            "q's message {seq} neither arrived nor was reported: got {got:?}, gaps {gaps:?}"
        );
    }
    h.stop().await;
}

/// A client that stops reading with an ordinary receive buffer (the
/// kernel's default, 128 KiB here, not the 4 KiB of `stalled_subscriber`)
/// takes some 250 KB before its socket is full. Herald sees it fall behind
/// by its receive window and then writes to it once per pace, everything
/// queued in one write, instead of once per message (about 240 writes for
/// these 400 messages when each goes as it comes); nothing is lost: once it
/// reads, it gets every message in order.
#[tokio::test]
async fn a_lagging_reader_is_written_to_in_paced_batches() {
    let t = "slow-paced";
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":t,"access":"public","limits":{"queue_bytes":1048576,"max_message_bytes":8192,"slow_consumer":"drop-oldest"}}))
        .await;
    let stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let plain = tokio_tungstenite::MaybeTlsStream::Plain(stream);
    let (s, _) = tokio_tungstenite::client_async(h.ws_url(t), plain)
        .await
        .unwrap();
    let mut lagging = Ws { s };
    lagging.sub("c", 1).await;
    let writes = format!("herald_socket_writes_total{{tenant=\"{t}\"}}");
    let before = h.metric(&writes).await;
    let pad = "p".repeat(1000);
    const SENT: u64 = 400;
    for n in 1..=SENT {
        let (s, v) = h
            .publish(t, &key, json!({"ch":"c","data":{"n":n,"pad":pad}}))
            .await;
        assert_eq!(s, 200, "{v}");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = h.metric(&writes).await - before;
    assert!(
        written < 170.0,
        "{written} writes for {SENT} messages to a reader that stopped: not paced"
    );
    let (seqs, gaps) = drain(&mut lagging).await;
    assert_eq!(gaps, 0, "nothing lost");
    assert_eq!(seqs, (1..=SENT).collect::<Vec<_>>());
    h.stop().await;
}
