//! permessage-deflate (RFC 7692) without I/O: the offer a client makes and
//! the answer Herald gives, one message compressed, one inflated under a
//! bound.
//!
//! Herald always answers with `server_no_context_takeover` and
//! `client_no_context_takeover`: every message is compressed and inflated on
//! its own, so a message's compressed frame is the same bytes for every
//! subscriber that agreed to the same window (compressed once per message
//! and audience, shared like the plain frame), and an idle connection keeps
//! no compression state at all (no 32 KiB window per connection).

use crate::ws::FrameError;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use std::cell::RefCell;

/// The extension's token in `Sec-WebSocket-Extensions`.
pub const EXTENSION: &str = "permessage-deflate";

/// The largest LZ77 window (bits) DEFLATE has, and the default.
pub const MAX_WINDOW_BITS: u8 = 15;

/// What Herald agreed to with one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The window Herald compresses within: the client's
    /// `server_max_window_bits`, 15 when it named none.
    pub server_window_bits: u8,
}

impl Agreed {
    /// The `Sec-WebSocket-Extensions` value of the handshake's answer.
    pub fn response(&self) -> String {
        let mut s = format!("{EXTENSION}; server_no_context_takeover; client_no_context_takeover");
        if self.server_window_bits < MAX_WINDOW_BITS {
            s.push_str(&format!(
                "; server_max_window_bits={}",
                self.server_window_bits
            ));
        }
        s
    }
}

/// The first permessage-deflate offer among a request's
/// `Sec-WebSocket-Extensions` values that Herald can accept (RFC 7692 §5,
/// §7.1): offers with an unknown, repeated or malformed parameter are
/// declined, as are other extensions.
pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Agreed> {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .find_map(accept_offer)
}

fn accept_offer(offer: &str) -> Option<Agreed> {
    let mut parts = offer.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case(EXTENSION) {
        return None;
    }
    let mut seen = [false; 4];
    let mut server_window_bits = MAX_WINDOW_BITS;
    for p in parts {
        if p.is_empty() {
            return None;
        }
        let (name, value) = match p.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (p, None),
        };
        let (i, ok) = match name.to_ascii_lowercase().as_str() {
            "server_no_context_takeover" => (0, value.is_none()),
            "client_no_context_takeover" => (1, value.is_none()),
            "server_max_window_bits" => {
                let bits = value.and_then(window_bits)?;
                server_window_bits = bits;
                (2, true)
            }
            // Herald inflates with the largest window, so it needs no
            // smaller one from the client and names none in its answer.
            "client_max_window_bits" => (3, value.is_none_or(|v| window_bits(v).is_some())),
            _ => return None,
        };
        if !ok || std::mem::replace(&mut seen[i], true) {
            return None;
        }
    }
    Some(Agreed { server_window_bits })
}

/// A window size parameter: 8 to 15, digits only (RFC 7692 §7.1.2).
fn window_bits(v: &str) -> Option<u8> {
    if v.is_empty() || v.len() > 2 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let bits: u8 = v.parse().ok()?;
    (8..=MAX_WINDOW_BITS).contains(&bits).then_some(bits)
}

