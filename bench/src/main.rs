//! `bench`: Herald's load generator and benchmark scenarios.
//!
//! `bench idle` measures memory per idle connection; `bench fanout` measures
//! frames per server CPU-second and latency, optionally beside the raw
//! one-write-per-frame baseline. `bench worker` (hidden) and `bench raw-server`
//! are the child processes the scenarios start. Every scenario runs under an
//! overall deadline, talks to loopback only, and kills (by its own child
//! handles) everything it started, on success and on every error path.

mod client;
mod connect;
mod fanout;
mod hist;
mod http;
mod idle;
mod ingest;
mod opts;
mod plot;
mod plugin;
mod pool;
mod procs;
mod raw;
mod report;
mod slow;
mod swap;
mod target;
mod ticker;
mod track;
mod worker;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bench", about = "Herald benchmark scenarios (loopback only)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Idle connections: Herald RSS per connection.
    Idle(idle::IdleArgs),
    /// Fan-out: frames per server CPU-second, latency, gaps.
    Fanout(fanout::FanoutArgs),
    /// Ingest: Kafka or outbox records to subscribers (throughput, latency).
    Ingest(ingest::IngestArgs),
    /// The seed scenario: a stock ticker, conflated by the ticker plugin.
    Ticker(ticker::TickerArgs),
    /// Connection rate with and without plugin auth; reconnect storm.
    Connect(connect::ConnectArgs),
    /// Slow consumers: healthy clients' latency beside clients that stopped reading.
    Slow(slow::SlowArgs),
    /// Plugin cost: transform per message, authorize-connect latency, connect rate with jwt-auth.
    Plugin(plugin::PluginArgs),
    /// Hot swap under load: activate to serving, per plugin language.
    Swap(swap::SwapArgs),
    /// A process holding a share of the client connections (started by the scenarios).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// The baseline: a minimal WebSocket server with one write() per frame per subscriber.
    RawServer(raw::RawArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Worker(a) => worker::main(a),
        Cmd::RawServer(a) => raw::main(a),
        Cmd::Idle(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, idle::run(a))
        }
        Cmd::Ingest(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, ingest::run(a))
        }
        Cmd::Plugin(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, plugin::run(a))
        }
        Cmd::Ticker(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, ticker::run(a))
        }
        Cmd::Connect(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, connect::run(a))
        }
        Cmd::Slow(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, slow::run(a))
        }
        Cmd::Swap(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, swap::run(a))
        }
        Cmd::Fanout(a) => {
            let deadline = a.common.deadline();
            scenario(deadline, fanout::run(a))
        }
    }
}

/// Runs a scenario under its overall deadline. When the deadline fires the
/// scenario future is dropped, and with it every child-process guard.
fn scenario(
    deadline: std::time::Duration,
    f: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match tokio::time::timeout(deadline, f).await {
            Ok(r) => r,
            Err(_) => anyhow::bail!(
                "overall deadline of {deadline:?} reached; stopped every process this run started"
            ),
        }
    })
}
