use super::*;

/// Feeds `(seq, prev, n)` frames to a fresh check over `streams` streams.
fn order(streams: u64, frames: &[(u64, u64, u64)]) -> Order {
    let mut o = Order::new(streams);
    for (seq, prev, n) in frames {
        let f = format!(
            r#"{{"op":"msg","ch":"c","seq":{seq},"prev":{prev},"data":{{"sym":"A","n": {n},"t":7}}}}"#
        );
        o.see(f.as_bytes());
    }
    o
}

#[test]
fn streams_may_interleave_but_each_keeps_its_order() {
    // Two partitions: records 0, 2, 4 on stream 0; 1, 3, 5 on stream 1.
    let o = order(
        2,
        &[
            (1, 0, 1),
            (2, 1, 0),
            (3, 2, 3),
            (4, 3, 2),
            (5, 4, 4),
            (6, 5, 5),
        ],
    );
    assert!(o.verdict(6, 0).unwrap().contains("6 of 6 records"));
    let o = order(2, &[(1, 0, 0), (2, 1, 2), (3, 2, 1), (4, 3, 0)]);
    let e = o.verdict(4, 0).unwrap_err();
    assert!(e.contains("record 0 repeated"), "{e}");
    let o = order(2, &[(1, 0, 2), (2, 1, 0), (3, 2, 1), (4, 3, 3)]);
    let e = o.verdict(4, 0).unwrap_err();
    assert!(e.contains("record 0 after record 2 of its stream 0"), "{e}");
}

#[test]
fn a_missing_record_needs_a_counted_and_visible_reason() {
    // Record 2 of 1..=4 (seq 2) never came; the frame after it shows the gap.
    let gap = [(1, 0, 1), (3, 2, 3), (4, 3, 4)];
    assert!(order(1, &gap).verdict(4, 1).is_ok());
    let e = order(1, &gap).verdict(4, 0).unwrap_err();
    assert!(e.contains("1 of 4 records lost"), "{e}");
    // Missing with every prev matching: silent, whatever was counted.
    let silent = [(1, 0, 1), (3, 1, 3), (4, 3, 4)];
    let e = order(1, &silent).verdict(4, 1).unwrap_err();
    assert!(e.contains("no frame showed a gap"), "{e}");
    // The channel's seq must increase.
    let e = order(1, &[(2, 0, 1), (1, 2, 2)]).verdict(2, 0).unwrap_err();
    assert!(e.contains("seq 1 after seq 2"), "{e}");
    let e = order(1, &[(1, 0, 1)]).verdict(0, 0).unwrap_err();
    assert!(e.contains("only 0 were sent"), "{e}");
}

#[test]
fn numbers_are_found_with_or_without_a_space() {
    assert_eq!(find_u64(br#"{"seq":12,"data":{"n": 5}}"#, "n"), Some(5));
    assert_eq!(find_u64(br#"{"seq":12}"#, "seq"), Some(12));
    assert_eq!(find_u64(br#"{"seq":12}"#, "prev"), None);
}
