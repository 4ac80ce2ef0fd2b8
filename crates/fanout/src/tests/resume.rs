//! The hub's unit tests of the resume protocol (ARCHITECTURE.md, "Positions"):
//! restarts, nodes behind the client, tombs, a start that skipped records,
//! rebases and source changes.

use super::*;

/// The control frames queued for `s`, as JSON.
fn ctrls(s: &SessionHandle) -> Vec<serde_json::Value> {
    s.take_queued()
        .into_iter()
        .filter_map(|i| match i {
            Item::Ctrl(b) => Some(serde_json::from_slice(&b[2..]).unwrap()),
            Item::Msg(_) => None,
        })
        .collect()
}

fn gaps(s: &SessionHandle) -> Vec<(u64, u64)> {
    ctrls(s)
        .iter()
        .filter(|v| v["op"] == "gap")
        .map(|v| (v["from"].as_u64().unwrap(), v["to"].as_u64().unwrap()))
        .collect()
}

fn sourced(read_before: u64) -> Hub {
    let hub = Hub::default();
    hub.new_source(Some(42));
    hub.reading_from(read_before, 1, false);
    hub
}

/// A restarted node (its reader resumes past record 7, its channels are
/// gone): a client that had position 2000 gets a gap up to what the node
/// read before it began, and nothing at or below it twice.
#[test]
fn a_resume_below_what_a_restarted_node_read_is_a_gap() {
    let hub = sourced(7);
    let s = session();
    let epoch = shared_epoch(42, "a");
    let r = hub.subscribe("a", &s, Some((2000, Some(epoch))), LIMITS, 0, |_, _| {});
    assert_eq!(r.gap, Some((2001, 7999)));
    assert_eq!(r.head, 7999);
    assert_eq!(gaps(&s), [(2001, 7999)]);
    // Record 8 is read and published: it is new to the client.
    hub.read_to(0, 8);
    hub.publish_at(&msg("a", at(0, 8, 0), &ONE), &[], LIMITS, 0)
        .unwrap();
    assert_eq!(msgs(&s), [(8000, 0)]);
}

/// A node behind the client (it has read up to record 3, the client saw
/// 5000 elsewhere): no replay, no gap; what it reads up to 5000 is not sent
/// again, what comes after is.
#[test]
fn a_node_behind_the_client_defers_to_its_reader() {
    let hub = sourced(0);
    for n in 1..=3 {
        hub.read_to(0, n);
        hub.publish_at(&msg("a", at(0, n, 0), &ONE), &[], LIMITS, 0)
            .unwrap();
    }
    let s = session();
    let r = hub.subscribe(
        "a",
        &s,
        Some((5000, Some(shared_epoch(42, "a")))),
        LIMITS,
        0,
        |_, _| {},
    );
    assert_eq!((r.gap, r.replayed), (None, 0));
    for n in 4..=6 {
        hub.read_to(0, n);
        hub.publish_at(&msg("a", at(0, n, 0), &ONE), &[], LIMITS, 0)
            .unwrap();
    }
    assert_eq!(msgs(&s), [(6000, 5000)]);
}

/// A channel swept while quiet leaves a tomb: a client that saw its last
/// message resumes without a false gap; one that saw less gets the gap.
#[test]
fn a_swept_channel_continues_from_its_tomb() {
    let hub = sourced(0);
    let epoch = shared_epoch(42, "a");
    for n in 1..=2 {
        hub.read_to(0, n);
        hub.publish_at(&msg("a", at(0, n, 0), &ONE), &[], LIMITS, 0)
            .unwrap();
    }
    let expire = HistoryLimits {
        max_age_ms: 10,
        ..LIMITS
    };
    assert_eq!(hub.sweep(expire, 1_000), 1);
    assert_eq!(hub.channel_count(), 0);
    let s = session();
    let r = hub.subscribe("a", &s, Some((2000, Some(epoch))), LIMITS, 1_000, |_, _| {});
    assert_eq!((r.epoch, r.head, r.gap), (epoch, 2000, None));
    hub.unsubscribe("a", &s);
    let t = session();
    let r = hub.subscribe("a", &t, Some((1000, Some(epoch))), LIMITS, 1_000, |_, _| {});
    assert_eq!(r.gap, Some((1001, 2000)));
}

