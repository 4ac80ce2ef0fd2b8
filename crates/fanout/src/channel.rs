//! One channel of a tenant's hub: its positions, epoch, marks, audience
//! chains and history, its subscribers with their floors and pending
//! resumes, and the tomb a channel leaves when it is dropped while empty.
//!
//! Invariants: `seq` only increases within an epoch; a message is a
//! duplicate only when its own source position was already published here;
//! a frame's `prev` is the previous position its audience was sent (or, for
//! audiences no longer tracked, never less than what they may have been
//! sent); an epoch change tells every subscriber. The hub (mod.rs) holds the
//! lock and decides when; this file never takes a lock and never waits.

use super::session::SessionHandle;
use super::{At, Duplicate, HistoryLimits, PublishReport, Published, Serves, Variant};
use herald_proto::{self as proto, sse, ws};
use indexmap::IndexMap;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The last source position a channel published from one stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    pub(super) stream: u32,
    pub(super) last: ((u64, u64), u64),
}

/// Audiences tracked per channel beyond which the ones equivalent to the
/// rest are forgotten (and beyond four times which the least recent are).
pub(super) const TRACKED_AUDIENCES: usize = 64;

/// The frames of one position: one per variant (and per distinct `prev`).
pub(super) type Entry = Box<[Arc<Published>]>;

/// What an entry holds in encoded bytes (both wire formats).
pub(super) fn entry_bytes(e: &[Arc<Published>]) -> usize {
    e.iter().map(|p| p.ws.len() + p.sse.len()).sum()
}

pub(super) struct Channel {
    pub(super) name: Arc<str>,
    pub(super) epoch: u64,
    pub(super) seq: u64,
    pub(super) history: VecDeque<Entry>,
    /// Encoded bytes `history` holds (counted in the hub's total too).
    pub(super) history_bytes: usize,
    /// Keyed by the handle's address: O(1) leave, Vec-like iteration.
    pub(super) subscribers: IndexMap<usize, Subscriber>,
    pub(super) marks: Vec<Mark>,
    /// The last position that had an untagged variant (sent to everyone
    /// without a variant of their own).
    pub(super) untagged_last: u64,
    /// Per audience, the last position that had a variant tagged for it.
    pub(super) tagged_last: HashMap<Arc<str>, u64>,
    /// The highest last position of audiences no longer tracked (a plugin
    /// tagging per user, a channel revived from its tomb): what such an
    /// audience may have been sent, so its resume reports a gap too eagerly
    /// rather than missing one.
    pub(super) forgotten_last: u64,
    pub(super) rebased: bool,
    /// The epoch is the source's (`Hub::new_source`), the same on every node
    /// reading it, so positions a client got elsewhere mean the same here.
    pub(super) shared_epoch: bool,
    /// Positions up to here may have been read before this node knew the
    /// channel (an earlier process, before a sweep left no tomb, before the
    /// reader's start): what the channel had there is unknown here. Past it,
    /// every record this node read was applied to the channel. `None` until
    /// the reader has said where it starts (`Hub::reading_from`).
    pub(super) known_from: Option<u64>,
}

/// What a channel dropped by a sweep (or its last unsubscribe) leaves behind,
/// so that its next use continues its positions instead of forgetting them.
pub(super) struct Tomb {
    pub(super) epoch: u64,
    pub(super) seq: u64,
    pub(super) untagged_last: u64,
    /// Per audience, its last position (as many as are tracked beyond the
    /// rest, up to [`TRACKED_AUDIENCES`]).
    pub(super) tagged_last: Vec<(Arc<str>, u64)>,
    /// The highest last position of audiences not kept in `tagged_last`.
    pub(super) forgotten_last: u64,
    pub(super) shared_epoch: bool,
    pub(super) rebased: bool,
    pub(super) known_from: Option<u64>,
    pub(super) marks: Vec<Mark>,
}

/// Tombs a hub keeps at most; past it the oldest half is forgotten (a resume
/// on such a channel then gets a conservative `gap`, never silence).
pub(super) const MAX_TOMBS: usize = 65_536;

/// A session in a channel's live set.
pub(super) struct Subscriber {
    pub(super) handle: Arc<SessionHandle>,
    /// Positions up to here are not sent: the session has them (it resumed
    /// from there, possibly on a node that had read further than this one),
    /// or was told they are a gap (see `Hub::subscribe`).
    pub(super) floor: u64,
    /// The session's position is not settled yet (see [`Pending`]).
    pub(super) pending: PendingSlot,
}

