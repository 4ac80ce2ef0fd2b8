//! The parent's side of the worker processes.
//!
//! Owns: splitting N connections over worker processes (each at most
//! `max_per_worker`, each from its own source address 127.0.0.2, .3, …),
//! spawning them as `bench worker …` children of this very binary, talking to
//! them over stdin/stdout ([`WorkerMsg`] lines), and their CPU time. Every
//! worker is held by a [`ChildGuard`], so an error anywhere kills them all.

use crate::client::{Dialect, Transport};
use crate::procs::{self, ChildGuard};
use crate::track::Stats;
use crate::worker::WorkerMsg;
use anyhow::{bail, Context as _};
use std::io::{BufRead as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;

/// What every worker of a pool connects to and subscribes.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    pub target: SocketAddr,
    pub dialect: Dialect,
    pub transport: Transport,
    pub channels: usize,
    pub subs_per_conn: usize,
    pub connect_concurrency: usize,
    pub deadline: Duration,
    /// Clients that never read after subscribing.
    pub no_read: bool,
    /// SO_RCVBUF of every client (None: the kernel's default).
    pub rcvbuf: Option<u32>,
    /// Clients that offer permessage-deflate.
    pub deflate: bool,
}

impl PoolSpec {
    /// A pool of Herald-protocol (or raw baseline) clients of the bench tenant,
    /// or of a peer's bare-payload clients, as the target speaks.
    pub fn new(
        target: &crate::target::Target,
        transport: Transport,
        deadline: Duration,
    ) -> PoolSpec {
        PoolSpec {
            target: target.addr,
            dialect: target.dialect(),
            transport,
            channels: 1,
            subs_per_conn: 1,
            connect_concurrency: 256,
            deadline,
            no_read: false,
            rcvbuf: None,
            deflate: false,
        }
    }
}

/// Totals of a `progress` round over every worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub msgs: u64,
    pub frames: u64,
    pub closed_early: u64,
    /// Connections open right now.
    pub open: usize,
    /// Connections back after a storm.
    pub reconnected: u64,
}

