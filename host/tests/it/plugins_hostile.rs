//! Hostile fixtures: each fails with its exact, named error; the host keeps
//! serving, the failed instance is replaced, other tenants never notice. A
//! record whose output breaks the contract fails alone, not its batch.

use crate::helpers::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn hostile(fixture: &str, kind: &str) {
    let h = spawn_host().await;
    // Tenants of this test's own: the metrics recorder is shared by every
    // test of the binary.
    let (ok, bad) = (format!("ok-{kind}"), format!("hostile-{kind}"));
    let ok_key = h.public_tenant(&ok).await;
    let mut healthy = h.ws(&ok).await;
    healthy.sub("c", 1).await;
    // The upload's instantiate and describe run under this deadline too: room
    // for a loaded machine, while the fixture's loop still ends in 250 ms.
    let limits = json!({"plugin_deadline_ms": 250, "plugin_memory_bytes": 16 << 20});
    let key = h
        .tenant(json!({"id":bad,"access":"public","limits":limits}))
        .await;
    let dead_letters =
        format!("herald_plugin_dead_letters_total{{tenant=\"{bad}\",kind=\"{kind}\"}}");
    let dead_before = h.metric(&dead_letters).await;
    let (s, v) = h.upload_plugin(&bad, plugin_wasm(fixture)).await;
    assert_eq!(s, 201, "describe works, so upload validates: {v}");
    h.activate(&bad, v["version"].as_i64().unwrap()).await;

    for round in 1..=2u64 {
        // Long enough with no guest running for the epoch clock to sleep:
        // the call must wake it, or a loop would never meet its deadline.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // transform fails: the batch is dead-lettered with its kind.
        let t = Instant::now();
        let (s, v) = h
            .publish(&bad, &key, json!({"ch":"c","data":{"v":1}}))
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
        h.publish(&ok, &ok_key, json!({"ch":"c","data":round}))
            .await;
        let m = healthy.next().await;
        assert_eq!(
            (m["seq"].as_u64(), m["data"].as_u64()),
            (Some(round), Some(round))
        );
    }
    assert_eq!(h.metric(&dead_letters).await - dead_before, 2.0);

    // authorize-connect fails closed (the fixture implements it) with a reason code.
    if fixture != "fixture_bad_output" {
        let r = h
            .admin(
                reqwest::Method::PATCH,
                &format!("/admin/v1/tenants/{bad}"),
                Some(json!({"access":"plugin"})),
            )
            .await;
        assert_eq!(r.0, 200);
        let (s, v) = h.ws_with(&bad, "").await.err().unwrap();
        assert_eq!(s, 503, "{v}");
        assert_eq!(v["error"]["code"], format!("plugin_{kind}"));
    }
    h.publish(&ok, &ok_key, json!({"ch":"c","data":3})).await;
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

/// One batch of ten through a component that breaks the contract for four of
/// them (a forbidden channel beside a good output, an empty conflation key, an
/// audience too long): those four are dead-lettered, the six others delivered
/// in order, and the next batch is untouched.
#[tokio::test]
async fn bad_records_fail_alone_not_their_batch() {
    let h = spawn_host().await;
    let tenant = "bad-records";
    let key = h.public_tenant(tenant).await;
    h.install_plugin(tenant, "fixture_bad_records").await;
    let dead_letters =
        format!("herald_plugin_dead_letters_total{{tenant=\"{tenant}\",kind=\"bad_output\"}}");
    let before = h.metric(&dead_letters).await;
    let mut ws = h.ws(tenant).await;
    ws.sub("c", 1).await;
    ws.sub("side", 2).await;
    let bad = |n: u64| -> Option<Value> {
        match n {
            3 | 7 => Some(json!({"n":n,"also":"no spaces"})),
            5 => Some(json!({"n":n,"key":""})),
            8 => Some(json!({"n":n,"audience":"a".repeat(65)})),
            _ => None,
        }
    };
    let items: Vec<Value> = (0..10u64)
        .map(|n| {
            // Record 1 fans out to a second, valid channel: it stays whole.
            let data = bad(n).unwrap_or_else(|| match n {
                1 => json!({"n":n,"also":"side"}),
                _ => json!({"n":n}),
            });
            json!({"ch":"c","data":data})
        })
        .collect();
    let (s, v) = h.publish(tenant, &key, Value::Array(items)).await;
    assert_eq!(s, 200, "the batch goes on: {v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(
        results.len(),
        7,
        "six records to c, one of them also to side: {v}"
    );

    let good: Vec<u64> = (0..10).filter(|&n| bad(n).is_none()).collect();
    let mut got = Vec::new();
    let mut side = Vec::new();
    let mut last = 0;
    while got.len() < good.len() {
        let m = ws.next().await;
        assert_eq!(m["op"], "msg", "{m}");
        if m["ch"] == "side" {
            side.push(m["data"]["n"].as_u64().unwrap());
            continue;
        }
        assert_eq!(m["prev"].as_u64(), Some(last), "no gap among the good: {m}");
        last = m["seq"].as_u64().unwrap();
        got.push(m["data"]["n"].as_u64().unwrap());
    }
    assert_eq!(got, good);
    if side.is_empty() {
        side.push(
            next_op(&mut ws, "msg", WAIT).await["data"]["n"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(side, vec![1]);
    assert_eq!(
        h.metric(&dead_letters).await - before,
        4.0,
        "each bad record counted once"
    );

    // The next batch is not affected, and nothing of the bad records arrives late.
    let (s, v) = h
        .publish(tenant, &key, json!({"ch":"c","data":{"n":10}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let m = ws.next().await;
    assert_eq!(
        (m["data"]["n"].as_u64(), m["prev"].as_u64()),
        (Some(10), Some(last)),
        "{m}"
    );
    h.stop().await;
}

/// A public tenant whose active plugin does not load at restart
/// (here: a memory cap no component instantiates under) refuses connections
/// and publishes with 503 `plugin_unavailable` instead of serving without it
/// — a redact plugin's tenant would send unredacted messages. Deactivating
/// the plugin lets it serve again.
#[tokio::test]
async fn a_plugin_that_does_not_load_fails_closed() {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":"unload","access":"public","config":{"redact_fields":["bid"]}}))
        .await;
    h.install_plugin("unload", "redact").await;
    let data_dir = h.data_dir.clone();
    let dir = h.stop().await;
    let mut opts = HostOptions::new();
    opts.config.data_dir = data_dir;
    opts.dir = dir;
    opts.config.limits.plugin_memory_bytes = 1 << 20;
    let h = spawn_with(opts).await;
    let refused = h.ws_with("unload", "").await.err();
    assert_eq!(
        refused.map(|(s, v)| (s, v["error"]["code"].clone())),
        Some((503, json!("plugin_unavailable")))
    );
    let (s, v) = h
        .publish("unload", &key, json!({"ch":"c","data":{"bid":1}}))
        .await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (503, json!("plugin_unavailable")),
        "{v}"
    );
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants/unload/plugins/deactivate",
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws("unload").await;
    ws.sub("c", 1).await;
    let (s, v) = h
        .publish("unload", &key, json!({"ch":"c","data":{"bid":1}}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ws.next().await["data"], json!({"bid":1}));
    h.stop().await;
}

/// A batch whose transform takes longer than the deadline as a
/// whole (400 records at 1 ms each against 100 ms) is split and every
/// record published in order, instead of the whole batch dead-lettered.
#[tokio::test]
async fn a_batch_too_big_for_the_deadline_is_split_not_dropped() {
    let h = spawn_host().await;
    let t = "split";
    let key = h
        .tenant(json!({"id":t,"access":"public","config":{"record_ms":1},"limits":{"plugin_deadline_ms":100}}))
        .await;
    h.install_plugin(t, "fixture_slow").await;
    let mut ws = h.ws(t).await;
    ws.sub("c", 1).await;
    let n = 400u64;
    let items: Vec<Value> = (0..n).map(|i| json!({"ch":"c","data":{"n":i}})).collect();
    let (s, v) = h.publish(t, &key, Value::Array(items)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["results"].as_array().map(Vec::len),
        Some(n as usize),
        "{v}"
    );
    for i in 0..n {
        let m = ws.next().await;
        assert_eq!(
            (m["data"]["n"].as_u64(), m["seq"].as_u64()),
            (Some(i), Some(i + 1)),
            "{m}"
        );
    }
    h.stop().await;
}
