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
use crate::fanout::Variant;
use crate::plugin::batch::{OutMessage, SourceRecord};
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

/// A message ready to publish: one position, one or more audience variants.
struct Message {
    channel: String,
    key: Option<String>,
    variants: Vec<HeldVariant>,
}

fn kind_of(payload: &[u8]) -> PayloadKind {
    if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        PayloadKind::Json
    } else {
        PayloadKind::Binary
    }
}

/// Consecutive outputs of one record to one channel are variants of one message.
fn group(outputs: Vec<OutMessage>) -> Vec<Message> {
    let mut out: Vec<(u32, Message)> = Vec::with_capacity(outputs.len());
    for o in outputs {
        let kind = kind_of(&o.payload);
        let v = HeldVariant {
            audience: o.audience,
            payload: o.payload,
            kind,
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
                },
            )),
        }
    }
    out.into_iter().map(|(_, m)| m).collect()
}

/// Runs a batch through the tenant's plugin (if it transforms) and publishes it.
/// `records` must name their channel when the tenant has no transform.
pub fn ingest(tenant: &Tenant, records: &[SourceRecord<'_>]) -> Result<Vec<Outcome>, PluginError> {
    let settings = tenant.settings();
    let plugin = tenant.plugin().filter(|p| p.info.hooks.transform);
    let messages = match &plugin {
        Some(p) => match p.transform(records, settings.limits.max_message_bytes) {
            Ok(outputs) => group(outputs),
            Err(e) => {
                tenant.metrics.dead_letter(e.kind(), records.len() as u64);
                tracing::warn!(tenant = %tenant.id, version = p.version, kind = e.kind(), error = %e, records = records.len(), "transform failed; batch dead-lettered");
                return Err(e);
            }
        },
        None => records
            .iter()
            .filter_map(|r| {
                Some(Message {
                    channel: r.channel?.to_string(),
                    key: r
                        .key
                        .and_then(|k| std::str::from_utf8(k).ok())
                        .map(str::to_string),
                    variants: vec![HeldVariant {
                        audience: None,
                        payload: r.value.to_vec(),
                        kind: kind_of(r.value),
                    }],
                })
            })
            .collect(),
    };
    let merge = plugin.as_ref().filter(|p| p.info.hooks.merge);
    let max = settings.limits.max_message_bytes;
    let now = now_ms() as u64;
    let mut outcomes = Vec::with_capacity(messages.len());
    let mut now_publish = Vec::new();
    {
        let mut held = None;
        for m in messages {
            let key = match m.key {
                Some(k) if settings.conflation.applies_to(&m.channel) => k,
                key => {
                    now_publish.push(Message { key, ..m });
                    continue;
                }
            };
            let conflator = held.get_or_insert_with(|| tenant.conflator.lock());
            let msg = Held {
                channel: m.channel,
                key,
                variants: m.variants,
                count: 1,
            };
            let channel = msg.channel.clone();
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
                    let h = back.expect("a full conflator hands the message back");
                    now_publish.push(Message {
                        channel: h.channel,
                        key: Some(h.key),
                        variants: h.variants,
                    });
                    continue;
                }
            }
            outcomes.push(Outcome {
                channel,
                seq: None,
                delivered: 0,
            });
        }
    }
    for m in now_publish {
        let (seq, delivered) = publish(tenant, &m.channel, m.key.as_deref(), &m.variants, now);
        outcomes.push(Outcome {
            channel: m.channel,
            seq: Some(seq),
            delivered,
        });
    }
    Ok(outcomes)
}

fn publish(
    tenant: &Tenant,
    channel: &str,
    key: Option<&str>,
    variants: &[HeldVariant],
    now: u64,
) -> (u64, usize) {
    let v: Vec<Variant<'_>> = variants
        .iter()
        .map(|h| Variant {
            payload: &h.payload,
            kind: h.kind,
            audience: h.audience.as_deref(),
        })
        .collect();
    let history = tenant.settings().limits.history();
    let (seq, report) = tenant.hub.publish_variants(channel, key, &v, history, now);
    tenant.metrics.published.increment(1);
    tenant.metrics.conflated.increment(report.conflated as u64);
    tenant.metrics.dropped.increment(report.dropped as u64);
    tenant
        .metrics
        .disconnected
        .increment(report.disconnected as u64);
    (seq, report.delivered)
}

/// Closes the tenant's conflation window: publishes what it held.
pub fn flush(tenant: &Tenant) -> usize {
    let held = tenant.conflator.lock().drain();
    let now = now_ms() as u64;
    for h in &held {
        publish(tenant, &h.channel, Some(&h.key), &h.variants, now);
    }
    held.len()
}
