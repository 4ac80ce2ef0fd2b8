//! `bench swap`: how long a hot swap takes under load.
//!
//! Owns one measurement per plugin component given (the example plugin of
//! plugins/example/SPEC.md in any language): a tenant running it, `--subs`
//! SSE subscribers of one channel, a publisher at `--rate` messages a second
//! through the plugin's transform, and `--swaps` activations alternating
//! between two uploads of the component (the second made distinct by a
//! custom section, so it is another version with another sha256). Per swap:
//! the activate request's round trip (the API answers once the version
//! serves) and the time from sending it to the answer of the first publish
//! sent after it (which runs on the new version). Around them: the
//! publisher's round trips and the subscribers' delivery latency over the
//! whole run, and whether every published message reached every subscriber.

use crate::hist::Histogram;
use crate::opts::CommonArgs;
use crate::report::fmt_ms;
use crate::target::Target;
use anyhow::{bail, Context as _};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, clap::Args)]
pub struct SwapArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// A component of the example plugin (plugins/target/example/<lang>.wasm,
    /// plugins/target/wasm32-wasip2/release/herald_example_rust.wasm); repeatable.
    #[arg(long, required = true)]
    pub plugin: Vec<PathBuf>,
    /// Activations per component, alternating between its two versions.
    #[arg(long, default_value_t = 40)]
    pub swaps: usize,
    /// Milliseconds between one activation's answer and the next request.
    #[arg(long, default_value_t = 250)]
    pub gap_ms: u64,
    /// SSE subscribers of the channel.
    #[arg(long, default_value_t = 200)]
    pub subs: usize,
    /// Messages published per second.
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
}

const TOKEN: &str = "tok-bench";
const SYM: &str = "SWAP";

/// `bytes` with a custom section appended: the same component, another sha256.
fn distinct(bytes: &[u8], tag: &str) -> Vec<u8> {
    let name = b"herald-bench-swap";
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(tag.as_bytes());
    let mut out = bytes.to_vec();
    out.push(0); // custom section
    let mut n = body.len();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        out.push(if n == 0 { b } else { b | 0x80 });
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&body);
    out
}

#[derive(Default)]
struct Figures {
    activate_us: Histogram,
    serve_us: Histogram,
    publish_us: Histogram,
    deliver_ms: Histogram,
    published: u64,
    received: u64,
    /// Subscriptions answered 200 (first ones and resumptions).
    subscribed: usize,
    /// Subscriptions refused (each retried after 10 ms).
    refused: u64,
    /// Publishes answered 503 (plugin busy; the publisher goes on).
    publish_refused: u64,
    duplicates: u64,
    skipped: u64,
    gaps: u64,
    /// When each activation request was sent, and each resumption answered
    /// (microseconds since the epoch).
    swaps_us: Vec<u64>,
    resubscribed_us: Vec<u64>,
    /// The server's counts of plugin failures and lane moves at the end.
    server_says: Vec<String>,
}

impl Figures {
    /// For every resumption, the time since the activation before it.
    fn back_us(&self) -> Histogram {
        let mut h = Histogram::default();
        for &t in &self.resubscribed_us {
            if let Some(s) = self.swaps_us.iter().rev().find(|&&s| s <= t) {
                h.record(t - s);
            }
        }
        h
    }
}

pub async fn run(a: SwapArgs) -> anyhow::Result<()> {
    let (swaps, subs, rate) = if a.common.smoke {
        (4, 5, 50)
    } else {
        (a.swaps, a.subs, a.rate)
    };
    let mut lines = Vec::new();
    for path in &a.plugin {
        let wasm =
            std::fs::read(path).with_context(|| format!("{}: build it first", path.display()))?;
        let f = tokio::task::LocalSet::new()
            .run_until(one(&a, &wasm, swaps, subs, rate))
            .await?;
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into());
        let back = f.back_us();
        let p = |h: &Histogram| {
            format!(
                "p50 {} p99 {} max {}",
                fmt_ms(h.percentile(50.0)),
                fmt_ms(h.percentile(99.0)),
                fmt_ms(Some(h.max()))
            )
        };
        println!("{name} ({swaps} swaps, {subs} SSE subscribers, {rate} msg/s):");
        println!(
            "  activate request answered:            {}",
            p(&f.activate_us)
        );
        println!(
            "  activate → first publish on it answered: {}",
            p(&f.serve_us)
        );
        println!(
            "  activate → each subscriber resumed:    {} ({} resumptions, {} refused and retried)",
            p(&back),
            back.count(),
            f.refused
        );
        println!(
            "  publish round trip:                    {} ({} refused with 503)",
            p(&f.publish_us),
            f.publish_refused
        );
        println!(
            "  delivery: p50 {} ms p99 {} ms max {} ms; {} of {} delivered, {} duplicates, {} skipped, {} gaps",
            f.deliver_ms.percentile(50.0).unwrap_or(0),
            f.deliver_ms.percentile(99.0).unwrap_or(0),
            f.deliver_ms.max(),
            f.received,
            f.published * subs as u64,
            f.duplicates,
            f.skipped,
            f.gaps
        );
        for l in &f.server_says {
            println!("  server: {l}");
        }
        let summary = |h: &Histogram| serde_json::json!({"p50": ms(h.percentile(50.0)), "p99": ms(h.percentile(99.0)), "max": ms(Some(h.max()))});
        lines.push(serde_json::json!({
            "plugin": name,
            "swaps": swaps,
            "activate_ms": summary(&f.activate_us),
            "serve_ms": summary(&f.serve_us),
            "resumed_ms": summary(&back),
            "refused": f.refused,
            "publish_refused": f.publish_refused,
            "publish_ms": summary(&f.publish_us),
            "delivery_p99_ms": f.deliver_ms.percentile(99.0),
            "received": f.received, "expected": f.published * subs as u64,
            "duplicates": f.duplicates, "skipped": f.skipped, "gaps": f.gaps,
        }));
        if f.received != f.published * subs as u64 || f.duplicates + f.skipped + f.gaps > 0 {
            // Refusals are figures, not failures: a client retries them.
            bail!("{name}: not every message reached every subscriber exactly once");
        }
    }
    a.common.record(serde_json::json!({
        "scenario": "swap", "at": crate::report::utc_now(), "commit": crate::report::git_commit(),
        "subs": subs, "rate": rate, "results": lines,
    }))
}

fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|u| u as f64 / 1000.0)
}

async fn one(
    a: &SwapArgs,
    wasm: &[u8],
    swaps: usize,
    subs: usize,
    rate: u64,
) -> anyhow::Result<Figures> {
    let mut target = Target::herald(&a.common.herald, &a.common.herald_args).await?;
    let body = serde_json::json!({"id": "swap", "access": "plugin",
        "config": {"tokens": {TOKEN: {"subject": "bench"}}},
        "limits": {"connection_share_percent": 100, "max_connections_per_address": 100_000}});
    let created = target
        .admin_request("POST", "/admin/v1/tenants", body.to_string().as_bytes())
        .await
        .context("creating the swap tenant")?;
    let key = created["publish_key"]
        .as_str()
        .context("no publish_key")?
        .to_string();
    let versions = [
        target
            .upload_plugin_on("swap", &distinct(wasm, "a"))
            .await?,
        target
            .upload_plugin_on("swap", &distinct(wasm, "b"))
            .await?,
    ];
    let activate = |v: i64| format!("/admin/v1/tenants/swap/plugins/{v}/activate");
    target
        .admin_request("POST", &activate(versions[0]), b"")
        .await?;

    let epoch = Instant::now();
    let figures = Rc::new(RefCell::new(Figures::default()));
    let stop = Rc::new(Cell::new(false));
    let readers: Vec<_> = (0..subs)
        .map(|_| tokio::task::spawn_local(subscribe(target.addr, epoch, figures.clone())))
        .collect();
    // Every subscriber is in before the first publish.
    let t0 = Instant::now();
    while figures.borrow().subscribed < subs {
        if t0.elapsed() > Duration::from_secs(20) || readers.iter().any(|r| r.is_finished()) {
            bail!("{} of {subs} subscribers in", figures.borrow().subscribed);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let publisher = tokio::task::spawn_local(publish(
        crate::http::HttpConn::new(target.addr),
        key.clone(),
        rate,
        epoch,
        figures.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut probe = crate::http::HttpConn::new(target.addr);
    for i in 0..swaps {
        let started = Instant::now();
        figures
            .borrow_mut()
            .swaps_us
            .push(epoch.elapsed().as_micros() as u64);
        target
            .admin_request("POST", &activate(versions[(i + 1) % 2]), b"")
            .await?;
        let answered = started.elapsed();
        let mut r = probe
            .request("POST", "/v1/t/swap/publish", Some(&key), &tick(epoch))
            .await?;
        while r.status == 503 && started.elapsed() < Duration::from_secs(5) {
            figures.borrow_mut().publish_refused += 1;
            r = probe
                .request("POST", "/v1/t/swap/publish", Some(&key), &tick(epoch))
                .await?;
        }
        if r.status != 200 {
            bail!("publish after the swap: {} {}", r.status, r.text());
        }
        let serving = started.elapsed();
        {
            let mut f = figures.borrow_mut();
            f.activate_us.record(answered.as_micros() as u64);
            f.serve_us.record(serving.as_micros() as u64);
            f.published += 1;
        }
        tokio::time::sleep(Duration::from_millis(a.gap_ms)).await;
    }
    stop.set(true);
    publisher.await??;
    // Whatever is in flight arrives.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let done = {
            let f = figures.borrow();
            f.received >= f.published * subs as u64
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in readers {
        if r.is_finished() {
            if let Ok(Err(e)) = r.await {
                bail!("a subscriber failed: {e:#}");
            }
        } else {
            r.abort();
        }
    }
    target.check_alive()?;
    // Why a client was refused, in the server's words.
    let metrics = crate::http::HttpConn::new(target.addr)
        .request("GET", "/metrics", None, b"")
        .await?;
    figures.borrow_mut().server_says = String::from_utf8_lossy(&metrics.body)
        .lines()
        .filter(|l| {
            l.starts_with("herald_plugin_call_moves_total")
                || l.starts_with("herald_plugin_failures_total")
        })
        .map(str::to_string)
        .collect();
    let f = std::mem::take(&mut *figures.borrow_mut());
    Ok(f)
}

fn tick(epoch: Instant) -> Vec<u8> {
    format!(
        r#"{{"ch":"ticks.{SYM}","data":{{"sym":"{SYM}","px":"{}"}}}}"#,
        epoch.elapsed().as_millis()
    )
    .into_bytes()
}

async fn publish(
    mut http: crate::http::HttpConn,
    key: String,
    rate: u64,
    epoch: Instant,
    figures: Rc<RefCell<Figures>>,
    stop: Rc<Cell<bool>>,
) -> anyhow::Result<()> {
    let mut every = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.get() {
        every.tick().await;
        let t0 = Instant::now();
        let r = http
            .request("POST", "/v1/t/swap/publish", Some(&key), &tick(epoch))
            .await?;
        if r.status == 503 {
            // Nothing was published: the next tick tries again.
            figures.borrow_mut().publish_refused += 1;
            continue;
        }
        if r.status != 200 {
            bail!("publish: {} {}", r.status, r.text());
        }
        let mut f = figures.borrow_mut();
        f.publish_us.record(t0.elapsed().as_micros() as u64);
        f.published += 1;
    }
    Ok(())
}

/// One SSE subscriber. A swap on a plugin tenant closes the sessions the
/// old version admitted, to be authorized again by the new one: like an
/// EventSource, this one reconnects (at once, not after `retry`) with
/// `Last-Event-ID` and resumes. Counts messages, duplicates, skipped seqs
/// and gap events, records each message's delivery latency from the `px`
/// the publisher stamped (milliseconds since `epoch`) and when each
/// reconnection was answered 200.
async fn subscribe(
    addr: std::net::SocketAddr,
    epoch: Instant,
    figures: Rc<RefCell<Figures>>,
) -> anyhow::Result<()> {
    let mut last: Option<(String, u64)> = None;
    let mut refused = 0;
    loop {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let resume = last
            .as_ref()
            .map_or(String::new(), |(id, _)| format!("Last-Event-ID: {id}\r\n"));
        let req = format!(
            "GET /v1/t/swap/sse?ch=ticks.{SYM}&token={TOKEN} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{resume}\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::with_capacity(8192);
        let head = loop {
            if let Some(at) = find(&buf, b"\r\n\r\n") {
                break at + 4;
            }
            if s.read_buf(&mut buf).await? == 0 {
                bail!("the server closed an SSE stream before its answer");
            }
        };
        if !buf.starts_with(b"HTTP/1.1 200") {
            refused += 1;
            if refused > 100 {
                bail!(
                    "SSE subscription refused: {}",
                    String::from_utf8_lossy(&buf[..head])
                );
            }
            figures.borrow_mut().refused += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        buf.drain(..head);
        {
            let mut f = figures.borrow_mut();
            if last.is_some() {
                f.resubscribed_us.push(epoch.elapsed().as_micros() as u64);
            }
            f.subscribed += 1;
        }
        loop {
            let now = epoch.elapsed().as_millis() as u64;
            let mut used = 0;
            while let Some(n) = buf[used..].iter().position(|&b| b == b'\n') {
                on_line(
                    &buf[used..used + n],
                    now,
                    &mut last,
                    &mut figures.borrow_mut(),
                )?;
                used += n + 1;
            }
            buf.drain(..used);
            if s.read_buf(&mut buf).await? == 0 {
                break;
            }
        }
    }
}

/// One line of an SSE stream (`id:` and `data:` of msg events, gap events).
fn on_line(
    line: &[u8],
    now_ms: u64,
    last: &mut Option<(String, u64)>,
    f: &mut Figures,
) -> anyhow::Result<()> {
    if let Some(id) = line.strip_prefix(b"id: ") {
        let id = std::str::from_utf8(id)?.to_string();
        let seq: u64 = id.rsplit(':').next().unwrap_or("").parse()?;
        match last.as_ref().map(|(_, s)| *s) {
            Some(prev) if seq <= prev => f.duplicates += 1,
            Some(prev) if seq > prev + 1 => f.skipped += seq - prev - 1,
            _ => {}
        }
        if last.as_ref().is_none_or(|(_, s)| seq > *s) {
            *last = Some((id, seq));
        }
    } else if line.starts_with(b"event: gap") {
        f.gaps += 1;
    } else if let Some(at) = find(line, br#""px":""#) {
        let rest = &line[at + 6..];
        let len = rest.iter().position(|&b| b == b'"').unwrap_or(rest.len());
        let sent: u64 = std::str::from_utf8(&rest[..len])?.parse()?;
        f.deliver_ms.record(now_ms.saturating_sub(sent));
        f.received += 1;
    }
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
