//! `bench fanout`: frames per server CPU-second and publish-to-receive latency.
//!
//! Owns: the publish plan (rate, batch, channels, payload carrying its send
//! time), the measurement window (server, parent and worker CPU from the
//! first publish until every queued frame arrived or delivery stalled), and
//! the comparison with the same-run raw baseline (`--baseline raw`), whose
//! one-write-per-frame figure is the physical limit Herald is held against.

use crate::client::{now_nanos, Transport};
use crate::hist::Histogram;
use crate::opts::CommonArgs;
use crate::pool::{Pool, PoolSpec, Ready};
use crate::procs;
use crate::report::{fmt_int, fmt_ms, fmt_rate, fmt_ratio, ratio, verdict};
use crate::target::{Kind, Peer, Published, Target};
use crate::track::Stats;
use crate::worker::channel_name;
use anyhow::{bail, Context as _};
use serde_json::json;
use std::time::{Duration, Instant};

/// Herald must reach this share of the same-run one-write-per-frame limit.
pub const TARGET_RATIO_TO_RAW: f64 = 0.9;
/// Herald / nchan frames per server CPU-second where each frame needs its own write…
pub const TARGET_RATIO_TO_NCHAN: f64 = 1.2;
/// …and where frames can share a write (batches, several channels per connection).
pub const TARGET_RATIO_TO_NCHAN_SHARED: f64 = 3.0;
/// With a plugin, within 10 % of the same Herald without it.
pub const TARGET_RATIO_TO_NO_PLUGIN: f64 = 0.9;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishMode {
    PerMessage,
    Native,
}

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
    /// Rising rates (msg/s per channel) instead of --rate: each server runs
    /// each rate until its delivery or p99 breaks; draws latency against load.
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// A rate "breaks" a server when its p99 exceeds this (or frames are lost).
    #[arg(long, default_value_t = 1000.0)]
    pub break_p99_ms: f64,
    /// Peers started in the same run with the same clients and payloads.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub peers: Vec<Peer>,
    /// How a request carries messages when peers run: `per-message` (every
    /// server gets one message per request, as the peers' APIs require) or
    /// `native` (Herald and the raw baseline take each round's messages in one
    /// request, their own batch API; the peers still get one per request).
    #[arg(long, value_enum, default_value_t = PublishMode::PerMessage)]
    pub publish: PublishMode,
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
    /// Another Herald build (e.g. the commit before a change) measured in the
    /// same run with the same plugin: the A/B of a change on the data path.
    #[arg(long)]
    pub baseline_herald: Option<std::path::PathBuf>,
    /// Also measure Herald in cluster mode with this many nodes (processes
    /// sharing the port, SO_REUSEPORT), each count in the same run: e.g.
    /// `1,2,3`. Needs --cluster-db.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<usize>,
    /// The clusters of --nodes log publishes in Kafka (`--cluster-kafka`,
    /// librdkafka's mock cluster in this process) instead of the registry.
    #[arg(long)]
    pub cluster_kafka_mock: bool,
    /// Only the clusters of --nodes (for more subscribers than one process
    /// may hold: ~19,900 here).
    #[arg(long)]
    pub cluster_only: bool,
    /// A Postgres (a throwaway one) on which each cluster gets a registry
    /// database of its own.
    #[arg(long, env = "HERALD_TEST_POSTGRES_URL")]
    pub cluster_db: Option<String>,
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

    /// One request's messages as (channel, payload); `counters` holds the last
    /// `n` of each channel, so every payload carries its channel's next number.
    pub fn messages(&self, t: u64, counters: &mut Vec<u64>) -> Vec<(String, String)> {
        let channels = self.channels.max(1);
        counters.resize(channels, 0);
        let mut out = Vec::with_capacity(self.msgs_per_request());
        for (c, n) in counters.iter_mut().enumerate() {
            for _ in 0..self.batch.max(1) {
                *n += 1;
                let ch = channel_name(c);
                let data = payload(t, &ch, *n, self.payload_bytes);
                out.push((ch, data));
            }
        }
        out
    }
}

