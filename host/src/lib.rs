//! Herald: a multi-tenant real-time push server.
//!
//! The server is a library; `main.rs` only parses flags and wires signals.
//! [`run`] is the one entry point: tests call it with a port-0 listener and
//! their own shutdown future. See ARCHITECTURE.md for the code map.

// The layers below the host (ARCHITECTURE.md, "Layers") are crates of their
// own, so that nothing in them can name anything up here; re-exported under
// the module names the host and its tests use.
pub use herald_base::{clock, metrics, ratelimit, secret};
pub use herald_fanout as fanout;
pub use herald_plugin as plugin;
pub use herald_proto as proto;

pub mod api;
mod cgroup;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod demo;
#[cfg(test)]
mod fuzz;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
pub mod ingest;
pub mod node;
pub mod plugin_host;
pub mod publish;
pub mod reconcile;
pub mod registry;
pub mod server;
pub mod source;
pub mod tenant;
pub mod watch;

use anyhow::Context as _;
use clock::now_ms;
use config::Config;
use node::{Node, NodeParts};
use registry::{Backend, Registry};
use secret::key_digest;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tenant::Capacity;
use tokio::net::TcpListener;

/// File descriptors kept back from the session capacity for the registry,
/// logs, the listener and accepting-to-refuse over-capacity clients.
const FD_RESERVE: u64 = 100;

/// Of those, the ones no client socket may take (sessions and doors
/// together stop here): the registry pool, Kafka's broker connections,
/// the outbox and cluster listeners, log files, epoll.
const FD_INTERNAL: u64 = 50;

/// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the soft limit
/// now in force. Call once at process start.
pub fn raise_nofile_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// Binds the listener with an explicit backlog (and SO_REUSEPORT when asked).
pub fn bind(addr: SocketAddr, backlog: u32, reuse_port: bool) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    TcpListener::from_std(socket.into())
}

/// Connection capacity allowed by the open-files limit now in force.
fn fd_capacity() -> usize {
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((1024, 1024));
    soft.saturating_sub(FD_RESERVE).max(1) as usize
}

/// Client sockets of both kinds (sessions and doors) the open-files limit allows.
fn fd_sockets() -> usize {
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((1024, 1024));
    soft.saturating_sub(FD_INTERNAL).max(2) as usize
}

async fn resolve_admin_token(config: &Config, registry: &Registry) -> anyhow::Result<[u8; 32]> {
    if let Some(t) = &config.admin_token {
        return Ok(key_digest(t));
    }
    if registry.backend() != Backend::Sqlite {
        anyhow::bail!("--admin-token is required with a shared registry");
    }
    if let Some(stored) = registry.get_setting("admin_token_sha256").await? {
        let mut d = [0u8; 32];
        for (i, chunk) in stored.as_bytes().chunks(2).enumerate().take(32) {
            d[i] = u8::from_str_radix(std::str::from_utf8(chunk)?, 16)
                .context("stored admin token digest")?;
        }
        tracing::info!(
            "admin token: the one printed at first start (pass --admin-token to replace it)"
        );
        return Ok(d);
    }
    let token = secret::new_secret("adm_");
    let digest = key_digest(&token);
    registry
        .put_setting("admin_token_sha256", &secret::hex(&digest))
        .await?;
    // Printed once, on stdout, like a generated password; only its digest is stored.
    println!("herald: generated admin token (shown once, keep it): {token}");
    Ok(digest)
}

/// The process's resident memory, from `VmRSS` (in kB whatever the page
/// size: 4 KiB here, 16 or 64 KiB on some arm64 kernels, where counting
/// `statm` pages as 4 KiB read a quarter of the truth or less).
fn read_rss_bytes() -> Option<u64> {
    vm_rss_bytes(&std::fs::read_to_string("/proc/self/status").ok()?)
}

fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(n * 1024),
        _ => None,
    }
}

