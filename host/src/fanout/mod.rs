//! Fan-out: per-channel positions and history, and delivery into session queues.
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
pub mod queue;
pub mod session;

use crate::proto::{self, PayloadKind};
use bytes::Bytes;
use channel::{entry_bytes, Channel, Entry, Pending, PendingSlot, Subscriber, Tomb, MAX_TOMBS};
use parking_lot::Mutex;
use position::{SourcePos, MESSAGES_PER_RECORD};
use queue::Wire;
use session::{Delivery, SessionHandle};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Which sessions a frame is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serves {
    /// Sessions of this audience: the plugin tagged the variant.
    Audience(Arc<str>),
    /// Every session without a variant of its own.
    Rest,
    /// The untagged variant, for these audiences only: they were sent a
    /// position the rest were not, so their `prev` differs.
    Listed(Box<[Arc<str>]>),
}

/// One frame of one message of one channel, encoded once for each wire format.
#[derive(Debug)]
pub struct Published {
    pub ch: Arc<str>,
    pub epoch: u64,
    pub seq: u64,
    /// The previous position the sessions this frame serves were sent.
    pub prev: u64,
    /// Conflation key given by the publisher.
    pub key: Option<Arc<str>>,
    pub serves: Serves,
    /// Publish time, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The complete WebSocket text frame.
    pub ws: Bytes,
    /// The SSE event body without its `id:` line.
    pub sse: Bytes,
}

impl Published {
    pub fn wire_bytes(&self, wire: Wire) -> &Bytes {
        match wire {
            Wire::Ws => &self.ws,
            Wire::Sse => &self.sse,
        }
    }

    #[cfg(test)]
    pub(crate) fn for_test(ch: &str, seq: u64, key: Option<&str>, size: usize) -> Published {
        Published {
            ch: ch.into(),
            epoch: 1,
            seq,
            prev: seq.saturating_sub(1),
            key: key.map(Into::into),
            serves: Serves::Rest,
            at_ms: 0,
            ws: Bytes::from(vec![b'x'; size]),
            sse: Bytes::from(vec![b'x'; size]),
        }
    }
}

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
pub struct Outgoing<'a> {
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

impl Published {
    /// The message as a JSON object (`{"op":"msg","ch",…}`): the text of
    /// its WebSocket frame (server frames are unmasked).
    pub fn json(&self) -> &[u8] {
        let len7 = self.ws.get(1).map_or(0, |b| b & 0x7f);
        let start = match len7 {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        self.ws.get(start..).unwrap_or_default()
    }
}

/// Counts of what a publish did, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PublishReport {
    pub delivered: usize,
    pub conflated: usize,
    pub dropped: usize,
    pub disconnected: usize,
    /// The source position was behind the channel's (another stream fed it
    /// further): published at the channel's next position instead.
    pub rebased: bool,
    /// This publish was the channel's first rebase: worth one log line.
    pub first_rebase: bool,
    /// The tenant's histories were full: the message was not kept (and its
    /// channel's history was cleared).
    pub not_kept: bool,
}

