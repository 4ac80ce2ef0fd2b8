//! The simulated system of the position model: the source's log, nodes
//! (each a hub with its reader's place and stored cursor) and clients that
//! check every frame they are sent; `World::settle` checks the promise.

use super::super::super::channel::shared_epoch;
use super::super::super::position::SourcePos;
use super::super::super::queue::{Item, SlowConsumer, Wire};
use super::super::super::session::SessionHandle;
use super::super::super::{At, Hub, Message, Variant};
use super::{CHANNELS, CLIENTS, HISTORY, NODES, SEED, SLOW, SLOW_QUEUE};
use herald_proto::PayloadKind;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
struct Record {
    /// The source (position space) it came from: 0, then 1 after a change…
    space: u32,
    stream: u32,
    /// Where it comes in reading order (the outbox's xid).
    order: u64,
    number: u64,
    channel: usize,
    pro_only: bool,
    /// Its number is below one read before it (an id drawn earlier).
    late: bool,
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
            order: (self.order, 0),
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
    /// The records received (their index in the log).
    received: Vec<usize>,
    /// (epoch, from, to, records in the log when it was told)
    gaps: Vec<(u64, u64, u64, usize)>,
    /// Epochs the client was moved off, with its last position in each.
    left: Vec<(u64, u64)>,
}

pub(super) struct World {
    log: Vec<Record>,
    next: [u64; 2],
    orders: [u64; 2],
    /// Per stream, ids skipped by appends and not taken by a late record.
    unused: [Vec<u64>; 2],
    /// Per record, every (epoch, seq) a node published it at.
    published: HashMap<usize, Vec<(u64, u64)>>,
    /// The position space of every epoch a node published in.
    epochs: HashMap<u64, u32>,
    /// Epochs a channel rebased to: the epoch it left and the last position
    /// published in it. The new epoch's numbers up to there are the old
    /// one's (history before the rebase is replayed under the new epoch).
    rebases: HashMap<u64, (u64, u64)>,
    streams: usize,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    now: u64,
    /// Records below this index were deleted by retention.
    pruned: usize,
    /// The source read now.
    space: u32,
}

/// Whether position `seq` of `epoch` is named by `seq` of `named_in` too:
/// the same epoch, or one that rebased from it after `seq`.
fn names(rebases: &HashMap<u64, (u64, u64)>, named_in: u64, epoch: u64, seq: u64) -> bool {
    let (mut cur, mut upto) = (named_in, u64::MAX);
    loop {
        if cur == epoch && seq <= upto {
            return true;
        }
        match rebases.get(&cur) {
            Some(&(parent, last)) => {
                upto = upto.min(last);
                cur = parent;
            }
            None => return false,
        }
    }
}

/// Whether `epoch` is one that rebased, once or more, from `from`.
fn descends(rebases: &HashMap<u64, (u64, u64)>, epoch: u64, from: u64) -> bool {
    let mut cur = epoch;
    while let Some(&(parent, _)) = rebases.get(&cur) {
        if parent == from {
            return true;
        }
        cur = parent;
    }
    false
}

/// The position space of a channel's `epoch`, among the sources so far: a
/// source's shared epoch, or one a channel rebased to.
fn space_of(epochs: &HashMap<u64, u32>, epoch: u64, channel: &str, spaces: u32) -> u32 {
    if let Some(&k) = epochs.get(&epoch) {
        return k;
    }
    (0..=spaces)
        .find(|&k| shared_epoch(SEED + k as u64, channel) == epoch)
        .expect("an epoch of one of the sources")
}

/// A node's hub as its reader starts: after the stored cursor, whose last
/// record read has order `after` (what comes after it is new to the node).
fn hub(streams: usize, stored_read: u64, space: u32, after: u64) -> Hub {
    let h = Hub::default();
    h.new_source(Some(SEED + space as u64));
    h.reading_from(stored_read, streams, false);
    h.read_after((after, 0));
    h
}

impl World {
    pub(super) fn new(streams: usize) -> World {
        World {
            log: Vec::new(),
            next: [0; 2],
            orders: [0; 2],
            unused: [Vec::new(), Vec::new()],
            published: HashMap::new(),
            epochs: HashMap::new(),
            rebases: HashMap::new(),
            streams,
            nodes: (0..NODES)
                .map(|_| Node {
                    hub: hub(streams, 0, 0, 0),
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
                    left: Vec::new(),
                })
                .collect(),
            now: 0,
            pruned: 0,
            space: 0,
        }
    }

