//! What a client checks on every message: `seq`/`prev` continuity per channel,
//! and the counters and latency histogram a worker reports.
//!
//! Owns: gap and duplicate detection (pure logic, no I/O) and [`Stats`], the
//! per-worker totals. A channel's position starts from the `seq` in its
//! subscribe ack (WebSocket) or from its first message (SSE, which has no ack).

use crate::hist::{Histogram, SparseHistogram};
use serde::{Deserialize, Serialize};

/// The result of checking one message against its channel's last position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// `prev` equals the last position seen.
    InOrder,
    /// First message on a channel with no known start (SSE).
    First,
    /// `prev` is ahead of the last position: `missing` positions were skipped.
    Gap { missing: u64 },
    /// `seq` is not above the last position: a duplicate or a step back.
    Backwards,
    /// A message for a channel this connection never subscribed to.
    Unknown,
}

/// Per-connection positions, one entry per subscribed channel.
#[derive(Debug, Default, Clone)]
pub struct SeqTracker {
    chans: Vec<(Box<str>, Option<u64>)>,
}

impl SeqTracker {
    /// Registers a channel; `head` is its position at subscribe time, if known.
    pub fn start(&mut self, ch: &str, head: Option<u64>) {
        match self.chans.iter_mut().find(|(c, _)| &**c == ch) {
            Some(entry) => entry.1 = head,
            None => self.chans.push((ch.into(), head)),
        }
    }

    /// Checks one message and records its position.
    pub fn on_msg(&mut self, ch: &str, seq: u64, prev: u64) -> SeqCheck {
        let Some(entry) = self.chans.iter_mut().find(|(c, _)| &**c == ch) else {
            return SeqCheck::Unknown;
        };
        let check = match entry.1 {
            None => SeqCheck::First,
            Some(last) if seq <= last => return SeqCheck::Backwards,
            Some(last) if prev == last => SeqCheck::InOrder,
            Some(last) if prev > last => SeqCheck::Gap {
                missing: prev - last,
            },
            // prev < last < seq: the server skipped positions without saying so.
            Some(last) => SeqCheck::Gap {
                missing: seq - last - 1,
            },
        };
        entry.1 = Some(seq);
        check
    }
}

/// Totals of one worker (and, merged, of a whole run).
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Data frames or SSE events received (any op).
    pub frames: u64,
    /// `msg` frames.
    pub msgs: u64,
    pub gaps: u64,
    pub missing: u64,
    pub backwards: u64,
    /// Frames that could not be parsed, or msgs without a usable `t`.
    pub bad: u64,
    /// `gap`/`err` frames from the server.
    pub server_errors: u64,
    pub pings: u64,
    /// Connections that ended before the worker stopped them.
    pub closed_early: u64,
    /// Close codes received, as (code, count).
    pub close_codes: Vec<(u16, u64)>,
    /// Publish-to-receive latency in microseconds.
    pub latency_us: Histogram,
    /// Failed connection attempts by reason ([`failure_reason`]), as (reason, count).
    pub failures: Vec<(String, u64)>,
    /// Reconnect storm: time from the storm to each connection being back, µs.
    pub reconnect_us: Histogram,
    /// Bytes read off the sockets after the handshakes (what the wire carried).
    pub wire_bytes: u64,
}

impl Stats {
    pub fn count_check(&mut self, c: SeqCheck) {
        match c {
            SeqCheck::InOrder | SeqCheck::First => {}
            SeqCheck::Gap { missing } => {
                self.gaps += 1;
                self.missing += missing;
            }
            SeqCheck::Backwards => self.backwards += 1,
            SeqCheck::Unknown => self.bad += 1,
        }
    }

    pub fn count_close(&mut self, code: u16) {
        match self.close_codes.iter_mut().find(|(c, _)| *c == code) {
            Some(e) => e.1 += 1,
            None => self.close_codes.push((code, 1)),
        }
    }

    pub fn count_failure(&mut self, reason: &str) {
        self.count_failures(reason, 1);
    }

    fn count_failures(&mut self, reason: &str, n: u64) {
        match self.failures.iter_mut().find(|(r, _)| r == reason) {
            Some(e) => e.1 += n,
            None => self.failures.push((reason.to_string(), n)),
        }
    }

    pub fn merge(&mut self, o: &Stats) {
        self.frames += o.frames;
        self.msgs += o.msgs;
        self.gaps += o.gaps;
        self.missing += o.missing;
        self.backwards += o.backwards;
        self.bad += o.bad;
        self.server_errors += o.server_errors;
        self.pings += o.pings;
        self.closed_early += o.closed_early;
        for (code, n) in &o.close_codes {
            for _ in 0..*n {
                self.count_close(*code);
            }
        }
        self.latency_us.merge(&o.latency_us);
        for (reason, n) in &o.failures {
            self.count_failures(reason, *n);
        }
        self.reconnect_us.merge(&o.reconnect_us);
        self.wire_bytes += o.wire_bytes;
    }

    pub fn to_wire(&self) -> StatsWire {
        StatsWire {
            frames: self.frames,
            msgs: self.msgs,
            gaps: self.gaps,
            missing: self.missing,
            backwards: self.backwards,
            bad: self.bad,
            server_errors: self.server_errors,
            pings: self.pings,
            closed_early: self.closed_early,
            close_codes: self.close_codes.clone(),
            latency_us: self.latency_us.to_sparse(),
            failures: self.failures.clone(),
            reconnect_us: self.reconnect_us.to_sparse(),
            wire_bytes: self.wire_bytes,
        }
    }

