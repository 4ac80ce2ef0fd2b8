//! Hostile fixtures: each fails with its exact, named error; the host keeps
//! serving, the failed instance is replaced, other tenants never notice.

use crate::helpers::*;
use serde_json::json;
use std::time::{Duration, Instant};

async fn hostile(fixture: &str, kind: &str) {
    let h = spawn_host().await;
    let ok_key = h.public_tenant("ok").await;
    let mut healthy = h.ws("ok").await;
    healthy.sub("c", 1).await;
    let limits = json!({"plugin_deadline_ms": 50, "plugin_memory_bytes": 16 << 20});
    let key = h
        .tenant(json!({"id":"bad","access":"public","limits":limits}))
        .await;
    let (s, v) = h.upload_plugin("bad", plugin_wasm(fixture)).await;
    assert_eq!(s, 201, "describe works, so upload validates: {v}");
    h.activate("bad", v["version"].as_i64().unwrap()).await;

    for round in 1..=2u64 {
        // transform fails: the batch is dead-lettered with its kind.
        let t = Instant::now();
        let (s, v) = h
            .publish("bad", &key, json!({"ch":"c","data":{"v":1}}))
            .await;
        assert_eq!(s, 502, "{v}");
        assert_eq!(v["error"]["code"], "transform_failed");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("({kind})")),
            "{v}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "bounded: {:?}",
            t.elapsed()
        );
        // The healthy tenant keeps receiving, in order.
        h.publish("ok", &ok_key, json!({"ch":"c","data":round}))
            .await;
        let m = healthy.next().await;
        assert_eq!(
            (m["seq"].as_u64(), m["data"].as_u64()),
            (Some(round), Some(round))
        );
    }
    let dead = h
        .metric(&format!(
            "herald_plugin_dead_letters_total{{tenant=\"bad\",kind=\"{kind}\"}}"
        ))
        .await;
    assert_eq!(dead, 2.0);

    // authorize-connect fails closed (the fixture implements it) with a reason code.
    if fixture != "fixture_bad_output" {
        let r = h
            .admin(
                reqwest::Method::PATCH,
                "/admin/v1/tenants/bad",
                Some(json!({"access":"plugin"})),
            )
            .await;
        assert_eq!(r.0, 200);
        let (s, v) = h.ws_with("bad", "").await.err().unwrap();
        assert_eq!(s, 503, "{v}");
        assert_eq!(v["error"]["code"], format!("plugin_{kind}"));
    }
    h.publish("ok", &ok_key, json!({"ch":"c","data":3})).await;
    assert_eq!(healthy.next().await["seq"], 3);
    h.stop().await;
}

#[tokio::test]
async fn infinite_loop_times_out() {
    hostile("fixture_loop", "timeout").await;
}

#[tokio::test]
async fn memory_bomb_hits_the_cap() {
    hostile("fixture_membomb", "memory").await;
}

#[tokio::test]
async fn panic_traps() {
    hostile("fixture_panic", "trap").await;
}

#[tokio::test]
async fn bad_output_is_rejected() {
    hostile("fixture_bad_output", "bad_output").await;
}
