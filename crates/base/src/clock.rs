//! The wall clock, in milliseconds since the Unix epoch: the one `now_ms`
//! of the host (registry rows, positions, ages, the plugin's `now-ms`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
