//! The model of the position promise over the whole system: one source
//! (one or two streams, sparse numbers), several nodes reading it at their
//! own pace, each with its own hub, a stored cursor, restarts (graceful, or
//! a crash past the stored cursor), sweeps and history expiry, tombs
//! forgotten, retention deleting records some node had not read yet,
//! clients that leave and resume on any node, and a slow client whose small
//! queue drops the oldest messages.
//!
//! Oracle, the promise itself (with several streams, once each channel has
//! had one more message: see `World::settle`): from the record its node had not read when a
//! client first subscribed, every message of its channel meant for its audience reaches it once,
//! in order, or lies inside a `gap` it was sent; within a subscription and
//! across resumes on any node, `seq` only increases and `prev` never points
//! past what the client saw or was told it cannot have.
//!
//! `PROPTEST_CASES=10000 cargo test -p herald-host --lib fanout::model::system`
//! runs a longer search than the test command's 256 cases.

use super::super::channel::shared_epoch;
use super::super::position::SourcePos;
use super::super::queue::{Item, SlowConsumer, Wire};
use super::super::session::SessionHandle;
use super::super::{At, HistoryLimits, Hub, Message, Variant};
use crate::proto::PayloadKind;
use proptest::prelude::*;
use std::sync::Arc;

const SEED: u64 = 0x5eed;
const NODES: usize = 3;
const CLIENTS: usize = 5;
const CHANNELS: [&str; 3] = ["c0", "c1", "c2"];
/// The slow client: a queue of about seven messages, the oldest dropped (a
/// resume's replay, three messages and their gaps, fits in it).
const SLOW: usize = 4;
const SLOW_QUEUE: usize = 400;
const HISTORY: HistoryLimits = HistoryLimits {
    max_messages: 3,
    max_age_ms: 250,
    max_bytes: usize::MAX,
    tenant_max_bytes: usize::MAX,
};

#[derive(Debug, Clone)]
enum Op {
    /// The source gets a record for `channel`; `skip` ids go to others.
    Append {
        channel: usize,
        pro_only: bool,
        skip: u64,
    },
    /// A node reads up to `n` more records.
    Read {
        node: usize,
        n: usize,
    },
    /// A node stores its cursor.
    Store {
        node: usize,
    },
    /// A node restarts: `graceful` stores its cursor first, a crash does not.
    Restart {
        node: usize,
        graceful: bool,
    },
    /// Time passes; a node sweeps.
    Sweep {
        node: usize,
        ms: u64,
    },
    /// A node forgets what its swept channels left behind (a full tomb map).
    DropTombs {
        node: usize,
    },
    Connect {
        client: usize,
        node: usize,
    },
    Disconnect {
        client: usize,
    },
    /// A slow client reads what it was sent (the others read at once).
    Drain {
        client: usize,
    },
    /// The source's retention deletes all but the last `keep` records: a
    /// node that had not read them never will (the shared log's prune, a
    /// Kafka position out of range).
    Prune {
        keep: usize,
    },
    /// The tenant's source is changed to another (another position space):
    /// every node's reader starts on it, records of the old one it had not
    /// read are left behind.
    NewSource,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop::bool::weighted(0.2), 0..3u64)
            .prop_map(|(channel, pro_only, skip)| Op::Append { channel, pro_only, skip }),
        5 => (0..NODES, 1..4usize).prop_map(|(node, n)| Op::Read { node, n }),
        2 => (0..NODES).prop_map(|node| Op::Store { node }),
        1 => (0..NODES, any::<bool>()).prop_map(|(node, graceful)| Op::Restart { node, graceful }),
        2 => (0..NODES, 0..400u64).prop_map(|(node, ms)| Op::Sweep { node, ms }),
        1 => (0..NODES).prop_map(|node| Op::DropTombs { node }),
        4 => (0..CLIENTS, 0..NODES).prop_map(|(client, node)| Op::Connect { client, node }),
        3 => (0..CLIENTS).prop_map(|client| Op::Disconnect { client }),
        2 => Just(Op::Drain { client: SLOW }),
        1 => (0..6usize).prop_map(|keep| Op::Prune { keep }),
        1 => Just(Op::NewSource),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Record {
    /// The source (position space) it came from: 0, then 1 after a change…
    space: u32,
    stream: u32,
    number: u64,
    channel: usize,
    pro_only: bool,
}

impl Record {
    fn seq(&self) -> u64 {
        At {
            pos: self.pos(),
            index: 0,
        }
        .seq()
    }

    fn pos(&self) -> SourcePos {
        SourcePos {
            stream: self.stream,
            order: (self.number, 0),
            number: self.number,
        }
    }

