//! `bench slow`: healthy clients beside clients that stopped reading.
//!
//! Owns: for each server (Herald, then every `--peers` server), `--rounds`
//! rounds of phases on one server process: N healthy clients alone, then with
//! each `--slow` count of clients that subscribe and never read (with the
//! kernel's default receive buffer, as an ordinary client that stalls has,
//! unless `--slow-rcvbuf` asks for a smaller one). Each phase publishes the
//! same schedule on one channel and measures the healthy clients'
//! publish→receive latency; the verdict is how far the healthy p99 moved from
//! the phase without slow clients of the same round (target ≤ 10 ms in every
//! round), beside the server's RSS after each phase and its peak (the memory
//! bound), and what happened to the slow clients (closed by the server, with
//! which code). Later rounds run on a server that has already held and shed
//! stalled clients.

use crate::client::Transport;
use crate::fanout::{drain, publish_plan, start, Plan};
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec};
use crate::report::{fmt_int, fmt_ms, verdict};
use crate::target::{Kind, Peer, Target};
use crate::track::Stats;
use anyhow::bail;
use serde_json::json;
use std::time::{Duration, Instant};

/// How far the healthy clients' p99 may move when slow clients join.
pub const TARGET_P99_SHIFT_MS: f64 = 10.0;

#[derive(Debug, Clone, clap::Args)]
pub struct SlowArgs {
    /// Clients that keep reading.
    #[arg(long, default_value_t = 1000)]
    pub healthy: usize,
    /// Counts of clients that stop reading, one phase each (after a phase with none).
    #[arg(long, value_delimiter = ',', default_value = "25,1000")]
    pub slow: Vec<usize>,
    /// Messages per second on the one channel.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Payload size: large enough that the non-readers' buffers fill.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Seconds of publishing per phase.
    #[arg(long, default_value_t = 10.0)]
    pub phase_secs: f64,
    /// Rounds of phases (no slow clients, then each `--slow` count) on the
    /// same server process.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// SO_RCVBUF of the clients that stop reading (default: the kernel's,
    /// 128 KiB here; 4096 makes them push back after kilobytes).
    #[arg(long)]
    pub slow_rcvbuf: Option<u32>,
    /// Peers run through the same phases.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub peers: Vec<Peer>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One phase's figures.
#[derive(Debug)]
struct Phase {
    round: usize,
    slow: usize,
    healthy_connected: usize,
    slow_connected: usize,
    published: u64,
    healthy: Stats,
    expected: u64,
    drained: bool,
    slow_stats: Stats,
    rss_kib: u64,
    server_cpu: f64,
    /// The kernel's TCP buffer memory at the end of the phase (all sockets).
    tcp_kib: u64,
}

impl Phase {
    fn p99_us(&self) -> Option<u64> {
        self.healthy.latency_us.percentile(99.0)
    }
}

/// Healthy p99 shift of a phase against the phase without slow clients, in ms.
pub fn p99_shift_ms(base_us: Option<u64>, with_us: Option<u64>) -> Option<f64> {
    Some((with_us? as f64 - base_us? as f64) / 1000.0)
}

pub async fn run(mut args: SlowArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.healthy = 20;
        args.slow = vec![5];
        args.phase_secs = 1.0;
        args.payload_bytes = 4096;
        args.rate = 50.0;
        args.rounds = 1;
    }
    if !(args.rate.is_finite() && args.rate > 0.0)
        || args.phase_secs <= 0.0
        || args.healthy == 0
        || args.rounds == 0
    {
        bail!("--rate, --phase-secs, --healthy and --rounds must be positive");
    }
    let deadline = Instant::now() + args.common.deadline();
    let mut kinds = vec![Kind::Herald];
    kinds.extend(args.peers.iter().map(|p| p.kind()));
    println!(
        "slow: {} healthy clients; {} round(s) of phases with {:?} clients that stop reading (receive buffer {}); {} msg/s of {} B on one channel for {} s per phase",
        args.healthy,
        args.rounds,
        args.slow,
        args.slow_rcvbuf
            .map_or("the kernel's default".to_string(), |b| format!("{b} B")),
        args.rate,
        args.payload_bytes,
        args.phase_secs
    );
    for kind in kinds {
        let mut server = start(kind, &args.common, None).await?;
        let mut phases: Vec<Phase> = Vec::new();
        for round in 0..args.rounds {
            let first = phases.len();
            for slow in std::iter::once(0).chain(args.slow.iter().copied()) {
                let p = phase(&args, &server, round, slow, deadline).await?;
                print_phase(kind, &p, phases.get(first));
                phases.push(p);
            }
        }
        print_verdict(kind, &phases);
        server.check_alive()?;
        let (_, peak) = server.memory_kib()?;
        println!(
            "  {} peak RSS {} KiB over all phases",
            kind.as_str(),
            fmt_int(peak)
        );
        record(&args.common, &args, kind, &phases, peak)?;
        if args.common.smoke {
            smoke_check(kind, &phases)?;
        }
    }
    if args.common.smoke {
        println!("smoke checks passed");
    }
    Ok(())
}

