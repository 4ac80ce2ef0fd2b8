//! A token bucket without clocks of its own: the caller passes the time.
//!
//! Owns: the publish rate rule per tenant and the operation budget per
//! WebSocket connection. Invariant: never more than `burst` tokens; a
//! refused take says how long until it would succeed (publish) or counts
//! a strike (operations).

use std::time::{Duration, Instant};

/// What a client operation past its budget gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpVerdict {
    Allowed,
    /// Refused with an `err` frame; the client should slow down.
    Refused,
    /// Refused so often in a row that the connection is closed (1008).
    Close,
}

/// Operations past the budget in a row after which the connection closes.
pub const STRIKES_TO_CLOSE: u16 = 50;

/// A connection's budget of client operations: a token bucket kept small
/// (it lives in every session) and a count of refusals in a row.
#[derive(Debug)]
pub struct OpBudget {
    tokens: f32,
    last: Instant,
    strikes: u16,
}

impl OpBudget {
    pub fn new(burst: u32, now: Instant) -> OpBudget {
        OpBudget {
            tokens: burst as f32,
            last: now,
            strikes: 0,
        }
    }

    /// Takes one operation at `now` under `rate` per second and `burst`.
    pub fn take(&mut self, rate: f64, burst: u32, now: Instant) -> OpVerdict {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens as f64 + elapsed * rate).min(burst as f64) as f32;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.strikes = 0;
            return OpVerdict::Allowed;
        }
        self.strikes = self.strikes.saturating_add(1);
        if self.strikes >= STRIKES_TO_CLOSE {
            OpVerdict::Close
        } else {
            OpVerdict::Refused
        }
    }
}

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate_per_sec: f64, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate_per_sec,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes `n` tokens, or returns how long to wait before `n` are available.
    /// A request larger than the burst can never succeed and says so with the
    /// time a full bucket takes.
    pub fn try_take(&mut self, n: u32, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate_per_sec).min(self.burst);
        let n = f64::from(n);
        if n <= self.tokens {
            self.tokens -= n;
            return Ok(());
        }
        let missing = (n.min(self.burst) - self.tokens).max(0.0);
        Err(Duration::from_secs_f64(
            (missing / self.rate_per_sec).max(0.001),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 5, t0);
        for _ in 0..5 {
            assert!(b.try_take(1, t0).is_ok());
        }
        let wait = b.try_take(1, t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(90) && wait <= Duration::from_millis(101),
            "{wait:?}"
        );
        assert!(b.try_take(1, t0 + Duration::from_millis(100)).is_ok());
        assert!(b.try_take(1, t0 + Duration::from_millis(100)).is_err());
        // A long pause refills to the burst, not beyond.
        let later = t0 + Duration::from_secs(100);
        assert!(b.try_take(5, later).is_ok());
        assert!(b.try_take(1, later).is_err());
    }

    #[test]
    fn batch_takes_many() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 50, t0);
        assert!(b.try_take(50, t0).is_ok());
        assert!(b.try_take(60, t0).is_err());
    }

    #[test]
    fn op_budget_refuses_past_the_burst_then_closes() {
        let t0 = Instant::now();
        let mut b = OpBudget::new(3, t0);
        for _ in 0..3 {
            assert_eq!(b.take(10.0, 3, t0), OpVerdict::Allowed);
        }
        assert_eq!(b.take(10.0, 3, t0), OpVerdict::Refused);
        // A tenth of a second later one more is allowed, and the strikes reset.
        assert_eq!(
            b.take(10.0, 3, t0 + Duration::from_millis(100)),
            OpVerdict::Allowed
        );
        let t1 = t0 + Duration::from_millis(100);
        for _ in 1..STRIKES_TO_CLOSE {
            assert_eq!(b.take(10.0, 3, t1), OpVerdict::Refused);
        }
        assert_eq!(b.take(10.0, 3, t1), OpVerdict::Close);
        // Refill never passes the burst.
        let mut b = OpBudget::new(3, t0);
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(10.0, 3, later), OpVerdict::Allowed);
        }
        assert_eq!(b.take(10.0, 3, later), OpVerdict::Refused);
    }
}
