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

mod drive;
mod report;
use drive::*;
pub use drive::{drain, publish_plan, start};
use report::*;

/// Herald must reach this share of the same-run one-write-per-frame limit.
pub const TARGET_RATIO_TO_RAW: f64 = 0.95;
/// Herald / nchan frames per server CPU-second where each frame needs its own write…
pub const TARGET_RATIO_TO_NCHAN: f64 = 1.2;
/// …where frames can share a write (batches, several channels per connection)…
pub const TARGET_RATIO_TO_NCHAN_SHARED: f64 = 3.0;
/// …and where the publish requests are most of the work (one message per
/// request, ten subscribers per channel or fewer).
pub const TARGET_RATIO_TO_NCHAN_PUBLISH: f64 = 1.0;
/// Herald / uWebSockets where each frame needs its own write.
pub const TARGET_RATIO_TO_UWS: f64 = 1.2;
/// With a plugin, within 10 % of the same Herald without it.
pub const TARGET_RATIO_TO_NO_PLUGIN: f64 = 0.9;

/// What a fan-out run mostly costs the server, which decides the targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Frames share writes (batches, several channels per connection).
    SharedWrites,
    /// A write per frame, many subscribers per publish request.
    PerFrame,
    /// A write per frame, ten subscribers per channel or fewer: the publish
    /// requests are most of the work.
    PublishBound,
}

impl Load {
    fn of(args: &FanoutArgs) -> Load {
        let per_channel = (args.subs * args.subs_per_conn) / args.channels.max(1);
        if args.batch > 1 || args.subs_per_conn > 1 {
            Load::SharedWrites
        } else if per_channel <= 10 {
            Load::PublishBound
        } else {
            Load::PerFrame
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishMode {
    PerMessage,
    Native,
    /// One message per request for every server, with or without a peer in
    /// the run (a Herald against another build: the publish path's A/B).
    Single,
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
    /// request, their own batch API; the peers still get one per request);
    /// `single`: one message per request whether or not peers run.
    #[arg(long, value_enum, default_value_t = PublishMode::PerMessage)]
    pub publish: PublishMode,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// Runs every server this many times in turn at each rate (A B C, A B
    /// C, …): each round is a same-run pair; the summary gives each pair's
    /// ratio and their median.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
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
    /// Also run Herald with permessage-deflate for messages of at least this
    /// many bytes (`--deflate-min-bytes`), its clients offering it: frames
    /// per server CPU-second and bytes on the wire beside plain Herald, in
    /// the same run.
    #[arg(long)]
    pub deflate: Option<usize>,
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
    /// Waits of Herald's writers holding off for lagging readers.
    lagging_holds: Option<f64>,
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
            "wire_bytes": self.stats.wire_bytes,
            "wire_bytes_per_frame": ratio(self.stats.wire_bytes as f64, self.stats.msgs as f64),
            "server_cpu_secs": self.server_cpu,
            "frames_per_server_cpu_sec": self.fps(),
            "frames_per_write": self.frames_per_write,
            "lagging_holds": self.lagging_holds,
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
    /// permessage-deflate for messages of at least this many bytes.
    deflate: Option<usize>,
}

/// Whether an outcome means the server broke at this rate: frames lost or
/// stuck, p99 above `break_p99_ms`, or publishing took a quarter longer than
/// planned (`slip`: the server could not take the offered rate).
pub fn breaks(drained: bool, lost: u64, p99_us: Option<u64>, break_p99_ms: f64, slip: f64) -> bool {
    !drained || lost > 0 || slip > 1.25 || p99_us.is_some_and(|p| p as f64 / 1000.0 > break_p99_ms)
}

/// The ratio Herald must reach against a server of this label, if any.
pub fn target_ratio(label: &str, load: Load) -> Option<f64> {
    match (label, load) {
        ("raw", _) => Some(TARGET_RATIO_TO_RAW),
        ("nchan", Load::SharedWrites) => Some(TARGET_RATIO_TO_NCHAN_SHARED),
        ("nchan", Load::PerFrame) => Some(TARGET_RATIO_TO_NCHAN),
        ("nchan", Load::PublishBound) => Some(TARGET_RATIO_TO_NCHAN_PUBLISH),
        ("uwebsockets", Load::PerFrame) => Some(TARGET_RATIO_TO_UWS),
        ("herald-no-plugin", _) => Some(TARGET_RATIO_TO_NO_PLUGIN),
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
        && (args.baseline == Some(Baseline::Raw)
            || args.peers.contains(&Peer::Python)
            || args.peers.contains(&Peer::Uws))
    {
        bail!("the raw baseline, the Python and the uWebSockets peers speak WebSocket only; use --transport ws");
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
        deflate: None,
    }];
    if let Some(min) = args.deflate {
        servers.push(Server {
            kind: Kind::Herald,
            plugin: args.plugin.as_deref(),
            label: "herald-deflate".into(),
            bin: None,
            nodes: None,
            deflate: Some(min),
        });
    }
    if let Some(bin) = &args.baseline_herald {
        servers.push(Server {
            kind: Kind::Herald,
            plugin: args.plugin.as_deref(),
            label: "herald-baseline".into(),
            bin: Some(bin),
            nodes: None,
            deflate: None,
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
            deflate: None,
        });
    }
    match args.baseline {
        Some(Baseline::Raw) => servers.push(Server {
            kind: Kind::Raw,
            plugin: None,
            label: "raw".into(),
            bin: None,
            nodes: None,
            deflate: None,
        }),
        Some(Baseline::NoPlugin) => servers.push(Server {
            kind: Kind::Herald,
            plugin: None,
            label: "herald-no-plugin".into(),
            bin: None,
            nodes: None,
            deflate: None,
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
            deflate: None,
        });
        // uWebSockets compresses too (its shared compressor): beside Herald's.
        if *p == Peer::Uws && args.deflate.is_some() {
            servers.push(Server {
                kind: Kind::Uws,
                plugin: None,
                label: "uwebsockets-deflate".into(),
                bin: None,
                nodes: None,
                deflate: args.deflate,
            });
        }
    }
    // Peers take one message per request; with a peer in the run every server
    // does, unless each may use its own API (`--publish native`).
    let split = args.publish == PublishMode::Single
        || (!args.peers.is_empty() && args.publish == PublishMode::PerMessage);
    let load = Load::of(&args);
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
        let mut pairs: Vec<serde_json::Map<String, serde_json::Value>> = Vec::new();
        for round in 0..args.repeat.max(1) {
            if args.repeat > 1 {
                println!("round {} of {}:", round + 1, args.repeat);
            }
            let outcomes = round_at(&args, &plan, &servers, &mut broken, split, deadline).await?;
            let ratios = summarize(rate, &outcomes, load);
            for o in &outcomes {
                let mut line = json!({
                    "scenario": "fanout",
                    "server": o.kind.as_str(),
                    "label": o.label,
                    "round": round,
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
            pairs.push(ratios);
            all.extend(outcomes);
        }
        if pairs.len() > 1 {
            print_medians(rate, &pairs, load);
        }
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
        "deflate_min_bytes": args.deflate,
    })
}

#[cfg(test)]
mod tests;
