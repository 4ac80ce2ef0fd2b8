//! Source positions: where a record sits in the source that delivered it.
//!
//! Owns: the one description every source gives of a record's place, which
//! the hub turns into channel positions (`seq`) and duplicate checks. See
//! "Positions" in ARCHITECTURE.md for the model. Invariants: within one
//! `stream` a source delivers records in increasing `order`; `number` is the
//! same on every node for the same record, so `seq` derived from it is too.
//! Never: compare `order` across streams (two Kafka partitions have no order
//! between them).

/// A record's place in its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourcePos {
    /// One ordered stream of the source: a Kafka partition (see
    /// `source::kafka::stream_id`), or the outbox table (stream 0).
    pub stream: u32,
    /// Delivery order within the stream; compared lexicographically. Outbox:
    /// `(xid8, id)`; Kafka: `(offset + 1, 0)`.
    pub order: (u64, u64),
    /// The number the record's messages take their `seq` from: the outbox
    /// id, or the Kafka offset + 1 (never 0).
    pub number: u64,
}

/// How many messages one record may become (over all its channels); its
/// message `i` (in the plugin's output order) of a record numbered `n` is
/// published at `seq = n × MESSAGES_PER_RECORD + i`.
pub const MESSAGES_PER_RECORD: u64 = 1000;