/// An `Option<Pending>` in one word (a subscriber is kept per subscription:
/// its size is per-connection memory): `u64::MAX` for none, the top bit for
/// `fresh`, positions below 2^63.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PendingSlot(pub(super) u64);

impl PendingSlot {
    pub(super) const NONE: PendingSlot = PendingSlot(u64::MAX);
    pub(super) const FRESH: u64 = 1 << 63;

    pub(super) fn of(p: Pending) -> PendingSlot {
        let since = p.since.min(Self::FRESH - 1);
        PendingSlot(if p.fresh { since | Self::FRESH } else { since })
    }

    pub(super) fn is_some(self) -> bool {
        self != Self::NONE
    }

    pub(super) fn take(&mut self) -> Option<Pending> {
        if !self.is_some() {
            return None;
        }
        let v = std::mem::replace(self, Self::NONE).0;
        Some(Pending {
            since: v & !Self::FRESH,
            fresh: v & Self::FRESH != 0,
        })
    }
}

/// A subscription made before this node could account for what precedes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    /// The position the session has.
    pub(super) since: u64,
    /// A fresh subscription (no resume) made while the reader's start was
    /// unknown: only a reader that began past records it did not read
    /// (Kafka `latest`, an outbox's newest row) can have skipped some of
    /// what came after it.
    pub(super) fresh: bool,
}

/// The epoch of channel `name` of a source known by `seed`: the same on
/// every node (and every Herald version), small enough for JavaScript.
pub(super) fn shared_epoch(seed: u64, name: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(seed.to_be_bytes());
    h.update(name.as_bytes());
    let d = h.finalize();
    (u64::from_be_bytes(d[..8].try_into().unwrap_or_default()) >> 12).max(1)
}

/// The epoch a channel takes when it rebases at `at` with `seq` published.
pub(super) fn rebased_epoch(epoch: u64, seq: u64, at: At) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for n in [epoch, seq, at.pos.stream as u64, at.pos.number, at.index] {
        h.update(n.to_be_bytes());
    }
    let d = h.finalize();
    (u64::from_be_bytes(d[..8].try_into().unwrap_or_default()) >> 12).max(1)
}

impl Channel {
    pub(super) fn new(name: Arc<str>, seed: Option<u64>, known_from: Option<u64>) -> Channel {
        Channel {
            epoch: seed.map_or_else(new_epoch, |s| shared_epoch(s, &name)),
            shared_epoch: seed.is_some(),
            name,
            seq: 0,
            history: VecDeque::new(),
            history_bytes: 0,
            subscribers: IndexMap::new(),
            marks: Vec::new(),
            untagged_last: 0,
            tagged_last: HashMap::new(),
            forgotten_last: 0,
            rebased: false,
            known_from,
        }
    }

    /// The channel as its tomb left it: the same epoch and positions, no
    /// history (it had none left, or the sweep would have kept it).
    pub(super) fn revive(name: Arc<str>, t: Tomb) -> Channel {
        Channel {
            epoch: t.epoch,
            shared_epoch: t.shared_epoch,
            seq: t.seq,
            untagged_last: t.untagged_last,
            tagged_last: t.tagged_last.into_iter().collect(),
            forgotten_last: t.forgotten_last,
            rebased: t.rebased,
            known_from: t.known_from,
            marks: t.marks,
            ..Channel::new(name, None, None)
        }
    }

    pub(super) fn tomb(&mut self) -> Tomb {
        // A few audiences are kept as they are; a plugin tagging per user
        // leaves one number for all of them.
        let (tagged_last, forgotten_last) = if self.tagged_last.len() <= TRACKED_AUDIENCES {
            (self.tagged_last.drain().collect(), self.forgotten_last)
        } else {
            let max = self.tagged_last.values().copied().max().unwrap_or(0);
            (Vec::new(), self.forgotten_last.max(max))
        };
        Tomb {
            epoch: self.epoch,
            seq: self.seq,
            untagged_last: self.untagged_last,
            tagged_last,
            forgotten_last,
            shared_epoch: self.shared_epoch,
            rebased: self.rebased,
            known_from: self.known_from,
            marks: std::mem::take(&mut self.marks),
        }
    }

