//! `bench ticker`: the seed scenario, a stock ticker with conflation.
//!
//! Owns: a Herald whose bench tenant runs the ticker-conflate plugin with a
//! conflation window (100 ms by default); `symbols` channels, one tick per
//! symbol per second, spread evenly over each second in small publish
//! requests; `clients` WebSocket clients subscribed to `subs_per_client`
//! symbols each; tick-to-client latency (window included) against the
//! 150 ms p99 target and the seed system's measured p50 229 ms / p99
//! 572–601 ms at 10k clients.

use crate::client::{now_nanos, Transport};
use crate::fanout::tick;
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec};
use crate::procs;
use crate::report::{fmt_int, fmt_ms, fmt_rate, ratio, verdict};
use crate::target::{Target, TENANT};
use crate::worker::channel_name;
use anyhow::{bail, Context as _};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// p99 tick-to-client, the 100 ms window included.
pub const TARGET_P99_MS: f64 = 150.0;
/// The seed system (Spring STOMP) at 10k clients, window included.
pub const SEED_P50_MS: f64 = 229.0;
pub const SEED_P99_MS: f64 = 572.0;

#[derive(Debug, Clone, clap::Args)]
pub struct TickerArgs {
    #[arg(long, default_value_t = 202)]
    pub symbols: usize,
    #[arg(long, default_value_t = 10_000)]
    pub clients: usize,
    #[arg(long, default_value_t = 5)]
    pub subs_per_client: usize,
    /// Conflation window of the tenant, ms.
    #[arg(long, default_value_t = 100)]
    pub window_ms: u64,
    /// Publish requests per second (the ticks of each second spread over them).
    #[arg(long, default_value_t = 20)]
    pub requests_per_sec: usize,
    #[arg(long, default_value_t = 30.0)]
    pub duration_secs: f64,
    /// The ticker plugin component.
    #[arg(long, default_value_os_t = crate::plugin::default_plugins().join("ticker_conflate.wasm"))]
    pub plugin: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Symbol `i`'s name: `S000`, `S001`, …
pub fn symbol(i: usize) -> String {
    format!("S{i:03}")
}

/// Which symbols request `k` (of `per_sec` each second) carries: an even
/// share of `symbols`, so every symbol ticks once a second.
pub fn slot(symbols: usize, per_sec: usize, k: usize) -> std::ops::Range<usize> {
    let per_sec = per_sec.max(1);
    (k * symbols / per_sec)..((k + 1) * symbols / per_sec)
}

pub async fn run(mut args: TickerArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.clients = 50;
        args.symbols = args.symbols.min(20);
        args.duration_secs = 2.0;
    }
    if args.symbols == 0 || args.requests_per_sec == 0 || args.duration_secs <= 0.0 {
        bail!("--symbols, --requests-per-sec and --duration-secs must be positive");
    }
    let c: &CommonArgs = &args.common;
    let deadline = Instant::now() + c.deadline();
    let mut server = Target::herald(&c.herald, &c.herald_args).await?;
    server.install_plugin(&args.plugin).await?;
    let body = json!({"conflation": {"window_ms": args.window_ms}}).to_string();
    server
        .admin_request(
            "PATCH",
            &format!("/admin/v1/tenants/{TENANT}"),
            body.as_bytes(),
        )
        .await
        .context("setting the conflation window")?;
    let left = deadline.saturating_duration_since(Instant::now());
    let spec = PoolSpec {
        channels: args.symbols,
        subs_per_conn: args.subs_per_client,
        connect_concurrency: c.connect_concurrency,
        ..PoolSpec::new(&server, Transport::Ws, left + Duration::from_secs(5))
    };
    println!(
        "ticker: {} symbols x 1 tick/s, {} clients x {} symbols, {} ms conflation (ticker-conflate), {} s",
        args.symbols,
        fmt_int(args.clients as u64),
        args.subs_per_client,
        args.window_ms,
        args.duration_secs
    );
    let mut pool = Pool::spawn(&spec, args.clients, c.max_per_worker, c.workers)?;
    let ready = pool.ready(left).await?;
    if ready.connected < args.clients {
        bail!(
            "only {} of {} clients connected: {:?}",
            ready.connected,
            args.clients,
            ready.first_error
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let me = std::process::id();
    let (s0, l0) = (server.cpu_secs()?, procs::cpu_secs(me)? + pool.cpu_secs());
    let t0 = Instant::now();
    let mut http = server.publisher();
    let mut counters = vec![0u64; args.symbols];
    let period = Duration::from_secs_f64(1.0 / args.requests_per_sec as f64);
    let rounds = (args.duration_secs * args.requests_per_sec as f64).round() as usize;
    let mut sent = crate::target::Published::default();
    for round in 0..rounds {
        tokio::time::sleep_until((t0 + period * round as u32).into()).await;
        if round > 0 && round % (5 * args.requests_per_sec) == 0 {
            println!(
                "  … {:.0} s: {} ticks published",
                t0.elapsed().as_secs_f64(),
                fmt_int(sent.messages)
            );
        }
        let now = now_nanos();
        let msgs: Vec<(String, String)> = slot(
            args.symbols,
            args.requests_per_sec,
            round % args.requests_per_sec,
        )
        .map(|i| {
            counters[i] += 1;
            let ch = channel_name(i);
            let data = tick(now, &ch, counters[i], &symbol(i), 100);
            (ch, data)
        })
        .collect();
        if msgs.is_empty() {
            continue;
        }
        sent.add(server.publish(&mut http, &msgs, false).await);
        if Instant::now() > deadline {
            bail!("overall deadline reached while publishing");
        }
    }
    let (ticks, errors, first_error) = (sent.messages, sent.errors, sent.first_error);
    // Every tick reaches each of its symbol's subscribers after at most one
    // window (one tick per symbol per window: nothing is conflated away).
    let expected = expected_frames(&counters, args.clients, args.subs_per_client);
    let drained = crate::fanout::drain(&mut pool, expected, 10.0, deadline).await?;
    let window_secs = t0.elapsed().as_secs_f64();
    let (s1, l1) = (server.cpu_secs()?, procs::cpu_secs(me)? + pool.cpu_secs());
    let (stats, _) = pool.stop().await?;
    server.check_alive()?;
    let h = &stats.latency_us;
    let p99_ms = h.percentile(99.0).map(|u| u as f64 / 1000.0);
    println!(
        "  published {} ticks ({} errors{}); clients received {} of {}{}",
        fmt_int(ticks),
        errors,
        first_error
            .as_ref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default(),
        fmt_int(stats.msgs),
        fmt_int(expected),
        if drained { "" } else { " (NOT all delivered)" }
    );
    println!(
        "  tick-to-client latency: p50 {}, p99 {}, p99.9 {}, max {}; gaps {}, backwards {}",
        fmt_ms(h.percentile(50.0)),
        fmt_ms(h.percentile(99.0)),
        fmt_ms(h.percentile(99.9)),
        fmt_ms((h.count() > 0).then(|| h.max())),
        stats.gaps,
        stats.backwards
    );
    println!(
        "  p99 target ≤ {TARGET_P99_MS} ms: {}; seed system p50 {SEED_P50_MS} ms / p99 {SEED_P99_MS}–601 ms = {} / {} Herald's",
        verdict(p99_ms, TARGET_P99_MS, true),
        crate::report::fmt_ratio(h.percentile(50.0).and_then(|u| ratio(SEED_P50_MS, u as f64 / 1000.0))),
        crate::report::fmt_ratio(p99_ms.and_then(|p| ratio(SEED_P99_MS, p))),
    );
    let server_cpu = s1 - s0;
    let loadgen_cpu = l1 - l0;
    println!(
        "  server CPU {server_cpu:.2} s over {window_secs:.1} s ({} frames per server CPU-second); load generator {loadgen_cpu:.2} s{}",
        fmt_rate(ratio(stats.msgs as f64, server_cpu)),
        if loadgen_cpu > server_cpu { "  <-- FLAG: the load generator used more CPU than the server" } else { "" }
    );
    c.record(json!({
        "scenario": "ticker",
        "server": "herald",
        "params": {
            "symbols": args.symbols, "clients": args.clients, "subs_per_client": args.subs_per_client,
            "window_ms": args.window_ms, "requests_per_sec": args.requests_per_sec,
            "duration_secs": args.duration_secs, "smoke": c.smoke, "herald_args": c.herald_args,
        },
        "ticks": ticks,
        "publish_errors": errors,
        "expected_frames": expected,
        "frames_received": stats.msgs,
        "drained": drained,
        "latency_us": {"p50": h.percentile(50.0), "p99": h.percentile(99.0), "p999": h.percentile(99.9), "max": (h.count() > 0).then(|| h.max())},
        "gaps": stats.gaps,
        "backwards": stats.backwards,
        "server_cpu_secs": server_cpu,
        "loadgen_cpu_secs": loadgen_cpu,
        "target_p99_ms": TARGET_P99_MS,
    }))?;
    if c.smoke {
        if errors > 0 || !drained || stats.gaps + stats.backwards + stats.bad > 0 || stats.msgs == 0
        {
            bail!(
                "ticker smoke check failed: {errors} publish errors, {} of {expected} frames, {} gaps, {} backwards, {} bad",
                stats.msgs,
                stats.gaps,
                stats.backwards,
                stats.bad
            );
        }
        println!("smoke checks passed");
    }
    Ok(())
}

/// Frames the clients should receive: each channel's ticks times its subscribers.
pub fn expected_frames(ticks_per_channel: &[u64], clients: usize, subs_per_client: usize) -> u64 {
    let mut subs = vec![0u64; ticks_per_channel.len()];
    for conn in 0..clients {
        for ch in crate::worker::channels_for(conn, ticks_per_channel.len(), subs_per_client) {
            if let Some(i) = ch.strip_prefix('c').and_then(|n| n.parse::<usize>().ok()) {
                subs[i] += 1;
            }
        }
    }
    subs.iter().zip(ticks_per_channel).map(|(s, t)| s * t).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbol_ticks_once_a_second() {
        for (symbols, per_sec) in [(202, 20), (20, 20), (5, 20), (202, 1)] {
            let mut seen = vec![0; symbols];
            for k in 0..per_sec {
                for i in slot(symbols, per_sec, k) {
                    seen[i] += 1;
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "{symbols}/{per_sec}: {seen:?}"
            );
        }
        assert_eq!(symbol(7), "S007");
        // 4 clients x 2 of 3 channels: c0 c1 | c2 c0 | c1 c2 | c0 c1 -> c0:3 c1:3 c2:2.
        assert_eq!(
            expected_frames(&[10, 100, 1000], 4, 2),
            3 * 10 + 3 * 100 + 2 * 1000
        );
    }
}
