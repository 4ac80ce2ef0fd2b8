//! The sandbox: the one `Engine` and `Linker` of the process, compiling
//! components (cached by sha256, on disk through `artifacts`), each
//! instance's store (deny-by-default WASI, the memory and table limiter, the
//! log budget), deadlines in epoch ticks, and what a failed call was.

use crate::contract::{v1, v2, Compiled, Level, Prepared};
use crate::limits::Limiter;
use crate::{artifacts, logs, wasi, GuestOutput, PluginError, SandboxLimits};
use crate::{MEMORY_GUARD, MEMORY_RESERVATION};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// How often the epoch advances; call deadlines are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// What each instance's store holds.
pub struct StoreState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: Limiter,
    pub(crate) tenant: Arc<str>,
    pub(crate) config: Arc<str>,
    /// Log lines the plugin may still write during the current call.
    pub(crate) log_budget: u32,
    /// The tenant's share of the log, across its instances.
    pub(crate) log_rate: Arc<logs::LogRate>,
    /// What the guest wrote to stdout and stderr during the current call.
    pub(crate) output: wasi::Capture,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

pub(crate) const LOGS_PER_CALL: u32 = logs::PER_CALL;

impl StoreState {
    pub(crate) fn log(&mut self, level: Level, message: String) {
        logs::write(
            &self.tenant,
            &self.log_rate,
            &mut self.log_budget,
            level,
            &message,
        );
    }
}

/// Where [`Runtime::compile_from`] found a compiled component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompiledFrom {
    /// Compiled before by this runtime (or by a caller it waited for).
    Memory,
    /// Loaded from the artifact directory.
    Disk,
    /// Compiled by this call.
    Compiled,
}

/// The process's engine, linker and compiled-component cache.
pub struct Runtime {
    engine: Engine,
    linker: Linker<StoreState>,
    /// One cell per sha256: a second caller of the same bytes waits for the
    /// first one's compilation instead of compiling them again. Entries no
    /// tenant runs or may roll back to are evicted ([`Runtime::retain`]).
    cache: Mutex<HashMap<[u8; 32], Arc<Compiled>>>,
    /// Where compiled components are kept across restarts (`None`: not).
    artifacts: Option<artifacts::Cache>,
    /// Each tenant's share of the log (plugin log lines a second).
    log_rates: Mutex<HashMap<Arc<str>, Arc<logs::LogRate>>>,
    clock: EpochClock,
}

/// The epoch clock: a thread that advances the engine's epoch every
/// [`EPOCH_TICK`] while guest code may run, and sleeps once no guest has
/// run for [`EpochClock::IDLE_TICKS`] ticks (a node without plugin work
/// does not wake a thousand times a second). Stops once the engine is gone.
///
/// Invariant: while a guest runs (a [`GuestRunning`] is held) the clock
/// ticks, so every deadline is kept to within a tick: the holder counts
/// itself in before it wakes the clock, and the clock counts the holders
/// before it sleeps (a wake between the two makes its sleep return at once).
pub(crate) struct EpochClock {
    counts: Arc<ClockCounts>,
    thread: std::thread::Thread,
}

/// What the clock's thread and the guests' entries share.
struct ClockCounts {
    /// Guests running (instantiations and calls).
    running: AtomicUsize,
    /// Ticks so far: what tests read.
    ticks: AtomicU64,
}

impl EpochClock {
    /// Ticks with no guest running before the clock sleeps.
    pub(crate) const IDLE_TICKS: u32 = 100;
    /// A sleeping clock still looks whether its engine is gone this often.
    const SLEEP_CHECK: Duration = Duration::from_secs(1);

    fn start(engine: &Engine) -> anyhow::Result<EpochClock> {
        let weak = engine.weak();
        let counts = Arc::new(ClockCounts {
            running: AtomicUsize::new(0),
            ticks: AtomicU64::new(0),
        });
        let seen = counts.clone();
        let handle = std::thread::Builder::new()
            .name("herald-epoch".into())
            .spawn(move || {
                let mut idle = 0;
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => return,
                    }
                    seen.ticks.fetch_add(1, Ordering::Relaxed);
                    if seen.running.load(Ordering::SeqCst) > 0 {
                        idle = 0;
                        continue;
                    }
                    idle += 1;
                    if idle >= EpochClock::IDLE_TICKS {
                        // Returns at once when a guest started since the
                        // last sleep (its wake is kept).
                        std::thread::park_timeout(EpochClock::SLEEP_CHECK);
                        idle = 0;
                    }
                }
            })?;
        Ok(EpochClock {
            counts,
            thread: handle.thread().clone(),
        })
    }

    fn enter(&self) -> GuestRunning {
        self.counts.running.fetch_add(1, Ordering::SeqCst);
        // An atomic swap when the clock is awake; a wake-up when it sleeps.
        self.thread.unpark();
        GuestRunning(self.counts.clone())
    }
}

