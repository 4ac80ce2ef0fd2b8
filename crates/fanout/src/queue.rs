//! A session's bounded outbound queue and its overflow policy, without I/O.
//!
//! Owns: the byte bound, the slow-consumer policy, and the accounting that
//! tells the caller what the policy did. Invariants: queued bytes never exceed
//! the bound by more than one control frame (and one `gap` per channel whose
//! oldest messages were dropped: the session is told each drop where it
//! happened, so a channel that stays quiet afterwards shows it too; a message
//! conflated away shows by the `prev` of its newer one, which is always
//! queued behind it); messages of one channel stay in
//! `seq` order (conflation removes the older entry and appends the newer, it
//! never moves a message ahead of another of its channel). An empty queue holds
//! no allocation. Must never block, and never wait on a socket.

use super::Published;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::sync::Arc;

/// What happens when a session's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SlowConsumer {
    /// Keep only the latest message per (channel, conflation key); messages
    /// without a key fall back to dropping the oldest.
    #[default]
    Conflate,
    /// Drop the oldest queued messages to make room.
    DropOldest,
    /// Close the session with close code 4001.
    Disconnect,
}

impl SlowConsumer {
    pub fn as_str(self) -> &'static str {
        match self {
            SlowConsumer::Conflate => "conflate",
            SlowConsumer::DropOldest => "drop-oldest",
            SlowConsumer::Disconnect => "disconnect",
        }
    }
}

/// The wire format of a session; decides which encoding of a message it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Ws,
    Sse,
}

/// One queued frame.
#[derive(Debug, Clone)]
pub enum Item {
    /// A channel message, encoded once and shared by every subscriber.
    Msg(Arc<Published>),
    /// A frame for this session alone (ack, err, gap, pong), already encoded
    /// for the session's wire format.
    Ctrl(Bytes),
}

impl Item {
    pub fn wire_len(&self, wire: Wire) -> usize {
        match self {
            Item::Msg(m) => m.wire_bytes(wire).len(),
            Item::Ctrl(b) => b.len(),
        }
    }
}

/// What a queue holds, and what its writer takes: one item inline (a quiet
/// channel's frame, the usual take), more on the heap. An item pushed and
/// taken alone costs no allocation, on the publishing thread or the
/// writer's.
pub type Queued = SmallVec<[Item; 1]>;

/// What a push did, so the caller can count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    Queued,
    /// Queued after removing `n` older messages with the same conflation key.
    Conflated(usize),
    /// Queued after dropping the `n` oldest messages.
    DroppedOldest(usize),
    /// The policy is `disconnect` (or nothing could be dropped): the session
    /// must close. The item was not queued.
    Overflow,
}

#[derive(Debug)]
struct Lost {
    ch: Arc<str>,
    /// Drops of one channel are one gap only within one epoch: an epoch
    /// change (announced in the queue) between them starts another.
    epoch: u64,
    from: u64,
    to: u64,
    /// Items ahead of the first dropped message (control frames only: the
    /// queue drops its oldest message, and never a control frame).
    at: usize,
}

/// The channels whose messages were dropped since the last take.
#[derive(Debug, Default)]
struct Drops(Vec<Lost>);

#[derive(Debug, Default)]
pub struct OutQueue {
    items: Queued,
    bytes: usize,
    /// Per channel, the positions dropped to make room since the last take
    /// (`from` is the first dropped message's `prev` + 1), and where the
    /// first of them stood (behind that many control frames): the session is
    /// told them there as a `gap`, before anything else of that channel, so a
    /// drop on a channel that then stays quiet is seen too. At most one entry
    /// per channel the session is subscribed to. Boxed: drops are rare, and
    /// an idle session's queue is per-connection memory (one word here).
    lost: Option<Box<Drops>>,
}

impl OutQueue {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Queues `item`, applying `policy` if that would exceed `limit` bytes.
    pub fn push(
        &mut self,
        item: Item,
        wire: Wire,
        limit: usize,
        policy: SlowConsumer,
    ) -> PushOutcome {
        let len = item.wire_len(wire);
        if self.bytes + len <= limit {
            return self.append(item, len, PushOutcome::Queued);
        }
        if let Item::Ctrl(_) = item {
            // Control frames answer the client's own requests; a little slack
            // keeps an ack from being lost, but a client that floods requests
            // without reading is closed rather than buffered without bound.
            if self.bytes + len <= limit + limit / 4 {
                return self.append(item, len, PushOutcome::Queued);
            }
            return PushOutcome::Overflow;
        }
        match policy {
            SlowConsumer::Disconnect => PushOutcome::Overflow,
            SlowConsumer::Conflate => {
                let removed = self.remove_same_key(&item, wire);
                if removed > 0 && self.bytes + len <= limit {
                    return self.append(item, len, PushOutcome::Conflated(removed));
                }
                match self.drop_oldest_until(len, limit, wire) {
                    Some(dropped) if removed > 0 || dropped > 0 => {
                        self.append(item, len, PushOutcome::Conflated(removed + dropped))
                    }
                    Some(_) => self.append(item, len, PushOutcome::Queued),
                    None => PushOutcome::Overflow,
                }
            }
            SlowConsumer::DropOldest => match self.drop_oldest_until(len, limit, wire) {
                Some(dropped) => self.append(item, len, PushOutcome::DroppedOldest(dropped)),
                None => PushOutcome::Overflow,
            },
        }
    }