    fn for_audience(&self, audience: Option<&str>) -> bool {
        !self.pro_only || audience == Some("pro")
    }
}

struct Node {
    hub: Hub,
    /// Records read (a prefix of the log, in log order).
    pos: usize,
    /// The highest number read.
    read: u64,
    /// The stored cursor: (records read, highest number read).
    stored: (usize, u64),
}

struct Client {
    channel: usize,
    audience: Option<&'static str>,
    node: Option<(usize, Arc<SessionHandle>)>,
    epoch: Option<u64>,
    /// The position space of `epoch`.
    space: u32,
    /// The last position seen or told missing.
    last: u64,
    /// Where the client's first subscription began: the first record its
    /// node had not read then (what came before is not the client's).
    start: Option<usize>,
    received: Vec<(u32, u64)>,
    /// (space, from, to)
    gaps: Vec<(u32, u64, u64)>,
}

struct World {
    log: Vec<Record>,
    next: [u64; 2],
    streams: usize,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    now: u64,
    /// Records below this index were deleted by retention.
    pruned: usize,
    /// The source read now.
    space: u32,
}

/// The position space of a channel's `epoch`, among the sources so far.
fn space_of(epoch: u64, channel: &str, spaces: u32) -> u32 {
    (0..=spaces)
        .find(|&k| shared_epoch(SEED + k as u64, channel) == epoch)
        .expect("an epoch of one of the sources")
}

fn hub(streams: usize, stored_read: u64, space: u32) -> Hub {
    let h = Hub::default();
    h.new_source(Some(SEED + space as u64));
    h.reading_from(stored_read, streams, false);
    h
}

impl World {
    fn new(streams: usize) -> World {
        World {
            log: Vec::new(),
            next: [0; 2],
            streams,
            nodes: (0..NODES)
                .map(|_| Node {
                    hub: hub(streams, 0, 0),
                    pos: 0,
                    read: 0,
                    stored: (0, 0),
                })
                .collect(),
            clients: (0..CLIENTS)
                .map(|i| Client {
                    channel: i % 3,
                    audience: if i == 3 { Some("pro") } else { None },
                    node: None,
                    epoch: None,
                    space: 0,
                    last: 0,
                    start: None,
                    received: Vec::new(),
                    gaps: Vec::new(),
                })
                .collect(),
            now: 0,
            pruned: 0,
            space: 0,
        }
    }

    /// Every node's reader moves to a new source at once (an admin change).
    fn new_source(&mut self) {
        self.space += 1;
        self.next = [0; 2];
        let seed = SEED + self.space as u64;
        for nd in self.nodes.iter_mut() {
            nd.hub.new_source(Some(seed));
            nd.hub.reading_from(0, self.streams, false);
            nd.pos = self.log.len();
            nd.read = 0;
            nd.stored = (nd.pos, 0);
        }
        self.check_all();
    }

    fn append(&mut self, channel: usize, pro_only: bool, skip: u64) {
        // With two streams, c2 is the second's (a partition of its own).
        let stream = if self.streams > 1 && channel == 2 {
            1
        } else {
            0
        };
        self.next[stream] += 1 + skip;
        self.log.push(Record {
            space: self.space,
            stream: stream as u32,
            number: self.next[stream],
            channel,
            pro_only,
        });
    }

    fn read_on(&mut self, node: usize, n: usize) {
        // Records deleted before this node read them: reported, skipped.
        if self.nodes[node].pos < self.pruned {
            let lost = &self.log[self.nodes[node].pos..self.pruned];
            for stream in 0..2u32 {
                if let Some(top) = lost
                    .iter()
                    .filter(|r| r.stream == stream)
                    .map(|r| r.number)
                    .max()
                {
                    self.nodes[node].hub.skip_to(stream, top);
                    self.nodes[node].read = self.nodes[node].read.max(top);
                }
            }
            self.nodes[node].pos = self.pruned;
        }
        let end = self.nodes[node].pos.saturating_add(n).min(self.log.len());
        for i in self.nodes[node].pos..end {
            let r = self.log[i];
            let nd = &mut self.nodes[node];
            nd.hub.read_to(r.stream, r.number);
            nd.read = nd.read.max(r.number);
            let payload = format!("{{\"i\":{i}}}");
            let variants = vec![Variant {
                payload: payload.as_bytes(),
                kind: PayloadKind::Json,
                audience: r.pro_only.then_some("pro"),
            }];
            let m = Message {
                channel: CHANNELS[r.channel],
                key: None,
                variants,
                at: Some(At {
                    pos: r.pos(),
                    index: 0,
                }),
            };
            let (seq, _) = nd
                .hub
                .publish_at(&m, &[], HISTORY, self.now)
                .expect("a node reads each record once");
            assert_eq!(seq, r.seq(), "no rebase: one stream per channel");
        }
        self.nodes[node].pos = end;
        self.check_all();
    }

