//! The flat batch encoding of `transform`, host side, without I/O.
//!
//! Owns: packing source records into one buffer plus lengths, and checking
//! what a plugin returns. Invariants: output whose structure is broken
//! (lengths past the data, bytes left over, a source index out of range) is
//! refused whole, since nothing in it can be trusted; a well-formed output
//! whose content breaks the contract (a bad channel name, a bad key or
//! audience length, text that is not UTF-8, an oversized payload) costs only
//! the record it came from: all of that record's outputs are dropped together
//! and the record is reported as refused, the rest of the batch goes on.
//! Checking costs no allocation per message.

use crate::proto;

/// One record as a source delivered it.
#[derive(Debug, Clone, Copy)]
pub struct SourceRecord<'a> {
    pub timestamp_ms: u64,
    /// Where the record sits in its source; `None` for HTTP publish.
    pub position: Option<crate::fanout::position::SourcePos>,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// The channel the publisher named (HTTP publish), if any.
    pub channel: Option<&'a str>,
    pub headers: &'a [(String, Vec<u8>)],
}

/// Packs records as `herald:plugin/types.record-batch` (data, meta).
pub fn encode_records(records: &[SourceRecord<'_>]) -> (Vec<u8>, Vec<u64>) {
    let size: usize = records
        .iter()
        .map(|r| {
            r.key.map_or(0, <[u8]>::len)
                + r.value.len()
                + r.channel.map_or(0, str::len)
                + r.headers
                    .iter()
                    .map(|(n, v)| 8 + n.len() + v.len())
                    .sum::<usize>()
        })
        .sum();
    let mut data = Vec::with_capacity(size);
    let mut meta = Vec::with_capacity(records.len() * 6);
    for r in records {
        if let Some(k) = r.key {
            data.extend_from_slice(k);
        }
        data.extend_from_slice(r.value);
        if let Some(c) = r.channel {
            data.extend_from_slice(c.as_bytes());
        }
        let start_headers = data.len();
        for (n, v) in r.headers {
            data.extend_from_slice(&(n.len() as u32).to_le_bytes());
            data.extend_from_slice(n.as_bytes());
            data.extend_from_slice(&(v.len() as u32).to_le_bytes());
            data.extend_from_slice(v);
        }
        meta.extend_from_slice(&[
            r.timestamp_ms,
            r.position.map_or(0, |p| p.number),
            r.key.map_or(u64::MAX, |k| k.len() as u64),
            r.value.len() as u64,
            r.channel.map_or(0, |c| c.len() as u64),
            (data.len() - start_headers) as u64,
        ]);
    }
    (data, meta)
}

/// Records as 0.2.0's typed `list<source-record>`: each field copied into a
/// value of its own (the cost the flat encoding avoids).
pub fn typed_records(records: &[SourceRecord<'_>]) -> Vec<super::SourceRecord> {
    records
        .iter()
        .map(|r| super::SourceRecord {
            timestamp_ms: r.timestamp_ms,
            position: r.position.map_or(0, |p| p.number),
            key: r.key.map(<[u8]>::to_vec),
            value: r.value.to_vec(),
            channel: r.channel.map(str::to_string),
            headers: r.headers.to_vec(),
        })
        .collect()
}

/// 0.2.0's typed `list<outgoing>` in the flat encoding, so both are checked
/// by [`decode_outgoing`] alike. A field too long for the encoding's u32
/// lengths (impossible under any memory cap) fails the call.
pub fn encode_outgoing(out: &[super::Outgoing]) -> (Vec<u8>, Vec<u32>) {
    let size: usize = out
        .iter()
        .map(|o| {
            o.channel.len()
                + o.payload.len()
                + o.conflation_key.as_ref().map_or(0, String::len)
                + o.audience.as_ref().map_or(0, String::len)
        })
        .sum();
    let mut data = Vec::with_capacity(size);
    let mut meta = Vec::with_capacity(out.len() * 5);
    let len = |n: usize| u32::try_from(n).unwrap_or(NONE - 1);
    for o in out {
        data.extend_from_slice(o.channel.as_bytes());
        data.extend_from_slice(&o.payload);
        if let Some(k) = &o.conflation_key {
            data.extend_from_slice(k.as_bytes());
        }
        if let Some(a) = &o.audience {
            data.extend_from_slice(a.as_bytes());
        }
        meta.extend_from_slice(&[
            len(o.channel.len()),
            len(o.payload.len()),
            o.conflation_key.as_ref().map_or(NONE, |k| len(k.len())),
            o.audience.as_ref().map_or(NONE, |a| len(a.len())),
            o.source_index,
        ]);
    }
    (data, meta)
}

/// One message a plugin asked to publish, borrowed from its output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutMessage<'a> {
    pub channel: &'a str,
    pub payload: &'a [u8],
    pub key: Option<&'a str>,
    pub audience: Option<&'a str>,
    /// Index of the source record it came from.
    pub source: u32,
}

#[derive(Debug, Clone, Copy)]
struct Spans {
    channel: (u32, u32),
    payload: (u32, u32),
    key: Option<(u32, u32)>,
    audience: Option<(u32, u32)>,
    source: u32,
}

/// A plugin's checked output: its buffer and where each message lies in it.
#[derive(Debug, Default)]
pub struct Outputs {
    data: Vec<u8>,
    spans: Vec<Spans>,
}

impl Outputs {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn text(&self, (a, b): (u32, u32)) -> &str {
        // Checked as UTF-8 when the output was decoded.
        std::str::from_utf8(&self.data[a as usize..b as usize]).unwrap_or_default()
    }

    pub fn iter(&self) -> impl Iterator<Item = OutMessage<'_>> {
        self.spans.iter().map(|s| OutMessage {
            channel: self.text(s.channel),
            payload: &self.data[s.payload.0 as usize..s.payload.1 as usize],
            key: s.key.map(|k| self.text(k)),
            audience: s.audience.map(|a| self.text(a)),
            source: s.source,
        })
    }
}

