//! `bench plugin`: what a tenant plugin costs.
//!
//! Owns three measurements, each beside a baseline taken in the same run:
//! 1. `transform` per message (ticker-conflate, 100-byte JSON ticks) by batch
//!    size, through the host's real path (flat batch encoding, one call per
//!    batch, output contract checks); baseline: the same parsing and routing
//!    done natively in this process.
//! 2. `authorize-connect` latency with jwt-auth (HS256 verify in the guest):
//!    the call itself, and the call as the server makes it (on a blocking
//!    thread, off the runtime's workers).
//! 3. New WebSocket connections per second against a real Herald with
//!    jwt-auth, beside a public tenant (no plugin) in the same process.
//!
//! Components come from plugins/target (build them with plugins/build.sh).

use crate::hist::Histogram;
use crate::opts::CommonArgs;
use crate::report;
use crate::target::Target;
use anyhow::{bail, Context as _};
use base64::Engine as _;
use herald_plugin::active::{Activation, ActivePlugin};
use herald_plugin::batch::SourceRecord;
use herald_plugin::{Runtime, SandboxLimits};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Directory holding the built plugin components.
    #[arg(long, default_value_os_t = default_plugins())]
    pub plugins: PathBuf,
    /// Seconds spent measuring each transform batch size.
    #[arg(long, default_value_t = 1.0)]
    pub secs_per_size: f64,
    /// authorize-connect calls measured.
    #[arg(long, default_value_t = 20_000)]
    pub auth_calls: usize,
    /// WebSocket connections opened per tenant in the connect-rate test.
    #[arg(long, default_value_t = 10_000)]
    pub connects: usize,
    /// Handshakes in flight at once in the connect-rate test.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Another ticker transform component to measure beside the Rust one,
    /// e.g. one written in another language (plugins/js-ticker); repeatable.
    #[arg(long)]
    pub also: Vec<PathBuf>,
}

pub fn default_plugins() -> PathBuf {
    report::bench_dir().join("../plugins/target/wasm32-wasip2/release")
}

const SECRET: &str = "bench-jwt-secret-0123456789abcdef";

fn jwt(sub: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let h = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    let p = b64.encode(format!(
        r#"{{"sub":"{sub}","exp":{exp},"channels":["ticks.*"]}}"#
    ));
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(format!("{h}.{p}").as_bytes());
    format!("{h}.{p}.{}", b64.encode(mac.finalize().into_bytes()))
}

fn load(
    runtime: &Arc<Runtime>,
    path: &std::path::Path,
    config: &str,
) -> anyhow::Result<Arc<ActivePlugin>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("{}: run plugins/build.sh first", path.display()))?;
    let component = runtime.compile(&bytes)?;
    let activation = Activation {
        version: 1,
        sha256: herald_plugin::sha256_hex(&bytes),
        tenant: "bench".into(),
        config: config.into(),
        limits: SandboxLimits {
            memory_bytes: 64 << 20,
            deadline: Duration::from_millis(100),
            threads: 2,
            queue: 64,
        },
    };
    Ok(ActivePlugin::load(runtime, &component, activation)?)
}

fn ticks(n: usize) -> Vec<Vec<u8>> {
    const SYMS: [&str; 5] = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"];
    (0..n)
        .map(|i| {
            let mut s = format!(
                r#"{{"sym":"{}","px":{}.25,"ts":{},"pad":""#,
                SYMS[i % 5],
                100 + i,
                1_700_000_000_000u64 + i as u64
            );
            while s.len() < 98 {
                s.push('x');
            }
            s.push_str("\"}");
            s.into_bytes()
        })
        .collect()
}

/// The same work natively: parse the symbol, keep the channel, copy the payload.
fn native_transform(values: &[Vec<u8>]) -> usize {
    #[derive(serde::Deserialize)]
    struct Tick<'a> {
        #[serde(borrow)]
        sym: &'a str,
    }
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        if let Ok(t) = serde_json::from_slice::<Tick<'_>>(v) {
            out.push(("ticks", v.clone(), t.sym.to_string()));
        }
    }
    out.len()
}

struct TransformFigure {
    batch: usize,
    plugin_ns: f64,
    native_ns: f64,
}

