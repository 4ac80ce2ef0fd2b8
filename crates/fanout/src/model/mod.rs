//! A model-based property test of the fan-out core: random interleavings of
//! batches from every kind of source (HTTP without positions, a sparse
//! outbox-like stream, two Kafka-like partitions feeding the same channels,
//! re-reads of earlier batches, several messages per record to one channel,
//! audience variants), conflation windows and flushes, subscribe, resume with
//! `since`, unsubscribe, history trimming by count and age, and sweeps.
//!
//! Oracle, for every session: positions strictly increase and none repeats;
//! every frame's `prev` is the last position the session saw, or a `gap`
//! frame just before it says which positions it cannot have — never a
//! silent hole. For sessions subscribed from the start: every message of
//! their channel meant for their audience arrives, unless a later message of
//! the same channel and key that waited in the same window (the model tracks
//! each channel's windows: a flush, or a message published at once, closes
//! one) arrived in its place; and only re-reads are ever dropped as
//! duplicates.
//!
//! `PROPTEST_CASES=5000 cargo test -p herald-host --lib fanout::model` runs a
//! longer search than the test command's default.

mod system;

use super::conflate::{ConflationSettings, Conflator, HeldVariant};
use super::deliver::{self, Fate, Message, Tally, Window};
use super::position::SourcePos;
use super::queue::{Item, SlowConsumer, Wire};
use super::session::SessionHandle;
use super::{At, HistoryLimits, Hub, Variant};
use herald_proto::PayloadKind;
use proptest::prelude::*;
use std::collections::HashSet;
use std::sync::Arc;

const CHANNELS: [&str; 3] = ["c0", "c1", "c2"];
const AUDIENCES: [Option<&str>; 3] = [None, Some("pro"), Some("basic")];
/// Sessions 0..3 (one per channel, each audience once) never leave.
const SESSIONS: usize = 9;
const PERMANENT: usize = 3;

#[derive(Debug, Clone)]
struct Gen {
    channel: usize,
    key: Option<u8>,
    /// 0: untagged; 1: pro + untagged; 2: pro only; 3: basic only.
    shape: u8,
    /// A second message of the same record to the same channel.
    twice: bool,
}

#[derive(Debug, Clone)]
enum Op {
    /// A batch from source 0 (HTTP), 1 (outbox), 2 or 3 (partitions).
    Batch {
        source: u8,
        records: Vec<Gen>,
    },
    /// The positional batch `n` back is delivered again (a reconnect).
    Reread(usize),
    Flush,
    Subscribe {
        session: usize,
        resume: bool,
    },
    Unsubscribe {
        session: usize,
    },
    /// Time passes; channels are swept.
    Tick(u64),
}

fn gen() -> impl Strategy<Value = Gen> {
    (
        0..3usize,
        prop::option::weighted(0.6, 0..3u8),
        0..4u8,
        prop::bool::weighted(0.15),
    )
        .prop_map(|(channel, key, shape, twice)| Gen {
            channel,
            key,
            shape,
            twice,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4u8, prop::collection::vec(gen(), 1..6)).prop_map(|(source, records)| Op::Batch { source, records }),
        1 => (0..4usize).prop_map(Op::Reread),
        2 => Just(Op::Flush),
        2 => (PERMANENT..SESSIONS, any::<bool>()).prop_map(|(session, resume)| Op::Subscribe { session, resume }),
        1 => (PERMANENT..SESSIONS).prop_map(|session| Op::Unsubscribe { session }),
        1 => (0..400u64).prop_map(Op::Tick),
    ]
}

/// One input message as the model knows it.
#[derive(Debug, Clone)]
struct Input {
    id: u64,
    channel: usize,
    key: Option<u8>,
    shape: u8,
    reread: bool,
    at: Option<At>,
}

fn for_audience(shape: u8, audience: Option<&str>) -> bool {
    match shape {
        0 | 1 => true,
        2 => audience == Some("pro"),
        _ => audience == Some("basic"),
    }
}

struct Client {
    channel: usize,
    audience: Option<&'static str>,
    handle: Option<Arc<SessionHandle>>,
    /// (epoch, last position seen) of the current or last subscription.
    last: Option<(u64, u64)>,
    received: HashSet<u64>,
}

struct World {
    hub: Hub,
    pending: Conflator,
    settings: ConflationSettings,
    history: HistoryLimits,
    now: u64,
    inputs: Vec<Input>,
    /// Positional batches delivered so far, for re-reads.
    batches: Vec<Vec<Input>>,
    next_number: [u64; 4],
    /// Messages delivered again so far.
    rereads: u64,
    /// Per channel, which window is open (closed by a flush, or by a
    /// message of the channel published at once).
    windows: [u64; 3],
    /// The window a message waited in: (channel, window).
    held_in: std::collections::HashMap<u64, (usize, u64)>,
    clients: Vec<Client>,
}

