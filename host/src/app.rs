//! The process-wide state every part of the server shares.
//!
//! Owns: the registry handle, the live tenants, global capacity, readiness,
//! and the shutdown token. Invariant: built once in `run` before the listener
//! accepts, dropped after every task it spawned has finished.

use crate::clock::now_ms;
use crate::config::Config;
use crate::fanout::conflate::ConflationSettings;
use crate::plugin::active::{Activation, ActivePlugin};
use crate::plugin::{PluginError, Runtime};
use crate::registry::{Registry, RegistryError, TenantRecord};
use crate::secret::{hex, key_digest, new_secret};
use crate::tenant::{Access, Capacity, LimitOverrides, Tenant, TenantSettings, Tenants};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub struct App {
    pub config: Config,
    pub registry: Registry,
    pub tenants: Tenants,
    pub capacity: Arc<Capacity>,
    pub admin_token_sha256: [u8; 32],
    /// Cancelled when the server shuts down: sessions close with 1001.
    pub shutdown: CancellationToken,
    /// Cancelled when the node stops accepting connections (a drain, before
    /// `shutdown`); a child of `shutdown`.
    pub accepting: CancellationToken,
    pub tracker: TaskTracker,
    pub plugins: Arc<Runtime>,
    /// Every tenant's ingest source, keyed by tenant id.
    pub sources: crate::source::Sources,
    ready: AtomicBool,
    /// The start's first reconcile is running: a tenant's plugin is not
    /// loaded in line but queued in `deferred_loads`, so the server listens
    /// at once (`lib::run` loads them in the background).
    pub starting: AtomicBool,
    pub deferred_loads: parking_lot::Mutex<Vec<(Arc<crate::tenant::Tenant>, i64)>>,
    /// Background plugin uploads and how they ended.
    pub uploads: crate::api::plugins::Uploads,
    /// `lib::load_deferred` is running (the server listens, not yet ready).
    pub loading_plugins: AtomicBool,
    over_memory: AtomicBool,
    /// Admission's view of memory between RSS readings (see `admit_memory`).
    pub memory: MemoryGauge,
    /// Near the budget, at least one tenant holds more than its share: only
    /// such tenants are refused (otherwise the growth is nobody's in
    /// particular, and every tenant is).
    memory_blamed: AtomicBool,
    pub metrics: PrometheusHandle,
    /// Cluster mode's shared parts; `None` on a node of its own.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// One change at a time per tenant (`reconcile`).
    pub turns: crate::reconcile::Turns,
}

/// A tenant row turned into live settings, or why it cannot be.
pub fn settings_from_record(rec: &TenantRecord, config: &Config) -> Result<TenantSettings, String> {
    let access: Access = serde_json::from_value(serde_json::Value::String(rec.access.clone()))
        .map_err(|_| format!("access {:?} is not public or plugin", rec.access))?;
    let overrides: LimitOverrides =
        serde_json::from_value(rec.limits.clone()).map_err(|e| format!("limits: {e}"))?;
    let limits = overrides.apply(&config.limits)?;
    let digest = crate::secret::digest_from_hex(&rec.publish_key_sha256)
        .ok_or("publish key digest is not 64 hex digits")?;
    let conflation: ConflationSettings =
        serde_json::from_value(rec.conflation.clone()).map_err(|e| format!("conflation: {e}"))?;
    conflation.validate()?;
    let allowed_origins = crate::tenant::parse_origins(&rec.allowed_origins)?;
    Ok(TenantSettings {
        access,
        config: rec.config.clone(),
        overrides,
        limits,
        publish_key_sha256: digest,
        conflation,
        allowed_origins,
    })
}

