//! herald-fanout, Herald's core without I/O (L1 of ARCHITECTURE.md, "Layers"):
//! per-channel positions and history, and delivery into session queues.
//! This file is the tenant's `Hub` (its channels, what its reader has read,
//! subscribe, publish, sweep); one channel's state is in `channel.rs`.
//!
//! Owns: `seq`/`prev` assignment (the position model: ARCHITECTURE.md,
//! "Positions"), the per-stream marks that recognise a source record
//! published before, the bounded history per channel (count and age) used
//! for resume, the channel epoch, the subscriber sets, and what the resume
//! protocol needs to know: how far this node's reader has read (`start`,
//! `read`, `Hub::skip_to`), where each channel's knowledge starts
//! (`known_from`), what swept channels leave behind (tombs), and each
//! session's floor and pending resume.
//! Invariants: a resume is answered by the protocol of ARCHITECTURE.md,
//! "Positions": nothing at or below a session's floor is sent to it, and
//! whatever this node cannot account for after `since` is a `gap` before
//! anything after it; an epoch change reaches live subscribers as an `ack`
//! without an id; a message is encoded once per wire format (and once per
//! distinct `prev` among audiences) and shared by every subscriber
//! (`Arc<Published>`); `seq` only increases within an epoch; a message is
//! dropped as a duplicate only when its own source position (stream, order,
//! index) was already published on the channel; a frame's `prev` is the
//! previous position the receiving session's audience was sent, so a session
//! tells a lost message from one that was not for it; history keeps or drops
//! a position with all its variants together; subscribing replays history
//! and joins the live set under one channel lock, so no message is missed or
//! duplicated between the two; a channel is swept only while nobody else
//! holds it, so a subscriber never joins a dead channel, and leaves a tomb
//! (bounded per hub) so its next use continues its positions. Publishing
//! never waits on a socket: it only pushes into bounded session queues.
//! Never: lets the read horizon fall below what was read (too high is a gap
//! reported too eagerly; too low would be one missed).

mod channel;
pub mod conflate;
pub mod deliver;
#[cfg(test)]
mod model;
pub mod position;
mod published;
pub mod queue;
pub mod registry;
mod report;
mod resume;
pub mod session;

use channel::{entry_bytes, Channel, Entry, Pending, PendingSlot, Tomb, MAX_TOMBS};
use herald_proto::{self as proto, PayloadKind};
use parking_lot::Mutex;
use position::{SourcePos, MESSAGES_PER_RECORD};
use session::{Delivery, SessionHandle};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// How much history each channel keeps for resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Positions kept (a position with several audience variants counts once).
    pub max_messages: usize,
    pub max_age_ms: u64,
    /// Encoded bytes one channel's history may hold.
    pub max_bytes: usize,
    /// Encoded bytes the histories of all the tenant's channels may hold
    /// together: a message that would pass it is sent live but not kept,
    /// and its channel's history is cleared (a resume across it gets a
    /// `gap`, never a silent hole).
    pub tenant_max_bytes: usize,
}

/// A message to publish into one channel.
pub struct NewMessage<'a> {
    pub ch: &'a str,
    pub payload: &'a [u8],
    pub kind: PayloadKind,
    pub key: Option<&'a str>,
}

/// One audience's version of a message; all variants share one position.
#[derive(Debug, Clone, Copy)]
pub struct Variant<'a> {
    pub payload: &'a [u8],
    pub kind: PayloadKind,
    pub audience: Option<&'a str>,
}

/// A message ready to publish: one position, one or more audience variants,
/// borrowed from the source records or the plugin's output buffer.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub channel: &'a str,
    pub key: Option<&'a str>,
    pub variants: Vec<Variant<'a>>,
    /// Where the message sits in its source; `None` for HTTP publish.
    pub at: Option<At>,
}

/// A message's place in its source: the record's position and which of the
/// record's messages to this channel it is (0 for the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    pub pos: SourcePos,
    pub index: u64,
}

impl At {
    /// The `seq` the message takes when the channel has not passed it.
    pub fn seq(&self) -> u64 {
        self.pos.number * MESSAGES_PER_RECORD + self.index
    }

    pub(crate) fn order(&self) -> ((u64, u64), u64) {
        (self.pos.order, self.index)
    }
}

