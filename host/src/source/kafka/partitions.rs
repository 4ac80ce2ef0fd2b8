//! Which partitions a Kafka reader reads and where it stands in each, without I/O.
//!
//! Owns: the start rule for a partition being assigned, this node's next
//! offset per partition, and the lag computed from the brokers' latest
//! offsets. Invariants: a partition is assigned once per connection; a
//! partition that appears after this node first read its topics (added to
//! the topic later, while this node ran or while it was away) starts at its
//! beginning — every record in it is new — and never at "latest"; only the
//! first assignment of a node without stored positions uses `start`.

use super::KafkaStart;
use std::collections::{BTreeMap, BTreeSet};

/// Where an unassigned partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// This node's stored position: the next offset to deliver.
    Offset(i64),
    Beginning,
    Latest,
    /// The first record at or after this time (ms since the Unix epoch).
    Timestamp(u64),
}

/// One partition to assign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub topic: String,
    pub partition: i32,
    pub start: StartAt,
}

/// The registry's key for a partition's position.
pub fn key(topic: &str, partition: i32) -> String {
    format!("{topic}:{partition}")
}

/// This node's place in every partition of its topics.
#[derive(Debug, Default)]
pub struct Partitions {
    /// `topic:partition` → the next offset to deliver. Holds the stored
    /// positions until their partitions are assigned, then every assigned one.
    next: BTreeMap<String, i64>,
    assigned: BTreeSet<(String, i32)>,
    /// Partitions found from now on were added after this node first read
    /// its topics: true once positions were stored or anything was assigned.
    resumed: bool,
    /// Partitions whose stored position had fallen out of the brokers'
    /// retention: (topic, partition, the earliest offset they still hold).
    /// The records between were never read here: the reader reports them.
    skipped: Vec<(String, i32, i64)>,
}

impl Partitions {
    /// Starts from the positions stored in the registry (empty on a new node).
    pub fn new(stored: BTreeMap<String, i64>) -> Partitions {
        Partitions {
            resumed: !stored.is_empty(),
            next: stored,
            assigned: BTreeSet::new(),
            skipped: Vec::new(),
        }
    }

    /// The partitions in `found` (topic → its partition ids) not yet
    /// assigned, each with where it starts.
    pub fn unassigned(&self, found: &[(String, Vec<i32>)], start: KafkaStart) -> Vec<Plan> {
        let mut plans = Vec::new();
        for (topic, ids) in found {
            for &partition in ids {
                if self.assigned.contains(&(topic.clone(), partition)) {
                    continue;
                }
                let start = match self.next.get(&key(topic, partition)) {
                    Some(&o) => StartAt::Offset(o),
                    None if self.resumed => StartAt::Beginning,
                    None => match start {
                        KafkaStart::Latest => StartAt::Latest,
                        KafkaStart::Earliest => StartAt::Beginning,
                        KafkaStart::Timestamp(ms) => StartAt::Timestamp(ms),
                    },
                };
                plans.push(Plan {
                    topic: topic.clone(),
                    partition,
                    start,
                });
            }
        }
        plans
    }

    /// Records that `partition`'s stored position had fallen below what the
    /// brokers still hold: it starts at `earliest` instead.
    pub fn skipped(&mut self, topic: &str, partition: i32, earliest: i64) {
        self.skipped.push((topic.to_string(), partition, earliest));
    }

    /// The skips recorded since the last call.
    pub fn take_skipped(&mut self) -> Vec<(String, i32, i64)> {
        std::mem::take(&mut self.skipped)
    }

    /// Records that `partition` was assigned and the offset it reads next. A
    /// record of it may already have been delivered (reading starts with the
    /// assignment): a position never moves back.
    pub fn assigned(&mut self, topic: &str, partition: i32, next: i64) {
        self.assigned.insert((topic.to_string(), partition));
        self.next
            .entry(key(topic, partition))
            .and_modify(|n| *n = (*n).max(next))
            .or_insert(next);
        self.resumed = true;
    }

    /// Records that the record at `offset` was delivered.
    pub fn delivered(&mut self, topic: &str, partition: i32, offset: i64) {
        self.next.insert(key(topic, partition), offset + 1);
    }

    /// How many partitions are assigned.
    pub fn count(&self) -> usize {
        self.assigned.len()
    }

    /// The assigned partitions with the next offset of each.
    pub fn positions(&self) -> Vec<(String, i32, i64)> {
        self.assigned
            .iter()
            .map(|(t, p)| {
                (
                    t.clone(),
                    *p,
                    self.next.get(&key(t, *p)).copied().unwrap_or(0),
                )
            })
            .collect()
    }

