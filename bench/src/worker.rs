//! `bench worker`: a child process that holds a share of the client connections.
//!
//! Owns: opening its connections (bounded concurrency, a few retries) from one
//! loopback source address, then serving the parent's commands on stdin
//! (`progress`, `stop`; end of input means stop) and answering with one JSON
//! line each on stdout ([`WorkerMsg`]); `storm` drops every connection at
//! once and reopens it without the connect-concurrency limit, timing each
//! return. One single-threaded runtime, so all
//! connections share one [`Stats`] without locks. It exits by itself at its
//! deadline or when the parent goes away (stdin closes).

use crate::client::{Conn, ConnSpec, Dialect, End, Transport, OPEN_TIMEOUT};
use crate::track::{failure_reason, Stats, StatsWire};
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::io::BufRead as _;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub target: SocketAddr,
    /// Local address every connection binds before connecting.
    #[arg(long)]
    pub source: IpAddr,
    #[arg(long, default_value = "bench")]
    pub tenant: String,
    /// Speak to a peer that delivers bare payloads, subscribing with this
    /// path (`{chs}` = the comma-separated channels) instead of Herald's protocol.
    #[arg(long)]
    pub bare_path: Option<String>,
    /// Never read after subscribing (a client that stopped reading).
    #[arg(long)]
    pub no_read: bool,
    /// SO_RCVBUF of every connection (default: the kernel's).
    #[arg(long)]
    pub rcvbuf: Option<u32>,
    /// Offer permessage-deflate.
    #[arg(long)]
    pub deflate: bool,
    #[arg(long, value_enum)]
    pub transport: Transport,
    #[arg(long)]
    pub conns: usize,
    /// Global index of this worker's first connection (decides its channels).
    #[arg(long, default_value_t = 0)]
    pub first_conn: usize,
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    #[arg(long, default_value_t = 1)]
    pub subs_per_conn: usize,
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    #[arg(long, default_value_t = 120)]
    pub deadline_secs: u64,
}

/// One line of a worker's stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    Ready {
        connected: usize,
        failed: usize,
        first_error: Option<String>,
        secs: f64,
    },
    Progress {
        msgs: u64,
        frames: u64,
        closed_early: u64,
        /// Connections open right now.
        #[serde(default)]
        open: usize,
        /// Connections back after a storm (since the worker started).
        #[serde(default)]
        reconnected: u64,
    },
    Report {
        stats: StatsWire,
        deadline_hit: bool,
    },
}

/// Name of channel number `i`.
pub fn channel_name(i: usize) -> String {
    format!("c{i}")
}

/// The channels connection number `conn` (global index) subscribes to:
/// `subs` consecutive channels starting at `conn * subs`, modulo `channels`.
pub fn channels_for(conn: usize, channels: usize, subs: usize) -> Vec<String> {
    let channels = channels.max(1);
    let subs = subs.clamp(1, channels);
    (0..subs)
        .map(|j| channel_name((conn * subs + j) % channels))
        .collect()
}

fn emit(msg: &WorkerMsg) {
    // stdout is line-buffered: one line reaches the parent whole.
    println!("{}", serde_json::to_string(msg).unwrap_or_default());
}

pub fn main(args: WorkerArgs) -> anyhow::Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, run(args))
}

/// Commands from the parent, read on a plain thread (stdin blocks).
fn stdin_commands() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(l.trim().to_string()).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        // Dropping `tx` tells the worker its parent is gone.
    });
    rx
}

async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.deadline_secs);
    let dialect = match &args.bare_path {
        Some(path) => Dialect::Bare { path: path.clone() },
        None => Dialect::Herald {
            tenant: args.tenant.clone(),
        },
    };
    let spec = ConnSpec {
        target: args.target,
        source: args.source,
        dialect,
        transport: args.transport,
        rcvbuf: args.rcvbuf,
        deflate: args.deflate,
    };
    let stats = Rc::new(RefCell::new(Stats::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (storm_tx, storm_rx) = watch::channel(0u64);
    let permits = Rc::new(Semaphore::new(args.connect_concurrency.max(1)));
    let connected = Rc::new(Cell::new(0usize));
    let failed = Rc::new(Cell::new(0usize));
    let open = Rc::new(Cell::new(0usize));
    let first_error: Rc<RefCell<Option<String>>> = Rc::default();
    let mut tasks = Vec::with_capacity(args.conns);
    for i in 0..args.conns {
        let channels = channels_for(args.first_conn + i, args.channels, args.subs_per_conn);
        let (spec, stats, stop_rx, storm_rx, permits) = (
            spec.clone(),
            stats.clone(),
            stop_rx.clone(),
            storm_rx.clone(),
            permits.clone(),
        );
        let (connected, failed, open, first_error) = (
            connected.clone(),
            failed.clone(),
            open.clone(),
            first_error.clone(),
        );
        let read = !args.no_read;
        tasks.push(tokio::task::spawn_local(async move {
            // Set while reconnecting after a storm: when it was called.
            let mut storm_at: Option<Instant> = None;
            loop {
                let conn = match storm_at {
                    None => {
                        let _permit = permits.acquire().await.ok();
                        open_retrying(&spec, &channels, &stats, &stop_rx, 3, i).await
                    }
                    // A storm: everyone at once, no concurrency limit.
                    Some(_) => {
                        open_retrying(&spec, &channels, &stats, &stop_rx, STORM_ATTEMPTS, i).await
                    }
                };
                let c = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        if storm_at.is_none() {
                            failed.set(failed.get() + 1);
                            first_error.borrow_mut().get_or_insert(e);
                        }
                        return;
                    }
                };
                match storm_at.take() {
                    Some(t) => stats
                        .borrow_mut()
                        .reconnect_us
                        .record(t.elapsed().as_micros() as u64),
                    None => connected.set(connected.get() + 1),
                }
                open.set(open.get() + 1);
                let end = c
                    .run(stop_rx.clone(), storm_rx.clone(), stats.clone(), read)
                    .await;
                open.set(open.get() - 1);
                match end {
                    End::Storm => storm_at = Some(Instant::now()),
                    End::Stopped | End::Closed => return,
                }
            }
        }));
    }
    while connected.get() + failed.get() < args.conns && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    emit(&WorkerMsg::Ready {
        connected: connected.get(),
        failed: args.conns - connected.get(),
        first_error: first_error.borrow().clone(),
        secs: started.elapsed().as_secs_f64(),
    });
    let mut commands = stdin_commands();
    let mut deadline_hit = false;
    loop {
        tokio::select! {
            cmd = commands.recv() => match cmd.as_deref() {
                Some("progress") => {
                    let s = stats.borrow();
                    emit(&WorkerMsg::Progress { msgs: s.msgs, frames: s.frames, closed_early: s.closed_early, open: open.get(), reconnected: s.reconnect_us.count() });
                }
                Some("storm") => storm_tx.send_modify(|g| *g += 1),
                Some("stop") | None => break,
                Some(_) => {}
            },
            _ = tokio::time::sleep_until(deadline) => {
                deadline_hit = true;
                break;
            }
        }
    }
    stop_tx.send(true).context("stopping connections")?;
    let wait_all = async {
        for t in &mut tasks {
            let _ = t.await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), wait_all)
        .await
        .is_err()
    {
        for t in &tasks {
            t.abort();
        }
    }
    let report = stats.borrow().to_wire();
    emit(&WorkerMsg::Report {
        stats: report,
        deadline_hit,
    });
    Ok(())
}