/// The frame a session of `audience` receives out of one position's frames.
fn pick<'a>(frames: &'a [Arc<Published>], audience: Option<&str>) -> Option<&'a Arc<Published>> {
    if let [only] = frames {
        if only.serves == Serves::Rest {
            return Some(only);
        }
    }
    if let Some(a) = audience {
        let own = frames.iter().find(|f| match &f.serves {
            Serves::Audience(x) => &**x == a,
            Serves::Listed(list) => list.iter().any(|x| &**x == a),
            Serves::Rest => false,
        });
        if own.is_some() {
            return own;
        }
    }
    frames.iter().find(|f| f.serves == Serves::Rest)
}

/// What a subscribe found, so the session can answer the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeResult {
    /// The channel's name, shared: a session keeps this one, not a copy.
    pub name: Arc<str>,
    pub epoch: u64,
    /// The last position the session's audience was sent at the moment of
    /// joining: the `prev` of the next message it gets live.
    pub head: u64,
    /// Positions the history could not cover, as `(from, to)` inclusive.
    pub gap: Option<(u64, u64)>,
    pub replayed: usize,
}

/// A channel's history as the admin API shows it (`Hub::history`).
#[derive(Debug)]
pub struct HistoryView {
    pub epoch: u64,
    /// The channel's last position.
    pub head: u64,
    /// The oldest position history still holds.
    pub oldest: Option<u64>,
    /// Each position's frames: one per audience variant (and `prev`).
    pub positions: Vec<Box<[Arc<Published>]>>,
}

pub use published::{deflate_frame, Published, Serves};
pub use report::PublishReport;

/// The channel already published this source position: nothing was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duplicate;

/// The last position of a record `number` (all its messages), in `seq` units.
fn upto(number: u64) -> u64 {
    if number == 0 {
        0
    } else {
        number
            .saturating_mul(MESSAGES_PER_RECORD)
            .saturating_add(MESSAGES_PER_RECORD - 1)
    }
}

/// `Hub::start` before the reader has said where it starts.
const UNKNOWN: u64 = u64::MAX;

fn key_of(s: &Arc<SessionHandle>) -> usize {
    Arc::as_ptr(s) as usize
}

/// All channels of one tenant.
pub struct Hub {
    channels: Mutex<HashMap<Arc<str>, Arc<Mutex<Channel>>>>,
    /// Encoded bytes of every channel's history together.
    history_bytes: AtomicUsize,
    /// The source's epoch seed (`new_source`); `None`: every channel picks a
    /// random epoch (positions of this node alone).
    seed: Mutex<Option<u64>>,
    /// Positions up to here (`seq` units) were read before this node's
    /// reader started: by an earlier process, or never by this node (a node
    /// new to the source starts past them). [`UNKNOWN`] until the reader says.
    start: AtomicU64,
    /// The highest position this node's reader has read (`start` at least).
    read: AtomicU64,
    /// Records after this order (one stream) were never read by an earlier
    /// process of this node (`read_after`): one of them numbered below what
    /// was read before it is a late record. `None`: not known (no check).
    after: Mutex<Option<(u64, u64)>>,
    /// The highest position published in reading order by this process, or
    /// what its start says was read before: a late record comes below it.
    /// (`read` moves a whole batch ahead of its records.)
    ordered: AtomicU64,
    /// The first stream read (+1; 0: none yet), and whether another was:
    /// with several streams, `read` is the highest of unrelated number
    /// spaces, so it says nothing exact about any one channel's stream.
    stream: AtomicU64,
    several: std::sync::atomic::AtomicBool,
    /// The reader began past records it did not read (`reading_from`).
    skipped: std::sync::atomic::AtomicBool,
    /// What channels dropped while empty left behind (see [`Tomb`]).
    tombs: Mutex<HashMap<Arc<str>, Tomb>>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            channels: Mutex::new(HashMap::new()),
            history_bytes: AtomicUsize::new(0),
            seed: Mutex::new(None),
            start: AtomicU64::new(UNKNOWN),
            read: AtomicU64::new(0),
            after: Mutex::new(None),
            ordered: AtomicU64::new(0),
            stream: AtomicU64::new(0),
            several: std::sync::atomic::AtomicBool::new(false),
            skipped: std::sync::atomic::AtomicBool::new(false),
            tombs: Mutex::new(HashMap::new()),
        }
    }
}

