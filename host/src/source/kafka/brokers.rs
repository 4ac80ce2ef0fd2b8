//! What a Kafka source asks the brokers: topic metadata, offsets, assignment.
//!
//! Owns: the blocking librdkafka calls (callers run them off the runtime, in
//! `spawn_blocking`) and turning their answers into partitions.rs's terms.
//! Invariants: offsets for many partitions are asked in one request per
//! broker (ListOffsets), never one round trip per partition, so a probe's
//! time does not grow with the partition count; every call has a timeout.

use super::partitions::{key, Partitions, Plan, StartAt};
use super::KafkaStart;
use parking_lot::Mutex;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

/// The partitions of `topic`, or why they cannot be had.
pub fn partitions<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, String> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("cannot reach the brokers: {e}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("topic {topic:?} does not exist"))?;
    if let Some(e) = t.error() {
        return Err(format!("topic {topic:?}: {e:?}"));
    }
    if t.partitions().is_empty() {
        return Err(format!("topic {topic:?} does not exist"));
    }
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

/// Every topic with its partitions, as the brokers know them now.
pub fn find<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<(String, Vec<i32>)>, String> {
    topics
        .iter()
        .map(|t| Ok((t.clone(), partitions(consumer, t, timeout)?)))
        .collect()
}

/// Asks for one offset per partition: `query` holds, in the offset field, a
/// time in ms, `Offset::End` (the latest offset) or `Offset::Beginning` (the
/// earliest). Returns the answers in the order asked; `None` where no record
/// is at or after the time asked.
fn offsets<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    query: &[(String, i32, Offset)],
    timeout: Duration,
) -> Result<Vec<Option<i64>>, String> {
    if query.is_empty() {
        return Ok(Vec::new());
    }
    let mut tpl = TopicPartitionList::new();
    for (topic, p, at) in query {
        tpl.add_partition_offset(topic, *p, *at)
            .map_err(|e| e.to_string())?;
    }
    let found = consumer
        .offsets_for_times(tpl, timeout)
        .map_err(|e| format!("cannot reach the brokers: {e}"))?;
    query
        .iter()
        .map(|(topic, p, _)| {
            let e = found
                .find_partition(topic, *p)
                .ok_or_else(|| format!("no offset for {}", key(topic, *p)))?;
            e.error()
                .map_err(|err| format!("offsets of {}: {err}", key(topic, *p)))?;
            Ok(match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
        })
        .collect()
}

/// The latest offset of each partition (the high watermark, or the last
/// stable offset under read_committed), in the order given.
pub fn latest<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    positions: &[(String, i32, i64)],
    timeout: Duration,
) -> Result<Vec<i64>, String> {
    let query: Vec<_> = positions
        .iter()
        .map(|(t, p, _)| (t.clone(), *p, Offset::End))
        .collect();
    offsets(consumer, &query, timeout)?
        .into_iter()
        .zip(positions)
        .map(|(o, (t, p, _))| o.ok_or_else(|| format!("no latest offset for {}", key(t, *p))))
        .collect()
}

/// Where each planned partition starts: the offset to assign, and the next
/// offset to count its lag from.
/// A partition whose stored position fell below the brokers' earliest:
/// (topic, partition, that earliest offset).
type Skipped = (String, i32, i64);

/// Where each plan starts (the offset to assign, the next to deliver), and
/// the partitions that skipped records.
type Resolved = (Vec<(Offset, i64)>, Vec<Skipped>);

fn resolve<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    plans: &[Plan],
    timeout: Duration,
) -> Result<Resolved, String> {
    let ask = |p: &Plan| match p.start {
        StartAt::Offset(_) => None,
        StartAt::Latest => Some(Offset::End),
        StartAt::Beginning => Some(Offset::Beginning),
        StartAt::Timestamp(ms) => Some(Offset::Offset(ms as i64)),
    };
    let query: Vec<_> = plans
        .iter()
        .filter_map(|p| Some((p.topic.clone(), p.partition, ask(p)?)))
        .collect();
    let mut answers = offsets(consumer, &query, timeout)?.into_iter();
    // A time after every record of a partition: it starts at its latest offset.
    let mut after_all = Vec::new();
    let mut skipped = Vec::new();
    let mut resolved = Vec::with_capacity(plans.len());
    for p in plans {
        let answer = if ask(p).is_some() {
            answers.next().flatten()
        } else {
            None
        };
        resolved.push(match (p.start, answer) {
            (StartAt::Offset(o), _) => {
                // A stored position the brokers no longer hold (retention
                // deleted the records after it) must not jump anywhere in
                // silence: it starts at the earliest they hold, and the
                // records between are reported (`Partitions::skipped`).
                let (low, high) = consumer
                    .fetch_watermarks(&p.topic, p.partition, timeout)
                    .map_err(|e| format!("watermarks of {}: {e}", key(&p.topic, p.partition)))?;
                if o > high {
                    // Offsets this node read are not there (a topic deleted
                    // and made again, an unclean leader election): the
                    // records that take them are others, and would be
                    // dropped as re-reads. Stalled, loudly, until an
                    // operator chooses.
                    return Err(format!(
                        "this node read {} up to offset {o}, but the brokers hold only up to {high}: the topic was re-created or lost records; set the source again with a higher `generation` to start a new position space",
                        key(&p.topic, p.partition)
                    ));
                }
                if o < low {
                    skipped.push((p.topic.clone(), p.partition, low));
                    (Offset::Offset(low), low)
                } else {
                    (Offset::Offset(o), o)
                }
            }
            // Assigned as "beginning", not as today's earliest offset: if
            // retention removes records meanwhile, reading still starts.
            (StartAt::Beginning, Some(low)) => (Offset::Beginning, low),
            (_, Some(o)) => (Offset::Offset(o), o),
            (StartAt::Timestamp(_), None) => {
                after_all.push((p.topic.clone(), p.partition, Offset::End));
                (Offset::End, 0)
            }
            (_, None) => return Err(format!("no offset for {}", key(&p.topic, p.partition))),
        });
    }
    let mut latest = offsets(consumer, &after_all, timeout)?.into_iter();
    for r in resolved.iter_mut().filter(|r| r.0 == Offset::End) {
        let o = latest
            .next()
            .flatten()
            .ok_or("no latest offset for a partition")?;
        *r = (Offset::Offset(o), o);
    }
    Ok((resolved, skipped))
}

/// Assigns the partitions in `found` that are not assigned yet (each where
/// `Partitions` says it starts) and returns how many there were. Adds to the
/// assignment, never replaces it: partitions being read are not disturbed.
pub fn assign_new<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    partitions: &Mutex<Partitions>,
    found: &[(String, Vec<i32>)],
    start: KafkaStart,
    timeout: Duration,
) -> Result<usize, String> {
    let plans = partitions.lock().unassigned(found, start);
    if plans.is_empty() {
        return Ok(0);
    }
    let (resolved, skipped) = resolve(consumer, &plans, timeout)?;
    let mut tpl = TopicPartitionList::new();
    for (plan, (offset, _)) in plans.iter().zip(&resolved) {
        tpl.add_partition_offset(&plan.topic, plan.partition, *offset)
            .map_err(|e| e.to_string())?;
    }
    consumer
        .incremental_assign(&tpl)
        .map_err(|e| format!("assigning partitions: {e}"))?;
    let mut p = partitions.lock();
    for (topic, partition, earliest) in skipped {
        p.skipped(&topic, partition, earliest);
    }
    for (plan, (_, next)) in plans.iter().zip(&resolved) {
        p.assigned(&plan.topic, plan.partition, *next);
    }
    Ok(plans.len())
}
