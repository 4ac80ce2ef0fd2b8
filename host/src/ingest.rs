//! Ingest: records from a tenant's source become published messages.
//!
//! Owns: the one path every source takes (HTTP publish today): the tenant's
//! `transform` once per batch (never per subscriber), grouping a record's
//! per-audience outputs under one position, holding keyed messages for the
//! conflation window, and publishing. Invariants: a failed transform drops
//! the whole batch into the counted dead-letter path and publishes nothing of
//! it; a batch's held messages enter the window under one lock, so one
//! window never splits a batch.

use crate::fanout::conflate::{Held, HeldVariant, Offer};
use crate::fanout::{HistoryLimits, Variant};
use crate::plugin::active::ActivePlugin;
use crate::plugin::batch::{Outputs, SourceRecord};
use crate::plugin::PluginError;
use crate::proto::PayloadKind;
use crate::registry::now_ms;
use crate::tenant::Tenant;

/// What happened to one message of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub channel: String,
    /// The position given, or `None` while the message waits in a conflation window.
    pub seq: Option<u64>,
    pub delivered: usize,
}

/// A message ready to publish: one position, one or more audience variants,
/// borrowed from the source records or the plugin's output buffer.
struct Message<'a> {
    channel: &'a str,
    key: Option<&'a str>,
    variants: Vec<Variant<'a>>,
    /// The source position (outbox id); `None` for sources without one.
    position: Option<u64>,
}

fn position(r: &SourceRecord<'_>) -> Option<u64> {
    r.position.map(|p| p.number)
}

fn kind_of(payload: &[u8]) -> PayloadKind {
    if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        PayloadKind::Json
    } else {
        PayloadKind::Binary
    }
}

