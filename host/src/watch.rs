//! Cluster mode's tasks: the registry watch (LISTEN for tenant changes and
//! for new rows of the shared publish log, a full reconcile on every
//! (re)connect and every `--reconcile-secs`), the node's heartbeat in the
//! cluster view (always: the cluster view of a single node is that node),
//! and the publish log's retention.
//!
//! Invariants: a change missed while the watch was down is applied by the
//! reconcile that follows its reconnect, so a deleted tenant or an old key
//! outlives its change by at most the time the registry was unreachable plus
//! one reconcile period; while the registry is unreachable the node serves
//! what it has. Never: decides anything the registry has not recorded.

use crate::clock::now_ms;
use crate::cluster::{Cluster, HEARTBEAT_EVERY, PUBLISH_CHANNEL, REGISTRY_CHANNEL};
use crate::node::Node;
use crate::reconcile;
use crate::registry::NodeRecord;
use sqlx::postgres::PgListener;
use std::sync::Arc;
use std::time::Duration;

/// Starts the watch and the log's retention (cluster mode) and the heartbeat
/// (always: the cluster view of a single node is that node).
pub fn spawn(app: &Arc<Node>, tasks: &tokio_util::task::TaskTracker, address: String) {
    tasks.spawn(heartbeat(app.clone(), address));
    if let Some(cluster) = app.cluster.clone() {
        tasks.spawn(watch(app.clone(), cluster.clone()));
        tasks.spawn(prune(app.clone(), cluster));
    }
}

/// Listens for changes and reconciles; reconnects (and reconciles) forever.
async fn watch(app: Arc<Node>, cluster: Arc<Cluster>) {
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
async fn listen(app: &Arc<Node>, cluster: &Cluster, backoff: &mut Duration) -> Result<(), String> {
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
fn dispatch(app: &Arc<Node>, channel: &str, payload: &str) {
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
async fn precompile(app: &Node, tenant: &str, version: i64) {
    let bytes = match app.registry.plugin_component(tenant, version).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(%tenant, version, error = %e, "uploaded plugin not precompiled");
            return;
        }
    };
    let runtime = app.plugins.runtime.clone();
    // Hashed there too: 18 MB take ~12 ms, not a runtime worker's to spend.
    let compiled = tokio::task::spawn_blocking(move || {
        runtime
            .compile(&bytes)
            .map(|_| crate::plugin::sha256_hex(&bytes))
    })
    .await;
    match compiled {
        Ok(Ok(sha256)) => {
            // Kept compiled as the tenant's newest upload, older ones not.
            if let Some(t) = app.tenants.get(tenant) {
                t.plugin_uploaded(sha256);
            }
            app.evict_compiled();
        }
        Ok(Err(e)) => {
            tracing::warn!(%tenant, version, error = %e, "an uploaded plugin does not compile on this node")
        }
        Err(_) => {}
    }
}

/// Records this node in the registry's cluster view every few seconds.
async fn heartbeat(app: Arc<Node>, address: String) {
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
            id: app.node_id.clone(),
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
async fn prune(app: Arc<Node>, cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(cluster.log.prune_every());
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        cluster.log.prune().await;
    }
}