    /// Every node's reader moves to a new source at once (an admin change).
    pub(super) fn new_source(&mut self) {
        self.space += 1;
        self.next = [0; 2];
        self.unused = [Vec::new(), Vec::new()];
        let seed = SEED + self.space as u64;
        for nd in self.nodes.iter_mut() {
            nd.hub.new_source(Some(seed));
            nd.hub.reading_from(0, self.streams, false);
            nd.hub.read_after((self.orders[0], 0));
            nd.pos = self.log.len();
            nd.read = 0;
            nd.stored = (nd.pos, 0);
        }
        self.check_all();
    }

    /// The stream of `channel`: with two, c2 is the second's (a partition
    /// of its own).
    fn stream_of(&self, channel: usize) -> usize {
        if self.streams > 1 && channel == 2 {
            1
        } else {
            0
        }
    }

    pub(super) fn append(&mut self, channel: usize, pro_only: bool, skip: u64) {
        let stream = self.stream_of(channel);
        let first = self.next[stream] + 1;
        self.next[stream] += 1 + skip;
        self.unused[stream].extend(first..self.next[stream]);
        self.push(stream, self.next[stream], channel, pro_only);
    }

    pub(super) fn late(&mut self, channel: usize, pick: usize) {
        let stream = self.stream_of(channel);
        let unused = &mut self.unused[stream];
        if unused.is_empty() {
            return;
        }
        let number = unused.remove(pick % unused.len());
        self.push(stream, number, channel, false);
    }

    fn push(&mut self, stream: usize, number: u64, channel: usize, pro_only: bool) {
        self.orders[stream] += 1;
        let late = number < self.next[stream];
        self.log.push(Record {
            late,
            space: self.space,
            stream: stream as u32,
            order: self.orders[stream],
            number,
            channel,
            pro_only,
        });
    }

