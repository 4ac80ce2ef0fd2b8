//! `bench ingest`: records from a tenant's source to its subscribers.
//!
//! Owns two measurements against a real Herald process:
//! - `--source kafka`: records produced to librdkafka's mock cluster (in this
//!   process; Herald connects to it over loopback) are consumed, transformed
//!   (with `--plugin`) and fanned out; figure: records per server CPU-second,
//!   with and without the plugin in the same run (`--baseline no-plugin`).
//! - `--source outbox`: rows inserted at a fixed rate into an outbox table of
//!   a Postgres you name (`--database-url`; the test script's throwaway
//!   cluster works) reach a subscriber; figures: rows delivered per second and
//!   insert-to-client latency percentiles.
//!
//! One in-process WebSocket subscriber counts deliveries and checks them
//! ([`Order`]): every record carries its number, and a run fails on a frame
//! that is repeated or out of order, or on a missing one that the server's
//! slow-consumer policy did not count. Loopback only; every Herald is stopped
//! by its guard.

use crate::client::now_nanos;
use crate::hist::Histogram;
use crate::http::HttpConn;
use crate::opts::CommonArgs;
use crate::report;
use crate::target::{Target, TENANT};
use anyhow::{bail, Context as _};
use herald_proto::ws::{decode_frame, encode_client_frame, OpCode, Role};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod kafka;
use kafka::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    Kafka,
    Outbox,
}

#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, value_enum)]
    pub source: Source,
    /// Kafka: records produced before the source starts.
    #[arg(long, default_value_t = 500_000)]
    pub records: u64,
    /// Kafka: a plugin component the tenant transforms records with.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Kafka: also measure without the plugin, in the same run.
    #[arg(long)]
    pub no_plugin_baseline: bool,
    /// Outbox: the Postgres holding the outbox table (a throwaway one).
    #[arg(long, env = "HERALD_TEST_POSTGRES_URL")]
    pub database_url: Option<String>,
    /// Outbox: rows inserted per second.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// Outbox: seconds of inserting.
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
}

/// A WebSocket subscriber counting `msg` frames, their latency from `t` and
/// their order.
struct Subscriber {
    count: Arc<AtomicU64>,
    hist: Arc<SharedHist>,
    order: Arc<std::sync::Mutex<Order>>,
    task: tokio::task::JoinHandle<()>,
}

/// What one subscriber received of numbered records, checked frame by frame.
/// Record `n` (its payload's `"n"`) belongs to stream `n % streams` (a Kafka
/// partition; the outbox is one stream), in which numbers must only increase;
/// no number may come twice; the channel's `seq` must only increase, and a
/// frame whose `prev` is not the last `seq` is a visible gap.
#[derive(Debug)]
struct Order {
    streams: u64,
    last_n: Vec<Option<u64>>,
    /// One bit per number seen.
    seen: Vec<u64>,
    last_seq: u64,
    distinct: u64,
    gaps: u64,
    problems: u64,
    first_problem: Option<String>,
}

impl Order {
    fn new(streams: u64) -> Order {
        Order {
            streams,
            last_n: vec![None; streams as usize],
            seen: Vec::new(),
            last_seq: 0,
            distinct: 0,
            gaps: 0,
            problems: 0,
            first_problem: None,
        }
    }

    fn problem(&mut self, what: String) {
        self.problems += 1;
        self.first_problem.get_or_insert(what);
    }

    /// Checks one `msg` frame.
    fn see(&mut self, frame: &[u8]) {
        let (Some(seq), Some(prev), Some(n)) = (
            find_u64(frame, "seq"),
            find_u64(frame, "prev"),
            find_u64(frame, "n"),
        ) else {
            return self.problem(format!(
                "a frame without seq, prev or n: {}",
                String::from_utf8_lossy(frame)
            ));
        };
        if seq <= self.last_seq {
            self.problem(format!("seq {seq} after seq {}", self.last_seq));
        }
        if prev != self.last_seq {
            self.gaps += 1;
        }
        self.last_seq = self.last_seq.max(seq);
        let (word, bit) = ((n / 64) as usize, 1u64 << (n % 64));
        if word >= self.seen.len() {
            self.seen.resize(word + 1, 0);
        }
        if self.seen[word] & bit != 0 {
            return self.problem(format!("record {n} repeated (seq {seq})"));
        }
        self.seen[word] |= bit;
        self.distinct += 1;
        let last = &mut self.last_n[(n % self.streams) as usize];
        match *last {
            Some(l) if n < l => {
                let stream = n % self.streams;
                self.problem(format!(
                    "record {n} after record {l} of its stream {stream} (seq {seq})"
                ))
            }
            _ => *last = Some(n),
        }
    }

