//! The kafka source against librdkafka's in-process mock cluster (the real
//! protocol): records flow through fan-out with no gap, bad configurations
//! are refused, and a broker outage reaches subscribers as stalled, then live.

use crate::helpers::*;
use crate::outbox::{msgs, wait_live};
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

/// README: subscribers are told a source stalled "within two seconds". What
/// is checked is when the node decided (the status's `since_ms`, its own
/// clock) against when the outage began, not how long a loaded test machine
/// then takes to carry the news to a client, which gets `NEWS_WITHIN`.
const STALLED_WITHIN: Duration = Duration::from_secs(2);
const NEWS_WITHIN: Duration = Duration::from_secs(10);

/// Now, in ms since the Unix epoch: when an outage began.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The `stalled` status `ws` gets for an outage that began at `began_ms`,
/// checked to have been decided within [`STALLED_WITHIN`] of it.
async fn stalled_status(ws: &mut Ws, began_ms: u64) -> Value {
    let st = next_op(ws, "status", NEWS_WITHIN).await;
    assert_eq!(
        (st["source"].as_str(), st["state"].as_str()),
        (Some("kafka"), Some("stalled")),
        "{st}"
    );
    assert_decided_in_time(&st, began_ms);
    st
}

/// `since_ms` of a status or health is within [`STALLED_WITHIN`] of `began_ms`.
fn assert_decided_in_time(v: &Value, began_ms: u64) {
    let since = v["since_ms"].as_u64().expect("since_ms");
    let took = Duration::from_millis(since.saturating_sub(began_ms));
    eprintln!("stalled {took:?} after the outage began (the node's clock)");
    assert!(
        took <= STALLED_WITHIN,
        "stalled {took:?} after the outage began: {v}"
    );
}

/// A producer of test records on `brokers`; records wait up to two minutes
/// for the brokers (a test's outage ends well before).
pub(crate) fn test_producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "120000")
        .create()
        .unwrap()
}

/// A host on the test Postgres registry (its positions survive what a test
/// does to them), a mock cluster with `topic` (one partition), a producer,
/// and a public tenant named `prefix` and a random suffix.
pub(crate) struct PgKafka {
    pub pg: String,
    pub cluster: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    pub producer: FutureProducer,
    pub tenant: String,
    pub h: Host,
}

/// [`PgKafka`]; `None` without a test Postgres.
pub(crate) async fn pg_kafka(topic: &str, prefix: &str) -> Option<PgKafka> {
    let Ok(pg) = std::env::var("HERALD_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("HERALD_REQUIRE_POSTGRES").is_err(),
            "Postgres required but not configured"
        );
        return None;
    };
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, 1, 1).unwrap();
    let producer = test_producer(&cluster.bootstrap_servers());
    let tenant = format!("{prefix}{}", rand::random::<u32>());
    let mut opts = HostOptions::new();
    opts.config.database_url = Some(pg.clone());
    let h = spawn_with(opts).await;
    h.public_tenant(&tenant).await;
    Some(PgKafka {
        pg,
        cluster,
        producer,
        tenant,
        h,
    })
}

/// A host whose public `tenant` reads `topic` (of `partitions`) on a mock
/// cluster of its own, live.
async fn live_kafka_tenant(
    topic: &str,
    partitions: i32,
    tenant: &str,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    Host,
) {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, partitions, 1).unwrap();
    let h = spawn_host().await;
    h.public_tenant(tenant).await;
    let source = json!({"kind":"kafka","brokers":cluster.bootstrap_servers(),"topics":[topic]});
    let (s, v) = h
        .admin(
            Method::PUT,
            &format!("/admin/v1/tenants/{tenant}/source"),
            Some(source),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    wait_live(&h, tenant).await;
    (cluster, h)
}

