//! Ingest: records from a tenant's source become published messages.
//!
//! Owns: the one path every source takes (HTTP publish, the outbox, Kafka):
//! the tenant's `transform` once per batch (never per subscriber), grouping a
//! record's per-audience outputs under one position and numbering a record's
//! several messages to one channel, then delivery through the conflation
//! window (`fanout::deliver`) and the tenant's metrics. Invariants: a failed
//! transform drops the whole batch into the counted dead-letter path and
//! publishes nothing of it; a batch is delivered under the tenant's window
//! lock, so one window never splits a batch and a flush never interleaves
//! with it.

use crate::clock::now_ms;
use crate::fanout::conflate::HeldVariant;
use crate::fanout::deliver::{self, Fate, Message, Tally, Window};
use crate::fanout::position::MESSAGES_PER_RECORD;
use crate::fanout::{At, Variant};
use crate::plugin::active::Patience;
use crate::plugin::batch::{Outputs, SourceRecord};
use crate::plugin::PluginError;
use crate::proto::PayloadKind;
use crate::tenant::Tenant;

/// What happened to one message of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub channel: String,
    pub fate: Fate,
}

fn kind_of(payload: &[u8]) -> PayloadKind {
    if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        PayloadKind::Json
    } else {
        PayloadKind::Binary
    }
}

/// Consecutive outputs of one record to one channel, each for another
/// audience, are variants of one message. A record's messages are numbered
/// in output order (index 0, 1, … across its channels) under the record's
/// position, so several messages of one record to one channel are told apart
/// and none is a "duplicate" of its sibling; past [`MESSAGES_PER_RECORD`] the
/// rest are counted in `too_many`.
fn group<'a>(
    outputs: &'a Outputs,
    records: &[SourceRecord<'_>],
    too_many: &mut u64,
) -> Vec<Message<'a>> {
    let mut out: Vec<(u32, Message<'_>)> = Vec::with_capacity(outputs.len());
    // Messages so far per record: no hashing per message.
    let mut next_index: Vec<u16> = Vec::new();
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
            _ => {
                let pos = records.get(o.source as usize).and_then(|r| r.position);
                let at = match pos {
                    Some(pos) => {
                        if next_index.is_empty() {
                            next_index = vec![0; records.len()];
                        }
                        let index = &mut next_index[o.source as usize];
                        if u64::from(*index) >= MESSAGES_PER_RECORD {
                            *too_many += 1;
                            continue;
                        }
                        *index += 1;
                        Some(At {
                            pos,
                            index: u64::from(*index - 1),
                        })
                    }
                    None => None,
                };
                out.push((
                    o.source,
                    Message {
                        channel: o.channel,
                        key: o.key,
                        variants: vec![v],
                        at,
                    },
                ))
            }
        }
    }
    out.into_iter().map(|(_, m)| m).collect()
}