/// Held while guest code may run: keeps the epoch clock ticking.
pub(crate) struct GuestRunning(Arc<ClockCounts>);

impl Drop for GuestRunning {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    herald_base::secret::hex(&Sha256::digest(bytes))
}

impl Runtime {
    /// A runtime that keeps compiled components in memory only.
    pub fn new() -> anyhow::Result<Arc<Runtime>> {
        Runtime::with_artifacts(None)
    }

    /// A runtime that also keeps compiled components in `dir`, by sha256,
    /// so a restart loads them instead of compiling again.
    pub fn with_artifacts(dir: Option<std::path::PathBuf>) -> anyhow::Result<Arc<Runtime>> {
        let artifacts = dir.map(artifacts::Cache::open).transpose()?;
        let mut cfg = wasmtime::Config::new();
        cfg.wasm_component_model(true);
        cfg.epoch_interruption(true);
        cfg.concurrency_support(false);
        // Bounds checks elided by guard pages (explicit checks cost plugins
        // 1.2-1.8x); with [`MAX_MEMORIES`] per instance and at most
        // `plugin_threads + cores + 1` live instances per tenant, the
        // address space one tenant can reserve is bounded (ARCHITECTURE.md,
        // "Plugins").
        cfg.memory_reservation(MEMORY_RESERVATION);
        cfg.memory_guard_size(MEMORY_GUARD);
        let engine = Engine::new(&cfg)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        wasi::add_sync_io(&mut linker, |s: &mut StoreState| wasi::SyncIo(&mut s.table))?;
        wasi::deny_sockets(&mut linker, |s: &mut StoreState| {
            wasi::NoSockets(&mut s.table)
        })?;
        v2::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        v1::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        let clock = EpochClock::start(&engine)?;
        Ok(Arc::new(Runtime {
            engine,
            linker,
            clock,
            cache: Mutex::new(HashMap::new()),
            artifacts,
            log_rates: Mutex::new(HashMap::new()),
        }))
    }

    /// Keeps the epoch clock ticking until dropped: held around every
    /// entry into guest code, before its deadline is set.
    pub(crate) fn guest_running(&self) -> GuestRunning {
        self.clock.enter()
    }

    /// Epoch ticks since the runtime started.
    pub fn epoch_ticks(&self) -> u64 {
        self.clock.counts.ticks.load(Ordering::Relaxed)
    }

    /// Whether the component with this sha256 (hex) is compiled in memory.
    pub fn is_compiled(&self, sha256: &str) -> bool {
        self.cache.lock().iter().any(|(d, c)| {
            c.get().is_some_and(Result::is_ok) && herald_base::secret::hex(d) == sha256
        })
    }

    /// The compiled component with this sha256 (hex), from memory or from
    /// the artifact directory, without its bytes: a load of a version this
    /// node compiled before (its upload, an earlier activation) neither
    /// reads nor hashes the component again. `None`: compile it from its
    /// bytes ([`Runtime::compile`]). CPU and disk work: a blocking thread.
    pub fn compiled(&self, sha256: &str) -> Option<Component> {
        let digest = herald_base::secret::digest_from_hex(sha256)?;
        let cell = self.cache.lock().get(&digest).cloned();
        if let Some(Ok(c)) = cell.as_ref().and_then(|c| c.get()) {
            return Some(c.clone());
        }
        let c = self.artifacts.as_ref()?.load(&self.engine, &digest)?;
        metrics::counter!("herald_plugin_compiles_total", "from" => "disk").increment(1);
        let cell = self.cache.lock().entry(digest).or_default().clone();
        Some(cell.get_or_init(|| Ok(c)).as_ref().ok()?.clone())
    }

