//! The resume protocol's half of the `Hub` (ARCHITECTURE.md, "Positions"):
//! what this node's reader has read (`reading_from`, `read_to`, `skip_to`),
//! where a channel's knowledge starts, and `subscribe`, which answers a
//! resume by the rules: a floor at `since`, history after it, and a `gap`
//! for whatever this node cannot account for; and `new_source`, which
//! starts every channel over when the position space changes.
//!
//! Invariants: the read horizon never falls below what was read (too high is
//! a gap reported too eagerly, too low would be one missed); `read_to` is
//! called before a record is published; a session's floor only rises within
//! an epoch. Never: takes the channel map while holding a channel.

use super::channel::{Channel, Pending, PendingSlot, Subscriber};
use super::session::SessionHandle;
use super::{key_of, pick, upto, HistoryLimits, Hub, Published, SubscribeResult, UNKNOWN};
use herald_proto as proto;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Hub {
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
        self.ordered.fetch_max(at, Ordering::AcqRel);
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

    /// The reader (of one stream) starts after `order`: records past it were
    /// never read by an earlier process of this node, and one numbered below
    /// what was read before it is late (see `publish_at`). Records at or
    /// below it that come again (a crash re-reads what a conflation window
    /// held) are not.
    pub fn read_after(&self, order: (u64, u64)) {
        *self.after.lock() = Some(order);
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
    pub(super) fn known_from(&self, c: &mut Channel) -> Option<u64> {
        if c.known_from.is_none() {
            let start = self.start.load(Ordering::Acquire);
            if start != UNKNOWN {
                c.known_from = Some(start);
            }
        }
        c.known_from
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
            name: c.name.clone(),
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
            let since = if same_epoch { since } else { 0 };
            // A rebased epoch is derived from where the rebase happened, so
            // nodes that read the same records name them alike in it; a
            // position past this node's is one it has not read yet, as on
            // the shared epoch: it defers to its reader (the floor).
            let ahead = same_epoch && !c.shared_epoch && since > c.seq;
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
            let several = self.several.load(Ordering::Acquire);
            // A rebased epoch of one stream (a late record's) names the
            // positions up to its rebase as the shared one did: what this
            // node forgot of them is unknown too.
            let rebased_here = c.rebased && !several && known.is_some();
            if (c.shared_epoch || rebased_here) && missing == 0 {
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
            if c.shared_epoch || ahead {
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
        *self.after.lock() = None;
        self.ordered.store(0, Ordering::Release);
        self.stream.store(0, Ordering::Release);
        self.several.store(false, Ordering::Release);
        self.skipped.store(false, Ordering::Release);
        self.tombs.lock().clear();
        let channels: Vec<_> = self.channels.lock().values().cloned().collect();
        for c in channels {
            c.lock().restart(seed, &self.history_bytes);
        }
    }
}
