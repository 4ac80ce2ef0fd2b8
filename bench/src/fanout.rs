//! `bench fanout`: frames per server CPU-second and publish-to-receive latency.
//!
//! Owns: the publish plan (rate, batch, channels, payload carrying its send
//! time), the measurement window (server, parent and worker CPU from the
//! first publish until every queued frame arrived or delivery stalled), and
//! the comparison with the same-run raw baseline (`--baseline raw`), whose
//! one-write-per-frame figure is the physical limit Herald is held against.

use crate::client::{now_nanos, Transport};
use crate::hist::Histogram;
use crate::http::HttpConn;
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec, Ready};
use crate::procs;
use crate::report::{fmt_int, fmt_ms, fmt_rate, fmt_ratio, ratio, verdict};
use crate::target::{Kind, Target, TENANT};
use crate::track::Stats;
use crate::worker::channel_name;
use anyhow::bail;
use serde_json::json;
use std::time::{Duration, Instant};

/// Herald must reach this share of the same-run one-write-per-frame limit.
pub const TARGET_RATIO_TO_RAW: f64 = 0.9;
/// 1.2 × nchan's frames per CPU-second on this machine class.
pub const TARGET_FPS: f64 = 150_000.0;
/// Measured outside this run, printed for context only.
pub const REF_NCHAN_FPS: f64 = 125_000.0;
pub const REF_ONE_WRITE_FPS: f64 = 172_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// `bench raw-server`: one write() per frame per subscriber.
    Raw,
    /// The same Herald without the `--plugin` (its transform's cost on fan-out).
    NoPlugin,
}

#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    /// Subscriber connections.
    #[arg(long, default_value_t = 10_000)]
    pub subs: usize,
    /// Messages per second per channel.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// Channels; each publish request carries `batch` messages for every channel.
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// Channels each connection subscribes to.
    #[arg(long, default_value_t = 1)]
    pub subs_per_conn: usize,
    /// Messages per channel in one publish request (they reach each session together).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Size of each published JSON payload.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    #[arg(long, value_enum, default_value_t = Transport::Ws)]
    pub transport: Transport,
    /// Run the same scenario against a baseline server afterwards and compare.
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
    /// A plugin component activated on the bench tenant (e.g. ticker_conflate.wasm).
    #[arg(long)]
    pub plugin: Option<std::path::PathBuf>,
    /// Longest wait after the last publish for queued frames to arrive.
    #[arg(long, default_value_t = 15.0)]
    pub drain_secs: f64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// What is published, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub channels: usize,
    pub rate: f64,
    pub batch: usize,
    pub duration_secs: f64,
    pub payload_bytes: usize,
}

impl Plan {
    /// Publish requests in the whole run.
    pub fn requests(&self) -> u64 {
        ((self.rate * self.duration_secs) / self.batch.max(1) as f64)
            .round()
            .max(1.0) as u64
    }

    /// Time between requests.
    pub fn period(&self) -> Duration {
        Duration::from_secs_f64(self.batch.max(1) as f64 / self.rate)
    }

    pub fn msgs_per_request(&self) -> usize {
        self.channels.max(1) * self.batch.max(1)
    }

