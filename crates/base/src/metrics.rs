//! Prometheus metrics: one recorder per process, handles per tenant.
//!
//! Owns: metric names and labels. Invariants: labels are tenant ids and small
//! fixed enums only (never channel or connection ids); hot paths hold
//! pre-registered handles, so counting a frame is one atomic add, on a
//! cache line of the counting thread's own ([`HotCounter`]); what `/metrics`
//! renders ([`render`]) includes every count made before it.

use metrics::{counter, gauge, Counter, Gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder once; later calls reuse it (tests run
/// several hosts in one process).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first, in which
            // case our handle renders nothing: say so rather than hide it.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            handle
        })
        .clone()
}

/// The exposition text: every [`HotCounter`]'s counts folded in first.
pub fn render(handle: &PrometheusHandle) -> String {
    fold_hot(None);
    handle.render()
}

/// Slots of a [`HotCounter`]: threads share one only past this many.
const HOT_SLOTS: usize = 8;

/// One slot on a cache line of its own (128 bytes: the line and the one
/// the prefetcher pairs with it).
#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicU64);

/// Counts not yet in `exported`, one slot per counting thread.
struct Hot {
    slots: [Slot; HOT_SLOTS],
    exported: Counter,
}

/// A counter every runtime worker bumps for every frame it writes. An
/// exported counter is one atomic word (two, with its generation) that all
/// workers add to, so its cache line moves between cores at every frame;
/// here each thread adds to a line of its own, and the counts reach the
/// exported counter when `/metrics` is read ([`render`]) or the counter
/// is dropped.
pub struct HotCounter(Arc<Hot>);

/// Every live hot counter, for [`render`] to fold in.
static HOT: Mutex<Vec<Weak<Hot>>> = Mutex::new(Vec::new());

impl HotCounter {
    pub fn new(exported: Counter) -> HotCounter {
        let hot = Arc::new(Hot {
            slots: Default::default(),
            exported,
        });
        // Folding forgets the dropped ones, so tenants that come and go
        // leave nothing behind.
        fold_hot(Some(Arc::downgrade(&hot)));
        HotCounter(hot)
    }

    pub fn increment(&self, n: u64) {
        thread_local! {
            static SLOT: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) % HOT_SLOTS
            };
        }
        let i = SLOT.with(|s| *s);
        self.0.slots[i].0.fetch_add(n, Ordering::Relaxed);
    }
}

impl Hot {
    /// Moves what was counted into the exported counter (a count made
    /// meanwhile stays for the next fold: nothing is lost or counted twice).
    fn fold(&self) {
        let n: u64 = self
            .slots
            .iter()
            .map(|s| s.0.swap(0, Ordering::Relaxed))
            .sum();
        if n > 0 {
            self.exported.increment(n);
        }
    }
}

impl Drop for HotCounter {
    fn drop(&mut self) {
        self.0.fold();
    }
}

/// Folds every live hot counter into its exported counter, forgets the
/// dropped ones (they folded their counts as they went), and adds `new`.
fn fold_hot(new: Option<Weak<Hot>>) {
    let mut hot = HOT.lock().unwrap_or_else(PoisonError::into_inner);
    hot.retain(|h| h.upgrade().inspect(|h| h.fold()).is_some());
    hot.extend(new);
}

/// Session end reasons with pre-registered counters (see `server::session`).
const CLOSE_REASONS: [&str; 8] = [
    "peer",
    "io_error",
    "shutdown",
    "tenant_gone",
    "slow_consumer",
    "heartbeat_timeout",
    "too_big",
    "protocol",
];

/// Handles for one tenant's hot-path counters.
pub struct TenantMetrics {
    pub connections: Gauge,
    pub opened_ws: Counter,
    pub opened_sse: Counter,
    pub subscriptions: Gauge,
    pub frames_sent: HotCounter,
    /// Messages compressed for permessage-deflate sessions: one per
    /// message and audience, however many sessions it is sent to.
    pub deflated: Counter,
    pub writes: HotCounter,
    /// Waits of a writer holding off for a reader falling behind (its
    /// window low at two looks in a row): one per pace it waits.
    pub lagging: Counter,
    pub published: Counter,
    pub conflated: Counter,
    pub dropped: Counter,
    pub disconnected: Counter,
    /// Messages absorbed by a conflation window (replaced or merged).
    pub window_conflated: Counter,
    closed_by: [Counter; 8],
    /// Source records whose position a channel had already passed.
    pub duplicates: Counter,
    /// Source messages published at the channel's next position because
    /// another stream (a second Kafka partition) fed the channel further.
    pub rebased: Counter,
    /// Messages sent live but not kept in history (the tenant's histories
    /// were full; a resume across them gets a `gap`).
    pub history_not_kept: Counter,
    pub source_up: Gauge,
    pub source_lag: Gauge,
    pub source_records: Counter,
    pub source_errors: Counter,
    tenant: String,
}

