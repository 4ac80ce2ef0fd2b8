//! A token bucket without clocks of its own: the caller passes the time.
//!
//! Owns: the publish rate rule per tenant. Invariant: never more than `burst`
//! tokens; a refused take says how long until it would succeed.

use std::time::{Duration, Instant};

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
}
