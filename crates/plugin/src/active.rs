//! An activated plugin version: its linked component, a small pool of
//! long-lived instances that calls borrow, and the lane its calls run in.
//!
//! Owns: calling hooks under the sandbox, and where they run. Invariants:
//! one call per instance at a time; an instance that failed (trap, timeout,
//! memory) is dropped, never returned to the pool; an instance whose memory
//! passed the high-water mark is recycled after its call; a version has at
//! most `threads + workers + 1` live instances, `workers` being the
//! runtime's (so its memory is bounded by that many caps); a call holds a
//! runtime worker for at most the inline budget, never its deadline (a call
//! that finds no instance waits for one with `.await`, holding nothing); a
//! hot swap replaces the whole `ActivePlugin`, so calls in flight finish on
//! the version they started on.

use super::{
    check_session, classify, cut_denial, deadline_ticks, from_v1, Bound, ConnectRequest, Contract,
    DeclaredHooks, Denial, Encoding, Grant, PluginError, PluginInfo, Prepared, Runtime,
    SandboxLimits, StoreState, EPOCH_TICK, LOGS_PER_CALL,
};
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use wasmtime::Store;

mod lanes;
mod transform;

use lanes::thread_cpu;

/// Instances kept idle per version, at least (one per runtime worker if
/// there are more); more are made under load and dropped after.
const POOL_MAX: usize = 4;

/// How long a call may hold a runtime worker. A jwt-auth call takes ~7 µs
/// and the hop to a blocking thread ~30 µs more (bench plugin), so most
/// calls run inline; a call still running after this is cut and runs again
/// on the tenant's plugin threads, and if it is slow there too the
/// version's later calls go there directly ([`ActivePlugin::run`]).
pub const INLINE_BUDGET: Duration = Duration::from_millis(2);

/// How long an inline call that found every instance busy waits in all for
/// one to come back (an inline call holds one for the [`INLINE_BUDGET`] at
/// most, and a worker the kernel preempted a few ms more) before it goes to
/// the plugin threads to have one made.
const COLD_WAIT: Duration = Duration::from_millis(20);

/// How a version moved off the workers for being slow earns its way back:
/// each offloaded call under a quarter of the inline budget adds one, one
/// between that and the budget takes [`MIDDLING_COST`] back, one over the
/// budget (or failed) starts again; at [`FAST_STREAK`] it runs inline.
/// Calls overwhelmingly fast come back within a few hundred calls though a
/// rare one is slow (a new instance, a busy machine); calls often slow
/// never do, so a version does not flap between the lanes.
const FAST_STREAK: u32 = 256;
const MIDDLING_COST: u32 = 16;

/// Records per `transform` call at most (the WIT promises it); a longer
/// batch is run in parts.
pub const MAX_RECORDS_PER_CALL: usize = 512;

/// Calls in a row that finish within the deadline at a version's part size
/// before it may double again (after a timeout halved it).
const GROW_AFTER: u32 = 64;

/// Where a version's calls run.
const INLINE: u8 = 0;
/// Off the workers: a call overran the inline budget (may come back).
const SLOW: u8 = 1;
/// Off the workers for good: a call panicked the host (a WASI call that
/// enters a runtime, which `plugin::wasi` exists to prevent; kept as the
/// safety net).
const BLOCKING: u8 = 2;

/// `herald_plugin_call_moves_total{tenant, to, why}`: a version's calls
/// moved off the runtime workers (`to="plugin_threads"`, `why` one of
/// `"over_budget"`, `"slow_start"`, `"host_panic"` — which no plugin should
/// cause) or back (`to="inline"`, `why="fast_again"`).
fn moved(tenant: &str, to: &'static str, why: &'static str) {
    metrics::counter!("herald_plugin_call_moves_total", "tenant" => tenant.to_string(), "to" => to, "why" => why)
        .increment(1);
}