    fn restart(&mut self, node: usize, graceful: bool) {
        for c in 0..CLIENTS {
            if self.clients[c]
                .node
                .as_ref()
                .is_some_and(|(n, _)| *n == node)
            {
                self.disconnect(c);
            }
        }
        let nd = &mut self.nodes[node];
        if graceful {
            nd.stored = (nd.pos, nd.read);
        }
        nd.hub = hub(self.streams, nd.stored.1, self.space);
        nd.pos = nd.stored.0;
        nd.read = nd.stored.1;
    }

    fn connect(&mut self, client: usize, node: usize) {
        if self.clients[client].node.is_some() {
            return;
        }
        let c = &self.clients[client];
        let handle = SessionHandle::new(
            Wire::Ws,
            if client == SLOW { SLOW_QUEUE } else { 1 << 24 },
            SlowConsumer::DropOldest,
            c.audience.map(Into::into),
        );
        let resume = c.epoch.map(|e| (c.last, Some(e)));
        let mut ack = (0, 0);
        let r = self.nodes[node].hub.subscribe(
            CHANNELS[c.channel],
            &handle,
            resume,
            HISTORY,
            self.now,
            |e, h| ack = (e, h),
        );
        assert_eq!((r.epoch, r.head), ack);
        let c = &mut self.clients[client];
        let space = space_of(r.epoch, CHANNELS[c.channel], self.space);
        match c.epoch {
            Some(e) if e == r.epoch => {}
            // The source changed while the client was away: its positions
            // mean nothing here, history is replayed from its start.
            Some(_) => {
                assert!(space > c.space, "client {client}: an older epoch");
                c.epoch = Some(r.epoch);
                c.space = space;
                c.last = 0;
            }
            None => {
                c.epoch = Some(r.epoch);
                c.space = space;
                c.last = r.head;
                c.start = Some(self.nodes[node].pos);
            }
        }
        c.node = Some((node, handle));
        self.check(client);
    }

    fn disconnect(&mut self, client: usize) {
        self.check(client);
        if let Some((node, h)) = self.clients[client].node.take() {
            let ch = CHANNELS[self.clients[client].channel];
            self.nodes[node].hub.unsubscribe(ch, &h);
        }
    }

    /// Every client but the slow one reads what it was sent.
    fn check_all(&mut self) {
        for c in 0..CLIENTS {
            if c != SLOW {
                self.check(c);
            }
        }
    }

    /// Takes what a client was sent and checks it frame by frame.
    fn check(&mut self, client: usize) {
        let c = &mut self.clients[client];
        let Some((_, h)) = &c.node else { return };
        for item in h.take_queued() {
            match item {
                Item::Ctrl(b) => {
                    let v: serde_json::Value = serde_json::from_slice(&b[2..]).unwrap();
                    if v["op"] == "ack" {
                        // No id: the channel's epoch changed (a new source).
                        assert!(v["id"].is_null(), "client {client}: {v}");
                        let e = v["epoch"].as_u64().unwrap();
                        let k = space_of(e, CHANNELS[c.channel], self.space);
                        assert!(k > c.space, "client {client}: back to an older epoch {v}");
                        c.epoch = Some(e);
                        c.space = k;
                        c.last = v["seq"].as_u64().unwrap();
                        continue;
                    }
                    assert_eq!(v["op"], "gap", "client {client}: unexpected {v}");
                    let (from, to) = (v["from"].as_u64().unwrap(), v["to"].as_u64().unwrap());
                    // A gap may reach back over what the client has (a queue that
                    // dropped messages knows their `prev`, not the client's
                    // last), never start past it.
                    assert!(
                        from <= c.last + 1,
                        "client {client}: gap {v} after {}",
                        c.last
                    );
                    assert!(to >= from, "client {client}: empty gap {v}");
                    c.gaps.push((c.space, from, to));
                    c.last = c.last.max(to);
                }
                Item::Msg(m) => {
                    assert_eq!(Some(m.epoch), c.epoch, "client {client}: epoch changed");
                    assert!(
                        m.seq > c.last,
                        "client {client}: seq {} after {}",
                        m.seq,
                        c.last
                    );
                    assert!(
                        m.prev <= c.last,
                        "client {client}: message {} has prev {} past {}: a silent hole",
                        m.seq,
                        m.prev,
                        c.last
                    );
                    let v: serde_json::Value = serde_json::from_slice(m.json()).unwrap();
                    let r = self.log[v["data"]["i"].as_u64().unwrap() as usize];
                    assert_eq!(r.space, c.space, "client {client}: another source's record");
                    assert_eq!(r.seq(), m.seq, "client {client}: the record's position");
                    assert_eq!(r.channel, c.channel);
                    assert!(r.for_audience(c.audience));
                    c.received.push((c.space, m.seq));
                    c.last = m.seq;
                }
            }
        }
        // The server closed it (a slow reader's control frames overflowed
        // its queue): the client is disconnected and resumes later.
        if h.close_reason().is_some() {
            c.node = None;
        }
    }

