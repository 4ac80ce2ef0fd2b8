//! Mutation fuzzing of every parser a remote party feeds (the targets are
//! `crate::fuzzing`), on the stable toolchain the test command has (the
//! coverage-guided runs under cargo-fuzz need a nightly one: `fuzz/`): seeds of valid input, mutated by bit flips, interesting bytes,
//! JSON tokens, insertions, deletions, duplications, splices and
//! truncations, each run under `catch_unwind` with the parser's own
//! invariants checked. A crash prints the input as hex; it then becomes a
//! regression test beside the parser.
//!
//! The test command runs each target for `HERALD_FUZZ_SECS` (default 1 s);
//! a longer run: `HERALD_FUZZ_SECS=300 cargo test -p herald-host --lib fuzz
//! -- --nocapture --test-threads 1`. Each target prints its executions and
//! executions per second.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

const TOKENS: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"1e999",
    b"18446744073709551616",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"\r\n",
    b"\r\n\r\n",
    b"%",
    b"%zz",
    b"&",
    b"=",
    b"?",
    b"/",
    b";",
    b"\xff",
    b"\xc3",
    b"\x00",
];

const INTERESTING: &[u8] = &[0, 1, 0x7e, 0x7f, 0x80, 0x81, 0x88, 0x89, 0x8a, 0xfe, 0xff];

fn mutate(rng: &mut SmallRng, input: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    for _ in 0..rng.random_range(1..=4) {
        let len = input.len();
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                input[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                input[i] = INTERESTING[rng.random_range(0..INTERESTING.len())];
            }
            2 => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                let i = rng.random_range(0..=len);
                input.splice(i..i, t.iter().copied());
            }
            3 => {
                let i = rng.random_range(0..=len);
                let n = rng.random_range(1..=16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                input.splice(i..i, bytes);
            }
            4 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - i).min(32));
                input.drain(i..i + n);
            }
            5 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - i).min(64));
                let copy = input[i..i + n].to_vec();
                let at = rng.random_range(0..=len);
                input.splice(at..at, copy);
            }
            6 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                if !other.is_empty() {
                    let from = rng.random_range(0..other.len());
                    let at = rng.random_range(0..=len);
                    input.splice(at..at, other[from..].iter().copied());
                }
            }
            _ if len > 0 => input.truncate(rng.random_range(0..len)),
            _ => input.push(rng.random()),
        }
    }
    input.truncate(1 << 16);
}

fn budget() -> Duration {
    let secs = std::env::var("HERALD_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs)
}

/// Runs `target` on mutated seeds for the time budget; panics (failing the
/// test) with the input's hex when it panics. Returns the executions.
fn fuzz(name: &str, seeds: &[&[u8]], target: impl Fn(&[u8])) -> u64 {
    let seeds: Vec<Vec<u8>> = seeds.iter().map(|s| s.to_vec()).collect();
    let mut rng = SmallRng::seed_from_u64(rand::random());
    let start = Instant::now();
    let limit = budget();
    let mut execs = 0u64;
    // The seeds as they are, then mutants.
    for s in &seeds {
        run_one(name, s, &target);
        execs += 1;
    }
    let mut input = Vec::new();
    while start.elapsed() < limit {
        if execs.is_multiple_of(8) || input.is_empty() {
            input = seeds[rng.random_range(0..seeds.len())].clone();
        }
        mutate(&mut rng, &mut input, &seeds);
        run_one(name, &input, &target);
        execs += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "fuzz {name}: {execs} executions in {secs:.1} s ({:.0}/s)",
        execs as f64 / secs
    );
    execs
}

fn run_one(name: &str, input: &[u8], target: &impl Fn(&[u8])) {
    if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        panic!("fuzz {name}: crashed on input {hex}");
    }
}