impl PublishReport {
    fn add(&mut self, d: Delivery) {
        match d {
            Delivery::Queued => self.delivered += 1,
            Delivery::Conflated(n) => {
                self.delivered += 1;
                self.conflated += n;
            }
            Delivery::DroppedOldest(n) => {
                self.delivered += 1;
                self.dropped += n;
            }
            Delivery::Disconnected => self.disconnected += 1,
            Delivery::Closed => {}
        }
    }
}

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

    /// The reader starts: records up to `number` (a source number: outbox
    /// id, Kafka offset + 1; the highest over its `streams`) were read
    /// before, by an earlier process, or lie before where this node begins.
    /// Called before the reader hands ingest anything. Channels made before
    /// now learn it, and sessions that resumed on them meanwhile get their
    /// gap (with one stream; with several, at their first message).
    /// `skipped`: the reader began past records it did not read (no stored
    /// position): a session that subscribed while the start was unknown may
    /// have missed some of them and is told so.
    pub fn reading_from(&self, number: u64, streams: usize, skipped: bool) {
        if streams > 1 {
            self.several.store(true, Ordering::Release);
        }
        if skipped {
            self.skipped.store(true, Ordering::Release);
        }
        let at = upto(number);
        let _ = self
            .start
            .compare_exchange(UNKNOWN, at, Ordering::AcqRel, Ordering::Acquire);
        self.read.fetch_max(at, Ordering::AcqRel);
        let start = self.start.load(Ordering::Acquire);
        let several = self.several.load(Ordering::Acquire);
        let channels: Vec<_> = self.channels.lock().values().cloned().collect();
        for chan in channels {
            let mut c = chan.lock();
            let known = *c.known_from.get_or_insert(start);
            if several {
                continue;
            }
            let name = c.name.clone();
            for s in c.subscribers.values_mut() {
                let Some(Pending { since, fresh }) = s.pending.take() else {
                    continue;
                };
                if (!fresh || skipped) && since < known {
                    s.handle
                        .deliver_ctrl("gap", &proto::encode_gap(&name, since + 1, known));
                    s.floor = s.floor.max(known);
                }
            }
        }
    }

    /// The reader could not read records of `stream` up to `number` (the
    /// shared log's retention deleted them, a Kafka offset fell out of
    /// range): they are unknown here. Every session of a channel they may
    /// have fed is told so by a `gap` up to them (and will not be sent
    /// anything at or below), and such a channel's chain goes on from there,
    /// so a later resume below it is a gap too. Called before the reader
    /// reads on past them.
    pub fn skip_to(&self, stream: u32, number: u64) {
        let k = upto(number);
        self.read.fetch_max(k, Ordering::AcqRel);
        let several = self.several.load(Ordering::Acquire);
        // A revived channel would continue a chain that does not know.
        self.tombs.lock().clear();
        let channels: Vec<_> = self.channels.lock().values().cloned().collect();
        for chan in channels {
            let mut c = chan.lock();
            let fed = c.marks.iter().any(|m| m.stream == stream);
            let known = c.known_from.unwrap_or(0).max(k);
            c.known_from = Some(known);
            if several && !fed {
                // Several streams and no sign of which feeds it: its
                // sessions' next message settles it (`Pending`).
                let lasts = c.subscriber_lasts();
                for (s, last) in c.subscribers.values_mut().zip(lasts) {
                    if !s.pending.is_some() {
                        s.pending = PendingSlot::of(Pending {
                            since: s.floor.max(last),
                            fresh: false,
                        });
                    }
                }
                continue;
            }
            let name = c.name.clone();
            let lasts = c.subscriber_lasts();
            for (s, last) in c.subscribers.values_mut().zip(lasts) {
                let from = s.floor.max(last) + 1;
                if k >= from {
                    s.handle
                        .deliver_ctrl("gap", &proto::encode_gap(&name, from, k));
                }
                s.floor = s.floor.max(k);
                s.pending = PendingSlot::NONE;
            }
            c.seq = c.seq.max(k);
            c.untagged_last = c.untagged_last.max(k);
            for t in c.tagged_last.values_mut() {
                *t = (*t).max(k);
            }
            c.forgotten_last = c.forgotten_last.max(k);
        }
    }

    /// Whether the reader has said where it starts.
    pub fn started(&self) -> bool {
        self.start.load(Ordering::Acquire) != UNKNOWN
    }

    /// The reader has read a record at `number` of `stream` (called before
    /// the record is published).
    pub fn read_to(&self, stream: u32, number: u64) {
        let tag = stream as u64 + 1;
        match self
            .stream
            .compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(first) if first != tag => self.several.store(true, Ordering::Release),
            Err(_) => {}
        }
        self.read.fetch_max(upto(number), Ordering::AcqRel);
    }

    /// Where the channel's knowledge starts, once the reader's start is known.
    fn known_from(&self, c: &mut Channel) -> Option<u64> {
        if c.known_from.is_none() {
            let start = self.start.load(Ordering::Acquire);
            if start != UNKNOWN {
                c.known_from = Some(start);
            }
        }
        c.known_from
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
        msg: Outgoing<'_>,
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
        let seq = c.position(m.at, also, &mut report)?;
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

    /// Replays history after `since` (when given) and joins the live set.
    /// `before_replay(epoch, head)` runs under the channel lock before any
    /// replayed frame is queued, so the session's ack precedes its messages.
    ///
    /// A resume (`since`, `epoch`) is answered by the rule of ARCHITECTURE.md
    /// "Positions": on the source's shared epoch, nothing at or below `since`
    /// is sent again (the session's floor); history after it is replayed; and
    /// whatever this node cannot account for after `since` — positions it
    /// read before it knew the channel, history it no longer holds — is a
    /// `gap`, sent before the replay, and raises the floor. A node that has
    /// not read as far as `since` defers the rest to its reader. With another
    /// epoch, the client's positions mean nothing here: everything it cannot
    /// have is a gap, and history is replayed from its start.
    pub fn subscribe(
        &self,
        ch: &str,
        session: &Arc<SessionHandle>,
        resume: Option<(u64, Option<u64>)>,
        limits: HistoryLimits,
        now_ms: u64,
        before_replay: impl FnOnce(u64, u64),
    ) -> SubscribeResult {
        let chan = self.channel(ch);
        let mut c = chan.lock();
        c.trim(limits, now_ms, &self.history_bytes);
        let known = self.known_from(&mut c);
        let audience = session.audience();
        let head = c.last_for(audience);
        let mut result = SubscribeResult {
            epoch: c.epoch,
            head,
            gap: None,
            replayed: 0,
        };
        let mut sub = Subscriber {
            handle: session.clone(),
            floor: 0,
            pending: PendingSlot::NONE,
        };
        if let Some((since, epoch)) = resume {
            let same_epoch = epoch.is_none_or(|e| e == c.epoch);
            // The positions after which the client wants everything.
            let since = match (same_epoch, c.shared_epoch) {
                (false, _) => 0,
                (true, true) => since,
                // This node's own numbers: a position past them is not ours.
                (true, false) if since > c.seq => 0,
                (true, false) => since,
            };
            let frames: Vec<&Arc<Published>> = c
                .history
                .iter()
                .filter(|e| e[0].seq > since)
                .filter_map(|e| pick(e, audience))
                .collect();
            // The position before the first one history holds for the
            // session, or its last one: what came after `since` up to it and
            // is not held was lost (trimmed, expired, not kept).
            let mut missing = match frames.first() {
                Some(f) => f.prev,
                None => head,
            };
            // A chain of this node's that starts after `since` (no position
            // before it known here, `prev` 0) leaves (since, first) unknown
            // when the node may have read there before it knew the channel
            // (with another epoch too: `since` is 0 then).
            if c.shared_epoch && missing == 0 {
                let several = self.several.load(Ordering::Acquire);
                match (known, frames.first()) {
                    (Some(k), _) if k <= since => {}
                    // One stream: everything up to where the channel's
                    // knowledge starts, and never past its first message.
                    (Some(k), first) if !several => {
                        missing = first.map_or(k, |f| k.min(f.seq - 1));
                    }
                    // Several streams: up to the first message, whose stream
                    // is the channel's.
                    (Some(_), Some(f)) => missing = f.seq - 1,
                    // Not known yet: settled when the reader says where it
                    // starts (one stream) or by the first message.
                    _ => {
                        sub.pending = PendingSlot::of(Pending {
                            since,
                            fresh: false,
                        })
                    }
                }
            }
            let floor = since.max(missing);
            if c.shared_epoch {
                sub.floor = floor;
            }
            result.head = head.max(floor);
            before_replay(c.epoch, result.head);
            if missing > since {
                session.deliver_ctrl("gap", &proto::encode_gap(&c.name, since + 1, missing));
                result.gap = Some((since + 1, missing));
            }
            let mut last = floor;
            for f in frames.iter().filter(|f| f.seq > floor) {
                // A hole inside history (what this node could not read,
                // `skip_to`, between two messages it holds) is said, not
                // left for the client to notice by `prev`.
                if f.prev > last {
                    session.deliver_ctrl("gap", &proto::encode_gap(&c.name, last + 1, f.prev));
                }
                session.deliver_msg(f);
                result.replayed += 1;
                last = f.seq;
            }
            // History ends below the channel's last position for the
            // session: what this node could not read (`skip_to`) lies between.
            if head > last {
                session.deliver_ctrl("gap", &proto::encode_gap(&c.name, last + 1, head));
                if c.shared_epoch {
                    sub.floor = sub.floor.max(head);
                }
            }
        } else {
            if c.shared_epoch && known.is_none() {
                sub.pending = PendingSlot::of(Pending {
                    since: head,
                    fresh: true,
                });
            }
            before_replay(c.epoch, head);
        }
        c.subscribers.insert(key_of(session), sub);
        result
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

    /// A new source feeds the tenant, whose positions are named by `seed`
    /// (the same on every node reading it; `None`: positions of this node
    /// alone). Another seed is another position space: every channel starts
    /// over in it (new epoch, no history, no marks; its subscribers are told
    /// the epoch by an `ack`), and where the new reader starts is unknown
    /// until it says. The same seed again (an edit that keeps the source's
    /// identity) changes nothing: its positions, marks and history stand.
    pub fn new_source(&self, seed: Option<u64>) {
        {
            let mut current = self.seed.lock();
            if *current == seed {
                return;
            }
            *current = seed;
        }
        self.start.store(UNKNOWN, Ordering::Release);
        self.read.store(0, Ordering::Release);
        self.stream.store(0, Ordering::Release);
        self.several.store(false, Ordering::Release);
        self.skipped.store(false, Ordering::Release);
        self.tombs.lock().clear();
        let channels: Vec<_> = self.channels.lock().values().cloned().collect();
        for c in channels {
            c.lock().restart(seed, &self.history_bytes);
        }
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