/// A session that subscribed while the reader's start was unknown: a
/// reader that began past records it never read tells it; one that resumed
/// from a stored position does not.
#[test]
fn a_subscription_made_while_starting_learns_what_the_start_skipped() {
    for (skipped, want) in [(true, vec![(1, 9999)]), (false, vec![])] {
        let hub = Hub::default();
        hub.new_source(Some(42));
        let s = session();
        let r = hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
        assert_eq!(r.head, 0);
        let resumed = session();
        hub.subscribe(
            "a",
            &resumed,
            Some((4000, Some(shared_epoch(42, "a")))),
            LIMITS,
            0,
            |_, _| {},
        );
        hub.reading_from(9, 1, skipped);
        assert_eq!(gaps(&s), want, "skipped: {skipped}");
        assert_eq!(gaps(&resumed), [(4001, 9999)], "skipped: {skipped}");
    }
}

/// A channel of the source's shared epoch that rebases (a record behind it
/// from another stream) takes an epoch derived from where it happened and
/// tells its subscribers before the rebased message; the same state on
/// another node gives the same epoch.
#[test]
fn a_rebase_is_announced_with_a_derived_epoch() {
    let rebased = |hub: &Hub, s: &Arc<SessionHandle>| {
        hub.subscribe("a", s, None, LIMITS, 0, |_, _| {});
        for (stream, n) in [(0, 5), (1, 2)] {
            hub.read_to(stream, n);
            hub.publish_at(&msg("a", at(stream, n, 0), &ONE), &[], LIMITS, 0)
                .unwrap();
        }
    };
    let (one, two) = (sourced(0), sourced(0));
    let (s, t) = (session(), session());
    rebased(&one, &s);
    rebased(&two, &t);
    let items = s.take_queued();
    let acks: Vec<serde_json::Value> = items
        .iter()
        .filter_map(|i| match i {
            Item::Ctrl(b) => Some(serde_json::from_slice(&b[2..]).unwrap()),
            Item::Msg(_) => None,
        })
        .collect();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0]["op"], "ack");
    assert!(acks[0]["id"].is_null());
    let epoch = acks[0]["epoch"].as_u64().unwrap();
    assert_ne!(epoch, shared_epoch(42, "a"));
    // The ack comes before the rebased message, which carries the new epoch.
    assert!(matches!(&items[1], Item::Ctrl(_)));
    assert!(matches!(&items[2], Item::Msg(m) if m.epoch == epoch && m.seq == 5_001));
    assert_eq!(
        ctrls(&t)[0]["epoch"].as_u64(),
        Some(epoch),
        "the same on both nodes"
    );
}

/// An edit that keeps the source's identity (the same seed) changes nothing:
/// a record published before is still a duplicate, history and epoch stand.
#[test]
fn the_same_source_again_keeps_positions_and_marks() {
    let hub = sourced(0);
    hub.read_to(0, 3);
    hub.publish_at(&msg("a", at(0, 3, 0), &ONE), &[], LIMITS, 0)
        .unwrap();
    hub.new_source(Some(42));
    assert_eq!(
        hub.publish_at(&msg("a", at(0, 3, 0), &ONE), &[], LIMITS, 0),
        Err(Duplicate)
    );
    let view = hub.history("a", 0, 10, LIMITS, 0).unwrap();
    assert_eq!((view.epoch, view.head), (shared_epoch(42, "a"), 3_000));
}

/// A restarted node whose reader resumes after order 11 (it read up to
/// record 11 before): a record re-read at or below that order (a conflation
/// window held it at the crash) keeps its position; a late record after it
/// (an id drawn before 11, committed after the restart) rebases past what
/// was read, on a channel the node only now makes, as one that had been
/// here all along would — never below positions a client may hold.
#[test]
fn a_late_record_after_a_restart_rebases_and_a_reread_does_not() {
    let pos = |order: u64, number: u64| {
        Some(At {
            pos: SourcePos {
                stream: 0,
                order: (order, 0),
                number,
            },
            index: 0,
        })
    };
    let hub = sourced(11);
    hub.read_after((11, 0));
    hub.read_to(0, 10);
    let (seq, report) = hub
        .publish_at(&msg("a", pos(10, 10), &ONE), &[], LIMITS, 0)
        .unwrap();
    assert_eq!((seq, report.rebased), (10000, false), "a re-read");
    hub.read_to(0, 4);
    let (seq, report) = hub
        .publish_at(&msg("b", pos(12, 4), &ONE), &[], LIMITS, 0)
        .unwrap();
    assert_eq!((seq, report.rebased), (12000, true), "a late record");
    let s = session();
    let epoch = shared_epoch(42, "b");
    let r = hub.subscribe("b", &s, Some((11000, Some(epoch))), LIMITS, 0, |_, _| {});
    assert_ne!(
        r.epoch, epoch,
        "another epoch: the client's positions do not hold"
    );
    assert_eq!(msgs(&s), [(12000, 0)], "the late record is sent");
}