#[tokio::test]
async fn kafka_records_flow_and_a_broker_outage_is_pushed() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("ticks", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer = test_producer(&brokers);
    let h = spawn_host().await;
    h.public_tenant("kflow").await;
    let put = |body: Value| {
        let h = &h;
        async move {
            h.admin(Method::PUT, "/admin/v1/tenants/kflow/source", Some(body))
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
    let mut ws = h.ws("kflow").await;
    // From the start of history: the record written before subscribing comes
    // first (replayed or live), so every message's `prev` is the `seq` of the
    // one before it, and the first one's is 0.
    ws.send(json!({"op":"sub","ch":"t","since":0,"id":1})).await;
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
    while seen.len() < 4 {
        let m = next_op(&mut ws, "msg", WAIT).await;
        assert_eq!(m["prev"].as_u64(), Some(last), "no gap: {m}");
        last = m["seq"].as_u64().unwrap();
        seen.push(m["data"]["n"].as_u64().unwrap());
    }
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3]);

    // Broker down for 6 s (several of the client's reconnect attempts, each
    // backing off up to 1 s): subscribers see stalled within 2 s.
    let (t, began) = (Instant::now(), now_ms());
    cluster.broker_down(1).unwrap();
    stalled_status(&mut ws, began).await;
    let (_, v) = h
        .admin(Method::GET, "/admin/v1/tenants/kflow/source", None)
        .await;
    assert_eq!(v["health"]["state"], "stalled", "{v}");
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(t.elapsed())).await;
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
        h.metric("herald_plugin_dead_letters_total{tenant=\"kflow\",kind=\"bad_record\"}")
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
    let producer = test_producer(&brokers);
    let h = spawn_host().await;
    h.public_tenant("krestart").await;
    let body = json!({"kind":"kafka","brokers":brokers,"topics":["events"],"channel_from":"header:channel"});
    let (s, v) = h
        .admin(Method::PUT, "/admin/v1/tenants/krestart/source", Some(body))
        .await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws("krestart").await;
    ws.sub("e", 1).await;
    // "latest": the reader must have taken its position before we produce.
    wait_live(&h, "krestart").await;
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
    let mut ws = h.ws("krestart").await;
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

#[tokio::test]
async fn kafka_a_client_connecting_while_stalled_is_told_at_once() {
    let (cluster, h) = live_kafka_tenant("quotes", 2, "kstall").await;
    let mut early = h.ws("kstall").await;

    let began = now_ms();
    cluster.broker_down(1).unwrap();
    let st = stalled_status(&mut early, began).await;

    // A client connecting now is told before anything else, without asking.
    let mut late = h.ws("kstall").await;
    let first = tokio::time::timeout(Duration::from_millis(500), late.next())
        .await
        .expect("a frame right after connecting");
    assert_eq!(
        (
            first["op"].as_str(),
            first["source"].as_str(),
            first["state"].as_str()
        ),
        (Some("status"), Some("kafka"), Some("stalled")),
        "{first}"
    );
    assert_eq!(first["since_ms"], st["since_ms"], "the same stall: {first}");

    cluster.broker_up(1).unwrap();
    for ws in [&mut early, &mut late] {
        let st = next_op(ws, "status", Duration::from_secs(10)).await;
        assert_eq!(st["state"], "live", "{st}");
    }
    h.stop().await;
}

#[tokio::test]
async fn kafka_a_broker_that_stops_answering_is_stalled_within_2s() {
    let (cluster, h) = live_kafka_tenant("silent", 2, "ksilent").await;
    let mut ws = h.ws("ksilent").await;

    // Connected but silent: the connection stays open, no answer comes back
    // (a network partition, a hung broker): no librdkafka error to wait for.
    let (t, began) = (Instant::now(), now_ms());
    cluster
        .broker_round_trip_time(1, Duration::from_secs(30))
        .unwrap();
    stalled_status(&mut ws, began).await;
    cluster
        .broker_round_trip_time(1, Duration::from_millis(0))
        .unwrap();
    let st = next_op(&mut ws, "status", Duration::from_secs(40)).await;
    assert_eq!(st["state"], "live", "{st}");
    eprintln!("live {:?} after it answered again", t.elapsed());
    h.stop().await;
}