    /// `Ok` with a summary when every frame came once and in order, and the
    /// records of the `expected` that never came are no more than the
    /// slow-consumer policy counted (`explained`) and visible as gaps.
    fn verdict(&self, expected: u64, explained: u64) -> Result<String, String> {
        if let Some(p) = &self.first_problem {
            return Err(format!("{} bad frame(s), the first: {p}", self.problems));
        }
        if self.distinct > expected {
            return Err(format!(
                "{} distinct records arrived, only {expected} were sent",
                self.distinct
            ));
        }
        let missing = expected - self.distinct;
        if missing > explained {
            return Err(format!(
                "{} of {expected} records lost: {missing} never arrived, the slow-consumer policy counted {explained}",
                missing - explained
            ));
        }
        if missing > 0 && self.gaps == 0 {
            return Err(format!(
                "{missing} records never arrived and no frame showed a gap"
            ));
        }
        Ok(format!(
            "order: {} of {} records arrived once each and in order; {missing} conflated or dropped by the slow-consumer policy ({explained} counted), {} gap(s) shown",
            r_fmt(self.distinct),
            r_fmt(expected),
            self.gaps
        ))
    }
}

/// The subscriber's histogram, shared with the scenario that reports it.
#[derive(Default)]
struct SharedHist(std::sync::Mutex<Histogram>);

