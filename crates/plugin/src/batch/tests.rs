use super::*;

#[test]
fn records_pack_in_order() {
    let headers = vec![("h".to_string(), b"v".to_vec())];
    let recs = [
        SourceRecord {
            timestamp_ms: 5,
            position: Some(herald_fanout::position::SourcePos {
                stream: 0,
                order: (0, 9),
                number: 9,
            }),
            key: Some(b"k"),
            value: b"{}",
            channel: Some("c"),
            headers: &headers,
        },
        SourceRecord {
            timestamp_ms: 6,
            position: Some(herald_fanout::position::SourcePos {
                stream: 0,
                order: (0, 10),
                number: 10,
            }),
            key: None,
            value: b"x",
            channel: None,
            headers: &[],
        },
    ];
    let (data, meta) = encode_records(&recs);
    assert_eq!(meta, vec![5, 9, 1, 2, 1, 10, 6, 10, u64::MAX, 1, 0, 0]);
    assert_eq!(&data[..4], b"k{}c");
    assert_eq!(data.len(), 4 + 10 + 1);
}

/// (channel, payload, key, audience, source index)
type Msg<'a> = (&'a str, &'a [u8], Option<&'a str>, Option<&'a str>, u32);

fn enc(msgs: &[Msg<'_>]) -> (Vec<u8>, Vec<u32>) {
    let mut data = Vec::new();
    let mut meta = Vec::new();
    for (c, p, k, a, s) in msgs {
        data.extend_from_slice(c.as_bytes());
        data.extend_from_slice(p);
        k.map(|k| data.extend_from_slice(k.as_bytes()));
        a.map(|a| data.extend_from_slice(a.as_bytes()));
        meta.extend_from_slice(&[
            c.len() as u32,
            p.len() as u32,
            k.map_or(NONE, |k| k.len() as u32),
            a.map_or(NONE, |a| a.len() as u32),
            *s,
        ]);
    }
    (data, meta)
}

#[test]
fn good_output_decodes() {
    let (d, m) = enc(&[
        ("a", b"{}", Some("K"), None, 0),
        ("b", b"1", None, Some("pro"), 1),
    ]);
    let t = decode_outgoing(d, &m, 2, 100).unwrap();
    assert!(t.refused.is_empty());
    let v: Vec<_> = t.outputs.iter().collect();
    assert_eq!(
        (v[0].channel, v[0].payload, v[0].key),
        ("a", &b"{}"[..], Some("K"))
    );
    assert_eq!((v[1].audience, v[1].source), (Some("pro"), 1));
    let empty = decode_outgoing(Vec::new(), &[], 0, 100).unwrap();
    assert!(empty.outputs.is_empty() && empty.refused.is_empty());
}

/// (channel, source) of what survived, and the refused source indexes.
fn survivors(t: &Transformed) -> (Vec<(&str, u32)>, Vec<u32>) {
    (
        t.outputs.iter().map(|o| (o.channel, o.source)).collect(),
        t.refused.iter().map(|r| r.source).collect(),
    )
}

#[test]
fn one_bad_record_fails_alone() {
    // Record 1 has a good output before its bad one, and another after a
    // message of record 2: all three of its outputs go, nothing else does.
    let (d, m) = enc(&[
        ("a", b"0", None, None, 0),
        ("b", b"1", None, None, 1),
        ("bad name", b"1", None, None, 1),
        ("c", b"2", None, None, 2),
        ("b2", b"1", None, None, 1),
        ("d", b"3", None, None, 3),
    ]);
    let t = decode_outgoing(d, &m, 4, 100).expect("one bad record must not refuse the batch");
    assert_eq!(survivors(&t), (vec![("a", 0), ("c", 2), ("d", 3)], vec![1]));
    assert!(
        t.refused[0]
            .reason
            .contains("message 2: channel \"bad name\""),
        "{:?}",
        t.refused
    );
}

#[test]
fn each_per_record_breach_refuses_its_record_only() {
    let long_key = "k".repeat(129);
    let long_audience = "a".repeat(65);
    let big = [b'x'; 101];
    let cases: [(Msg<'_>, &str); 9] = [
        (("bad name", b"{}", None, None, 1), "channel \"bad name\""),
        (("", b"{}", None, None, 1), "channel \"\""),
        (
            ("a", &big, None, None, 1),
            "payload of 101 bytes exceeds 100",
        ),
        (
            ("a", b"{}", Some(""), None, 1),
            "conflation key must be 1-128 bytes",
        ),
        (
            ("a", b"{}", Some(&long_key), None, 1),
            "conflation key must be 1-128 bytes",
        ),
        (
            ("a", b"{}", None, Some(""), 1),
            "audience must be 1-64 bytes",
        ),
        (
            ("a", b"{}", None, Some(&long_audience), 1),
            "audience must be 1-64 bytes",
        ),
        (("a", b"{}", Some("k"), Some("pro"), 1), ""),
        (("a", b"", None, None, 1), ""),
    ];
    for (bad, want) in cases {
        let (d, m) = enc(&[
            ("ok", b"0", None, None, 0),
            bad,
            ("ok", b"2", None, None, 2),
        ]);
        let t = decode_outgoing(d, &m, 3, 100).unwrap();
        if want.is_empty() {
            // The limits themselves are allowed (control cases).
            assert_eq!(survivors(&t).1, Vec::<u32>::new(), "{bad:?}");
            continue;
        }
        assert_eq!(
            survivors(&t),
            (vec![("ok", 0), ("ok", 2)], vec![1]),
            "{want}"
        );
        assert!(t.refused[0].reason.contains(want), "{:?}", t.refused);
    }
    // Text that is not UTF-8, in each text field.
    let not_utf8: [(&[u8], [u32; 5]); 3] = [
        (b"\xff{}", [1, 2, NONE, NONE, 1]),
        (b"c{}\xff", [1, 2, 1, NONE, 1]),
        (b"c{}\xff", [1, 2, NONE, 1, 1]),
    ];
    for (field, (bytes, spans)) in not_utf8.into_iter().enumerate() {
        let (mut d, mut m) = enc(&[("ok", b"0", None, None, 0)]);
        d.extend_from_slice(bytes);
        m.extend_from_slice(&spans);
        let t = decode_outgoing(d, &m, 2, 100).unwrap();
        assert_eq!(survivors(&t), (vec![("ok", 0)], vec![1]), "field {field}");
        assert!(t.refused[0].reason.contains("not UTF-8"), "{:?}", t.refused);
    }
}

#[test]
fn many_bad_records_are_each_refused_once() {
    let msgs: Vec<Msg<'_>> = (0..200u32)
        .flat_map(|i| {
            let ch = if i % 3 == 0 { "bad name" } else { "ok" };
            [
                (ch, &b"{}"[..], None, None, i),
                (ch, &b"{}"[..], None, None, i),
            ]
        })
        .collect();
    let (d, m) = enc(&msgs);
    let t = decode_outgoing(d, &m, 200, 100).unwrap();
    let (kept, refused) = survivors(&t);
    assert_eq!(refused, (0..200).filter(|i| i % 3 == 0).collect::<Vec<_>>());
    assert_eq!(kept.len(), 2 * (200 - refused.len()));
    assert!(kept.iter().all(|&(_, s)| s % 3 != 0));
}

#[test]
fn structural_breakage_is_refused_whole() {
    // Each case also carries a good record and a content breach: a broken
    // structure refuses everything, whatever else is in the output.
    let good: Msg<'_> = ("a", b"{}", None, None, 0);
    let breach: Msg<'_> = ("bad name", b"{}", None, None, 0);
    let err = |d: Vec<u8>, m: &[u32]| decode_outgoing(d, m, 1, 100).unwrap_err().0;

    let (mut d, mut m) = enc(&[good, breach]);
    d.extend_from_slice(b"short");
    m.extend_from_slice(&[3, 1_000_000, NONE, NONE, 0]);
    assert!(err(d, &m).contains("payload length 1000000 runs past the data"));

    let (mut d, mut m) = enc(&[good, breach]);
    d.extend_from_slice(b"ab");
    m.extend_from_slice(&[1, 1, 500, NONE, 0]);
    assert!(err(d, &m).contains("key length 500 runs past the data"));

    let (d, m) = enc(&[good, ("a", b"{}", None, None, 3), breach]);
    assert!(err(d, &m).contains("source index 3 out of range"));

    let (mut d, m) = enc(&[good, breach]);
    d.push(0);
    assert!(err(d, &m).contains("1 bytes of data left over"));

    let (d, mut m) = enc(&[good, breach]);
    m.push(1);
    assert!(err(d, &m).contains("not a multiple of 5"));
    assert!(err(b"short".to_vec(), &[3, 1_000_000, NONE, NONE, 0]).contains("runs past"));
}