#[tokio::test]
async fn kafka_options_reach_librdkafka_and_secrets_never_show() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("secure", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let h = spawn_host().await;
    h.public_tenant("kopts").await;
    let put = |options: Value| {
        let h = &h;
        let body = json!({"kind":"kafka","brokers":brokers,"topics":["secure"],"options":options});
        async move {
            h.admin(Method::PUT, "/admin/v1/tenants/kopts/source", Some(body))
                .await
        }
    };
    let message = |v: &Value| {
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };

    // What Herald owns is refused by name.
    for name in [
        "group.id",
        "bootstrap.servers",
        "enable.auto.commit",
        "enable.auto.offset.store",
    ] {
        let (s, v) = put(json!({ name: "x" })).await;
        assert_eq!(s, 400, "{name}: {v}");
        assert!(message(&v).contains(&format!("\"{name}\"")), "{v}");
    }
    // Herald refuses what is not on its list; librdkafka bad values, in its
    // words.
    let (s, v) = put(json!({"no.such.property": "1"})).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        message(&v).contains("not an option a tenant may set"),
        "{v}"
    );
    let (s, v) = put(json!({"security.protocol": "carrier_pigeon"})).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        message(&v).contains(
            "Invalid value \"carrier_pigeon\" for configuration property \"security.protocol\""
        ),
        "{v}"
    );
    // The option changes how the client talks to the brokers: this mock
    // broker speaks no SASL, so a SASL client never gets its metadata.
    let (s, v) = put(
        json!({"security.protocol":"SASL_PLAINTEXT","sasl.mechanism":"PLAIN",
        "sasl.username":"u","sasl.password":"hunter2"}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("cannot reach the brokers"), "{v}");
    assert!(!v.to_string().contains("hunter2"), "{v}");

    // Accepted: secrets show as *** in the answer and in GET, the rest as given.
    let (s, v) = put(json!({"client.id":"herald-kopts","sasl.username":"u",
        "sasl.password":"hunter2","ssl.key.password":"pw2","session.timeout.ms":6000}))
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, got) = h
        .admin(Method::GET, "/admin/v1/tenants/kopts/source", None)
        .await;
    for shown in [&v, &got] {
        let o = &shown["source"]["options"];
        assert_eq!(o["sasl.password"], "***", "{shown}");
        assert_eq!(o["ssl.key.password"], "***", "{shown}");
        assert_eq!(o["sasl.username"], "u", "{shown}");
        assert_eq!(o["client.id"], "herald-kopts", "{shown}");
        assert_eq!(o["session.timeout.ms"], "6000", "{shown}");
        assert!(!shown.to_string().contains("hunter2"), "{shown}");
    }
    let got = wait_live(&h, "kopts").await;
    assert_eq!(got["health"]["partitions"], 1, "{got}");
    // Sending back what GET showed would store "***" as the password: refused.
    let (s, v) = h
        .admin(
            Method::PUT,
            "/admin/v1/tenants/kopts/source",
            Some(got["source"].clone()),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("placeholder"), "{v}");
    h.stop().await;
}

