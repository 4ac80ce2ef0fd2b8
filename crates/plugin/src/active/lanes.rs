//! Where an activated version's calls run: inline on the calling runtime
//! worker under the 2 ms budget, or on the tenant's plugin threads, and how
//! a version moves between the two (`run`, `offload`, `settle`, `demote`).

use super::{
    moved, ActivePlugin, Counted, Patience, PluginError, BLOCKING, CALLS_TOOK, COLD_WAIT,
    FAST_STREAK, INLINE, INLINE_BUDGET, INLINE_CALL, MIDDLING_COST, SLOW,
};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl ActivePlugin {
    /// Runs plugin work `f` for async code. Fast path: right here, on the
    /// runtime worker, under the inline budget ([`INLINE_BUDGET`]) instead
    /// of the deadline. A call still running then is cut (its instance
    /// dropped; hooks are pure, and a batch cut here published nothing) and
    /// runs again on the tenant's plugin threads with its whole deadline.
    /// The budget is wall time: a worker the kernel preempted on a busy
    /// machine overruns as a slow plugin does. So the call run again is
    /// the judge: if its guest call takes the budget or more of CPU time
    /// there, the version's later calls go there directly until they have
    /// been fast again for a while (every instance has answered `describe`
    /// before it serves, so a first call's faults are not what is judged).
    /// A call that panics the host (none should:
    /// `plugin::wasi` keeps every WASI call off the runtime) is caught and
    /// its version runs off the workers for good. So no plugin holds a
    /// worker for longer than the budget, whatever its deadline.
    pub async fn run<R: Send + 'static>(
        self: &Arc<Self>,
        patience: Patience,
        f: impl Fn(&ActivePlugin) -> Result<R, PluginError> + Send + 'static,
    ) -> Result<R, PluginError> {
        let mut wait_until = None;
        while self.mode.load(Ordering::Relaxed) == INLINE {
            let was = INLINE_CALL.replace(true);
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(self)));
            INLINE_CALL.set(was);
            match r {
                Ok(Err(PluginError::OverBudget)) => {
                    let (r, took) = self.offload_timed(patience, f).await;
                    if took.is_some_and(|t| t >= INLINE_BUDGET) {
                        self.demote(SLOW, "over_budget");
                    }
                    return r;
                }
                // No pooled instance, but one per worker exists or is being
                // made: one is in a call and comes back soon. Waiting for it
                // (up to COLD_WAIT in all: a call that finds the one handed
                // back taken by another waits again) keeps a burst of calls
                // on the workers; sent to the plugin threads instead, each
                // would have an instance made there, hold it meanwhile, and
                // a burst would fill their queue (JavaScript's swap storm:
                // 10-169 of 4,000 reconnections refused with plugin_busy).
                Ok(Err(PluginError::Cold)) if self.instances_busy() => {
                    let until =
                        *wait_until.get_or_insert_with(|| tokio::time::Instant::now() + COLD_WAIT);
                    if tokio::time::timeout_at(until, self.returned.notified())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                // Too few instances: this call has one made on a plugin
                // thread, and counts as it meanwhile, so the calls behind it
                // wait for it instead of each having one more made.
                Ok(Err(PluginError::Cold)) => {
                    let _making = Counted::add(&self.making);
                    return self.offload(patience, f).await;
                }
                Ok(r) => return r,
                Err(_) => self.demote(BLOCKING, "host_panic"),
            }
        }
        self.offload(patience, f).await
    }

    /// Runs `f` on one of the tenant's plugin threads (a blocking thread
    /// holding one of its `threads` permits), waiting for one per
    /// `patience`.
    pub async fn offload<R: Send + 'static>(
        self: &Arc<Self>,
        patience: Patience,
        f: impl FnOnce(&ActivePlugin) -> Result<R, PluginError> + Send + 'static,
    ) -> Result<R, PluginError> {
        self.offload_timed(patience, f).await.0
    }

    /// [`Self::offload`], with the CPU time its guest calls took (not the
    /// wait for a thread, nor making an instance; `None`: it made none).
    async fn offload_timed<R: Send + 'static>(
        self: &Arc<Self>,
        patience: Patience,
        f: impl FnOnce(&ActivePlugin) -> Result<R, PluginError> + Send + 'static,
    ) -> (Result<R, PluginError>, Option<Duration>) {
        let permit = match self.threads.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let (_waiting, ahead) = Counted::add(&self.waiting);
                if patience == Patience::Bounded && ahead >= self.limits.queue {
                    if self.busy_logged.due(1000) {
                        tracing::warn!(tenant = %self.tenant, version = self.version, threads = self.limits.threads, queue = self.limits.queue, "plugin threads and queue full: refusing calls with plugin_busy (logged once a second)");
                    }
                    return (Err(PluginError::Busy(ahead)), None);
                }
                match self.threads.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return (Err(PluginError::Busy(ahead)), None),
                }
            }
        };
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            CALLS_TOOK.set(None);
            let r = f(&this);
            let took = CALLS_TOOK.get();
            if let Some(t) = took {
                this.settle(t, r.is_ok());
            }
            (r, took)
        })
        .await
        .unwrap_or_else(|e| {
            let e = PluginError::Trap(format!("plugin thread failed: {e}"), Default::default());
            (Err(e), None)
        })
    }

    /// A version moved off the workers for being slow comes back once its
    /// calls have been fast for [`FAST_STREAK`] calls in a row.
    fn settle(&self, took: Duration, ok: bool) {
        if self.mode.load(Ordering::Relaxed) != SLOW {
            return;
        }
        if !ok || took >= INLINE_BUDGET {
            self.fast_streak.store(0, Ordering::Relaxed);
            return;
        }
        if took >= INLINE_BUDGET / 4 {
            let _ = self
                .fast_streak
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(MIDDLING_COST))
                });
            return;
        }
        if self.fast_streak.fetch_add(1, Ordering::Relaxed) + 1 >= FAST_STREAK
            && self
                .mode
                .compare_exchange(SLOW, INLINE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.fast_streak.store(0, Ordering::Relaxed);
            moved(&self.tenant, "inline", "fast_again");
            tracing::info!(tenant = %self.tenant, version = self.version, "plugin calls are fast again; they run inline");
        }
    }

    /// Moves the version's calls to lane `to`; `why` is the metric's label
    /// (`over_budget`, `slow_start`: making an instance ran past the deadline,
    /// `host_panic`).
    pub(super) fn demote(&self, to: u8, why: &'static str) {
        let from = self.mode.fetch_max(to, Ordering::Relaxed);
        if from < to {
            if from == INLINE {
                moved(&self.tenant, "plugin_threads", why);
            }
            tracing::warn!(tenant = %self.tenant, version = self.version, why, "plugin calls move to the tenant's plugin threads");
        }
    }
}

/// The CPU time this thread has used.
pub(super) fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}