    /// Everyone catches up; every client resumes; then the promise. With
    /// several streams a node cannot tell which one a channel it does not
    /// know is fed by, so a resume there is settled by the channel's next
    /// message: each channel gets one more before the promise is checked.
    fn settle(&mut self) {
        for n in 0..NODES {
            self.read_on(n, usize::MAX);
        }
        for c in 0..CLIENTS {
            if self.clients[c].node.is_none() && self.clients[c].epoch.is_some() {
                self.connect(c, c % NODES);
            }
        }
        if self.streams > 1 {
            for ch in 0..CHANNELS.len() {
                self.append(ch, false, 0);
            }
            for n in 0..NODES {
                self.read_on(n, usize::MAX);
            }
        }
        self.check_all();
        self.check(SLOW);
        // A client the server closed meanwhile (its queue overflowed with
        // control frames) comes back and resumes.
        for c in 0..CLIENTS {
            if self.clients[c].node.is_none() && self.clients[c].epoch.is_some() {
                self.connect(c, c % NODES);
                self.check(c);
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            let Some(start) = c.start else { continue };
            for r in &self.log[start..] {
                if r.channel != c.channel || !r.for_audience(c.audience) {
                    continue;
                }
                let s = r.seq();
                // A source the client moved past: the epoch change told it
                // that the rest of the old one is not coming.
                let left_behind = r.space < c.space;
                assert!(
                    left_behind
                        || c.received.contains(&(r.space, s))
                        || c.gaps
                            .iter()
                            .any(|(k, a, b)| *k == r.space && *a <= s && s <= *b),
                    "client {i} neither got {r:?} (seq {s}) nor a gap over it: received {:?}, gaps {:?}",
                    c.received,
                    c.gaps
                );
            }
        }
    }
}

fn run(streams: usize, ops: &[Op]) {
    let mut w = World::new(streams);
    for op in ops {
        match *op {
            Op::Append {
                channel,
                pro_only,
                skip,
            } => w.append(channel, pro_only, skip),
            Op::Read { node, n } => w.read_on(node, n),
            Op::Store { node } => {
                let nd = &mut w.nodes[node];
                nd.stored = (nd.pos, nd.read);
            }
            Op::Restart { node, graceful } => w.restart(node, graceful),
            Op::Sweep { node, ms } => {
                w.now += ms;
                w.nodes[node].hub.sweep(HISTORY, w.now);
                w.check_all();
            }
            Op::DropTombs { node } => w.nodes[node].hub.drop_tombs(),
            Op::Connect { client, node } => w.connect(client, node),
            Op::Disconnect { client } => w.disconnect(client),
            Op::Drain { client } => w.check(client),
            Op::Prune { keep } => w.pruned = w.pruned.max(w.log.len().saturating_sub(keep)),
            Op::NewSource => w.new_source(),
        }
    }
    w.settle();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: super::cases(),
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]
    #[test]
    fn one_stream_every_client_gets_every_message_or_a_gap_on_any_node(ops in prop::collection::vec(op(), 1..80)) {
        run(1, &ops);
    }

    #[test]
    fn two_streams_every_client_gets_every_message_or_a_gap_on_any_node(ops in prop::collection::vec(op(), 1..80)) {
        run(2, &ops);
    }
}

/// The first case, fixed: a client saw S, left, three more records
/// were read, the node restarted past them; the resume reports them.
#[test]
fn a_restart_past_what_a_client_missed() {
    let ops = [
        Op::Connect { client: 0, node: 0 },
        Op::Append {
            channel: 0,
            pro_only: false,
            skip: 0,
        },
        Op::Read { node: 0, n: 1 },
        Op::Disconnect { client: 0 },
        Op::Append {
            channel: 0,
            pro_only: false,
            skip: 0,
        },
        Op::Append {
            channel: 0,
            pro_only: false,
            skip: 0,
        },
        Op::Append {
            channel: 0,
            pro_only: false,
            skip: 0,
        },
        Op::Read { node: 0, n: 3 },
        Op::Restart {
            node: 0,
            graceful: true,
        },
        Op::Connect { client: 0, node: 0 },
    ];
    run(1, &ops);
}
