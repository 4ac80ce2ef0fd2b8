//! Connection, subscription and publish-rate limits are answered at once.

use crate::helpers::*;
use futures_util::SinkExt;
use serde_json::json;
use std::time::{Duration, Instant};

fn http_status(err: tokio_tungstenite::tungstenite::Error) -> (u16, Option<String>) {
    match err {
        tokio_tungstenite::tungstenite::Error::Http(r) => (
            r.status().as_u16(),
            r.headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string()),
        ),
        other => panic!("expected an HTTP refusal, got {other}"),
    }
}

#[tokio::test]
async fn tenant_and_global_connection_limits_answer_immediately() {
    let mut opts = HostOptions::new();
    opts.config.max_connections = Some(3);
    let h = spawn_with(opts).await;
    h.tenant(json!({"id":"conn-small","access":"public","limits":{"max_connections":2}}))
        .await;
    h.public_tenant("conn-big").await;
    let refused =
        "herald_connections_refused_total{tenant=\"conn-small\",reason=\"tenant_connections\"}";
    let refused_before = h.metric(refused).await;
    let _a = h.ws("conn-small").await;
    let _b = h.ws("conn-small").await;
    let t = Instant::now();
    let (status, retry) = http_status(
        tokio_tungstenite::connect_async(h.ws_url("conn-small"))
            .await
            .unwrap_err(),
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "refusal took {:?}",
        t.elapsed()
    );
    assert_eq!(status, 503);
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=5).contains(&retry));
    assert_eq!(h.sse("conn-small", "ch=a", None).await.status, 503);
    // The global cap (3) also holds across tenants.
    let _c = h.ws("conn-big").await;
    let (status, _) = http_status(
        tokio_tungstenite::connect_async(h.ws_url("conn-big"))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 503);
    assert_eq!(
        h.metric(refused).await - refused_before,
        2.0,
        "the WebSocket and the SSE refusal"
    );
    // Freed slots are reusable: once the server has let go of the closed
    // connection (the tenant's gauge shows one left), a new one is admitted.
    drop(_a);
    let open = "herald_connections{tenant=\"conn-small\"}";
    let deadline = Instant::now() + WAIT;
    while h.metric(open).await != 1.0 {
        assert!(
            Instant::now() < deadline,
            "the closed connection still holds its slot after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _d = h.ws("conn-small").await;
    assert_eq!(h.metric(open).await, 2.0);
    h.stop().await;
}

#[tokio::test]
async fn subscription_limit_and_publish_rate() {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":"sub-rate","access":"public","limits":{"max_subscriptions":2,"publish_rate":1.0,"publish_burst":3}}))
        .await;
    let mut ws = h.ws("sub-rate").await;
    ws.sub("a", 1).await;
    ws.sub("b", 2).await;
    ws.sub("a", 3).await; // already subscribed: still fine
    ws.send(json!({"op":"sub","ch":"c","id":4})).await;
    let e = ws.next().await;
    assert_eq!(
        (e["code"].as_str(), e["id"].as_u64()),
        (Some("too_many_subscriptions"), Some(4))
    );
    for _ in 0..3 {
        assert_eq!(
            h.publish("sub-rate", &key, json!({"ch":"a","data":1}))
                .await
                .0,
            200
        );
    }
    let r = h
        .http
        .post(h.url("/v1/t/sub-rate/publish"))
        .bearer_auth(&key)
        .json(&json!({"ch":"a","data":1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
    h.stop().await;
}

/// A connection's operations are rate limited: past its burst it
/// gets `err` `rate_limited` for each, and one that keeps going is closed
/// (1008); another connection of the tenant is untouched.
#[tokio::test]
async fn a_connection_flooding_operations_is_limited_then_closed() {
    let h = spawn_host().await;
    h.tenant(json!({"id":"ops","access":"public","limits":{"client_ops_per_sec":1.0,"client_ops_burst":5}}))
        .await;
    let mut calm = h.ws("ops").await;
    let mut flood = h.ws("ops").await;
    for id in 0..5 {
        flood.send(json!({"op":"ping","id":id})).await;
        assert_eq!(flood.next().await["op"], "pong");
    }
    flood.send(json!({"op":"ping","id":5})).await;
    let refused = flood.next().await;
    assert_eq!(
        (refused["op"].clone(), refused["code"].clone()),
        (json!("err"), json!("rate_limited")),
        "{refused}"
    );
    for id in 6..80 {
        if flood
            .s
            .send(tokio_tungstenite::tungstenite::Message::Text(
                json!({"op":"ping","id":id}).to_string().into(),
            ))
            .await
            .is_err()
        {
            break;
        }
    }
    assert_eq!(flood.closed().await.0, 1008);
    calm.send(json!({"op":"ping","id":1})).await;
    assert_eq!(calm.next().await["op"], "pong");
    h.stop().await;
}

/// A client looping sub/unsub over fresh names leaves no channel
/// behind, and the channels a tenant's subscribers may bring into being are
/// bounded (WebSocket `err`, SSE 429).
#[tokio::test]
async fn channels_are_bounded_per_tenant() {
    let h = spawn_host().await;
    h.tenant(json!({"id":"chans","access":"public",
                    "limits":{"max_channels":3,"client_ops_burst":1000}}))
        .await;
    let mut ws = h.ws("chans").await;
    for i in 0..100u64 {
        ws.sub(&format!("fresh-{i}"), i).await;
        ws.send(json!({"op":"unsub","ch":format!("fresh-{i}"),"id":1000 + i}))
            .await;
        assert_eq!(ws.next().await["op"], "ack");
    }
    let (s, v) = h
        .admin(reqwest::Method::GET, "/admin/v1/tenants/chans", None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["channels"], 0, "nothing left behind: {v}");
    for (i, ch) in ["a", "b", "c"].iter().enumerate() {
        ws.sub(ch, i as u64).await;
    }
    ws.send(json!({"op":"sub","ch":"d","id":9})).await;
    let refused = ws.next().await;
    assert_eq!(
        (refused["op"].as_str(), refused["code"].as_str()),
        (Some("err"), Some("too_many_channels")),
        "{refused}"
    );
    let sse = h
        .http
        .get(h.url("/v1/t/chans/sse?ch=a&ch=e"))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 429);
    let v: serde_json::Value = sse.json().await.unwrap();
    assert_eq!(v["error"]["code"], "too_many_channels");
    // Channels that exist stay open to everyone.
    let mut other = h.ws("chans").await;
    other.sub("b", 1).await;
    h.stop().await;
}

/// Near the memory budget, only a tenant past its share is
/// refused new connections; another tenant's clients still get in.
#[tokio::test]
async fn near_the_memory_budget_only_the_tenant_past_its_share_is_refused() {
    let mut opts = HostOptions::new();
    // Far below what this test process holds: always near the budget.
    opts.config.memory_budget_bytes = Some(8 << 20);
    let h = spawn_with(opts).await;
    let hog_key = h
        .tenant(json!({"id":"hog","access":"public","limits":{"memory_share_percent":25}}))
        .await;
    h.public_tenant("modest").await;
    // 3 MiB of history: past 25 % of 8 MiB.
    let pad = "x".repeat(60_000);
    for i in 0..50 {
        let (s, v) = h
            .publish(
                "hog",
                &hog_key,
                json!({"ch":format!("c{}", i % 5),"data":{"pad":pad}}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
    }
    // The memory watch looks once a second; until it has seen whose memory
    // it is, everyone is refused.
    let deadline = Instant::now() + WAIT;
    loop {
        let hog = h.ws_with("hog", "").await.err();
        let modest = h.ws_with("modest", "").await.err();
        if let (Some((503, v)), None) = (&hog, &modest) {
            assert_eq!(v["error"]["code"], "memory_budget");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "hog {hog:?}, modest {modest:?}: a tenant within its share is not refused"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.stop().await;
}