thread_local! {
    /// Set while a call runs inline on a runtime worker: `call` then gives
    /// it the inline budget instead of its deadline.
    static INLINE_CALL: Cell<bool> = const { Cell::new(false) };
    /// The CPU time guest calls off the workers took on this thread since
    /// it was last reset (`None`: no call), an offloaded call's judge
    /// ([`ActivePlugin::run`]).
    static CALLS_TOOK: Cell<Option<Duration>> = const { Cell::new(None) };
    /// `herald plugin test`: keep what each call on this thread wrote.
    static KEEP_OUTPUT: Cell<bool> = const { Cell::new(false) };
    static LAST_OUTPUT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    static LAST_LOG: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes calls on this thread keep their guest output, successful or not,
/// for [`take_output`] (the server keeps only a failed call's, in its error).
pub fn keep_output(on: bool) {
    KEEP_OUTPUT.set(on);
}

/// What the calls on this thread wrote since the last take.
pub fn take_output() -> String {
    LAST_OUTPUT.with_borrow_mut(std::mem::take)
}

/// Keeps a log line the guest wrote (as the host's log got it) when
/// [`keep_output`] is on for this thread.
pub(crate) fn keep_log(line: impl FnOnce() -> String) {
    if KEEP_OUTPUT.get() {
        LAST_LOG.with_borrow_mut(|l| l.push(line()));
    }
}

/// The log lines the calls on this thread wrote since the last take.
pub fn take_log() -> Vec<String> {
    LAST_LOG.with_borrow_mut(std::mem::take)
}

/// Whether a call that finds every plugin thread busy may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// A client's request (connect, subscribe, HTTP publish): waits behind
    /// at most `queue` others, else `Busy` (503 `plugin_busy`).
    Bounded,
    /// A source reader: its batch waits as long as it takes (the reader is
    /// the only caller of its kind, and waiting is its backpressure).
    Unbounded,
}

struct Loaded {
    store: Store<StoreState>,
    plugin: Bound,
    _live: Live,
}