/// Runs the server on `listener` until `shutdown` resolves, then drains.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let metrics_handle = metrics::install();
    let registry = Registry::open(config.database_url.as_deref(), &config.data_dir)
        .await
        .context("opening the registry")?;
    let admin = resolve_admin_token(&config, &registry).await?;
    let tls = match &config.tls {
        Some((cert, key)) => Some(server::tls::load(cert, key)?),
        None => None,
    };
    // A TLS session holds three sockets: the client's and both ends of its
    // bridge (server/tls.rs).
    let per_session = if tls.is_some() { 3 } else { 1 };
    let fd_cap = fd_capacity() / per_session;
    let max = match config.max_connections {
        Some(m) if m > fd_cap => {
            tracing::warn!(
                requested = m,
                allowed = fd_cap,
                "--max-connections exceeds what the open-files limit allows; capped"
            );
            fd_cap
        }
        Some(m) => m,
        None => fd_cap,
    };
    metrics::set_capacity(max);
    // Compiled components survive restarts beside the registry's data.
    let compiled =
        (config.compiled_dir.clone()).unwrap_or_else(|| config.data_dir.join("compiled"));
    let plugins =
        plugin::Runtime::with_artifacts(Some(compiled)).context("starting the plugin runtime")?;
    let cluster = match (&config.cluster, config.database_url.as_deref()) {
        (Some(c), Some(url)) => Some(
            cluster::Cluster::connect(url, c.clone())
                .await
                .context("connecting to the registry for cluster mode")?,
        ),
        _ => None,
    };
    let pending = config.max_pending_connections;
    let per_address = config.max_pending_per_address;
    let app = Arc::new(Node::new(NodeParts {
        node_id: config.node_id.clone(),
        defaults: config.limits.clone(),
        memory_budget: config.memory_budget_bytes,
        registry,
        capacity: Capacity::with_limits(max, pending, fd_sockets() / per_session, per_address),
        runtime: plugins,
        cluster,
    }));
    // Every tenant and its source, as the registry has them; plugins are
    // loaded once the server listens (`PluginHost::load_deferred`).
    app.plugins
        .starting
        .store(true, std::sync::atomic::Ordering::Release);
    let reconciled = reconcile::all(&app).await.context("loading tenants");
    app.plugins
        .starting
        .store(false, std::sync::atomic::Ordering::Release);
    reconciled?;
    if config.demo_tenant {
        if let Some(key) = demo::ensure_tenant(&app)
            .await
            .context("creating the demo tenant")?
        {
            reconcile::tenant(&app, "demo")
                .await
                .context("loading the demo tenant")?;
            println!("herald: created public tenant \"demo\"; its publish key (shown once): {key}");
        }
        if let Some(every) = config.demo_interval {
            app.tracker.spawn(demo::publish(app.clone(), every));
        }
    }
    let addr = listener.local_addr()?;
    let loaded = app.tenants.all().len();
    tracing::info!(%addr, tenants = loaded, connection_capacity = max, node = %app.node_id, cluster = app.cluster.is_some(), "herald listening");

    let watchers = tokio_util::task::TaskTracker::new();
    let advertised = config.advertise.clone().unwrap_or_else(|| addr.to_string());
    watch::spawn(&app, &watchers, advertised);
    watchers.spawn(watch_memory(app.clone()));
    watchers.spawn(sweep_channels(app.clone()));
    watchers.spawn(flush_conflation(app.clone()));
    watchers.spawn(release_lagging(app.clone()));
    watchers.spawn(beat_sessions(app.clone(), config.heartbeat));

    let api = Arc::new(api::Api {
        node: app.clone(),
        settings: api::ApiSettings {
            admin_token_sha256: admin,
            metrics_token: config.metrics_token.clone(),
            metrics: metrics_handle,
            admin_listen: config.admin_listen.is_some(),
            demo_tenant: config.demo_tenant,
        },
    });
    let front = Arc::new(server::Server {
        node: app.clone(),
        settings: config.server_settings(),
    });
    if let Some(admin_addr) = config.admin_listen {
        // The operators' door: its own listener and tasks, outside the
        // client doors' count, so a flood of client sockets cannot keep the
        // admin API from answering. Closed with the rest at shutdown.
        let l = TcpListener::bind(admin_addr)
            .await
            .with_context(|| format!("--admin-listen {admin_addr}"))?;
        tracing::info!(addr = %admin_addr, "admin API listening");
        let (router, stop) = (api::admin_router(api.clone()), app.shutdown.clone());
        app.tracker.spawn(async move {
            let _ = axum::serve(l, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
    }
    let router = api::router(api);
    let accept = match tls {
        Some(tls) => {
            let bridge = server::tls::start(&front, listener, tls).context("starting TLS")?;
            tokio::spawn(server::accept_tls(front.clone(), bridge, router))
        }
        None => tokio::spawn(server::accept_loop(front.clone(), listener, router)),
    };
    // Listening: each tenant serves as soon as its plugin is loaded (from
    // the compiled-component cache on disk, or compiled), and says
    // `plugin_loading` until then. Ready once all are.
    // A stop asked for meanwhile is not kept waiting for a compile.
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        _ = app.plugins.load_deferred(&app.registry, &app.tenants) => {
            app.set_ready(true);
            shutdown.as_mut().await;
        }
        _ = shutdown.as_mut() => {}
    }
    app.set_ready(false);
    let drain = config.drain;
    if !drain.wait.is_zero() {
        tracing::info!(
            wait_secs = drain.wait.as_secs(),
            "draining: not ready, still serving while the load balancer takes this node out"
        );
        tokio::time::sleep(drain.wait).await;
    }
    app.accepting.cancel();
    let _ = accept.await;
    if !drain.spread.is_zero() {
        close_spread(&app, drain.spread).await;
    }
    tracing::info!("shutting down: closing sessions");
    // Every source reader stops here (their tokens are children).
    app.shutdown.cancel();
    // Readers finish their batch and store their positions; then every
    // conflation window is closed, so what it held reaches the sessions,
    // which send their queues before they close with 1001.
    source::stopped_all(&app.sources).await;
    for t in app.tenants.all() {
        ingest::flush_final(&t);
        t.sessions
            .close_all(fanout::session::QueueClose::GoingAway, true);
    }
    app.tracker.close();
    let grace = config.shutdown_grace;
    if tokio::time::timeout(grace, app.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            remaining = app.tracker.len(),
            "sessions still open at the shutdown deadline; dropping them"
        );
    }
    watchers.close();
    watchers.wait().await;
    app.registry.close().await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// Closes every session (close 1012) evenly over `spread`, sources still
/// running, so clients reconnect to other nodes a few at a time and resume.
async fn close_spread(app: &Node, spread: Duration) {
    let sessions: Vec<_> = app
        .tenants
        .all()
        .iter()
        .flat_map(|t| t.sessions.handles())
        .collect();
    tracing::info!(
        sessions = sessions.len(),
        spread_secs = spread.as_secs(),
        "draining: closing sessions gradually"
    );
    // Step k closes the sessions up to n × (k + 1) / steps: evenly spread
    // whether there are fewer sessions than steps or many more.
    const STEP: Duration = Duration::from_millis(50);
    let steps = (spread.as_millis() / STEP.as_millis()).max(1) as usize;
    let n = sessions.len();
    let mut closed = 0;
    let mut tick = tokio::time::interval(spread / steps as u32);
    for k in 0..steps {
        tick.tick().await;
        let upto = n * (k + 1) / steps;
        for s in &sessions[closed..upto] {
            s.close_with(fanout::session::QueueClose::Draining);
        }
        closed = upto;
    }
}

/// Reads RSS four times a second (a read of /proc/self/status costs
/// microseconds); admission adds what it admitted since (`MemoryGauge`).
async fn watch_memory(app: Arc<Node>) {
    if let Some(budget) = app.memory_budget {
        tracing::info!(
            budget_mib = budget >> 20,
            "memory budget: new connections are refused near it (--memory-budget-mib, else nine tenths of the cgroup's limit)"
        );
    }
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(rss) = read_rss_bytes() else {
            continue;
        };
        metrics::set_rss(rss);
        app.memory.reading(rss);
        if let Some(budget) = app.memory_budget {
            let over = rss >= budget / 100 * 95;
            // Whose memory it is, before saying the process is near the
            // budget: one tenant's burst refuses its own clients only.
            let mut blamed = false;
            for t in app.tenants.all() {
                let share = budget / 100 * u64::from(t.settings().limits.memory_share_percent);
                let past = over && t.accounted_bytes() as u64 > share;
                if past != t.over_share() {
                    if past {
                        tracing::warn!(tenant = %t.id, share, "tenant past its share of the memory budget: refusing its new connections");
                    }
                    t.set_over_share(past);
                }
                blamed |= past;
            }
            app.set_memory_blamed(blamed);
            if over != app.over_memory() {
                if over {
                    tracing::warn!(
                        rss,
                        budget,
                        "near the memory budget: refusing new connections"
                    );
                } else {
                    tracing::info!(
                        rss,
                        budget,
                        "back under the memory budget: accepting connections"
                    );
                }
                app.set_over_memory(over);
            }
        }
    }
}

