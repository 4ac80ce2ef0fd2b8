//! The watch of one Kafka connection: lag probes and new partitions.
//!
//! Owns: asking the brokers for their latest offsets every PROBE_EVERY (the
//! lag, and whether they answer at all), reading the topics' metadata every
//! DISCOVER_EVERY and assigning partitions added since, and the live/stalled
//! state that follows. Invariants: it runs as a task of its own beside the
//! reading, so no batch delays a stall; brokers that do not answer stall the
//! source within PROBE_EVERY + PROBE_TIMEOUT; lag is a stall only when
//! records wait with no delivery for STALL_AFTER, never because a burst was
//! probed a moment before the reader fetched it.

use super::{brokers, partitions, KafkaStart, Link, DISCOVER_EVERY, PROBE_EVERY, PROBE_TIMEOUT};
use crate::source::outbox::STALL_AFTER;
use crate::source::{set_state, Health, SourceState};
use crate::tenant::Tenant;
use parking_lot::Mutex;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

/// Watches one connection beside the reading: a task of its own, so that a
/// batch holding the reader — a slow transform, which may run on the
/// reader's own runtime thread — never delays a stall.
pub(super) struct Watch {
    pub(super) tenant: Arc<Tenant>,
    pub(super) health: Arc<Mutex<Health>>,
    pub(super) topics: Vec<String>,
    pub(super) start: KafkaStart,
    pub(super) link: Arc<Link>,
}

impl Watch {
    /// Probes the brokers every PROBE_EVERY and looks for new partitions every
    /// DISCOVER_EVERY, until aborted with its connection.
    pub(super) async fn run(self) -> Infallible {
        let mut discovered = Instant::now();
        loop {
            self.probe().await;
            if discovered.elapsed() >= DISCOVER_EVERY {
                discovered = Instant::now();
                self.discover().await;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// Asks for the latest offsets: the lag, and the state — stalled when the
    /// brokers do not answer or records wait without progress, else live.
    async fn probe(&self) {
        let positions = self.link.partitions.lock().positions();
        let (c, asked) = (self.link.consumer.clone(), positions.clone());
        let latest =
            tokio::task::spawn_blocking(move || brokers::latest(&*c, &asked, PROBE_TIMEOUT))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
        let latest = match latest {
            Ok(latest) => latest,
            Err(e) => {
                return set_state(&self.tenant, &self.health, SourceState::Stalled, Some(e));
            }
        };
        let lag = partitions::lag(&positions, &latest);
        self.health.lock().lag = Some(lag);
        self.tenant.metrics.source_lag.set(lag as f64);
        let now = Instant::now();
        let delivered = *self.link.progress.lock();
        let stuck = {
            let mut behind = self.link.behind_since.lock();
            *behind = behind_since(*behind, lag, delivered, now);
            behind.is_some_and(|t| now - t > STALL_AFTER)
        };
        if stuck {
            set_state(
                &self.tenant,
                &self.health,
                SourceState::Stalled,
                Some("lagging without progress".into()),
            );
        } else {
            set_state(&self.tenant, &self.health, SourceState::Live, None);
        }
    }

    /// Reads the topics' metadata again and assigns partitions added since
    /// (from their beginning: every record in them is new).
    async fn discover(&self) {
        let (c, p, topics, start) = (
            self.link.consumer.clone(),
            self.link.partitions.clone(),
            self.topics.clone(),
            self.start,
        );
        let added = tokio::task::spawn_blocking(move || {
            let found = brokers::find(&*c, &topics, PROBE_TIMEOUT)?;
            brokers::assign_new(&*c, &p, &found, start, PROBE_TIMEOUT)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match added {
            Ok(0) => {}
            Ok(n) => {
                let count = self.link.partitions.lock().count();
                self.health.lock().partitions = Some(count);
                tracing::info!(tenant = %self.tenant.id, added = n, partitions = count, "kafka partitions added to the topics; reading them from their beginning");
            }
            Err(e) => set_state(&self.tenant, &self.health, SourceState::Stalled, Some(e)),
        }
    }
}

/// Since when records have waited without a delivery (`None`: not behind),
/// from the previous answer, the lag just measured and the last delivery. A
/// lag first seen after a quiet spell starts the wait now — records written
/// a moment ago are not late yet — and a delivery since restarts it.
fn behind_since(
    before: Option<Instant>,
    lag: u64,
    delivered: Instant,
    now: Instant,
) -> Option<Instant> {
    match before {
        _ if lag == 0 => None,
        Some(t) if t > delivered => Some(t),
        _ => Some(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn records_after_a_quiet_spell_are_not_late_but_records_that_never_move_are() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let stuck =
            |since: Option<Instant>, now: Instant| since.is_some_and(|t| now - t > STALL_AFTER);
        // Last delivery at 0; a burst is written at 10 s and probed before
        // the reader fetched it: behind from now on, not since 0.
        let b = behind_since(None, 3, at(0), at(10_000));
        assert_eq!(b, Some(at(10_000)));
        assert!(!stuck(b, at(10_000)));
        // Delivered at 10.05 s, more waiting at 10.25 s: the wait restarts.
        let b = behind_since(b, 2, at(10_050), at(10_250));
        assert_eq!(b, Some(at(10_250)));
        // Nothing delivered after that: stalled once STALL_AFTER passed.
        let b = behind_since(b, 2, at(10_050), at(11_500));
        assert!(!stuck(b, at(11_500)));
        let b = behind_since(b, 2, at(10_050), at(11_800));
        assert!(stuck(b, at(11_800)));
        // Caught up: not behind.
        assert_eq!(behind_since(b, 0, at(10_050), at(12_000)), None);
    }
}