struct WorkerProc {
    guard: ChildGuard,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

pub struct Pool {
    workers: Vec<WorkerProc>,
}

/// Connections summed over workers once they are all set up.
#[derive(Debug, Clone, Default)]
pub struct Ready {
    pub connected: usize,
    pub failed: usize,
    pub first_error: Option<String>,
    pub secs: f64,
}

/// Splits `total` into `parts` near-equal shares, larger ones first.
pub fn split(total: usize, parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    (0..parts)
        .map(|i| total / parts + usize::from(i < total % parts))
        .collect()
}

/// How many workers `total` connections need.
pub fn worker_count(total: usize, max_per_worker: usize, requested: Option<usize>) -> usize {
    let needed = total.div_ceil(max_per_worker.max(1)).max(1);
    requested
        .map_or(needed, |r| r.max(needed))
        .min(total.max(1))
        .min(250)
}

/// Source address of worker `i`: 127.0.0.2, 127.0.0.3, …
pub fn source_addr(i: usize) -> IpAddr {
    let n = 2 + i;
    IpAddr::V4(Ipv4Addr::new(127, 0, (n / 256) as u8, (n % 256) as u8))
}

impl Pool {
    pub fn spawn(
        spec: &PoolSpec,
        total: usize,
        max_per_worker: usize,
        requested: Option<usize>,
    ) -> anyhow::Result<Pool> {
        let exe = std::env::current_exe().context("finding the bench binary")?;
        let n = worker_count(total, max_per_worker, requested);
        let mut workers = Vec::with_capacity(n);
        let mut first = 0;
        for (i, conns) in split(total, n).into_iter().enumerate() {
            let mut cmd = Command::new(&exe);
            cmd.arg("worker");
            let tenant = match &spec.dialect {
                Dialect::Herald { tenant } => tenant.as_str(),
                Dialect::Bare { path } => {
                    cmd.args(["--bare-path", path]);
                    "bench"
                }
            };
            if spec.no_read {
                cmd.arg("--no-read");
            }
            if spec.deflate {
                cmd.arg("--deflate");
            }
            if let Some(bytes) = spec.rcvbuf {
                cmd.args(["--rcvbuf", &bytes.to_string()]);
            }
            cmd.args(["--target", &spec.target.to_string()])
                .args(["--source", &source_addr(i).to_string()])
                .args(["--tenant", tenant])
                .args(["--transport", spec.transport.as_str()])
                .args(["--conns", &conns.to_string()])
                .args(["--first-conn", &first.to_string()])
                .args(["--channels", &spec.channels.to_string()])
                .args(["--subs-per-conn", &spec.subs_per_conn.to_string()])
                .args([
                    "--connect-concurrency",
                    &spec.connect_concurrency.to_string(),
                ])
                .args([
                    "--deadline-secs",
                    &spec.deadline.as_secs().max(1).to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = cmd.spawn().context("spawning a bench worker")?;
            let stdin = child.stdin.take();
            let stdout = child.stdout.take().context("worker stdout")?;
            let (tx, lines) = mpsc::unbounded_channel();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    match line {
                        Ok(l) => {
                            if tx.send(l).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
            workers.push(WorkerProc {
                guard: ChildGuard::new(format!("worker {i}"), child),
                stdin,
                lines,
            });
            first += conns;
        }
        Ok(Pool { workers })
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.guard.pid()).collect()
    }

    /// CPU seconds used so far by all workers.
    pub fn cpu_secs(&self) -> f64 {
        self.pids()
            .into_iter()
            .filter_map(|p| procs::cpu_secs(p).ok())
            .sum()
    }

    fn send_all(&mut self, cmd: &str) -> anyhow::Result<()> {
        for w in &mut self.workers {
            let stdin = w.stdin.as_mut().context("worker stdin already closed")?;
            writeln!(stdin, "{cmd}")
                .and_then(|_| stdin.flush())
                .with_context(|| format!("{} stdin", w.guard.name()))?;
        }
        Ok(())
    }

    /// Next message of worker `i`, skipping lines that are not messages.
    async fn next_msg(w: &mut WorkerProc, timeout: Duration) -> anyhow::Result<WorkerMsg> {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let line = match tokio::time::timeout_at(until, w.lines.recv()).await {
                Ok(Some(l)) => l,
                Ok(None) => {
                    let status = w.guard.exited();
                    bail!(
                        "{} ended its output (exit status {status:?})",
                        w.guard.name()
                    )
                }
                Err(_) => bail!("{} did not answer within {timeout:?}", w.guard.name()),
            };
            match serde_json::from_str(&line) {
                Ok(m) => return Ok(m),
                Err(_) => eprintln!("bench: {}: {line}", w.guard.name()),
            }
        }
    }

    /// Waits until every worker has opened (or given up on) its connections.
    pub async fn ready(&mut self, timeout: Duration) -> anyhow::Result<Ready> {
        let mut r = Ready::default();
        for w in &mut self.workers {
            match Self::next_msg(w, timeout).await? {
                WorkerMsg::Ready {
                    connected,
                    failed,
                    first_error,
                    secs,
                } => {
                    r.connected += connected;
                    r.failed += failed;
                    r.secs = r.secs.max(secs);
                    if r.first_error.is_none() {
                        r.first_error = first_error;
                    }
                }
                other => bail!("{}: expected ready, got {other:?}", w.guard.name()),
            }
        }
        Ok(r)
    }

    /// Frames received and connections open so far, over every worker.
    pub async fn progress(&mut self) -> anyhow::Result<Progress> {
        self.send_all("progress")?;
        let mut total = Progress::default();
        for w in &mut self.workers {
            loop {
                match Self::next_msg(w, Duration::from_secs(10)).await? {
                    WorkerMsg::Progress {
                        msgs,
                        frames,
                        closed_early,
                        open,
                        reconnected,
                    } => {
                        total.reconnected += reconnected;
                        total.msgs += msgs;
                        total.frames += frames;
                        total.closed_early += closed_early;
                        total.open += open;
                        break;
                    }
                    _ => continue,
                }
            }
        }
        Ok(total)
    }

    /// Tells every worker to drop all its connections at once and reconnect.
    pub fn storm(&mut self) -> anyhow::Result<()> {
        self.send_all("storm")
    }

    /// Stops every worker and merges their reports; reaps the processes.
    pub async fn stop(&mut self) -> anyhow::Result<(Stats, bool)> {
        self.send_all("stop")?;
        let mut all = Stats::default();
        let mut deadline_hit = false;
        for w in &mut self.workers {
            loop {
                match Self::next_msg(w, Duration::from_secs(15)).await? {
                    WorkerMsg::Report {
                        stats,
                        deadline_hit: d,
                    } => {
                        all.merge(&Stats::from_wire(&stats));
                        deadline_hit |= d;
                        break;
                    }
                    _ => continue,
                }
            }
            w.stdin = None;
            w.guard.stop(Duration::from_secs(5));
        }
        Ok((all, deadline_hit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_connections() {
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(10_000, 2), vec![5_000, 5_000]);
        assert_eq!(split(5, 1), vec![5]);
        assert_eq!(split(7, 0), vec![7]);
        assert_eq!(worker_count(10_000, 9_000, None), 2);
        assert_eq!(worker_count(50, 9_000, None), 1);
        assert_eq!(worker_count(50, 9_000, Some(4)), 4);
        assert_eq!(worker_count(3, 9_000, Some(8)), 3);
        assert_eq!(worker_count(20_000, 9_000, Some(1)), 3);
        assert_eq!(source_addr(0).to_string(), "127.0.0.2");
        assert_eq!(source_addr(3).to_string(), "127.0.0.5");
    }
}
