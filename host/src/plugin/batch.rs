//! The flat batch encoding of `transform`, host side, without I/O.
//!
//! Owns: packing source records into one buffer plus lengths, and checking
//! what a plugin returns. Invariant: output that breaks the contract (lengths
//! past the data, bytes left over, a bad channel name, an oversized payload,
//! a source index out of range) is refused whole, never partly used.

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
/// Checking costs no allocation per message.
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin output breaks the contract: {0}")]
pub struct BadOutput(pub String);

const NONE: u32 = u32::MAX;

/// Checks `herald:plugin/types.outgoing-batch` whole: lengths within the data
/// and using all of it, channel names, UTF-8, sizes, source indexes.
pub fn decode_outgoing(
    data: Vec<u8>,
    meta: &[u32],
    records: usize,
    max_payload: usize,
) -> Result<Outputs, BadOutput> {
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
    let text = |(a, b): (u32, u32), what: &str, i: usize| -> Result<&str, BadOutput> {
        std::str::from_utf8(&data[a as usize..b as usize])
            .map_err(|_| BadOutput(format!("message {i}: {what} is not UTF-8")))
    };
    let mut spans = Vec::with_capacity(meta.len() / 5);
    for (i, m) in meta.chunks_exact(5).enumerate() {
        let channel = take(m[0], "channel", i)?;
        let name = text(channel, "channel", i)?;
        proto::validate_channel(name)
            .map_err(|e| BadOutput(format!("message {i}: channel {name:?}: {e}")))?;
        let payload = take(m[1], "payload", i)?;
        if (payload.1 - payload.0) as usize > max_payload {
            return Err(BadOutput(format!(
                "message {i}: payload of {} bytes exceeds {max_payload}",
                payload.1 - payload.0
            )));
        }
        let key = match m[2] {
            NONE => None,
            n if n == 0 || n > 128 => {
                return Err(BadOutput(format!(
                    "message {i}: conflation key must be 1-128 bytes"
                )))
            }
            n => {
                let k = take(n, "key", i)?;
                text(k, "key", i)?;
                Some(k)
            }
        };
        let audience = match m[3] {
            NONE => None,
            n if n == 0 || n > 64 => {
                return Err(BadOutput(format!(
                    "message {i}: audience must be 1-64 bytes"
                )))
            }
            n => {
                let a = take(n, "audience", i)?;
                text(a, "audience", i)?;
                Some(a)
            }
        };
        if m[4] as usize >= records {
            return Err(BadOutput(format!(
                "message {i}: source index {} out of range",
                m[4]
            )));
        }
        spans.push(Spans {
            channel,
            payload,
            key,
            audience,
            source: m[4],
        });
    }
    if pos as usize != data.len() {
        return Err(BadOutput(format!(
            "{} bytes of data left over",
            data.len() - pos as usize
        )));
    }
    Ok(Outputs { data, spans })
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
        let out = decode_outgoing(d, &m, 2, 100).unwrap();
        let v: Vec<_> = out.iter().collect();
        assert_eq!(
            (v[0].channel, v[0].payload, v[0].key),
            ("a", &b"{}"[..], Some("K"))
        );
        assert_eq!((v[1].audience, v[1].source), (Some("pro"), 1));
        assert!(decode_outgoing(Vec::new(), &[], 0, 100).unwrap().is_empty());
    }

    #[test]
    fn bad_output_is_refused_whole() {
        assert!(
            decode_outgoing(b"short".to_vec(), &[3, 1_000_000, NONE, NONE, 0], 1, 100).is_err()
        );
        let (d, m) = enc(&[("bad name", b"{}", None, None, 0)]);
        assert!(decode_outgoing(d.clone(), &m, 1, 100)
            .unwrap_err()
            .0
            .contains("channel"));
        let (d, m) = enc(&[("a", &[b'x'; 200], None, None, 0)]);
        assert!(decode_outgoing(d.clone(), &m, 1, 100)
            .unwrap_err()
            .0
            .contains("exceeds"));
        let (d, m) = enc(&[("a", b"{}", None, None, 3)]);
        assert!(decode_outgoing(d.clone(), &m, 1, 100)
            .unwrap_err()
            .0
            .contains("source index"));
        let (mut d, m) = enc(&[("a", b"{}", None, None, 0)]);
        d.push(0);
        assert!(decode_outgoing(d.clone(), &m, 1, 100)
            .unwrap_err()
            .0
            .contains("left over"));
        assert!(decode_outgoing(Vec::new(), &[1, 2, 3], 1, 100).is_err());
    }
}
