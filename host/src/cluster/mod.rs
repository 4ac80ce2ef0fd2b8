//! Cluster mode: several nodes on one Postgres registry, no protocol of
//! their own between them (DESIGN.md, "Scale-out").
//!
//! Owns: the registry watch (LISTEN for tenant changes and for new rows of
//! the shared publish log, a full reconcile on every (re)connect and every
//! `--reconcile-secs`), whether this node hears the registry (`/readyz`,
//! `herald_registry_up`), the node's heartbeat in the cluster view, and the
//! publish log's retention. Invariants: a change missed while the watch was
//! down is applied by the reconcile that follows its reconnect, so a deleted
//! tenant or an old key outlives its change by at most the time the
//! registry was unreachable plus one reconcile period; while the registry is
//! unreachable the node serves what it has. Never: decides anything the
//! registry has not recorded.

use crate::app::App;
use crate::clock::now_ms;
use crate::reconcile;
use crate::registry::log::SharedLog;
use crate::registry::NodeRecord;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Tenant ids whose row (or plugins) changed; sent by the registry's triggers.
pub const REGISTRY_CHANNEL: &str = "herald_registry";
pub use crate::registry::log::PUBLISH_CHANNEL;
/// How often a node records itself in the cluster view.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);

/// Cluster mode's settings (`--cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub reconcile: Duration,
    pub log_retention: Duration,
    /// HTTP publishes go through Kafka topics rather than the registry's log.
    pub kafka: Option<crate::source::ClusterKafka>,
}

/// What every part of cluster mode shares.
pub struct Cluster {
    /// The registry database: the publish log is written and read here.
    pub pool: PgPool,
    /// The shared publish log, on the same pool.
    pub log: Arc<SharedLog>,
    pub config: ClusterConfig,
    up: AtomicBool,
    /// When the registry was last found unreachable (0: it is not).
    down_since_ms: AtomicU64,
}

impl Cluster {
    /// Connects to the registry database for the publish log and the watch.
    pub async fn connect(url: &str, config: ClusterConfig) -> Result<Arc<Cluster>, sqlx::Error> {
        let options = PgConnectOptions::from_str(url)?.application_name("herald");
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // Short: a registry that does not answer must show within seconds.
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(options)
            .await?;
        metrics_up(true);
        let log = Arc::new(SharedLog {
            pool: pool.clone(),
            retention: config.log_retention,
        });
        Ok(Arc::new(Cluster {
            pool,
            log,
            config,
            up: AtomicBool::new(true),
            down_since_ms: AtomicU64::new(0),
        }))
    }

    /// Whether this node hears the registry, and since when it has not.
    pub fn registry(&self) -> (bool, Option<u64>) {
        let up = self.up.load(Ordering::Acquire);
        let since = self.down_since_ms.load(Ordering::Acquire);
        (up, (!up && since > 0).then_some(since))
    }

    fn set_up(&self, up: bool) {
        if self.up.swap(up, Ordering::AcqRel) == up {
            return;
        }
        if up {
            self.down_since_ms.store(0, Ordering::Release);
            tracing::info!("registry reachable again; reconciled with it");
        } else {
            self.down_since_ms.store(now_ms() as u64, Ordering::Release);
            tracing::warn!("registry unreachable: serving what this node has until it is back");
        }
        metrics_up(up);
    }
}

fn metrics_up(up: bool) {
    crate::metrics::set_registry_up(up);
}

/// Starts the watch and the log's retention (cluster mode) and the heartbeat
/// (always: the cluster view of a single node is that node).
pub fn spawn(app: &Arc<App>, tasks: &tokio_util::task::TaskTracker, address: String) {
    tasks.spawn(heartbeat(app.clone(), address));
    if let Some(cluster) = app.cluster.clone() {
        tasks.spawn(watch(app.clone(), cluster.clone()));
        tasks.spawn(prune(app.clone(), cluster));
    }
}

