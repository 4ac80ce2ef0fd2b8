//! Configuration: one tree, parsed once from flags and `HERALD_*` variables,
//! validated before any port is bound.
//!
//! Owns: `herald serve`'s flags and `HERALD_*` variables ([`ServeArgs`]) and
//! their validation into [`Config`]. Invariant: nothing below `main` reads
//! the environment; `lib::run` hands every layer the part of [`Config`] it
//! reads (ARCHITECTURE.md, "Layers"), and no module below it names `Config`.

pub use crate::cluster::ClusterConfig;
use crate::fanout::queue::SlowConsumer;
pub use crate::registry::log::ClusterKafka;
use crate::tenant::TenantLimits;

/// The limit flags' defaults: the tenant layer's (tenant/limits.rs).
const D: TenantLimits = TenantLimits::DEFAULT;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address for clients, publish and admin (one listener).
    #[arg(long, env = "HERALD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve the admin API (with /healthz, /readyz and /metrics) on this
    /// address instead of --listen: a door of its own, which no client load
    /// can fill. Bind it where only operators reach.
    #[arg(long, env = "HERALD_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Directory for the embedded SQLite registry.
    #[arg(long, env = "HERALD_DATA_DIR", default_value = "./herald-data")]
    pub data_dir: PathBuf,
    /// Registry database (`postgres://…` or `sqlite://…`); overrides the SQLite default.
    #[arg(long, env = "HERALD_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// --database-url read from this file (its first line): kept out of argv.
    #[arg(
        long,
        env = "HERALD_DATABASE_URL_FILE",
        conflicts_with = "database_url"
    )]
    pub database_url_file: Option<PathBuf>,
    /// Bearer token for /admin. Generated and printed once when absent (SQLite only).
    #[arg(long, env = "HERALD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// --admin-token read from this file (its first line): kept out of argv.
    #[arg(long, env = "HERALD_ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// Bearer token `/metrics` requires (it lists every tenant id); open when absent.
    #[arg(long, env = "HERALD_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// --metrics-token read from this file (its first line).
    #[arg(
        long,
        env = "HERALD_METRICS_TOKEN_FILE",
        conflicts_with = "metrics_token"
    )]
    pub metrics_token_file: Option<PathBuf>,
    /// The demo: create a public tenant `demo` if it does not exist (and
    /// print its publish key), serve the live ticker page at `/` (and the
    /// browser client at `/herald.js`), and publish ticks into it.
    #[arg(long, env = "HERALD_DEMO")]
    pub demo: bool,
    /// Serve TLS with this PEM certificate chain (with --tls-key); for
    /// deployments without a terminating proxy.
    #[arg(long, env = "HERALD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "HERALD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// With `--demo`: publish a tick for each demo symbol this often; 0: no
    /// built-in publisher (feed it with examples/ticker.sh).
    #[arg(long, env = "HERALD_DEMO_INTERVAL_MS", default_value_t = 500)]
    pub demo_interval_ms: u64,
    /// Listen backlog (the kernel caps it at net.core.somaxconn).
    #[arg(long, env = "HERALD_LISTEN_BACKLOG", default_value_t = 4096)]
    pub listen_backlog: u32,
    /// Set SO_REUSEPORT so several Herald processes can share the port.
    #[arg(long, env = "HERALD_REUSE_PORT")]
    pub reuse_port: bool,
    /// Connections across all tenants; default and ceiling: what the open-files limit allows.
    #[arg(long, env = "HERALD_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Refuse new connections (503 / 1013) when the process RSS passes this
    /// many MiB. Default: nine tenths of the cgroup's memory limit where one
    /// is set (a container's), else none; 0: none.
    #[arg(long, env = "HERALD_MEMORY_BUDGET_MIB")]
    pub memory_budget_mib: Option<u64>,
    /// Sockets that are not sessions yet (before their handshake) or plain
    /// HTTP connections, at most; one past it is closed at once.
    #[arg(long, env = "HERALD_MAX_PENDING_CONNECTIONS", default_value_t = 16_384)]
    pub max_pending_connections: usize,
    /// Of those, at most this many from one client address; one past it is
    /// closed at once (default: half of --max-pending-connections, so one
    /// address never takes every door and a reconnect storm from behind one
    /// NAT still fits; 0: no bound, for a single proxy in front).
    #[arg(long, env = "HERALD_MAX_PENDING_PER_ADDRESS")]
    pub max_pending_per_address: Option<usize>,
    /// Seconds a connection may take to send a request head, and may stay
    /// idle between requests on a kept-alive HTTP connection.
    #[arg(long, env = "HERALD_HEAD_TIMEOUT_SECS", default_value_t = 10)]
    pub head_timeout_secs: u64,
    /// Seconds between heartbeats (WebSocket ping, SSE comment).
    #[arg(long, env = "HERALD_HEARTBEAT_SECS", default_value_t = 25)]
    pub heartbeat_secs: u64,
    /// Seconds that sessions get to close at shutdown.
    #[arg(long, env = "HERALD_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,
    /// On SIGTERM: seconds to stay up, not ready (`/readyz` 503) but serving,
    /// so the load balancer stops sending clients before any is closed.
    #[arg(long, env = "HERALD_DRAIN_WAIT_SECS", default_value_t = 0)]
    pub drain_wait_secs: u64,
    /// On SIGTERM, after the wait: close the sessions spread evenly over this
    /// many seconds (close 1012, SSE a `close` event), so clients reconnect
    /// to the other nodes gradually rather than all at once.
    #[arg(long, env = "HERALD_DRAIN_SPREAD_SECS", default_value_t = 0)]
    pub drain_spread_secs: u64,
    /// This node's name in the registry (ingest cursors are kept per node).
    /// Default: the host name.
    #[arg(long, env = "HERALD_NODE_ID")]
    pub node_id: Option<String>,
    /// Kernel send buffer per client socket, in bytes (SO_SNDBUF; the kernel
    /// doubles it). Bounds what a client that stopped reading costs in kernel
    /// memory: beyond it frames wait in Herald's own bounded queue, where the
    /// slow-consumer policy applies. 0 leaves the kernel's autotuning (up to
    /// tcp_wmem's maximum, 4 MiB by default, per socket).
    #[arg(long, env = "HERALD_SOCKET_SEND_BUFFER", default_value_t = 65_536)]
    pub socket_send_buffer: usize,
    /// Runtime worker threads (default: one per core).
    #[arg(long, env = "HERALD_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Cluster mode (needs a Postgres registry shared by every node): admin
    /// changes reach every node through LISTEN/NOTIFY, and HTTP publishes go
    /// through a log in the registry that every node delivers from, so all
    /// nodes give a message the same position.
    #[arg(long, env = "HERALD_CLUSTER")]
    pub cluster: bool,
    /// Cluster mode: seconds between full comparisons of the live tenants
    /// with the registry (the safety net under NOTIFY; also run on every
    /// reconnect). Bounds how long a missed change can go unseen.
    #[arg(long, env = "HERALD_RECONCILE_SECS", default_value_t = 10)]
    pub reconcile_secs: u64,
    /// Cluster mode: how long HTTP publishes stay in the registry's log, in
    /// seconds. A node down for longer misses what was deleted meanwhile.
    #[arg(
        long,
        env = "HERALD_CLUSTER_LOG_RETENTION_SECS",
        default_value_t = 3600
    )]
    pub cluster_log_retention_secs: u64,
    /// Cluster mode: Kafka brokers (`bootstrap.servers`) for the log of HTTP
    /// publishes instead of the registry's table: each `http` tenant gets a
    /// topic of its own (`--cluster-kafka-prefix` + tenant id, one partition,
    /// created by Herald when the brokers allow it).
    #[arg(long, env = "HERALD_CLUSTER_KAFKA")]
    pub cluster_kafka: Option<String>,
    /// Cluster mode: the prefix of the per-tenant publish topics.
    #[arg(
        long,
        env = "HERALD_CLUSTER_KAFKA_PREFIX",
        default_value = "herald.publish."
    )]
    pub cluster_kafka_prefix: String,
    /// The address this node is reached at, for the cluster view (default:
    /// the listen address).
    #[arg(long, env = "HERALD_ADVERTISE")]
    pub advertise: Option<String>,
    /// The Autobahn testsuite's testee: this tenant's WebSocket sessions
    /// echo every text and binary message instead of reading client
    /// operations. For the test command only.
    #[arg(long, env = "HERALD_ECHO_TENANT", hide = true)]
    pub echo_tenant: Option<String>,
    /// Log filter (tracing `EnvFilter` syntax).
    #[arg(long, env = "HERALD_LOG", default_value = "info")]
    pub log: String,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Defaults for every tenant; each can be overridden per tenant via the admin API.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Connections per tenant (default: no limit below the global one).
    #[arg(long, env = "HERALD_TENANT_MAX_CONNECTIONS")]
    pub tenant_max_connections: Option<usize>,
    /// Subscriptions per connection.
    #[arg(long, env = "HERALD_MAX_SUBSCRIPTIONS", default_value_t = D.max_subscriptions)]
    pub max_subscriptions: usize,
    /// Largest client frame and published payload, in bytes.
    #[arg(long, env = "HERALD_MAX_MESSAGE_BYTES", default_value_t = D.max_message_bytes)]
    pub max_message_bytes: usize,
    /// Outbound queue per session, in bytes.
    #[arg(long, env = "HERALD_QUEUE_BYTES", default_value_t = D.queue_bytes)]
    pub queue_bytes: usize,
    /// What a full session queue does: conflate, drop-oldest or disconnect.
    #[arg(long, env = "HERALD_SLOW_CONSUMER", default_value = "conflate", value_parser = parse_policy)]
    pub slow_consumer: SlowConsumer,
    /// Published messages per second per tenant (sustained).
    #[arg(long, env = "HERALD_PUBLISH_RATE", default_value_t = D.publish_rate)]
    pub publish_rate: f64,
    /// Publish burst per tenant above the sustained rate.
    #[arg(long, env = "HERALD_PUBLISH_BURST", default_value_t = D.publish_burst)]
    pub publish_burst: u32,
    /// Messages kept per channel for resume.
    #[arg(long, env = "HERALD_HISTORY_SIZE", default_value_t = D.history_size)]
    pub history_size: usize,
    /// Age after which history is dropped, in seconds.
    #[arg(long, env = "HERALD_HISTORY_TTL_SECS", default_value_t = D.history_ttl_ms / 1000)]
    pub history_ttl_secs: u64,
    /// Encoded bytes of history one channel keeps (besides the count and age).
    #[arg(long, env = "HERALD_HISTORY_BYTES", default_value_t = D.history_bytes)]
    pub history_bytes: usize,
    /// MiB of history all of one tenant's channels keep together; a message
    /// past it is sent live, not kept (a resume across it gets a `gap`).
    #[arg(long, env = "HERALD_TENANT_HISTORY_MIB", default_value_t = D.history_total_bytes >> 20)]
    pub tenant_history_mib: usize,
    /// Channels one tenant's subscribers may bring into being.
    #[arg(long, env = "HERALD_MAX_CHANNELS", default_value_t = D.max_channels)]
    pub max_channels: usize,
    /// MiB one tenant's conflation window may hold.
    #[arg(long, env = "HERALD_CONFLATION_MAX_MIB", default_value_t = D.conflation_max_bytes >> 20)]
    pub conflation_max_mib: usize,
    /// Percent of --memory-budget-mib one tenant's queues, histories and
    /// window may hold: near the budget only tenants past their share are
    /// refused new connections.
    #[arg(long, env = "HERALD_MEMORY_SHARE_PERCENT", default_value_t = D.memory_share_percent)]
    pub memory_share_percent: u8,
    /// Memory cap of each plugin instance, in MiB.
    #[arg(long, env = "HERALD_PLUGIN_MEMORY_MIB", default_value_t = D.plugin_memory_bytes >> 20)]
    pub plugin_memory_mib: usize,
    /// CPU deadline of each plugin call, in milliseconds.
    #[arg(long, env = "HERALD_PLUGIN_DEADLINE_MS", default_value_t = D.plugin_deadline_ms)]
    pub plugin_deadline_ms: u64,
    /// Blocking threads each tenant's plugin calls may use at once (calls
    /// that overran the 2 ms inline budget, merges, blocking guests).
    #[arg(long, env = "HERALD_PLUGIN_THREADS", default_value_t = D.plugin_threads)]
    pub plugin_threads: usize,
    /// Plugin calls of a tenant that may wait for one of its threads; past
    /// it a connect, subscribe or publish is refused with `plugin_busy`.
    #[arg(long, env = "HERALD_PLUGIN_QUEUE", default_value_t = D.plugin_queue)]
    pub plugin_queue: usize,
    /// Client operations (WebSocket frames) per second per connection; past
    /// the burst a client gets `err` `rate_limited`, and is closed (1008) if
    /// it keeps going.
    #[arg(long, env = "HERALD_CLIENT_OPS_PER_SEC", default_value_t = D.client_ops_per_sec)]
    pub client_ops_per_sec: f64,
    /// Client operations a connection may send at once above the rate.
    #[arg(long, env = "HERALD_CLIENT_OPS_BURST", default_value_t = D.client_ops_burst)]
    pub client_ops_burst: u32,
    /// permessage-deflate (RFC 7692) for WebSocket clients that offer it:
    /// messages of at least this many bytes go compressed, once per message
    /// and audience; 0 (the default) agrees to no compression.
    #[arg(long, env = "HERALD_DEFLATE_MIN_BYTES", default_value_t = D.deflate_min_bytes)]
    pub deflate_min_bytes: usize,
    /// Largest plugin component accepted for upload, in MiB.
    #[arg(long, env = "HERALD_PLUGIN_MAX_MIB", default_value_t = D.plugin_max_bytes >> 20)]
    pub plugin_max_mib: usize,
}