impl World {
    fn new() -> World {
        let mut w = World {
            hub: Hub::default(),
            pending: Conflator::with_max(4),
            settings: ConflationSettings {
                window_ms: 100,
                channels: vec!["c0".into(), "c1".into()],
            },
            history: HistoryLimits {
                max_messages: 3,
                max_age_ms: 250,
                max_bytes: usize::MAX,
                tenant_max_bytes: usize::MAX,
            },
            now: 0,
            inputs: Vec::new(),
            batches: Vec::new(),
            next_number: [0; 4],
            rereads: 0,
            windows: [0; 3],
            held_in: Default::default(),
            clients: (0..SESSIONS)
                .map(|i| Client {
                    channel: i % 3,
                    audience: AUDIENCES[(i + i / 3) % 3],
                    handle: None,
                    last: None,
                    received: HashSet::new(),
                })
                .collect(),
        };
        for i in 0..PERMANENT {
            w.subscribe(i, false);
        }
        w
    }

    fn subscribe(&mut self, i: usize, resume: bool) {
        if self.clients[i].handle.is_some() {
            return;
        }
        let c = &self.clients[i];
        let handle = SessionHandle::new(
            Wire::Ws,
            1 << 24,
            SlowConsumer::DropOldest,
            c.audience.map(Into::into),
        );
        let since = if resume { c.last } else { None };
        let mut ack = (0, 0);
        let r = self.hub.subscribe(
            CHANNELS[c.channel],
            &handle,
            since.map(|(e, s)| (s, Some(e))),
            self.history,
            self.now,
            |e, h| ack = (e, h),
        );
        assert_eq!(r.epoch, ack.0);
        let c = &mut self.clients[i];
        c.last = Some(match since {
            // Same epoch: the chain continues from where the client was.
            Some((e, s)) if e == r.epoch => (e, s),
            // Another epoch (the channel was swept): from nothing.
            Some(_) => (r.epoch, 0),
            None => (r.epoch, r.head),
        });
        c.handle = Some(handle);
        self.check(i);
    }

    fn unsubscribe(&mut self, i: usize) {
        self.check(i);
        if let Some(h) = self.clients[i].handle.take() {
            self.hub.unsubscribe(CHANNELS[self.clients[i].channel], &h);
        }
    }

    /// Reads what a client was sent and checks the chain.
    fn check(&mut self, i: usize) {
        let c = &mut self.clients[i];
        let Some(h) = &c.handle else { return };
        let (epoch, mut last) = c.last.expect("subscribed clients have a position");
        for item in h.take_queued() {
            match item {
                Item::Ctrl(b) => {
                    let v: serde_json::Value = serde_json::from_slice(&b[2..]).unwrap();
                    if v["op"] == "gap" {
                        let (from, to) = (v["from"].as_u64().unwrap(), v["to"].as_u64().unwrap());
                        assert_eq!(
                            from,
                            last + 1,
                            "client {i}: a gap must start after the last position seen"
                        );
                        assert!(to >= from, "client {i}: empty gap {v}");
                        last = to;
                    }
                }
                Item::Msg(m) => {
                    assert_eq!(
                        m.epoch, epoch,
                        "client {i}: epoch changed under a live subscription"
                    );
                    assert!(
                        m.seq > last,
                        "client {i}: seq {} after {last}: not increasing",
                        m.seq
                    );
                    assert_eq!(m.prev, last, "client {i}: message {} has prev {} but the client last saw {last}: a silent hole", m.seq, m.prev);
                    last = m.seq;
                    let v: serde_json::Value = serde_json::from_slice(&m.ws[2..]).unwrap();
                    c.received.insert(v["data"]["id"].as_u64().unwrap());
                }
            }
        }
        c.last = Some((epoch, last));
    }

    fn batch(&mut self, source: u8, records: &[Gen]) {
        let mut batch = Vec::new();
        for g in records {
            let at = (source > 0).then(|| {
                let s = source as usize;
                // Sparse numbers, like outbox ids across tables.
                self.next_number[s] += 1 + (g.channel as u64 % 3);
                SourcePos {
                    stream: s as u32,
                    order: (self.next_number[s], 0),
                    number: self.next_number[s],
                }
            });
            for index in 0..if g.twice { 2 } else { 1 } {
                let id = self.inputs.len() as u64;
                let input = Input {
                    id,
                    channel: g.channel,
                    key: g.key,
                    shape: g.shape,
                    reread: false,
                    at: at.map(|pos| At { pos, index }),
                };
                self.inputs.push(input.clone());
                batch.push(input);
            }
        }
        self.deliver(&batch);
        if source > 0 {
            self.batches.push(batch);
        }
    }

    fn reread(&mut self, back: usize) {
        let Some(b) = self
            .batches
            .len()
            .checked_sub(back + 1)
            .map(|k| self.batches[k].clone())
        else {
            return;
        };
        let again: Vec<Input> = b.into_iter().map(|i| Input { reread: true, ..i }).collect();
        self.rereads += again.len() as u64;
        self.deliver(&again);
    }

