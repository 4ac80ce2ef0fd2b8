//! Subscribe, publish, receive in order; resume and gaps; SSE.

use crate::helpers::*;
use serde_json::json;

#[tokio::test]
async fn ws_receives_in_order_with_positions() {
    let h = spawn_host().await;
    let key = h.public_tenant("acme").await;
    let mut a = h.ws("acme").await;
    let ack = a.sub("ticks.AAPL", 7).await;
    assert_eq!(ack["seq"], 0);
    assert!(ack["epoch"].as_u64().is_some());
    let mut b = h.ws("acme").await;
    b.sub("ticks.AAPL", 1).await;
    for i in 1..=20 {
        let (s, v) = h
            .publish("acme", &key, json!({"ch":"ticks.AAPL","data":{"px":i}}))
            .await;
        assert_eq!((s, v["seq"].as_u64()), (200, Some(i)));
    }
    for ws in [&mut a, &mut b] {
        for i in 1..=20u64 {
            let m = ws.next().await;
            assert_eq!(m["op"], "msg");
            assert_eq!(m["ch"], "ticks.AAPL");
            assert_eq!(m["seq"], i);
            assert_eq!(m["prev"], i - 1);
            assert_eq!(m["data"], json!({"px": i}));
        }
    }
    // A batch publishes to several channels; only subscribers of a channel get it.
    let (s, v) = h
        .publish(
            "acme",
            &key,
            json!([{"ch":"other","data":"x"},{"ch":"ticks.AAPL","data":[1,2]}]),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["results"][1]["seq"], 21);
    let m = a.next().await;
    assert_eq!(
        (m["seq"].as_u64(), m["data"].clone()),
        (Some(21), json!([1, 2]))
    );
    // Unsubscribe stops delivery and is acknowledged.
    a.send(json!({"op":"unsub","ch":"ticks.AAPL","id":9})).await;
    assert_eq!(a.next().await, json!({"op":"ack","id":9}));
    h.publish("acme", &key, json!({"ch":"ticks.AAPL","data":1}))
        .await;
    assert_eq!(b.next().await["seq"], 21);
    assert_eq!(b.next().await["seq"], 22);
    a.send(json!({"op":"ping","id":3})).await;
    assert_eq!(a.next().await, json!({"op":"pong","id":3}));
    h.stop().await;
}

#[tokio::test]
async fn resume_replays_history_and_reports_gaps() {
    let mut opts = HostOptions::new();
    opts.config.limits.history_size = 5;
    let h = spawn_with(opts).await;
    let key = h.public_tenant("acme").await;
    for i in 1..=8 {
        h.publish("acme", &key, json!({"ch":"c","data":i})).await;
    }
    // History holds 4..=8. Resuming after 5 replays 6, 7, 8 with no gap.
    let mut a = h.ws("acme").await;
    a.send(json!({"op":"sub","ch":"c","since":5,"id":1})).await;
    let ack = a.next().await;
    assert_eq!(
        (ack["op"].as_str(), ack["seq"].as_u64()),
        (Some("ack"), Some(8))
    );
    for i in 6..=8 {
        assert_eq!(a.next().await["seq"], i);
    }
    // Resuming after 1 cannot get 2 and 3: a gap frame says so first.
    let mut b = h.ws("acme").await;
    b.send(json!({"op":"sub","ch":"c","since":1,"epoch":ack["epoch"],"id":2}))
        .await;
    assert_eq!(b.next().await["op"], "ack");
    assert_eq!(b.next().await, json!({"op":"gap","ch":"c","from":2,"to":3}));
    for i in 4..=8 {
        assert_eq!(b.next().await["seq"], i);
    }
    // A position from another epoch (history lost) resumes from nothing.
    let mut c = h.ws("acme").await;
    let foreign = ack["epoch"].as_u64().unwrap() ^ 1;
    c.send(json!({"op":"sub","ch":"c","since":7,"epoch":foreign,"id":3}))
        .await;
    assert_eq!(c.next().await["op"], "ack");
    assert_eq!(c.next().await, json!({"op":"gap","ch":"c","from":1,"to":3}));
    assert_eq!(c.next().await["seq"], 4);
    // Live messages continue after the replay with no duplicate.
    h.publish("acme", &key, json!({"ch":"c","data":9})).await;
    assert_eq!(a.next().await["seq"], 9);
    h.stop().await;
}

#[tokio::test]
async fn sse_streams_and_resumes_from_last_event_id() {
    let h = spawn_host().await;
    let key = h.public_tenant("acme").await;
    let mut s = h.sse("acme", "ch=a&ch=b", None).await;
    assert_eq!(s.status, 200);
    h.publish("acme", &key, json!({"ch":"a","data":{"n":1}}))
        .await;
    h.publish("acme", &key, json!({"ch":"b","data":{"n":2}}))
        .await;
    let e1 = s.next().await.unwrap();
    assert_eq!(
        (e1.event.as_str(), e1.data["seq"].as_u64()),
        ("msg", Some(1))
    );
    let e2 = s.next().await.unwrap();
    assert_eq!(e2.data["ch"], "b");
    let last_id = e2.id.clone().unwrap();
    drop(s);
    // Missed while away: one on each channel.
    h.publish("acme", &key, json!({"ch":"a","data":{"n":3}}))
        .await;
    h.publish("acme", &key, json!({"ch":"b","data":{"n":4}}))
        .await;
    let mut s = h.sse("acme", "ch=a&ch=b", Some(&last_id)).await;
    let got: Vec<_> = [s.next().await.unwrap(), s.next().await.unwrap()]
        .iter()
        .map(|e| {
            (
                e.data["ch"].as_str().unwrap().to_string(),
                e.data["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        got.contains(&("a".into(), 2)) && got.contains(&("b".into(), 2)),
        "{got:?}"
    );
    // Pretty-printed JSON survives SSE framing.
    let r = h
        .http
        .post(h.url("/v1/t/acme/publish"))
        .bearer_auth(&key)
        .body("{\"ch\":\"a\",\"data\":{\n  \"multi\": \"line\"\n}}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.next().await.unwrap().data["data"]["multi"], "line");
    h.stop().await;
}
