use super::*;

fn plan(channels: usize, rate: f64, batch: usize) -> Plan {
    Plan {
        channels,
        rate,
        batch,
        duration_secs: 10.0,
        payload_bytes: 100,
    }
}

#[test]
fn payload_has_requested_size_and_time() {
    let t = 1_712_345_678_901_234_567;
    let p = payload(t, "c3", 42, 100);
    assert_eq!(p.len(), 100);
    let v: serde_json::Value = serde_json::from_str(&p).unwrap();
    assert_eq!(
        (v["t"].as_u64(), v["ch"].as_str(), v["n"].as_u64()),
        (Some(t), Some("c3"), Some(42))
    );
    // Too small a size still gives a valid payload.
    assert!(serde_json::from_str::<serde_json::Value>(&payload(t, "c0", 1, 3)).is_ok());
}

#[test]
fn schedule() {
    let p = plan(1, 10.0, 1);
    assert_eq!(p.requests(), 100);
    assert_eq!(p.period(), Duration::from_millis(100));
    let p = plan(1, 200.0, 20);
    assert_eq!((p.requests(), p.msgs_per_request()), (100, 20));
    assert_eq!(p.period(), Duration::from_millis(100));
    assert_eq!(plan(100, 10.0, 1).msgs_per_request(), 100);
}

#[test]
fn messages_number_each_channel() {
    let mut counters = Vec::new();
    let m = plan(3, 10.0, 2).messages(5, &mut counters);
    let got: Vec<(String, u64)> = m
        .iter()
        .map(|(ch, d)| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            assert_eq!(v["ch"].as_str(), Some(ch.as_str()));
            (ch.clone(), v["n"].as_u64().unwrap())
        })
        .collect();
    let want = [
        ("c0", 1),
        ("c0", 2),
        ("c1", 1),
        ("c1", 2),
        ("c2", 1),
        ("c2", 2),
    ];
    assert_eq!(
        got,
        want.iter()
            .map(|(c, n)| (c.to_string(), *n))
            .collect::<Vec<_>>()
    );
    // The next request continues each channel's numbering.
    let m = plan(3, 10.0, 2).messages(6, &mut counters);
    assert!(m[0].1.contains(r#""n":3"#) && m[5].1.contains(r#""n":4"#));
}

#[test]
fn breaking_and_targets() {
    assert!(!breaks(true, 0, Some(900_000), 1000.0, 1.1));
    assert!(breaks(true, 0, Some(1_100_000), 1000.0, 1.0));
    assert!(breaks(false, 0, Some(1), 1000.0, 1.0));
    assert!(breaks(true, 3, None, 1000.0, 1.0));
    assert!(breaks(true, 0, Some(1), 1000.0, 4.0));
    assert_eq!(target_ratio("nchan", Load::PerFrame), Some(1.2));
    assert_eq!(target_ratio("nchan", Load::SharedWrites), Some(3.0));
    assert_eq!(target_ratio("nchan", Load::PublishBound), Some(1.0));
    assert_eq!(target_ratio("uwebsockets", Load::PerFrame), Some(1.2));
    assert_eq!(target_ratio("raw", Load::SharedWrites), Some(0.95));
    assert_eq!(target_ratio("python-websockets", Load::PerFrame), None);
}

#[test]
fn median_of_pairs() {
    assert_eq!(median(&mut vec![0.83, 0.70, 0.70]), Some(0.70));
    assert_eq!(median(&mut vec![1.0, f64::NAN, 3.0, 2.0]), Some(2.0));
    assert_eq!(median(&mut vec![2.0, 1.0]), Some(1.0));
    assert_eq!(median(&mut vec![f64::NAN]), None);
}