/// Counts a live instance for as long as it exists (pooled or in a call).
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes one off a count it was added to when dropped: a call waiting for
/// a plugin thread, a call having an instance made.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Adds one to `count` until the guard drops; also the count before.
    fn add(count: &'a AtomicUsize) -> (Counted<'a>, usize) {
        let before = count.fetch_add(1, Ordering::AcqRel);
        (Counted(count), before)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub struct ActivePlugin {
    pub version: i64,
    pub sha256: String,
    pub info: PluginInfo,
    runtime: Arc<Runtime>,
    pre: Prepared,
    limits: SandboxLimits,
    tenant: Arc<str>,
    config: Arc<str>,
    pool: Mutex<Vec<Loaded>>,
    /// Told each time an instance goes back to the pool.
    returned: tokio::sync::Notify,
    /// Instances in existence (pooled or in a call).
    live: Arc<AtomicUsize>,
    /// Inline calls that found too few instances, sent to the plugin
    /// threads to have one made (counted from before they get a thread).
    making: AtomicUsize,
    max_live: usize,
    /// The runtime's workers when the version was loaded: each may be in
    /// one inline call at a time, so the version makes one instance each.
    workers: usize,
    /// Instances kept idle: [`POOL_MAX`], or one per runtime worker.
    pool_max: usize,
    /// The tenant's plugin threads: calls off the runtime hold a permit.
    threads: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// INLINE, SLOW or BLOCKING.
    mode: AtomicU8,
    /// Refusals for being busy are logged once a second.
    busy_logged: herald_base::metrics::LogEvery,
    fast_streak: AtomicU32,
    /// Records per transform call: [`MAX_RECORDS_PER_CALL`], halved by a
    /// call that timed out, doubled back after [`GROW_AFTER`] good ones.
    part: AtomicUsize,
    part_streak: AtomicU32,
}

/// What an activation needs besides the component.
pub struct Activation {
    pub version: i64,
    pub sha256: String,
    pub tenant: Arc<str>,
    pub config: Arc<str>,
    pub limits: SandboxLimits,
}

impl ActivePlugin {
    /// Links `component`, instantiates it once and asks `describe`, all under
    /// the sandbox limits: a version that cannot do this is never activated.
    pub fn load(
        runtime: &Arc<Runtime>,
        component: &wasmtime::component::Component,
        a: Activation,
    ) -> Result<Arc<ActivePlugin>, PluginError> {
        let pre = runtime.prepare(component)?;
        let workers = runtime_workers();
        let mut active = ActivePlugin {
            version: a.version,
            sha256: a.sha256,
            info: PluginInfo {
                name: String::new(),
                version: String::new(),
                hooks: Default::default(),
                contract: match pre {
                    Prepared::V0_1(_) => Contract::V0_1,
                    Prepared::V0_2(_) => Contract::V0_2,
                },
                encoding: Encoding::Flat,
            },
            runtime: runtime.clone(),
            pre,
            limits: a.limits,
            tenant: a.tenant,
            config: a.config,
            pool: Mutex::new(Vec::new()),
            returned: tokio::sync::Notify::new(),
            live: Arc::new(AtomicUsize::new(0)),
            making: AtomicUsize::new(0),
            // The tenant's threads, one inline call per runtime worker and
            // the activation's own `describe`.
            max_live: a.limits.threads + workers + 1,
            workers,
            pool_max: workers.max(POOL_MAX),
            threads: Arc::new(Semaphore::new(a.limits.threads.max(1))),
            waiting: AtomicUsize::new(0),
            mode: AtomicU8::new(INLINE),
            busy_logged: Default::default(),
            fast_streak: AtomicU32::new(0),
            part: AtomicUsize::new(MAX_RECORDS_PER_CALL),
            part_streak: AtomicU32::new(0),
        };
        let (name, version, hooks, encoding) = active
            .describe()
            .and_then(|(n, v, h)| h.map(|(h, e)| (n, v, h, e)))?;
        active.info.name = name;
        active.info.version = version;
        active.info.hooks = hooks;
        active.info.encoding = encoding;
        Ok(Arc::new(active))
    }

    /// Makes the instances the runtime's workers call inline (one each), on
    /// this thread (the loader's, never a worker): after a swap the first
    /// connects, subscribes and publishes on every worker find one pooled,
    /// instead of each going to the plugin threads to make one (a Python
    /// instance takes milliseconds) while the rest wait or are refused.
    /// Called by the load that is to serve (not by an upload's check, whose
    /// instances would be dropped at once).
    pub fn premake(&self) -> Result<(), PluginError> {
        while self.pool.lock().len() < self.workers {
            let made = self.instantiate()?;
            self.pool.lock().push(made);
        }
        Ok(())
    }

    /// `describe` on a pooled instance: name, version, hooks, encoding.
    #[allow(clippy::type_complexity)]
    fn describe(
        &self,
    ) -> Result<
        (
            String,
            String,
            Result<(DeclaredHooks, Encoding), PluginError>,
        ),
        PluginError,
    > {
        self.call(|store, p| match p {
            Bound::V0_2(p) => {
                let i = p.herald_plugin_guest().call_describe(store)?;
                Ok((i.name, i.version, DeclaredHooks::from_v2(i.hooks)))
            }
            Bound::V0_1(p) => {
                let i = p.herald_plugin_guest().call_describe(store)?;
                let hooks = DeclaredHooks::from_v1(i.hooks);
                Ok((i.name, i.version, Ok((hooks, Encoding::Flat))))
            }
        })
    }

    /// Whether this load runs with `config` (the tenant's, as JSON text)
    /// and `limits`: a load made with others is stale and is loaded again.
    pub fn loaded_with(&self, config: &str, limits: SandboxLimits) -> bool {
        *self.config == *config && self.limits == limits
    }

    /// Instances of this version in existence (pooled or in a call).
    pub fn live_instances(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// At least one instance per runtime worker exists or is being made:
    /// one that is not pooled is in a call, or in the making, and comes to
    /// the pool when that ends.
    fn instances_busy(&self) -> bool {
        self.live_instances() + self.making.load(Ordering::Acquire) >= self.workers
    }

    fn instantiate(&self) -> Result<Loaded, PluginError> {
        let taken = self
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_live).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(PluginError::Busy(self.waiting.load(Ordering::Acquire)));
        }
        let live = Live(self.live.clone());
        let mut store = self.runtime.store(&self.tenant, &self.config, self.limits);
        let _ticking = self.runtime.guest_running();
        store.set_epoch_deadline(deadline_ticks(self.limits));
        let made = match &self.pre {
            Prepared::V0_2(pre) => pre.instantiate(&mut store).map(Bound::V0_2),
            Prepared::V0_1(pre) => pre.instantiate(&mut store).map(Bound::V0_1),
        };
        // Each instance answers `describe` once before it serves: a fresh
        // instance's first call faults in its memory and runs a guest's lazy
        // setup (a Python or JavaScript instance's first call took 1.0-1.6
        // ms here, its later ones 25-250 µs), which a worker's 2 ms budget
        // should not have to carry, nor the judge of a cut call measure.
        let made = made.and_then(|plugin| {
            match &plugin {
                Bound::V0_2(p) => p.herald_plugin_guest().call_describe(&mut store).map(drop),
                Bound::V0_1(p) => p.herald_plugin_guest().call_describe(&mut store).map(drop),
            }?;
            Ok(plugin)
        });
        match made {
            Ok(plugin) => Ok(Loaded {
                store,
                plugin,
                _live: live,
            }),
            Err(e) if super::sandbox_count(&e) => Err(PluginError::Instantiate(format!(
                "{:#}: one instance may have at most {} core instances, {} linear memories and {} tables",
                e.root_cause(),
                super::MAX_CORE_INSTANCES,
                super::MAX_MEMORIES,
                super::MAX_TABLES
            ))),
            Err(e) => Err(match classify(e, store.data(), self.limits) {
                PluginError::Trap(m, out) => PluginError::Instantiate(format!("{m}{out}")),
                e @ PluginError::Timeout(..) => {
                    self.demote(BLOCKING, "slow_start");
                    e
                }
                other => other,
            }),
        }
    }

    /// Runs one call on a pooled instance under a fresh deadline (the
    /// inline budget when it runs on a runtime worker, see [`Self::run`]).
    fn call<R>(
        &self,
        f: impl FnOnce(&mut Store<StoreState>, &Bound) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let pooled = self.pool.lock().pop();
        let inline = INLINE_CALL.get();
        let mut inst = match pooled {
            Some(i) => i,
            // A start function may run up to the whole deadline: instances
            // are made on the tenant's plugin threads, never on a worker.
            None if inline => return Err(PluginError::Cold),
            None => self.instantiate()?,
        };
        let full = deadline_ticks(self.limits);
        let ticks = if inline {
            full.min(inline_ticks())
        } else {
            full
        };
        let ticking = self.runtime.guest_running();
        inst.store.set_epoch_deadline(ticks);
        let state = inst.store.data_mut();
        state.log_budget = LOGS_PER_CALL;
        state.output.clear();
        // What the limiter saw belongs to the call that saw it: a guest
        // that survived a refused growth must not make a later trap look
        // like a memory failure.
        state.limiter.hit = false;
        // Off the workers, the CPU time the guest took is kept: what judges
        // a call cut at the budget, and brings a slow version back (a
        // syscall each way, beside a thread hop of ~30 µs).
        let cpu = (!inline).then(thread_cpu);
        let result = f(&mut inst.store, &inst.plugin);
        drop(ticking);
        if let Some(before) = cpu {
            let took = thread_cpu().saturating_sub(before);
            CALLS_TOOK.set(Some(CALLS_TOOK.get().unwrap_or_default() + took));
        }
        if KEEP_OUTPUT.get() {
            let text = inst.store.data().output.text();
            LAST_OUTPUT.with_borrow_mut(|o| {
                if !text.is_empty() {
                    if !o.is_empty() {
                        o.push('\n');
                    }
                    o.push_str(&text);
                }
            });
        }
        match result {
            Ok(v) => {
                // Garbage-collected guests never give memory back: recycle an
                // instance past three quarters of its cap.
                let st = inst.store.data();
                if st.limiter.total <= self.limits.memory_bytes / 4 * 3 {
                    let mut pool = self.pool.lock();
                    if pool.len() < self.pool_max {
                        pool.push(inst);
                        drop(pool);
                        self.returned.notify_one();
                    }
                }
                Ok(v)
            }
            Err(e) => Err(match classify(e, inst.store.data(), self.limits) {
                PluginError::Timeout(..) if inline => PluginError::OverBudget,
                other => other,
            }),
        }
    }

    /// `authorize-connect`; a failure of the plugin itself is an error, a
    /// refusal is `Ok(Err(denial))`. A session that breaks the WIT's rules
    /// fails the call (`bad_output`): refused, never admitted.
    pub fn authorize_connect(
        &self,
        req: &ConnectRequest,
    ) -> Result<Result<Grant, Denial>, PluginError> {
        let r = self.call(|s, p| match p {
            Bound::V0_2(p) => p.herald_plugin_guest().call_authorize_connect(s, req),
            Bound::V0_1(p) => p
                .herald_plugin_guest()
                .call_authorize_connect(s, &from_v1::request(req))
                .map(|r| r.map(from_v1::session).map_err(from_v1::denial)),
        })?;
        match r {
            Ok(session) => check_session(&session).map(|()| Ok(session)),
            Err(d) => Ok(Err(cut_denial(d))),
        }
    }

    pub fn authorize_subscribe(
        &self,
        session: &Grant,
        channel: &str,
    ) -> Result<Result<(), Denial>, PluginError> {
        // A hook the plugin does not declare is never called (its export is
        // a stub that traps): every subscription is allowed.
        if !self.info.hooks.authorize_subscribe {
            return Ok(Ok(()));
        }
        let r = self.call(|s, p| match p {
            Bound::V0_2(p) => p
                .herald_plugin_guest()
                .call_authorize_subscribe(s, session, channel),
            Bound::V0_1(p) => p
                .herald_plugin_guest()
                .call_authorize_subscribe(s, &from_v1::session_in(session), channel)
                .map(|r| r.map_err(from_v1::denial)),
        })?;
        Ok(r.map_err(cut_denial))
    }

    pub async fn authorize_connect_async(
        self: Arc<Self>,
        req: ConnectRequest,
    ) -> Result<Result<Grant, Denial>, PluginError> {
        self.run(Patience::Bounded, move |p| p.authorize_connect(&req))
            .await
    }

    pub async fn authorize_subscribe_async(
        self: Arc<Self>,
        session: Arc<Grant>,
        channel: String,
    ) -> Result<Result<(), Denial>, PluginError> {
        self.run(Patience::Bounded, move |p| {
            p.authorize_subscribe(&session, &channel)
        })
        .await
    }

    pub fn merge(
        &self,
        key: &str,
        older: &[u8],
        newer: &[u8],
        max_payload: usize,
    ) -> Result<Vec<u8>, PluginError> {
        let out = self.call(|s, p| match p {
            Bound::V0_2(p) => p.herald_plugin_guest().call_merge(s, key, older, newer),
            Bound::V0_1(p) => p.herald_plugin_guest().call_merge(s, key, older, newer),
        })?;
        if out.len() > max_payload {
            return Err(PluginError::BadOutput(format!(
                "merge returned {} bytes, over {max_payload}",
                out.len()
            )));
        }
        Ok(out)
    }
}

/// The runtime's worker threads, each of which may be in one inline call at
/// a time: the runtime's count when called on it (`--worker-threads` may
/// exceed the cores), never fewer than the cores.
fn runtime_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::runtime::Handle::try_current().map_or(cores, |h| h.metrics().num_workers().max(cores))
}

/// The inline budget in epoch ticks (a deadline of n ticks fires between
/// n - 1 and n ticks from now).
fn inline_ticks() -> u64 {
    (INLINE_BUDGET.as_millis() as u64 / EPOCH_TICK.as_millis() as u64).max(1) + 1
}