/// A source record whose outputs broke the contract: none of them is in
/// [`Transformed::outputs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Index of the source record.
    pub source: u32,
    /// "bad_output", or "timeout" for a record that alone ran past the
    /// deadline (a batch split down to it, see `ActivePlugin::transform`).
    pub kind: &'static str,
    /// The first breach found among its outputs.
    pub reason: String,
}

/// What a checked `transform` call gave back: the messages to publish and
/// the records refused (each once, in record order).
#[derive(Debug, Default)]
pub struct Transformed {
    pub outputs: Outputs,
    pub refused: Vec<Refusal>,
}

impl Transformed {
    /// Adds the result of a call on the records from `offset` on (a batch
    /// run in parts), in record order after what is here.
    pub fn append(&mut self, other: Transformed, offset: u32) -> Result<(), BadOutput> {
        let base = u32::try_from(self.outputs.data.len() + other.outputs.data.len())
            .map(|_| self.outputs.data.len() as u32)
            .map_err(|_| BadOutput("the batch's output is larger than 4 GiB".into()))?;
        let shift = |(a, b): (u32, u32)| (a + base, b + base);
        self.outputs.data.extend_from_slice(&other.outputs.data);
        self.outputs
            .spans
            .extend(other.outputs.spans.into_iter().map(|s| Spans {
                channel: shift(s.channel),
                payload: shift(s.payload),
                key: s.key.map(shift),
                audience: s.audience.map(shift),
                source: s.source + offset,
            }));
        self.refused
            .extend(other.refused.into_iter().map(|r| Refusal {
                source: r.source + offset,
                ..r
            }));
        Ok(())
    }

