//! Fan-out: per-channel positions and history, and delivery into session queues.
//!
//! Owns: `seq`/`prev` assignment, the bounded history per channel (count and
//! age) used for resume, the channel epoch, and the subscriber lists.
//! Invariants: a message is encoded once per wire format and shared by every
//! subscriber (`Arc<Published>`); `seq` only increases within an epoch;
//! subscribing replays history and joins the live list under one channel lock,
//! so no message is missed or duplicated between the two. Publishing never
//! waits on a socket: it only pushes into bounded session queues.

pub mod conflate;
pub mod position;
pub mod queue;
pub mod session;

use crate::proto::{self, sse, ws, PayloadKind};
use bytes::Bytes;
use parking_lot::Mutex;
use queue::Wire;
use session::{Delivery, SessionHandle};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// One message of one channel, encoded once for each wire format.
#[derive(Debug)]
pub struct Published {
    pub ch: Arc<str>,
    pub epoch: u64,
    pub seq: u64,
    pub prev: u64,
    /// Conflation key given by the publisher.
    pub key: Option<Arc<str>>,
    /// Only sessions of this audience receive this variant; `None`: everyone
    /// who has no variant of their own.
    pub audience: Option<Arc<str>>,
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
            audience: None,
            at_ms: 0,
            ws: Bytes::from(vec![b'x'; size]),
            sse: Bytes::from(vec![b'x'; size]),
        }
    }
}

/// How much history each channel keeps for resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    pub max_messages: usize,
    pub max_age_ms: u64,
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

/// The variant a session of `audience` receives, if any.
fn pick<'a>(variants: &'a [Arc<Published>], audience: Option<&str>) -> Option<&'a Arc<Published>> {
    if let [only] = variants {
        if only.audience.is_none() {
            return Some(only);
        }
    }
    audience
        .and_then(|a| variants.iter().find(|v| v.audience.as_deref() == Some(a)))
        .or_else(|| variants.iter().find(|v| v.audience.is_none()))
}

/// What a subscribe found, so the session can answer the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeResult {
    pub epoch: u64,
    /// The channel's latest position at the moment of joining.
    pub head: u64,
    /// Positions the history could not cover, as `(from, to)` inclusive.
    pub gap: Option<(u64, u64)>,
    pub replayed: usize,
}

/// Counts of what a publish did, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PublishReport {
    pub delivered: usize,
    pub conflated: usize,
    pub dropped: usize,
    pub disconnected: usize,
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

struct Channel {
    name: Arc<str>,
    epoch: u64,
    seq: u64,
    history: VecDeque<Arc<Published>>,
    subscribers: Vec<Arc<SessionHandle>>,
}

impl Channel {
    fn trim(&mut self, limits: HistoryLimits, now_ms: u64) {
        while self.history.len() > limits.max_messages {
            self.history.pop_front();
        }
        while let Some(front) = self.history.front() {
            if now_ms.saturating_sub(front.at_ms) > limits.max_age_ms {
                self.history.pop_front();
            } else {
                break;
            }
        }
    }
}

/// All channels of one tenant.
pub struct Hub {
    channels: Mutex<HashMap<Arc<str>, Arc<Mutex<Channel>>>>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            channels: Mutex::new(HashMap::new()),
        }
    }
}

fn new_epoch() -> u64 {
    // Small enough to be exact in a JavaScript number.
    rand::random::<u64>() >> 12
}

impl Hub {
    fn channel(&self, name: &str) -> Arc<Mutex<Channel>> {
        let mut map = self.channels.lock();
        if let Some(c) = map.get(name) {
            return c.clone();
        }
        let name: Arc<str> = name.into();
        let c = Arc::new(Mutex::new(Channel {
            name: name.clone(),
            epoch: new_epoch(),
            seq: 0,
            history: VecDeque::new(),
            subscribers: Vec::new(),
        }));
        map.insert(name, c.clone());
        c
    }

    /// Number of channels currently held (with subscribers or history).
    pub fn channel_count(&self) -> usize {
        self.channels.lock().len()
    }