    fn append(&mut self, item: Item, len: usize, outcome: PushOutcome) -> PushOutcome {
        self.bytes += len;
        self.items.push(item);
        outcome
    }

    fn remove_same_key(&mut self, item: &Item, wire: Wire) -> usize {
        let Item::Msg(new) = item else { return 0 };
        let Some(key) = new.key.as_deref() else {
            return 0;
        };
        let before = self.items.len();
        let mut freed = 0;
        self.items.retain(|q| match q {
            Item::Msg(old) if old.key.as_deref() == Some(key) && old.ch == new.ch => {
                freed += old.wire_bytes(wire).len();
                false
            }
            _ => true,
        });
        self.bytes -= freed;
        before - self.items.len()
    }

    /// Drops the oldest messages (never control frames) until `len` more bytes
    /// fit. Returns how many were dropped, or `None` if they cannot fit.
    fn drop_oldest_until(&mut self, len: usize, limit: usize, wire: Wire) -> Option<usize> {
        if len > limit {
            return None;
        }
        let mut dropped = 0;
        let mut i = 0;
        while self.bytes + len > limit && i < self.items.len() {
            if let Item::Msg(m) = &self.items[i] {
                self.bytes -= m.wire_bytes(wire).len();
                // The oldest message queued: the oldest of its channel here,
                // so a gap sent before the rest of the queue is in order.
                let lost = &mut self.lost.get_or_insert_with(Default::default).0;
                match lost.iter_mut().find(|l| l.ch == m.ch && l.epoch == m.epoch) {
                    Some(l) => l.to = m.seq,
                    None => lost.push(Lost {
                        ch: m.ch.clone(),
                        epoch: m.epoch,
                        from: m.prev + 1,
                        to: m.seq,
                        at: i,
                    }),
                }
                self.items.remove(i);
                dropped += 1;
            } else {
                i += 1;
            }
        }
        (self.bytes + len <= limit).then_some(dropped)
    }

