//! The publish service: what an HTTP publish (or the demo's publisher) does
//! with a body whose key was accepted, whatever the tenant's source — into
//! the fan-out on a node of its own, into the shared log in cluster mode,
//! into the topic of a Kafka tenant.
//!
//! Invariant: the whole batch is validated (channel names, payload sizes,
//! conflation keys, rate) before any message is published; an answer names
//! each message's position, or says it is held in the conflation window.

use crate::clock::now_ms;
use crate::fanout::deliver::Fate;
use crate::fanout::position::MESSAGES_PER_RECORD;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::plugin::PluginError;
use crate::proto;
use crate::registry::log::{self, Publication, SharedLog};
use crate::registry::Registry;
use crate::source::kafka::produce::{ProduceError, Publisher};
use crate::source::Sources;
use crate::tenant::Tenant;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::Duration;

/// Why a publish was refused; nothing of the batch was published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{0}")]
    Bad(String),
    /// The tenant's messages come from another source.
    #[error("tenant {0:?} reads from its {1} source; write into that source (an HTTP publish would take positions the source cannot agree with), or set the source to http or kafka")]
    SourceNotHttp(String, &'static str),
    #[error("rate limit exceeded")]
    RateLimited(Duration),
    #[error("the tenant's plugin (version {0}) is not loaded on this node; nothing was published, retry")]
    PluginUnavailable(i64),
    #[error("the tenant's plugin (version {0}) is still loading on this node; nothing was published, retry shortly")]
    PluginLoading(i64),
    #[error("the tenant's plugin is busy; nothing was published, retry")]
    PluginBusy,
    /// An Idempotency-Key in flight, or used for a batch of another length.
    #[error("{0}")]
    Conflict(String),
    /// The shared log or the Kafka topic did not confirm the write.
    #[error("the {0} did not confirm the write; retry (a record not confirmed may still be delivered once)")]
    SourceUnavailable(&'static str, String),
    #[error("transform failed ({0}); the batch was dead-lettered: {1}")]
    TransformFailed(&'static str, String),
}

/// What a publish did: one result per item (its channel and `seq`, or
/// `held`, `duplicate`, where the source placed it).
pub struct Published {
    pub results: Vec<serde_json::Value>,
    /// The body was an array: the answer is `{"results": [...]}` even for one.
    pub batch: bool,
}

impl Published {
    /// The answer's JSON body.
    pub fn body(mut self) -> serde_json::Value {
        if self.batch || self.results.len() != 1 {
            serde_json::json!({ "results": self.results })
        } else {
            self.results.pop().unwrap_or_default()
        }
    }
}

/// Parses a JSON body, naming the field at fault (the API's bodies too).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ItemsError> {
    serde_json::from_slice(body).map_err(|e| ItemsError::Bad(format!("invalid body: {e}")))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishItem {
    /// The channel (`[A-Za-z0-9_.:@-]{1,128}`); may be left out when the
    /// tenant's transform picks the channel.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.:@-]{1,128}$")]
    ch: Option<String>,
    /// Any JSON value; delivered as written.
    #[schema(value_type = Object)]
    data: Box<RawValue>,
    /// Conflation key, 1-128 bytes.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128)]
    key: Option<String>,
}

/// Why a publish body was refused (the message names the item and field).
#[derive(Debug, thiserror::Error)]
pub enum ItemsError {
    #[error("{0}")]
    Bad(String),
    #[error("{0}")]
    TooBig(String),
}

/// Parses and checks a publish body: one message object or a non-empty
/// array of them, each with a valid channel (or none, when
/// `channel_required` is false: the tenant's transform picks it), a payload
/// within `max_message_bytes` and a key of 1-128 bytes. Returns the items
/// and whether the body was a batch. Pure: fuzzed in `crate::fuzz`.
pub fn read_items(
    body: &[u8],
    max_message_bytes: usize,
    channel_required: bool,
) -> Result<(Vec<PublishItem>, bool), ItemsError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let (items, batch) = match first {
        Some(b'[') => (parse_json::<Vec<PublishItem>>(body)?, true),
        Some(b'{') => (vec![parse_json::<PublishItem>(body)?], false),
        _ => {
            return Err(ItemsError::Bad(
                "body must be a JSON object or an array of objects".into(),
            ))
        }
    };
    if items.is_empty() {
        return Err(ItemsError::Bad("batch is empty".into()));
    }
    for (i, item) in items.iter().enumerate() {
        let at = if batch {
            format!("[{i}].")
        } else {
            String::new()
        };
        match &item.ch {
            Some(ch) => {
                proto::validate_channel(ch).map_err(|e| ItemsError::Bad(format!("{at}ch: {e}")))?
            }
            None if channel_required => {
                return Err(ItemsError::Bad(format!(
                    "{at}ch: required (the tenant has no transform to pick a channel)"
                )))
            }
            None => {}
        }
        let size = item.data.get().len();
        if size > max_message_bytes {
            return Err(ItemsError::TooBig(format!(
                "{at}data: {size} bytes exceeds the limit of {max_message_bytes} bytes"
            )));
        }
        if let Some(k) = &item.key {
            if k.is_empty() || k.len() > 128 {
                return Err(ItemsError::Bad(format!("{at}key: must be 1-128 bytes")));
            }
        }
    }
    Ok((items, batch))
}

/// Publishes a body whose key was accepted: the one path of HTTP publish
/// (and of the demo's built-in publisher), whatever the tenant's source.
pub async fn publish(
    sources: &Sources,
    receipts: &Registry,
    tenant: &Arc<Tenant>,
    body: &[u8],
    key: Option<&str>,
) -> Result<Published, PublishError> {
    if let Some(version) = tenant.plugin_unavailable() {
        if tenant.plugin_loading() {
            tenant.metrics.publish_rejected("plugin_loading");
            return Err(PublishError::PluginLoading(version));
        }
        tenant.metrics.publish_rejected("plugin_unavailable");
        return Err(PublishError::PluginUnavailable(version));
    }
    // Positions come from one source per tenant: a publish beside an outbox
    // would move channels ahead of rows still to come; into Kafka it goes
    // through the topic.
    let (source, kafka) = sources.publish_route(&tenant.id);
    if source != "http" && kafka.is_none() {
        tenant.metrics.publish_rejected("source_not_http");
        return Err(PublishError::SourceNotHttp(tenant.id.to_string(), source));
    }
    let transform = tenant.plugin().is_some_and(|p| p.info.hooks.transform);
    let (items, batch) = read_items(body, tenant.settings().limits.max_message_bytes, !transform)
        .inspect_err(|e| {
            if matches!(e, ItemsError::TooBig(_)) {
                tenant.metrics.publish_rejected("too_big");
            }
        })
        .map_err(|e| PublishError::Bad(e.to_string()))?;
    if let Err(wait) = tenant.take_publish_tokens(items.len() as u32) {
        tenant.metrics.publish_rejected("rate_limited");
        return Err(PublishError::RateLimited(wait));
    }
    if let Some(kafka) = kafka {
        return produced(receipts, &kafka, tenant, &items, batch, key).await;
    }
    if let Some(log) = &sources.ctx.log {
        return logged(log, tenant, &items, batch, key).await;
    }
    let now = now_ms() as u64;
    // The publisher is heard: a source stalled by its silence is live
    // again, told before the message it brings.
    crate::source::http_published(sources, tenant, items.len());
    let run = {
        let tenant = tenant.clone();
        move || {
            let records: Vec<SourceRecord<'_>> = items
                .iter()
                .map(|i| SourceRecord {
                    timestamp_ms: now,
                    position: None,
                    key: i.key.as_deref().map(str::as_bytes),
                    value: i.data.get().as_bytes(),
                    channel: i.ch.as_deref(),
                    headers: &[],
                })
                .collect();
            ingest::ingest(&tenant, &records)
        }
    };
    // Where plugin work runs, and when a batch may be retried: ingest::run_batch.
    let outcomes = ingest::run_batch(tenant, crate::plugin::active::Patience::Bounded, run)
        .await
        .map_err(|e| match e {
            PluginError::Busy(_) => {
                tenant.metrics.publish_rejected("plugin_busy");
                PublishError::PluginBusy
            }
            e => PublishError::TransformFailed(e.kind(), e.to_string()),
        })?;
    let results: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| match o.fate {
            Fate::Published { seq, delivered } => {
                serde_json::json!({"ch": o.channel, "seq": seq, "delivered": delivered})
            }
            Fate::Held => serde_json::json!({"ch": o.channel, "seq": null, "held": true}),
            // HTTP publishes carry no source position; kept for completeness.
            Fate::Duplicate => serde_json::json!({"ch": o.channel, "seq": null, "duplicate": true}),
        })
        .collect();
    Ok(Published { results, batch })
}