fn parse_policy(s: &str) -> Result<SlowConsumer, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("{s:?} is not one of conflate, drop-oldest, disconnect"))
}

/// A kept-alive HTTP connection's lifetime (nginx's `keepalive_time` is an
/// hour; ten minutes keeps a pooled client moving between nodes as they come
/// and go, at one reconnect per ten minutes).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(600);

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// Where compiled plugin components are kept across restarts (by
    /// sha256, under a key of this directory's own): `data_dir/compiled`
    /// unless set. Embedders and the tests share one between servers.
    pub compiled_dir: Option<PathBuf>,
    /// `--admin-listen`: the admin API's own listener (not on the main one).
    pub admin_listen: Option<SocketAddr>,
    pub database_url: Option<String>,
    pub admin_token: Option<String>,
    /// `/metrics` requires this bearer token when set.
    pub metrics_token: Option<String>,
    pub demo_tenant: bool,
    /// `--tls-cert`, `--tls-key`: clients connect over TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The demo's built-in publisher; `None`: off.
    pub demo_interval: Option<Duration>,
    /// `None`: derived from the open-files limit at start.
    pub max_connections: Option<usize>,
    pub memory_budget_bytes: Option<u64>,
    pub max_pending_connections: usize,
    /// `--max-pending-per-address` (0: no bound).
    pub max_pending_per_address: usize,
    /// A request head's deadline, and a kept-alive connection's idle one.
    pub head_timeout: Duration,
    /// How long a kept-alive HTTP connection may live, busy or not (it is
    /// then closed after its current request): [`MAX_CONNECTION_AGE`].
    pub max_connection_age: Duration,
    pub heartbeat: Duration,
    pub shutdown_grace: Duration,
    /// Drain on shutdown: not ready for `wait`, then sessions closed over `spread`.
    pub drain: Drain,
    pub limits: TenantLimits,
    /// This node's name for per-node ingest cursors.
    pub node_id: String,
    /// SO_SNDBUF for accepted sockets; `None` keeps the kernel's autotuning.
    pub socket_send_buffer: Option<usize>,
    /// Cluster mode, when on.
    pub cluster: Option<ClusterConfig>,
    /// Shown in the cluster view; `None`: the listen address.
    pub advertise: Option<String>,
    /// `--echo-tenant` (the Autobahn testee; hidden).
    pub echo_tenant: Option<String>,
}