/// Subscribes to `channel`; its records are numbered over `streams` streams.
async fn subscribe(
    addr: SocketAddr,
    tenant: &str,
    channel: &str,
    streams: u64,
) -> anyhow::Result<Subscriber> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "GET /v1/t/{tenant}/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(1 << 16);
    loop {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("server closed during the handshake");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            if !buf.starts_with(b"HTTP/1.1 101") {
                bail!(
                    "handshake refused: {}",
                    String::from_utf8_lossy(&buf[..end])
                );
            }
            buf.drain(..end + 4);
            break;
        }
    }
    let sub = format!(r#"{{"op":"sub","ch":"{channel}","id":1}}"#);
    s.write_all(&encode_client_frame(
        OpCode::Text,
        sub.as_bytes(),
        [1, 2, 3, 4],
    ))
    .await?;
    let count = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(SharedHist::default());
    let order = Arc::new(std::sync::Mutex::new(Order::new(streams)));
    let (c, h, o) = (count.clone(), hist.clone(), order.clone());
    let task = tokio::spawn(async move {
        let mut local = Histogram::default();
        loop {
            loop {
                match decode_frame(&mut buf, Role::FromServer, 1 << 20) {
                    Ok(Some(head)) => {
                        let payload = &buf[head.payload_start..head.frame_len()];
                        if head.opcode == OpCode::Text && payload.starts_with(br#"{"op":"msg""#) {
                            if let Some(t) = find_u64(payload, "t") {
                                local.record(now_nanos().saturating_sub(t) / 1000);
                            }
                            o.lock().expect("order lock").see(payload);
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        let used = head.frame_len();
                        buf.drain(..used);
                    }
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
            if c.load(Ordering::Relaxed) % 1024 == 0 {
                h.0.lock()
                    .expect("histogram lock")
                    .merge(&std::mem::take(&mut local));
            }
            let mut chunk = vec![0u8; 1 << 16];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    h.0.lock().expect("histogram lock").merge(&local);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            h.0.lock()
                .expect("histogram lock")
                .merge(&std::mem::take(&mut local));
        }
    });
    Ok(Subscriber {
        count,
        hist,
        order,
        task,
    })
}

/// The first `"<key>":<integer>` in a frame, without parsing the whole frame.
fn find_u64(frame: &[u8], key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    let i = frame.windows(pat.len()).position(|w| w == pat.as_bytes())? + pat.len();
    let digits: Vec<u8> = frame[i..]
        .iter()
        .copied()
        // Postgres renders jsonb as `"t": 123` (with a space).
        .skip_while(|b| *b == b' ')
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Messages the bench tenant's slow-consumer policy conflated or dropped: the
/// only frames a subscriber may miss.
async fn slow_consumer_removals(t: &Target) -> anyhow::Result<u64> {
    let label = format!("tenant=\"{TENANT}\"");
    // The whole body (`Response::text` keeps 500 characters for messages:
    // the tenant's lines were found only when rendered early, which made
    // this look like a body cut short). One without all three lines is
    // fetched again rather than read as zero.
    for _ in 0..20 {
        let r = HttpConn::new(t.addr)
            .request("GET", "/metrics", None, b"")
            .await?;
        let lines: Vec<f64> = String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| l.starts_with("herald_slow_consumer_total{") && l.contains(&label))
            .filter_map(|l| {
                let v = l.rsplit_once(' ')?.1.trim().parse::<f64>().ok()?;
                let counted =
                    l.contains("action=\"conflated\"") || l.contains("action=\"dropped\"");
                Some(if counted { v } else { 0.0 })
            })
            .collect();
        if lines.len() == 3 {
            return Ok(lines.iter().sum::<f64>() as u64);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("/metrics never listed the bench tenant's three slow-consumer counters")
}

/// The bench tenant's delivery counters, for a failed check to show where
/// the records went.
async fn tenant_counters(t: &Target) -> String {
    let Ok(r) = HttpConn::new(t.addr)
        .request("GET", "/metrics", None, b"")
        .await
    else {
        return "(metrics unavailable)".into();
    };
    let label = format!("tenant=\"{TENANT}\"");
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with("herald_") && l.contains(&label))
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sets the bench tenant's ingest source.
async fn set_source(t: &Target, source: serde_json::Value) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{TENANT}/source");
    t.admin_request("PUT", &path, source.to_string().as_bytes())
        .await?;
    Ok(())
}

fn r_fmt(n: u64) -> String {
    report::fmt_int(n)
}

async fn outbox(a: &IngestArgs) -> anyhow::Result<()> {
    let url = a
        .database_url
        .clone()
        .context("--database-url (or HERALD_TEST_POSTGRES_URL) is required for the outbox")?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    let table = format!("ob_bench_{}", now_nanos() % 1_000_000);
    let sql = include_str!("../../migrations/outbox/herald_outbox.sql")
        .replace("herald_outbox", &table)
        .replace(&format!("pg_notify('{table}'"), "pg_notify('herald_outbox'");
    sqlx::raw_sql(&sql).execute(&pool).await?;
    let target = Target::herald(&a.common.herald, &a.common.herald_args).await?;
    set_source(
        &target,
        serde_json::json!({"kind":"postgres_outbox","database_url":url,"table":table}),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sub = subscribe(target.addr, TENANT, "o", 1).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rate, secs) = if a.common.smoke {
        (1_000, 1.0)
    } else {
        (a.rate, a.duration_secs)
    };
    println!("ingest outbox: inserting {rate} rows/s for {secs} s into {table}");
    let per_tick = (rate / 100).max(1);
    // Rows are numbered 1, 2, 3… in insert (and id) order.
    let insert = format!(
        "INSERT INTO {table} (channel, payload) SELECT 'o', jsonb_build_object('t', $1::bigint, 'n', $3::bigint + g, 'pad', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') FROM generate_series(1, $2) g"
    );
    let cpu0 = target.cpu_secs()?;
    let t0 = Instant::now();
    let mut inserted = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while t0.elapsed().as_secs_f64() < secs {
        tick.tick().await;
        sqlx::query(&insert)
            .bind(now_nanos() as i64)
            .bind(per_tick as i64)
            .bind(inserted as i64)
            .execute(&pool)
            .await?;
        inserted += per_tick;
    }
    let insert_secs = t0.elapsed().as_secs_f64();
    let until = Instant::now() + Duration::from_secs(15);
    let mut explained = slow_consumer_removals(&target).await?;
    let mut polls = 0u32;
    while sub.count.load(Ordering::Relaxed) + explained < inserted && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        polls += 1;
        if polls.is_multiple_of(10) {
            explained = slow_consumer_removals(&target).await?;
        }
    }
    let done_secs = t0.elapsed().as_secs_f64();
    let server_cpu = target.cpu_secs()? - cpu0;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let delivered = sub.count.load(Ordering::Relaxed);
    sub.task.abort();
    let explained = slow_consumer_removals(&target).await?;
    let order = sub
        .order
        .lock()
        .expect("order lock")
        .verdict(inserted, explained);
    let h = sub.hist.0.lock().expect("histogram lock").clone();
    let ms = |p: f64| h.percentile(p).map(|us| us as f64 / 1000.0);
    let throughput = delivered as f64 / done_secs;
    println!(
        "  inserted {} rows in {:.1} s, delivered {} ({:.0} rows/s end to end; target >= 20,000: {}); server CPU {:.2} s",
        r_fmt(inserted),
        insert_secs,
        r_fmt(delivered),
        throughput,
        report::verdict(Some(throughput), 20_000.0, false),
        server_cpu
    );
    println!(
        "  insert-to-client latency: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (target p99 <= 50 ms: {})",
        ms(50.0).unwrap_or(f64::NAN),
        ms(99.0).unwrap_or(f64::NAN),
        h.max() as f64 / 1000.0,
        report::verdict(ms(99.0), 50.0, true)
    );
    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await?;
    let order = order.map_err(|e| anyhow::anyhow!("outbox ingest: {e}"))?;
    println!("  {order}");
    a.common.record(serde_json::json!({
        "scenario": "ingest", "source": "outbox", "smoke": a.common.smoke, "commit": report::git_commit(), "date": report::utc_now(),
        "rate": rate, "inserted": inserted, "delivered": delivered, "rows_per_sec": throughput,
        "latency_ms": {"p50": ms(50.0), "p99": ms(99.0), "max": h.max() as f64 / 1000.0}, "server_cpu_secs": server_cpu,
    }))?;
    Ok(())
}

pub async fn run(a: IngestArgs) -> anyhow::Result<()> {
    match a.source {
        Source::Kafka => kafka(&a).await,
        Source::Outbox => outbox(&a).await,
    }
}

#[cfg(test)]
mod tests;