/// Consecutive outputs of one record to one channel are variants of one message.
fn group<'a>(outputs: &'a Outputs, records: &[SourceRecord<'_>]) -> Vec<Message<'a>> {
    let mut out: Vec<(u32, Message<'_>)> = Vec::with_capacity(outputs.len());
    for o in outputs.iter() {
        let v = Variant {
            payload: o.payload,
            kind: kind_of(o.payload),
            audience: o.audience,
        };
        match out.last_mut() {
            Some((src, m))
                if *src == o.source
                    && m.channel == o.channel
                    && !m.variants.iter().any(|x| x.audience == v.audience) =>
            {
                m.variants.push(v)
            }
            _ => out.push((
                o.source,
                Message {
                    channel: o.channel,
                    key: o.key,
                    variants: vec![v],
                    position: records.get(o.source as usize).and_then(position),
                },
            )),
        }
    }
    out.into_iter().map(|(_, m)| m).collect()
}

fn owned(v: &Variant<'_>) -> HeldVariant {
    HeldVariant {
        audience: v.audience.map(str::to_string),
        payload: v.payload.to_vec(),
        kind: v.kind,
    }
}

/// Runs a batch through the tenant's plugin (if it transforms) and publishes it.
/// `records` must name their channel when the tenant has no transform.
pub fn ingest(tenant: &Tenant, records: &[SourceRecord<'_>]) -> Result<Vec<Outcome>, PluginError> {
    let settings = tenant.settings();
    let plugin = tenant.plugin().filter(|p| p.info.hooks.transform);
    let outputs = match &plugin {
        Some(p) => match p.transform(records, settings.limits.max_message_bytes) {
            Ok(t) => {
                // Records whose outputs broke the contract fail alone.
                if let Some(first) = t.refused.first() {
                    tenant
                        .metrics
                        .dead_letter("bad_output", t.refused.len() as u64);
                    let position = records.get(first.source as usize).and_then(|r| r.position);
                    tracing::warn!(tenant = %tenant.id, version = p.version, records = t.refused.len(), first = first.source, ?position, reason = %first.reason, "transform output broke the contract; those records dead-lettered");
                }
                Some(t.outputs)
            }
            Err(e) => {
                tenant.metrics.dead_letter(e.kind(), records.len() as u64);
                tracing::warn!(tenant = %tenant.id, version = p.version, kind = e.kind(), error = %e, records = records.len(), "transform failed; batch dead-lettered");
                return Err(e);
            }
        },
        None => None,
    };
    let messages = match &outputs {
        Some(o) => group(o, records),
        None => records
            .iter()
            .filter_map(|r| {
                // Sources other than HTTP publish deliver unchecked records: a
                // bad one is dead-lettered with its reason, the rest go on.
                let problem = match r.channel {
                    None => Some("the record names no channel and the tenant has no transform".to_string()),
                    Some(ch) => match crate::proto::validate_channel(ch) {
                        Err(e) => Some(format!("channel {ch:?}: {e}")),
                        Ok(()) if r.value.len() > settings.limits.max_message_bytes => Some(format!(
                            "payload of {} bytes exceeds {}",
                            r.value.len(),
                            settings.limits.max_message_bytes
                        )),
                        Ok(()) => None,
                    },
                };
                if let Some(reason) = problem {
                    tenant.metrics.dead_letter("bad_record", 1);
                    tracing::warn!(tenant = %tenant.id, position = ?r.position, %reason, "record dead-lettered");
                    return None;
                }
                Some(Message {
                    channel: r.channel?,
                    key: r.key.and_then(|k| std::str::from_utf8(k).ok()),
                    variants: vec![Variant {
                        audience: None,
                        payload: r.value,
                        kind: kind_of(r.value),
                    }],
                    position: position(r),
                })
            })
            .collect(),
    };
    let merge = plugin.as_ref().filter(|p| p.info.hooks.merge);
    let max = settings.limits.max_message_bytes;
    let now = now_ms() as u64;
    let history = settings.limits.history();
    let mut outcomes = Vec::with_capacity(messages.len());
    let mut now_publish: Vec<Message<'_>> = Vec::new();
    let mut overflow: Vec<Held> = Vec::new();
    {
        // One lock for the whole batch: one window never splits a batch.
        let mut held = None;
        for m in messages {
            let key = match m.key {
                Some(k) if settings.conflation.applies_to(m.channel) => k,
                _ => {
                    now_publish.push(m);
                    continue;
                }
            };
            let conflator = held.get_or_insert_with(|| tenant.conflator.lock());
            let msg = Held {
                channel: m.channel.to_string(),
                key: key.to_string(),
                variants: m.variants.iter().map(owned).collect(),
                count: 1,
                position: m.position,
            };
            let (offer, back) = conflator.offer(msg, |key, older, newer| match merge {
                Some(p) => match p.merge(key, &older.payload, &newer.payload, max) {
                    Ok(payload) => HeldVariant { kind: kind_of(&payload), payload, audience: newer.audience },
                    Err(e) => {
                        tenant.metrics.dead_letter(e.kind(), 1);
                        tracing::warn!(tenant = %tenant.id, kind = e.kind(), error = %e, "merge failed; the newer message wins");
                        newer
                    }
                },
                None => newer,
            });
            match offer {
                Offer::Conflated => tenant.metrics.window_conflated.increment(1),
                Offer::Held => {}
                Offer::Full => {
                    overflow.push(back.expect("a full conflator hands the message back"));
                    continue;
                }
            }
            outcomes.push(Outcome {
                channel: m.channel.to_string(),
                seq: None,
                delivered: 0,
            });
        }
    }
    for m in &now_publish {
        let (seq, delivered) = publish(
            tenant,
            m.channel,
            m.position,
            m.key,
            &m.variants,
            history,
            now,
        );
        outcomes.push(Outcome {
            channel: m.channel.to_string(),
            seq,
            delivered,
        });
    }
    for h in &overflow {
        let (seq, delivered) = publish_held(tenant, h, history, now);
        outcomes.push(Outcome {
            channel: h.channel.clone(),
            seq,
            delivered,
        });
    }
    Ok(outcomes)
}

/// Publishes one message. A position the channel already passed (the source
/// delivered it before) publishes nothing: `(None, 0)`.
fn publish(
    tenant: &Tenant,
    channel: &str,
    position: Option<u64>,
    key: Option<&str>,
    variants: &[Variant<'_>],
    history: HistoryLimits,
    now: u64,
) -> (Option<u64>, usize) {
    let published = tenant
        .hub
        .publish_at(channel, position, key, variants, history, now);
    let Some((seq, report)) = published else {
        tenant.metrics.duplicates.increment(1);
        return (None, 0);
    };
    tenant.metrics.published.increment(1);
    tenant.metrics.conflated.increment(report.conflated as u64);
    tenant.metrics.dropped.increment(report.dropped as u64);
    tenant
        .metrics
        .disconnected
        .increment(report.disconnected as u64);
    (Some(seq), report.delivered)
}

fn publish_held(
    tenant: &Tenant,
    h: &Held,
    history: HistoryLimits,
    now: u64,
) -> (Option<u64>, usize) {
    let v: Vec<Variant<'_>> = h
        .variants
        .iter()
        .map(|v| Variant {
            payload: &v.payload,
            kind: v.kind,
            audience: v.audience.as_deref(),
        })
        .collect();
    publish(
        tenant,
        &h.channel,
        h.position,
        Some(&h.key),
        &v,
        history,
        now,
    )
}

/// Closes the tenant's conflation window: publishes what it held.
pub fn flush(tenant: &Tenant) -> usize {
    let held = tenant.conflator.lock().drain();
    let now = now_ms() as u64;
    let history = tenant.settings().limits.history();
    for h in &held {
        publish_held(tenant, h, history, now);
    }
    held.len()
}

/// Runs one batch's ingest (`run`, which calls [`ingest`]) where the tenant's
/// plugin work may execute (see `ActivePlugin::run`). A batch is retried only
/// when nothing of it was published: a transform is pure, but merges change
/// held messages, so a merging plugin always runs off the runtime.
pub async fn run_batch<R: Send + 'static>(
    tenant: &Tenant,
    run: impl Fn() -> Result<R, PluginError> + Send + 'static,
) -> Result<R, PluginError> {
    match tenant
        .plugin()
        .filter(|p| p.info.hooks.transform || p.info.hooks.merge)
    {
        Some(p) if p.info.hooks.merge => ActivePlugin::off_runtime(run).await,
        Some(p) => p.run(move |_| run()).await,
        None => run(),
    }
}
