//! Unit tests of the Kafka source: client options, partitions found later, config shapes.

use super::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn options(json: &str) -> KafkaOptions {
    serde_json::from_str(json).unwrap()
}

#[test]
fn every_client_takes_the_tenants_options_and_herald_keeps_its_own() {
    let o = options(r#"{"client.id":"c1","fetch.wait.max.ms":10,"security.protocol":"SASL_SSL"}"#);
    let c = reader_config("b:9092", &o, "herald-t-n");
    assert_eq!(c.get("client.id"), Some("c1"));
    assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
    // Herald's tuning yields to the tenant; what Herald owns does not.
    assert_eq!(c.get("fetch.wait.max.ms"), Some("10"));
    assert_eq!(c.get("reconnect.backoff.max.ms"), Some("1000"));
    assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
    assert_eq!(c.get("group.id"), Some("herald-t-n"));
    assert_eq!(c.get("enable.auto.commit"), Some("false"));
    assert_eq!(c.get("allow.auto.create.topics"), Some("false"));
    assert_eq!(client_config("b", &o).get("client.id"), Some("c1"));
}

#[test]
fn tls_and_sasl_clients_can_be_made() {
    // Managed clusters take TLS, SASL/PLAIN over TLS, SCRAM or client
    // certificates: librdkafka must be built with OpenSSL for any of them.
    for o in [
        r#"{"security.protocol":"SSL","ssl.endpoint.identification.algorithm":"https"}"#,
        r#"{"security.protocol":"SASL_SSL","sasl.mechanism":"PLAIN","sasl.username":"u","sasl.password":"p"}"#,
        r#"{"security.protocol":"SASL_SSL","sasl.mechanism":"SCRAM-SHA-512","sasl.username":"u","sasl.password":"p"}"#,
    ] {
        reader_config("b:9093", &options(o), "g")
            .create::<BaseConsumer>()
            .map_err(client_error)
            .unwrap_or_else(|e| panic!("{o}: {e}"));
    }
}

#[test]
fn librdkafkas_refusal_never_repeats_a_secret() {
    let o = options(r#"{"sasl.jaas.config":"org.x required password=\"hunter2\";"}"#);
    let e = client_config("b", &o)
        .set("group.id", "g")
        .create::<BaseConsumer>()
        .map(drop)
        .map_err(client_error)
        .unwrap_err();
    assert!(e.contains("JAAS"), "librdkafka's reason: {e}");
    assert!(!e.contains("hunter2"), "{e}");
    let e = client_config("b", &options(r#"{"security.protocol":"carrier_pigeon"}"#))
        .set("group.id", "g")
        .create::<BaseConsumer>()
        .map(drop)
        .map_err(client_error)
        .unwrap_err();
    assert!(
        e.contains("carrier_pigeon") && e.contains("security.protocol"),
        "{e}"
    );
}

/// The mock cluster cannot add partitions to a topic (librdkafka's mock
/// has no CreatePartitions handler, and creating an existing topic fails),
/// so the reader's first assignment pretends the topic had one partition;
/// the metadata read by the watch then shows the second.
#[test]
fn a_partition_found_later_is_assigned_and_read_from_its_beginning() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("grow", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    // Written before the reader knew of partition 1: new to it all the same.
    for v in ["a", "b"] {
        producer
            .send(BaseRecord::<(), _>::to("grow").partition(1).payload(v))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let consumer: BaseConsumer = reader_config(&brokers, &KafkaOptions::default(), "g")
        .create()
        .unwrap();
    let parts = Mutex::new(Partitions::new(BTreeMap::new()));
    let first = [("grow".to_string(), vec![0])];
    let t = CONNECT_TIMEOUT;
    assert_eq!(
        brokers::assign_new(&consumer, &parts, &first, KafkaStart::Latest, t),
        Ok(1)
    );
    let found = brokers::find(&consumer, &["grow".to_string()], t).unwrap();
    assert_eq!(found, [("grow".to_string(), vec![0, 1])]);
    assert_eq!(
        brokers::assign_new(&consumer, &parts, &found, KafkaStart::Latest, t),
        Ok(1)
    );
    assert_eq!(
        brokers::assign_new(&consumer, &parts, &found, KafkaStart::Latest, t),
        Ok(0),
        "assigned once"
    );
    assert_eq!(parts.lock().count(), 2);
    assert_eq!(consumer.assignment().unwrap().count(), 2);
    // Its lag counts from its beginning, not from "latest".
    let positions = parts.lock().positions();
    let latest = brokers::latest(&consumer, &positions, t).unwrap();
    assert_eq!(partitions::lag(&positions, &latest), 2);

    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "records of partition 1: {got:?}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            got.push((m.partition(), m.offset(), m.payload().unwrap().to_vec()));
        }
    }
    assert_eq!(got, [(1, 0, b"a".to_vec()), (1, 1, b"b".to_vec())]);
}

#[test]
fn config_shapes() {
    let c: SourceConfig = serde_json::from_str(
        r#"{"kind":"kafka","brokers":"b:9092","topics":["t"],"start":"earliest"}"#,
    )
    .unwrap();
    assert!(matches!(
        c,
        SourceConfig::Kafka {
            start: KafkaStart::Earliest,
            ..
        }
    ));
    let c: SourceConfig = serde_json::from_str(
        r#"{"kind":"kafka","brokers":"b","topics":["t"],"start":1700000000000}"#,
    )
    .unwrap();
    assert!(matches!(
        c,
        SourceConfig::Kafka {
            start: KafkaStart::Timestamp(1_700_000_000_000),
            ..
        }
    ));
    let c: SourceConfig =
        serde_json::from_str(r#"{"kind":"kafka","brokers":"b","topics":["t"]}"#).unwrap();
    assert!(matches!(
        c,
        SourceConfig::Kafka {
            start: KafkaStart::Latest,
            ..
        }
    ));
    assert!(serde_json::from_str::<SourceConfig>(
        r#"{"kind":"kafka","brokers":"b","topics":["t"],"start":"yesterday"}"#
    )
    .is_err());
    assert_eq!(
        ChannelFrom::parse(None),
        Ok(ChannelFrom::Header("channel".into()))
    );
    assert_eq!(ChannelFrom::parse(Some("key")), Ok(ChannelFrom::Key));
    assert!(ChannelFrom::parse(Some("header:")).is_err());
}
