//! The kafka source against librdkafka's in-process mock cluster (the real
//! protocol): records flow through fan-out with no gap, bad configurations
//! are refused, and a broker outage reaches subscribers as stalled, then live.

use crate::helpers::*;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub(crate) async fn produce(p: &FutureProducer, topic: &str, channel: &str, n: u64) {
    let payload = json!({"n": n}).to_string();
    let key = format!("k{n}");
    let headers = OwnedHeaders::new().insert(Header {
        key: "channel",
        value: Some(channel),
    });
    p.send(
        FutureRecord::to(topic)
            .payload(&payload)
            .key(&key)
            .headers(headers),
        Duration::from_secs(60),
    )
    .await
    .map_err(|(e, _)| e)
    .expect("produced");
}

#[tokio::test]
async fn kafka_records_flow_and_a_broker_outage_is_pushed() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("ticks", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("message.timeout.ms", "120000")
        .create()
        .unwrap();
    let h = spawn_host().await;
    h.public_tenant("k").await;
    let put = |body: Value| {
        let h = &h;
        async move {
            h.admin(Method::PUT, "/admin/v1/tenants/k/source", Some(body))
                .await
        }
    };

    let (s, v) = put(json!({"kind":"kafka","brokers":brokers,"topics":["missing"]})).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("missing"),
        "{v}"
    );
    let (s, v) = put(json!({"kind":"kafka","brokers":"127.0.0.1:1","topics":["ticks"]})).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) =
        put(json!({"kind":"kafka","brokers":brokers,"topics":["ticks"],"channel_from":"nonsense"}))
            .await;
    assert_eq!(s, 400, "{v}");

    // Written before the source exists; "earliest" picks it up.
    produce(&producer, "ticks", "t", 0).await;
    let (s, v) =
        put(json!({"kind":"kafka","brokers":brokers,"topics":["ticks"],"start":"earliest"})).await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws("k").await;
    ws.sub("t", 1).await;
    // Records without the channel header are dead-lettered, not stopping anything.
    producer
        .send(
            FutureRecord::<(), _>::to("ticks").payload("{}"),
            Duration::from_secs(60),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    for n in 1..=3 {
        produce(&producer, "ticks", "t", n).await;
    }
    let mut seen = Vec::new();
    let mut last = 0u64;
    // The record written before subscribing may already be in history; count
    // what arrives live from here on.
    while seen.len() < 3 {
        let m = next_op(&mut ws, "msg", WAIT).await;
        assert_eq!(
            m["prev"].as_u64(),
            Some(last).filter(|l| *l > 0).or(m["prev"].as_u64())
        );
        last = m["seq"].as_u64().unwrap();
        if m["data"]["n"].as_u64().unwrap() > 0 {
            seen.push(m["data"]["n"].as_u64().unwrap());
        }
    }
    seen.sort();
    assert_eq!(seen, [1, 2, 3]);

    // Broker down for 30 s: subscribers see stalled within 2 s.
    let t = Instant::now();
    cluster.broker_down(1).unwrap();
    let st = next_op(&mut ws, "status", Duration::from_secs(3)).await;
    assert_eq!(
        (st["source"].as_str(), st["state"].as_str()),
        (Some("kafka"), Some("stalled"))
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "stalled after {:?}",
        t.elapsed()
    );
    let (_, v) = h
        .admin(Method::GET, "/admin/v1/tenants/k/source", None)
        .await;
    assert_eq!(v["health"]["state"], "stalled", "{v}");
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(t.elapsed())).await;
    let t = Instant::now();
    cluster.broker_up(1).unwrap();
    let st = next_op(&mut ws, "status", Duration::from_secs(5)).await;
    assert_eq!(st["state"], "live");
    eprintln!("live {:?} after the broker came back", t.elapsed());

    // Produced after recovery, then after that: all arrive, no gap.
    for n in 4..=6 {
        produce(&producer, "ticks", "t", n).await;
    }
    let mut after = Vec::new();
    while after.len() < 3 {
        let m = next_op(&mut ws, "msg", Duration::from_secs(10)).await;
        assert_eq!(m["prev"].as_u64(), Some(last), "no gap: {m}");
        last = m["seq"].as_u64().unwrap();
        after.push(m["data"]["n"].as_u64().unwrap());
    }
    after.sort();
    assert_eq!(after, [4, 5, 6]);
    assert!(
        h.metric("herald_plugin_dead_letters_total{tenant=\"k\",kind=\"bad_record\"}")
            .await
            >= 1.0
    );
    h.stop().await;
}

#[tokio::test]
async fn kafka_resumes_after_restart_without_loss() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("events", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let h = spawn_host().await;
    h.public_tenant("k").await;
    let body = json!({"kind":"kafka","brokers":brokers,"topics":["events"],"channel_from":"header:channel"});
    let (s, v) = h
        .admin(Method::PUT, "/admin/v1/tenants/k/source", Some(body))
        .await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws("k").await;
    ws.sub("e", 1).await;
    // "latest": give the reader a moment to take its position before producing.
    for _ in 0..50 {
        let (_, v) = h
            .admin(Method::GET, "/admin/v1/tenants/k/source", None)
            .await;
        if v["health"]["state"] == "live" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    produce(&producer, "events", "e", 1).await;
    assert_eq!(next_op(&mut ws, "msg", WAIT).await["data"]["n"], 1);
    drop(ws);
    let dir = h.data_dir.clone();
    let stopped = h.stop().await;
    for n in 2..=4 {
        produce(&producer, "events", "e", n).await;
    }
    let mut opts = HostOptions::new();
    opts.config.data_dir = dir;
    opts.dir = stopped;
    let h = spawn_with(opts).await;
    let mut ws = h.ws("k").await;
    // The reader resumes from its stored position: 2, 3, 4 are published
    // (into history if they beat this subscription), 1 is not repeated.
    ws.send(json!({"op":"sub","ch":"e","since":0,"id":1})).await;
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(
            next_op(&mut ws, "msg", WAIT).await["data"]["n"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(got, [2, 3, 4]);
    produce(&producer, "events", "e", 5).await;
    assert_eq!(next_op(&mut ws, "msg", WAIT).await["data"]["n"], 5);
    h.stop().await;
}
