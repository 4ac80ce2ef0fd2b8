//! The `kafka` source: a broadcast consumer of the tenant's topics.
//!
//! Owns: reading every partition of the tenant's topics by manual assignment
//! (no consumer group, no rebalancing: every node holds subscribers of any
//! channel, so every node reads everything), picking up partitions added to a
//! topic later, this node's positions in the registry, the tenant's librdkafka
//! options (options.rs), the record-to-channel mapping for tenants without a
//! transform, each record's position (partition → stream, offset + 1 →
//! number: a re-read record is a duplicate, and every node numbers it
//! alike), and the source's health. A connection to the brokers is read
//! (batches into ingest) and watched (watch.rs: lag probes, metadata for new
//! partitions) by two tasks, so neither waits for the other.
//!
//! Invariants: the stored positions only move past records that were
//! published, so a restart resumes without loss; a partition added later is
//! read from its beginning (partitions.rs); fetching runs only as fast as
//! ingest (librdkafka's fetch queue is bounded): Kafka is the buffer, never
//! Herald's memory; broker trouble — an error, or brokers that stop answering
//! — shows as stalled within two seconds, and as live once they answer
//! again and the reader keeps up.

use super::SourceContext;
use super::{set_state, Health, SourceConfig, SourceState};
use crate::clock::now_ms;
use crate::fanout::position::SourcePos;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::tenant::Tenant;
use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::ClientContext;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

mod brokers;
mod config;
mod options;
mod partitions;
pub mod produce;
mod topics;
mod watch;

pub use config::{ChannelFrom, KafkaStart};
pub use options::KafkaOptions;
use partitions::Partitions;
pub use topics::{check, ensure_topic};
use watch::Watch;

/// Records collected per batch before handing them to ingest.
const BATCH: usize = 512;

/// The hub's stream for a partition: the topic's index in the source's list
/// (the same on every node, which share the source config) and the partition.
pub fn stream_id(topics: &[String], topic: &str, partition: i32) -> u32 {
    let t = topics.iter().position(|x| x == topic).unwrap_or(0) as u32;
    (t << 20) | (partition.max(0) as u32 & 0xF_FFFF)
}
/// A batch gathers records for this long at most…
const BATCH_WINDOW: Duration = Duration::from_millis(200);
/// …and for this long once it holds one.
const BATCH_LINGER: Duration = Duration::from_millis(20);
/// Positions are stored at most this often while records flow.
const SAVE_EVERY: Duration = Duration::from_millis(200);
/// How often the brokers are asked for their latest offsets: the lag, and
/// whether they answer at all.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Brokers that do not answer a probe (or a metadata request) in this long
/// stall the source. PROBE_EVERY + PROBE_TIMEOUT stays under the two seconds
/// the README promises for a broker that goes silent without an error.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the topics' metadata is read again for partitions added since.
const DISCOVER_EVERY: Duration = Duration::from_secs(3);
/// Timeout of each broker call while connecting and checking.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Settings Herald chooses that a tenant's options may change: fetch
/// latency, and reconnecting quickly enough to turn live again within a
/// second of the brokers' return.
const TUNING: &[(&str, &str)] = &[
    ("fetch.wait.max.ms", "50"),
    ("reconnect.backoff.ms", "100"),
    ("reconnect.backoff.max.ms", "1000"),
    ("socket.connection.setup.timeout.ms", "2000"),
];

/// A client of `brokers`: Herald's tuning, the tenant's options over it,
/// then what Herald owns (which `KafkaOptions::check` keeps out of `options`).
fn client_config(brokers: &str, options: &KafkaOptions) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in TUNING {
        c.set(*k, *v);
    }
    for (k, v) in options.iter() {
        c.set(k, v);
    }
    c.set("bootstrap.servers", brokers)
        .set("allow.auto.create.topics", "false");
    c
}