    /// The request body: one object, or an array when it carries several messages.
    pub fn body(&self, t: u64) -> String {
        let data = payload(t, self.payload_bytes);
        if self.msgs_per_request() == 1 {
            return format!(r#"{{"ch":"{}","data":{data}}}"#, channel_name(0));
        }
        let mut out = String::with_capacity(self.msgs_per_request() * (data.len() + 24) + 2);
        out.push('[');
        for c in 0..self.channels.max(1) {
            for _ in 0..self.batch.max(1) {
                if out.len() > 1 {
                    out.push(',');
                }
                out.push_str(&format!(r#"{{"ch":"{}","data":{data}}}"#, channel_name(c)));
            }
        }
        out.push(']');
        out
    }
}

/// `{"t":<t>,"sym":"AAPL","pad":"…"}` padded to `bytes` (when `bytes` leaves
/// room for it); `sym` lets the ticker plugins route and key it.
pub fn payload(t: u64, bytes: usize) -> String {
    let bare = format!(r#"{{"t":{t},"sym":"AAPL","pad":""}}"#);
    let pad = bytes.saturating_sub(bare.len());
    format!(r#"{{"t":{t},"sym":"AAPL","pad":"{}"}}"#, "x".repeat(pad))
}

/// Sum of `delivered` (and `dropped`, raw server only) in a publish answer.
pub fn delivered(answer: &serde_json::Value) -> (u64, u64) {
    let one = |v: &serde_json::Value| {
        (
            v["delivered"].as_u64().unwrap_or(0),
            v["dropped"].as_u64().unwrap_or(0),
        )
    };
    match answer.get("results").and_then(|r| r.as_array()) {
        Some(items) => items
            .iter()
            .map(one)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        None => one(answer),
    }
}

/// Everything one server's run measured.
#[derive(Debug)]
struct Outcome {
    kind: Kind,
    ready: Ready,
    workers: usize,
    requests: u64,
    published: u64,
    publish_errors: u64,
    first_publish_error: Option<String>,
    /// Frames the server said it queued (Herald) or wrote (raw).
    offered: u64,
    /// Frames the raw server could not write (socket full).
    dropped_by_server: u64,
    publish_secs: f64,
    window_secs: f64,
    drained: bool,
    server_cpu: f64,
    parent_cpu: f64,
    workers_cpu: f64,
    /// CPU that processes other than the server and the bench used in the window.
    foreign_cpu: f64,
    frames_per_write: Option<f64>,
    stats: Stats,
    rss_kib: u64,
}

impl Outcome {
    fn fps(&self) -> Option<f64> {
        ratio(self.stats.msgs as f64, self.server_cpu)
    }

    /// Other processes used more than a tenth of a core during the window.
    fn machine_busy(&self) -> bool {
        self.foreign_cpu > 0.1 * self.window_secs
    }

    fn loadgen_cpu(&self) -> f64 {
        self.parent_cpu + self.workers_cpu
    }

    fn latency(&self) -> &Histogram {
        &self.stats.latency_us
    }

    fn json(&self) -> serde_json::Value {
        let h = self.latency();
        json!({
            "connected": self.ready.connected,
            "failed": self.ready.failed,
            "first_error": self.ready.first_error,
            "workers": self.workers,
            "requests": self.requests,
            "published": self.published,
            "publish_errors": self.publish_errors,
            "first_publish_error": self.first_publish_error,
            "publish_secs": self.publish_secs,
            "window_secs": self.window_secs,
            "drained": self.drained,
            "offered_frames": self.offered,
            "dropped_by_server": self.dropped_by_server,
            "frames_received": self.stats.msgs,
            "server_cpu_secs": self.server_cpu,
            "frames_per_server_cpu_sec": self.fps(),
            "frames_per_write": self.frames_per_write,
            "latency_us": {
                "p50": h.percentile(50.0), "p99": h.percentile(99.0), "p999": h.percentile(99.9),
                "max": (h.count() > 0).then(|| h.max()), "mean": h.mean(),
            },
            "gaps": self.stats.gaps,
            "missing": self.stats.missing,
            "backwards": self.stats.backwards,
            "bad_frames": self.stats.bad,
            "closed_early": self.stats.closed_early,
            "close_codes": self.stats.close_codes,
            "loadgen_cpu_secs": self.loadgen_cpu(),
            "parent_cpu_secs": self.parent_cpu,
            "workers_cpu_secs": self.workers_cpu,
            "loadgen_exceeds_server": self.loadgen_cpu() > self.server_cpu,
            "foreign_cpu_secs": self.foreign_cpu,
            "machine_busy": self.machine_busy(),
            "server_rss_kib": self.rss_kib,
        })
    }
}

pub async fn run(mut args: FanoutArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.subs = 50;
        args.duration_secs = 1.0;
        args.drain_secs = args.drain_secs.min(3.0);
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) || args.duration_secs <= 0.0 {
        bail!("--rate and --duration-secs must be positive");
    }
    if args.baseline == Some(Baseline::Raw) && args.transport != Transport::Ws {
        bail!("the raw baseline speaks WebSocket only; use --transport ws with --baseline raw");
    }
    if args.baseline == Some(Baseline::NoPlugin) && args.plugin.is_none() {
        bail!("--baseline no-plugin compares against --plugin; give the plugin");
    }
    let plan = Plan {
        channels: args.channels.max(1),
        rate: args.rate,
        batch: args.batch.max(1),
        duration_secs: args.duration_secs,
        payload_bytes: args.payload_bytes,
    };
    let deadline = Instant::now() + args.common.deadline();
    println!(
        "fanout: {} {} subscriber connection(s), {} channel(s), {} sub(s) each; {} msg/s per channel for {} s, {} per request, {} B payloads",
        fmt_int(args.subs as u64),
        args.transport.as_str(),
        plan.channels,
        args.subs_per_conn.clamp(1, plan.channels),
        args.rate,
        args.duration_secs,
        plan.batch,
        args.payload_bytes
    );
    let herald = one(&args, &plan, Kind::Herald, args.plugin.as_deref(), deadline).await?;
    print_outcome(&herald);
    let raw = match args.baseline {
        Some(Baseline::Raw) => {
            let r = one(&args, &plan, Kind::Raw, None, deadline).await?;
            print_outcome(&r);
            Some(r)
        }
        _ => None,
    };
    let bare = match args.baseline {
        Some(Baseline::NoPlugin) => {
            println!("herald without the plugin:");
            let r = one(&args, &plan, Kind::Herald, None, deadline).await?;
            print_outcome(&r);
            Some(r)
        }
        _ => None,
    };
    let vs_bare = bare.as_ref().and_then(|b| ratio(herald.fps()?, b.fps()?));
    let vs_raw = raw.as_ref().and_then(|r| ratio(herald.fps()?, r.fps()?));
    println!("summary:");
    if let Some(b) = &bare {
        println!(
            "  with plugin / without = {} (target ≥ 0.9×: {}); {} vs {} frames/CPU-s",
            fmt_ratio(vs_bare),
            verdict(vs_bare, 0.9, false),
            fmt_rate(herald.fps()),
            fmt_rate(b.fps()),
        );
    }
    if let Some(r) = &raw {
        println!(
            "  herald / raw one-write-per-frame = {} (target ≥ {TARGET_RATIO_TO_RAW}×: {}); raw {} vs {} frames/CPU-s",
            fmt_ratio(vs_raw),
            verdict(vs_raw, TARGET_RATIO_TO_RAW, false),
            fmt_rate(r.fps()),
            fmt_rate(herald.fps()),
        );
    }
    println!(
        "  herald {} frames/CPU-s = {} of the {} target ({}); reference, not measured in this run: nchan {} ({}), one-write limit {} ({})",
        fmt_rate(herald.fps()),
        fmt_ratio(herald.fps().and_then(|f| ratio(f, TARGET_FPS))),
        fmt_int(TARGET_FPS as u64),
        verdict(herald.fps(), TARGET_FPS, false),
        fmt_int(REF_NCHAN_FPS as u64),
        fmt_ratio(herald.fps().and_then(|f| ratio(f, REF_NCHAN_FPS))),
        fmt_int(REF_ONE_WRITE_FPS as u64),
        fmt_ratio(herald.fps().and_then(|f| ratio(f, REF_ONE_WRITE_FPS))),
    );
    let params = json!({
        "subs": args.subs,
        "transport": args.transport.as_str(),
        "channels": plan.channels,
        "subs_per_conn": args.subs_per_conn.clamp(1, plan.channels),
        "rate_per_channel": plan.rate,
        "duration_secs": plan.duration_secs,
        "batch": plan.batch,
        "payload_bytes": plan.payload_bytes,
        "smoke": args.common.smoke,
        "herald_args": args.common.herald_args,
    });
    let mut line = json!({"scenario": "fanout", "server": "herald", "params": params.clone()});
    merge(&mut line, herald.json());
    merge(
        &mut line,
        json!({
            "target_fps": TARGET_FPS,
            "ratio_to_target_fps": herald.fps().and_then(|f| ratio(f, TARGET_FPS)),
            "raw_fps": raw.as_ref().and_then(|r| r.fps()),
            "ratio_to_raw": vs_raw,
            "plugin": args.plugin.as_ref().map(|p| p.display().to_string()),
            "no_plugin_fps": bare.as_ref().and_then(|b| b.fps()),
            "ratio_to_no_plugin": vs_bare,
            "target_ratio_to_raw": TARGET_RATIO_TO_RAW,
        }),
    );
    args.common.record(line)?;
    if let Some(r) = &raw {
        let mut line = json!({"scenario": "fanout", "server": "raw", "params": params});
        merge(&mut line, r.json());
        args.common.record(line)?;
    }
    if args.common.smoke {
        println!("  (smoke scale: CPU figures are near /proc's 10 ms resolution and say nothing about performance)");
        for o in std::iter::once(&herald).chain(raw.as_ref()) {
            smoke_check(o)?;
        }
        println!("smoke checks passed");
    }
    Ok(())
}

/// At smoke scale nothing may be lost: every queued frame arrives, in order.
fn smoke_check(o: &Outcome) -> anyhow::Result<()> {
    let s = &o.stats;
    if o.publish_errors > 0
        || !o.drained
        || s.msgs != o.offered
        || s.gaps + s.backwards + s.bad + s.closed_early > 0
    {
        bail!(
            "{} smoke check failed: {} publish errors, {} of {} frames received, {} gaps, {} backwards, {} bad, {} closed early",
            o.kind.as_str(),
            o.publish_errors,
            s.msgs,
            o.offered,
            s.gaps,
            s.backwards,
            s.bad,
            s.closed_early
        );
    }
    if o.offered == 0 {
        bail!(
            "{} smoke check failed: nothing was delivered",
            o.kind.as_str()
        );
    }
    Ok(())
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

fn print_outcome(o: &Outcome) {
    let name = o.kind.as_str();
    let h = o.latency();
    println!("{name}:");
    println!(
        "  {} of {} subscribers connected over {} worker(s){}",
        fmt_int(o.ready.connected as u64),
        fmt_int((o.ready.connected + o.ready.failed) as u64),
        o.workers,
        o.ready
            .first_error
            .as_ref()
            .map(|e| format!(" (first error: {e})"))
            .unwrap_or_default()
    );
    println!(
        "  published {} msgs in {} requests over {:.1} s ({} errors{}); server queued/wrote {} frames{}",
        fmt_int(o.published),
        fmt_int(o.requests),
        o.publish_secs,
        o.publish_errors,
        o.first_publish_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default(),
        fmt_int(o.offered),
        if o.dropped_by_server > 0 { format!(", dropped {} (socket full)", fmt_int(o.dropped_by_server)) } else { String::new() }
    );
    println!(
        "  received {} msg frames{}; server CPU {:.2} s over a {:.1} s window ({:.0}% of one core) -> {} frames per server CPU-second",
        fmt_int(o.stats.msgs),
        if o.drained { "" } else { " (delivery stalled or drain time ran out)" },
        o.server_cpu,
        o.window_secs,
        100.0 * o.server_cpu / o.window_secs.max(1e-9),
        fmt_rate(o.fps())
    );
    if let Some(f) = o.frames_per_write {
        println!("  {f:.2} frames per socket write (herald counters)");
    }
    println!(
        "  latency publish->receive: p50 {}, p99 {}, p99.9 {}, max {}",
        fmt_ms(h.percentile(50.0)),
        fmt_ms(h.percentile(99.0)),
        fmt_ms(h.percentile(99.9)),
        fmt_ms((h.count() > 0).then(|| h.max()))
    );
    println!(
        "  seq check: {} gaps ({} positions missing), {} backwards, {} bad frames, {} connections closed early {:?}",
        o.stats.gaps, o.stats.missing, o.stats.backwards, o.stats.bad, o.stats.closed_early, o.stats.close_codes
    );
    let flag = if o.loadgen_cpu() > o.server_cpu {
        "  <-- FLAG: the load generator used more CPU than the server"
    } else {
        ""
    };
    println!(
        "  load generator CPU {:.2} s (parent {:.2}, workers {:.2}) = {} of the server's{flag}",
        o.loadgen_cpu(),
        o.parent_cpu,
        o.workers_cpu,
        fmt_ratio(ratio(o.loadgen_cpu(), o.server_cpu))
    );
    let busy = if o.machine_busy() {
        "  <-- WARNING: the machine was busy; CPU and latency figures are disturbed"
    } else {
        ""
    };
    println!(
        "  other processes used {:.2} CPU-s during the window (kernel softirq time included){busy}",
        o.foreign_cpu
    );
}

async fn start(
    kind: Kind,
    c: &CommonArgs,
    plugin: Option<&std::path::Path>,
) -> anyhow::Result<Target> {
    match kind {
        Kind::Herald => {
            let t = Target::herald(&c.herald, &c.herald_args).await?;
            if let Some(p) = plugin {
                t.install_plugin(p).await?;
            }
            Ok(t)
        }
        Kind::Raw => Target::raw().await,
    }
}

async fn one(
    args: &FanoutArgs,
    plan: &Plan,
    kind: Kind,
    plugin: Option<&std::path::Path>,
    deadline: Instant,
) -> anyhow::Result<Outcome> {
    let c = &args.common;
    let mut server = start(kind, c, plugin).await?;
    let left = deadline.saturating_duration_since(Instant::now());
    let spec = PoolSpec {
        target: server.addr,
        tenant: TENANT.into(),
        transport: args.transport,
        channels: plan.channels,
        subs_per_conn: args.subs_per_conn,
        connect_concurrency: c.connect_concurrency,
        deadline: left + Duration::from_secs(5),
    };
    let mut pool = Pool::spawn(&spec, args.subs, c.max_per_worker, c.workers)?;
    let ready = pool.ready(left).await?;
    if ready.connected == 0 {
        bail!(
            "{}: no subscriber connected: {:?}",
            kind.as_str(),
            ready.first_error
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let counters0 = server.write_counters().await;
    let me = std::process::id();
    let (s0, p0, w0) = (server.cpu_secs()?, procs::cpu_secs(me)?, pool.cpu_secs());
    let m0 = procs::machine_busy_secs()?;
    let t0 = Instant::now();

    // Publish on one keep-alive connection, on a fixed schedule.
    let mut http = HttpConn::new(server.addr);
    let path = format!("/v1/t/{TENANT}/publish");
    let (mut published, mut errors, mut offered, mut dropped) = (0u64, 0u64, 0u64, 0u64);
    let mut first_error = None;
    let requests = plan.requests();
    for i in 0..requests {
        tokio::time::sleep_until((t0 + plan.period().mul_f64(i as f64)).into()).await;
        let body = plan.body(now_nanos());
        match http
            .request("POST", &path, Some(&server.publish_key), body.as_bytes())
            .await
        {
            Ok(r) if r.status == 200 => {
                published += plan.msgs_per_request() as u64;
                let (d, x) = delivered(&r.json()?);
                offered += d;
                dropped += x;
            }
            Ok(r) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("status {}: {}", r.status, r.text()));
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
        if Instant::now() > deadline {
            bail!("overall deadline reached while publishing");
        }
    }
    let publish_secs = t0.elapsed().as_secs_f64();

    // Wait until every frame the server queued has arrived, or delivery stalls.
    let drain_until = Instant::now() + Duration::from_secs_f64(args.drain_secs);
    let (mut last, mut last_change, mut drained) = (0, Instant::now(), false);
    loop {
        let (msgs, _, _) = pool.progress().await?;
        if msgs >= offered {
            drained = true;
            break;
        }
        if msgs != last {
            last = msgs;
            last_change = Instant::now();
        }
        if last_change.elapsed() > Duration::from_secs(2)
            || Instant::now() > drain_until
            || Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let window_secs = t0.elapsed().as_secs_f64();
    let (s1, p1, w1) = (server.cpu_secs()?, procs::cpu_secs(me)?, pool.cpu_secs());
    let m1 = procs::machine_busy_secs()?;
    let foreign_cpu = ((m1 - m0) - (s1 - s0) - (p1 - p0) - (w1 - w0)).max(0.0);
    let counters1 = server.write_counters().await;
    let rss_kib = server.memory_kib().map(|m| m.0).unwrap_or(0);
    let (stats, _) = pool.stop().await?;
    server.check_alive()?;
    let frames_per_write = match (counters0, counters1) {
        (Some((f0, w0)), Some((f1, w1))) => ratio(f1 - f0, w1 - w0),
        _ => None,
    };
    Ok(Outcome {
        kind,
        ready,
        workers: pool.len(),
        requests,
        published,
        publish_errors: errors,
        first_publish_error: first_error,
        offered,
        dropped_by_server: dropped,
        publish_secs,
        window_secs,
        drained,
        server_cpu: s1 - s0,
        parent_cpu: p1 - p0,
        workers_cpu: w1 - w0,
        foreign_cpu,
        frames_per_write,
        stats,
        rss_kib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(channels: usize, rate: f64, batch: usize) -> Plan {
        Plan {
            channels,
            rate,
            batch,
            duration_secs: 10.0,
            payload_bytes: 100,
        }
    }

    #[test]
    fn payload_has_requested_size_and_time() {
        let t = 1_712_345_678_901_234_567;
        let p = payload(t, 100);
        assert_eq!(p.len(), 100);
        let v: serde_json::Value = serde_json::from_str(&p).unwrap();
        assert_eq!(v["t"].as_u64(), Some(t));
        // Too small a size still gives a valid payload.
        assert!(serde_json::from_str::<serde_json::Value>(&payload(t, 3)).is_ok());
    }

    #[test]
    fn schedule() {
        let p = plan(1, 10.0, 1);
        assert_eq!(p.requests(), 100);
        assert_eq!(p.period(), Duration::from_millis(100));
        let p = plan(1, 200.0, 20);
        assert_eq!((p.requests(), p.msgs_per_request()), (100, 20));
        assert_eq!(p.period(), Duration::from_millis(100));
        assert_eq!(plan(100, 10.0, 1).msgs_per_request(), 100);
    }

    #[test]
    fn bodies() {
        let single: serde_json::Value = serde_json::from_str(&plan(1, 10.0, 1).body(5)).unwrap();
        assert_eq!(single["ch"], "c0");
        assert_eq!(single["data"]["t"], 5);
        let many: serde_json::Value = serde_json::from_str(&plan(3, 10.0, 2).body(5)).unwrap();
        let a = many.as_array().unwrap();
        assert_eq!(a.len(), 6);
        assert_eq!(
            (
                a[0]["ch"].as_str(),
                a[1]["ch"].as_str(),
                a[5]["ch"].as_str()
            ),
            (Some("c0"), Some("c0"), Some("c2"))
        );
    }

    #[test]
    fn delivered_counts() {
        assert_eq!(delivered(&json!({"ch":"c0","seq":1,"delivered":7})), (7, 0));
        assert_eq!(
            delivered(&json!({"results":[{"delivered":3,"dropped":1},{"delivered":4}]})),
            (7, 1)
        );
        assert_eq!(delivered(&json!({})), (0, 0));
    }
}