/// Runs `each` on every tenant every `period` until shutdown (a late tick
/// is taken late, not doubled up), with the tick's number.
async fn every_tenant(
    app: Arc<Node>,
    period: Duration,
    mut each: impl FnMut(&tenant::Tenant, u64),
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0.. {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        for t in app.tenants.all() {
            each(&t, n);
        }
    }
}

/// A heartbeat is beaten in this many parts, evenly spread over it.
const HEARTBEAT_PARTS: u64 = 16;

/// The heartbeat of every session on the node: once per `heartbeat`, each
/// WebSocket client is pinged, or closed with 4002 if it sent nothing for
/// two heartbeats, and each SSE stream gets a comment
/// (`SessionHandle::beat`). One timer for all sessions instead of one
/// each: a waiting session is its state alone. A session registered just
/// after its part's turn waits up to a heartbeat for its first beat, so a
/// silent client is closed between two and three heartbeats after it last
/// sent something.
async fn beat_sessions(app: Arc<Node>, heartbeat: Duration) {
    let silent_ms = (heartbeat * 2).as_millis() as u64;
    let period = (heartbeat / HEARTBEAT_PARTS as u32).max(Duration::from_millis(1));
    every_tenant(app, period, move |t, n| {
        let part = (n % HEARTBEAT_PARTS) as usize;
        t.sessions
            .beat(part, HEARTBEAT_PARTS as usize, clock::mono_ms(), silent_ms);
    })
    .await
}

