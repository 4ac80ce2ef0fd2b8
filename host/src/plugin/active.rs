//! An activated plugin version: its linked component and a small pool of
//! long-lived instances that calls borrow.
//!
//! Owns: calling hooks under the sandbox. Invariants: one call per instance
//! at a time; an instance that failed (trap, timeout, memory) is dropped,
//! never returned to the pool; an instance whose memory passed the high-water
//! mark is recycled after its call; a hot swap replaces the whole
//! `ActivePlugin`, so calls in flight finish on the version they started on.

use super::batch::{self, SourceRecord, Transformed};
use super::{
    classify, deadline_ticks, ConnectRequest, Denial, Plugin, PluginError, PluginInfo, PluginPre,
    Runtime, SandboxLimits, Session, StoreState, LOGS_PER_CALL,
};
use parking_lot::Mutex;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use wasmtime::Store;

/// Instances kept idle per version; more are made under load and dropped after.
const POOL_MAX: usize = 4;

struct Loaded {
    store: Store<StoreState>,
    plugin: Plugin,
}

pub struct ActivePlugin {
    pub version: i64,
    pub sha256: String,
    pub info: PluginInfo,
    runtime: Arc<Runtime>,
    pre: PluginPre<StoreState>,
    limits: SandboxLimits,
    tenant: Arc<str>,
    config: Arc<str>,
    pool: Mutex<Vec<Loaded>>,
    /// Set once the plugin timed out or did blocking WASI I/O: its calls
    /// then run on blocking threads (see [`ActivePlugin::run`]).
    offload: AtomicBool,
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
        let mut active = ActivePlugin {
            version: a.version,
            sha256: a.sha256,
            info: PluginInfo {
                name: String::new(),
                version: String::new(),
                hooks: Default::default(),
            },
            runtime: runtime.clone(),
            pre,
            limits: a.limits,
            tenant: a.tenant,
            config: a.config,
            pool: Mutex::new(Vec::new()),
            offload: AtomicBool::new(false),
        };
        let info = active.call(|store, p| p.herald_plugin_guest().call_describe(store))?;
        active.info = PluginInfo {
            name: info.name,
            version: info.version,
            hooks: info.hooks.into(),
        };
        Ok(Arc::new(active))
    }

    fn instantiate(&self) -> Result<Loaded, PluginError> {
        let mut store = self.runtime.store(&self.tenant, &self.config, self.limits);
        store.set_epoch_deadline(deadline_ticks(self.limits));
        match self.pre.instantiate(&mut store) {
            Ok(plugin) => Ok(Loaded { store, plugin }),
            Err(e) => Err(match classify(e, store.data(), self.limits) {
                PluginError::Trap(m) => PluginError::Instantiate(m),
                other => other,
            }),
        }
    }

    /// Runs one call on a pooled instance under a fresh deadline.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut Store<StoreState>, &Plugin) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let pooled = self.pool.lock().pop();
        let mut inst = match pooled {
            Some(i) => i,
            None => self.instantiate()?,
        };
        inst.store.set_epoch_deadline(deadline_ticks(self.limits));
        inst.store.data_mut().log_budget = LOGS_PER_CALL;
        match f(&mut inst.store, &inst.plugin) {
            Ok(v) => {
                // Garbage-collected guests never give memory back: recycle an
                // instance past three quarters of its cap.
                let st = inst.store.data();
                if st.limiter.peak <= self.limits.memory_bytes / 4 * 3 {
                    let mut pool = self.pool.lock();
                    if pool.len() < POOL_MAX {
                        pool.push(inst);
                    }
                }
                Ok(v)
            }
            Err(e) => Err(classify(e, inst.store.data(), self.limits)),
        }
    }

    /// `authorize-connect`; a failure of the plugin itself is an error, a
    /// refusal is `Ok(Err(denial))`.
    pub fn authorize_connect(
        &self,
        req: &ConnectRequest,
    ) -> Result<Result<Session, Denial>, PluginError> {
        self.call(|s, p| p.herald_plugin_guest().call_authorize_connect(s, req))
    }

    pub fn authorize_subscribe(
        &self,
        session: &Session,
        channel: &str,
    ) -> Result<Result<(), Denial>, PluginError> {
        self.call(|s, p| {
            p.herald_plugin_guest()
                .call_authorize_subscribe(s, session, channel)
        })
    }

    /// One call for the whole batch; the output is checked against the
    /// contract. An output of broken structure fails the call; records whose
    /// outputs break it otherwise come back refused, beside the rest.
    pub fn transform(
        &self,
        records: &[SourceRecord<'_>],
        max_payload: usize,
    ) -> Result<Transformed, PluginError> {
        let (data, meta) = batch::encode_records(records);
        let b = super::herald::plugin::types::RecordBatch { data, meta };
        let out = self.call(|s, p| p.herald_plugin_guest().call_transform(s, &b))?;
        batch::decode_outgoing(out.data, &out.meta, records.len(), max_payload)
            .map_err(|e| PluginError::BadOutput(e.to_string()))
    }

    /// Runs plugin work `f` for async code. Fast path: right here, on the
    /// runtime thread (a jwt-auth call is ~7 µs; a hop to a blocking thread
    /// costs ~30 µs more). A plugin that once timed out, or that does
    /// blocking WASI I/O (a guest printing, e.g. its own panic message:
    /// WASI's synchronous streams block on a runtime of their own, which
    /// panics on a runtime thread), is marked and from then on runs on a
    /// blocking thread, so it can never stall the runtime again; the call
    /// that found out is retried there.
    pub async fn run<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl Fn(&ActivePlugin) -> Result<R, PluginError> + Send + 'static,
    ) -> Result<R, PluginError> {
        if !self.offload.load(Ordering::Relaxed) {
            match std::panic::catch_unwind(AssertUnwindSafe(|| f(self))) {
                Ok(Err(PluginError::Timeout(ms))) => {
                    self.mark_offload("timed out");
                    return Err(PluginError::Timeout(ms));
                }
                Ok(r) => return r,
                Err(_) => self.mark_offload("used blocking WASI I/O"),
            }
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .unwrap_or_else(|e| Err(PluginError::Trap(format!("plugin thread failed: {e}"))))
    }

    /// Runs `f` on a blocking thread, always.
    pub async fn off_runtime<R: Send + 'static>(
        f: impl FnOnce() -> Result<R, PluginError> + Send + 'static,
    ) -> Result<R, PluginError> {
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(PluginError::Trap(format!("plugin thread failed: {e}"))))
    }

    fn mark_offload(&self, why: &str) {
        if !self.offload.swap(true, Ordering::Relaxed) {
            tracing::warn!(tenant = %self.tenant, version = self.version, why, "plugin moves to blocking threads for its remaining calls");
        }
    }

    pub async fn authorize_connect_async(
        self: Arc<Self>,
        req: ConnectRequest,
    ) -> Result<Result<Session, Denial>, PluginError> {
        self.run(move |p| p.authorize_connect(&req)).await
    }

    pub async fn authorize_subscribe_async(
        self: Arc<Self>,
        session: Arc<Session>,
        channel: String,
    ) -> Result<Result<(), Denial>, PluginError> {
        self.run(move |p| p.authorize_subscribe(&session, &channel))
            .await
    }

    pub fn merge(
        &self,
        key: &str,
        older: &[u8],
        newer: &[u8],
        max_payload: usize,
    ) -> Result<Vec<u8>, PluginError> {
        let out = self.call(|s, p| p.herald_plugin_guest().call_merge(s, key, older, newer))?;
        if out.len() > max_payload {
            return Err(PluginError::BadOutput(format!(
                "merge returned {} bytes, over {max_payload}",
                out.len()
            )));
        }
        Ok(out)
    }
}