/// `{"t":<t>,"ch":"c0","n":7,"sym":"AAPL","pad":"…"}` padded to `bytes` (when
/// `bytes` leaves room for it). `t` gives latency; `ch`/`n` let a client of a
/// peer, which delivers payloads bare, check order; `sym` lets the ticker
/// plugins route and key it.
pub fn payload(t: u64, ch: &str, n: u64, bytes: usize) -> String {
    tick(t, ch, n, "AAPL", bytes)
}

/// [`payload`] with a chosen symbol.
pub fn tick(t: u64, ch: &str, n: u64, sym: &str, bytes: usize) -> String {
    let bare = format!(r#"{{"t":{t},"ch":"{ch}","n":{n},"sym":"{sym}","pad":""}}"#);
    let pad = bytes.saturating_sub(bare.len());
    format!(
        r#"{{"t":{t},"ch":"{ch}","n":{n},"sym":"{sym}","pad":"{}"}}"#,
        "x".repeat(pad)
    )
}

/// Everything one server's run measured.
#[derive(Debug)]
pub struct Outcome {
    kind: Kind,
    /// `herald`, `raw`, `nchan`, `herald-no-plugin`, …
    label: String,
    /// Messages per second per channel offered in this run.
    rate: f64,
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

/// One server of the run: what it is and how it is labelled.
struct Server<'a> {
    kind: Kind,
    plugin: Option<&'a std::path::Path>,
    label: String,
    /// A Herald binary other than `--herald`.
    bin: Option<&'a std::path::Path>,
    /// Cluster mode with this many nodes.
    nodes: Option<usize>,
}

/// Whether an outcome means the server broke at this rate: frames lost or
/// stuck, p99 above `break_p99_ms`, or publishing took a quarter longer than
/// planned (`slip`: the server could not take the offered rate).
pub fn breaks(drained: bool, lost: u64, p99_us: Option<u64>, break_p99_ms: f64, slip: f64) -> bool {
    !drained || lost > 0 || slip > 1.25 || p99_us.is_some_and(|p| p as f64 / 1000.0 > break_p99_ms)
}

/// The ratio Herald must reach against a server of this label, if any.
pub fn target_ratio(label: &str, shares_writes: bool) -> Option<f64> {
    match label {
        "raw" => Some(TARGET_RATIO_TO_RAW),
        "nchan" if shares_writes => Some(TARGET_RATIO_TO_NCHAN_SHARED),
        "nchan" => Some(TARGET_RATIO_TO_NCHAN),
        "herald-no-plugin" => Some(TARGET_RATIO_TO_NO_PLUGIN),
        _ => None,
    }
}

pub async fn run(mut args: FanoutArgs) -> anyhow::Result<()> {
    if args.common.smoke {
        args.subs = 50;
        args.duration_secs = 1.0;
        args.drain_secs = args.drain_secs.min(3.0);
        args.rates.truncate(2);
    }
    let rates = if args.rates.is_empty() {
        vec![args.rate]
    } else {
        args.rates.clone()
    };
    if rates.iter().any(|r| !(*r > 0.0 && r.is_finite())) || args.duration_secs <= 0.0 {
        bail!("--rate(s) and --duration-secs must be positive");
    }
    if args.transport != Transport::Ws
        && (args.baseline == Some(Baseline::Raw) || args.peers.contains(&Peer::Python))
    {
        bail!("the raw baseline and the Python peer speak WebSocket only; use --transport ws");
    }
    if args.baseline == Some(Baseline::NoPlugin) && args.plugin.is_none() {
        bail!("--baseline no-plugin compares against --plugin; give the plugin");
    }
    let mut servers = vec![Server {
        kind: Kind::Herald,
        plugin: args.plugin.as_deref(),
        label: "herald".into(),
        bin: None,
        nodes: None,
    }];
    if let Some(bin) = &args.baseline_herald {
        servers.push(Server {
            kind: Kind::Herald,
            plugin: args.plugin.as_deref(),
            label: "herald-baseline".into(),
            bin: Some(bin),
            nodes: None,
        });
    }
    if !args.nodes.is_empty() && args.cluster_db.is_none() {
        bail!("--nodes needs --cluster-db (or HERALD_TEST_POSTGRES_URL): a Postgres for the registries");
    }
    if args.cluster_only {
        if args.nodes.is_empty() {
            bail!("--cluster-only needs --nodes");
        }
        servers.clear();
    }
    for &n in &args.nodes {
        if n == 0 {
            bail!("--nodes counts must be at least 1");
        }
        servers.push(Server {
            kind: Kind::Herald,
            plugin: args.plugin.as_deref(),
            label: if args.cluster_kafka_mock {
                format!("cluster-kafka-{n}")
            } else {
                format!("cluster-{n}")
            },
            bin: None,
            nodes: Some(n),
        });
    }
    match args.baseline {
        Some(Baseline::Raw) => servers.push(Server {
            kind: Kind::Raw,
            plugin: None,
            label: "raw".into(),
            bin: None,
            nodes: None,
        }),
        Some(Baseline::NoPlugin) => servers.push(Server {
            kind: Kind::Herald,
            plugin: None,
            label: "herald-no-plugin".into(),
            bin: None,
            nodes: None,
        }),
        None => {}
    }
    for p in &args.peers {
        servers.push(Server {
            kind: p.kind(),
            plugin: None,
            label: p.kind().as_str().into(),
            bin: None,
            nodes: None,
        });
    }
    // Peers take one message per request; with a peer in the run every server
    // does, unless each may use its own API (`--publish native`).
    let split = !args.peers.is_empty() && args.publish == PublishMode::PerMessage;
    let shares_writes = args.batch > 1 || args.subs_per_conn > 1;
    let deadline = Instant::now() + args.common.deadline();
    println!(
        "fanout: {} {} subscriber connection(s), {} channel(s), {} sub(s) each; {} msg/s per channel for {} s, {} per request{}, {} B payloads; servers: {}",
        fmt_int(args.subs as u64),
        args.transport.as_str(),
        args.channels.max(1),
        args.subs_per_conn.clamp(1, args.channels.max(1)),
        rates.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "),
        args.duration_secs,
        args.batch.max(1),
        if split { " (one message per request)" } else { "" },
        args.payload_bytes,
        servers.iter().map(|s| s.label.as_str()).collect::<Vec<_>>().join(", "),
    );
    let mut broken = vec![false; servers.len()];
    let mut all: Vec<Outcome> = Vec::new();
    for &rate in &rates {
        let plan = Plan {
            channels: args.channels.max(1),
            rate,
            batch: args.batch.max(1),
            duration_secs: args.duration_secs,
            payload_bytes: args.payload_bytes,
        };
        let mut outcomes: Vec<Outcome> = Vec::new();
        for (i, srv) in servers.iter().enumerate() {
            if broken[i] {
                continue;
            }
            println!("{} at {rate} msg/s per channel:", srv.label);
            let o = one(&args, &plan, srv, split, deadline).await?;
            print_outcome(&o);
            let lost = o.offered.saturating_sub(o.stats.msgs) + o.dropped_by_server;
            let slip = o.publish_secs / args.duration_secs;
            if breaks(
                o.drained,
                lost,
                o.latency().percentile(99.0),
                args.break_p99_ms,
                slip,
            ) {
                println!(
                    "  {} breaks at {rate} msg/s per channel (lost or late frames, p99 over {} ms, or publishing took {slip:.1}× the planned time)",
                    srv.label, args.break_p99_ms
                );
                broken[i] = true;
            }
            outcomes.push(o);
        }
        let herald = outcomes.iter().find(|o| o.label == "herald");
        println!("summary at {rate} msg/s per channel:");
        let mut ratios = serde_json::Map::new();
        if let Some(h) = herald {
            for o in outcomes.iter().filter(|o| o.label != "herald") {
                let r = ratio(h.fps().unwrap_or(f64::NAN), o.fps().unwrap_or(f64::NAN));
                let target = target_ratio(&o.label, shares_writes);
                println!(
                    "  herald / {} = {} frames per server CPU-second ({} vs {}){}",
                    o.label,
                    fmt_ratio(r),
                    fmt_rate(h.fps()),
                    fmt_rate(o.fps()),
                    target
                        .map(|t| format!("; target ≥ {t}×: {}", verdict(r, t, false)))
                        .unwrap_or_default()
                );
                ratios.insert(o.label.clone(), r.into());
            }
        }
        for o in &outcomes {
            let mut line = json!({
                "scenario": "fanout",
                "server": o.kind.as_str(),
                "label": o.label,
                "params": params(&args, &plan, split),
            });
            merge(&mut line, o.json());
            if o.label == "herald" {
                merge(
                    &mut line,
                    json!({
                        "ratios": ratios,
                        "plugin": args.plugin.as_ref().map(|p| p.display().to_string()),
                    }),
                );
            }
            args.common.record(line)?;
        }
        all.extend(outcomes);
    }
    if rates.len() > 1 {
        let path = crate::report::plot_path(&args.common, "fanout-latency");
        draw_latency(&all, &args, &path)?;
        crate::report::show_plot(&args.common, &path);
    }
    if args.common.smoke {
        println!("  (smoke scale: CPU figures are near /proc's 10 ms resolution and say nothing about performance)");
        for o in &all {
            smoke_check(o)?;
        }
        println!("smoke checks passed");
    }
    Ok(())
}

fn params(args: &FanoutArgs, plan: &Plan, split: bool) -> serde_json::Value {
    json!({
        "subs": args.subs,
        "transport": args.transport.as_str(),
        "channels": plan.channels,
        "subs_per_conn": args.subs_per_conn.clamp(1, plan.channels),
        "rate_per_channel": plan.rate,
        "duration_secs": plan.duration_secs,
        "batch": plan.batch,
        "one_message_per_request": split,
        "payload_bytes": plan.payload_bytes,
        "smoke": args.common.smoke,
        "herald_args": args.common.herald_args,
    })
}

/// p50 and p99 against offered frames per second, one line each per server.
fn draw_latency(all: &[Outcome], args: &FanoutArgs, path: &std::path::Path) -> anyhow::Result<()> {
    let mut series = Vec::new();
    let mut labels: Vec<&str> = Vec::new();
    for o in all {
        if !labels.contains(&o.label.as_str()) {
            labels.push(&o.label);
        }
    }
    for label in labels {
        for (pct, name) in [(50.0, "p50"), (99.0, "p99")] {
            let points = all
                .iter()
                .filter(|o| o.label == label)
                .filter_map(|o| {
                    // Every subscription receives `rate` messages per second.
                    let offered = o.rate
                        * args.subs as f64
                        * args.subs_per_conn.clamp(1, args.channels.max(1)) as f64;
                    Some((offered, o.latency().percentile(pct)? as f64 / 1000.0))
                })
                .collect();
            series.push(crate::plot::Series {
                name: format!("{label} {name}"),
                points,
            });
        }
    }
    crate::plot::draw(
        &crate::plot::Chart {
            title: format!(
                "fan-out latency: {} subscribers, {} channel(s), {} B",
                args.subs, args.channels, args.payload_bytes
            ),
            x_label: "offered frames per second".into(),
            y_label: "publish → receive latency (ms)".into(),
            log_x: true,
            log_y: true,
            series,
        },
        path,
    )
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
            o.label,
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
        bail!("{} smoke check failed: nothing was delivered", o.label);
    }
    Ok(())
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

fn print_outcome(o: &Outcome) {
    let name = &o.label;
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

/// Starts a server of `kind` (Herald with `plugin` active, if given).
pub async fn start(
    kind: Kind,
    c: &CommonArgs,
    plugin: Option<&std::path::Path>,
) -> anyhow::Result<Target> {
    start_bin(kind, c, plugin, &c.herald).await
}

/// [`start`] with Herald from `bin`.
async fn start_bin(
    kind: Kind,
    c: &CommonArgs,
    plugin: Option<&std::path::Path>,
    bin: &std::path::Path,
) -> anyhow::Result<Target> {
    match kind {
        Kind::Herald => {
            let t = Target::herald(bin, &c.herald_args).await?;
            if let Some(p) = plugin {
                t.install_plugin(p).await?;
            }
            Ok(t)
        }
        Kind::Raw => Target::raw().await,
        Kind::Nchan => Target::peer(Peer::Nchan).await,
        Kind::Python => Target::peer(Peer::Python).await,
    }
}

async fn one(
    args: &FanoutArgs,
    plan: &Plan,
    srv: &Server<'_>,
    split: bool,
    deadline: Instant,
) -> anyhow::Result<Outcome> {
    let c = &args.common;
    let kind = srv.kind;
    // Kept for the server's life: its publish topic lives in it.
    let mut _kafka = None;
    let mut server = match (srv.nodes, &args.cluster_db) {
        (Some(n), Some(db)) => {
            let mut extra = c.herald_args.clone();
            if args.cluster_kafka_mock {
                let mock = rdkafka::mocking::MockCluster::new(1)
                    .context("starting the Kafka mock cluster")?;
                mock.create_topic(&format!("herald.publish.{}", crate::target::TENANT), 1, 1)
                    .context("creating the publish topic")?;
                extra.extend(["--cluster-kafka".to_string(), mock.bootstrap_servers()]);
                _kafka = Some(mock);
            }
            let t = Target::herald_cluster(&c.herald, &extra, n, db).await?;
            if let Some(p) = srv.plugin {
                t.install_plugin(p).await?;
            }
            t
        }
        _ => start_bin(kind, c, srv.plugin, srv.bin.unwrap_or(&c.herald)).await?,
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let spec = PoolSpec {
        channels: plan.channels,
        subs_per_conn: args.subs_per_conn,
        connect_concurrency: c.connect_concurrency,
        ..PoolSpec::new(&server, args.transport, left + Duration::from_secs(5))
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

    let sent = publish_plan(&server, plan, split, deadline).await?;
    let publish_secs = t0.elapsed().as_secs_f64();
    // A cluster answers once the log has the message, before any node
    // delivered it: what is offered is every subscription of its channel.
    let offered = match srv.nodes {
        Some(_) => {
            let subscriptions =
                ready.connected as u64 * args.subs_per_conn.clamp(1, plan.channels) as u64;
            sent.messages * subscriptions / plan.channels as u64
        }
        None => sent.delivered,
    };
    let drained = drain(&mut pool, offered, args.drain_secs, deadline).await?;
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
        label: srv.label.clone(),
        rate: plan.rate,
        ready,
        workers: pool.len(),
        requests: sent.requests,
        published: sent.messages,
        publish_errors: sent.errors,
        first_publish_error: sent.first_error,
        offered,
        dropped_by_server: sent.dropped,
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

/// Publishes `plan` on one keep-alive connection, on its fixed schedule.
pub async fn publish_plan(
    server: &Target,
    plan: &Plan,
    split: bool,
    deadline: Instant,
) -> anyhow::Result<Published> {
    let t0 = Instant::now();
    let mut http = server.publisher();
    let mut counters = Vec::new();
    let mut sent = Published::default();
    let rounds = plan.requests();
    let mut shown = Instant::now();
    for i in 0..rounds {
        tokio::time::sleep_until((t0 + plan.period().mul_f64(i as f64)).into()).await;
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            println!(
                "  … {:.0} s: {} of {} rounds published, {} frames queued by the server",
                t0.elapsed().as_secs_f64(),
                fmt_int(i),
                fmt_int(rounds),
                fmt_int(sent.delivered)
            );
        }
        let msgs = plan.messages(now_nanos(), &mut counters);
        sent.add(server.publish(&mut http, &msgs, split).await);
        if Instant::now() > deadline {
            bail!("overall deadline reached while publishing");
        }
    }
    Ok(sent)
}

/// How often a long step shows where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Waits until the pool has received `expected` msg frames (true), or
/// delivery stalls for 2 s, or `drain_secs` or the deadline pass (false).
pub async fn drain(
    pool: &mut Pool,
    expected: u64,
    drain_secs: f64,
    deadline: Instant,
) -> anyhow::Result<bool> {
    let until = Instant::now() + Duration::from_secs_f64(drain_secs);
    let (mut last, mut last_change) = (0, Instant::now());
    let mut shown = Instant::now();
    loop {
        let msgs = pool.progress().await?.msgs;
        if msgs >= expected {
            return Ok(true);
        }
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            println!(
                "  … draining: {} of {} frames received",
                fmt_int(msgs),
                fmt_int(expected)
            );
        }
        if msgs != last {
            last = msgs;
            last_change = Instant::now();
        }
        if last_change.elapsed() > Duration::from_secs(2)
            || Instant::now() > until
            || Instant::now() > deadline
        {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
        let p = payload(t, "c3", 42, 100);
        assert_eq!(p.len(), 100);
        let v: serde_json::Value = serde_json::from_str(&p).unwrap();
        assert_eq!(
            (v["t"].as_u64(), v["ch"].as_str(), v["n"].as_u64()),
            (Some(t), Some("c3"), Some(42))
        );
        // Too small a size still gives a valid payload.
        assert!(serde_json::from_str::<serde_json::Value>(&payload(t, "c0", 1, 3)).is_ok());
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
    fn messages_number_each_channel() {
        let mut counters = Vec::new();
        let m = plan(3, 10.0, 2).messages(5, &mut counters);
        let got: Vec<(String, u64)> = m
            .iter()
            .map(|(ch, d)| {
                let v: serde_json::Value = serde_json::from_str(d).unwrap();
                assert_eq!(v["ch"].as_str(), Some(ch.as_str()));
                (ch.clone(), v["n"].as_u64().unwrap())
            })
            .collect();
        let want = [
            ("c0", 1),
            ("c0", 2),
            ("c1", 1),
            ("c1", 2),
            ("c2", 1),
            ("c2", 2),
        ];
        assert_eq!(
            got,
            want.iter()
                .map(|(c, n)| (c.to_string(), *n))
                .collect::<Vec<_>>()
        );
        // The next request continues each channel's numbering.
        let m = plan(3, 10.0, 2).messages(6, &mut counters);
        assert!(m[0].1.contains(r#""n":3"#) && m[5].1.contains(r#""n":4"#));
    }

    #[test]
    fn breaking_and_targets() {
        assert!(!breaks(true, 0, Some(900_000), 1000.0, 1.1));
        assert!(breaks(true, 0, Some(1_100_000), 1000.0, 1.0));
        assert!(breaks(false, 0, Some(1), 1000.0, 1.0));
        assert!(breaks(true, 3, None, 1000.0, 1.0));
        assert!(breaks(true, 0, Some(1), 1000.0, 4.0));
        assert_eq!(target_ratio("nchan", false), Some(1.2));
        assert_eq!(target_ratio("nchan", true), Some(3.0));
        assert_eq!(target_ratio("raw", true), Some(0.9));
        assert_eq!(target_ratio("python-websockets", false), None);
    }
}
