//! HTTP publish into a Kafka tenant's topic (ARCHITECTURE.md, "Positions"): the
//! message lands in the source every node reads, and reaches subscribers
//! only through the consumer, at the record's position — the same `seq` on
//! every node, the receiving one included.
//!
//! Owns: the tenant's producer (made on first use; idempotent, `acks=all`),
//! how a publish item becomes a record (its channel where the source reads
//! channels from: a header, the key or the topic), and waiting for the
//! brokers' acknowledgement. Invariants: a publish is answered only after
//! every record of it was acknowledged (or says which were not); every
//! record that names its channel goes to that channel's partition (a stable
//! hash of the name over the topic's partitions), so one channel's messages
//! keep one order and one chain of positions on every node, whatever their
//! conflation keys. Never: delivers anything itself.

use super::{client_error, options::KafkaOptions, ChannelFrom, TUNING};
use crate::registry::log::Publication;
use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a record may wait for the brokers before its publish fails.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the brokers stored a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Written {
    pub topic_index: usize,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The item cannot be expressed in this source (answered 400).
    #[error("{0}")]
    Bad(String),
    /// The brokers did not acknowledge (answered 503).
    #[error("{0}")]
    Unavailable(String),
}

/// A Kafka tenant's way in.
pub struct Publisher {
    brokers: String,
    topics: Vec<String>,
    options: KafkaOptions,
    channel_from: ChannelFrom,
    producer: OnceLock<Result<FutureProducer, String>>,
    /// Partitions per topic (by index), read from the brokers on first use.
    partitions: Mutex<HashMap<usize, i32>>,
}

/// The partition of `channel` among `count`: FNV-1a of the name, stable
/// across nodes, versions and restarts.
fn partition_for(channel: &str, count: i32) -> i32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in channel.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % count.max(1) as u64) as i32
}

impl Publisher {
    pub fn new(
        brokers: &str,
        topics: &[String],
        options: &KafkaOptions,
        channel_from: Option<&str>,
    ) -> Publisher {
        Publisher {
            brokers: brokers.to_string(),
            topics: topics.to_vec(),
            options: options.clone(),
            channel_from: ChannelFrom::parse(channel_from)
                .unwrap_or(ChannelFrom::Header("channel".into())),
            producer: OnceLock::new(),
            partitions: Mutex::new(HashMap::new()),
        }
    }

