//! A Kafka source's README promises beyond the header: `channel_from`
//! `"key"` and `"topic"` map records to channels by their key or topic, and
//! a `start` in ms. librdkafka's mock cluster answers every ListOffsets by
//! time with "no record at or after it" (its lookup by time is a FIXME), so
//! only that answer runs end to end here — a time after every record, which
//! starts at the partition's end; source/kafka/partitions.rs checks that the
//! time is what the reader asks the brokers for.

use crate::helpers::*;
use crate::kafka::test_producer;
use crate::outbox::wait_live;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

/// Produces `{"n": n}` to `topic` with `key`.
async fn produce(p: &FutureProducer, topic: &str, key: &str, n: u64) {
    let payload = json!({"n": n}).to_string();
    let record = FutureRecord::to(topic).payload(&payload).key(key);
    p.send(record, Duration::from_secs(60))
        .await
        .map_err(|(e, _)| e)
        .expect("produced");
}

type Cluster = MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

/// A mock cluster with `topics` (one partition each) and a producer.
fn mock(topics: &[&str]) -> (Cluster, FutureProducer) {
    let cluster = MockCluster::new(1).unwrap();
    for t in topics {
        cluster.create_topic(t, 1, 1).unwrap();
    }
    let producer = test_producer(&cluster.bootstrap_servers());
    (cluster, producer)
}

/// A host with a public tenant `tenant` reading `topics` of `cluster`, the
/// source's other fields from `extra`; once it is live.
async fn serve(cluster: &Cluster, tenant: &str, topics: &[&str], extra: Value) -> Host {
    let h = spawn_host().await;
    h.public_tenant(tenant).await;
    let mut source = json!({"kind":"kafka","brokers":cluster.bootstrap_servers(),"topics":topics});
    for (k, v) in extra.as_object().unwrap() {
        source[k] = v.clone();
    }
    let path = format!("/admin/v1/tenants/{tenant}/source");
    let (s, v) = h.admin(Method::PUT, &path, Some(source)).await;
    assert_eq!(s, 200, "{v}");
    wait_live(&h, tenant).await;
    h
}

/// A subscriber of each of `channels` from the start of their history.
async fn from_the_start(h: &Host, tenant: &str, channels: &[&str]) -> Ws {
    let mut ws = h.ws(tenant).await;
    for (id, ch) in channels.iter().enumerate() {
        ws.send(json!({"op":"sub","ch":ch,"since":0,"id":id})).await;
    }
    ws
}

/// The `n` of each message `ws` gets, `count` of them, with their channel.
async fn ns(ws: &mut Ws, count: usize) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    while out.len() < count {
        let m = ws.next().await;
        if m["op"] == "msg" {
            out.push((
                m["ch"].as_str().unwrap().to_string(),
                m["data"]["n"].as_u64().unwrap(),
            ));
        }
    }
    out
}

/// `"channel_from": "key"`: a record goes to the channel its key names;
/// one without a key is dead-lettered, not stopping the rest.
#[tokio::test]
async fn channel_from_key_maps_each_record_to_its_key() {
    let (cluster, producer) = mock(&["events"]);
    let h = serve(&cluster, "kkey", &["events"], json!({"channel_from":"key"})).await;
    let mut ws = from_the_start(&h, "kkey", &["room-1", "room-2"]).await;
    produce(&producer, "events", "room-1", 1).await;
    produce(&producer, "events", "room-2", 2).await;
    producer
        .send(
            FutureRecord::<(), _>::to("events").payload("{\"n\":0}"),
            Duration::from_secs(60),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    produce(&producer, "events", "room-1", 3).await;
    produce(&producer, "events", "room-3", 4).await;
    let mut got = ns(&mut ws, 3).await;
    got.sort();
    assert_eq!(
        got,
        [
            ("room-1".into(), 1),
            ("room-1".into(), 3),
            ("room-2".into(), 2)
        ],
        "each record on its key's channel, the keyless one on none"
    );
    let dead = r#"herald_plugin_dead_letters_total{tenant="kkey""#;
    assert_eq!(
        h.metric(dead).await,
        1.0,
        "the keyless record dead-lettered"
    );
    h.stop().await;
}

/// `"channel_from": "topic"`: every record of a topic goes to the channel
/// named after it.
#[tokio::test]
async fn channel_from_topic_maps_each_topic_to_its_channel() {
    let (cluster, producer) = mock(&["alpha", "beta"]);
    let h = serve(
        &cluster,
        "ktopic",
        &["alpha", "beta"],
        json!({"channel_from":"topic"}),
    )
    .await;
    let mut ws = from_the_start(&h, "ktopic", &["alpha", "beta"]).await;
    produce(&producer, "alpha", "x", 1).await;
    produce(&producer, "beta", "x", 2).await;
    produce(&producer, "alpha", "y", 3).await;
    let mut got = ns(&mut ws, 3).await;
    got.sort();
    assert_eq!(
        got,
        [("alpha".into(), 1), ("alpha".into(), 3), ("beta".into(), 2)]
    );
    h.stop().await;
}

/// `"start": <ms>` later than every record: the brokers find no record at
/// or after it, and the source starts at the partition's end — records
/// produced before are not delivered, the next one is. A source that took
/// the answer for "from the beginning", or stalled on it, fails here.
#[tokio::test]
async fn a_start_time_after_every_record_starts_at_the_end() {
    let (cluster, producer) = mock(&["ticks"]);
    produce(&producer, "ticks", "k", 1).await;
    produce(&producer, "ticks", "k", 2).await;
    let in_an_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 3_600_000;
    let h = serve(
        &cluster,
        "ktime",
        &["ticks"],
        json!({"channel_from":"topic","start":in_an_hour}),
    )
    .await;
    let mut ws = from_the_start(&h, "ktime", &["ticks"]).await;
    assert_eq!(ws.next().await["op"], "ack");
    produce(&producer, "ticks", "k", 3).await;
    assert_eq!(
        ns(&mut ws, 1).await,
        [("ticks".to_string(), 3)],
        "only the record produced after the source started"
    );
    h.stop().await;
}
