//! `bench idle`: memory per idle connection, Herald beside its peers.
//!
//! Owns: for each requested connection count and each server (Herald, then
//! every `--peers` server), a fresh server; its RSS (summed over its
//! processes) and the kernel's slab before any client connects and after N
//! clients are connected, subscribed (one channel each by default) and
//! settled; KiB per connection against the 3 KiB target and the ratio of each
//! peer to Herald. `--processes K` spreads Herald's connections over K
//! processes sharing the port (SO_REUSEPORT), for counts beyond one process's
//! open-files limit. With several counts it draws memory against connections.

use crate::client::Transport;
use crate::fanout::start;
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec};
use crate::procs;
use crate::report::{fmt_int, fmt_ratio, ratio, verdict};
use crate::target::{Kind, Peer, Target};
use std::time::{Duration, Instant};

/// Herald's budget per idle connection.
pub const TARGET_KIB: f64 = 3.0;

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
    /// Herald processes sharing the port (SO_REUSEPORT) and one registry.
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Peers measured in the same run with the same clients.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub peers: Vec<Peer>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// KiB per connection from RSS before and after, in KiB.
pub fn kib_per_conn(before_kib: u64, after_kib: u64, conns: usize) -> Option<f64> {
    (conns > 0).then(|| (after_kib as f64 - before_kib as f64) / conns as f64)
}

/// One server at one connection count.
struct Measured {
    kind: Kind,
    conns: usize,
    connected: usize,
    per_conn_kib: Option<f64>,
    rss_after_kib: u64,
}

pub async fn run(mut args: IdleArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.conns = vec![20, 50];
        args.settle_secs = args.settle_secs.min(0.5);
    }
    if args.transport == Transport::Sse
        && (args.peers.contains(&Peer::Python) || args.peers.contains(&Peer::Uws))
    {
        anyhow::bail!("the Python and uWebSockets peers speak WebSocket only; use --transport ws");
    }
    let deadline = Instant::now() + args.common.deadline();
    let mut kinds = vec![Kind::Herald];
    kinds.extend(args.peers.iter().map(|p| p.kind()));
    let mut all = Vec::new();
    for &n in &args.conns {
        let mut herald_kib = None;
        for &kind in &kinds {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = one(&args, kind, n, left, herald_kib).await?;
            if kind == Kind::Herald {
                herald_kib = m.per_conn_kib;
            }
            all.push(m);
        }
    }
    if args.conns.len() > 1 {
        let path = crate::report::plot_path(&args.common, "idle-memory");
        let series = kinds
            .iter()
            .map(|k| crate::plot::Series {
                name: k.as_str().into(),
                points: all
                    .iter()
                    .filter(|m| m.kind == *k)
                    .map(|m| (m.conns as f64, m.rss_after_kib as f64 / 1024.0))
                    .collect(),
            })
            .collect();
        crate::plot::draw(
            &crate::plot::Chart {
                title: format!("memory with idle {} connections", args.transport.as_str()),
                x_label: "idle connections".into(),
                y_label: "server RSS (MiB)".into(),
                log_x: true,
                log_y: true,
                series,
            },
            &path,
        )?;
        crate::report::show_plot(&args.common, &path);
    }
    // A peer that holds fewer connections has shown its limit (reported
    // above); Herald holding fewer is a failure.
    for m in all.iter().filter(|m| m.kind == Kind::Herald) {
        if m.connected < m.conns {
            anyhow::bail!(
                "{}: only {} of {} connections were established",
                m.kind.as_str(),
                m.connected,
                m.conns
            );
        }
    }
    Ok(())
}

async fn one(
    args: &IdleArgs,
    kind: Kind,
    n: usize,
    left: Duration,
    herald_kib: Option<f64>,
) -> anyhow::Result<Measured> {
    let c = &args.common;
    let mut server = match kind {
        Kind::Herald => Target::herald_processes(&c.herald, &c.herald_args, args.processes).await?,
        other => start(other, c, None).await?,
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss0, _) = server.memory_kib()?;
    let slab0 = procs::slab_kib()?;
    let spec = PoolSpec {
        channels: args.channels,
        connect_concurrency: c.connect_concurrency,
        ..PoolSpec::new(&server, args.transport, left + Duration::from_secs(5))
    };
    let t0 = Instant::now();
    let mut pool = Pool::spawn(&spec, n, c.max_per_worker, c.workers)?;
    let ready = pool.ready(left).await?;
    let connect_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(args.settle_secs)).await;
    let (rss1, hwm) = server.memory_kib()?;
    let slab1 = procs::slab_kib()?;
    let p = pool.progress().await?;
    let (stats, _) = pool.stop().await?;
    server.check_alive()?;
    let processes = server.processes();
    drop(server);

    let name = kind.as_str();
    let per = kib_per_conn(rss0, rss1, ready.connected);
    let slab_per = kib_per_conn(slab0, slab1, ready.connected);
    let vs_target = per.and_then(|p| ratio(p, TARGET_KIB));
    println!(
        "idle {} x{} {name}{}: {} of {} connected+subscribed in {connect_secs:.1}s over {} worker(s); RSS {} -> {} KiB (peak {} KiB); kernel slab {} -> {} KiB",
        args.transport.as_str(),
        fmt_int(n as u64),
        if processes > 1 { format!(" ({processes} processes, SO_REUSEPORT)") } else { String::new() },
        fmt_int(ready.connected as u64),
        fmt_int(n as u64),
        pool.len(),
        fmt_int(rss0),
        fmt_int(rss1),
        fmt_int(hwm),
        fmt_int(slab0),
        fmt_int(slab1),
    );
    if let Some(e) = &ready.first_error {
        println!("  first connection error: {e}");
    }
    let vs_herald = match (kind, per, herald_kib) {
        (Kind::Herald, _, _) => None,
        (_, Some(p), Some(h)) => ratio(p, h),
        _ => None,
    };
    match per {
        Some(p) if kind == Kind::Herald => println!(
            "  {p:.2} KiB per connection = {} of the {TARGET_KIB} KiB target ({}); kernel slab {:.2} KiB per connection (client and server sockets both count: loopback)",
            fmt_ratio(vs_target),
            verdict(per, TARGET_KIB, true),
            slab_per.unwrap_or(f64::NAN),
        ),
        Some(p) => println!(
            "  {p:.2} KiB per connection = {} Herald's; kernel slab {:.2} KiB per connection",
            fmt_ratio(vs_herald),
            slab_per.unwrap_or(f64::NAN),
        ),
        None => println!("  no connection was established; no per-connection figure"),
    }
    if p.closed_early > 0 || stats.closed_early > 0 {
        println!(
            "  WARNING: {} connection(s) closed by the server while idle",
            stats.closed_early.max(p.closed_early)
        );
    }
    let line = serde_json::json!({
        "scenario": "idle",
        "server": name,
        "params": {
            "conns": n,
            "transport": args.transport.as_str(),
            "channels": args.channels,
            "settle_secs": args.settle_secs,
            "workers": pool.len(),
            "processes": processes,
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
        "slab_before_kib": slab0,
        "slab_after_kib": slab1,
        "slab_kib_per_conn": slab_per,
        "target_kib": TARGET_KIB,
        "ratio_to_target": vs_target,
        "ratio_to_herald": vs_herald,
        "closed_early": stats.closed_early,
        "msgs_while_idle": p.msgs,
    });
    c.record(line)?;
    Ok(Measured {
        kind,
        conns: n,
        connected: ready.connected,
        per_conn_kib: per,
        rss_after_kib: rss1,
    })
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
