//! `bench connect`: how fast clients get in, and how a crowd gets back.
//!
//! Owns two measurements. Rate: new WebSocket connections per second (each
//! closed after its 101) to a public tenant and to a tenant whose jwt-auth
//! plugin checks every connect, with the server's and the load generator's
//! CPU per connection (the load generator shares the cores; a run where it
//! used more CPU than the server is flagged). Storm: N subscribed clients
//! (spread over worker processes) all drop their connection at the same
//! instant and reconnect with backoff; the time until every one is back and
//! subscribed, per-client reconnect times, and failed attempts by reason —
//! for Herald and for each `--peers` server.

use crate::client::Transport;
use crate::fanout::start;
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec};
use crate::procs;
use crate::report::{fmt_int, fmt_ms, fmt_ratio, ratio, verdict};
use crate::target::{Kind, Peer, Target};
use anyhow::bail;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// New connections per second with plugin authorization.
pub const TARGET_CONNECTS_PER_SEC: f64 = 20_000.0;

#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Connections opened per tenant in the rate test.
    #[arg(long, default_value_t = 20_000)]
    pub connects: usize,
    /// Handshakes in flight at once in the rate test.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Clients in the reconnect storm (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub storm: usize,
    /// Longest wait for the storm's clients to be back.
    #[arg(long, default_value_t = 60.0)]
    pub storm_timeout_secs: f64,
    /// Peers that go through the same storm.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub peers: Vec<Peer>,
    /// Directory holding the built plugin components (jwt_auth.wasm).
    #[arg(long, default_value_os_t = crate::plugin::default_plugins())]
    pub plugins: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One tenant's connection rate.
#[derive(Debug)]
struct Rate {
    per_sec: f64,
    failed: usize,
    server_cpu_us: f64,
    loadgen_cpu_us: f64,
}

impl Rate {
    fn json(&self) -> serde_json::Value {
        json!({
            "per_sec": self.per_sec,
            "failed": self.failed,
            "server_cpu_us_per_conn": self.server_cpu_us,
            "loadgen_cpu_us_per_conn": self.loadgen_cpu_us,
            "loadgen_exceeds_server": self.loadgen_cpu_us > self.server_cpu_us,
        })
    }
}

pub async fn run(mut args: ConnectArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.connects = 50;
        args.storm = args.storm.min(50);
        args.storm_timeout_secs = args.storm_timeout_secs.min(20.0);
    }
    let deadline = Instant::now() + args.common.deadline();
    let target = Target::herald(&args.common.herald, &args.common.herald_args).await?;
    let jwt_path = crate::plugin::jwt_tenant(&target, &args.plugins).await?;
    println!(
        "connect: {} new WebSocket connections per tenant, {} in flight",
        fmt_int(args.connects as u64),
        args.concurrency
    );
    let public = rate(&target, "/v1/t/bench/ws".into(), &args).await?;
    print_rate("public tenant", &public);
    let jwt = rate(&target, jwt_path, &args).await?;
    print_rate("jwt-auth plugin", &jwt);
    println!(
        "  with plugin / without = {}; {:.0}/s with plugin auth (target ≥ {}: {})",
        fmt_ratio(ratio(jwt.per_sec, public.per_sec)),
        jwt.per_sec,
        fmt_int(TARGET_CONNECTS_PER_SEC as u64),
        verdict(Some(jwt.per_sec), TARGET_CONNECTS_PER_SEC, false)
    );
    drop(target);
    args.common.record(json!({
        "scenario": "connect",
        "server": "herald",
        "params": {"connects": args.connects, "concurrency": args.concurrency, "smoke": args.common.smoke, "herald_args": args.common.herald_args},
        "public": public.json(),
        "jwt": jwt.json(),
        "target_per_sec": TARGET_CONNECTS_PER_SEC,
    }))?;
    if public.failed + jwt.failed > 0 {
        bail!("{} handshakes failed", public.failed + jwt.failed);
    }

    if args.storm > 0 {
        let mut kinds = vec![Kind::Herald];
        kinds.extend(args.peers.iter().map(|p| p.kind()));
        for kind in kinds {
            storm(&args, kind, deadline).await?;
        }
    }
    if args.common.smoke {
        println!("smoke checks passed");
    }
    Ok(())
}