/// The reader may be busy for seconds with one batch (here a transform that
/// runs to its deadline, on the reader's own runtime thread): the stall must
/// not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_slow_batch_does_not_delay_the_stall() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("slow", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer = test_producer(&brokers);
    let h = spawn_host().await;
    h.tenant(json!({"id":"kslow","access":"public","limits":{"plugin_deadline_ms":3000}}))
        .await;
    h.install_plugin("kslow", "fixture_loop").await;
    let (s, v) = h
        .admin(
            Method::PUT,
            "/admin/v1/tenants/kslow/source",
            Some(json!({"kind":"kafka","brokers":brokers,"topics":["slow"]})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    wait_live(&h, "kslow").await;
    produce(&producer, "slow", "s", 1).await;
    // The reader fetches the record within its fetch wait (50 ms) and holds
    // it in the transform for 3 s. Nothing outside shows a batch in flight,
    // so this one wait is a pause, well inside those 3 s.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (t, began) = (Instant::now(), now_ms());
    cluster
        .broker_round_trip_time(1, Duration::from_secs(30))
        .unwrap();
    loop {
        let (_, v) = h
            .admin(Method::GET, "/admin/v1/tenants/kslow/source", None)
            .await;
        if v["health"]["state"] == "stalled" {
            assert_decided_in_time(&v["health"], began);
            break;
        }
        assert!(
            t.elapsed() < NEWS_WITHIN,
            "not stalled {:?} after the broker stopped answering: {v}",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stalled = Instant::now();
    // The case ran: the batch was in the transform when the stall showed.
    // Its one record times out 3 s after the call began and is
    // dead-lettered then, so that call began before the stall was seen.
    let timeouts = "herald_plugin_dead_letters_total{tenant=\"kslow\",kind=\"timeout\"}";
    let done = loop {
        if h.metric(timeouts).await >= 1.0 {
            break Instant::now();
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the slow batch never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        done.duration_since(stalled) < Duration::from_millis(3000),
        "the transform began after the stall showed ({:?} later): the stall was not \
         shown while a batch was in flight",
        done.duration_since(stalled)
            .saturating_sub(Duration::from_millis(3000))
    );
    cluster
        .broker_round_trip_time(1, Duration::from_millis(0))
        .unwrap();
    h.stop().await;
}

/// HTTP publish on a Kafka tenant is produced into its topic and comes back
/// through the consumer: the answer's `seq` is the one subscribers get, from
/// the record's offset, as on every node.
#[tokio::test]
async fn http_publish_into_a_kafka_tenant_goes_through_the_topic() {
    let (_cluster, h) = live_kafka_tenant("kpub", 1, "kpub").await;
    let key = {
        let (s, v) = h
            .admin(
                Method::POST,
                "/admin/v1/tenants/kpub/publish-key",
                Some(json!({})),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        v["publish_key"].as_str().unwrap().to_string()
    };
    let mut ws = h.ws("kpub").await;
    ws.sub("c", 1).await;
    let (s, one) = h
        .publish("kpub", &key, json!({"ch":"c","data":{"n":0}}))
        .await;
    assert_eq!(s, 200, "{one}");
    let (s, many) = h
        .publish(
            "kpub",
            &key,
            json!([{"ch":"c","data":{"n":1}},{"ch":"c","data":{"n":2},"key":"k"}]),
        )
        .await;
    assert_eq!(s, 200, "{many}");
    let mut answered = vec![one["seq"].clone()];
    answered.extend(
        many["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["seq"].clone()),
    );
    let got = msgs(&mut ws, 3).await;
    let ns: Vec<Value> = got.iter().map(|m| m["data"]["n"].clone()).collect();
    assert_eq!(ns, [json!(0), json!(1), json!(2)], "in order");
    let seqs: Vec<Value> = got.iter().map(|m| m["seq"].clone()).collect();
    assert_eq!(seqs, answered, "the answered positions");
    assert_eq!(
        got[0]["seq"],
        json!((one["offset"].as_u64().unwrap() + 1) * 1000)
    );
    h.stop().await;
}

/// A reader that falls behind the topic's retention while it runs (here its
/// fetches fail while the brokers delete old records) must not jump ahead
/// in silence: the records it never read are a `gap` for the channels they
/// may have fed, before the next message.
#[tokio::test]
async fn kafka_records_lost_to_retention_while_reading_are_a_gap() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let (cluster, h) = live_kafka_tenant("k-retained", 1, "k-retained").await;
    let producer = test_producer(&cluster.bootstrap_servers());
    let mut ws = h.ws("k-retained").await;
    ws.sub("c", 1).await;
    produce(&producer, "k-retained", "c", 0).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["data"]["n"], 0);
    // The reader's fetches fail for a while (each failure backs it off
    // 500 ms), while the topic takes more than the mock brokers keep (5 MiB
    // per partition): the record for `c` at offset 1 is deleted unread.
    cluster.request_errors(
        RDKafkaApiKey::Fetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 8],
    );
    produce(&producer, "k-retained", "c", 1).await;
    let pad = vec![b'x'; 100_000];
    for _ in 0..70 {
        producer
            .send(
                FutureRecord::<(), _>::to("k-retained").payload(&pad),
                Duration::from_secs(60),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("produced");
    }
    use rdkafka::consumer::Consumer as _;
    let probe: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .create()
        .unwrap();
    let (low, _) = probe
        .fetch_watermarks("k-retained", 0, Duration::from_secs(5))
        .unwrap();
    assert!(low > 1, "the brokers still hold offset 1 (earliest {low})");
    produce(&producer, "k-retained", "c", 2).await;
    // What the client sees before n = 2: a gap that covers n = 1's position
    // (offset 1 → 2000), or n = 1 itself.
    let end = Instant::now() + 3 * WAIT;
    let mut covered = false;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "n = 2 never arrived");
        let Ok(m) = tokio::time::timeout(left, ws.next()).await else {
            continue;
        };
        match m["op"].as_str() {
            Some("gap") if m["ch"] == "c" => {
                covered |= m["to"].as_u64().is_some_and(|to| to >= 2000)
            }
            Some("msg") if m["data"]["n"] == 1 => covered = true,
            Some("msg") if m["data"]["n"] == 2 => break,
            _ => {}
        }
    }
    assert!(covered, "n = 1 was lost without a gap");
    h.stop().await;
}

/// Offsets this node read that the brokers no longer have (the topic was
/// deleted and made again; here the stored position is moved past the end)
/// are never read over in silence: the source stalls and says why, and a
/// new `generation` starts a new position space, which subscribers are told
/// of by an `ack` with the new epoch.
#[tokio::test]
async fn kafka_a_position_past_the_topics_end_stalls_until_a_new_generation() {
    let Some(PgKafka {
        pg,
        cluster,
        producer,
        tenant,
        h,
    }) = pg_kafka("k-again", "k-again").await
    else {
        return;
    };
    let brokers = cluster.bootstrap_servers();
    let path = format!("/admin/v1/tenants/{tenant}/source");
    let source = |start: &str, generation: Option<u32>| {
        let mut b = json!({"kind":"kafka","brokers":brokers,"topics":["k-again"],"start":start});
        if let Some(g) = generation {
            b["generation"] = json!(g);
        }
        b
    };
    let (s, v) = h
        .admin(Method::PUT, &path, Some(source("earliest", None)))
        .await;
    assert_eq!(s, 200, "{v}");
    wait_live(&h, &tenant).await;
    let mut ws = h.ws(&tenant).await;
    let ack = ws.sub("c", 1).await;
    for n in 0..3 {
        produce(&producer, "k-again", "c", n).await;
    }
    assert_eq!(msgs(&mut ws, 3).await.len(), 3);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // From now on every position this node stores reads 100 (the reader
    // stores its own when it stops).
    let pool = sqlx::PgPool::connect(&pg).await.unwrap();
    let past = format!("past_{}", tenant.replace('-', "_"));
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION {past}() RETURNS trigger AS $$ BEGIN \
           IF NEW.tenant_id = '{tenant}' THEN NEW.position := '{{\"k-again:0\":100}}'; END IF; RETURN NEW; END; $$ LANGUAGE plpgsql;
         CREATE TRIGGER {past} BEFORE INSERT OR UPDATE ON ingest_cursors FOR EACH ROW EXECUTE FUNCTION {past}();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    // Another start (the same position space) starts the reader again.
    let (s, v) = h
        .admin(Method::PUT, &path, Some(source("latest", None)))
        .await;
    assert_eq!(s, 200, "{v}");
    let deadline = Instant::now() + WAIT;
    let health = loop {
        let (_, v) = h.admin(Method::GET, &path, None).await;
        if v["health"]["state"] == "stalled" {
            break v["health"].clone();
        }
        assert!(Instant::now() < deadline, "read over in silence: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let why = health["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("re-created") && why.contains("generation"),
        "{health}"
    );
    sqlx::raw_sql(&format!(
        "DROP TRIGGER {past} ON ingest_cursors; DROP FUNCTION {past}();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    // The operator starts a new position space.
    let (s, v) = h
        .admin(Method::PUT, &path, Some(source("earliest", Some(1))))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["source"]["generation"], 1, "{v}");
    wait_live(&h, &tenant).await;
    let told = next_op(&mut ws, "ack", WAIT).await;
    assert_eq!(told["ch"], "c");
    assert_ne!(told["epoch"], ack["epoch"], "a new epoch: {told}");
    produce(&producer, "k-again", "c", 3).await;
    let mut seen = Vec::new();
    while seen.last() != Some(&3) {
        seen.extend(
            msgs(&mut ws, 1)
                .await
                .iter()
                .map(|m| m["data"]["n"].as_u64().unwrap()),
        );
    }
    assert_eq!(seen, [0, 1, 2, 3], "the topic read again in its new space");
    h.stop().await;
}