async fn sweep_channels(app: Arc<Node>) {
    every_tenant(app, Duration::from_secs(10), |t, _| {
        t.hub.sweep(t.settings().limits.history(), now_ms() as u64);
    })
    .await
}

/// Wakes the writers that hold off for lagging readers, all tenants at
/// once, every `LAG_PACE`: such a reader gets what queued meanwhile in one
/// write (`session/writer.rs`, `Hold`).
async fn release_lagging(app: Arc<Node>) {
    every_tenant(app, server::session::LAG_PACE, |t, _| {
        t.sessions.release_held();
    })
    .await
}

/// Closes each tenant's conflation window on time: one timer for all
/// tenants, which never blocks on one of them.
async fn flush_conflation(app: Arc<Node>) {
    // Never waits for a tenant's window: a batch holding it (a slow merge
    // on that tenant's plugin threads) delays that tenant's flush by a
    // tick, nobody else's.
    every_tenant(app, Duration::from_millis(5), |t, _| {
        let window = t.settings().conflation.window_ms;
        if window == 0 && t.conflator.try_lock().is_some_and(|c| c.is_empty()) {
            return;
        }
        let due = t.last_flush.lock().elapsed() >= Duration::from_millis(window);
        if due && ingest::try_flush(t).is_some() {
            *t.last_flush.lock() = std::time::Instant::now();
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn rss_is_read_in_bytes_from_vm_rss() {
        let status = "Name:\therald\nVmPeak:\t  200000 kB\nVmRSS:\t   48600 kB\nThreads:\t4\n";
        assert_eq!(super::vm_rss_bytes(status), Some(48_600 * 1024));
        assert_eq!(super::vm_rss_bytes("VmRSS:\t12 MB\n"), None);
        assert_eq!(super::vm_rss_bytes("Name: x\n"), None);
        assert!(super::read_rss_bytes().is_some_and(|b| b > 1 << 20));
    }
}