async fn rate(target: &Target, path: String, args: &ConnectArgs) -> anyhow::Result<Rate> {
    let me = std::process::id();
    let (s0, l0) = (target.cpu_secs()?, procs::cpu_secs(me)?);
    let (per_sec, failed) =
        crate::plugin::connect_rate(target.addr, path, args.connects, args.concurrency).await?;
    let (s1, l1) = (target.cpu_secs()?, procs::cpu_secs(me)?);
    let n = args.connects.max(1) as f64;
    Ok(Rate {
        per_sec,
        failed,
        server_cpu_us: (s1 - s0) * 1e6 / n,
        loadgen_cpu_us: (l1 - l0) * 1e6 / n,
    })
}

fn print_rate(name: &str, r: &Rate) {
    let flag = if r.loadgen_cpu_us > r.server_cpu_us {
        "  <-- FLAG: the load generator used more CPU than the server; the rate is the pair's, not the server's limit"
    } else {
        ""
    };
    println!(
        "  {name:<16} {:>8.0}/s  server CPU {:.1} us/conn, load generator {:.1} us/conn, failed {}{flag}",
        r.per_sec, r.server_cpu_us, r.loadgen_cpu_us, r.failed
    );
}

/// Time until `want` connections were back after the storm, polling the
/// pool; `None` on timeout. Also returns how many were back.
async fn wait_back(
    pool: &mut Pool,
    want: usize,
    timeout: Duration,
) -> anyhow::Result<(Option<f64>, usize)> {
    let t0 = Instant::now();
    let mut open = 0;
    while t0.elapsed() < timeout {
        open = pool.progress().await?.reconnected as usize;
        if open >= want {
            return Ok((Some(t0.elapsed().as_secs_f64()), open));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((None, open))
}

async fn storm(args: &ConnectArgs, kind: Kind, deadline: Instant) -> anyhow::Result<()> {
    let c: &CommonArgs = &args.common;
    let mut server = start(kind, c, None).await?;
    let left = deadline.saturating_duration_since(Instant::now());
    let spec = PoolSpec {
        connect_concurrency: c.connect_concurrency,
        ..PoolSpec::new(&server, Transport::Ws, left + Duration::from_secs(5))
    };
    let mut pool = Pool::spawn(&spec, args.storm, c.max_per_worker, c.workers)?;
    let ready = pool.ready(left).await?;
    if ready.connected < args.storm {
        bail!(
            "{}: only {} of {} storm clients connected before the storm: {:?}",
            kind.as_str(),
            ready.connected,
            args.storm,
            ready.first_error
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu0 = server.cpu_secs()?;
    pool.storm()?;
    let timeout = Duration::from_secs_f64(args.storm_timeout_secs).min(left);
    let (back_secs, open) = wait_back(&mut pool, ready.connected, timeout).await?;
    let cpu1 = server.cpu_secs()?;
    let (stats, _) = pool.stop().await?;
    server.check_alive()?;
    drop(server);
    let h = &stats.reconnect_us;
    println!(
        "storm {}: {} subscribed clients dropped at once; {} back {}",
        kind.as_str(),
        fmt_int(ready.connected as u64),
        fmt_int(open as u64),
        match back_secs {
            Some(s) => format!("after {:.2} s (all of them)", s),
            None => format!(
                "when {} s ran out (NOT all of them)",
                args.storm_timeout_secs
            ),
        }
    );
    println!(
        "  per client: p50 {}, p99 {}, max {}; server CPU {:.2} s; failed attempts by reason {:?}",
        fmt_ms(h.percentile(50.0)),
        fmt_ms(h.percentile(99.0)),
        fmt_ms((h.count() > 0).then(|| h.max())),
        cpu1 - cpu0,
        stats.failures
    );
    c.record(json!({
        "scenario": "connect-storm",
        "server": kind.as_str(),
        "params": {"clients": args.storm, "timeout_secs": args.storm_timeout_secs, "smoke": c.smoke, "herald_args": c.herald_args},
        "connected": ready.connected,
        "back": open,
        "all_back_secs": back_secs,
        "reconnect_us": {"p50": h.percentile(50.0), "p99": h.percentile(99.0), "max": (h.count() > 0).then(|| h.max())},
        "failures": stats.failures,
        "server_cpu_secs": cpu1 - cpu0,
    }))?;
    if back_secs.is_none() {
        bail!(
            "{}: only {open} of {} clients were back after the storm",
            kind.as_str(),
            ready.connected
        );
    }
    Ok(())
}