/// Attempts a reconnecting client makes after a storm before giving up.
const STORM_ATTEMPTS: u32 = 20;

/// Backoff before attempt `attempt + 1`: doubling from 50 ms up to 2 s, spread
/// by up to half again per connection so retries do not arrive in lockstep.
pub fn backoff(attempt: u32, conn: usize) -> Duration {
    let base = 50u64 << attempt.min(6);
    let base = base.min(2_000);
    let jitter = (conn as u64).wrapping_mul(2_654_435_761) % (base / 2 + 1);
    Duration::from_millis(base + jitter)
}

/// Opens a connection, retrying up to `attempts` times; every failed attempt
/// is counted by reason. Gives up early when the worker is stopping.
async fn open_retrying(
    spec: &ConnSpec,
    channels: &[String],
    stats: &RefCell<Stats>,
    stop: &watch::Receiver<bool>,
    attempts: u32,
    conn: usize,
) -> Result<Conn, String> {
    let mut attempt = 0;
    loop {
        let err = match tokio::time::timeout(OPEN_TIMEOUT, Conn::open(spec, channels, stats)).await
        {
            Ok(Ok(c)) => return Ok(c),
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => format!("no handshake/ack within {OPEN_TIMEOUT:?}"),
        };
        stats.borrow_mut().count_failure(&failure_reason(&err));
        attempt += 1;
        if attempt >= attempts || *stop.borrow() {
            return Err(err);
        }
        tokio::time::sleep(backoff(attempt - 1, conn)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_assignment() {
        assert_eq!(channels_for(0, 1, 1), vec!["c0"]);
        assert_eq!(channels_for(7, 1, 3), vec!["c0"]);
        assert_eq!(channels_for(0, 100, 4), vec!["c0", "c1", "c2", "c3"]);
        assert_eq!(channels_for(25, 100, 4), vec!["c0", "c1", "c2", "c3"]);
        assert_eq!(channels_for(3, 10, 4), vec!["c2", "c3", "c4", "c5"]);
    }

    #[test]
    fn backoff_doubles_with_spread() {
        assert!(backoff(0, 0) >= Duration::from_millis(50));
        assert!(backoff(0, 7) <= Duration::from_millis(75));
        assert!(backoff(3, 1) >= Duration::from_millis(400));
        assert!(backoff(30, 5) <= Duration::from_millis(3_000));
        // Different connections get different delays.
        let d: std::collections::HashSet<_> = (0..20).map(|c| backoff(2, c)).collect();
        assert!(d.len() > 5);
    }

    #[test]
    fn messages_roundtrip() {
        let m = WorkerMsg::Ready {
            connected: 3,
            failed: 1,
            first_error: Some("x".into()),
            secs: 0.5,
        };
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.starts_with(r#"{"type":"ready""#), "{s}");
        assert!(matches!(
            serde_json::from_str(&s).unwrap(),
            WorkerMsg::Ready { connected: 3, .. }
        ));
        // A report with a filled histogram survives the internally tagged enum.
        let mut st = Stats::default();
        st.latency_us.record(1_234_567);
        st.count_close(4001);
        let s = serde_json::to_string(&WorkerMsg::Report {
            stats: st.to_wire(),
            deadline_hit: true,
        })
        .unwrap();
        match serde_json::from_str(&s).unwrap() {
            WorkerMsg::Report {
                stats,
                deadline_hit,
            } => {
                assert!(deadline_hit);
                assert_eq!(Stats::from_wire(&stats).latency_us, st.latency_us);
            }
            other => panic!("{other:?}"),
        }
    }
}
