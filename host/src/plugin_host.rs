//! The plugin host: the node's plugin runtime and what it does with stored
//! versions — compiling and loading them for a tenant (on a blocking
//! thread, under the tenant's config and sandbox limits), the loads the
//! start defers until the server listens, background uploads and their
//! state, and evicting compiled components nobody runs.
//!
//! Invariants: a version is loaded with the settings the tenant has when
//! the load starts, and `Activation` records them (a reconcile that changes
//! them reloads: `ActivePlugin::loaded_with`); compiling never runs on a
//! runtime worker.

use crate::clock::now_ms;
use crate::plugin::active::{Activation, ActivePlugin};
use crate::plugin::{PluginError, Runtime};
use crate::registry::{Registry, RegistryError};
use crate::tenant::{Tenant, Tenants};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The node's plugin runtime and its loads.
pub struct PluginHost {
    pub runtime: Arc<Runtime>,
    /// Background uploads and how they ended.
    pub uploads: Uploads,
    /// The start's first reconcile is running: a tenant's plugin is not
    /// loaded in line but queued in `deferred`, so the server listens at
    /// once (`load_deferred` loads them in the background).
    pub starting: AtomicBool,
    pub deferred: Mutex<Vec<(Arc<Tenant>, i64)>>,
    /// `load_deferred` is running (the server listens, not yet ready).
    loading: AtomicBool,
    /// Loads an activation made and its reconcile takes (`stage`).
    staged: Mutex<Vec<(String, Arc<ActivePlugin>)>>,
}

/// Why a stored plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Plugin(PluginError),
}

impl PluginHost {
    pub fn new(runtime: Arc<Runtime>) -> PluginHost {
        PluginHost {
            runtime,
            uploads: Uploads::default(),
            starting: AtomicBool::new(false),
            deferred: Mutex::default(),
            loading: AtomicBool::new(false),
            staged: Mutex::default(),
        }
    }

    /// Whether the start's deferred loads are running.
    pub fn loading(&self) -> bool {
        self.loading.load(Ordering::Acquire)
    }

    /// Loads one stored plugin version for a tenant, under the tenant's
    /// current config and sandbox limits: the load an activation staged for
    /// it if there is one, else from the compiled component (in memory or
    /// on disk, found by the registry's sha256, so the component is neither
    /// read nor hashed again), else compiled from the stored bytes. The CPU
    /// work runs on blocking threads.
    pub async fn load(
        &self,
        registry: &Registry,
        tenant: &Tenant,
        version: i64,
    ) -> Result<Arc<ActivePlugin>, LoadError> {
        let settings = tenant.settings();
        let (config, limits) = (settings.config.to_string(), settings.limits.sandbox());
        drop(settings);
        if let Some(p) = self.take_staged(&tenant.id, version, &config, limits) {
            return Ok(p);
        }
        let sha256 = registry.plugin_sha256(&tenant.id, version).await?;
        let runtime = self.runtime.clone();
        let sha = sha256.clone();
        let compiled = blocking(move || Ok(runtime.compiled(&sha))).await?;
        let bytes = match compiled {
            Some(_) => None,
            None => Some(registry.plugin_component(&tenant.id, version).await?),
        };
        let activation = Activation {
            version,
            sha256,
            tenant: tenant.id.clone(),
            config: config.into(),
            limits,
        };
        let runtime = self.runtime.clone();
        blocking(move || {
            let component = match (compiled, bytes) {
                (Some(c), _) => c,
                (None, bytes) => {
                    let bytes = bytes.unwrap_or_default();
                    if crate::plugin::sha256_hex(&bytes) != activation.sha256 {
                        return Err(PluginError::Compile(format!(
                            "the stored component of version {version} does not match its sha256 {}",
                            activation.sha256
                        )));
                    }
                    runtime.compile(&bytes)?
                }
            };
            let loaded = ActivePlugin::load(&runtime, &component, activation)?;
            loaded.premake()?;
            Ok(loaded)
        })
        .await
    }

    /// Keeps a load an activation made to check the version, for the
    /// reconcile that applies the activation right after: one load per
    /// activation, not two.
    pub fn stage(&self, tenant: &str, loaded: Arc<ActivePlugin>) {
        let mut staged = self.staged.lock();
        staged.retain(|(t, _)| t != tenant);
        staged.push((tenant.to_string(), loaded));
    }

    /// Drops what `stage` kept for `tenant` and nobody took.
    pub fn unstage(&self, tenant: &str) {
        self.staged.lock().retain(|(t, _)| t != tenant);
    }

    /// The staged load of `tenant`'s `version`, if it was made with this
    /// config and these limits (else it is dropped: a change landed since).
    fn take_staged(
        &self,
        tenant: &str,
        version: i64,
        config: &str,
        limits: crate::plugin::SandboxLimits,
    ) -> Option<Arc<ActivePlugin>> {
        let mut staged = self.staged.lock();
        let at = staged.iter().position(|(t, _)| t == tenant)?;
        let (_, p) = staged.swap_remove(at);
        (p.version == version && p.loaded_with(config, limits)).then_some(p)
    }

