//! The model of the position promise over the whole system: one source
//! (one or two streams, sparse numbers), several nodes reading it at their
//! own pace, each with its own hub, a stored cursor, restarts (graceful, or
//! a crash past the stored cursor), sweeps and history expiry, tombs
//! forgotten, retention deleting records some node had not read yet,
//! clients that leave and resume on any node, a slow client whose small
//! queue drops the oldest messages, and late records: an id drawn before
//! others but committed after them (an outbox row of a slow transaction),
//! read after them, which makes its channel rebase. Each run models one
//! kind of source (`Source`): late records come only from an outbox, and
//! retention only deletes from the log and Kafka.
//!
//! Oracle, the promise itself (with several streams, once each channel has
//! had one more message: see `World::settle`): from the record its node had not read when a
//! client first subscribed, every message of its channel meant for its audience reaches it once,
//! in order, or lies inside a `gap` it was sent, or past the client's last
//! position in an epoch it was moved off (an epoch change, which clients
//! report as a gap); within an epoch, across resumes on any node, `seq` only
//! increases and `prev` never points past what the client saw or was told
//! it cannot have.
//!
//! `PROPTEST_CASES=10000 cargo test -p herald-host --lib fanout::model::system`
//! runs a longer search than the test command's 256 cases.

use super::super::HistoryLimits;
use proptest::prelude::*;
use world::World;

mod world;

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
    /// The source gets a record for `channel`; `skip` ids go to others
    /// (transactions that commit later, or never).
    Append {
        channel: usize,
        pro_only: bool,
        skip: u64,
    },
    /// A transaction that drew a skipped id (the `pick`th still unused of
    /// the channel's stream) commits now: its record comes after the others
    /// in reading order, with a lower number.
    Late {
        channel: usize,
        pick: usize,
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
        1 => (0..3usize, 0..4usize).prop_map(|(channel, pick)| Op::Late { channel, pick }),
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

/// What kind of source the nodes read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// One stream whose records may come late (an outbox table: ids drawn
    /// before commit); Herald deletes nothing from it.
    Outbox,
    /// One stream in commit order, pruned by retention (the shared log).
    Log,
    /// Two streams (Kafka partitions), numbers growing in each, retention.
    Partitions,
}

fn run(source: Source, ops: &[Op]) {
    let streams = if source == Source::Partitions { 2 } else { 1 };
    let mut w = World::new(streams);
    for op in ops {
        match *op {
            Op::Append {
                channel,
                pro_only,
                skip,
            } => w.append(channel, pro_only, skip),
            Op::Late { channel, pick } if source == Source::Outbox => w.late(channel, pick),
            Op::Late { .. } => {}
            Op::Read { node, n } => w.read_on(node, n),
            Op::Store { node } => w.store(node),
            Op::Restart { node, graceful } => w.restart(node, graceful),
            Op::Sweep { node, ms } => w.sweep(node, ms),
            Op::DropTombs { node } => w.drop_tombs(node),
            Op::Connect { client, node } => w.connect(client, node),
            Op::Disconnect { client } => w.disconnect(client),
            Op::Drain { client } => w.check(client),
            Op::Prune { .. } if source == Source::Outbox => {}
            Op::Prune { keep } => w.prune(keep),
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
    fn an_outbox_every_client_gets_every_message_or_a_gap_on_any_node(ops in prop::collection::vec(op(), 1..80)) {
        run(Source::Outbox, &ops);
    }

    #[test]
    fn one_stream_every_client_gets_every_message_or_a_gap_on_any_node(ops in prop::collection::vec(op(), 1..80)) {
        run(Source::Log, &ops);
    }

    #[test]
    fn two_streams_every_client_gets_every_message_or_a_gap_on_any_node(ops in prop::collection::vec(op(), 1..80)) {
        run(Source::Partitions, &ops);
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
    run(Source::Log, &ops);
}