    /// How many partitions topic `index` has (asked once, then remembered).
    async fn partition_count(
        &self,
        producer: &FutureProducer,
        index: usize,
    ) -> Result<i32, ProduceError> {
        if let Some(&n) = self.partitions.lock().get(&index) {
            return Ok(n);
        }
        let (p, topic) = (producer.clone(), self.topics[index].clone());
        let n = tokio::task::spawn_blocking(move || {
            let md = p
                .client()
                .fetch_metadata(Some(&topic), DELIVERY_TIMEOUT)
                .map_err(|e| format!("kafka metadata of {topic}: {e}"))?;
            md.topics()
                .first()
                .map(|t| t.partitions().len() as i32)
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("kafka topic {topic} has no partitions"))
        })
        .await
        .map_err(|e| ProduceError::Unavailable(e.to_string()))?
        .map_err(ProduceError::Unavailable)?;
        self.partitions.lock().insert(index, n);
        Ok(n)
    }

    fn producer(&self) -> Result<&FutureProducer, ProduceError> {
        self.producer
            .get_or_init(|| {
                // Checked again here: a source stored by an older Herald.
                self.options.check()?;
                let mut c = ClientConfig::new();
                for (k, v) in TUNING.iter().filter(|(k, _)| !k.starts_with("fetch.")) {
                    c.set(*k, *v);
                }
                for (k, v) in self.options.iter() {
                    c.set(k, v);
                }
                c.set("bootstrap.servers", &self.brokers)
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("linger.ms", "1")
                    .set(
                        "message.timeout.ms",
                        DELIVERY_TIMEOUT.as_millis().to_string(),
                    );
                c.create().map_err(client_error)
            })
            .as_ref()
            .map_err(|e| ProduceError::Unavailable(e.clone()))
    }

    /// The topic an item goes to, and whether this source can carry it.
    fn topic_of(&self, item: &Publication<'_>) -> Result<usize, ProduceError> {
        match &self.channel_from {
            ChannelFrom::Topic if item.channel.is_none() && self.topics.len() == 1 => Ok(0),
            ChannelFrom::Topic => self
                .topics
                .iter()
                .position(|t| Some(t.as_str()) == item.channel)
                .ok_or_else(|| {
                    ProduceError::Bad(format!(
                        "ch: this tenant's channels are its topics ({}); {:?} is not one",
                        self.topics.join(", "),
                        item.channel
                    ))
                }),
            ChannelFrom::Key if item.key.is_some() => Err(ProduceError::Bad(
                "key: this tenant's channel is the Kafka key; a publish cannot set another".into(),
            )),
            _ => Ok(0),
        }
    }

    /// Checks every item before anything is produced.
    pub fn check(&self, items: &[Publication<'_>]) -> Result<(), ProduceError> {
        items.iter().try_for_each(|i| self.topic_of(i).map(drop))
    }

    /// Produces every item and waits for the brokers; the positions in order.
    pub async fn publish(&self, items: &[Publication<'_>]) -> Result<Vec<Written>, ProduceError> {
        let all: Vec<usize> = (0..items.len()).collect();
        let each = self.produce(items, &all).await?;
        let failed: Vec<String> = each
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("[{i}]: {e}")))
            .collect();
        if !failed.is_empty() {
            return Err(ProduceError::Unavailable(format!(
                "{} of {} records not acknowledged by the brokers ({}); the others were",
                failed.len(),
                items.len(),
                failed.join("; ")
            )));
        }
        Ok(each.into_iter().flatten().collect())
    }

    /// Produces the items of `items` at the indexes `which` (all of them
    /// checked first) and waits for the brokers: for each, in `which`'s
    /// order, where it was stored or why it was not acknowledged.
    pub async fn produce(
        &self,
        items: &[Publication<'_>],
        which: &[usize],
    ) -> Result<Vec<Result<Written, String>>, ProduceError> {
        self.check(items)?;
        let producer = self.producer()?;
        let mut pending = Vec::with_capacity(which.len());
        for item in which.iter().map(|&i| &items[i]) {
            let topic_index = self.topic_of(item)?;
            let topic = &self.topics[topic_index];
            let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(item.payload);
            // The channel's partition: its messages in one order, whatever
            // their keys (the conflation key only travels as the key).
            let channel = match &self.channel_from {
                ChannelFrom::Topic => item.channel.or(Some(topic.as_str())),
                _ => item.channel,
            };
            if let Some(ch) = channel {
                let count = self.partition_count(producer, topic_index).await?;
                record = record.partition(partition_for(ch, count));
            }
            let key = match &self.channel_from {
                ChannelFrom::Key => item.channel.map(str::as_bytes),
                _ => item.key.map(str::as_bytes),
            };
            if let Some(k) = key {
                record = record.key(k);
            }
            if let (ChannelFrom::Header(name), Some(ch)) = (&self.channel_from, item.channel) {
                record = record.headers(OwnedHeaders::new().insert(Header {
                    key: name,
                    value: Some(ch.as_bytes()),
                }));
            }
            // A record the producer refused to queue is that record's
            // failure: the ones queued before it may still be written.
            let delivery = producer
                .send_result(record)
                .map_err(|(e, _)| format!("kafka: {e}"));
            pending.push((topic_index, delivery));
        }
        let mut each = Vec::with_capacity(pending.len());
        for (topic_index, delivery) in pending {
            let delivery = match delivery {
                Ok(d) => d,
                Err(e) => {
                    each.push(Err(e));
                    continue;
                }
            };
            each.push(match delivery.await {
                Ok(Ok(d)) => Ok(Written {
                    topic_index,
                    partition: d.partition,
                    offset: d.offset,
                }),
                Ok(Err((e, _))) => Err(e.to_string()),
                Err(_) => Err("the producer went away".to_string()),
            });
        }
        Ok(each)
    }
}