    /// Forgets compiled components whose sha256 (hex) is not in `keep`;
    /// one being compiled stays. Returns how many are left.
    pub fn retain(&self, keep: &std::collections::HashSet<String>) -> usize {
        let mut cache = self.cache.lock();
        cache.retain(|digest, cell| {
            cell.get().is_none() || keep.contains(&herald_base::secret::hex(digest))
        });
        metrics::gauge!("herald_plugin_compiled_versions").set(cache.len() as f64);
        cache.len()
    }

    /// Compiles a component (CPU-heavy: call from a blocking thread), or
    /// returns the cached one with the same sha256 — waiting for it when
    /// another thread is compiling the same bytes (an upload announced to
    /// every node, then its activation). A failure is not kept.
    pub fn compile(&self, bytes: &[u8]) -> Result<Component, PluginError> {
        self.compile_from(bytes).map(|(c, _)| c)
    }

    /// [`Runtime::compile`], saying where the compiled component came from.
    pub fn compile_from(&self, bytes: &[u8]) -> Result<(Component, CompiledFrom), PluginError> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let cell = self.cache.lock().entry(digest).or_default().clone();
        let mut from = CompiledFrom::Memory;
        let compiled = cell.get_or_init(|| {
            if let Some(c) = self.artifacts.as_ref().and_then(|a| a.load(&self.engine, &digest)) {
                metrics::counter!("herald_plugin_compiles_total", "from" => "disk").increment(1);
                from = CompiledFrom::Disk;
                return Ok(c);
            }
            from = CompiledFrom::Compiled;
            let started = std::time::Instant::now();
            let c = Component::new(&self.engine, bytes).map_err(|e| format!("{e:#}"))?;
            metrics::counter!("herald_plugin_compiles_total", "from" => "compile").increment(1);
            tracing::info!(sha256 = %herald_base::secret::hex(&digest), bytes = bytes.len(), ms = started.elapsed().as_millis() as u64, "plugin component compiled");
            if let Some(a) = &self.artifacts {
                a.store(&digest, &c);
            }
            Ok(c)
        });
        match compiled {
            Ok(c) => Ok((c.clone(), from)),
            Err(e) => {
                let mut cache = self.cache.lock();
                if cache.get(&digest).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    cache.remove(&digest);
                }
                Err(PluginError::Compile(e.clone()))
            }
        }
    }

    pub(crate) fn store(
        &self,
        tenant: &Arc<str>,
        config: &Arc<str>,
        limits: SandboxLimits,
    ) -> Store<StoreState> {
        let output = wasi::Capture::default();
        let mut ctx = WasiCtx::builder();
        ctx.allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .stdout(output.clone())
            .stderr(output.clone())
            .wall_clock(wasi::Frozen)
            .monotonic_clock(wasi::Frozen)
            .secure_random(wasi::Fixed::default())
            .insecure_random(wasi::Fixed::default())
            .insecure_random_seed(0x6865_7261_6c64);
        let state = StoreState {
            wasi: ctx.build(),
            table: ResourceTable::new(),
            limiter: Limiter::new(limits.memory_bytes),
            tenant: tenant.clone(),
            config: config.clone(),
            log_budget: LOGS_PER_CALL,
            log_rate: self
                .log_rates
                .lock()
                .entry(tenant.clone())
                .or_insert_with(|| Arc::new(logs::LogRate::new()))
                .clone(),
            output,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store
    }

    /// Links a compiled component once, against the contract it exports
    /// (0.2.0, else 0.1.0); instances are made from the result.
    pub fn prepare(&self, component: &Component) -> Result<Prepared, PluginError> {
        let pre = self
            .linker
            .instantiate_pre(component)
            .map_err(|e| PluginError::Instantiate(format!("{e:#}")))?;
        match v2::PluginPre::new(pre.clone()) {
            Ok(p) => Ok(Prepared::V0_2(p)),
            Err(e2) => match v1::PluginPre::new(pre) {
                Ok(p) => Ok(Prepared::V0_1(p)),
                Err(_) => Err(PluginError::Instantiate(format!(
                    "the component exports neither herald:plugin/guest@0.2.0 nor @0.1.0: {e2:#}"
                ))),
            },
        }
    }
}