impl TenantMetrics {
    pub fn new(tenant: &str) -> TenantMetrics {
        let t = tenant.to_string();
        let slow = |action: &'static str| counter!("herald_slow_consumer_total", "tenant" => t.clone(), "action" => action);
        TenantMetrics {
            connections: gauge!("herald_connections", "tenant" => t.clone()),
            opened_ws: counter!("herald_connections_opened_total", "tenant" => t.clone(), "transport" => "ws"),
            opened_sse: counter!("herald_connections_opened_total", "tenant" => t.clone(), "transport" => "sse"),
            subscriptions: gauge!("herald_subscriptions", "tenant" => t.clone()),
            frames_sent: HotCounter::new(
                counter!("herald_frames_sent_total", "tenant" => t.clone()),
            ),
            writes: HotCounter::new(counter!("herald_socket_writes_total", "tenant" => t.clone())),
            deflated: counter!("herald_ws_deflated_total", "tenant" => t.clone()),
            lagging: counter!("herald_lagging_reader_holds_total", "tenant" => t.clone()),
            published: counter!("herald_messages_published_total", "tenant" => t.clone()),
            conflated: slow("conflated"),
            dropped: slow("dropped"),
            disconnected: slow("disconnected"),
            window_conflated: counter!("herald_window_conflated_total", "tenant" => t.clone()),
            history_not_kept: counter!("herald_history_not_kept_total", "tenant" => t.clone()),
            source_up: gauge!("herald_source_up", "tenant" => t.clone()),
            source_lag: gauge!("herald_source_lag", "tenant" => t.clone()),
            source_records: counter!("herald_source_records_total", "tenant" => t.clone()),
            source_errors: counter!("herald_source_errors_total", "tenant" => t.clone()),
            duplicates: counter!("herald_source_duplicates_total", "tenant" => t.clone()),
            rebased: counter!("herald_source_rebased_total", "tenant" => t.clone()),
            closed_by: CLOSE_REASONS.map(
                |r| counter!("herald_sessions_closed_total", "tenant" => t.clone(), "reason" => r),
            ),
            tenant: t,
        }
    }

    pub fn refused(&self, reason: &'static str) {
        counter!("herald_connections_refused_total", "tenant" => self.tenant.clone(), "reason" => reason).increment(1);
    }

    pub fn client_error(&self, code: &'static str) {
        counter!("herald_client_errors_total", "tenant" => self.tenant.clone(), "code" => code)
            .increment(1);
    }

    pub fn publish_rejected(&self, reason: &'static str) {
        counter!("herald_publish_rejected_total", "tenant" => self.tenant.clone(), "reason" => reason).increment(1);
    }

    /// Records that a plugin failure dropped `n` records (or a connect/subscribe).
    pub fn dead_letter(&self, kind: &'static str, n: u64) {
        counter!("herald_plugin_dead_letters_total", "tenant" => self.tenant.clone(), "kind" => kind).increment(n);
    }

    pub fn plugin_failure(&self, hook: &'static str, kind: &'static str) {
        counter!("herald_plugin_failures_total", "tenant" => self.tenant.clone(), "hook" => hook, "kind" => kind).increment(1);
    }

    /// Counts a session that ended. The usual reasons have handles made at
    /// tenant creation: this runs once per connection.
    pub fn closed(&self, reason: &'static str) {
        match CLOSE_REASONS.iter().position(|r| *r == reason) {
            Some(i) => self.closed_by[i].increment(1),
            None => counter!("herald_sessions_closed_total", "tenant" => self.tenant.clone(), "reason" => reason)
                .increment(1),
        }
    }
}

/// A log line at most once per interval (a protection refusing under load
/// is counted per event and logged rarely).
#[derive(Debug, Default)]
pub struct LogEvery {
    last_ms: std::sync::atomic::AtomicU64,
}

impl LogEvery {
    /// True for the first caller once `every_ms` has passed since the last.
    pub fn due(&self, every_ms: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let now = crate::clock::now_ms() as u64;
        let last = self.last_ms.load(Relaxed);
        now >= last + every_ms
            && self
                .last_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }
}

/// Process-wide events without a tenant.
pub fn accept_error(kind: &'static str) {
    counter!("herald_accept_errors_total", "kind" => kind).increment(1);
}

pub fn refused_global(reason: &'static str) {
    counter!("herald_connections_refused_total", "tenant" => "", "reason" => reason).increment(1);
}

pub fn set_capacity(max: usize) {
    gauge!("herald_connection_capacity").set(max as f64);
}

pub fn set_rss(bytes: u64) {
    gauge!("herald_process_rss_bytes").set(bytes as f64);
}

/// 1 while this node hears the registry (cluster mode's LISTEN connection
/// and its reconcile queries work), 0 while it serves what it last knew.
pub fn set_registry_up(up: bool) {
    gauge!("herald_registry_up").set(if up { 1.0 } else { 0.0 });
}

/// Full comparisons of the live tenants with the registry, and the changes
/// they found that NOTIFY had not already brought.
pub fn reconciled(changed: usize) {
    counter!("herald_registry_reconciles_total").increment(1);
    counter!("herald_registry_reconcile_changes_total").increment(changed as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, name: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    }

    #[test]
    fn a_hot_counter_renders_every_count_from_every_thread() {
        let handle = install();
        let name = "herald_test_hot_total{tenant=\"hot\"}";
        let hot = Arc::new(HotCounter::new(
            counter!("herald_test_hot_total", "tenant" => "hot"),
        ));
        let threads: Vec<_> = (0..HOT_SLOTS + 3)
            .map(|_| {
                let hot = hot.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| hot.increment(3)))
            })
            .collect();
        let all = 3 * 1000 * (HOT_SLOTS as u64 + 3);
        // Reads while the threads count: never more than was counted.
        let early = value(&render(&handle), name).unwrap_or(0);
        assert!(early <= all);
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(value(&render(&handle), name), Some(all));
        // Counts made after a render, then the counter dropped: folded by the drop.
        hot.increment(5);
        drop(Arc::into_inner(hot).expect("the threads let go"));
        assert_eq!(value(&render(&handle), name), Some(all + 5));
    }
}
