//! Conflation windows, without I/O or clocks: the host holds keyed messages
//! for a window and publishes only the latest (or the plugin's merge) per
//! (channel, key) when the window closes.
//!
//! Owns: the pending set of one tenant and the rule of which channels have a
//! window. Invariants: entries leave in the order their newest messages
//! arrived (the source's order), whole or per channel, so a window collapses
//! a channel's messages but never reorders them; the pending set is bounded
//! in entries and in bytes (a message that would exceed either bound is
//! published at once instead of held, after what its channel holds).

use super::At;
use herald_proto::PayloadKind;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A tenant's conflation window: `{"window_ms": 100, "channels": ["ticks.*"]}`.
/// No `channels` means every channel. A window of 0 turns conflation off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConflationSettings {
    #[serde(default)]
    pub window_ms: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<String>,
}

impl ConflationSettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.window_ms > 60_000 {
            return Err("conflation.window_ms must be at most 60000".into());
        }
        if self.channels.len() > 64 {
            return Err("conflation.channels may list at most 64 patterns".into());
        }
        Ok(())
    }

    /// True when keyed messages on `channel` wait for the window.
    pub fn applies_to(&self, channel: &str) -> bool {
        self.window_ms > 0
            && (self.channels.is_empty()
                || self.channels.iter().any(|p| match p.strip_suffix('*') {
                    Some(prefix) => channel.starts_with(prefix),
                    None => channel == p,
                }))
    }
}

/// One audience's version of a held message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldVariant {
    pub audience: Option<String>,
    pub payload: Vec<u8>,
    pub kind: PayloadKind,
}

/// A message held until the window closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub channel: String,
    pub key: String,
    pub variants: Vec<HeldVariant>,
    /// How many messages this one stands for.
    pub count: u64,
    /// The source position of the newest message it stands for, if the
    /// source has positions.
    pub at: Option<At>,
    /// The newest position of every other stream it stands for (one channel
    /// fed by several Kafka partitions), so their re-reads are duplicates too.
    pub also: Vec<At>,
}

/// Most (channel, key) pairs held per tenant.
pub const MAX_HELD: usize = 100_000;

/// The held messages of one channel, by key, each with when it last arrived.
type ChannelWindow = HashMap<String, (u64, Held)>;

#[derive(Debug)]
pub struct Conflator {
    channels: HashMap<String, ChannelWindow>,
    len: usize,
    max: usize,
    /// Bytes held (payloads, keys and channel names), and the bound.
    bytes: usize,
    max_bytes: usize,
    /// Counts offers: an entry's arrival is that of its newest message.
    arrivals: u64,
    /// Closed for good ([`Conflator::close`]).
    closed: bool,
}

impl Default for Conflator {
    fn default() -> Self {
        Conflator::with_max(MAX_HELD)
    }
}

/// What offering a message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Held as a new entry.
    Held,
    /// The held entry already stands for this source position (a re-read):
    /// dropped.
    Duplicate,
    /// Replaced or merged into an entry already held.
    Conflated,
    /// The pending set is full: publish it now instead (after its channel's
    /// held messages, to keep the channel's order).
    Full,
}

/// Entries in the order their newest messages arrived: the order the
/// source delivered them in, so a flush never publishes a channel's
/// messages out of their source order.
fn in_arrival_order(mut entries: Vec<(u64, Held)>) -> Vec<Held> {
    entries.sort_unstable_by_key(|(arrival, _)| *arrival);
    entries.into_iter().map(|(_, h)| h).collect()
}

/// What a held entry costs in bytes.
fn held_bytes(h: &Held) -> usize {
    h.channel.len()
        + h.key.len()
        + h.variants
            .iter()
            .map(|v| v.payload.len() + v.audience.as_ref().map_or(0, |a| a.len()))
            .sum::<usize>()
}

impl Conflator {
    /// A pending set of at most `max` (channel, key) pairs.
    pub fn with_max(max: usize) -> Conflator {
        Conflator::with_limits(max, usize::MAX)
    }

    /// At most `max` pairs and `max_bytes` bytes.
    pub fn with_limits(max: usize, max_bytes: usize) -> Conflator {
        Conflator {
            channels: HashMap::new(),
            len: 0,
            max,
            bytes: 0,
            max_bytes,
            arrivals: 0,
            closed: false,
        }
    }