/// The reader's client: what Herald owns in a reader over `client_config`.
fn reader_config(brokers: &str, options: &KafkaOptions, group: &str) -> ClientConfig {
    let mut config = client_config(brokers, options);
    config
        // Required by librdkafka; never joined: partitions are assigned by hand.
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // A position that falls out of the brokers' range while reading is
        // an error, never a silent jump (to the earliest record held, past
        // records this node never read, or back before records it did):
        // the reader starts over from its stored positions, where `connect`
        // reports what retention deleted unread (`Hub::skip_to`).
        .set("auto.offset.reset", "error")
        .set("queued.max.messages.kbytes", "16384");
    config
}

/// librdkafka's reason a client could not be made, without the value that
/// the Rust binding appends to it (it may be a secret).
fn client_error(e: KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, desc, key, value)
            if options::is_secret(&key) && !value.is_empty() =>
        {
            format!("kafka client: {}", desc.replace(&value, options::REDACTED))
        }
        KafkaError::ClientConfig(_, desc, _, _) => format!("kafka client: {desc}"),
        e => format!("kafka client: {e}"),
    }
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
    ctx: Arc<SourceContext>,
    tenant: Arc<Tenant>,
    brokers: String,
    topics: Vec<String>,
    options: KafkaOptions,
    start: KafkaStart,
    channel_from: ChannelFrom,
    /// The source's `generation`: part of the positions' registry key.
    generation: u32,
    health: Arc<Mutex<Health>>,
    stop: CancellationToken,
    /// When the positions were last stored.
    saved: Mutex<Instant>,
    /// The registry key of this node's positions (`source_key`), known once
    /// connected.
    key: Mutex<String>,
}

/// One connection to the brokers, shared by reading and watching.
struct Link {
    consumer: Arc<StreamConsumer<Ctx>>,
    partitions: Arc<Mutex<Partitions>>,
    /// When a batch was last delivered.
    progress: Mutex<Instant>,
    /// Since when the brokers have held records this node has not delivered
    /// (reset by a delivery): lag without progress for STALL_AFTER stalls.
    behind_since: Mutex<Option<Instant>>,
}

