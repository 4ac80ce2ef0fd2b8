//! Cluster mode's shared parts: several nodes on one Postgres registry, no
//! protocol of their own between them: the registry and Kafka are the backbone.
//!
//! Owns: the connection to the registry database that the shared publish
//! log and the watch use, cluster mode's settings, and whether this node
//! hears the registry (`/readyz`, `herald_registry_up`). What runs on them —
//! the watch, the heartbeat, the log's retention — is `watch.rs`.

use crate::clock::now_ms;
use crate::registry::log::{ClusterKafka, SharedLog};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
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
    pub kafka: Option<ClusterKafka>,
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

    /// Records whether the watch hears the registry (logged on a change).
    pub fn set_up(&self, up: bool) {
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
