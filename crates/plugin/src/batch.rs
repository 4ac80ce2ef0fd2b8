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

use herald_proto as proto;

/// One record as a source delivered it.
#[derive(Debug, Clone, Copy)]
pub struct SourceRecord<'a> {
    pub timestamp_ms: u64,
    /// Where the record sits in its source; `None` for HTTP publish.
    pub position: Option<herald_fanout::position::SourcePos>,
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
pub fn typed_records(records: &[SourceRecord<'_>]) -> Vec<super::TypedRecord> {
    records
        .iter()
        .map(|r| super::TypedRecord {
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
pub fn encode_outgoing(out: &[super::TransformOutput]) -> (Vec<u8>, Vec<u32>) {
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
mod tests;

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