    pub fn from_wire(w: &StatsWire) -> Stats {
        Stats {
            frames: w.frames,
            msgs: w.msgs,
            gaps: w.gaps,
            missing: w.missing,
            backwards: w.backwards,
            bad: w.bad,
            server_errors: w.server_errors,
            pings: w.pings,
            closed_early: w.closed_early,
            close_codes: w.close_codes.clone(),
            latency_us: Histogram::from_sparse(&w.latency_us),
            failures: w.failures.clone(),
            reconnect_us: Histogram::from_sparse(&w.reconnect_us),
            wire_bytes: w.wire_bytes,
        }
    }
}

/// [`Stats`] as it travels from a worker to the parent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatsWire {
    pub frames: u64,
    pub msgs: u64,
    pub gaps: u64,
    pub missing: u64,
    pub backwards: u64,
    pub bad: u64,
    pub server_errors: u64,
    pub pings: u64,
    pub closed_early: u64,
    pub close_codes: Vec<(u16, u64)>,
    pub latency_us: SparseHistogram,
    #[serde(default)]
    pub failures: Vec<(String, u64)>,
    #[serde(default)]
    pub reconnect_us: SparseHistogram,
    #[serde(default)]
    pub wire_bytes: u64,
}

/// A short, countable reason for a failed connection attempt, from its error
/// text: `http 503`, `refused`, `timeout`, `reset`, `closed` or `other`.
pub fn failure_reason(err: &str) -> String {
    if let Some(rest) = err.split("answered ").nth(1) {
        let code: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if !code.is_empty() {
            return format!("http {code}");
        }
    }
    let e = err.to_ascii_lowercase();
    let reason = if e.contains("refused") {
        "refused"
    } else if e.contains("within") || e.contains("timed out") {
        "timeout"
    } else if e.contains("reset") {
        "reset"
    } else if e.contains("closed") || e.contains("broken pipe") {
        "closed"
    } else {
        "other"
    };
    reason.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_from_ack_position() {
        let mut t = SeqTracker::default();
        t.start("c", Some(5));
        assert_eq!(t.on_msg("c", 6, 5), SeqCheck::InOrder);
        assert_eq!(t.on_msg("c", 7, 6), SeqCheck::InOrder);
    }

    #[test]
    fn gaps_count_missing_positions() {
        let mut t = SeqTracker::default();
        t.start("c", Some(0));
        assert_eq!(t.on_msg("c", 1, 0), SeqCheck::InOrder);
        // 2 and 3 never arrived; the server said prev=3.
        assert_eq!(t.on_msg("c", 4, 3), SeqCheck::Gap { missing: 2 });
        assert_eq!(t.on_msg("c", 5, 4), SeqCheck::InOrder);
        // Positions need not be contiguous (Kafka offsets): prev decides.
        assert_eq!(t.on_msg("c", 9, 5), SeqCheck::InOrder);
        // prev behind the last position but seq ahead: counted through seq.
        assert_eq!(t.on_msg("c", 12, 8), SeqCheck::Gap { missing: 2 });
    }

    #[test]
    fn duplicates_and_unknown_channels() {
        let mut t = SeqTracker::default();
        t.start("a", Some(3));
        assert_eq!(t.on_msg("a", 3, 2), SeqCheck::Backwards);
        assert_eq!(t.on_msg("b", 1, 0), SeqCheck::Unknown);
        assert_eq!(t.on_msg("a", 4, 3), SeqCheck::InOrder);
    }

    #[test]
    fn sse_starts_at_first_message() {
        let mut t = SeqTracker::default();
        t.start("a", None);
        t.start("b", None);
        assert_eq!(t.on_msg("a", 10, 9), SeqCheck::First);
        assert_eq!(t.on_msg("a", 11, 10), SeqCheck::InOrder);
        assert_eq!(t.on_msg("b", 3, 2), SeqCheck::First);
    }

    #[test]
    fn failure_reasons() {
        assert_eq!(
            failure_reason("handshake answered 503: over capacity"),
            "http 503"
        );
        assert_eq!(
            failure_reason("connecting to 127.0.0.1:9: Connection refused (os error 111)"),
            "refused"
        );
        assert_eq!(failure_reason("no handshake/ack within 15s"), "timeout");
        assert_eq!(
            failure_reason("Connection reset by peer (os error 104)"),
            "reset"
        );
        assert_eq!(
            failure_reason("connection closed during the handshake"),
            "closed"
        );
        assert_eq!(failure_reason("something odd"), "other");
    }

    #[test]
    fn stats_count_and_merge() {
        let mut a = Stats::default();
        a.count_check(SeqCheck::Gap { missing: 3 });
        a.count_check(SeqCheck::InOrder);
        a.count_check(SeqCheck::Backwards);
        a.count_close(4002);
        a.latency_us.record(100);
        a.count_failure("http 503");
        a.reconnect_us.record(2_000);
        let mut b = Stats::from_wire(&a.to_wire());
        b.count_failure("timeout");
        b.count_close(4002);
        b.count_close(1000);
        b.merge(&a);
        assert_eq!((b.gaps, b.missing, b.backwards), (2, 6, 2));
        assert_eq!(b.close_codes, vec![(4002, 3), (1000, 1)]);
        assert_eq!(b.latency_us.count(), 2);
        assert_eq!(
            b.failures,
            vec![("http 503".to_string(), 2), ("timeout".to_string(), 1)]
        );
        assert_eq!(b.reconnect_us.count(), 2);
    }
}