    /// The positions as the registry stores them (`{"topic:partition": next}`).
    pub fn encoded(&self) -> String {
        serde_json::to_string(&self.next).unwrap_or_default()
    }

    /// As [`encoded`](Self::encoded), each partition's position lowered to
    /// `cap(topic, partition)` where that is lower (a record a conflation
    /// window still holds must be read again after a crash).
    pub fn encoded_capped(&self, cap: impl Fn(&str, i32) -> Option<i64>) -> String {
        let capped: BTreeMap<&str, i64> = self
            .next
            .iter()
            .map(|(key, &next)| {
                let c = key
                    .rsplit_once(':')
                    .and_then(|(t, p)| cap(t, p.parse().ok()?));
                (key.as_str(), c.map_or(next, |c| next.min(c)))
            })
            .collect();
        serde_json::to_string(&capped).unwrap_or_default()
    }
}

/// Records beyond this node's positions: for each partition, its latest
/// offset (`latest`, same order as `positions`) minus the next one to deliver.
pub fn lag(positions: &[(String, i32, i64)], latest: &[i64]) -> u64 {
    positions
        .iter()
        .zip(latest)
        .map(|((_, _, next), high)| (high - next).max(0) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(topic: &str, n: i32) -> Vec<(String, Vec<i32>)> {
        vec![(topic.to_string(), (0..n).collect())]
    }

    fn starts(plans: &[Plan]) -> Vec<(i32, StartAt)> {
        plans.iter().map(|p| (p.partition, p.start)).collect()
    }

    #[test]
    fn a_new_node_starts_where_it_was_told() {
        let p = Partitions::new(BTreeMap::new());
        let plans = p.unassigned(&found("t", 2), KafkaStart::Latest);
        assert_eq!(starts(&plans), [(0, StartAt::Latest), (1, StartAt::Latest)]);
        let plans = p.unassigned(&found("t", 1), KafkaStart::Timestamp(5));
        assert_eq!(starts(&plans), [(0, StartAt::Timestamp(5))]);
        let plans = p.unassigned(&found("t", 1), KafkaStart::Earliest);
        assert_eq!(starts(&plans), [(0, StartAt::Beginning)]);
    }

    #[test]
    fn partitions_added_while_reading_start_at_their_beginning() {
        let mut p = Partitions::new(BTreeMap::new());
        for plan in p.unassigned(&found("t", 2), KafkaStart::Latest) {
            p.assigned(&plan.topic, plan.partition, 40);
        }
        assert_eq!(p.count(), 2);
        // The same metadata again: nothing to do.
        assert!(p.unassigned(&found("t", 2), KafkaStart::Latest).is_empty());
        // Two partitions added to the topic: from their beginning, never "latest".
        let plans = p.unassigned(&found("t", 4), KafkaStart::Latest);
        assert_eq!(
            starts(&plans),
            [(2, StartAt::Beginning), (3, StartAt::Beginning)]
        );
        for plan in &plans {
            p.assigned(&plan.topic, plan.partition, 0);
        }
        assert_eq!(p.count(), 4);
        assert_eq!(p.encoded(), r#"{"t:0":40,"t:1":40,"t:2":0,"t:3":0}"#);
    }

    #[test]
    fn partitions_added_while_the_node_was_away_start_at_their_beginning() {
        let stored = BTreeMap::from([("t:0".to_string(), 7), ("t:1".to_string(), 9)]);
        let p = Partitions::new(stored);
        let plans = p.unassigned(&found("t", 3), KafkaStart::Latest);
        assert_eq!(
            starts(&plans),
            [
                (0, StartAt::Offset(7)),
                (1, StartAt::Offset(9)),
                (2, StartAt::Beginning)
            ]
        );
    }

    #[test]
    fn positions_and_lag_follow_deliveries() {
        let mut p = Partitions::new(BTreeMap::new());
        p.assigned("t", 0, 10);
        p.assigned("t", 1, 0);
        p.delivered("t", 0, 14);
        let positions = p.positions();
        assert_eq!(positions, [("t".into(), 0, 15), ("t".into(), 1, 0)]);
        // Latest offsets 20 and 3: 5 + 3 behind; a latest below ours counts 0.
        assert_eq!(lag(&positions, &[20, 3]), 8);
        assert_eq!(lag(&positions, &[12, 0]), 0);
    }
}
