//! A batch's messages into the hub, through the conflation window, in
//! source order. Without I/O, clocks or plugins (`combine` is passed in).
//!
//! Owns: the rule that joins the window and the positions — a message that
//! is not held (no key, no window for its channel, or the pending set full)
//! first publishes whatever its channel holds, so a channel's messages
//! leave in the order the source gave them and a held message is never
//! behind a later one (where the hub would take it for a duplicate).
//! Invariants: the caller holds the tenant's window for the whole batch and
//! for every flush, so a flush and a batch never interleave on a channel;
//! every message ends as exactly one [`Fate`].

use super::conflate::{ConflationSettings, Conflator, Held, HeldVariant, Offer};
pub use super::Message;
use super::{At, Duplicate, HistoryLimits, Hub, PublishReport, Variant};

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Published {
        seq: u64,
        delivered: usize,
    },
    /// Waiting in the conflation window.
    Held,
    /// Its source position was already published on the channel.
    Duplicate,
}

/// Totals of a batch or a flush, for the tenant's metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub published: u64,
    pub duplicates: u64,
    /// Messages published at the channel's next position because their
    /// source position was behind it (one channel fed by several streams).
    pub rebased: u64,
    /// Channels rebased for the first time (each is logged once).
    pub newly_rebased: Vec<String>,
    /// Messages the window combined into one held earlier.
    pub window_conflated: u64,
    pub queue_conflated: u64,
    pub dropped: u64,
    pub disconnected: u64,
    /// Messages sent live but not kept: the tenant's histories were full.
    pub not_kept: u64,
}

impl Tally {
    fn count(&mut self, channel: &str, r: &PublishReport) {
        self.published += 1;
        self.queue_conflated += r.conflated as u64;
        self.dropped += r.dropped as u64;
        self.disconnected += r.disconnected as u64;
        if r.rebased {
            self.rebased += 1;
        }
        if r.not_kept {
            self.not_kept += 1;
        }
        if r.first_rebase {
            self.newly_rebased.push(channel.to_string());
        }
    }
}

/// The tenant's conflation window, locked by the caller.
pub struct Window<'w> {
    pub pending: &'w mut Conflator,
    pub settings: &'w ConflationSettings,
}

fn owned(v: &Variant<'_>) -> HeldVariant {
    HeldVariant {
        audience: v.audience.map(str::to_string),
        payload: v.payload.to_vec(),
        kind: v.kind,
    }
}

fn publish(
    hub: &Hub,
    m: &Message<'_>,
    also: &[At],
    history: HistoryLimits,
    now: u64,
    tally: &mut Tally,
) -> Fate {
    match hub.publish_at(m, also, history, now) {
        Ok((seq, report)) => {
            tally.count(m.channel, &report);
            Fate::Published {
                seq,
                delivered: report.delivered,
            }
        }
        Err(Duplicate) => {
            tally.duplicates += 1;
            Fate::Duplicate
        }
    }
}

fn publish_held(hub: &Hub, h: &Held, history: HistoryLimits, now: u64, tally: &mut Tally) -> Fate {
    let variants = h
        .variants
        .iter()
        .map(|v| Variant {
            payload: &v.payload,
            kind: v.kind,
            audience: v.audience.as_deref(),
        })
        .collect();
    let m = Message {
        channel: &h.channel,
        key: Some(&h.key),
        variants,
        at: h.at,
    };
    publish(hub, &m, &h.also, history, now, tally)
}

/// Publishes what `channel` holds, in order.
fn flush_channel(
    hub: &Hub,
    pending: &mut Conflator,
    channel: &str,
    history: HistoryLimits,
    now: u64,
    tally: &mut Tally,
) {
    for h in pending.take_channel(channel) {
        publish_held(hub, &h, history, now, tally);
    }
}