/// The records themselves as messages (a tenant without a transform). Sources
/// other than HTTP publish deliver unchecked records: a bad one is
/// dead-lettered with its reason, the rest go on.
fn as_messages<'a>(
    tenant: &Tenant,
    records: &[SourceRecord<'a>],
    max_bytes: usize,
) -> Vec<Message<'a>> {
    records
        .iter()
        .filter_map(|r| {
            let problem = match r.channel {
                None => Some("the record names no channel and the tenant has no transform".to_string()),
                Some(ch) => match crate::proto::validate_channel(ch) {
                    Err(e) => Some(format!("channel {ch:?}: {e}")),
                    Ok(()) if r.value.len() > max_bytes => Some(format!(
                        "payload of {} bytes exceeds {max_bytes}",
                        r.value.len(),
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
                at: r.position.map(|pos| At { pos, index: 0 }),
            })
        })
        .collect()
}

/// Counts what a batch or a flush did in the tenant's metrics.
fn record(tenant: &Tenant, t: &Tally) {
    let m = &tenant.metrics;
    m.published.increment(t.published);
    m.duplicates.increment(t.duplicates);
    m.rebased.increment(t.rebased);
    m.window_conflated.increment(t.window_conflated);
    m.conflated.increment(t.queue_conflated);
    m.dropped.increment(t.dropped);
    m.disconnected.increment(t.disconnected);
    m.history_not_kept.increment(t.not_kept);
    if t.not_kept > 0 && tenant.history_full_logged.due(60_000) {
        tracing::warn!(tenant = %tenant.id, not_kept = t.not_kept, limit = tenant.settings().limits.history_total_bytes, "the tenant's histories are full: messages are sent live but not kept (a resume across them gets a gap; logged once a minute)");
    }
    if t.rebased > 0 {
        tenant
            .rebased
            .fetch_add(t.rebased, std::sync::atomic::Ordering::Relaxed);
    }
    for ch in &t.newly_rebased {
        tracing::warn!(tenant = %tenant.id, channel = %ch, "a source position behind the channel's (several Kafka partitions into one channel, or outbox rows committed out of id order) was published at the channel's next seq, which other nodes may number differently");
    }
}

/// Runs a batch through the tenant's plugin (if it transforms) and publishes it.
/// `records` must name their channel when the tenant has no transform.
pub fn ingest(tenant: &Tenant, records: &[SourceRecord<'_>]) -> Result<Vec<Outcome>, PluginError> {
    // Never as if there were no plugin: the source holds its records.
    if let Some(version) = tenant.plugin_unavailable() {
        return Err(PluginError::Unavailable(version));
    }
    // How far this node has read, before anything of the batch is published
    // (ARCHITECTURE.md, "Positions"): a channel made from now on knows it
    // may have missed these records, never the other way round.
    let mut read: Vec<(u32, u64)> = Vec::new();
    for p in records.iter().filter_map(|r| r.position) {
        match read.iter_mut().find(|(s, _)| *s == p.stream) {
            Some((_, n)) => *n = (*n).max(p.number),
            None => read.push((p.stream, p.number)),
        }
    }
    for (stream, number) in read {
        tenant.hub.read_to(stream, number);
    }
    let settings = tenant.settings();
    let plugin = tenant.plugin().filter(|p| p.info.hooks.transform);
    let outputs = match &plugin {
        Some(p) => match p.transform(records, settings.limits.max_message_bytes) {
            Ok(t) => {
                // Records whose outputs broke the contract fail alone.
                for kind in ["bad_output", "timeout"] {
                    let mut of_kind = t.refused.iter().filter(|r| r.kind == kind);
                    let Some(first) = of_kind.next() else {
                        continue;
                    };
                    let n = 1 + of_kind.count();
                    tenant.metrics.dead_letter(kind, n as u64);
                    let position = records.get(first.source as usize).and_then(|r| r.position);
                    tracing::warn!(tenant = %tenant.id, version = p.version, records = n, first = first.source, ?position, kind, reason = %first.reason, "transform failed for some records (broke the contract, or ran past the deadline alone); those records dead-lettered, the rest published");
                }
                Some(t.outputs)
            }
            // Cut on a runtime worker, or no instance ready there: it runs
            // again off the runtime (nothing was published, nothing is
            // dead-lettered).
            Err(e @ (PluginError::OverBudget | PluginError::Cold)) => return Err(e),
            Err(e) => {
                tenant.metrics.dead_letter(e.kind(), records.len() as u64);
                tracing::warn!(tenant = %tenant.id, version = p.version, kind = e.kind(), error = %e.for_log(), records = records.len(), "transform failed; batch dead-lettered");
                return Err(e);
            }
        },
        None => None,
    };
    let messages = match &outputs {
        Some(o) => {
            let mut too_many = 0;
            let messages = group(o, records, &mut too_many);
            if too_many > 0 {
                tenant.metrics.dead_letter("too_many_messages", too_many);
                tracing::warn!(tenant = %tenant.id, dropped = too_many, "a record became more than {MESSAGES_PER_RECORD} messages; the rest are dead-lettered");
            }
            messages
        }
        None => as_messages(tenant, records, settings.limits.max_message_bytes),
    };
    let channels: Vec<String> = messages.iter().map(|m| m.channel.to_string()).collect();
    let merge = plugin.as_ref().filter(|p| p.info.hooks.merge);
    let max = settings.limits.max_message_bytes;
    let combine = |key: &str, older: &HeldVariant, newer: HeldVariant| match merge {
        Some(p) => match p.merge(key, &older.payload, &newer.payload, max) {
            Ok(payload) => HeldVariant {
                kind: kind_of(&payload),
                payload,
                audience: newer.audience,
            },
            Err(e) => {
                tenant.metrics.dead_letter(e.kind(), 1);
                tracing::warn!(tenant = %tenant.id, kind = e.kind(), error = %e.for_log(), "merge failed; the newer message wins");
                newer
            }
        },
        None => newer,
    };
    let now = now_ms() as u64;
    let history = settings.limits.history();
    let mut tally = Tally::default();
    let fates = {
        // The window stays locked for the whole batch: one window never splits
        // a batch, and a flush never interleaves with it on a channel.
        let mut pending = tenant.conflator.lock();
        let window = (settings.conflation.window_ms > 0 || !pending.is_empty()).then(|| Window {
            pending: &mut pending,
            settings: &settings.conflation,
        });
        deliver::deliver(
            &tenant.hub,
            window,
            messages,
            history,
            now,
            combine,
            &mut tally,
        )
    };
    record(tenant, &tally);
    Ok(channels
        .into_iter()
        .zip(fates)
        .map(|(channel, fate)| Outcome { channel, fate })
        .collect())
}

/// Closes the tenant's conflation window: publishes what it held.
pub fn flush(tenant: &Tenant) -> usize {
    flush_window(tenant, &mut tenant.conflator.lock())
}

/// The final flush (shutdown): the window is closed under its lock first,
/// so a publish that lands after it is published at once, never answered
/// "held" for a flush that will not come.
pub fn flush_final(tenant: &Tenant) -> usize {
    let mut window = tenant.conflator.lock();
    window.close();
    flush_window(tenant, &mut window)
}

/// Closes the window unless a batch holds it (its plugin may be merging on
/// one of the tenant's plugin threads): the shared flush task never waits
/// for one tenant, and tries this one again on its next tick. `None` when
/// the window was busy.
pub fn try_flush(tenant: &Tenant) -> Option<usize> {
    let mut pending = tenant.conflator.try_lock()?;
    Some(flush_window(tenant, &mut pending))
}

fn flush_window(tenant: &Tenant, pending: &mut crate::fanout::conflate::Conflator) -> usize {
    let history = tenant.settings().limits.history();
    let mut tally = Tally::default();
    let n = { deliver::flush(&tenant.hub, pending, history, now_ms() as u64, &mut tally) };
    record(tenant, &tally);
    n
}

/// Runs one batch's ingest (`run`, which calls [`ingest`]) where the tenant's
/// plugin work may execute (see `ActivePlugin::run`), waiting for a plugin
/// thread per `patience`. A batch is retried only when nothing of it was
/// published (a transform cut at the inline budget): merges change held
/// messages under the tenant's window lock, so a merging plugin always runs
/// on the tenant's plugin threads, never on a runtime worker.
pub async fn run_batch<R: Send + 'static>(
    tenant: &Tenant,
    patience: Patience,
    run: impl Fn() -> Result<R, PluginError> + Send + 'static,
) -> Result<R, PluginError> {
    match tenant
        .plugin()
        .filter(|p| p.info.hooks.transform || p.info.hooks.merge)
    {
        Some(p) if p.info.hooks.merge => p.offload(patience, move |_| run()).await,
        Some(p) => p.run(patience, move |_| run()).await,
        None => run(),
    }
}