pub(crate) fn deadline_ticks(limits: SandboxLimits) -> u64 {
    (limits.deadline.as_millis() as u64 / EPOCH_TICK.as_millis() as u64).max(1) + 1
}

/// Whether an instantiation failed on the sandbox's count of core
/// instances, memories or tables (wasmtime's `ResourceLimiter` counts).
pub(crate) fn sandbox_count(e: &wasmtime::Error) -> bool {
    e.chain().any(|c| {
        c.to_string().starts_with("resource limit exceeded: ")
            && c.to_string().contains(" count too high")
    })
}

/// Turns a wasmtime error into the named failure, looking at what the
/// sandbox recorded.
pub(crate) fn classify(
    e: wasmtime::Error,
    state: &StoreState,
    limits: SandboxLimits,
) -> PluginError {
    let output = GuestOutput(state.output.text());
    if state.limiter.hit {
        return PluginError::MemoryExceeded(limits.memory_bytes, output);
    }
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return PluginError::Timeout(limits.deadline.as_millis() as u64, output);
    }
    PluginError::Trap(trap_message(&e), output)
}

/// What trapped, and where: "wasm trap: wasm `unreachable` instruction
/// executed (in `rust_panic`)", not the first line of the backtrace.
pub(crate) fn trap_message(e: &wasmtime::Error) -> String {
    let what = match e.downcast_ref::<wasmtime::Trap>() {
        Some(t) => t.to_string(),
        None => e.root_cause().to_string(),
    };
    let mut m: String = what
        .lines()
        .next()
        .unwrap_or("trap")
        .chars()
        .take(300)
        .collect();
    let frame = e.downcast_ref::<wasmtime::WasmBacktrace>().and_then(|bt| {
        bt.frames()
            .iter()
            .find_map(|f| f.func_name().map(str::to_string))
    });
    if let Some(f) = frame {
        m.push_str(&format!(
            " (in `{}`)",
            f.chars().take(120).collect::<String>()
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn a_logged_error_leaves_out_what_the_guest_wrote() {
        let e = PluginError::Trap(
            "unreachable".into(),
            GuestOutput("Traceback\n2026 ERROR forged".into()),
        );
        assert!(e.to_string().contains("Traceback"), "the answer keeps it");
        let logged = e.for_log();
        assert!(
            !logged.contains("Traceback") && !logged.contains('\n'),
            "{logged}"
        );
        assert!(logged.contains("wrote 27 bytes"), "{logged}");
    }

    /// An idle node's clock sleeps (it ticked a thousand times a second
    /// with no plugin work at all); a guest that starts wakes it, and it
    /// ticks for as long as one runs, however long since the last.
    #[test]
    fn the_epoch_clock_ticks_only_while_guests_may_run() {
        let rt = Runtime::new().unwrap();
        let tick_ms = EPOCH_TICK.as_millis() as u64;
        let idle = u64::from(EpochClock::IDLE_TICKS) * tick_ms;
        std::thread::sleep(Duration::from_millis(idle * 2 + 100));
        let a = rt.epoch_ticks();
        std::thread::sleep(Duration::from_millis(300));
        let slept = rt.epoch_ticks() - a;
        assert!(slept <= 2, "{slept} ticks in 300 ms with no guest");

        let running = rt.guest_running();
        // Longer than the idle bound: a call that runs on keeps it awake.
        std::thread::sleep(Duration::from_millis(idle * 3));
        let ran = rt.epoch_ticks() - a - slept;
        assert!(
            ran >= idle * 3 / tick_ms / 2,
            "{ran} ticks in {} ms of a running guest",
            idle * 3
        );
        drop(running);
    }

    #[test]
    fn every_memory_counts_against_one_cap() {
        let mut l = Limiter::new(10 << 20);
        // Two memories of 6 MiB each: the second does not fit beside the first.
        assert!(l.memory_growing(0, 6 << 20, None).unwrap());
        assert!(!l.memory_growing(0, 6 << 20, None).unwrap());
        assert!(l.hit);
        // Growing one memory counts only what it adds.
        l.hit = false;
        assert!(l.memory_growing(6 << 20, 9 << 20, None).unwrap());
        assert_eq!(l.total, 9 << 20);
        assert!(!l.memory_growing(9 << 20, (10 << 20) + 1, None).unwrap());
    }
}