/// Delivers `messages` in order; the fates come back in the same order.
pub fn deliver(
    hub: &Hub,
    mut window: Option<Window<'_>>,
    messages: Vec<Message<'_>>,
    history: HistoryLimits,
    now: u64,
    mut combine: impl FnMut(&str, &HeldVariant, HeldVariant) -> HeldVariant,
    tally: &mut Tally,
) -> Vec<Fate> {
    let mut fates = Vec::with_capacity(messages.len());
    for m in messages {
        if let Some(w) = window.as_mut() {
            if let Some(key) = m.key.filter(|_| w.settings.applies_to(m.channel)) {
                // A re-read of what the channel had must not take the place of
                // newer messages held under its key.
                if m.at.is_some_and(|at| hub.has(m.channel, at)) {
                    tally.duplicates += 1;
                    fates.push(Fate::Duplicate);
                    continue;
                }
                let held = Held {
                    channel: m.channel.to_string(),
                    key: key.to_string(),
                    variants: m.variants.iter().map(owned).collect(),
                    count: 1,
                    at: m.at,
                    also: Vec::new(),
                };
                match w.pending.offer(held, &mut combine) {
                    (Offer::Held, _) => {
                        fates.push(Fate::Held);
                        continue;
                    }
                    (Offer::Conflated, _) => {
                        tally.window_conflated += 1;
                        fates.push(Fate::Held);
                        continue;
                    }
                    (Offer::Duplicate, _) => {
                        tally.duplicates += 1;
                        fates.push(Fate::Duplicate);
                        continue;
                    }
                    (Offer::Full, _) => {}
                }
            }
            flush_channel(hub, w.pending, m.channel, history, now, tally);
        }
        fates.push(publish(hub, &m, &[], history, now, tally));
    }
    fates
}