fn measure_transform(p: &ActivePlugin, batch: usize, secs: f64) -> anyhow::Result<TransformFigure> {
    let values = ticks(batch);
    let records: Vec<SourceRecord<'_>> = values
        .iter()
        .map(|v| SourceRecord {
            timestamp_ms: 0,
            position: None,
            key: None,
            value: v,
            // As HTTP publish delivers them: the publisher names the channel.
            channel: Some("ticks"),
            headers: &[],
        })
        .collect();
    // Warm-up, and a check that the plugin did the work.
    let t = p.transform(&records, 65_536)?;
    let out = t.outputs;
    if out.len() != batch || !t.refused.is_empty() || out.iter().any(|m| m.channel != "ticks") {
        bail!(
            "{} returned {} messages for {batch} ticks, refused {} (or renamed their channel)",
            p.info.name,
            out.len(),
            t.refused.len()
        );
    }
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let (mut msgs, start) = (0usize, Instant::now());
    while Instant::now() < until {
        msgs += p.transform(&records, 65_536)?.outputs.len();
    }
    let plugin_ns = start.elapsed().as_nanos() as f64 / msgs as f64;
    let until = Instant::now() + Duration::from_secs_f64(secs / 2.0);
    let (mut n, start) = (0usize, Instant::now());
    while Instant::now() < until {
        n += std::hint::black_box(native_transform(&values));
    }
    let native_ns = start.elapsed().as_nanos() as f64 / n as f64;
    Ok(TransformFigure {
        batch,
        plugin_ns,
        native_ns,
    })
}

async fn handshake(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .context("connect")?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .context("send the request")?;
    let mut buf = [0u8; 512];
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).await.context("read the answer")?;
        if n == 0 {
            break;
        }
        got += n;
        if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") || got == buf.len() {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..got]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, head.chars().take(300).collect()))
}

/// Creates tenant `jwt` on `target` with jwt-auth active; returns the path a
/// client with a valid token connects to.
pub async fn jwt_tenant(target: &Target, plugins: &std::path::Path) -> anyhow::Result<String> {
    let body = serde_json::json!({"id":"jwt","config":{"secret":SECRET}}).to_string();
    target
        .admin_request("POST", "/admin/v1/tenants", body.as_bytes())
        .await
        .context("creating the jwt tenant")?;
    target
        .install_plugin_on("jwt", &plugins.join("jwt_auth.wasm"))
        .await?;
    Ok(format!("/v1/t/jwt/ws?token={}", jwt("bench-user")))
}

/// Opens `n` connections (`concurrency` at a time), each closed after its 101.
pub async fn connect_rate(
    addr: SocketAddr,
    path: String,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<(f64, usize)> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The first failure's reason: a run that fails says why.
    let first = Arc::new(std::sync::Mutex::new(None::<String>));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (next, failed, path, first) =
            (next.clone(), failed.clone(), path.clone(), first.clone());
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let why = match handshake(addr, &path).await {
                    Ok((101, _)) => continue,
                    Ok((status, head)) => format!("status {status}: {head}"),
                    Err(e) => format!("{e:#}"),
                };
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(why);
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let failed = failed.load(std::sync::atomic::Ordering::Relaxed);
    if let Some(why) = first.lock().unwrap_or_else(|p| p.into_inner()).take() {
        println!("  {failed} of {n} handshakes failed; the first: {why}");
    }
    Ok((rate, failed))
}

