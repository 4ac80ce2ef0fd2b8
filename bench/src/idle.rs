//! `bench idle`: memory per idle connection.
//!
//! Owns: for each requested connection count, a fresh Herald; its RSS before
//! any client connects and after N clients are connected, subscribed (one
//! channel each by default) and settled; KiB per connection against the
//! 3 KiB target and against peers measured elsewhere.

use crate::client::Transport;
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec};
use crate::report::{fmt_int, fmt_ratio, ratio, verdict};
use crate::target::{Target, TENANT};
use std::time::{Duration, Instant};

/// Herald's budget per idle connection.
pub const TARGET_KIB: f64 = 3.0;
/// Measured outside this bench (DESIGN/issue notes); printed for context only.
pub const PEERS_KIB: &[(&str, f64)] = &[
    ("Node ws", 6.6),
    ("nchan", 10.2),
    ("Python websockets", 15.5),
];

#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Connection counts, one fresh server each.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub conns: Vec<usize>,
    #[arg(long, value_enum, default_value_t = Transport::Ws)]
    pub transport: Transport,
    /// Distinct channels; connection i subscribes to channel i mod this.
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// Seconds to wait after the last subscription before reading RSS.
    #[arg(long, default_value_t = 2.0)]
    pub settle_secs: f64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// KiB per connection from RSS before and after, in KiB.
pub fn kib_per_conn(before_kib: u64, after_kib: u64, conns: usize) -> Option<f64> {
    (conns > 0).then(|| (after_kib as f64 - before_kib as f64) / conns as f64)
}

pub async fn run(mut args: IdleArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.conns = vec![50];
        args.settle_secs = args.settle_secs.min(0.5);
    }
    let deadline = Instant::now() + args.common.deadline();
    for &n in &args.conns {
        let left = deadline.saturating_duration_since(Instant::now());
        one(&args, n, left).await?;
    }
    Ok(())
}

async fn one(args: &IdleArgs, n: usize, left: Duration) -> anyhow::Result<()> {
    let c = &args.common;
    let server = Target::herald(&c.herald, &c.herald_args).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss0, _) = server.memory_kib()?;
    let spec = PoolSpec {
        target: server.addr,
        tenant: TENANT.into(),
        transport: args.transport,
        channels: args.channels,
        subs_per_conn: 1,
        connect_concurrency: c.connect_concurrency,
        deadline: left + Duration::from_secs(5),
    };
    let t0 = Instant::now();
    let mut pool = Pool::spawn(&spec, n, c.max_per_worker, c.workers)?;
    let ready = pool.ready(left).await?;
    let connect_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(args.settle_secs)).await;
    let (rss1, hwm) = server.memory_kib()?;
    let (progress_msgs, _, closed_early) = pool.progress().await?;
    let (stats, _) = pool.stop().await?;
    drop(server);

    let per = kib_per_conn(rss0, rss1, ready.connected);
    let vs_target = per.and_then(|p| ratio(p, TARGET_KIB));
    println!(
        "idle {} x{}: {} of {} connected+subscribed in {connect_secs:.1}s over {} worker(s); herald RSS {} -> {} KiB (peak {} KiB)",
        args.transport.as_str(),
        fmt_int(n as u64),
        fmt_int(ready.connected as u64),
        fmt_int(n as u64),
        pool.len(),
        fmt_int(rss0),
        fmt_int(rss1),
        fmt_int(hwm),
    );
    if let Some(e) = &ready.first_error {
        println!("  first connection error: {e}");
    }
    match per {
        Some(p) => {
            println!(
                "  {p:.2} KiB per connection = {} of the {TARGET_KIB} KiB target ({})",
                fmt_ratio(vs_target),
                verdict(per, TARGET_KIB, true)
            );
            let peers: Vec<String> = PEERS_KIB
                .iter()
                .map(|(name, kib)| {
                    format!(
                        "{name} {kib} KiB (= {} Herald's)",
                        fmt_ratio(ratio(*kib, p))
                    )
                })
                .collect();
            println!(
                "  reference, not measured in this run: {}",
                peers.join(", ")
            );
        }
        None => println!("  no connection was established; no per-connection figure"),
    }
    if closed_early > 0 || stats.closed_early > 0 {
        println!(
            "  WARNING: {} connection(s) closed by the server while idle",
            stats.closed_early.max(closed_early)
        );
    }
    let line = serde_json::json!({
        "scenario": "idle",
        "server": "herald",
        "params": {
            "conns": n,
            "transport": args.transport.as_str(),
            "channels": args.channels,
            "settle_secs": args.settle_secs,
            "workers": pool.len(),
            "smoke": c.smoke,
            "herald_args": c.herald_args,
        },
        "connected": ready.connected,
        "failed": ready.failed,
        "first_error": ready.first_error,
        "connect_secs": connect_secs,
        "rss_before_kib": rss0,
        "rss_after_kib": rss1,
        "rss_peak_kib": hwm,
        "kib_per_conn": per,
        "target_kib": TARGET_KIB,
        "ratio_to_target": vs_target,
        "closed_early": stats.closed_early,
        "msgs_while_idle": progress_msgs,
    });
    c.record(line)?;
    if ready.connected < n {
        anyhow::bail!(
            "only {} of {n} connections were established: {:?}",
            ready.connected,
            ready.first_error
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_connection_kib() {
        assert_eq!(kib_per_conn(10_000, 40_000, 10_000), Some(3.0));
        assert_eq!(kib_per_conn(10_000, 9_000, 1_000), Some(-1.0));
        assert_eq!(kib_per_conn(1, 2, 0), None);
    }
}