    /// Refuses record `source`, which produced nothing.
    pub fn refuse(&mut self, source: u32, kind: &'static str, reason: String) {
        self.refused.push(Refusal {
            source,
            kind,
            reason,
        });
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin output breaks the contract: {0}")]
pub struct BadOutput(pub String);

const NONE: u32 = u32::MAX;

/// Checks `herald:plugin/types.outgoing-batch`: its structure whole (lengths
/// within the data and using all of it, source indexes), then each message's
/// content (channel name, key and audience lengths, UTF-8, payload size),
/// refusing the records whose messages break it.
pub fn decode_outgoing(
    data: Vec<u8>,
    meta: &[u32],
    records: usize,
    max_payload: usize,
) -> Result<Transformed, BadOutput> {
    if !meta.len().is_multiple_of(5) {
        return Err(BadOutput(format!(
            "meta has {} entries, not a multiple of 5",
            meta.len()
        )));
    }
    if data.len() > u32::MAX as usize {
        return Err(BadOutput("output larger than 4 GiB".into()));
    }
    let mut pos = 0u32;
    let mut take = |len: u32, what: &str, i: usize| -> Result<(u32, u32), BadOutput> {
        let end = pos
            .checked_add(len)
            .filter(|&e| e as usize <= data.len())
            .ok_or_else(|| {
                BadOutput(format!(
                    "message {i}: {what} length {len} runs past the data"
                ))
            })?;
        let span = (pos, end);
        pos = end;
        Ok(span)
    };
    let mut spans = Vec::with_capacity(meta.len() / 5);
    // One bit per source record, allocated at the first refusal.
    let mut refused_bits: Vec<u64> = Vec::new();
    let mut refused = Vec::new();
    for (i, m) in meta.chunks_exact(5).enumerate() {
        let channel = take(m[0], "channel", i)?;
        let payload = take(m[1], "payload", i)?;
        let key = match m[2] {
            NONE => None,
            n => Some(take(n, "key", i)?),
        };
        let audience = match m[3] {
            NONE => None,
            n => Some(take(n, "audience", i)?),
        };
        if m[4] as usize >= records {
            return Err(BadOutput(format!(
                "message {i}: source index {} out of range",
                m[4]
            )));
        }
        let s = Spans {
            channel,
            payload,
            key,
            audience,
            source: m[4],
        };
        if let Err(reason) = check_content(&data, &s, i, max_payload) {
            if refused_bits.is_empty() {
                refused_bits = vec![0; records.div_ceil(64)];
            }
            let (word, bit) = (s.source as usize / 64, 1u64 << (s.source % 64));
            if refused_bits[word] & bit == 0 {
                refused_bits[word] |= bit;
                refused.push(Refusal {
                    source: s.source,
                    kind: "bad_output",
                    reason,
                });
            }
        }
        spans.push(s);
    }
    if pos as usize != data.len() {
        return Err(BadOutput(format!(
            "{} bytes of data left over",
            data.len() - pos as usize
        )));
    }
    if !refused.is_empty() {
        // A record's outputs go together or not at all: an earlier, good
        // output of a refused record is dropped too.
        spans.retain(|s| refused_bits[s.source as usize / 64] & (1u64 << (s.source % 64)) == 0);
        refused.sort_unstable_by_key(|r| r.source);
    }
    Ok(Transformed {
        outputs: Outputs { data, spans },
        refused,
    })
}

/// The content rules of one well-formed message; the error (allocated only
/// for a breach) is the reason its record is refused.
fn check_content(data: &[u8], s: &Spans, i: usize, max_payload: usize) -> Result<(), String> {
    let text = |(a, b): (u32, u32), what: &str| -> Result<&str, String> {
        std::str::from_utf8(&data[a as usize..b as usize])
            .map_err(|_| format!("message {i}: {what} is not UTF-8"))
    };
    let len = |(a, b): (u32, u32)| (b - a) as usize;
    let name = text(s.channel, "channel")?;
    proto::validate_channel(name).map_err(|e| format!("message {i}: channel {name:?}: {e}"))?;
    if len(s.payload) > max_payload {
        return Err(format!(
            "message {i}: payload of {} bytes exceeds {max_payload}",
            len(s.payload)
        ));
    }
    if let Some(k) = s.key {
        if !(1..=128).contains(&len(k)) {
            return Err(format!("message {i}: conflation key must be 1-128 bytes"));
        }
        text(k, "key")?;
    }
    if let Some(a) = s.audience {
        if !(1..=64).contains(&len(a)) {
            return Err(format!("message {i}: audience must be 1-64 bytes"));
        }
        text(a, "audience")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_pack_in_order() {
        let headers = vec![("h".to_string(), b"v".to_vec())];
        let recs = [
            SourceRecord {
                timestamp_ms: 5,
                position: Some(crate::fanout::position::SourcePos {
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
                position: Some(crate::fanout::position::SourcePos {
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
}

#[cfg(test)]
mod append_tests {
    use super::*;

    fn one(ch: &str, payload: &[u8], key: Option<&str>, source: u32) -> Transformed {
        let mut data = ch.as_bytes().to_vec();
        data.extend_from_slice(payload);
        data.extend_from_slice(key.unwrap_or("").as_bytes());
        let meta = [
            ch.len() as u32,
            payload.len() as u32,
            key.map_or(NONE, |k| k.len() as u32),
            NONE,
            source,
        ];
        decode_outgoing(data, &meta, source as usize + 1, 1024).unwrap()
    }

    #[test]
    fn parts_append_in_record_order_with_their_offsets() {
        let mut all = one("a", b"1", Some("k"), 0);
        all.append(one("bb", b"22", None, 1), 5).unwrap();
        all.refuse(7, "timeout", "late".into());
        let msgs: Vec<_> = all.outputs.iter().collect();
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            (
                msgs[0].channel,
                msgs[0].payload,
                msgs[0].key,
                msgs[0].source
            ),
            ("a", &b"1"[..], Some("k"), 0)
        );
        assert_eq!(
            (
                msgs[1].channel,
                msgs[1].payload,
                msgs[1].key,
                msgs[1].source
            ),
            ("bb", &b"22"[..], None, 6)
        );
        assert_eq!((all.refused[0].source, all.refused[0].kind), (7, "timeout"));
    }
}
