//! A running node: the state its control layer and its edges share — the
//! registry, the live tenants and their sources, the plugin host, capacity
//! and memory, readiness, and the stop tokens.
//!
//! Owns: readiness (`/readyz`, session admission), memory pressure as
//! admission sees it ([`MemoryGauge`]), the shutdown and drain tokens.
//! Invariant: built once in `lib::run` before the listener accepts, dropped
//! after every task it spawned has finished. Knows nothing of `Config` or of
//! the HTTP edges: `lib::run` hands it the parts it needs.

use crate::plugin::active::ActivePlugin;
use crate::plugin_host::{LoadError, PluginHost};
use crate::registry::Registry;
use crate::tenant::{Capacity, Tenant, TenantLimits, Tenants};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub struct Node {
    /// This node's name (cursors, the cluster view, `/readyz`).
    pub node_id: String,
    /// A tenant's limits where its row overrides none.
    pub defaults: TenantLimits,
    /// `--memory-budget-mib`: admission refuses near it.
    pub memory_budget: Option<u64>,
    pub registry: Registry,
    pub tenants: Tenants,
    pub capacity: Arc<Capacity>,
    /// Cancelled when the server shuts down: sessions close with 1001.
    pub shutdown: CancellationToken,
    /// Cancelled when the node stops accepting connections (a drain, before
    /// `shutdown`); a child of `shutdown`.
    pub accepting: CancellationToken,
    pub tracker: TaskTracker,
    pub plugins: Arc<PluginHost>,
    /// Every tenant's ingest source, keyed by tenant id.
    pub sources: crate::source::Sources,
    ready: AtomicBool,
    over_memory: AtomicBool,
    /// Admission's view of memory between RSS readings (see `admit_memory`).
    pub memory: MemoryGauge,
    /// Near the budget, at least one tenant holds more than its share: only
    /// such tenants are refused (otherwise the growth is nobody's in
    /// particular, and every tenant is).
    memory_blamed: AtomicBool,
    /// Cluster mode's shared parts; `None` on a node of its own.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// One change at a time per tenant (`reconcile`).
    pub turns: Turns,
    /// A unit test's registry directory, removed with the node.
    #[cfg(test)]
    scratch: Option<tempfile::TempDir>,
}

/// One change at a time per tenant.
#[derive(Default)]
pub struct Turns(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Turns {
    pub async fn take(&self, id: &str) -> OwnedMutexGuard<()> {
        let lock = self.0.lock().entry(id.to_string()).or_default().clone();
        lock.lock_owned().await
    }

    /// Forgets the turn of a tenant nobody waits for (after deletion).
    pub fn release(&self, id: &str) {
        let mut map = self.0.lock();
        if map.get(id).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(id);
        }
    }
}

/// What `lib::run` gives a node.
pub struct NodeParts {
    pub node_id: String,
    pub defaults: TenantLimits,
    pub memory_budget: Option<u64>,
    pub registry: Registry,
    pub capacity: Arc<Capacity>,
    pub runtime: Arc<crate::plugin::Runtime>,
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl Node {
    pub fn new(parts: NodeParts) -> Node {
        let NodeParts {
            node_id,
            defaults,
            memory_budget,
            registry,
            capacity,
            runtime,
            cluster,
        } = parts;
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let sources = crate::source::Sources::new(crate::source::SourceContext {
            cursors: crate::registry::cursors::CursorStore::new(registry.clone(), &node_id),
            log: cluster.as_ref().map(|c| c.log.clone()),
            log_kafka: cluster.as_ref().and_then(|c| c.config.kafka.clone()),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        });
        Node {
            node_id,
            defaults,
            memory_budget,
            registry,
            tenants: Tenants::default(),
            capacity,
            accepting: shutdown.child_token(),
            shutdown,
            tracker,
            sources,
            plugins: Arc::new(PluginHost::new(runtime)),
            ready: AtomicBool::new(false),
            over_memory: AtomicBool::new(false),
            memory: MemoryGauge::default(),
            memory_blamed: AtomicBool::new(false),
            cluster,
            turns: Default::default(),
            #[cfg(test)]
            scratch: None,
        }
    }

    /// A node on a throwaway SQLite registry, for unit tests.
    #[cfg(test)]
    pub async fn for_tests() -> Arc<Node> {
        let scratch = tempfile::Builder::new()
            .prefix("herald-unit-")
            .tempdir()
            .expect("test dir");
        let registry = Registry::open(None, scratch.path())
            .await
            .expect("test registry");
        let mut node = Node::new(NodeParts {
            node_id: "test".into(),
            defaults: TenantLimits::DEFAULT,
            memory_budget: None,
            registry,
            capacity: Capacity::new(100),
            runtime: crate::plugin::Runtime::new().expect("plugin runtime"),
            cluster: None,
        });
        node.scratch = Some(scratch);
        Arc::new(node)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Whether sessions are admitted: once ready, and already while the
    /// start's plugins load (each tenant then says `plugin_loading` until
    /// its own is loaded); not once a drain or shutdown began.
    pub fn admits_sessions(&self) -> bool {
        self.is_ready() || (self.plugins.loading() && !self.accepting.is_cancelled())
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
                .memory_budget
                .is_some_and(|b| self.memory.estimate() >= b / 100 * 95);
        near && (tenant.over_share() || !self.memory_blamed.load(Ordering::Relaxed))
    }

    pub fn set_memory_blamed(&self, blamed: bool) {
        self.memory_blamed.store(blamed, Ordering::Relaxed);
    }

    /// Loads one stored plugin version for a tenant (`PluginHost::load`).
    pub async fn load_plugin(
        &self,
        tenant: &Tenant,
        version: i64,
    ) -> Result<Arc<ActivePlugin>, LoadError> {
        self.plugins.load(&self.registry, tenant, version).await
    }

    /// Drops compiled components no tenant runs or may roll back to.
    pub fn evict_compiled(&self) -> usize {
        self.plugins.evict_compiled(&self.tenants)
    }
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

#[cfg(test)]
mod scratch_tests {
    use super::Node;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_test_nodes_registry_directory_goes_with_it() {
        let node = Node::for_tests().await;
        let dir = node
            .scratch
            .as_ref()
            .expect("a test node")
            .path()
            .to_owned();
        assert!(dir.join("registry.db").exists());
        let node = Arc::into_inner(node).expect("nothing else holds the node");
        // The registry's pool closes first: SQLite's files go with the directory.
        node.registry.close().await;
        drop(node);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