thread_local! {
    static COMPRESSOR: RefCell<Compress> = RefCell::new(Compress::new(Compression::new(6), false));
    static INFLATER: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// The tail every sync-flushed message ends with; it is left off the wire
/// (RFC 7692 §7.2.1) and put back before inflating.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Appends `payload` compressed as one message to `out` and returns true:
/// raw DEFLATE blocks
/// that refer back at most 2^`window_bits` bytes, without the trailing
/// `00 00 ff ff`. A window below the largest is kept by compressing each
/// stretch of 2^bits bytes from a fresh state (their blocks, each ending in
/// a sync flush, form one valid stream). Returns false, with `out` as it
/// was, when the compressor's output did not end in a complete sync flush
/// (miniz_oxide left one unfinished on some 64 KiB messages of Autobahn's
/// case 12.2): the message must then go uncompressed.
#[must_use]
pub fn compress(payload: &[u8], window_bits: u8, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let chunk = if window_bits >= MAX_WINDOW_BITS {
        payload.len().max(1)
    } else {
        1usize << window_bits.max(8)
    };
    let complete = COMPRESSOR.with(|c| {
        let c = &mut *c.borrow_mut();
        let mut chunks = payload.chunks(chunk).peekable();
        if chunks.peek().is_none() {
            return deflate_chunk(c, &[], out);
        }
        chunks.all(|part| deflate_chunk(c, part, out))
    });
    if !complete || !out[start..].ends_with(&TAIL) {
        out.truncate(start);
        return false;
    }
    out.truncate(out.len() - TAIL.len());
    true
}

/// One stretch from a fresh state, ending in a sync flush; false if the
/// output does not end in the flush's `00 00 ff ff`.
fn deflate_chunk(c: &mut Compress, mut input: &[u8], out: &mut Vec<u8>) -> bool {
    c.reset();
    let start = out.len();
    loop {
        out.reserve(input.len() / 2 + 64);
        let before = c.total_in();
        c.compress_vec(input, out, FlushCompress::Sync)
            .expect("compressing into a growing buffer cannot fail");
        input = &input[(c.total_in() - before) as usize..];
        // Done once all input is in and the flush left room to spare.
        if input.is_empty() && out.len() < out.capacity() {
            return out[start..].ends_with(&TAIL);
        }
    }
}

/// Inflates one message's compressed payload (its frames' payloads joined):
/// more than `max` bytes of it is `TooBig` — a zip bomb costs at most `max`
/// bytes — and data that is not DEFLATE fails the connection with 1007.
pub fn inflate(data: &[u8], max: usize) -> Result<Vec<u8>, FrameError> {
    INFLATER.with(|d| {
        let d = &mut *d.borrow_mut();
        d.reset(false);
        let mut out = Vec::with_capacity((data.len() * 4).max(64).min(max.saturating_add(1)));
        for input in [data, &TAIL[..]] {
            let mut input = input;
            loop {
                if out.len() == out.capacity() {
                    if out.len() > max {
                        return Err(FrameError::TooBig {
                            size: out.len() as u64,
                            limit: max,
                        });
                    }
                    let more = out.len().max(64).min(max + 1 - out.len());
                    out.reserve_exact(more);
                }
                let before = d.total_in();
                let status = d
                    .decompress_vec(input, &mut out, FlushDecompress::Sync)
                    .map_err(|_| FrameError::BadDeflate)?;
                input = &input[(d.total_in() - before) as usize..];
                if out.len() > max {
                    return Err(FrameError::TooBig {
                        size: out.len() as u64,
                        limit: max,
                    });
                }
                if status == Status::StreamEnd {
                    // A final block: what follows it is not part of the
                    // stream (the tail appended here is the only thing
                    // allowed to be left over).
                    if !input.is_empty() && input != TAIL {
                        return Err(FrameError::BadDeflate);
                    }
                    return Ok(out);
                }
                if input.is_empty() && out.len() < out.capacity() {
                    break;
                }
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offers_are_accepted_or_declined_as_rfc_7692_says() {
        let ok = |s: &str| negotiate([s]);
        let full = Agreed {
            server_window_bits: 15,
        };
        assert_eq!(ok("permessage-deflate"), Some(full));
        assert_eq!(ok("permessage-deflate; client_max_window_bits"), Some(full));
        assert_eq!(
            ok("permessage-deflate; server_no_context_takeover; client_max_window_bits=10"),
            Some(full)
        );
        assert_eq!(
            ok("permessage-deflate; server_max_window_bits=9"),
            Some(Agreed {
                server_window_bits: 9
            })
        );
        assert_eq!(
            ok("permessage-deflate; server_max_window_bits=\"10\""),
            Some(Agreed {
                server_window_bits: 10
            })
        );
        // Declined: other extensions, unknown or repeated parameters, bad values.
        for bad in [
            "x-webkit-deflate-frame",
            "permessage-deflate; foo",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=7",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits=+9",
            "permessage-deflate; client_max_window_bits=0",
            "permessage-deflate; client_no_context_takeover=1",
            "permessage-deflate;",
        ] {
            assert_eq!(ok(bad), None, "{bad}");
        }
        // The first acceptable offer wins, across values and commas.
        assert_eq!(
            negotiate([
                "permessage-deflate; server_max_window_bits=99, permessage-deflate; server_max_window_bits=12",
                "permessage-deflate",
            ]),
            Some(Agreed {
                server_window_bits: 12
            })
        );
        assert_eq!(
            full.response(),
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        );
        assert!(Agreed {
            server_window_bits: 9
        }
        .response()
        .ends_with("; server_max_window_bits=9"));
    }

    /// RFC 7692 §7.2.3.1: "Hello" compressed without context takeover.
    #[test]
    fn the_rfc_example_inflates() {
        let hello = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        assert_eq!(inflate(&hello, 100).unwrap(), b"Hello");
        // §7.2.3.3: a stored (uncompressed) block.
        let stored = [
            0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
        ];
        assert_eq!(inflate(&stored, 100).unwrap(), b"Hello");
        assert_eq!(inflate(&[0x00], 100).unwrap(), b"");
    }

    #[test]
    fn a_zip_bomb_is_too_big_and_garbage_is_bad_data() {
        let zeros = vec![0u8; 10 << 20];
        let mut bomb = Vec::new();
        assert!(compress(&zeros, 15, &mut bomb));
        assert!(bomb.len() < 20_000, "{}", bomb.len());
        assert!(matches!(
            inflate(&bomb, 1 << 20),
            Err(FrameError::TooBig { limit, .. }) if limit == 1 << 20
        ));
        assert_eq!(inflate(&bomb, 10 << 20).unwrap().len(), 10 << 20);
        assert_eq!(
            inflate(&[0xff, 0xff, 0xff], 100),
            Err(FrameError::BadDeflate)
        );
        assert_eq!(
            FrameError::BadDeflate.close_code(),
            crate::ws::close::BAD_DATA
        );
    }

    /// The largest distance a raw DEFLATE stream refers back (walks its
    /// blocks with a tiny inflater of its own), to check the window kept.
    fn max_distance(data: &[u8]) -> usize {
        inflate_distances(data)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Any message, any window: what is compressed inflates to itself,
        /// never refers further back than the window, and is the same bytes
        /// every time (so one compression serves every subscriber).
        #[test]
        fn compress_inflate_round_trips_within_the_window(
            block in proptest::collection::vec(any::<u8>(), 0..3000),
            repeat in 1usize..12,
            bits in 8u8..=15,
        ) {
            // A random block repeated: matches lie a block's length back,
            // past a small window.
            let payload: Vec<u8> = block.iter().copied().cycle().take(block.len() * repeat).collect();
            let mut a = Vec::new();
            prop_assert!(compress(&payload, bits, &mut a));
            let mut b = Vec::new();
            prop_assert!(compress(&payload, bits, &mut b));
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(inflate(&a, payload.len()).unwrap(), payload.clone());
            let far = max_distance(&a);
            prop_assert!(far <= 1 << bits, "{} > {}", far, 1 << bits);
            if !payload.is_empty() {
                let short = inflate(&a, payload.len() - 1);
                prop_assert!(matches!(short, Err(FrameError::TooBig { .. })), "{:?}", short.map(|v| v.len()));
            }
        }
    }

    /// A minimal DEFLATE decoder (RFC 1951) that reports the largest
    /// back-reference distance instead of the output.
    fn inflate_distances(data: &[u8]) -> usize {
        let mut with_tail = data.to_vec();
        with_tail.extend_from_slice(&TAIL);
        let mut r = Bits {
            data: &with_tail,
            pos: 0,
        };
        let mut max = 0;
        loop {
            if r.pos / 8 >= with_tail.len() {
                return max;
            }
            let last = r.bits(1);
            match r.bits(2) {
                0 => {
                    r.pos = r.pos.div_ceil(8) * 8;
                    let len = r.bits(16);
                    r.bits(16);
                    r.pos += len * 8;
                }
                kind @ (1 | 2) => {
                    let (lit, dist) = if kind == 1 {
                        fixed_tables()
                    } else {
                        dynamic_tables(&mut r)
                    };
                    loop {
                        let sym = decode(&mut r, &lit);
                        if sym < 256 {
                            continue;
                        }
                        if sym == 256 {
                            break;
                        }
                        let (_, extra) = LEN[sym - 257];
                        r.bits(extra);
                        let d = decode(&mut r, &dist);
                        let (base, extra) = DIST[d];
                        max = max.max(base + r.bits(extra));
                    }
                }
                _ => panic!("reserved block type"),
            }
            if last == 1 {
                return max;
            }
        }
    }

    struct Bits<'a> {
        data: &'a [u8],
        pos: usize,
    }

    impl Bits<'_> {
        fn bits(&mut self, n: usize) -> usize {
            let mut v = 0;
            for i in 0..n {
                let b = (self.data[self.pos / 8] >> (self.pos % 8)) & 1;
                v |= (b as usize) << i;
                self.pos += 1;
            }
            v
        }
    }

    /// A canonical Huffman code: how many codes of each length, and the
    /// symbols in code order.
    struct Table {
        count: [usize; 16],
        symbols: Vec<usize>,
    }

    fn table(lens: &[u8]) -> Table {
        let mut count = [0usize; 16];
        for &l in lens {
            count[l as usize] += 1;
        }
        count[0] = 0;
        let mut symbols = Vec::new();
        for len in 1..16u8 {
            symbols.extend((0..lens.len()).filter(|&s| lens[s] == len));
        }
        Table { count, symbols }
    }

    fn decode(r: &mut Bits, t: &Table) -> usize {
        let (mut code, mut first, mut index) = (0usize, 0usize, 0usize);
        for len in 1..16 {
            code |= r.bits(1);
            let count = t.count[len];
            if code < first + count {
                return t.symbols[index + code - first];
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        panic!("bad Huffman code")
    }

    fn fixed_tables() -> (Table, Table) {
        let mut lit = vec![8u8; 288];
        lit[144..256].fill(9);
        lit[256..280].fill(7);
        (table(&lit), table(&[5u8; 30]))
    }

    fn dynamic_tables(r: &mut Bits) -> (Table, Table) {
        const ORDER: [usize; 19] = [
            16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
        ];
        let hlit = r.bits(5) + 257;
        let hdist = r.bits(5) + 1;
        let hclen = r.bits(4) + 4;
        let mut cl_lens = vec![0u8; 19];
        for &i in ORDER.iter().take(hclen) {
            cl_lens[i] = r.bits(3) as u8;
        }
        let cl = table(&cl_lens);
        let mut lens = Vec::new();
        while lens.len() < hlit + hdist {
            match decode(r, &cl) {
                s @ 0..=15 => lens.push(s as u8),
                16 => {
                    let prev = *lens.last().expect("a length to repeat");
                    let n = 3 + r.bits(2);
                    lens.extend(std::iter::repeat_n(prev, n));
                }
                17 => {
                    let n = 3 + r.bits(3);
                    lens.extend(std::iter::repeat_n(0, n));
                }
                _ => {
                    let n = 11 + r.bits(7);
                    lens.extend(std::iter::repeat_n(0, n));
                }
            }
        }
        (table(&lens[..hlit]), table(&lens[hlit..]))
    }

    /// Length codes 257..285: (base, extra bits).
    const LEN: [(usize, usize); 29] = [
        (3, 0),
        (4, 0),
        (5, 0),
        (6, 0),
        (7, 0),
        (8, 0),
        (9, 0),
        (10, 0),
        (11, 1),
        (13, 1),
        (15, 1),
        (17, 1),
        (19, 2),
        (23, 2),
        (27, 2),
        (31, 2),
        (35, 3),
        (43, 3),
        (51, 3),
        (59, 3),
        (67, 4),
        (83, 4),
        (99, 4),
        (115, 4),
        (131, 5),
        (163, 5),
        (195, 5),
        (227, 5),
        (258, 0),
    ];
    /// Distance codes 0..29: (base, extra bits).
    const DIST: [(usize, usize); 30] = [
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 1),
        (7, 1),
        (9, 2),
        (13, 2),
        (17, 3),
        (25, 3),
        (33, 4),
        (49, 4),
        (65, 5),
        (97, 5),
        (129, 6),
        (193, 6),
        (257, 7),
        (385, 7),
        (513, 8),
        (769, 8),
        (1025, 9),
        (1537, 9),
        (2049, 10),
        (3073, 10),
        (4097, 11),
        (6145, 11),
        (8193, 12),
        (12289, 12),
        (16385, 13),
        (24577, 13),
    ];
}