pub async fn run(a: PluginArgs) -> anyhow::Result<()> {
    let smoke = a.common.smoke;
    let runtime = Runtime::new()?;
    let ticker = load(&runtime, &a.plugins.join("ticker_conflate.wasm"), "{}")?;
    let auth_config = format!(r#"{{"secret":"{SECRET}"}}"#);
    let jwt_plugin = load(&runtime, &a.plugins.join("jwt_auth.wasm"), &auth_config)?;

    println!("plugin: transform cost per message (ticker-conflate, 100-byte JSON ticks)");
    let secs = if smoke { 0.05 } else { a.secs_per_size };
    let mut transform = Vec::new();
    for batch in [1, 16, 64, 256] {
        let f = measure_transform(&ticker, batch, secs)?;
        println!(
            "  batch {:>3}: plugin {:>7.0} ns/msg, native {:>5.0} ns/msg, plugin/native {:.2}x{}",
            f.batch,
            f.plugin_ns,
            f.native_ns,
            f.plugin_ns / f.native_ns,
            if f.batch == 64 {
                format!(
                    "  (target <= 500 ns: {})",
                    report::verdict(Some(f.plugin_ns), 500.0, true)
                )
            } else {
                String::new()
            }
        );
        transform.push(f);
    }

    let mut others = Vec::new();
    for path in &a.also {
        let t = Instant::now();
        let p = load(&runtime, path, "{}")?;
        println!(
            "plugin: {} ({}, {:.1} MB, loaded in {:.1} s): transform cost per message",
            p.info.name,
            path.display(),
            std::fs::metadata(path)?.len() as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
        for batch in [1, 16, 64, 256] {
            let f = measure_transform(&p, batch, secs)?;
            let rust = transform
                .iter()
                .find(|r| r.batch == batch)
                .map(|r| r.plugin_ns);
            println!(
                "  batch {:>3}: {:>8.0} ns/msg = {} the Rust plugin's",
                f.batch,
                f.plugin_ns,
                report::fmt_ratio(rust.and_then(|r| report::ratio(f.plugin_ns, r)))
            );
            others.push(serde_json::json!({"plugin": p.info.name, "path": path.display().to_string(), "batch": batch, "ns_per_msg": f.plugin_ns}));
        }
    }

    let calls = if smoke { 200 } else { a.auth_calls };
    let token = jwt("bench-user");
    let req = herald_plugin::ConnectRequest {
        tenant: "bench".into(),
        transport: "ws".into(),
        headers: vec![("origin".into(), "http://localhost".into())],
        query: Vec::new(),
        credentials: Some(token.clone()),
        remote_addr: "127.0.0.1:40000".into(),
    };
    let mut direct = Histogram::default();
    for _ in 0..calls {
        let t = Instant::now();
        match jwt_plugin.authorize_connect(&req)? {
            Ok(_) => {}
            Err(d) => bail!("jwt-auth denied the bench token: {} {}", d.code, d.message),
        }
        direct.record(t.elapsed().as_nanos() as u64);
    }
    let mut hosted = Histogram::default();
    for _ in 0..calls {
        let t = Instant::now();
        jwt_plugin
            .clone()
            .authorize_connect_async(req.clone())
            .await?
            .ok()
            .context("denied")?;
        hosted.record(t.elapsed().as_nanos() as u64);
    }
    let us = |h: &Histogram, p: f64| h.percentile(p).unwrap_or(0) as f64 / 1000.0;
    println!("plugin: authorize-connect with jwt-auth ({calls} calls)");
    println!(
        "  in the calling thread: p50 {:.1} us, p99 {:.1} us (target p99 <= 20 us: {})",
        us(&direct, 50.0),
        us(&direct, 99.0),
        report::verdict(Some(us(&direct, 99.0)), 20.0, true)
    );
    println!(
        "  as the server calls it (ActivePlugin::run): p50 {:.1} us, p99 {:.1} us",
        us(&hosted, 50.0),
        us(&hosted, 99.0)
    );

    // Connection rate against a real server: jwt-auth tenant vs a public one.
    let target = Target::herald(&a.common.herald, &a.common.herald_args).await?;
    jwt_tenant(&target, &a.plugins).await?;
    let n = if smoke { 50 } else { a.connects };
    let cpu0 = target.cpu_secs()?;
    let (public_rate, public_failed) =
        connect_rate(target.addr, "/v1/t/bench/ws".into(), n, a.concurrency).await?;
    let cpu1 = target.cpu_secs()?;
    let (jwt_rate, jwt_failed) = connect_rate(
        target.addr,
        format!("/v1/t/jwt/ws?token={token}"),
        n,
        a.concurrency,
    )
    .await?;
    let cpu2 = target.cpu_secs()?;
    let public_cpu_us = (cpu1 - cpu0) * 1e6 / n as f64;
    let jwt_cpu_us = (cpu2 - cpu1) * 1e6 / n as f64;
    println!(
        "plugin: new WebSocket connections per second ({n} each, {} in flight)",
        a.concurrency
    );
    println!("  public tenant: {public_rate:>8.0}/s  server CPU {public_cpu_us:.1} us/conn  failed {public_failed}");
    println!(
        "  jwt-auth:      {jwt_rate:>8.0}/s  server CPU {jwt_cpu_us:.1} us/conn  failed {jwt_failed}  jwt/public {:.2}x (target >= 20,000/s: {})",
        jwt_rate / public_rate,
        report::verdict(Some(jwt_rate), 20_000.0, false)
    );
    if public_failed + jwt_failed > 0 {
        bail!("{} handshakes failed", public_failed + jwt_failed);
    }
    let t64 = transform
        .iter()
        .find(|f| f.batch == 64)
        .expect("64 is measured");
    a.common.record(serde_json::json!({
        "scenario": "plugin",
        "smoke": smoke,
        "commit": report::git_commit(),
        "date": report::utc_now(),
        "transform": transform.iter().map(|f| serde_json::json!({"batch": f.batch, "plugin_ns_per_msg": f.plugin_ns, "native_ns_per_msg": f.native_ns})).collect::<Vec<_>>(),
        "transform_batch64_ns": t64.plugin_ns,
        "transform_other_plugins": others,
        "authorize_connect_us": {"direct_p50": us(&direct, 50.0), "direct_p99": us(&direct, 99.0), "hosted_p50": us(&hosted, 50.0), "hosted_p99": us(&hosted, 99.0)},
        "connect_rate": {"public_per_sec": public_rate, "jwt_per_sec": jwt_rate, "public_server_cpu_us": public_cpu_us, "jwt_server_cpu_us": jwt_cpu_us, "connections": n, "concurrency": a.concurrency},
    }))?;
    Ok(())
}