/// How a stopping node lets its clients go (`--drain-wait-secs`,
/// `--drain-spread-secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drain {
    pub wait: Duration,
    pub spread: Duration,
}

/// A secret given directly, or the first line of `file`.
fn secret(
    direct: &Option<String>,
    file: &Option<PathBuf>,
    flag: &str,
) -> Result<Option<String>, String> {
    let Some(path) = file else {
        return Ok(direct.clone());
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim_end();
    if line.is_empty() {
        return Err(format!("{flag} {}: empty", path.display()));
    }
    Ok(Some(line.to_string()))
}

impl ServeArgs {
    /// Checks the flags and builds the [`Config`]; errors name the flag.
    pub fn to_config(&self) -> Result<Config, String> {
        let mut resolved = self.clone();
        resolved.admin_token = secret(
            &self.admin_token,
            &self.admin_token_file,
            "--admin-token-file",
        )?;
        resolved.database_url = secret(
            &self.database_url,
            &self.database_url_file,
            "--database-url-file",
        )?;
        resolved.metrics_token = secret(
            &self.metrics_token,
            &self.metrics_token_file,
            "--metrics-token-file",
        )?;
        resolved.checked()
    }

    fn checked(&self) -> Result<Config, String> {
        let l = &self.limits;
        if l.max_message_bytes < 64 {
            return Err("--max-message-bytes must be at least 64".into());
        }
        if l.queue_bytes < l.max_message_bytes {
            return Err("--queue-bytes must be at least --max-message-bytes, or one message could never be queued".into());
        }
        if !(l.publish_rate > 0.0 && l.publish_rate.is_finite()) {
            return Err("--publish-rate must be a positive number".into());
        }
        if !(l.client_ops_per_sec > 0.0 && l.client_ops_per_sec.is_finite())
            || l.client_ops_burst == 0
        {
            return Err(
                "--client-ops-per-sec must be a positive number and --client-ops-burst at least 1"
                    .into(),
            );
        }
        if !(1..=4096).contains(&l.plugin_memory_mib)
            || !(1..=10_000).contains(&l.plugin_deadline_ms)
            || !(1..=256).contains(&l.plugin_max_mib)
        {
            return Err("--plugin-memory-mib (1-4096), --plugin-deadline-ms (1-10000) and --plugin-max-mib (1-256) are out of range".into());
        }
        if !(1..=16).contains(&l.plugin_threads) || l.plugin_queue > 10_000 {
            return Err(
                "--plugin-threads must be between 1 and 16 and --plugin-queue at most 10000".into(),
            );
        }
        if self.socket_send_buffer != 0 && self.socket_send_buffer < 4096 {
            return Err(
                "--socket-send-buffer must be 0 (kernel autotuning) or at least 4096".into(),
            );
        }
        if self.max_pending_connections == 0 || !(1..=300).contains(&self.head_timeout_secs) {
            return Err("--max-pending-connections must be at least 1 and --head-timeout-secs between 1 and 300".into());
        }
        if self.heartbeat_secs == 0 {
            return Err("--heartbeat-secs must be at least 1".into());
        }
        if let Some(t) = &self.admin_token {
            if t.len() < 16 {
                return Err("--admin-token must be at least 16 characters".into());
            }
        }
        if self.metrics_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err("--metrics-token must be at least 16 characters".into());
        }
        if self.database_url.is_some() && self.admin_token.is_none() {
            return Err("--admin-token is required with --database-url (it is generated only for the embedded SQLite default)".into());
        }
        let cluster = if self.cluster {
            let postgres = self
                .database_url
                .as_deref()
                .is_some_and(|u| u.starts_with("postgres:") || u.starts_with("postgresql:"));
            if !postgres {
                return Err("--cluster needs a Postgres registry (--database-url postgres://…) that every node shares".into());
            }
            if self.reconcile_secs == 0 || self.cluster_log_retention_secs == 0 {
                return Err(
                    "--reconcile-secs and --cluster-log-retention-secs must be at least 1".into(),
                );
            }
            let prefix_ok = !self.cluster_kafka_prefix.is_empty()
                && self.cluster_kafka_prefix.len() <= 180
                && self
                    .cluster_kafka_prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !prefix_ok {
                return Err(
                    "--cluster-kafka-prefix must be 1-180 characters of a-z A-Z 0-9 . _ -".into(),
                );
            }
            Some(ClusterConfig {
                reconcile: Duration::from_secs(self.reconcile_secs),
                log_retention: Duration::from_secs(self.cluster_log_retention_secs),
                kafka: self.cluster_kafka.clone().map(|brokers| ClusterKafka {
                    brokers,
                    prefix: self.cluster_kafka_prefix.clone(),
                }),
            })
        } else {
            if self.cluster_kafka.is_some() {
                return Err("--cluster-kafka needs --cluster".into());
            }
            None
        };
        let config = Config {
            cluster,
            advertise: self.advertise.clone(),
            echo_tenant: self.echo_tenant.clone(),
            data_dir: self.data_dir.clone(),
            compiled_dir: None,
            admin_listen: self.admin_listen,
            database_url: self.database_url.clone(),
            admin_token: self.admin_token.clone(),
            metrics_token: self.metrics_token.clone(),
            demo_tenant: self.demo,
            tls: self.tls_cert.clone().zip(self.tls_key.clone()),
            demo_interval: (self.demo && self.demo_interval_ms > 0)
                .then(|| Duration::from_millis(self.demo_interval_ms)),
            max_connections: self.max_connections,
            memory_budget_bytes: match self.memory_budget_mib {
                Some(0) => None,
                Some(m) => Some(m * 1024 * 1024),
                None => crate::cgroup::memory_limit().map(crate::cgroup::budget),
            },
            max_pending_connections: self.max_pending_connections,
            max_pending_per_address: self
                .max_pending_per_address
                .unwrap_or(self.max_pending_connections / 2),
            head_timeout: Duration::from_secs(self.head_timeout_secs),
            max_connection_age: MAX_CONNECTION_AGE,
            heartbeat: Duration::from_secs(self.heartbeat_secs),
            node_id: match &self.node_id {
                Some(n) if !n.trim().is_empty() => n.trim().to_string(),
                Some(_) => return Err("--node-id must not be empty".into()),
                None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "herald".into()),
            },
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            drain: Drain {
                wait: Duration::from_secs(self.drain_wait_secs),
                spread: Duration::from_secs(self.drain_spread_secs),
            },
            socket_send_buffer: (self.socket_send_buffer > 0).then_some(self.socket_send_buffer),
            limits: TenantLimits {
                max_connections: l.tenant_max_connections,
                connection_share_percent: None,
                max_connections_per_address: None,
                max_subscriptions: l.max_subscriptions,
                max_message_bytes: l.max_message_bytes,
                queue_bytes: l.queue_bytes,
                slow_consumer: l.slow_consumer,
                publish_rate: l.publish_rate,
                publish_burst: l.publish_burst,
                history_size: l.history_size,
                history_ttl_ms: l.history_ttl_secs * 1000,
                history_bytes: l.history_bytes,
                history_total_bytes: l.tenant_history_mib << 20,
                max_channels: l.max_channels,
                conflation_max_bytes: l.conflation_max_mib << 20,
                memory_share_percent: l.memory_share_percent,
                plugin_memory_bytes: l.plugin_memory_mib << 20,
                plugin_deadline_ms: l.plugin_deadline_ms,
                plugin_max_bytes: l.plugin_max_mib << 20,
                plugin_threads: l.plugin_threads,
                plugin_queue: l.plugin_queue,
                client_ops_per_sec: l.client_ops_per_sec,
                client_ops_burst: l.client_ops_burst,
                deflate_min_bytes: l.deflate_min_bytes,
            },
        };
        // The defaults must pass the checks a tenant's overrides pass.
        crate::tenant::LimitOverrides::default()
            .apply(&config.limits)
            .map_err(|e| format!("the command line's limits do not work together: {e}"))?;
        Ok(config)
    }
}

impl Config {
    /// The front door's part.
    pub fn server_settings(&self) -> crate::server::ServerSettings {
        crate::server::ServerSettings {
            head_timeout: self.head_timeout,
            max_connection_age: self.max_connection_age,
            heartbeat: self.heartbeat,
            socket_send_buffer: self.socket_send_buffer,
            max_pending_connections: self.max_pending_connections,
            max_pending_per_address: self.max_pending_per_address,
            echo_tenant: self.echo_tenant.clone(),
        }
    }

    /// A configuration for tests and embedding: SQLite in `data_dir`, defaults
    /// as the command line would give them.
    pub fn for_data_dir(data_dir: impl Into<PathBuf>) -> Config {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        let Serve { args } = clap::Parser::parse_from(["herald"]);
        let mut c = args.to_config().expect("defaults are valid");
        c.data_dir = data_dir.into();
        c
    }
}

#[cfg(test)]
mod tests;
