//! What a plugin writes to Herald's own log (`log` in the WIT).
//!
//! Owns: turning a guest's log call into one log event. Invariants: a line
//! is at most [`LINE_MAX`] bytes; it is escaped (line breaks, control
//! characters and other unprintable characters as `\n`, `\u{1b}`…), so no
//! plugin can forge a log line of the host's or a terminal escape; a call
//! writes at most [`PER_CALL`] lines, and a tenant's plugin [`PER_SECOND`]
//! a second (a burst of [`BURST`]) across all its instances — what is
//! dropped past that is counted and said once it writes again.

use herald_base::ratelimit::TokenBucket;
use parking_lot::Mutex;
use std::time::Instant;

use super::v2::herald::plugin::types::Level;

/// Log lines one call may write.
pub(super) const PER_CALL: u32 = 16;
/// The longest line kept (longer ones are cut at a character boundary).
pub(super) const LINE_MAX: usize = 1024;
/// Log lines a tenant's plugin may write a second, and at once.
const PER_SECOND: f64 = 20.0;
const BURST: u32 = 100;

/// A tenant's share of the log, shared by all its plugin's instances.
pub(crate) struct LogRate {
    state: Mutex<(TokenBucket, u64)>,
}

impl LogRate {
    pub(super) fn new() -> LogRate {
        LogRate {
            state: Mutex::new((TokenBucket::new(PER_SECOND, BURST, Instant::now()), 0)),
        }
    }

    /// Whether a line may be written now, and how many were dropped since
    /// the last one that was.
    fn take(&self) -> Option<u64> {
        let mut s = self.state.lock();
        if s.0.try_take(1, Instant::now()).is_err() {
            s.1 += 1;
            return None;
        }
        Some(std::mem::take(&mut s.1))
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

/// Writes one guest log line for `tenant`, if its budgets allow.
pub(super) fn write(tenant: &str, rate: &LogRate, budget: &mut u32, level: Level, message: &str) {
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    let Some(dropped) = rate.take() else {
        return;
    };
    if dropped > 0 {
        tracing::warn!(
            tenant,
            dropped,
            "plugin log lines dropped past the tenant's rate"
        );
    }
    let mut cut = message.len().min(LINE_MAX);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let m = message[..cut].escape_debug();
    crate::active::keep_log(|| format!("{}: {m}", level_name(level)));
    match level {
        Level::Trace => tracing::trace!(tenant, plugin_log = %m),
        Level::Debug => tracing::debug!(tenant, plugin_log = %m),
        Level::Info => tracing::info!(tenant, plugin_log = %m),
        Level::Warn => tracing::warn!(tenant, plugin_log = %m),
        // A plugin's error is not data loss in the host: keep ERROR for the host's own.
        Level::Error => tracing::warn!(tenant, plugin_log = %m, plugin_level = "error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The log as a string, for one closure's events.
    fn captured(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_plugin_cannot_forge_a_log_line_or_an_escape() {
        let rate = LogRate::new();
        let mut budget = PER_CALL;
        let log = captured(|| {
            write(
                "t",
                &rate,
                &mut budget,
                Level::Info,
                "ok\n2026-12-02T00:00:00Z ERROR herald: admin token leaked\r\x1b[2J",
            )
        });
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(log.contains(r"ok\n2026"), "{log}");
        assert!(!log.contains('\x1b') && !log.contains('\r'), "{log:?}");
    }

    #[test]
    fn a_tenants_plugin_writes_at_most_its_rate_and_says_what_it_dropped() {
        let rate = LogRate::new();
        let log = captured(|| {
            // Many calls (each with a fresh per-call budget) in one instant.
            for _ in 0..50 {
                let mut budget = PER_CALL;
                for _ in 0..PER_CALL {
                    write("t", &rate, &mut budget, Level::Info, "chatty");
                }
            }
        });
        let lines = log.lines().filter(|l| l.contains("chatty")).count();
        assert!(
            (BURST as usize..=BURST as usize + 2).contains(&lines),
            "{lines}"
        );
        std::thread::sleep(std::time::Duration::from_millis(120));
        let mut budget = PER_CALL;
        let log = captured(|| write("t", &rate, &mut budget, Level::Info, "again"));
        assert!(log.contains("dropped="), "{log}");
        assert!(log.contains("again"), "{log}");
    }
}