impl Hub {
    /// The channel, created when missing. The clone handed out keeps the
    /// sweeper away until the caller drops it.
    fn channel(&self, name: &str) -> Arc<Mutex<Channel>> {
        let mut map = self.channels.lock();
        if let Some(c) = map.get(name) {
            return c.clone();
        }
        let name: Arc<str> = name.into();
        let channel = match self.tombs.lock().remove(&name) {
            Some(t) => Channel::revive(name.clone(), t),
            None => {
                // Every record read from here on reaches this channel; what
                // was read before is unknown to it.
                let known = (self.start.load(Ordering::Acquire) != UNKNOWN)
                    .then(|| self.read.load(Ordering::Acquire));
                Channel::new(name.clone(), *self.seed.lock(), known)
            }
        };
        let c = Arc::new(Mutex::new(channel));
        map.insert(name, c.clone());
        c
    }

    /// True when `ch` already published the source position `at`.
    pub fn has(&self, ch: &str, at: At) -> bool {
        let Some(chan) = self.channels.lock().get(ch).cloned() else {
            return false;
        };
        let c = chan.lock();
        c.marks
            .iter()
            .any(|m| m.stream == at.pos.stream && at.order() <= m.last)
    }

    /// Number of channels currently held (with subscribers or history).
    pub fn channel_count(&self) -> usize {
        self.channels.lock().len()
    }

    /// Whether a subscriber may use `ch`: it exists, or fewer than `max`
    /// channels do (a client looping over fresh names cannot grow the map).
    pub fn may_open(&self, ch: &str, max: usize) -> bool {
        let map = self.channels.lock();
        map.len() < max || map.contains_key(ch)
    }

    /// Encoded bytes the tenant's channel histories hold.
    pub fn history_bytes(&self) -> usize {
        self.history_bytes.load(Ordering::Relaxed)
    }

    /// Assigns the next position, records history, and queues the frame for
    /// every subscriber. Never waits on a socket.
    pub fn publish(
        &self,
        msg: NewMessage<'_>,
        limits: HistoryLimits,
        now_ms: u64,
    ) -> (u64, PublishReport) {
        let m = Message {
            channel: msg.ch,
            key: msg.key,
            variants: vec![Variant {
                payload: msg.payload,
                kind: msg.kind,
                audience: None,
            }],
            at: None,
        };
        self.publish_at(&m, &[], limits, now_ms)
            .expect("a position the hub assigns is always new")
    }

    /// Publishes one message in per-audience variants under one position:
    /// the source's (`at`: every node gives the message the same `seq`), or
    /// the channel's next when `None`. A source position this channel already
    /// published from the same stream is a [`Duplicate`]: nothing happens.
    /// `also` are positions of other streams the message stands for (a
    /// conflation of several), marked as had.
    pub fn publish_at(
        &self,
        m: &Message<'_>,
        also: &[At],
        limits: HistoryLimits,
        now_ms: u64,
    ) -> Result<(u64, PublishReport), Duplicate> {
        let chan = self.channel(m.channel);
        let mut c = chan.lock();
        let mut report = PublishReport::default();
        // A late record (one stream: an outbox row whose transaction drew
        // its id before rows already read and committed after them, and
        // after this process began) comes below positions a client may hold
        // even on a channel this node made only now: it rebases past what
        // was read before it, as the channel would had it been here all along.
        let late_past = match m.at {
            Some(at) if !self.several.load(Ordering::Acquire) => {
                let ordered = self.ordered.load(Ordering::Acquire);
                let new = self.after.lock().is_some_and(|o| at.pos.order > o);
                (new && at.seq() <= ordered).then_some(ordered)
            }
            _ => None,
        };
        let seq = c.position(m.at, also, late_past.unwrap_or(0), &mut report)?;
        if let Some(at) = m.at {
            self.ordered.fetch_max(at.seq(), Ordering::AcqRel);
        }
        let key: Option<Arc<str>> = m.key.map(Into::into);
        let frames = c.encode(seq, key.as_ref(), &m.variants, now_ms);
        c.sent(seq, &m.variants);
        let unknown_below = self.known_from(&mut c).unwrap_or(UNKNOWN);
        let name = c.name.clone();
        c.subscribers.retain(|_, s| {
            if seq <= s.floor {
                // The node is behind the session: it reads on from here,
                // so nothing after `since` is unknown to it.
                if s.pending.is_some() {
                    s.pending = PendingSlot::NONE;
                }
                return true;
            }
            let Some(p) = pick(&frames, s.handle.audience()) else {
                return true;
            };
            if let Some(Pending { since, fresh }) = s.pending.take() {
                // The session's first message here: what came between its
                // `since` and this may have been read before this node knew
                // the channel.
                let may_miss = !fresh || self.skipped.load(Ordering::Acquire);
                if may_miss && unknown_below > since && seq - 1 > since {
                    s.handle
                        .deliver_ctrl("gap", &proto::encode_gap(&name, since + 1, seq - 1));
                }
            }
            let d = s.handle.deliver_msg(p);
            report.add(d);
            !matches!(d, Delivery::Disconnected | Delivery::Closed)
        });
        if limits.max_messages > 0 {
            let size = entry_bytes(&frames);
            if self.history_bytes.load(Ordering::Relaxed) + size > limits.tenant_max_bytes {
                c.forget(&self.history_bytes);
                report.not_kept = true;
            } else {
                self.history_bytes.fetch_add(size, Ordering::Relaxed);
                c.history_bytes += size;
                c.history.push_back(frames.into_boxed_slice());
            }
        }
        c.trim(limits, now_ms, &self.history_bytes);
        Ok((seq, report))
    }