    /// Assigns the next position, records history, and queues the frame for
    /// every subscriber. Never waits on a socket.
    pub fn publish(
        &self,
        msg: Outgoing<'_>,
        limits: HistoryLimits,
        now_ms: u64,
    ) -> (u64, PublishReport) {
        let v = [Variant {
            payload: msg.payload,
            kind: msg.kind,
            audience: None,
        }];
        self.publish_variants(msg.ch, msg.key, &v, limits, now_ms)
    }

    /// Publishes one message in per-audience variants under one position.
    pub fn publish_variants(
        &self,
        ch: &str,
        key: Option<&str>,
        variants: &[Variant<'_>],
        limits: HistoryLimits,
        now_ms: u64,
    ) -> (u64, PublishReport) {
        self.publish_at(ch, None, key, variants, limits, now_ms)
            .expect("a position the hub assigns is always new")
    }

    /// Publishes at the source's `position` (an outbox id: every node gives
    /// the message the same `seq`), or at the next position when `None`.
    /// A position not above the channel's last is a duplicate: nothing is
    /// published and `None` returned.
    pub fn publish_at(
        &self,
        ch: &str,
        position: Option<u64>,
        key: Option<&str>,
        variants: &[Variant<'_>],
        limits: HistoryLimits,
        now_ms: u64,
    ) -> Option<(u64, PublishReport)> {
        let chan = self.channel(ch);
        let mut c = chan.lock();
        let prev = c.seq;
        let seq = match position {
            Some(p) if p <= prev => return None,
            Some(p) => p,
            None => prev + 1,
        };
        c.seq = seq;
        let key: Option<Arc<str>> = key.map(Into::into);
        let encoded: Vec<Arc<Published>> = variants
            .iter()
            .map(|v| {
                let json = proto::encode_msg(&c.name, seq, prev, v.payload, v.kind);
                Arc::new(Published {
                    ch: c.name.clone(),
                    epoch: c.epoch,
                    seq,
                    prev,
                    key: key.clone(),
                    audience: v.audience.map(Into::into),
                    at_ms: now_ms,
                    ws: ws::encode_frame(ws::OpCode::Text, json.as_bytes()),
                    sse: sse::encode_event_body("msg", &json),
                })
            })
            .collect();
        let mut report = PublishReport::default();
        c.subscribers.retain(|s| {
            let Some(p) = pick(&encoded, s.audience()) else {
                return true;
            };
            let d = s.deliver_msg(p);
            report.add(d);
            !matches!(d, Delivery::Disconnected | Delivery::Closed)
        });
        if limits.max_messages > 0 {
            c.history.extend(encoded);
        }
        c.trim(limits, now_ms);
        Some((seq, report))
    }

    /// Replays history after `since` (when given) and joins the live list.
    /// `before_replay` runs under the channel lock before any replayed frame is
    /// queued, so the session's ack precedes its messages.
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
        c.trim(limits, now_ms);
        let head = c.seq;
        before_replay(c.epoch, head);
        let mut result = SubscribeResult {
            epoch: c.epoch,
            head,
            gap: None,
            replayed: 0,
        };
        if let Some((since, epoch)) = resume {
            // A different epoch means the positions the client holds belong to
            // a lost history: everything it cannot get here is a gap.
            let since = if epoch.is_some_and(|e| e != c.epoch) || since > head {
                0
            } else {
                since
            };
            let first = c.history.front().map_or(head + 1, |m| m.seq);
            if since + 1 < first && since < head {
                let to = first - 1;
                session.deliver_ctrl("gap", &proto::encode_gap(&c.name, since + 1, to));
                result.gap = Some((since + 1, to));
            }
            // Variants of one position sit next to each other in history.
            let mut group: Vec<Arc<Published>> = Vec::new();
            for m in c.history.iter().filter(|m| m.seq > since) {
                if group.first().is_some_and(|g| g.seq != m.seq) {
                    if let Some(p) = pick(&group, session.audience()) {
                        session.deliver_msg(p);
                        result.replayed += 1;
                    }
                    group.clear();
                }
                group.push(m.clone());
            }
            if let Some(p) = pick(&group, session.audience()) {
                session.deliver_msg(p);
                result.replayed += 1;
            }
        }
        if !c.subscribers.iter().any(|s| Arc::ptr_eq(s, session)) {
            c.subscribers.push(session.clone());
        }
        result
    }

    pub fn unsubscribe(&self, ch: &str, session: &Arc<SessionHandle>) {
        let chan = match self.channels.lock().get(ch) {
            Some(c) => c.clone(),
            None => return,
        };
        chan.lock().subscribers.retain(|s| !Arc::ptr_eq(s, session));
    }

    /// Drops channels that have neither subscribers nor live history; their
    /// next use starts a new epoch.
    pub fn sweep(&self, limits: HistoryLimits, now_ms: u64) -> usize {
        let mut map = self.channels.lock();
        let before = map.len();
        map.retain(|_, c| {
            let mut c = c.lock();
            c.trim(limits, now_ms);
            !(c.subscribers.is_empty() && c.history.is_empty())
        });
        before - map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::queue::{Item, SlowConsumer};

    const LIMITS: HistoryLimits = HistoryLimits {
        max_messages: 3,
        max_age_ms: 60_000,
    };

    fn out(ch: &str) -> Outgoing<'_> {
        Outgoing {
            ch,
            payload: b"{\"v\":1}",
            kind: PayloadKind::Json,
            key: None,
        }
    }

    fn session() -> Arc<SessionHandle> {
        SessionHandle::new(Wire::Ws, 1 << 20, SlowConsumer::DropOldest, None)
    }

    #[test]
    fn audiences_get_their_variant_under_one_position() {
        let hub = Hub::default();
        let pro = SessionHandle::new(
            Wire::Ws,
            1 << 20,
            SlowConsumer::DropOldest,
            Some("pro".into()),
        );
        let basic = SessionHandle::new(
            Wire::Ws,
            1 << 20,
            SlowConsumer::DropOldest,
            Some("basic".into()),
        );
        let anon = session();
        for s in [&pro, &basic, &anon] {
            hub.subscribe("c", s, None, LIMITS, 0, |_, _| {});
        }
        let v = [
            Variant {
                payload: b"{\"full\":1}",
                kind: PayloadKind::Json,
                audience: Some("pro"),
            },
            Variant {
                payload: b"{}",
                kind: PayloadKind::Json,
                audience: Some("basic"),
            },
        ];
        let (seq, r) = hub.publish_variants("c", None, &v, LIMITS, 0);
        assert_eq!((seq, r.delivered), (1, 2));
        let got = |s: &SessionHandle| drained(s);
        assert_eq!(got(&pro), ["msg1"]);
        assert_eq!(got(&basic), ["msg1"]);
        assert!(got(&anon).is_empty());
        // Replay gives each audience its own variant too.
        hub.publish_variants("c", None, &v, LIMITS, 0);
        let late = SessionHandle::new(
            Wire::Ws,
            1 << 20,
            SlowConsumer::DropOldest,
            Some("basic".into()),
        );
        let r = hub.subscribe("c", &late, Some((0, None)), LIMITS, 0, |_, _| {});
        assert_eq!(r.replayed, 2);
        let items = late.take_queued();
        assert!(items
            .iter()
            .all(|i| matches!(i, Item::Msg(m) if m.audience.as_deref() == Some("basic"))));
    }

    fn drained(s: &SessionHandle) -> Vec<String> {
        s.take_queued()
            .into_iter()
            .map(|i| match i {
                Item::Msg(m) => format!("msg{}", m.seq),
                Item::Ctrl(b) => String::from_utf8_lossy(&b).into_owned(),
            })
            .collect()
    }

    #[test]
    fn positions_increase_and_prev_links() {
        let hub = Hub::default();
        let s = session();
        hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
        assert_eq!(hub.publish(out("a"), LIMITS, 0).0, 1);
        assert_eq!(hub.publish(out("a"), LIMITS, 0).0, 2);
        assert_eq!(hub.publish(out("b"), LIMITS, 0).0, 1);
        let items = s.take_queued();
        assert_eq!(items.len(), 2);
        let Item::Msg(m) = &items[1] else { panic!() };
        assert_eq!((m.seq, m.prev), (2, 1));
        let v: serde_json::Value = serde_json::from_slice(&m.ws[2..]).unwrap();
        assert_eq!(v["seq"], 2);
        assert_eq!(v["prev"], 1);
    }

    #[test]
    fn source_positions_become_seq_and_duplicates_are_dropped() {
        let hub = Hub::default();
        let s = session();
        hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
        let v = [Variant {
            payload: b"1",
            kind: PayloadKind::Json,
            audience: None,
        }];
        assert_eq!(
            hub.publish_at("a", Some(10), None, &v, LIMITS, 0)
                .map(|r| r.0),
            Some(10)
        );
        assert_eq!(
            hub.publish_at("a", Some(14), None, &v, LIMITS, 0)
                .map(|r| r.0),
            Some(14)
        );
        assert!(hub.publish_at("a", Some(14), None, &v, LIMITS, 0).is_none());
        assert!(hub.publish_at("a", Some(3), None, &v, LIMITS, 0).is_none());
        let items = s.take_queued();
        let Item::Msg(m) = &items[1] else { panic!() };
        assert_eq!((m.seq, m.prev), (14, 10));
    }

    #[test]
    fn resume_replays_history_and_reports_gap() {
        let hub = Hub::default();
        for _ in 0..5 {
            hub.publish(out("a"), LIMITS, 0);
        }
        let s = session();
        let r = hub.subscribe("a", &s, Some((1, None)), LIMITS, 0, |_, _| {});
        // History holds 3, 4, 5; 2 is lost.
        assert_eq!(r.gap, Some((2, 2)));
        assert_eq!(r.replayed, 3);
        let got = drained(&s);
        assert!(got[0].contains("\"op\":\"gap\""));
        assert_eq!(&got[1..], ["msg3", "msg4", "msg5"]);

        let s2 = session();
        let r = hub.subscribe("a", &s2, Some((4, Some(r.epoch))), LIMITS, 0, |_, _| {});
        assert_eq!((r.gap, r.replayed), (None, 1));

        // A foreign epoch resumes from nothing.
        let s3 = session();
        let r = hub.subscribe("a", &s3, Some((4, Some(r.epoch + 1))), LIMITS, 0, |_, _| {});
        assert_eq!((r.gap, r.replayed), (Some((1, 2)), 3));
    }

    #[test]
    fn history_expires_by_age_and_sweep_drops_idle_channels() {
        let hub = Hub::default();
        let limits = HistoryLimits {
            max_messages: 10,
            max_age_ms: 100,
        };
        hub.publish(out("a"), limits, 0);
        let s = session();
        let r = hub.subscribe("a", &s, Some((0, None)), limits, 50, |_, _| {});
        assert_eq!(r.replayed, 1);
        assert_eq!(hub.sweep(limits, 500), 0, "a subscriber keeps the channel");
        hub.unsubscribe("a", &s);
        assert_eq!(hub.sweep(limits, 500), 1);
        assert_eq!(hub.channel_count(), 0);
    }

    #[test]
    fn closed_sessions_leave_the_channel() {
        let hub = Hub::default();
        let s = SessionHandle::new(Wire::Ws, 100, SlowConsumer::Disconnect, None);
        hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
        let (_, r1) = hub.publish(
            Outgoing {
                payload: &[b'1'; 30],
                ..out("a")
            },
            LIMITS,
            0,
        );
        assert_eq!(r1.delivered, 1);
        let (_, r2) = hub.publish(
            Outgoing {
                payload: &[b'1'; 30],
                ..out("a")
            },
            LIMITS,
            0,
        );
        assert_eq!(r2.disconnected, 1);
        assert!(s.close_reason().is_some());
        let (_, r3) = hub.publish(out("a"), LIMITS, 0);
        assert_eq!(r3, PublishReport::default());
    }
}
