//! The `kafka` source: a broadcast consumer of the tenant's topics.
//!
//! Owns: reading every partition of the tenant's topics by manual assignment
//! (no consumer group, no rebalancing: every node holds subscribers of any
//! channel, so every node reads everything), this node's positions in the
//! registry, the record-to-channel mapping for tenants without a transform,
//! each record's position (partition → stream, offset + 1 → number, so a
//! re-read record is a duplicate and every node numbers it alike), and the
//! source's health. Invariants: the stored positions only move past
//! records that were published, so a restart resumes without loss; fetching
//! runs only as fast as ingest (librdkafka's fetch queue is bounded): Kafka is
//! the buffer, never Herald's memory; broker trouble shows as stalled within
//! about two seconds and as live once records or watermarks flow again.

use super::{set_state, Health, SourceConfig, SourceState};
use crate::app::App;
use crate::fanout::position::SourcePos;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::registry::now_ms;
use crate::tenant::Tenant;
use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Where a new node starts reading (a node with stored positions resumes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(untagged)]
pub enum KafkaStart {
    #[default]
    #[serde(with = "latest_tag")]
    Latest,
    #[serde(with = "earliest_tag")]
    Earliest,
    /// Milliseconds since the Unix epoch.
    Timestamp(u64),
}

macro_rules! tag {
    ($m:ident, $s:literal) => {
        mod $m {
            pub fn serialize<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($s)
            }
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
                let v = <String as serde::Deserialize>::deserialize(d)?;
                if v == $s {
                    Ok(())
                } else {
                    Err(serde::de::Error::custom(concat!("expected \"", $s, "\"")))
                }
            }
        }
    };
}
tag!(latest_tag, "latest");
tag!(earliest_tag, "earliest");

/// Which part of a record names its channel (tenants without a transform).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelFrom {
    Header(String),
    Key,
    Topic,
}

impl ChannelFrom {
    /// `"header:<name>"` (default `header:channel`), `"key"` or `"topic"`.
    pub fn parse(s: Option<&str>) -> Result<ChannelFrom, String> {
        match s.unwrap_or("header:channel") {
            "key" => Ok(ChannelFrom::Key),
            "topic" => Ok(ChannelFrom::Topic),
            h => match h.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Ok(ChannelFrom::Header(name.to_string())),
                _ => Err(format!(
                    "channel_from {h:?} must be \"key\", \"topic\" or \"header:<name>\""
                )),
            },
        }
    }
}

/// Checks that the brokers answer and every topic exists.
pub async fn check(brokers: &str, topics: &[String]) -> Result<(), String> {
    if topics.is_empty() {
        return Err("topics: at least one topic is required".into());
    }
    let brokers = brokers.to_string();
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", "herald-check")
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| format!("kafka client: {e}"))?;
        for t in &topics {
            partitions(&consumer, t, Duration::from_secs(5))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("kafka check failed: {e}"))?
}