    fn deliver(&mut self, batch: &[Input]) {
        let payloads: Vec<(String, String)> = batch
            .iter()
            .map(|i| {
                (
                    format!("{{\"id\":{}}}", i.id),
                    format!("{{\"id\":{},\"pro\":true}}", i.id),
                )
            })
            .collect();
        let keys: Vec<Option<String>> = batch
            .iter()
            .map(|i| i.key.map(|k| format!("k{k}")))
            .collect();
        let messages: Vec<Message<'_>> = batch
            .iter()
            .zip(&payloads)
            .zip(&keys)
            .map(|((i, (plain, pro)), key)| {
                fn v<'p>(p: &'static str, payload: &'p str) -> Variant<'p> {
                    Variant {
                        payload: payload.as_bytes(),
                        kind: PayloadKind::Json,
                        audience: (!p.is_empty()).then_some(p),
                    }
                }
                let variants = match i.shape {
                    0 => vec![v("", plain)],
                    1 => vec![v("pro", pro), v("", plain)],
                    2 => vec![v("pro", pro)],
                    _ => vec![v("basic", plain)],
                };
                Message {
                    channel: CHANNELS[i.channel],
                    key: key.as_deref(),
                    variants,
                    at: i.at,
                }
            })
            .collect();
        let mut tally = Tally::default();
        let window = Window {
            pending: &mut self.pending,
            settings: &self.settings,
        };
        let latest = |_: &str, _: &HeldVariant, n: HeldVariant| n;
        let fates = deliver::deliver(
            &self.hub,
            Some(window),
            messages,
            self.history,
            self.now,
            latest,
            &mut tally,
        );
        // Which window each held message waited in: a message published on
        // its channel (unkeyed, or the window full) closes that channel's.
        for (i, f) in batch.iter().zip(&fates) {
            match f {
                Fate::Held => {
                    self.held_in
                        .insert(i.id, (i.channel, self.windows[i.channel]));
                }
                Fate::Duplicate => {}
                Fate::Published { .. } => self.windows[i.channel] += 1,
            }
        }
        for (i, f) in batch.iter().zip(&fates) {
            if *f == Fate::Duplicate {
                assert!(
                    i.reread,
                    "message {} was dropped as a duplicate but was never delivered before",
                    i.id
                );
            }
        }
        assert!(
            tally.duplicates <= self.rereads,
            "more duplicates than re-reads: {tally:?}"
        );
        self.check_all();
    }

    fn flush(&mut self) {
        for w in self.windows.iter_mut() {
            *w += 1;
        }
        let mut tally = Tally::default();
        deliver::flush(
            &self.hub,
            &mut self.pending,
            self.history,
            self.now,
            &mut tally,
        );
        assert!(
            tally.duplicates <= self.rereads,
            "more duplicates than re-reads: {tally:?}"
        );
        self.check_all();
    }

    fn check_all(&mut self) {
        for i in 0..SESSIONS {
            self.check(i);
        }
    }

    /// Every message meant for a permanent client arrived, or a later one of
    /// the same channel and key that waited in the same window (not merely
    /// any later one of the key) did: latest-wins per audience.
    fn nothing_lost(&mut self) {
        self.flush();
        for (ci, c) in self.clients.iter().enumerate().take(PERMANENT) {
            let reached = |input: &Input| {
                if c.received.contains(&input.id) {
                    return true;
                }
                let Some(window) = self.held_in.get(&input.id) else {
                    return false;
                };
                self.inputs.iter().any(|later| {
                    later.id > input.id
                        && !later.reread
                        && later.key == input.key
                        && self.held_in.get(&later.id) == Some(window)
                        && c.received.contains(&later.id)
                })
            };
            for input in self.inputs.iter() {
                if input.reread
                    || input.channel != c.channel
                    || !for_audience(input.shape, c.audience)
                {
                    continue;
                }
                if c.received.contains(&input.id) {
                    continue;
                }
                assert!(
                    reached(input),
                    "client {ci} ({:?}) never got message {input:?}",
                    c.audience
                );
            }
        }
    }
}

fn run(ops: &[Op]) {
    let mut w = World::new();
    for op in ops {
        match op {
            Op::Batch { source, records } => w.batch(*source, records),
            Op::Reread(back) => w.reread(*back),
            Op::Flush => w.flush(),
            Op::Subscribe { session, resume } => w.subscribe(*session, *resume),
            Op::Unsubscribe { session } => w.unsubscribe(*session),
            Op::Tick(ms) => {
                w.now += ms;
                w.hub.sweep(w.history, w.now);
                w.check_all();
            }
        }
    }
    w.nothing_lost();
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("regressions"))), ..ProptestConfig::default() })]
    #[test]
    fn every_client_sees_every_message_in_order_or_a_gap(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops);
    }
}

/// Keys A, B, A in one window (B before the second A), as a fixed sequence.
#[test]
fn keys_a_b_a_in_one_window() {
    let g = |key| Gen {
        channel: 0,
        key: Some(key),
        shape: 0,
        twice: false,
    };
    run(&[Op::Batch {
        source: 1,
        records: vec![g(0), g(1), g(0)],
    }]);
}