    /// Starts the channel over in another position space (a new source):
    /// nothing of the old one means anything there. Its subscribers are told
    /// the new epoch by an `ack` without an id.
    pub(super) fn restart(&mut self, seed: Option<u64>, total: &AtomicUsize) {
        self.forget(total);
        self.epoch = seed.map_or_else(new_epoch, |s| shared_epoch(s, &self.name));
        self.shared_epoch = seed.is_some();
        self.seq = 0;
        self.untagged_last = 0;
        self.tagged_last.clear();
        self.forgotten_last = 0;
        self.marks.clear();
        self.rebased = false;
        self.known_from = None;
        self.announce_epoch();
    }

    /// Tells every subscriber the channel's epoch changed (a rebase, a new
    /// source): an `ack` without an id restates the subscription. Floors of
    /// the old epoch mean nothing in the new one.
    pub(super) fn announce_epoch(&mut self) {
        let lasts = self.subscriber_lasts();
        for (s, head) in self.subscribers.values_mut().zip(lasts) {
            s.floor = 0;
            s.pending = PendingSlot::NONE;
            // Each session's own last position: an audience's variants
            // carry their own `prev`.
            let json = proto::encode_ack(None, Some((&self.name, self.epoch, head)));
            s.handle.deliver_ctrl("ack", &json);
        }
    }

    pub(super) fn trim(&mut self, limits: HistoryLimits, now_ms: u64, total: &AtomicUsize) {
        let before = self.history_bytes;
        while let Some(front) = self.history.front() {
            let expired = now_ms.saturating_sub(front[0].at_ms) > limits.max_age_ms;
            if self.history.len() > limits.max_messages
                || self.history_bytes > limits.max_bytes
                || expired
            {
                self.history_bytes -= entry_bytes(front);
                self.history.pop_front();
            } else {
                break;
            }
        }
        total.fetch_sub(before - self.history_bytes, Ordering::Relaxed);
    }

    /// Drops the whole history (the tenant's histories are full).
    pub(super) fn forget(&mut self, total: &AtomicUsize) {
        total.fetch_sub(self.history_bytes, Ordering::Relaxed);
        self.history_bytes = 0;
        self.history.clear();
    }

    /// Each subscriber's last position (`last_for` its audience), in the
    /// subscribers' order.
    pub(super) fn subscriber_lasts(&self) -> Vec<u64> {
        self.subscribers
            .values()
            .map(|s| self.last_for(s.handle.audience()))
            .collect()
    }

    /// The last position sessions of `audience` were sent.
    pub(super) fn last_for(&self, audience: Option<&str>) -> u64 {
        match audience {
            Some(a) => match self.tagged_last.get(a) {
                Some(&t) => t.max(self.untagged_last),
                None => self.untagged_last.max(self.forgotten_last),
            },
            None => self.untagged_last,
        }
    }

    /// Notes that the channel has had `at` (and everything of its stream
    /// before it); false when it had already.
    pub(super) fn mark(&mut self, at: At) -> bool {
        match self.marks.iter_mut().find(|m| m.stream == at.pos.stream) {
            Some(m) if at.order() <= m.last => false,
            Some(m) => {
                m.last = at.order();
                true
            }
            None => {
                self.marks.push(Mark {
                    stream: at.pos.stream,
                    last: at.order(),
                });
                true
            }
        }
    }

    /// The position for a message at `at` that also stands for `also` (a
    /// conflated message), or why there is none.
    pub(super) fn position(
        &mut self,
        at: Option<At>,
        also: &[At],
        below: u64,
        report: &mut PublishReport,
    ) -> Result<u64, Duplicate> {
        if at.is_some_and(|at| !self.mark(at)) {
            return Err(Duplicate);
        }
        for a in also {
            self.mark(*a);
        }
        let Some(at) = at else {
            return Ok(self.seq + 1);
        };
        let derived = at.seq();
        // The channel's last position, or what a late record comes below
        // (`below`: read before it, on any channel).
        let base = self.seq.max(below);
        if derived > base {
            return Ok(derived);
        }
        report.rebased = true;
        report.first_rebase = !self.rebased;
        self.rebased = true;
        if self.shared_epoch {
            // Numbers from here on follow this node's channel, not the source
            // alone: a new epoch, derived from where the rebase happened, so
            // nodes whose channel was in the same state agree on it, and a
            // client holding the old epoch's numbers gets a gap, never
            // another numbering's positions.
            self.epoch = rebased_epoch(self.epoch, base, at);
            self.shared_epoch = false;
            self.announce_epoch();
        }
        Ok(base + 1)
    }