    /// Changes the byte bound (the tenant's limits changed); what is held
    /// stays until the window closes.
    pub fn set_max_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = max_bytes;
    }

    /// Holds nothing more from here (the final flush at shutdown): every
    /// later offer is answered [`Offer::Full`], so it is published at once.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Holds `msg`, combining it with an earlier one of the same channel and
    /// key through `combine(key, older, newer)` (latest-wins or the plugin's
    /// merge). The entry takes the newer message's variants, each combined
    /// with the older variant its audience would have received, keeps the
    /// older variants of audiences the newer message does not reach (their
    /// latest for the key), and takes the newer message's place in the order.
    pub fn offer(
        &mut self,
        msg: Held,
        mut combine: impl FnMut(&str, &HeldVariant, HeldVariant) -> HeldVariant,
    ) -> (Offer, Option<Held>) {
        if self.closed {
            return (Offer::Full, Some(msg));
        }
        self.arrivals += 1;
        let arrival = self.arrivals;
        if let Some((at, held)) = self
            .channels
            .get_mut(&msg.channel)
            .and_then(|w| w.get_mut(&msg.key))
        {
            // Within one stream a source delivers in order: a position at or
            // below one the entry stands for is a re-read.
            if let Some(new) = msg.at {
                let seen = held
                    .at
                    .iter()
                    .chain(&held.also)
                    .find(|a| a.pos.stream == new.pos.stream);
                if seen.is_some_and(|a| new.order() <= a.order()) {
                    return (Offer::Duplicate, None);
                }
            }
            // The entry is published at its newest message's position (none
            // for HTTP publish); the others it stands for are kept in `also`.
            let stream = msg.at.map(|a| a.pos.stream);
            if let Some(old) = held.at.filter(|a| Some(a.pos.stream) != stream) {
                held.also.retain(|a| a.pos.stream != old.pos.stream);
                held.also.push(old);
            }
            held.also.retain(|a| Some(a.pos.stream) != stream);
            held.at = msg.at;
            *at = arrival;
            held.count += msg.count;
            // The entry becomes what each audience would see of the newer
            // message, combined with what it would have seen of the older.
            self.bytes -= held_bytes(held);
            let older = std::mem::take(&mut held.variants);
            // Who the newer message reaches: its tagged audiences, and with
            // an untagged variant everyone else too.
            let newer_untagged = msg.variants.iter().any(|v| v.audience.is_none());
            let covered = |a: &Option<String>| {
                newer_untagged || msg.variants.iter().any(|v| v.audience == *a)
            };
            // An audience the newer message does not reach keeps what it
            // would have seen of the older one: its latest for this key.
            let kept: Vec<HeldVariant> = older
                .iter()
                .filter(|o| !covered(&o.audience))
                .cloned()
                .collect();
            let mut variants: Vec<HeldVariant> = msg
                .variants
                .into_iter()
                .map(|v| {
                    let seen = older
                        .iter()
                        .find(|o| o.audience == v.audience)
                        .or_else(|| older.iter().find(|o| o.audience.is_none()));
                    match seen {
                        Some(o) => combine(&msg.key, o, v),
                        None => v,
                    }
                })
                .collect();
            variants.extend(kept);
            held.variants = variants;
            self.bytes += held_bytes(held);
            return (Offer::Conflated, None);
        }
        let size = held_bytes(&msg);
        if self.len >= self.max || self.bytes + size > self.max_bytes {
            return (Offer::Full, Some(msg));
        }
        self.len += 1;
        self.bytes += size;
        self.channels
            .entry(msg.channel.clone())
            .or_default()
            .insert(msg.key.clone(), (arrival, msg));
        (Offer::Held, None)
    }

    /// Per stream, the lowest source order a held entry waits to publish:
    /// a source must not store its position past it, or a crash loses the
    /// held message (re-reading it is a duplicate at worst).
    pub fn lowest_held(&self) -> Vec<(u32, (u64, u64))> {
        let mut lowest: Vec<(u32, (u64, u64))> = Vec::new();
        for (_, h) in self.channels.values().flat_map(|w| w.values()) {
            let Some(at) = h.at else { continue };
            match lowest.iter_mut().find(|(s, _)| *s == at.pos.stream) {
                Some((_, o)) => *o = (*o).min(at.pos.order),
                None => lowest.push((at.pos.stream, at.pos.order)),
            }
        }
        lowest
    }

    /// Everything `channel` holds, in arrival order.
    pub fn take_channel(&mut self, channel: &str) -> Vec<Held> {
        let Some(w) = self.channels.remove(channel) else {
            return Vec::new();
        };
        self.len -= w.len();
        self.bytes -= w.values().map(|(_, h)| held_bytes(h)).sum::<usize>();
        in_arrival_order(w.into_values().collect())
    }

    /// Everything held, in arrival order.
    pub fn drain(&mut self) -> Vec<Held> {
        self.len = 0;
        self.bytes = 0;
        in_arrival_order(
            self.channels
                .drain()
                .flat_map(|(_, w)| w.into_values())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(sym: &str, px: u32) -> Held {
        Held {
            channel: "ticks".into(),
            key: sym.into(),
            variants: vec![HeldVariant {
                audience: None,
                payload: px.to_string().into_bytes(),
                kind: PayloadKind::Json,
            }],
            count: 1,
            at: None,
            also: vec![],
        }
    }

    fn latest(_k: &str, _o: &HeldVariant, n: HeldVariant) -> HeldVariant {
        n
    }

    #[test]
    fn thousand_ticks_of_five_symbols_become_five() {
        let mut c = Conflator::default();
        let syms = ["A", "B", "C", "D", "E"];
        for i in 0..1000u32 {
            c.offer(tick(syms[(i % 5) as usize], i), latest);
        }
        let out = c.drain();
        assert_eq!(out.len(), 5);
        assert_eq!(out.iter().map(|h| h.key.as_str()).collect::<Vec<_>>(), syms);
        assert_eq!(out[0].variants[0].payload, b"995");
        assert_eq!(out[4].variants[0].payload, b"999");
        assert!(out.iter().all(|h| h.count == 200));
        assert!(c.drain().is_empty());
    }

    /// The window is bounded in bytes too; a message past the
    /// bound is published at once (Full), and the count follows what is held.
    #[test]
    fn the_window_is_bounded_in_bytes() {
        let one = held_bytes(&tick("A", 100));
        let mut c = Conflator::with_limits(1000, one * 2);
        assert_eq!(c.offer(tick("A", 100), latest).0, Offer::Held);
        assert_eq!(c.offer(tick("B", 100), latest).0, Offer::Held);
        assert_eq!(c.offer(tick("C", 100), latest).0, Offer::Full);
        // Replacing a held entry is always possible, and keeps the count.
        assert_eq!(c.offer(tick("A", 101), latest).0, Offer::Conflated);
        assert_eq!(c.bytes(), one * 2);
        let mut ch = tick("D", 1);
        ch.channel = "other".into();
        assert_eq!(c.take_channel("ticks").len(), 2);
        assert_eq!(c.bytes(), 0);
        assert_eq!(c.offer(ch, latest).0, Offer::Held);
        c.drain();
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn merge_sees_older_and_newer() {
        let mut c = Conflator::default();
        let mut sum = |_k: &str, o: &HeldVariant, n: HeldVariant| {
            let a: u32 = std::str::from_utf8(&o.payload).unwrap().parse().unwrap();
            let b: u32 = std::str::from_utf8(&n.payload).unwrap().parse().unwrap();
            HeldVariant {
                payload: (a + b).to_string().into_bytes(),
                ..n
            }
        };
        for i in 1..=4 {
            c.offer(tick("A", i), &mut sum);
        }
        assert_eq!(c.drain()[0].variants[0].payload, b"10");
    }

    #[test]
    fn lowest_held_per_stream() {
        let mut c = Conflator::default();
        let at = |stream, n| {
            Some(At {
                pos: crate::position::SourcePos {
                    stream,
                    order: (n, n),
                    number: n,
                },
                index: 0,
            })
        };
        for (key, stream, n) in [("A", 0, 7), ("B", 0, 5), ("A", 0, 9), ("C", 1, 3)] {
            c.offer(
                Held {
                    at: at(stream, n),
                    ..tick(key, 1)
                },
                latest,
            );
        }
        let mut l = c.lowest_held();
        l.sort();
        // A moved on to 9, so 5 (B) is stream 0's lowest.
        assert_eq!(l, [(0, (5, 5)), (1, (3, 3))]);
        c.drain();
        assert!(c.lowest_held().is_empty());
    }

    #[test]
    fn window_rules() {
        let s = ConflationSettings {
            window_ms: 100,
            channels: vec!["ticks.*".into(), "exact".into()],
        };
        assert!(s.applies_to("ticks.AAPL") && s.applies_to("exact"));
        assert!(!s.applies_to("exactly") && !s.applies_to("news"));
        assert!(ConflationSettings {
            window_ms: 100,
            channels: vec![]
        }
        .applies_to("any"));
        assert!(!ConflationSettings::default().applies_to("any"));
        assert!(ConflationSettings {
            window_ms: 600_000,
            channels: vec![]
        }
        .validate()
        .is_err());
    }
}
