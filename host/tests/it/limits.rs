//! Connection, subscription and publish-rate limits are answered at once.

use crate::helpers::*;
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
    h.tenant(json!({"id":"small","access":"public","limits":{"max_connections":2}}))
        .await;
    h.public_tenant("big").await;
    let _a = h.ws("small").await;
    let _b = h.ws("small").await;
    let t = Instant::now();
    let (status, retry) = http_status(
        tokio_tungstenite::connect_async(h.ws_url("small"))
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
    assert_eq!(h.sse("small", "ch=a", None).await.status, 503);
    // The global cap (3) also holds across tenants.
    let _c = h.ws("big").await;
    let (status, _) = http_status(
        tokio_tungstenite::connect_async(h.ws_url("big"))
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 503);
    assert!(
        h.metric(
            "herald_connections_refused_total{tenant=\"small\",reason=\"tenant_connections\"}"
        )
        .await
            >= 2.0
    );
    // Freed slots are reusable.
    drop(_a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _d = h.ws("small").await;
    h.stop().await;
}

#[tokio::test]
async fn subscription_limit_and_publish_rate() {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":"t","access":"public","limits":{"max_subscriptions":2,"publish_rate":1.0,"publish_burst":3}}))
        .await;
    let mut ws = h.ws("t").await;
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
            h.publish("t", &key, json!({"ch":"a","data":1})).await.0,
            200
        );
    }
    let r = h
        .http
        .post(h.url("/v1/t/t/publish"))
        .bearer_auth(&key)
        .json(&json!({"ch":"a","data":1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
    h.stop().await;
}