/// Closes the window: publishes everything held, in order. Returns how many.
pub fn flush(
    hub: &Hub,
    pending: &mut Conflator,
    history: HistoryLimits,
    now: u64,
    tally: &mut Tally,
) -> usize {
    let held = pending.drain();
    for h in &held {
        publish_held(hub, h, history, now, tally);
    }
    held.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::SourcePos;
    use crate::queue::{Item, SlowConsumer, Wire};
    use crate::session::SessionHandle;
    use herald_proto::PayloadKind;
    use std::sync::Arc;

    const H: HistoryLimits = HistoryLimits {
        max_messages: 100,
        max_age_ms: 60_000,
        max_bytes: usize::MAX,
        tenant_max_bytes: usize::MAX,
    };

    /// Delivers `batch` through a 100 ms window on every channel.
    fn windowed(
        hub: &Hub,
        pending: &mut Conflator,
        batch: Vec<Message<'_>>,
        tally: &mut Tally,
    ) -> Vec<Fate> {
        let settings = ConflationSettings {
            window_ms: 100,
            channels: vec![],
        };
        let w = Window {
            pending,
            settings: &settings,
        };
        deliver(hub, Some(w), batch, H, 0, latest, tally)
    }

    fn m<'a>(key: Option<&'a str>, n: u64, payload: &'a [u8]) -> Message<'a> {
        Message {
            channel: "ticks",
            key,
            variants: vec![Variant {
                payload,
                kind: PayloadKind::Json,
                audience: None,
            }],
            at: Some(At {
                pos: SourcePos {
                    stream: 0,
                    order: (0, n),
                    number: n,
                },
                index: 0,
            }),
        }
    }

    fn latest(_: &str, _: &HeldVariant, n: HeldVariant) -> HeldVariant {
        n
    }

    fn setup() -> (Hub, Arc<SessionHandle>) {
        let hub = Hub::default();
        let s = SessionHandle::new(Wire::Ws, 1 << 20, SlowConsumer::DropOldest, None);
        hub.subscribe("ticks", &s, None, H, 0, |_, _| {});
        (hub, s)
    }

    /// (seq, prev, payload) of what the session got.
    fn got(s: &SessionHandle) -> Vec<(u64, u64, String)> {
        s.take_queued()
            .into_iter()
            .filter_map(|i| match i {
                Item::Msg(m) => {
                    let v: serde_json::Value = serde_json::from_slice(&m.ws[2..]).unwrap();
                    Some((m.seq, m.prev, v["data"].to_string()))
                }
                Item::Ctrl(_) => None,
            })
            .collect()
    }

    /// After the final flush (shutdown) the window holds nothing more: a
    /// message it would have held is published at once, so no publish is
    /// answered "held" that no later flush would send.
    #[test]
    fn a_closed_window_publishes_at_once() {
        let (hub, s) = setup();
        let mut pending = Conflator::default();
        let mut tally = Tally::default();
        let fates = windowed(&hub, &mut pending, vec![m(Some("A"), 10, b"1")], &mut tally);
        assert_eq!(fates, [Fate::Held]);
        pending.close();
        assert_eq!(flush(&hub, &mut pending, H, 0, &mut tally), 1);
        let fates = windowed(&hub, &mut pending, vec![m(Some("A"), 11, b"2")], &mut tally);
        assert!(matches!(fates[..], [Fate::Published { .. }]), "{fates:?}");
        assert_eq!(got(&s).len(), 2);
        assert!(pending.is_empty());
    }

    /// A@10, B@11, A@12 in one window publish B then A.
    #[test]
    fn a_window_collapses_without_reordering() {
        let (hub, s) = setup();
        let mut pending = Conflator::default();
        let mut tally = Tally::default();
        let batch = vec![
            m(Some("A"), 10, b"1"),
            m(Some("B"), 11, b"2"),
            m(Some("A"), 12, b"3"),
        ];
        let fates = windowed(&hub, &mut pending, batch, &mut tally);
        assert_eq!(fates, [Fate::Held; 3]);
        assert_eq!(flush(&hub, &mut pending, H, 0, &mut tally), 2);
        assert_eq!(
            got(&s),
            [(11_000, 0, "2".into()), (12_000, 11_000, "3".into())]
        );
        assert_eq!(
            (tally.published, tally.duplicates, tally.window_conflated),
            (2, 0, 1)
        );
    }

    /// An unkeyed message goes out at once, after what its
    /// channel holds, so the held ones are not behind it.
    #[test]
    fn an_unkeyed_message_publishes_its_channel_first() {
        let (hub, s) = setup();
        let mut pending = Conflator::default();
        let mut tally = Tally::default();
        let batch = vec![
            m(Some("A"), 10, b"1"),
            m(None, 11, b"2"),
            m(Some("A"), 12, b"3"),
        ];
        windowed(&hub, &mut pending, batch, &mut tally);
        flush(&hub, &mut pending, H, 0, &mut tally);
        assert_eq!(
            got(&s),
            [
                (10_000, 0, "1".into()),
                (11_000, 10_000, "2".into()),
                (12_000, 11_000, "3".into())
            ]
        );
        assert_eq!(tally.duplicates, 0);
    }

    /// Past the bound a message is published at once, after
    /// what its channel holds.
    #[test]
    fn a_full_window_publishes_in_order() {
        let (hub, s) = setup();
        let mut pending = Conflator::with_max(2);
        let mut tally = Tally::default();
        let batch = vec![
            m(Some("A"), 10, b"1"),
            m(Some("B"), 11, b"2"),
            m(Some("C"), 12, b"3"),
        ];
        let fates = windowed(&hub, &mut pending, batch, &mut tally);
        assert_eq!(
            fates[2],
            Fate::Published {
                seq: 12_000,
                delivered: 1
            }
        );
        assert_eq!(
            got(&s).iter().map(|g| g.0).collect::<Vec<_>>(),
            [10_000, 11_000, 12_000]
        );
        assert_eq!(tally.duplicates, 0);
    }

    /// A re-read that the window already stands for is a duplicate, and does
    /// not take the newer message's place.
    #[test]
    fn a_reread_in_the_window_is_a_duplicate() {
        let (hub, s) = setup();
        let mut pending = Conflator::default();
        let mut tally = Tally::default();
        let batch = vec![
            m(Some("A"), 10, b"1"),
            m(Some("A"), 12, b"3"),
            m(Some("A"), 10, b"1"),
        ];
        let fates = windowed(&hub, &mut pending, batch, &mut tally);
        assert_eq!(fates[2], Fate::Duplicate);
        flush(&hub, &mut pending, H, 0, &mut tally);
        assert_eq!(got(&s), [(12_000, 0, "3".into())]);
    }
}
