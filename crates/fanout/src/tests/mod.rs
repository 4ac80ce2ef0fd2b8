//! Unit tests of the hub: positions, marks, audiences, history, resume, sweeps.

use super::channel::Subscriber;
use super::channel::{shared_epoch, TRACKED_AUDIENCES};
use super::*;
use crate::queue::{Item, SlowConsumer, Wire};

mod resume;

const LIMITS: HistoryLimits = HistoryLimits {
    max_messages: 3,
    max_age_ms: 60_000,
    max_bytes: usize::MAX,
    tenant_max_bytes: usize::MAX,
};

fn out(ch: &str) -> NewMessage<'_> {
    NewMessage {
        ch,
        payload: b"{\"v\":1}",
        kind: PayloadKind::Json,
        key: None,
    }
}

fn msg<'a>(ch: &'a str, at: Option<At>, variants: &[Variant<'a>]) -> Message<'a> {
    Message {
        channel: ch,
        key: None,
        variants: variants.to_vec(),
        at,
    }
}

fn session() -> Arc<SessionHandle> {
    SessionHandle::new(Wire::Ws, 1 << 20, SlowConsumer::DropOldest, None)
}

fn session_of(audience: &str) -> Arc<SessionHandle> {
    SessionHandle::new(
        Wire::Ws,
        1 << 20,
        SlowConsumer::DropOldest,
        Some(audience.into()),
    )
}

const ONE: [Variant<'static>; 1] = [Variant {
    payload: b"1",
    kind: PayloadKind::Json,
    audience: None,
}];

fn at(stream: u32, number: u64, index: u64) -> Option<At> {
    Some(At {
        pos: SourcePos {
            stream,
            order: (number, 0),
            number,
        },
        index,
    })
}

/// (seq, prev) of every message queued, skipping control frames.
fn msgs(s: &SessionHandle) -> Vec<(u64, u64)> {
    s.take_queued()
        .into_iter()
        .filter_map(|i| match i {
            Item::Msg(m) => Some((m.seq, m.prev)),
            Item::Ctrl(_) => None,
        })
        .collect()
}

#[test]
fn audiences_get_their_variant_under_one_position() {
    let hub = Hub::default();
    let pro = session_of("pro");
    let basic = session_of("basic");
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
    let (seq, r) = hub.publish_at(&msg("c", None, &v), &[], LIMITS, 0).unwrap();
    assert_eq!((seq, r.delivered), (1, 2));
    assert_eq!(msgs(&pro), [(1, 0)]);
    assert_eq!(msgs(&basic), [(1, 0)]);
    assert!(msgs(&anon).is_empty());
    // Replay gives each audience its own variant too.
    hub.publish_at(&msg("c", None, &v), &[], LIMITS, 0).unwrap();
    let late = session_of("basic");
    let r = hub.subscribe("c", &late, Some((0, None)), LIMITS, 0, |_, _| {});
    assert_eq!(r.replayed, 2);
    let items = late.take_queued();
    assert!(items
        .iter()
        .all(|i| matches!(i, Item::Msg(m) if m.serves == Serves::Audience("basic".into()))));
}

/// A position with no variant for a session is not a
/// gap in what that session sees.
#[test]
fn a_position_for_other_audiences_is_no_gap() {
    let hub = Hub::default();
    let pro = session_of("pro");
    let basic = session_of("basic");
    let anon = session();
    for s in [&pro, &basic, &anon] {
        hub.subscribe("c", s, None, LIMITS, 0, |_, _| {});
    }
    let pro_only = [Variant {
        payload: b"{\"pro\":1}",
        kind: PayloadKind::Json,
        audience: Some("pro"),
    }];
    hub.publish_at(&msg("c", None, &ONE), &[], LIMITS, 0)
        .unwrap(); // 1: everyone
    hub.publish_at(&msg("c", None, &pro_only), &[], LIMITS, 0)
        .unwrap(); // 2: pro only
    hub.publish_at(&msg("c", None, &ONE), &[], LIMITS, 0)
        .unwrap(); // 3: everyone
    assert_eq!(msgs(&pro), [(1, 0), (2, 1), (3, 2)]);
    assert_eq!(msgs(&basic), [(1, 0), (3, 1)]);
    assert_eq!(msgs(&anon), [(1, 0), (3, 1)]);
    // Resuming after 1 is no gap for basic either, and its ack names the
    // last position it was sent.
    let again = session_of("basic");
    let r = hub.subscribe("c", &again, Some((1, None)), LIMITS, 0, |_, _| {});
    assert_eq!((r.gap, r.replayed, r.head), (None, 1, 3));
    assert_eq!(msgs(&again), [(3, 1)]);
    let r = hub.subscribe(
        "c",
        &session_of("pro"),
        Some((1, None)),
        LIMITS,
        0,
        |_, _| {},
    );
    assert_eq!((r.gap, r.replayed), (None, 2));
}

