//! A publish retried after a lost answer or a `503`: on a Kafka
//! tenant, a batch sent again under its `Idempotency-Key` produces only what
//! the brokers did not acknowledge the first time, and is answered with the
//! positions of the first: subscribers get each message once. (The shared
//! log's keys: cluster/delivery.rs.)

use crate::helpers::*;
use crate::outbox::{msgs, wait_live};
use rdkafka::mocking::MockCluster;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

/// Host, mock cluster, a public tenant reading `topic` (created with
/// `partitions`, each led by broker `leaders[i]`) from its earliest record;
/// returns its publish key.
async fn kafka_tenant(
    h: &Host,
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    tenant: &str,
    topic: &str,
    leaders: &[i32],
) -> String {
    cluster
        .create_topic(topic, leaders.len() as i32, 1)
        .unwrap();
    for (p, &b) in leaders.iter().enumerate() {
        cluster.partition_leader(topic, p as i32, Some(b)).unwrap();
    }
    let key = h.public_tenant(tenant).await;
    let body = json!({"kind":"kafka","brokers":cluster.bootstrap_servers(),"topics":[topic],"start":"earliest"});
    let path = format!("/admin/v1/tenants/{tenant}/source");
    let (s, v) = h.admin(Method::PUT, &path, Some(body)).await;
    assert_eq!(s, 200, "{v}");
    wait_live(h, tenant).await;
    key
}

async fn post(h: &Host, tenant: &str, key: &str, idem: &str, body: &Value) -> (u16, Value) {
    let r = h
        .http
        .post(h.url(&format!("/v1/t/{tenant}/publish")))
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn seqs(v: &Value) -> Vec<u64> {
    v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {v}"))
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect()
}

/// Every `msg` for `within`: (channel, n).
async fn received(ws: &mut Ws, within: Duration) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let end = tokio::time::Instant::now() + within;
    while let Ok(m) = tokio::time::timeout_at(end, ws.next()).await {
        if m["op"] == "msg" {
            out.push((
                m["ch"].as_str().unwrap().to_string(),
                m["data"]["n"].as_u64().unwrap(),
            ));
        }
    }
    out
}

#[tokio::test]
async fn a_kafka_batch_sent_again_under_its_key_is_produced_once() {
    let cluster = MockCluster::new(1).unwrap();
    let h = spawn_host().await;
    let key = kafka_tenant(&h, &cluster, "idem-k", "idem-k", &[1]).await;
    let mut ws = h.ws("idem-k").await;
    ws.sub("c", 1).await;
    let batch =
        json!([{"ch":"c","data":{"n":0}},{"ch":"c","data":{"n":1}},{"ch":"c","data":{"n":2}}]);
    let (s, first) = post(&h, "idem-k", &key, "order-1", &batch).await;
    assert_eq!(s, 200, "{first}");
    // The answer was lost; the publisher sends the batch again.
    let (s, again) = post(&h, "idem-k", &key, "order-1", &batch).await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(seqs(&again), seqs(&first), "answered as the first");
    let got = received(&mut ws, Duration::from_millis(1500)).await;
    let ns: Vec<u64> = got.iter().map(|(_, n)| *n).collect();
    assert_eq!(ns, [0, 1, 2], "each message once");
    // The key names a batch of three.
    let (s, v) = post(
        &h,
        "idem-k",
        &key,
        "order-1",
        &json!([{"ch":"c","data":{"n":9}}]),
    )
    .await;
    assert_eq!(s, 409, "{v}");
    // Another key is another batch.
    let (s, v) = post(&h, "idem-k", &key, "order-2", &batch).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(msgs(&mut ws, 3).await.len(), 3);
    h.stop().await;
}

/// The partition of `channel` among `count`, as Herald's producer picks it
/// (FNV-1a of the name; README: "each record in its channel's partition").
fn partition_of(channel: &str, count: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in channel.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % count
}

/// A batch of which the brokers acknowledged part (one partition's leader is
/// down) is answered 503; sent again under its key once the leader is back,
/// only the unacknowledged record is produced.
#[tokio::test]
async fn a_kafka_batch_acknowledged_in_part_is_completed_not_repeated() {
    let cluster = MockCluster::new(2).unwrap();
    let h = spawn_host().await;
    let key = kafka_tenant(&h, &cluster, "idem-part", "idem-part", &[1, 2]).await;
    let on = |p: u64| {
        (0..)
            .map(|i| format!("ch{i}"))
            .find(|c| partition_of(c, 2) == p)
            .unwrap()
    };
    let (up, down) = (on(0), on(1));
    let mut ws = h.ws("idem-part").await;
    ws.sub(&up, 1).await;
    ws.sub(&down, 2).await;
    let batch = json!([{"ch":up,"data":{"n":0}},{"ch":down,"data":{"n":1}}]);
    cluster.broker_down(2).unwrap();
    let (s, v) = post(&h, "idem-part", &key, "order-3", &batch).await;
    assert_eq!(s, 503, "{v}");
    cluster.broker_up(2).unwrap();
    let deadline = tokio::time::Instant::now() + 4 * WAIT;
    let answer = loop {
        let (s, v) = post(&h, "idem-part", &key, "order-3", &batch).await;
        if s == 200 {
            break v;
        }
        assert_eq!(s, 503, "{v}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "never completed: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(seqs(&answer).len(), 2, "{answer}");
    let mut got = received(&mut ws, Duration::from_secs(3)).await;
    got.sort();
    let mut want = vec![(up, 0), (down, 1)];
    want.sort();
    assert_eq!(got, want, "each message once");
    h.stop().await;
}