/// Listens for changes and reconciles; reconnects (and reconciles) forever.
async fn watch(app: Arc<App>, cluster: Arc<Cluster>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = listen(&app, &cluster, &mut backoff);
        let result = tokio::select! {
            _ = app.shutdown.cancelled() => return,
            r = attempt => r,
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "registry watch failed");
            cluster.set_up(false);
        }
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One connected watch: returns only on an error.
async fn listen(app: &Arc<App>, cluster: &Cluster, backoff: &mut Duration) -> Result<(), String> {
    let mut listener = PgListener::connect_with(&cluster.pool)
        .await
        .map_err(|e| e.to_string())?;
    listener
        .listen_all([REGISTRY_CHANNEL, PUBLISH_CHANNEL])
        .await
        .map_err(|e| e.to_string())?;
    // Whatever changed while nobody listened.
    let changed = reconcile::all(app).await.map_err(|e| e.to_string())?;
    crate::metrics::reconciled(changed);
    // Rows logged meanwhile: every reader looks once.
    for t in app.tenants.all() {
        t.log_written.notify_one();
    }
    cluster.set_up(true);
    *backoff = Duration::from_millis(100);
    let mut tick = tokio::time::interval(cluster.config.reconcile);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            n = listener.try_recv() => {
                let n = n.map_err(|e| e.to_string())?.ok_or("the registry connection was lost")?;
                dispatch(app, n.channel(), n.payload());
            }
            _ = tick.tick() => {
                let changed = reconcile::all(app).await.map_err(|e| e.to_string())?;
                crate::metrics::reconciled(changed);
                if changed > 0 {
                    tracing::info!(changed, "reconcile found changes NOTIFY had not brought");
                }
            }
        }
    }
}

/// Acts on one notification: new log rows ring the tenant's reader; a
/// plugin upload (`tenant:version`) is compiled ahead; any other change of
/// a tenant is applied. Plugin work can take a while: it runs on its own
/// task, and the watch goes on.
fn dispatch(app: &Arc<App>, channel: &str, payload: &str) {
    if channel == PUBLISH_CHANNEL {
        if let Some(t) = app.tenants.get(payload) {
            t.log_written.notify_one();
        }
        return;
    }
    let app2 = app.clone();
    match payload.split_once(':') {
        Some((tenant, version)) => {
            let (tenant, version) = (tenant.to_string(), version.parse().unwrap_or(0));
            app.tracker
                .spawn(async move { precompile(&app2, &tenant, version).await });
        }
        None => {
            let id = payload.to_string();
            app.tracker.spawn(async move {
                if let Err(e) = reconcile::tenant(&app2, &id).await {
                    tracing::warn!(tenant = %id, error = %e, "applying a registry change failed; the next reconcile retries");
                }
            });
        }
    }
}

/// Compiles a version uploaded through another node into this node's cache,
/// so that its activation (seconds later, or never) costs an instantiation.
async fn precompile(app: &App, tenant: &str, version: i64) {
    let bytes = match app.registry.plugin_component(tenant, version).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(%tenant, version, error = %e, "uploaded plugin not precompiled");
            return;
        }
    };
    let runtime = app.plugins.clone();
    let compiled = tokio::task::spawn_blocking(move || runtime.compile(&bytes).map(drop)).await;
    if let Ok(Err(e)) = compiled {
        tracing::warn!(%tenant, version, error = %e, "an uploaded plugin does not compile on this node");
    }
}

/// Records this node in the registry's cluster view every few seconds.
async fn heartbeat(app: Arc<App>, address: String) {
    let started = now_ms();
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let plugins: serde_json::Map<String, serde_json::Value> = app
            .tenants
            .all()
            .iter()
            .filter_map(|t| Some((t.id.to_string(), t.plugin()?.version.into())))
            .collect();
        let node = NodeRecord {
            id: app.config.node_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            address: address.clone(),
            started_at_ms: started,
            heartbeat_at_ms: now_ms(),
            connections: app.capacity.current() as i64,
            plugins: plugins.into(),
        };
        if let Err(e) = app.registry.put_node(&node).await {
            tracing::debug!(error = %e, "heartbeat not recorded");
        }
    }
}

/// Prunes the shared publish log on its schedule until shutdown.
async fn prune(app: Arc<App>, cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(cluster.log.prune_every());
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        cluster.log.prune().await;
    }
}