fn masked(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = vec![(u8::from(fin) << 7) | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

#[test]
fn websocket_frames_and_reassembly() {
    let big = vec![b'a'; 300];
    let mut two = masked(0x1, false, b"{\"op\":");
    two.extend(masked(0x0, true, b"\"ping\"}"));
    let seeds: Vec<Vec<u8>> = vec![
        masked(0x1, true, b"{\"op\":\"sub\",\"ch\":\"a\",\"id\":1}"),
        masked(0x9, true, b"hi"),
        masked(0x8, true, &[0x03, 0xe8, b'o', b'k']),
        masked(0x2, true, &big),
        two,
    ];
    let seeds: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
    let n = fuzz("ws", &seeds, crate::fuzzing::ws_frames);
    assert!(n > 0);
}

#[test]
fn request_heads_and_routes() {
    let seeds: &[&[u8]] = &[
        b"GET /v1/t/acme/ws?token=x&since=4 HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        b"GET /v1/t/acme/sse?ch=a&ch=b%20c HTTP/1.1\r\nHost: a\r\nLast-Event-ID: 1:2;3:4\r\nOrigin: https://app.example\r\n\r\n",
        b"POST /v1/t/acme/publish HTTP/1.1\r\nHost: a\r\nContent-Length: 17\r\nAuthorization: Bearer k\r\n\r\n{\"ch\":\"a\",\"data\":1}",
    ];
    fuzz("head", seeds, crate::fuzzing::request_head);
}

#[test]
fn last_event_ids() {
    let seeds: &[&[u8]] = &[b"12:34", b"1:2;3:4;5:6", b"99999999999:1", b""];
    fuzz("last-event-id", seeds, crate::fuzzing::last_event_id);
}

#[test]
fn client_operations() {
    let seeds: &[&[u8]] = &[
        b"{\"op\":\"sub\",\"ch\":\"ticks.A\",\"id\":1,\"since\":5,\"epoch\":9}",
        b"{\"op\":\"unsub\",\"ch\":\"a\",\"id\":2}",
        b"{\"op\":\"ping\",\"id\":3}",
    ];
    fuzz("client-op", seeds, crate::fuzzing::client_op);
}

#[test]
fn publish_bodies() {
    let seeds: &[&[u8]] = &[
        b"0{\"ch\":\"a\",\"data\":{\"px\":1.5},\"key\":\"AAPL\"}",
        b"0[{\"ch\":\"a\",\"data\":1},{\"ch\":\"b.c\",\"data\":\"x\",\"key\":\"k\"}]",
        b"1[{\"data\":1},{\"ch\":\"b.c\",\"data\":\"x\"}]",
    ];
    fuzz("publish", seeds, crate::fuzzing::publish_body);
}

#[test]
fn admin_create_bodies() {
    let seeds: &[&[u8]] = &[
        b"{\"id\":\"acme\",\"access\":\"public\",\"config\":{\"a\":1},\"limits\":{\"queue_bytes\":100000,\"max_channels\":10,\"plugin_threads\":2},\"conflation\":{\"window_ms\":100,\"channels\":[\"ticks.*\"]},\"allowed_origins\":[\"https://app.example\"]}",
        b"{\"id\":\"b\"}",
    ];
    fuzz("admin-create", seeds, crate::fuzzing::admin_create);
}

#[test]
fn plugin_output_batches() {
    // Input: [records, metas...] then data; metas as little-endian u32s.
    let mut seed = vec![2u8, 5];
    for m in [1u32, 2, u32::MAX, u32::MAX, 0, 1, 1, 1, 1, 1] {
        seed.extend_from_slice(&m.to_le_bytes());
    }
    seed.extend_from_slice(b"a{}bxka");
    fuzz("plugin-output", &[&seed], crate::fuzzing::plugin_output);
}

/// The harness itself: a planted crash is found and reported, so a target
/// that passes has really run its parser on what the mutator made.
#[test]
fn a_planted_crash_is_found() {
    let found = catch_unwind(|| {
        fuzz("planted", &[b"{\"ch\":\"a\",\"data\":1}"], |input| {
            if input.windows(5).any(|w| w == b"1e999") {
                panic!("planted");
            }
        })
    });
    assert!(
        found.is_err(),
        "the mutator never produced the planted input"
    );
}
