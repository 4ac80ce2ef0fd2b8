//! Conflation windows, without I/O or clocks: the host holds keyed messages
//! for a window and publishes only the latest (or the plugin's merge) per
//! (channel, key) when the window closes.
//!
//! Owns: the pending set of one tenant and the rule of which channels have a
//! window. Invariants: pending entries keep their first-arrival order, so a
//! flush publishes in a stable order; the pending set is bounded (a message
//! that would exceed the bound is published at once instead of held).

use crate::proto::PayloadKind;
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
    pub position: Option<u64>,
}

/// Most (channel, key) pairs held per tenant.
pub const MAX_HELD: usize = 100_000;

#[derive(Debug, Default)]
pub struct Conflator {
    order: Vec<Held>,
    index: HashMap<(String, String), usize>,
}

/// What offering a message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Held as a new entry.
    Held,
    /// Replaced or merged into an entry already held.
    Conflated,
    /// The pending set is full: publish it now instead.
    Full,
}

impl Conflator {
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Holds `msg`, combining it with an earlier one of the same channel and
    /// key through `combine(key, older, newer)` (latest-wins or the plugin's
    /// merge). Variants are matched by audience.
    pub fn offer(
        &mut self,
        msg: Held,
        mut combine: impl FnMut(&str, &HeldVariant, HeldVariant) -> HeldVariant,
    ) -> (Offer, Option<Held>) {
        let id = (msg.channel.clone(), msg.key.clone());
        if let Some(&i) = self.index.get(&id) {
            let held = &mut self.order[i];
            held.count += msg.count;
            held.position = held.position.max(msg.position);
            for v in msg.variants {
                match held.variants.iter_mut().find(|o| o.audience == v.audience) {
                    Some(old) => *old = combine(&msg.key, old, v),
                    None => held.variants.push(v),
                }
            }
            return (Offer::Conflated, None);
        }
        if self.order.len() >= MAX_HELD {
            return (Offer::Full, Some(msg));
        }
        self.index.insert(id, self.order.len());
        self.order.push(msg);
        (Offer::Held, None)
    }

    /// Everything held, in first-arrival order.
    pub fn drain(&mut self) -> Vec<Held> {
        self.index.clear();
        std::mem::take(&mut self.order)
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
            position: None,
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