    /// Takes everything queued, leaving an empty queue that holds no memory;
    /// a `gap` for each channel whose messages were dropped comes first.
    pub fn take(&mut self, wire: Wire) -> Queued {
        self.bytes = 0;
        let mut items = std::mem::take(&mut self.items);
        // Latest position first, so the earlier ones stay where they were.
        let mut lost = self.lost.take().map(|b| b.0).unwrap_or_default();
        lost.sort_by_key(|l| std::cmp::Reverse(l.at));
        for l in lost {
            let json = herald_proto::encode_gap(&l.ch, l.from, l.to);
            let gap = Item::Ctrl(match wire {
                Wire::Ws => {
                    herald_proto::ws::encode_frame(herald_proto::ws::OpCode::Text, json.as_bytes())
                }
                Wire::Sse => herald_proto::sse::encode_event("gap", &json),
            });
            items.insert(l.at.min(items.len()), gap);
        }
        items
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Published;

    fn msg(ch: &str, seq: u64, key: Option<&str>, size: usize) -> Item {
        Item::Msg(Arc::new(Published::for_test(ch, seq, key, size)))
    }

    fn seqs(q: &mut OutQueue) -> Vec<u64> {
        q.take(Wire::Ws)
            .into_iter()
            .filter_map(|i| match i {
                Item::Msg(m) => Some(m.seq),
                Item::Ctrl(_) => None,
            })
            .collect()
    }

    /// Pushes a 10-byte message of channel `a` at `seq` under a 100-byte bound.
    fn push_small(q: &mut OutQueue, seq: u64) -> PushOutcome {
        q.push(
            msg("a", seq, None, 10),
            Wire::Ws,
            100,
            SlowConsumer::Disconnect,
        )
    }

    #[test]
    fn one_item_is_queued_and_taken_without_an_allocation() {
        let mut q = OutQueue::default();
        push_small(&mut q, 1);
        let one = q.take(Wire::Ws);
        assert_eq!(one.len(), 1);
        assert!(!one.spilled(), "one frame, the usual take, stays inline");
        push_small(&mut q, 2);
        push_small(&mut q, 3);
        assert!(q.take(Wire::Ws).spilled());
        // Taken: the queue holds nothing on the heap again.
        assert!(!q.items.spilled() && q.is_empty());
    }

    #[test]
    fn under_limit_everything_queues() {
        let mut q = OutQueue::default();
        for s in 1..=3 {
            assert_eq!(push_small(&mut q, s), PushOutcome::Queued);
        }
        assert_eq!(q.bytes(), 30);
        assert_eq!(seqs(&mut q), vec![1, 2, 3]);
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn disconnect_policy_overflows() {
        let mut q = OutQueue::default();
        q.push(
            msg("a", 1, None, 60),
            Wire::Ws,
            100,
            SlowConsumer::Disconnect,
        );
        assert_eq!(
            q.push(
                msg("a", 2, None, 60),
                Wire::Ws,
                100,
                SlowConsumer::Disconnect
            ),
            PushOutcome::Overflow
        );
    }

    #[test]
    fn drop_oldest_keeps_newest_and_bound() {
        let mut q = OutQueue::default();
        for s in 1..=10 {
            q.push(
                msg("a", s, None, 30),
                Wire::Ws,
                100,
                SlowConsumer::DropOldest,
            );
            assert!(q.bytes() <= 100);
        }
        let items = q.take(Wire::Ws);
        // What was dropped comes first, as one gap for the channel.
        let Item::Ctrl(gap) = &items[0] else {
            panic!("{items:?}")
        };
        let gap: serde_json::Value = serde_json::from_slice(&gap[2..]).unwrap();
        assert_eq!(
            (gap["op"].as_str(), gap["from"].as_u64(), gap["to"].as_u64()),
            (Some("gap"), Some(1), Some(7))
        );
        let kept: Vec<u64> = items
            .iter()
            .filter_map(|i| match i {
                Item::Msg(m) => Some(m.seq),
                Item::Ctrl(_) => None,
            })
            .collect();
        assert_eq!(kept, vec![8, 9, 10]);
        assert!(q.take(Wire::Ws).is_empty(), "told once");
    }

    #[test]
    fn conflate_keeps_latest_per_key_in_order() {
        let mut q = OutQueue::default();
        let p = SlowConsumer::Conflate;
        q.push(msg("t", 1, Some("AAPL"), 30), Wire::Ws, 100, p);
        q.push(msg("t", 2, Some("MSFT"), 30), Wire::Ws, 100, p);
        q.push(msg("t", 3, Some("GOOG"), 30), Wire::Ws, 100, p);
        assert_eq!(
            q.push(msg("t", 4, Some("AAPL"), 30), Wire::Ws, 100, p),
            PushOutcome::Conflated(1)
        );
        assert_eq!(
            q.push(msg("t", 5, Some("MSFT"), 30), Wire::Ws, 100, p),
            PushOutcome::Conflated(1)
        );
        // Same key on another channel is another stream.
        assert!(matches!(
            q.push(msg("u", 6, Some("AAPL"), 30), Wire::Ws, 100, p),
            PushOutcome::Conflated(_)
        ));
        let s = seqs(&mut q);
        assert!(s.windows(2).all(|w| w[0] < w[1]), "order kept: {s:?}");
        assert!(s.contains(&5) && s.contains(&6));
    }

    #[test]
    fn control_frames_survive_message_drops() {
        let mut q = OutQueue::default();
        q.push(
            Item::Ctrl(Bytes::from_static(&[0; 20])),
            Wire::Ws,
            100,
            SlowConsumer::DropOldest,
        );
        for s in 1..=5 {
            q.push(
                msg("a", s, None, 30),
                Wire::Ws,
                100,
                SlowConsumer::DropOldest,
            );
        }
        let items = q.take(Wire::Ws);
        assert!(matches!(items[0], Item::Ctrl(_)));
        // Flooding control frames past the slack overflows.
        let mut q = OutQueue::default();
        let mut last = PushOutcome::Queued;
        for _ in 0..20 {
            last = q.push(
                Item::Ctrl(Bytes::from_static(&[0; 10])),
                Wire::Ws,
                100,
                SlowConsumer::Conflate,
            );
        }
        assert_eq!(last, PushOutcome::Overflow);
    }

    #[test]
    fn message_larger_than_queue_overflows() {
        let mut q = OutQueue::default();
        assert_eq!(
            q.push(
                msg("a", 1, None, 200),
                Wire::Ws,
                100,
                SlowConsumer::DropOldest
            ),
            PushOutcome::Overflow
        );
    }
}