    /// Encodes `variants` at `seq`: each tagged variant with its audience's
    /// previous position, the untagged one once for the rest and once more
    /// per group of audiences whose previous position differs.
    pub(super) fn encode(
        &self,
        seq: u64,
        key: Option<&Arc<str>>,
        variants: &[Variant<'_>],
        now_ms: u64,
    ) -> Vec<Arc<Published>> {
        let frame = |prev: u64, v: &Variant<'_>, serves: Serves| {
            let json = proto::encode_msg(&self.name, seq, prev, v.payload, v.kind);
            Arc::new(Published {
                ch: self.name.clone(),
                epoch: self.epoch,
                seq,
                prev,
                key: key.cloned(),
                serves,
                at_ms: now_ms,
                ws: ws::encode_frame(ws::OpCode::Text, json.as_bytes()),
                sse: sse::encode_event_body("msg", &json),
                deflated: std::sync::OnceLock::new(),
            })
        };
        let mut out = Vec::with_capacity(variants.len());
        for v in variants {
            match v.audience {
                Some(a) => out.push(frame(self.last_for(Some(a)), v, Serves::Audience(a.into()))),
                None => {
                    // Audiences no longer tracked may have been sent up to
                    // `forgotten_last`: the rest's `prev` says so (a gap shown
                    // too eagerly once, never one hidden).
                    let rest = self.untagged_last.max(self.forgotten_last);
                    out.push(frame(rest, v, Serves::Rest));
                    if self.tagged_last.is_empty() {
                        continue;
                    }
                    // Audiences sent a tagged-only position since the last
                    // untagged one, grouped by that position.
                    let mut ahead: Vec<(u64, Arc<str>)> = self
                        .tagged_last
                        .iter()
                        .filter(|(a, &t)| {
                            t > rest && !variants.iter().any(|x| x.audience == Some(&***a))
                        })
                        .map(|(a, &t)| (t, a.clone()))
                        .collect();
                    ahead.sort();
                    for group in ahead.chunk_by(|x, y| x.0 == y.0) {
                        let list: Box<[Arc<str>]> = group.iter().map(|(_, a)| a.clone()).collect();
                        out.push(frame(group[0].0, v, Serves::Listed(list)));
                    }
                }
            }
        }
        out
    }

    /// Records that `seq` went to the audiences of `variants`.
    pub(super) fn sent(&mut self, seq: u64, variants: &[Variant<'_>]) {
        self.seq = seq;
        let mut untagged = false;
        for v in variants {
            match v.audience {
                Some(a) => match self.tagged_last.get_mut(a) {
                    Some(t) => *t = seq,
                    None => {
                        self.tagged_last.insert(a.into(), seq);
                    }
                },
                None => untagged = true,
            }
        }
        if untagged {
            self.untagged_last = seq;
        }
        if self.tagged_last.len() > TRACKED_AUDIENCES {
            // An audience not ahead of the rest is the rest.
            let rest = self.untagged_last;
            self.tagged_last.retain(|_, t| *t > rest);
        }
        if self.tagged_last.len() > TRACKED_AUDIENCES * 4 {
            // A plugin tagging per user: keep the most recent. What the
            // forgotten ones were sent is kept as one number: their resume
            // reports a gap too eagerly rather than missing one.
            let mut lasts: Vec<u64> = self.tagged_last.values().copied().collect();
            let (_, &mut cut, _) = lasts.select_nth_unstable_by(TRACKED_AUDIENCES, |a, b| b.cmp(a));
            let mut forgotten = self.forgotten_last;
            self.tagged_last.retain(|_, t| {
                let keep = *t > cut;
                if !keep {
                    forgotten = forgotten.max(*t);
                }
                keep
            });
            self.forgotten_last = forgotten;
        }
    }
}

pub(super) fn new_epoch() -> u64 {
    // Small enough to be exact in a JavaScript number.
    rand::random::<u64>() >> 12
}