/// How long a publish on a Kafka tenant waits for this node's reader to know
/// where it starts (a source just set, a node starting).
const READER_START_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A Kafka tenant: the batch is produced into its topic, answered once the
/// brokers acknowledged every record; every node delivers it from there at
/// offset + 1.
async fn produced(
    receipts: &Registry,
    kafka: &Publisher,
    tenant: &Tenant,
    items: &[PublishItem],
    batch: bool,
    key: Option<&str>,
) -> Result<Published, PublishError> {
    // Not before this node's reader knows where it starts: a record produced
    // earlier could fall before a `latest` it resolves later, and reach no
    // subscriber here.
    let deadline = tokio::time::Instant::now() + READER_START_WAIT;
    while !tenant.hub.started() {
        if tokio::time::Instant::now() >= deadline {
            return Err(PublishError::SourceUnavailable(
                "Kafka topic",
                "this node's reader has not started yet; try again".into(),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let written = match key {
        None => kafka
            .publish(&outgoing(items))
            .await
            .map_err(produce_error)?,
        Some(key) => produced_once(receipts, kafka, tenant, items, key).await?,
    };
    let placed = written.iter().map(|w| {
        let at = serde_json::json!({"partition": w.partition, "offset": w.offset});
        (w.offset as u64 + 1, at)
    });
    Ok(Published {
        results: positioned(tenant, items, placed),
        batch,
    })
}

fn produce_error(e: ProduceError) -> PublishError {
    match e {
        ProduceError::Bad(m) => PublishError::Bad(m),
        ProduceError::Unavailable(m) => PublishError::SourceUnavailable("Kafka topic", m),
    }
}

/// How long a keyed publish holds its key: past the producer's delivery
/// timeout, so an attempt still waiting for the brokers is never joined by
/// its retry; a process that died holding a key frees it after this.
const RECEIPT_HOLD_MS: i64 = 30_000;
/// How long a key is remembered: a retry comes within a day.
const RECEIPT_KEEP_MS: i64 = 24 * 3600 * 1000;

/// A keyed batch into a Kafka tenant's topic: only the items that no
/// earlier attempt under `key` got acknowledged are produced, and what the
/// brokers acknowledged is recorded before answering, so a retry after a
/// lost answer or a `503` writes nothing twice. A record acknowledged in the
/// instant the process died is not in the receipt and would be written
/// again (the brokers' idempotence does not span producers).
async fn produced_once(
    registry: &Registry,
    kafka: &Publisher,
    tenant: &Tenant,
    items: &[PublishItem],
    key: &str,
) -> Result<Vec<crate::source::kafka::produce::Written>, PublishError> {
    use crate::registry::Claim;
    use crate::source::kafka::produce::Written;
    let out = outgoing(items);
    // Nothing is claimed for a batch that cannot be produced.
    kafka.check(&out).map_err(produce_error)?;
    let empty = serde_json::to_string(&vec![None::<Written>; items.len()]).unwrap_or_default();
    let unavailable = |e: crate::registry::RegistryError| {
        PublishError::SourceUnavailable("Kafka topic", format!("Idempotency-Key: {e}"))
    };
    let claimed = registry
        .claim_receipt(&tenant.id, key, &empty, RECEIPT_HOLD_MS, RECEIPT_KEEP_MS)
        .await
        .map_err(unavailable)?;
    let stored = match claimed {
        Claim::InFlight => {
            return Err(PublishError::Conflict(
                "a publish under this Idempotency-Key is still in flight; try again".into(),
            ))
        }
        Claim::Ours(stored) => stored,
    };
    let mut slots: Vec<Option<Written>> = stored
        .as_deref()
        .map_or(Ok(vec![None; items.len()]), serde_json::from_str)
        .unwrap_or_default();
    if slots.len() != items.len() {
        let before = stored.unwrap_or_default();
        let _ = registry.settle_receipt(&tenant.id, key, &before).await;
        return Err(PublishError::Conflict(format!(
            "this Idempotency-Key was used for a batch of {} messages",
            slots.len()
        )));
    }
    let missing: Vec<usize> = (0..items.len()).filter(|&i| slots[i].is_none()).collect();
    let produced = if missing.is_empty() {
        Ok(Vec::new())
    } else {
        kafka.produce(&out, &missing).await
    };
    let mut failed = Vec::new();
    if let Ok(each) = &produced {
        for (&i, r) in missing.iter().zip(each) {
            match r {
                Ok(w) => slots[i] = Some(*w),
                Err(e) => failed.push(format!("[{i}]: {e}")),
            }
        }
    }
    let receipt = serde_json::to_string(&slots).unwrap_or_default();
    registry
        .settle_receipt(&tenant.id, key, &receipt)
        .await
        .map_err(unavailable)?;
    produced.map_err(produce_error)?;
    if !failed.is_empty() {
        return Err(PublishError::SourceUnavailable(
            "Kafka topic",
            format!(
                "{} of {} records not acknowledged by the brokers ({}); the others were: send the batch again under the same Idempotency-Key to write only these",
                failed.len(),
                items.len(),
                failed.join("; ")
            ),
        ));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// Cluster mode: the batch goes into the shared log, answered once it is
/// committed there; every node (this one too) delivers it from the log at
/// its row id.
async fn logged(
    log: &SharedLog,
    tenant: &Tenant,
    items: &[PublishItem],
    batch: bool,
    key: Option<&str>,
) -> Result<Published, PublishError> {
    let ids = log
        .append(&tenant.id, &outgoing(items), key)
        .await
        .map_err(|e| match e {
            log::AppendError::KeyReused(_) => PublishError::Conflict(e.to_string()),
            log::AppendError::Db(e) => {
                PublishError::SourceUnavailable("publish log", e.to_string())
            }
        })?;
    let placed = ids.iter().map(|&id| {
        (
            id as u64,
            serde_json::json!({"position": id, "logged": true}),
        )
    });
    Ok(Published {
        results: positioned(tenant, items, placed),
        batch,
    })
}

fn outgoing(items: &[PublishItem]) -> Vec<Publication<'_>> {
    items
        .iter()
        .map(|i| Publication {
            channel: i.ch.as_deref(),
            key: i.key.as_deref(),
            payload: i.data.get().as_bytes(),
        })
        .collect()
}

/// The answer for items placed in a source at (number, where): each record's
/// message is published at number × 1000 on every node, unless the tenant's
/// transform makes other messages of it (then `seq` is null).
fn positioned(
    tenant: &Tenant,
    items: &[PublishItem],
    placed: impl Iterator<Item = (u64, serde_json::Value)>,
) -> Vec<serde_json::Value> {
    let transform = tenant.plugin().is_some_and(|p| p.info.hooks.transform);
    items
        .iter()
        .zip(placed)
        .map(|(i, (number, mut at))| {
            at["ch"] = serde_json::json!(i.ch);
            at["seq"] = serde_json::json!((!transform).then(|| number * MESSAGES_PER_RECORD));
            at
        })
        .collect()
}