/// A plugin that tags every message for its own audience cannot grow a
/// channel's audience map without bound.
#[test]
fn per_user_audiences_stay_bounded() {
    let hub = Hub::default();
    let names: Vec<String> = (0..2_000).map(|i| format!("user{i}")).collect();
    for n in &names {
        let v = [Variant {
            payload: b"1",
            kind: PayloadKind::Json,
            audience: Some(n),
        }];
        hub.publish_at(&msg("c", None, &v), &[], LIMITS, 0).unwrap();
    }
    let chan = hub.channel("c");
    let c = chan.lock();
    assert!(
        c.tagged_last.len() <= TRACKED_AUDIENCES * 4,
        "{}",
        c.tagged_last.len()
    );
    assert_eq!(c.last_for(Some("user1999")), 2_000);
}

/// History drops a position with all its variants.
#[test]
fn history_keeps_positions_whole() {
    let hub = Hub::default();
    let v = [
        Variant {
            payload: b"1",
            kind: PayloadKind::Json,
            audience: Some("pro"),
        },
        Variant {
            payload: b"2",
            kind: PayloadKind::Json,
            audience: None,
        },
    ];
    for _ in 0..4 {
        hub.publish_at(&msg("c", None, &v), &[], LIMITS, 0).unwrap();
    }
    // Three positions kept, each with both variants.
    for s in [session_of("pro"), session()] {
        let r = hub.subscribe("c", &s, Some((0, None)), LIMITS, 0, |_, _| {});
        assert_eq!((r.gap, r.replayed), (Some((1, 1)), 3));
        assert_eq!(msgs(&s), [(2, 1), (3, 2), (4, 3)]);
    }
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
fn source_positions_become_seq_and_only_repeats_are_duplicates() {
    let hub = Hub::default();
    let s = session();
    hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
    let p = |n, i| {
        hub.publish_at(&msg("a", at(0, n, i), &ONE), &[], LIMITS, 0)
            .map(|r| r.0)
    };
    assert_eq!(p(10, 0), Ok(10_000));
    assert_eq!(p(14, 0), Ok(14_000));
    // A second message of record 14 to this channel is its own position.
    assert_eq!(p(14, 1), Ok(14_001));
    assert_eq!(p(14, 1), Err(Duplicate));
    assert_eq!(p(14, 0), Err(Duplicate));
    assert_eq!(p(3, 0), Err(Duplicate));
    assert_eq!(msgs(&s), [(10_000, 0), (14_000, 10_000), (14_001, 14_000)]);
}

/// One channel fed by two streams loses nothing; the
/// stream behind is numbered after the channel and counted.
#[test]
fn a_second_stream_is_rebased_not_dropped() {
    let hub = Hub::default();
    let s = session();
    hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
    let p = |st, n| {
        hub.publish_at(&msg("a", at(st, n, 0), &ONE), &[], LIMITS, 0)
            .unwrap()
    };
    assert_eq!(p(0, 500).0, 500_000);
    let (seq, r) = p(1, 3);
    assert_eq!(seq, 500_001);
    assert!(r.rebased && r.first_rebase);
    let (seq, r) = p(1, 4);
    assert!(r.rebased && !r.first_rebase);
    assert_eq!(seq, 500_002);
    assert_eq!(p(0, 501).0, 501_000);
    // A re-read of either stream is still a duplicate.
    assert!(hub
        .publish_at(&msg("a", at(1, 4, 0), &ONE), &[], LIMITS, 0)
        .is_err());
    assert!(hub
        .publish_at(&msg("a", at(0, 500, 0), &ONE), &[], LIMITS, 0)
        .is_err());
    // A new source is another position space: the channel starts over in
    // it (no marks: its first rows are not "seen"), and its subscriber is
    // told the new epoch before the first message of it.
    msgs(&s);
    hub.new_source(Some(9));
    assert_eq!(p(0, 2).0, 2_000);
    let got = s.take_queued();
    let Item::Ctrl(ack) = &got[0] else {
        panic!("{got:?}")
    };
    let ack: serde_json::Value = serde_json::from_slice(&ack[2..]).unwrap();
    assert_eq!(ack["op"], "ack");
    assert_eq!(ack["ch"], "a");
    assert_eq!(ack["epoch"].as_u64(), Some(shared_epoch(9, "a")));
    assert!(matches!(&got[1], Item::Msg(m) if m.seq == 2_000 && m.prev == 0));
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
    let got = s.take_queued();
    assert!(
        matches!(&got[0], Item::Ctrl(b) if String::from_utf8_lossy(b).contains("\"op\":\"gap\""))
    );
    assert_eq!(got.len(), 4);

    let s2 = session();
    let r = hub.subscribe("a", &s2, Some((4, Some(r.epoch))), LIMITS, 0, |_, _| {});
    assert_eq!((r.gap, r.replayed), (None, 1));

    // A foreign epoch resumes from nothing.
    let s3 = session();
    let r = hub.subscribe("a", &s3, Some((4, Some(r.epoch + 1))), LIMITS, 0, |_, _| {});
    assert_eq!((r.gap, r.replayed), (Some((1, 2)), 3));
}

/// With sparse positions only what is missing is a gap.
#[test]
fn resume_with_sparse_positions_reports_no_spurious_gap() {
    let hub = Hub::default();
    let limits = HistoryLimits {
        max_messages: 2,
        ..LIMITS
    };
    for n in [7, 14, 20, 26] {
        hub.publish_at(&msg("a", at(0, n, 0), &ONE), &[], limits, 0)
            .unwrap();
    }
    // History holds 20 000 (prev 14 000) and 26 000.
    let s = session();
    let r = hub.subscribe("a", &s, Some((14_000, None)), limits, 0, |_, _| {});
    assert_eq!((r.gap, r.replayed), (None, 2));
    let s = session();
    let r = hub.subscribe("a", &s, Some((7_000, None)), limits, 0, |_, _| {});
    assert_eq!((r.gap, r.replayed), (Some((7_001, 14_000)), 2));
    // Nothing in history for a client that saw everything.
    let s = session();
    let r = hub.subscribe("a", &s, Some((26_000, None)), limits, 0, |_, _| {});
    assert_eq!((r.gap, r.replayed), (None, 0));
}

#[test]
fn history_expires_by_age_and_sweep_drops_idle_channels() {
    let hub = Hub::default();
    let limits = HistoryLimits {
        max_messages: 10,
        max_age_ms: 100,
        max_bytes: usize::MAX,
        tenant_max_bytes: usize::MAX,
    };
    hub.publish(out("a"), limits, 0);
    let s = session();
    let r = hub.subscribe("a", &s, Some((0, None)), limits, 50, |_, _| {});
    assert_eq!(r.replayed, 1);
    assert_eq!(hub.sweep(limits, 500), 0, "a subscriber keeps the channel");
    // The sweep expired its history: the last unsubscribe drops it at once.
    hub.unsubscribe("a", &s);
    assert_eq!(hub.channel_count(), 0);
    // A channel whose history expires without anyone there is swept.
    hub.publish(out("b"), limits, 600);
    assert_eq!(hub.sweep(limits, 650), 0);
    assert_eq!(hub.sweep(limits, 800), 1);
    assert_eq!(hub.channel_count(), 0);
}

/// A channel someone is about to lock is not swept, so
/// the subscribe that follows joins the channel publishes go to.
#[test]
fn sweep_spares_a_channel_in_use() {
    let hub = Hub::default();
    let limits = HistoryLimits {
        max_messages: 10,
        max_age_ms: 100,
        max_bytes: usize::MAX,
        tenant_max_bytes: usize::MAX,
    };
    // As `subscribe` does: take the channel, then lock it.
    let taken = hub.channel("a");
    assert_eq!(hub.sweep(limits, 500), 0);
    let s = session();
    {
        let mut c = taken.lock();
        c.subscribers.insert(
            key_of(&s),
            Subscriber {
                handle: s.clone(),
                floor: 0,
                pending: PendingSlot::NONE,
            },
        );
    }
    drop(taken);
    hub.publish(out("a"), limits, 600);
    assert_eq!(msgs(&s), [(1, 0)]);
}

/// Leaving costs O(1), so 100k sessions leaving one
/// channel is quick (a linear scan per leave made it quadratic).
#[test]
fn many_sessions_leave_one_channel() {
    let hub = Hub::default();
    let sessions: Vec<_> = (0..100_000).map(|_| session()).collect();
    for s in &sessions {
        hub.subscribe("a", s, None, LIMITS, 0, |_, _| {});
    }
    for s in sessions.iter().step_by(2) {
        hub.unsubscribe("a", s);
    }
    let (_, r) = hub.publish(out("a"), LIMITS, 0);
    assert_eq!(r.delivered, 50_000);
    assert!(sessions
        .iter()
        .step_by(2)
        .all(|s| s.take_queued().is_empty()));
}

#[test]
fn closed_sessions_leave_the_channel() {
    let hub = Hub::default();
    let s = SessionHandle::new(Wire::Ws, 100, SlowConsumer::Disconnect, None);
    hub.subscribe("a", &s, None, LIMITS, 0, |_, _| {});
    let (_, r1) = hub.publish(
        NewMessage {
            payload: &[b'1'; 30],
            ..out("a")
        },
        LIMITS,
        0,
    );
    assert_eq!(r1.delivered, 1);
    let (_, r2) = hub.publish(
        NewMessage {
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

/// History is bounded by bytes per channel and per tenant; past
/// the tenant's bound a message is sent live, not kept, and its channel's
/// history is cleared, so a resume across it reports a gap.
#[test]
fn history_is_bounded_by_bytes() {
    let hub = Hub::default();
    // One message's frames (WebSocket and SSE) on channel "a".
    hub.publish(out("a"), LIMITS, 0);
    let one = hub.history_bytes();
    assert!(one > 0);
    let per_channel = HistoryLimits {
        max_messages: 100,
        max_bytes: one * 2,
        ..LIMITS
    };
    for _ in 0..5 {
        hub.publish(out("a"), per_channel, 0);
    }
    let s = session();
    let r = hub.subscribe("a", &s, Some((0, None)), per_channel, 0, |_, _| {});
    assert_eq!(r.replayed, 2, "two messages fit in the channel's bytes");
    assert_eq!(r.gap, Some((1, 4)));
    assert_eq!(hub.history_bytes(), one * 2);

    // The tenant's histories: room for three messages in all.
    let tenant = HistoryLimits {
        max_messages: 100,
        tenant_max_bytes: one * 3,
        ..LIMITS
    };
    let live = session();
    hub.subscribe("b", &live, None, tenant, 0, |_, _| {});
    let (_, r) = hub.publish(out("b"), tenant, 0);
    assert!(!r.not_kept);
    let (seq, r) = hub.publish(out("b"), tenant, 0);
    assert!(r.not_kept, "past the tenant's bytes");
    assert_eq!(r.delivered, 1, "still sent live");
    assert_eq!(hub.history_bytes(), one * 2, "b's history was cleared");
    let (_, r) = hub.publish(out("b"), tenant, 0);
    assert!(!r.not_kept);
    let s = session();
    let r = hub.subscribe("b", &s, Some((0, None)), tenant, 0, |_, _| {});
    assert_eq!(r.gap, Some((1, seq)), "what was not kept is a gap");
    assert_eq!(r.replayed, 1);
}

/// A client looping sub/unsub over fresh names leaves nothing
/// behind, and a tenant's subscribers can bring only so many channels into
/// being.
#[test]
fn fresh_names_leave_no_channels() {
    let hub = Hub::default();
    let s = session();
    for i in 0..1000 {
        let ch = format!("fresh-{i}");
        assert!(hub.may_open(&ch, 10));
        hub.subscribe(&ch, &s, None, LIMITS, 0, |_, _| {});
        hub.unsubscribe(&ch, &s);
    }
    assert_eq!(hub.channel_count(), 0);
    for i in 0..10 {
        hub.subscribe(&format!("held-{i}"), &s, None, LIMITS, 0, |_, _| {});
    }
    assert!(!hub.may_open("one-more", 10));
    assert!(
        hub.may_open("held-3", 10),
        "an existing channel is always open"
    );
    // A channel with history outlives its last subscriber (for resumes).
    hub.publish(out("held-0"), LIMITS, 0);
    hub.unsubscribe("held-0", &s);
    hub.unsubscribe("held-1", &s);
    assert_eq!(hub.channel_count(), 9);
}