/// What the reader does after a batch.
enum Next {
    More,
    /// The reader was stopped: the batch is the last.
    Stop,
    /// librdkafka stopped fetching a partition whose position the brokers
    /// no longer hold (`auto.offset.reset=error`).
    OutOfRange(String),
}

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
        ctx: Arc<SourceContext>,
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
            options,
            generation,
        } = config
        else {
            unreachable!("the kafka reader is only built for kafka sources")
        };
        Reader {
            ctx,
            tenant,
            brokers,
            topics,
            options,
            start,
            channel_from: ChannelFrom::parse(channel_from.as_deref())
                .unwrap_or(ChannelFrom::Header("channel".into())),
            generation,
            health,
            stop,
            saved: Mutex::new(Instant::now()),
            key: Mutex::new(String::new()),
        }
    }

    /// Where this node's positions were kept by Herald versions that named
    /// them by the topic list (a topic added lost them all).
    fn legacy_key(&self) -> String {
        format!(
            "kafka:{}{}",
            self.topics.join(","),
            super::generation_suffix(self.generation)
        )
    }

    /// The registry key of this node's positions: the Kafka cluster (its id,
    /// as the brokers report it), so that another cluster with the same topic
    /// names never lends its offsets, and adding a topic keeps the others'.
    /// Brokers that report no id: the topic list, as before.
    fn source_key(&self) -> String {
        let key = self.key.lock().clone();
        if key.is_empty() {
            self.legacy_key()
        } else {
            key
        }
    }

    pub async fn run(self) {
        super::keep_reading(&self.tenant, &self.health, &self.stop, "kafka", || {
            self.consume()
        })
        .await
    }

    /// One connection: reads until stopped (storing the positions) or until
    /// reading fails; the watch runs beside it and is aborted with it.
    async fn consume(&self) -> Result<(), String> {
        let link = Arc::new(self.connect().await?);
        let watch = Watch {
            tenant: self.tenant.clone(),
            health: self.health.clone(),
            topics: self.topics.clone(),
            start: self.start,
            link: link.clone(),
        };
        let _watching = AbortOnDropHandle::new(tokio::spawn(watch.run()));
        self.read(&link).await
    }

    /// A consumer with every partition assigned at its stored position (or
    /// where `start` says), the positions stored at once: from then on a
    /// partition without a stored position is known to be new.
    async fn connect(&self) -> Result<Link, String> {
        // Checked on every start, not only when the source was set: a source
        // stored by an older Herald stalls with the reason, unstarted.
        self.options.check()?;
        let group = format!("herald-{}-{}", self.tenant.id, self.ctx.cursors.node());
        let ctx = Ctx {
            tenant: self.tenant.clone(),
            health: self.health.clone(),
        };
        let consumer: Arc<StreamConsumer<Ctx>> = Arc::new(
            reader_config(&self.brokers, &self.options, &group)
                .create_with_context(ctx)
                .map_err(client_error)?,
        );
        let c = consumer.clone();
        let cluster =
            tokio::task::spawn_blocking(move || c.client().fetch_cluster_id(CONNECT_TIMEOUT))
                .await
                .map_err(|e| e.to_string())?;
        let key = match cluster {
            Some(id) => format!(
                "kafka-cluster:{id}{}",
                super::generation_suffix(self.generation)
            ),
            None => self.legacy_key(),
        };
        *self.key.lock() = key.clone();
        let mut stored = BTreeMap::new();
        let keys = if self.generation == 0 {
            vec![key, self.legacy_key()]
        } else {
            vec![key]
        };
        for k in keys {
            stored = self
                .ctx
                .cursors
                .get(&self.tenant.id, &k)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|s| serde_json::from_str::<BTreeMap<String, i64>>(&s).ok())
                .unwrap_or_default();
            if !stored.is_empty() {
                break;
            }
        }
        // Without stored positions a reader that starts at `latest` or a
        // timestamp begins past records it never read.
        let skipped = stored.is_empty() && !matches!(self.start, KafkaStart::Earliest);
        let partitions = Arc::new(Mutex::new(Partitions::new(stored)));
        let (c, p, topics, start) = (
            consumer.clone(),
            partitions.clone(),
            self.topics.clone(),
            self.start,
        );
        tokio::task::spawn_blocking(move || {
            let found = brokers::find(&*c, &topics, CONNECT_TIMEOUT)?;
            brokers::assign_new(&*c, &p, &found, start, CONNECT_TIMEOUT)
        })
        .await
        .map_err(|e| e.to_string())??;
        let (encoded, count, next) = {
            let p = partitions.lock();
            let next = p.positions().iter().map(|(_, _, n)| *n).max();
            (p.encoded(), p.count(), next)
        };
        self.save(&encoded).await?;
        // Where this node's knowledge starts (ARCHITECTURE.md, "Positions"):
        // the record before each partition's next offset has number = that
        // offset; everything up to it was read by an earlier process or lies
        // before where this node began.
        self.tenant
            .hub
            .reading_from(next.unwrap_or(0).max(0) as u64, count, skipped);
        let lost = partitions.lock().take_skipped();
        for (topic, partition, earliest) in lost {
            tracing::warn!(tenant = %self.tenant.id, %topic, partition, earliest, "the stored position had fallen out of the topic's retention; subscribers are told of the gap");
            self.tenant.hub.skip_to(
                stream_id(&self.topics, &topic, partition),
                earliest.max(0) as u64,
            );
        }
        {
            let mut h = self.health.lock();
            h.partitions = Some(count);
            h.position = Some(encoded);
        }
        Ok(Link {
            consumer,
            partitions,
            progress: Mutex::new(Instant::now()),
            behind_since: Mutex::new(None),
        })
    }

    /// Batches records into ingest until the reader stops.
    async fn read(&self, link: &Link) -> Result<(), String> {
        loop {
            let (batch, next) = self.collect(&link.consumer).await;
            if !batch.is_empty() {
                self.deliver(batch, link).await?;
            }
            match next {
                Next::More => {}
                Next::Stop => {
                    // Held messages go out before the positions past them are stored.
                    ingest::flush(&self.tenant);
                    let encoded = link.partitions.lock().encoded();
                    return self.save(&encoded).await;
                }
                Next::OutOfRange(e) => {
                    // What was delivered is stored; the next connection
                    // starts there and reports what the brokers no longer hold.
                    self.save(&self.held_back(link)).await?;
                    return Err(format!(
                        "a partition's position is out of the brokers' range ({e}); reading again from the stored positions"
                    ));
                }
            }
        }
    }

    /// Up to BATCH records, gathered for BATCH_WINDOW at most and for
    /// BATCH_LINGER once one arrived, and what comes after them.
    async fn collect(&self, consumer: &StreamConsumer<Ctx>) -> (Vec<Owned>, Next) {
        let opened = tokio::time::Instant::now();
        let mut batch = Vec::new();
        while batch.len() < BATCH {
            let msg = tokio::select! {
                // Unstored records are read again by whoever reads next.
                _ = self.stop.cancelled() => return (Vec::new(), Next::Stop),
                _ = tokio::time::sleep_until(opened + BATCH_WINDOW) => break,
                m = consumer.recv() => m,
            };
            match msg {
                Ok(m) => batch.push(self.own(&m)),
                Err(e @ KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)) => {
                    return (batch, Next::OutOfRange(e.to_string()));
                }
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
            if opened.elapsed() > BATCH_LINGER {
                break;
            }
        }
        (batch, Next::More)
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

    /// The positions to store: each partition's, or the offset of the lowest
    /// record a conflation window still holds from it, so a crash re-reads
    /// that record rather than losing it.
    fn held_back(&self, link: &Link) -> String {
        let lowest = self.tenant.conflator.lock().lowest_held();
        let p = link.partitions.lock();
        if lowest.is_empty() {
            return p.encoded();
        }
        p.encoded_capped(|topic, partition| {
            let stream = stream_id(&self.topics, topic, partition);
            // order is offset + 1: store the held record's own offset.
            lowest
                .iter()
                .find(|(s, _)| *s == stream)
                .map(|&(_, (order, _))| order as i64 - 1)
        })
    }

    async fn save(&self, encoded: &str) -> Result<(), String> {
        self.ctx
            .cursors
            .put(&self.tenant.id, &self.source_key(), encoded)
            .await
            .map_err(|e| format!("storing positions: {e}"))?;
        *self.saved.lock() = Instant::now();
        Ok(())
    }

    /// Publishes a batch through ingest, then stores the positions past it.
    async fn deliver(&self, batch: Vec<Owned>, link: &Link) -> Result<(), String> {
        {
            let mut p = link.partitions.lock();
            for r in &batch {
                p.delivered(&r.topic, r.partition, r.offset);
            }
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
        let result = ingest::run_batch(
            &self.tenant,
            crate::plugin::active::Patience::Unbounded,
            run,
        )
        .await;
        // Without its plugin the tenant takes nothing: the reader stalls and
        // reads these records again from the stored positions once it is back.
        if let Err(e @ crate::plugin::PluginError::Unavailable(_)) = &result {
            return Err(e.to_string());
        }
        if let Err(e) = result {
            tracing::warn!(tenant = %self.tenant.id, kind = e.kind(), records = n, "kafka batch dead-lettered");
        }
        *link.progress.lock() = Instant::now();
        self.tenant.metrics.source_records.increment(n);
        let encoded = link.partitions.lock().encoded();
        // Stored at most every SAVE_EVERY (and when the reader stops): a crash
        // re-reads at most that much (at-least-once); nothing is skipped.
        if self.saved.lock().elapsed() >= SAVE_EVERY {
            self.save(&self.held_back(link)).await?;
        }
        let mut h = self.health.lock();
        h.records += n;
        h.last_record_ms = Some(now_ms() as u64);
        h.position = Some(encoded);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