/// The partitions of `topic`, or why they cannot be had.
fn partitions<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, String> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("cannot reach the brokers: {e}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("topic {topic:?} does not exist"))?;
    if let Some(e) = t.error() {
        return Err(format!("topic {topic:?}: {e:?}"));
    }
    if t.partitions().is_empty() {
        return Err(format!("topic {topic:?} does not exist"));
    }
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

/// Turns librdkafka's error callbacks into the source's health.
struct Ctx {
    tenant: Arc<Tenant>,
    health: Arc<Mutex<Health>>,
}

impl ClientContext for Ctx {
    fn error(&self, error: KafkaError, reason: &str) {
        set_state(
            &self.tenant,
            &self.health,
            SourceState::Stalled,
            Some(format!("{error}: {reason}")),
        );
    }
}

impl ConsumerContext for Ctx {}

pub struct Reader {
    app: Arc<App>,
    tenant: Arc<Tenant>,
    brokers: String,
    topics: Vec<String>,
    start: KafkaStart,
    channel_from: ChannelFrom,
    health: Arc<Mutex<Health>>,
    stop: CancellationToken,
    /// When the positions were last stored.
    saved: Mutex<Instant>,
}

/// The hub's stream for a partition: the topic's index in the source's list
/// (the same on every node, which share the source config) and the partition.
pub fn stream_id(topics: &[String], topic: &str, partition: i32) -> u32 {
    let t = topics.iter().position(|x| x == topic).unwrap_or(0) as u32;
    (t << 20) | (partition.max(0) as u32 & 0xF_FFFF)
}

/// Records collected per batch before handing them to ingest.
const BATCH: usize = 512;
/// Positions are stored at most this often while records flow.
const SAVE_EVERY: Duration = Duration::from_millis(200);

struct Owned {
    topic: String,
    partition: i32,
    /// [`stream_id`] of the topic and partition.
    stream: u32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    channel: Option<String>,
    headers: Vec<(String, Vec<u8>)>,
    ts: u64,
}

impl Reader {
    pub fn new(
        app: Arc<App>,
        tenant: Arc<Tenant>,
        config: SourceConfig,
        health: Arc<Mutex<Health>>,
        stop: CancellationToken,
    ) -> Reader {
        let SourceConfig::Kafka {
            brokers,
            topics,
            start,
            channel_from,
        } = config
        else {
            unreachable!("the kafka reader is only built for kafka sources")
        };
        Reader {
            app,
            tenant,
            brokers,
            topics,
            start,
            channel_from: ChannelFrom::parse(channel_from.as_deref())
                .unwrap_or(ChannelFrom::Header("channel".into())),
            health,
            stop,
            saved: Mutex::new(Instant::now()),
        }
    }

    fn source_key(&self) -> String {
        format!("kafka:{}", self.topics.join(","))
    }

    pub async fn run(self) {
        super::keep_reading(&self.tenant, &self.health, &self.stop, "kafka", || {
            self.consume()
        })
        .await
    }

    async fn consume(&self) -> Result<(), String> {
        let ctx = Ctx {
            tenant: self.tenant.clone(),
            health: self.health.clone(),
        };
        let consumer: Arc<StreamConsumer<Ctx>> = Arc::new(
            ClientConfig::new()
                .set("bootstrap.servers", &self.brokers)
                // Required by librdkafka; never joined: partitions are assigned by hand.
                .set(
                    "group.id",
                    format!("herald-{}-{}", self.tenant.id, self.app.config.node_id),
                )
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("allow.auto.create.topics", "false")
                .set("queued.max.messages.kbytes", "16384")
                .set("fetch.wait.max.ms", "50")
                .set("reconnect.backoff.ms", "100")
                .set("reconnect.backoff.max.ms", "1000")
                .set("socket.connection.setup.timeout.ms", "2000")
                .create_with_context(ctx)
                .map_err(|e| format!("kafka client: {e}"))?,
        );
        let stored: BTreeMap<String, i64> = self
            .app
            .registry
            .cursor(
                &self.tenant.id,
                &self.app.config.node_id,
                &self.source_key(),
            )
            .await
            .map_err(|e| e.to_string())?
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        let (assignment, mut positions) = {
            let c = consumer.clone();
            let topics = self.topics.clone();
            let start = self.start;
            tokio::task::spawn_blocking(move || assign_all(&*c, &topics, start, &stored))
                .await
                .map_err(|e| e.to_string())??
        };
        consumer
            .assign(&assignment)
            .map_err(|e| format!("assigning partitions: {e}"))?;
        let mut last_progress = Instant::now();
        let mut last_check = Instant::now() - Duration::from_secs(10);
        loop {
            let mut batch: Vec<Owned> = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
            while batch.len() < BATCH {
                let msg = tokio::select! {
                    _ = self.stop.cancelled() => {
                        // Held messages go out before the positions past them are stored.
                        ingest::flush(&self.tenant);
                        let encoded = serde_json::to_string(&positions).unwrap_or_default();
                        return self.save(&encoded).await;
                    }
                    _ = tokio::time::sleep_until(deadline) => break,
                    m = consumer.recv() => m,
                };
                match msg {
                    Ok(m) => batch.push(self.own(&m)),
                    Err(e) => {
                        set_state(
                            &self.tenant,
                            &self.health,
                            SourceState::Stalled,
                            Some(e.to_string()),
                        );
                        break;
                    }
                }
                if !batch.is_empty()
                    && tokio::time::Instant::now() + Duration::from_millis(180) > deadline
                {
                    break;
                }
            }
            if !batch.is_empty() {
                set_state(&self.tenant, &self.health, SourceState::Live, None);
                self.deliver(batch, &mut positions).await?;
                last_progress = Instant::now();
            }
            if last_check.elapsed() >= Duration::from_millis(500) {
                last_check = Instant::now();
                let c = consumer.clone();
                let p = positions.clone();
                let lag = tokio::task::spawn_blocking(move || lag(&*c, &p))
                    .await
                    .map_err(|e| e.to_string())?;
                match lag {
                    Ok(lag) => {
                        self.health.lock().lag = Some(lag);
                        self.tenant.metrics.source_lag.set(lag as f64);
                        if lag > 0 && last_progress.elapsed() > super::outbox::STALL_AFTER {
                            set_state(
                                &self.tenant,
                                &self.health,
                                SourceState::Stalled,
                                Some("lagging without progress".into()),
                            );
                        } else {
                            set_state(&self.tenant, &self.health, SourceState::Live, None);
                        }
                    }
                    Err(e) => set_state(&self.tenant, &self.health, SourceState::Stalled, Some(e)),
                }
            }
        }
    }

    fn own(&self, m: &rdkafka::message::BorrowedMessage<'_>) -> Owned {
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        (
                            x.key.to_string(),
                            x.value.map(<[u8]>::to_vec).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let channel = match &self.channel_from {
            ChannelFrom::Topic => Some(m.topic().to_string()),
            ChannelFrom::Key => m
                .key()
                .and_then(|k| std::str::from_utf8(k).ok())
                .map(str::to_string),
            ChannelFrom::Header(name) => headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| String::from_utf8(v.clone()).ok()),
        };
        Owned {
            topic: m.topic().to_string(),
            partition: m.partition(),
            stream: stream_id(&self.topics, m.topic(), m.partition()),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            channel,
            headers,
            ts: m
                .timestamp()
                .to_millis()
                .map_or_else(|| now_ms() as u64, |t| t.max(0) as u64),
        }
    }

    async fn save(&self, encoded: &str) -> Result<(), String> {
        self.app
            .registry
            .put_cursor(
                &self.tenant.id,
                &self.app.config.node_id,
                &self.source_key(),
                encoded,
            )
            .await
            .map_err(|e| format!("storing positions: {e}"))?;
        *self.saved.lock() = Instant::now();
        Ok(())
    }

    /// Publishes a batch through ingest, then stores the positions past it.
    async fn deliver(
        &self,
        batch: Vec<Owned>,
        positions: &mut BTreeMap<String, i64>,
    ) -> Result<(), String> {
        for r in &batch {
            positions.insert(format!("{}:{}", r.topic, r.partition), r.offset + 1);
        }
        let n = batch.len() as u64;
        let tenant = self.tenant.clone();
        let run = move || {
            let records: Vec<SourceRecord<'_>> = batch
                .iter()
                .map(|r| SourceRecord {
                    timestamp_ms: r.ts,
                    position: Some(SourcePos {
                        stream: r.stream,
                        order: (r.offset as u64 + 1, 0),
                        number: r.offset as u64 + 1,
                    }),
                    key: r.key.as_deref(),
                    value: &r.value,
                    channel: r.channel.as_deref(),
                    headers: &r.headers,
                })
                .collect();
            ingest::ingest(&tenant, &records)
        };
        let result = ingest::run_batch(&self.tenant, run).await;
        if let Err(e) = result {
            tracing::warn!(tenant = %self.tenant.id, kind = e.kind(), records = n, "kafka batch dead-lettered");
        }
        self.tenant.metrics.source_records.increment(n);
        let encoded = serde_json::to_string(&*positions).unwrap_or_default();
        // Stored at most every SAVE_EVERY (and when the reader stops): a crash
        // re-reads at most that much (at-least-once); nothing is skipped.
        if self.saved.lock().elapsed() >= SAVE_EVERY {
            self.save(&encoded).await?;
        }
        let mut h = self.health.lock();
        h.records += n;
        h.last_record_ms = Some(now_ms() as u64);
        h.position = Some(encoded);
        Ok(())
    }
}

/// Every partition of every topic, each at its stored position or at `start`.
fn assign_all<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    topics: &[String],
    start: KafkaStart,
    stored: &BTreeMap<String, i64>,
) -> Result<(TopicPartitionList, BTreeMap<String, i64>), String> {
    let mut tpl = TopicPartitionList::new();
    let mut positions = stored.clone();
    for topic in topics {
        for p in partitions(consumer, topic, Duration::from_secs(5))? {
            let key = format!("{topic}:{p}");
            let offset = match stored.get(&key) {
                Some(&o) => Offset::Offset(o),
                None => match start {
                    KafkaStart::Latest => {
                        let (_, high) = consumer
                            .fetch_watermarks(topic, p, Duration::from_secs(5))
                            .map_err(|e| format!("watermarks of {key}: {e}"))?;
                        positions.insert(key.clone(), high);
                        Offset::Offset(high)
                    }
                    KafkaStart::Earliest => Offset::Beginning,
                    KafkaStart::Timestamp(ms) => {
                        let mut q = TopicPartitionList::new();
                        q.add_partition_offset(topic, p, Offset::Offset(ms as i64))
                            .map_err(|e| e.to_string())?;
                        let found = consumer
                            .offsets_for_times(q, Duration::from_secs(5))
                            .map_err(|e| format!("offsets for time on {key}: {e}"))?;
                        found
                            .find_partition(topic, p)
                            .map_or(Offset::End, |e| e.offset())
                    }
                },
            };
            tpl.add_partition_offset(topic, p, offset)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok((tpl, positions))
}

/// Records beyond this node's positions (high watermark minus position).
fn lag<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    positions: &BTreeMap<String, i64>,
) -> Result<u64, String> {
    let mut total = 0u64;
    for (key, &pos) in positions {
        let Some((topic, p)) = key.rsplit_once(':') else {
            continue;
        };
        let p: i32 = p.parse().unwrap_or(0);
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_millis(1000))
            .map_err(|e| format!("watermarks of {key}: {e}"))?;
        total += (high - pos).max(0) as u64;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