impl App {
    pub fn new(
        config: Config,
        registry: Registry,
        capacity: Arc<Capacity>,
        admin_token_sha256: [u8; 32],
        metrics: PrometheusHandle,
        plugins: Arc<Runtime>,
        cluster: Option<Arc<crate::cluster::Cluster>>,
    ) -> App {
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let sources = crate::source::Sources::new(crate::source::SourceContext {
            registry: registry.clone(),
            node_id: config.node_id.clone(),
            log: cluster.as_ref().map(|c| c.log.clone()),
            log_kafka: cluster.as_ref().and_then(|c| c.config.kafka.clone()),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        });
        App {
            config,
            registry,
            tenants: Tenants::default(),
            capacity,
            admin_token_sha256,
            accepting: shutdown.child_token(),
            shutdown,
            tracker,
            sources,
            plugins,
            ready: AtomicBool::new(false),
            starting: AtomicBool::new(false),
            deferred_loads: Default::default(),
            loading_plugins: AtomicBool::new(false),
            uploads: Default::default(),
            over_memory: AtomicBool::new(false),
            memory: MemoryGauge::default(),
            memory_blamed: AtomicBool::new(false),
            metrics,
            cluster,
            turns: Default::default(),
        }
    }

    /// An App on a throwaway SQLite registry, for unit tests.
    #[cfg(test)]
    pub async fn for_tests() -> Arc<App> {
        let dir = std::env::temp_dir().join(format!("herald-unit-{}", rand::random::<u64>()));
        let config = Config::for_data_dir(&dir);
        let registry = Registry::open(None, &dir).await.expect("test registry");
        let app = App::new(
            config,
            registry,
            Capacity::new(100),
            [0; 32],
            crate::metrics::install(),
            Runtime::new().expect("plugin runtime"),
            None,
        );
        Arc::new(app)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Whether sessions are admitted: once ready, and already while the
    /// start's plugins load (each tenant then says `plugin_loading` until
    /// its own is loaded); not once a drain or shutdown began.
    pub fn admits_sessions(&self) -> bool {
        self.is_ready()
            || (self.loading_plugins.load(Ordering::Acquire) && !self.accepting.is_cancelled())
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn over_memory(&self) -> bool {
        self.over_memory.load(Ordering::Relaxed)
    }

    pub fn set_over_memory(&self, over: bool) {
        self.over_memory.store(over, Ordering::Relaxed);
    }

    /// Whether a new connection of `tenant` is refused for memory: near
    /// the budget, if the tenant is past its share, or if no tenant is
    /// (the growth is not one tenant's burst).
    pub fn refuses_for_memory(&self, tenant: &crate::tenant::Tenant) -> bool {
        let near = self.over_memory()
            || self
                .config
                .memory_budget_bytes
                .is_some_and(|b| self.memory.estimate() >= b / 100 * 95);
        near && (tenant.over_share() || !self.memory_blamed.load(Ordering::Relaxed))
    }

    pub fn set_memory_blamed(&self, blamed: bool) {
        self.memory_blamed.store(blamed, Ordering::Relaxed);
    }

    pub fn check_admin_token(&self, presented: &str) -> bool {
        crate::secret::matches(&self.admin_token_sha256, presented)
    }

    /// Compiles (cached by sha256) and loads one stored plugin version for a
    /// tenant, under the tenant's current config and sandbox limits. The CPU
    /// work runs on a blocking thread.
    pub async fn load_plugin(
        &self,
        tenant: &Tenant,
        version: i64,
    ) -> Result<Arc<ActivePlugin>, LoadError> {
        let bytes = self.registry.plugin_component(&tenant.id, version).await?;
        let settings = tenant.settings();
        let activation = Activation {
            version,
            sha256: crate::plugin::sha256_hex(&bytes),
            tenant: tenant.id.clone(),
            config: settings.config.to_string().into(),
            limits: settings.limits.sandbox(),
        };
        let runtime = self.plugins.clone();
        tokio::task::spawn_blocking(move || {
            let component = runtime.compile(&bytes)?;
            ActivePlugin::load(&runtime, &component, activation)
        })
        .await
        .map_err(|e| {
            LoadError::Plugin(PluginError::Instantiate(format!(
                "loader thread failed: {e}"
            )))
        })?
        .map_err(LoadError::Plugin)
    }

    /// Drops compiled components that no tenant runs or may roll back to
    /// (an upload that was never activated, a version two swaps back): a
    /// compiled Python component holds 35-94 MiB. The disk keeps them, so
    /// activating one again loads it in milliseconds.
    pub fn evict_compiled(&self) -> usize {
        let keep: std::collections::HashSet<String> = self
            .tenants
            .all()
            .iter()
            .flat_map(|t| t.plugin_shas())
            .collect();
        self.plugins.retain(&keep)
    }

    /// Creates the public `demo` tenant's row if absent; returns its new
    /// publish key (the caller applies the row: `reconcile::tenant`).
    pub async fn ensure_demo_tenant(&self) -> Result<Option<String>, RegistryError> {
        if self.tenants.get("demo").is_some() {
            return Ok(None);
        }
        let key = new_secret("pk_");
        let rec = TenantRecord {
            id: "demo".into(),
            access: Access::Public.as_str().into(),
            config: serde_json::json!({}),
            limits: serde_json::json!({}),
            publish_key_sha256: hex(&key_digest(&key)),
            created_at_ms: now_ms(),
            updated_at_ms: now_ms(),
            active_plugin: None,
            conflation: serde_json::json!({}),
            // The demo page's badge turns "stalled" when its publisher stops.
            source: match self.cluster {
                None => serde_json::json!({"kind": "http", "stall_after_ms": 3000}),
                Some(_) => serde_json::json!({"kind": "http"}),
            },
            allowed_origins: serde_json::Value::Null,
        };
        self.registry.create_tenant(&rec).await?;
        Ok(Some(key))
    }
}

/// Why a stored plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Plugin(PluginError),
}

/// What admission knows of the process's memory between RSS readings: the
/// last reading, plus what each session admitted since is expected to cost
/// (learned from how RSS grew with the sessions between readings). A storm
/// of connections between two readings is refused once the estimate
/// reaches the budget, instead of overshooting it until the next reading.
#[derive(Debug)]
pub struct MemoryGauge {
    rss: std::sync::atomic::AtomicU64,
    admitted: std::sync::atomic::AtomicU64,
    per_session: std::sync::atomic::AtomicU64,
}

/// What a session is assumed to cost before any growth was seen: an idle
/// one is ~2 KiB, one that has just connected holds its handshake buffers
/// and queue briefly.
const SESSION_BYTES_GUESS: u64 = 16 << 10;

impl Default for MemoryGauge {
    fn default() -> Self {
        MemoryGauge {
            rss: Default::default(),
            admitted: Default::default(),
            per_session: std::sync::atomic::AtomicU64::new(SESSION_BYTES_GUESS),
        }
    }
}

impl MemoryGauge {
    /// Counts a session admitted since the last reading.
    pub fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// The last reading plus what was admitted since.
    pub fn estimate(&self) -> u64 {
        self.rss.load(Ordering::Relaxed)
            + self.admitted.load(Ordering::Relaxed) * self.per_session.load(Ordering::Relaxed)
    }