async fn phase(
    args: &SlowArgs,
    server: &Target,
    round: usize,
    slow: usize,
    deadline: Instant,
) -> anyhow::Result<Phase> {
    let c = &args.common;
    let left = deadline.saturating_duration_since(Instant::now());
    let base = PoolSpec {
        connect_concurrency: c.connect_concurrency,
        ..PoolSpec::new(server, Transport::Ws, left + Duration::from_secs(5))
    };
    let mut healthy = Pool::spawn(&base, args.healthy, c.max_per_worker, c.workers)?;
    let hr = healthy.ready(left).await?;
    let (mut slow_pool, slow_connected) = if slow > 0 {
        let spec = PoolSpec {
            no_read: true,
            rcvbuf: args.slow_rcvbuf,
            ..base.clone()
        };
        let mut p = Pool::spawn(&spec, slow, c.max_per_worker, Some(1))?;
        let r = p.ready(left).await?;
        (Some(p), r.connected)
    } else {
        (None, 0)
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let plan = Plan {
        channels: 1,
        rate: args.rate,
        batch: 1,
        duration_secs: args.phase_secs,
        payload_bytes: args.payload_bytes,
    };
    let cpu0 = server.cpu_secs()?;
    let sent = publish_plan(server, &plan, false, deadline).await?;
    if let Some(e) = &sent.first_error {
        bail!("{}: publishing failed: {e}", server.kind.as_str());
    }
    let expected = sent.messages * hr.connected as u64;
    let drained = drain(&mut healthy, expected, 10.0, deadline).await?;
    let rss_kib = server.memory_kib()?.0;
    let server_cpu = server.cpu_secs()? - cpu0;
    let tcp_kib = crate::procs::tcp_mem_kib().unwrap_or(0);
    let (healthy_stats, _) = healthy.stop().await?;
    let slow_stats = match slow_pool.as_mut() {
        Some(p) => p.stop().await?.0,
        None => Stats::default(),
    };
    Ok(Phase {
        round,
        slow,
        healthy_connected: hr.connected,
        slow_connected,
        published: sent.messages,
        healthy: healthy_stats,
        expected,
        drained,
        slow_stats,
        rss_kib,
        server_cpu,
        tcp_kib,
    })
}

fn print_phase(kind: Kind, p: &Phase, base: Option<&Phase>) {
    let h = &p.healthy.latency_us;
    println!(
        "{} round {}, {} slow client(s) ({} connected), {} healthy: published {}, healthy received {} of {}{}",
        kind.as_str(),
        p.round + 1,
        p.slow,
        p.slow_connected,
        p.healthy_connected,
        fmt_int(p.published),
        fmt_int(p.healthy.msgs),
        fmt_int(p.expected),
        if p.drained { "" } else { " (NOT all delivered)" }
    );
    println!(
        "  healthy latency p50 {}, p99 {}, max {}; gaps {}, closed early {}; server RSS {} KiB, CPU {:.2} s; kernel TCP buffers {} KiB",
        fmt_ms(h.percentile(50.0)),
        fmt_ms(h.percentile(99.0)),
        fmt_ms((h.count() > 0).then(|| h.max())),
        p.healthy.gaps,
        p.healthy.closed_early,
        fmt_int(p.rss_kib),
        p.server_cpu,
        fmt_int(p.tcp_kib)
    );
    if p.slow > 0 {
        println!(
            "  slow clients: closed by the server {} (codes {:?}), frames they had read before stopping {}",
            p.slow_stats.closed_early, p.slow_stats.close_codes, p.slow_stats.msgs
        );
    }
    if let Some(b) = base.filter(|_| p.slow > 0) {
        let shift = p99_shift_ms(b.p99_us(), p.p99_us());
        println!(
            "  healthy p99 moved {} ms (target ≤ {TARGET_P99_SHIFT_MS} ms: {})",
            shift.map_or("n/a".into(), |s| format!("{s:+.2}")),
            verdict(shift.map(f64::abs), TARGET_P99_SHIFT_MS, true)
        );
    }
}

fn record(
    c: &CommonArgs,
    args: &SlowArgs,
    kind: Kind,
    phases: &[Phase],
    peak_kib: u64,
) -> anyhow::Result<()> {
    let rows: Vec<serde_json::Value> = phases
        .iter()
        .map(|p| {
            let h = &p.healthy.latency_us;
            let base = round_base(phases, p.round).and_then(Phase::p99_us);
            json!({
                "round": p.round,
                "slow": p.slow,
                "slow_connected": p.slow_connected,
                "healthy_connected": p.healthy_connected,
                "published": p.published,
                "healthy_received": p.healthy.msgs,
                "healthy_expected": p.expected,
                "drained": p.drained,
                "healthy_p50_us": h.percentile(50.0),
                "healthy_p99_us": h.percentile(99.0),
                "healthy_max_us": (h.count() > 0).then(|| h.max()),
                "healthy_gaps": p.healthy.gaps,
                "healthy_closed_early": p.healthy.closed_early,
                "p99_shift_ms": p99_shift_ms(base, p.p99_us()),
                "slow_closed_by_server": p.slow_stats.closed_early,
                "slow_close_codes": p.slow_stats.close_codes,
                "rss_kib": p.rss_kib,
                "server_cpu_secs": p.server_cpu,
                "kernel_tcp_kib": p.tcp_kib,
            })
        })
        .collect();
    c.record(json!({
        "scenario": "slow",
        "server": kind.as_str(),
        "params": {
            "healthy": args.healthy,
            "slow": args.slow,
            "rate": args.rate,
            "payload_bytes": args.payload_bytes,
            "phase_secs": args.phase_secs,
            "rounds": args.rounds,
            "slow_rcvbuf": args.slow_rcvbuf,
            "smoke": c.smoke,
            "herald_args": c.herald_args,
        },
        "phases": rows,
        "peak_rss_kib": peak_kib,
        "worst_p99_shift_ms": worst_shift_ms(phases),
        "target_p99_shift_ms": TARGET_P99_SHIFT_MS,
    }))
}

/// The phase without slow clients of `round`.
fn round_base(phases: &[Phase], round: usize) -> Option<&Phase> {
    phases.iter().find(|p| p.round == round && p.slow == 0)
}

/// The largest healthy p99 shift of any phase with slow clients against its
/// round's phase without them.
fn worst_shift_ms(phases: &[Phase]) -> Option<f64> {
    phases
        .iter()
        .filter(|p| p.slow > 0)
        .filter_map(|p| p99_shift_ms(round_base(phases, p.round)?.p99_us(), p.p99_us()))
        .reduce(f64::max)
}

/// One line: the worst shift over every round, against the target.
fn print_verdict(kind: Kind, phases: &[Phase]) {
    let shifts: Vec<String> = phases
        .iter()
        .filter(|p| p.slow > 0)
        .map(|p| {
            round_base(phases, p.round)
                .and_then(|b| p99_shift_ms(b.p99_us(), p.p99_us()))
                .map_or("n/a".into(), |s| format!("{s:+.1}"))
        })
        .collect();
    let worst = worst_shift_ms(phases);
    println!(
        "  {} healthy p99 shifts (ms, every slow phase of every round): {}; worst {} (target ≤ {TARGET_P99_SHIFT_MS} ms in every round: {})",
        kind.as_str(),
        shifts.join(", "),
        worst.map_or("n/a".into(), |s| format!("{s:+.1}")),
        verdict(worst, TARGET_P99_SHIFT_MS, true)
    );
}

/// At smoke scale every healthy client gets every message, in order.
fn smoke_check(kind: Kind, phases: &[Phase]) -> anyhow::Result<()> {
    for p in phases {
        let h = &p.healthy;
        if !p.drained || h.gaps + h.backwards + h.bad + h.closed_early > 0 || p.published == 0 {
            bail!(
                "{} smoke check failed with {} slow clients: received {} of {}, {} gaps, {} backwards, {} bad, {} closed early",
                kind.as_str(),
                p.slow,
                h.msgs,
                p.expected,
                h.gaps,
                h.backwards,
                h.bad,
                h.closed_early
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift() {
        assert_eq!(p99_shift_ms(Some(5_000), Some(12_500)), Some(7.5));
        assert_eq!(p99_shift_ms(Some(5_000), Some(4_000)), Some(-1.0));
        assert_eq!(p99_shift_ms(None, Some(1)), None);
    }
}
