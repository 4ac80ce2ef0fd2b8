//! Flags shared by every scenario.
//!
//! Owns: the Herald binary path and extra `herald serve` flags, the overall
//! deadline, how connections spread over worker processes, where results go,
//! and the `--smoke` switch that shrinks a scenario to a few seconds.

use crate::report;
use std::path::PathBuf;
use std::time::Duration;

fn default_herald() -> PathBuf {
    report::bench_dir()
        .join("..")
        .join("target")
        .join("release")
        .join("herald")
}

#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// The Herald binary (a release build).
    #[arg(long, default_value_os_t = default_herald())]
    pub herald: PathBuf,
    /// Extra flag for `herald serve`, repeatable: --herald-arg=--queue-bytes=65536
    #[arg(long = "herald-arg", allow_hyphen_values = true)]
    pub herald_args: Vec<String>,
    /// Hard limit on the whole scenario, in seconds; every child is killed at the end.
    #[arg(long, default_value_t = 120)]
    pub deadline_secs: u64,
    /// Most client sockets one worker process holds (the open-files hard limit is per process).
    #[arg(long, default_value_t = 9000)]
    pub max_per_worker: usize,
    /// Worker processes (at least as many as --max-per-worker requires).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Connections each worker opens at the same time.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// JSON-lines file that every run is appended to.
    #[arg(long, default_value_os_t = report::default_results_path())]
    pub results: PathBuf,
    /// Do not append to the results file.
    #[arg(long)]
    pub no_record: bool,
    /// Tiny scale (50 connections, about a second of traffic) for scripts and CI.
    #[arg(long)]
    pub smoke: bool,
}

impl CommonArgs {
    pub fn deadline(&self) -> Duration {
        Duration::from_secs(self.deadline_secs.max(1))
    }

    /// Appends one result line unless `--no-record`.
    pub fn record(&self, line: serde_json::Value) -> anyhow::Result<()> {
        if self.no_record {
            return Ok(());
        }
        report::record(&self.results, line)?;
        println!("  recorded in {}", self.results.display());
        Ok(())
    }
}