    /// Drops compiled components that no tenant runs or may roll back to
    /// (an upload that was never activated, a version two swaps back): a
    /// compiled Python component holds 35-94 MiB. The disk keeps them, so
    /// activating one again loads it in milliseconds.
    pub fn evict_compiled(&self, tenants: &Tenants) -> usize {
        let keep: std::collections::HashSet<String> =
            tenants.all().iter().flat_map(|t| t.plugin_shas()).collect();
        self.runtime.retain(&keep)
    }

    /// Loads the plugins the start's reconcile deferred, a few at a time (one
    /// per core: compiling is CPU work), each tenant activated as its load
    /// finishes. A load that fails leaves the tenant `plugin_unavailable`, and
    /// later reconcile passes try again. Dropped (a stop during the loads), the
    /// loads still running are abandoned with their tasks.
    pub async fn load_deferred(self: &Arc<Self>, registry: &Registry, tenants: &Tenants) {
        let loads = std::mem::take(&mut *self.deferred.lock());
        if loads.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        self.loading.store(true, Ordering::Release);
        let parallel = std::thread::available_parallelism().map_or(2, |n| n.get());
        let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
        let mut tasks = tokio::task::JoinSet::new();
        for (tenant, version) in loads {
            let (host, gate, registry) = (self.clone(), gate.clone(), registry.clone());
            tasks.spawn(async move {
                let _turn = gate.acquire_owned().await;
                let t0 = std::time::Instant::now();
                let loaded = host.load(&registry, &tenant, version).await;
                match loaded {
                    // Unless the registry wants another version by now.
                    Ok(p) if tenant.plugin_unavailable() == Some(version) => {
                        tenant.activate(Some(p));
                        tracing::info!(tenant = %tenant.id, version, ms = t0.elapsed().as_millis() as u64, "plugin loaded; the tenant serves");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(tenant = %tenant.id, version, error = %e, "the active plugin failed to load; the tenant refuses connections and publishes until it loads")
                    }
                }
                // Only now: cleared before the activation, a request between
                // the two would be told `plugin_unavailable` for a plugin that
                // is about to serve.
                tenant.set_plugin_loading(false);
            });
        }
        let n = tasks.len();
        while tasks.join_next().await.is_some() {}
        self.loading.store(false, Ordering::Release);
        self.evict_compiled(tenants);
        tracing::info!(
            plugins = n,
            ms = started.elapsed().as_millis() as u64,
            "plugins of the start loaded"
        );
    }
}

/// Runs plugin CPU work on a blocking thread.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, PluginError> + Send + 'static,
) -> Result<R, LoadError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| {
            LoadError::Plugin(PluginError::Instantiate(format!(
                "loader thread failed: {e}"
            )))
        })?
        .map_err(LoadError::Plugin)
}

/// Uploads larger than this compile in the background: the answer is 202
/// with a status to poll (an 18 MB Python component compiles for 11-14 s).
pub const BACKGROUND_UPLOAD_BYTES: usize = 1 << 20;

/// Where a background upload stands, per (tenant, sha256).
#[derive(Debug, Clone)]
pub enum UploadState {
    Compiling {
        since_ms: i64,
    },
    /// The upload's answer, as the synchronous path gives it.
    Stored(Value),
    Failed {
        code: &'static str,
        message: String,
        at_ms: i64,
    },
}

/// Background uploads of the last hour, by (tenant, sha256); this node's
/// only (poll the node that answered 202).
#[derive(Default)]
pub struct Uploads(Mutex<HashMap<(String, String), UploadState>>);

impl Uploads {
    /// Records an upload as compiling, unless it already is (then: its state).
    pub fn begin(&self, tenant: &str, sha: &str) -> Option<UploadState> {
        let mut m = self.0.lock();
        let hour_ago = now_ms() - 3_600_000;
        m.retain(|_, s| match s {
            UploadState::Compiling { .. } => true,
            UploadState::Failed { at_ms, .. } => *at_ms > hour_ago,
            UploadState::Stored(v) => v["created_at_ms"].as_i64().unwrap_or(0) > hour_ago,
        });
        let key = (tenant.to_string(), sha.to_string());
        match m.get(&key) {
            Some(s @ UploadState::Compiling { .. }) => Some(s.clone()),
            _ => {
                m.insert(key, UploadState::Compiling { since_ms: now_ms() });
                None
            }
        }
    }

    pub fn finish(&self, tenant: &str, sha: &str, state: UploadState) {
        self.0
            .lock()
            .insert((tenant.to_string(), sha.to_string()), state);
    }

    pub fn get(&self, tenant: &str, sha: &str) -> Option<UploadState> {
        self.0
            .lock()
            .get(&(tenant.to_string(), sha.to_string()))
            .cloned()
    }
}