    /// What `ch`'s history holds after `since`, oldest first, at most
    /// `limit` positions (each with all its variants); `None` when the
    /// channel does not exist. Trims by the tenant's limits first, as a
    /// subscribe would, so it shows what a resume would replay.
    pub fn history(
        &self,
        ch: &str,
        since: u64,
        limit: usize,
        limits: HistoryLimits,
        now_ms: u64,
    ) -> Option<HistoryView> {
        let chan = self.channels.lock().get(ch).cloned()?;
        let mut c = chan.lock();
        c.trim(limits, now_ms, &self.history_bytes);
        let positions: Vec<Entry> = c
            .history
            .iter()
            .filter(|e| e[0].seq > since)
            .take(limit)
            .cloned()
            .collect();
        Some(HistoryView {
            epoch: c.epoch,
            head: c.seq,
            oldest: c.history.front().map(|e| e[0].seq),
            positions,
        })
    }

    /// Leaves `ch`; a channel left with neither subscribers nor history is
    /// dropped at once (sub/unsub over fresh names leaves nothing behind).
    pub fn unsubscribe(&self, ch: &str, session: &Arc<SessionHandle>) {
        let Some(chan) = self.channels.lock().get(ch).cloned() else {
            return;
        };
        let unused = {
            let mut c = chan.lock();
            c.subscribers.swap_remove(&key_of(session));
            c.subscribers.is_empty() && c.history.is_empty()
        };
        if unused {
            self.remove_if_unused(ch, &chan);
        }
    }

    /// Removes `chan` from the map if it is still there and unused, and
    /// only the map and the caller hold it: nobody got it from `channel()`
    /// to publish or subscribe through it meanwhile. Lock order: the map,
    /// then a channel (never the other way round).
    fn remove_if_unused(&self, name: &str, chan: &Arc<Mutex<Channel>>) -> bool {
        let mut map = self.channels.lock();
        if !map.get(name).is_some_and(|c| Arc::ptr_eq(c, chan)) || Arc::strong_count(chan) != 2 {
            return false;
        }
        let mut c = chan.lock();
        if !(c.subscribers.is_empty() && c.history.is_empty()) {
            return false;
        }
        let tomb = c.tomb();
        drop(c);
        if let Some((name, _)) = map.remove_entry(name) {
            let mut tombs = self.tombs.lock();
            if tombs.len() >= MAX_TOMBS {
                // Forget some: a resume on one of them is a gap, not silence.
                let drop_n = MAX_TOMBS / 2;
                let victims: Vec<Arc<str>> = tombs.keys().take(drop_n).cloned().collect();
                for v in victims {
                    tombs.remove(&v);
                }
            }
            tombs.insert(name, tomb);
        }
        true
    }

    /// Forgets every tomb (what a full tomb map does to the oldest).
    #[cfg(test)]
    pub(crate) fn drop_tombs(&self) {
        self.tombs.lock().clear();
    }

    /// The seed `new_source` last set.
    pub fn seed(&self) -> Option<u64> {
        *self.seed.lock()
    }

    /// Drops channels that have neither subscribers nor live history and that
    /// nobody is about to use; their next use starts a new epoch.
    /// Never holds the map while it trims: publishes and subscribes to other
    /// channels go on between its steps.
    pub fn sweep(&self, limits: HistoryLimits, now_ms: u64) -> usize {
        let all: Vec<(Arc<str>, Arc<Mutex<Channel>>)> = self
            .channels
            .lock()
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect();
        let mut removed = 0;
        for (name, chan) in all {
            let unused = {
                let mut c = chan.lock();
                c.trim(limits, now_ms, &self.history_bytes);
                c.subscribers.is_empty() && c.history.is_empty()
            };
            if unused && self.remove_if_unused(&name, &chan) {
                removed += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests;