    pub(super) fn read_on(&mut self, node: usize, n: usize) {
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
            let epoch_of = |hub: &Hub| {
                let chans = hub.channels.lock();
                chans.get(CHANNELS[r.channel]).map(|c| c.lock().epoch)
            };
            // A channel made by this record starts on the shared epoch.
            let before = epoch_of(&nd.hub).or(Some(shared_epoch(
                SEED + r.space as u64,
                CHANNELS[r.channel],
            )));
            let (seq, report) = nd
                .hub
                .publish_at(&m, &[], HISTORY, self.now)
                .expect("a node reads each record once");
            let epoch = epoch_of(&nd.hub).expect("the channel published in");
            if !report.rebased {
                assert_eq!(seq, r.seq(), "a record's own position, unless it rebased");
            }
            if let Some(old) = before.filter(|&old| old != epoch && report.rebased) {
                self.rebases.insert(epoch, (old, seq - 1));
            }
            self.published.entry(i).or_default().push((epoch, seq));
            self.epochs.insert(epoch, r.space);
        }
        self.nodes[node].pos = end;
        self.check_all();
    }

    /// A node stores its cursor.
    pub(super) fn store(&mut self, node: usize) {
        let nd = &mut self.nodes[node];
        nd.stored = (nd.pos, nd.read);
    }

    /// Time passes; a node sweeps.
    pub(super) fn sweep(&mut self, node: usize, ms: u64) {
        self.now += ms;
        self.nodes[node].hub.sweep(HISTORY, self.now);
        self.check_all();
    }

    pub(super) fn drop_tombs(&mut self, node: usize) {
        self.nodes[node].hub.drop_tombs();
    }

    /// Retention deletes all but the last `keep` records.
    pub(super) fn prune(&mut self, keep: usize) {
        self.pruned = self.pruned.max(self.log.len().saturating_sub(keep));
    }

    pub(super) fn restart(&mut self, node: usize, graceful: bool) {
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
        let after = self.log[..nd.stored.0]
            .iter()
            .filter(|r| r.stream == 0)
            .map(|r| r.order)
            .max()
            .unwrap_or(0);
        nd.hub = hub(self.streams, nd.stored.1, self.space, after);
        nd.pos = nd.stored.0;
        nd.read = nd.stored.1;
    }

    pub(super) fn connect(&mut self, client: usize, node: usize) {
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
        let space = space_of(&self.epochs, r.epoch, CHANNELS[c.channel], self.space);
        match c.epoch {
            Some(e) if e == r.epoch => {}
            // The source changed while the client was away, or the channel
            // rebased here or where the client was: its positions mean
            // nothing here, history is replayed from its start.
            Some(old) => {
                assert!(space >= c.space, "client {client}: an older source");
                c.left.push((old, c.last));
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

    pub(super) fn disconnect(&mut self, client: usize) {
        self.check(client);
        if let Some((node, h)) = self.clients[client].node.take() {
            let ch = CHANNELS[self.clients[client].channel];
            self.nodes[node].hub.unsubscribe(ch, &h);
        }
    }

    /// Every client but the slow one reads what it was sent.
    pub(super) fn check_all(&mut self) {
        for c in 0..CLIENTS {
            if c != SLOW {
                self.check(c);
            }
        }
    }

    /// Takes what a client was sent and checks it frame by frame.
    pub(super) fn check(&mut self, client: usize) {
        let c = &mut self.clients[client];
        let Some((_, h)) = &c.node else { return };
        for item in h.take_queued() {
            match item {
                Item::Ctrl(b) => {
                    let v: serde_json::Value = serde_json::from_slice(&b[2..]).unwrap();
                    if v["op"] == "ack" {
                        // No id: the channel's epoch changed (a new source,
                        // a rebase).
                        assert!(v["id"].is_null(), "client {client}: {v}");
                        let e = v["epoch"].as_u64().unwrap();
                        let k = space_of(&self.epochs, e, CHANNELS[c.channel], self.space);
                        assert!(k >= c.space, "client {client}: back to an older source {v}");
                        assert_ne!(c.epoch, Some(e), "client {client}: told its own epoch {v}");
                        c.left.extend(c.epoch.map(|old| (old, c.last)));
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
                    c.gaps.push((c.epoch.unwrap(), from, to, self.log.len()));
                    c.last = c.last.max(to);
                }
                Item::Msg(m) => {
                    // History from before a rebase is replayed under the new
                    // epoch (WebSocket frames carry none): its numbers are
                    // the same.
                    assert!(
                        names(&self.rebases, c.epoch.unwrap(), m.epoch, m.seq),
                        "client {client}: a message of epoch {} under {:?}",
                        m.epoch,
                        c.epoch
                    );
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
                    let i = v["data"]["i"].as_u64().unwrap() as usize;
                    let r = self.log[i];
                    assert_eq!(r.space, c.space, "client {client}: another source's record");
                    assert!(
                        self.published[&i].contains(&(m.epoch, m.seq)),
                        "client {client}: record {i} at a position no node gave it"
                    );
                    assert_eq!(r.channel, c.channel);
                    assert!(r.for_audience(c.audience));
                    c.received.push(i);
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
    pub(super) fn settle(&mut self) {
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
            for (j, r) in self.log.iter().enumerate().skip(start) {
                if r.channel != c.channel || !r.for_audience(c.audience) {
                    continue;
                }
                // A source the client moved past: the epoch change told it
                // that the rest of the old one is not coming.
                let left_behind = r.space < c.space;
                // Where nodes published it, and its own position in its
                // source's shared epoch (what a node that could not read it
                // reports: `skip_to`).
                let own = (
                    shared_epoch(SEED + r.space as u64, CHANNELS[r.channel]),
                    r.seq(),
                );
                let mut at = self.published.get(&j).cloned().unwrap_or_default();
                at.push(own);
                let named = |by: u64, e: u64, s: u64| names(&self.rebases, by, e, s);
                // A gap settles its epoch up to `to` as of when it is told:
                // a late record already in the log then, numbered below
                // `to`, is inside it even below `from` (it came after the
                // client's position, in an order numbers do not show).
                let told = at.iter().any(|&(e, s)| {
                    c.gaps.iter().any(|&(ge, a, b, len)| {
                        named(ge, e, s) && s <= b && (a <= s || (r.late && j < len))
                    }) || c.left.iter().any(|&(le, last)| {
                        // Moved off an epoch: what came after its last
                        // position there, and whatever a rebase of it holds,
                        // is not coming (clients report the change as a gap).
                        (named(le, e, s) && s > last) || descends(&self.rebases, e, le)
                    })
                });
                assert!(
                    left_behind || c.received.contains(&j) || told,
                    "client {i} neither got record {j} {r:?} (published at {at:?}) nor a gap over it: received {:?}, gaps {:?}, left {:?}",
                    c.received,
                    c.gaps,
                    c.left
                );
            }
        }
    }
}
