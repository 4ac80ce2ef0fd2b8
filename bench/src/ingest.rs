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
//! One in-process WebSocket subscriber counts deliveries; loopback only;
//! every Herald is stopped by its guard.

use crate::client::now_nanos;
use crate::hist::Histogram;
use crate::opts::CommonArgs;
use crate::report;
use crate::target::{Target, TENANT};
use anyhow::{bail, Context as _};
use herald::proto::ws::{decode_frame, encode_client_frame, OpCode, Role};
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

/// A WebSocket subscriber counting `msg` frames and their latency from `t`.
struct Subscriber {
    count: Arc<AtomicU64>,
    hist: Arc<SharedHist>,
    task: tokio::task::JoinHandle<()>,
}

/// The subscriber's histogram, shared with the scenario that reports it.
#[derive(Default)]
struct SharedHist(std::sync::Mutex<Histogram>);

async fn subscribe(addr: SocketAddr, tenant: &str, channel: &str) -> anyhow::Result<Subscriber> {
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
    let (c, h) = (count.clone(), hist.clone());
    let task = tokio::spawn(async move {
        let mut local = Histogram::default();
        loop {
            loop {
                match decode_frame(&mut buf, Role::FromServer, 1 << 20) {
                    Ok(Some(head)) => {
                        let payload = &buf[head.payload_start..head.frame_len()];
                        if head.opcode == OpCode::Text && payload.starts_with(br#"{"op":"msg""#) {
                            if let Some(t) = find_t(payload) {
                                local.record(now_nanos().saturating_sub(t) / 1000);
                            }
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
    Ok(Subscriber { count, hist, task })
}

/// The `"t":<nanos>` inside a payload, without parsing the whole frame.
fn find_t(frame: &[u8]) -> Option<u64> {
    let i = frame.windows(4).position(|w| w == br#""t":"#)? + 4;
    let digits: Vec<u8> = frame[i..]
        .iter()
        .copied()
        // Postgres renders jsonb as `"t": 123` (with a space).
        .skip_while(|b| *b == b' ')
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Sets the bench tenant's ingest source.
async fn set_source(t: &Target, source: serde_json::Value) -> anyhow::Result<()> {
    let path = format!("/admin/v1/tenants/{TENANT}/source");
    t.admin_request("PUT", &path, source.to_string().as_bytes())
        .await?;
    Ok(())
}

struct KafkaRun {
    records: u64,
    wall_secs: f64,
    server_cpu: f64,
    delivered: u64,
}

async fn kafka_run(
    a: &IngestArgs,
    brokers: &str,
    plugin: Option<&std::path::Path>,
) -> anyhow::Result<KafkaRun> {
    let target = Target::herald(&a.common.herald, &a.common.herald_args).await?;
    if let Some(p) = plugin {
        target.install_plugin(p).await?;
    }
    let sub = subscribe(target.addr, TENANT, "c").await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let source = serde_json::json!({"kind":"kafka","brokers":brokers,"topics":["ingest"],"start":"earliest"});
    let cpu0 = target.cpu_secs()?;
    let t0 = Instant::now();
    set_source(&target, source).await?;
    // Done when the reader's positions reach the end of every partition. The
    // mock cluster keeps a bounded log, so "earliest" may start above offset 0:
    // the figure counts the records the source actually read.
    let produced = if a.common.smoke { 2_000 } else { a.records };
    let records = loop {
        let v = target
            .admin_request("GET", &format!("/admin/v1/tenants/{TENANT}/source"), b"")
            .await?;
        let h = &v["health"];
        let at_end: u64 = h["position"]
            .as_str()
            .and_then(|p| serde_json::from_str::<std::collections::BTreeMap<String, u64>>(p).ok())
            .map_or(0, |m| m.values().sum());
        if at_end >= produced && h["lag"] == 0 {
            break h["records"].as_u64().unwrap_or(0);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the source did not reach the end of the topic in 60 s: {v}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wall_secs = t0.elapsed().as_secs_f64();
    let server_cpu = target.cpu_secs()? - cpu0;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = sub.count.load(Ordering::Relaxed);
    sub.task.abort();
    Ok(KafkaRun {
        records,
        wall_secs,
        server_cpu,
        delivered,
    })
}

async fn kafka(a: &IngestArgs) -> anyhow::Result<()> {
    let cluster = MockCluster::new(1).context("starting the mock Kafka cluster")?;
    cluster.create_topic("ingest", 4, 1)?;
    let brokers = cluster.bootstrap_servers();
    let records = if a.common.smoke { 2_000 } else { a.records };
    println!(
        "ingest kafka: producing {records} records of ~100 B to a mock cluster (4 partitions)"
    );
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "2000000")
        .set("batch.num.messages", "10000")
        .create()?;
    const SYMS: [&str; 5] = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"];
    let mut pending = Vec::with_capacity(10_000);
    for i in 0..records {
        let payload = format!(
            r#"{{"sym":"{}","px":{}.5,"t":{},"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#,
            SYMS[(i % 5) as usize],
            100 + i % 50,
            now_nanos()
        );
        let headers = OwnedHeaders::new().insert(Header {
            key: "channel",
            value: Some("c"),
        });
        let rec = FutureRecord::<(), _>::to("ingest")
            .payload(&payload)
            .headers(headers);
        pending.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        if pending.len() == 10_000 {
            for f in pending.drain(..) {
                f.await?.map_err(|(e, _)| e)?;
            }
        }
    }
    for f in pending {
        f.await?.map_err(|(e, _)| e)?;
    }
    let with = kafka_run(a, &brokers, a.plugin.as_deref()).await?;
    let label = if a.plugin.is_some() {
        "with plugin"
    } else {
        "no plugin"
    };
    let rate = |r: &KafkaRun| r.records as f64 / r.server_cpu.max(0.01);
    println!(
        "  {label}: {} records in {:.2} s ({:.0}/s wall), server CPU {:.2} s -> {:.0} records per server CPU-second (target >= 200,000: {}); subscriber got {}",
        r_fmt(with.records),
        with.wall_secs,
        with.records as f64 / with.wall_secs,
        with.server_cpu,
        rate(&with),
        report::verdict(Some(rate(&with)), 200_000.0, false),
        with.delivered
    );
    let mut line = serde_json::json!({
        "scenario": "ingest", "source": "kafka", "smoke": a.common.smoke, "commit": report::git_commit(), "date": report::utc_now(),
        "records": with.records, "plugin": a.plugin.as_ref().map(|p| p.display().to_string()),
        "records_per_server_cpu_sec": rate(&with), "wall_secs": with.wall_secs, "delivered": with.delivered,
    });
    if a.no_plugin_baseline && a.plugin.is_some() {
        let bare = kafka_run(a, &brokers, None).await?;
        println!(
            "  no plugin: {:.0} records per server CPU-second; with plugin / without = {:.2}x",
            rate(&bare),
            rate(&with) / rate(&bare)
        );
        line["no_plugin_records_per_server_cpu_sec"] = serde_json::json!(rate(&bare));
    }
    a.common.record(line)?;
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
    let sub = subscribe(target.addr, TENANT, "o").await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rate, secs) = if a.common.smoke {
        (1_000, 1.0)
    } else {
        (a.rate, a.duration_secs)
    };
    println!("ingest outbox: inserting {rate} rows/s for {secs} s into {table}");
    let per_tick = (rate / 100).max(1);
    let insert = format!(
        "INSERT INTO {table} (channel, payload) SELECT 'o', jsonb_build_object('t', $1::bigint, 'i', g, 'pad', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') FROM generate_series(1, $2) g"
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
            .execute(&pool)
            .await?;
        inserted += per_tick;
    }
    let insert_secs = t0.elapsed().as_secs_f64();
    let until = Instant::now() + Duration::from_secs(15);
    while sub.count.load(Ordering::Relaxed) < inserted && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done_secs = t0.elapsed().as_secs_f64();
    let server_cpu = target.cpu_secs()? - cpu0;
    let delivered = sub.count.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    sub.task.abort();
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
    if delivered < inserted {
        bail!(
            "{} of {inserted} rows were not delivered",
            inserted - delivered
        );
    }
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