    /// A new RSS reading: learns the cost per session from the growth since
    /// the last one (between 4 KiB and 256 KiB, smoothed), and starts
    /// counting admissions afresh.
    pub fn reading(&self, rss: u64) {
        let before = self.rss.swap(rss, Ordering::Relaxed);
        let admitted = self.admitted.swap(0, Ordering::Relaxed);
        if admitted >= 16 && before > 0 && rss > before {
            let seen = ((rss - before) / admitted).clamp(4 << 10, 256 << 10);
            let old = self.per_session.load(Ordering::Relaxed);
            self.per_session.store((old + seen) / 2, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod memory_tests {
    use super::MemoryGauge;

    #[test]
    fn admissions_between_readings_count() {
        let g = MemoryGauge::default();
        g.reading(10 << 20);
        for _ in 0..100 {
            g.admitted();
        }
        assert_eq!(g.estimate(), (10 << 20) + 100 * (16 << 10));
        // RSS grew 400 KiB with those 100: 4 KiB each, averaged with the guess.
        g.reading((10 << 20) + (400 << 10));
        assert_eq!(g.estimate(), (10 << 20) + (400 << 10));
        g.admitted();
        assert_eq!(g.estimate(), (10 << 20) + (400 << 10) + (10 << 10));
    }
}
