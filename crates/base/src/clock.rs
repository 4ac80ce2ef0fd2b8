//! The wall clock, in milliseconds since the Unix epoch: the one `now_ms`
//! of the host (registry rows, positions, ages, the plugin's `now-ms`); and
//! a monotonic one, `mono_ms`, for what only compares durations in this
//! process (when a session last heard its client).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Milliseconds of a monotonic clock since its first reading in this
/// process: it never goes back, and fits an atomic.
pub fn mono_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}
