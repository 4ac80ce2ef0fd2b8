//! The server under test: a Herald process, the bench's own raw baseline, or
//! a peer (nginx + nchan, a Python `websockets` broadcast server).
//!
//! Owns: starting the server on a free loopback port with a fresh directory,
//! installing a missing peer from the package registries
//! (`bench/peers/install.sh`), waiting for `/readyz`, creating Herald's public
//! `bench` tenant and keeping its publish key, publishing in each server's own
//! API, and reading the server's RSS and CPU (summed over its processes:
//! nginx's master and worker) and (Herald only) Prometheus counters. The
//! process is held by a [`ChildGuard`]; its log goes to a file whose tail is
//! shown when start-up fails.

use crate::client::Dialect;
use crate::http::HttpConn;
use crate::procs::{self, ChildGuard, TempDir};
use anyhow::{bail, Context as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod peers;

pub const TENANT: &str = "bench";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Herald,
    Raw,
    /// nginx with the nchan module, one worker process.
    Nchan,
    /// `bench/peers/py_broadcast.py` on the `websockets` library.
    Python,
    /// `bench/peers/uws_pubsub.js` on uWebSockets.js (C++ uWebSockets).
    Uws,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Herald => "herald",
            Kind::Raw => "raw",
            Kind::Nchan => "nchan",
            Kind::Python => "python-websockets",
            Kind::Uws => "uwebsockets",
        }
    }
}

/// A peer server to compare against in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    Nchan,
    Python,
    /// uWebSockets (its Node binding, uWebSockets.js 20.30).
    Uws,
}

impl Peer {
    pub fn kind(self) -> Kind {
        match self {
            Peer::Nchan => Kind::Nchan,
            Peer::Python => Kind::Python,
            Peer::Uws => Kind::Uws,
        }
    }
}

/// What one publish call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    pub requests: u64,
    pub messages: u64,
    /// Frames the server said it queued or wrote (subscribers reached).
    pub delivered: u64,
    /// Frames the raw server could not write (socket full).
    pub dropped: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Published {
    /// Adds up another call's figures (the first error seen is kept).
    pub fn add(&mut self, p: Published) {
        self.requests += p.requests;
        self.messages += p.messages;
        self.delivered += p.delivered;
        self.dropped += p.dropped;
        self.errors += p.errors;
        if self.first_error.is_none() {
            self.first_error = p.first_error;
        }
    }
}

pub struct Target {
    pub kind: Kind,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Where messages are published (the Python peer has a second port).
    pub publish_addr: SocketAddr,
    pub publish_key: String,
    /// The admin token Herald was started with (empty for the raw server).
    pub admin: String,
    guard: ChildGuard,
    /// Further Herald processes sharing the port (SO_REUSEPORT).
    others: Vec<ChildGuard>,
    log: PathBuf,
    // Dropped after `guard` (field order): the process is gone before its directory.
    _dir: TempDir,
}

impl Target {
    /// Starts `herald serve` and creates the public tenant.
    pub async fn herald(bin: &Path, extra_args: &[String]) -> anyhow::Result<Target> {
        Target::herald_processes(bin, extra_args, 1).await
    }

    /// Starts `processes` Herald processes sharing one port (SO_REUSEPORT)
    /// and one SQLite registry: the first creates the tenant while it is
    /// alone on the port, the others load it at start.
    pub async fn herald_processes(
        bin: &Path,
        extra_args: &[String],
        processes: usize,
    ) -> anyhow::Result<Target> {
        let mut extra = extra_args.to_vec();
        if processes > 1 {
            extra.push("--reuse-port".into());
        }
        let mut t = Target::herald_one(bin, &extra).await?;
        for n in 1..processes {
            let dir = t._dir.path().to_path_buf();
            t.add_process(bin, n, &dir, &extra).await?;
        }
        Ok(t)
    }

    /// Starts Herald process `n` on this target's port with its data in
    /// `data`, and waits until it listens (its tenants loaded).
    async fn add_process(
        &mut self,
        bin: &Path,
        n: usize,
        data: &Path,
        extra: &[String],
    ) -> anyhow::Result<()> {
        let log = self._dir.path().join(format!("herald-{n}.log"));
        let mut cmd = herald_command(bin, self.addr, data, &self.admin);
        cmd.args(["--node-id", &format!("bench-{n}")]).args(extra);
        let child = spawn_logged(&mut cmd, &log, &format!("{} #{n}", bin.display()))?;
        let mut guard = ChildGuard::new(format!("herald #{n}"), child);
        let until = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("herald listening") {
                break;
            }
            if guard.exited().is_some() || tokio::time::Instant::now() > until {
                bail!("herald #{n} did not start; log:\n{}", procs::tail(&log, 20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.others.push(guard);
        Ok(())
    }

    /// Starts `nodes` Herald processes in cluster mode on one port
    /// (SO_REUSEPORT) and a fresh registry database on the Postgres at
    /// `db_url` (a throwaway one): every publish goes through the registry's
    /// log and every node delivers it to the clients the kernel gave it.
    pub async fn herald_cluster(
        bin: &Path,
        extra_args: &[String],
        nodes: usize,
        db_url: &str,
    ) -> anyhow::Result<Target> {
        let name = format!(
            "herald_bench_{}",
            crate::client::now_nanos() % 1_000_000_000
        );
        let admin = sqlx::PgPool::connect(db_url)
            .await
            .context("connecting to --cluster-db")?;
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .context("creating the cluster's registry database")?;
        admin.close().await;
        let (root, _) = db_url
            .rsplit_once('/')
            .context("--cluster-db must end in /database")?;
        let url = format!("{root}/{name}");
        let mut extra = extra_args.to_vec();
        extra.extend(["--cluster".into(), "--database-url".into(), url]);
        if nodes > 1 {
            extra.push("--reuse-port".into());
        }
        let mut first = extra.clone();
        first.extend(["--node-id".into(), "bench-0".into()]);
        let mut t = Target::herald_one(bin, &first).await?;
        for n in 1..nodes {
            let dir = t._dir.path().join(n.to_string());
            t.add_process(bin, n, &dir, &extra).await?;
        }
        Ok(t)
    }

    async fn herald_one(bin: &Path, extra_args: &[String]) -> anyhow::Result<Target> {
        if !bin.is_file() {
            bail!("{} not found; build it with `cargo build --release -p herald-host` or pass --herald", bin.display());
        }
        let dir = TempDir::new("herald-bench")?;
        let port = procs::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let admin = format!("bench-admin-{}", crate::client::now_nanos());
        let log = dir.path().join("herald.log");
        let mut cmd = herald_command(bin, addr, dir.path(), &admin);
        cmd.args(extra_args);
        let child = spawn_logged(&mut cmd, &log, &bin.display().to_string())?;
        let mut t = Target {
            kind: Kind::Herald,
            addr,
            publish_addr: addr,
            publish_key: String::new(),
            admin: admin.clone(),
            guard: ChildGuard::new("herald", child),
            others: Vec::new(),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        // One tenant, its clients from one load generator's address: the
        // flood a public tenant's default shares guard against, so the
        // bench lifts them. A build from before those limits (a baseline)
        // refuses the fields: it gets the tenant without them.
        let lifted = serde_json::json!({"id": TENANT, "access": "public",
            "limits": {"connection_share_percent": 100, "max_connections_per_address": 10_000_000}})
        .to_string();
        let answer = match t
            .admin_request("POST", "/admin/v1/tenants", lifted.as_bytes())
            .await
        {
            Ok(a) => a,
            Err(e) if format!("{e:#}").contains("unknown field") => {
                let plain = serde_json::json!({"id": TENANT, "access": "public"}).to_string();
                t.admin_request("POST", "/admin/v1/tenants", plain.as_bytes())
                    .await?
            }
            Err(e) => return Err(e),
        };
        t.publish_key = answer["publish_key"]
            .as_str()
            .context("tenant has no publish_key")?
            .to_string();
        Ok(t)
    }

    /// One admin API call with Herald's admin token; an answer of 300 or more
    /// is an error naming the call.
    pub async fn admin_request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> anyhow::Result<serde_json::Value> {
        let r = HttpConn::new(self.addr)
            .request(method, path, Some(&self.admin), body)
            .await?;
        if r.status >= 300 {
            bail!("{method} {path}: {} {}", r.status, r.text());
        }
        if r.body.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        r.json()
    }

    /// Uploads a plugin component to the bench tenant and activates it.
    pub async fn install_plugin(&self, path: &Path) -> anyhow::Result<()> {
        self.install_plugin_on(TENANT, path).await
    }

    /// Uploads a plugin component to `tenant` and activates it.
    pub async fn install_plugin_on(&self, tenant: &str, path: &Path) -> anyhow::Result<()> {
        let wasm = std::fs::read(path)
            .with_context(|| format!("{}: run plugins/build.sh first", path.display()))?;
        let version = self
            .upload_plugin_on(tenant, &wasm)
            .await
            .with_context(|| format!("uploading {}", path.display()))?;
        let path = format!("/admin/v1/tenants/{tenant}/plugins/{version}/activate");
        self.admin_request("POST", &path, b"")
            .await
            .context("activating the plugin")?;
        Ok(())
    }

    /// Uploads a plugin component to `tenant` (waiting while a large one
    /// compiles in the background); returns its version.
    pub async fn upload_plugin_on(&self, tenant: &str, wasm: &[u8]) -> anyhow::Result<i64> {
        let path = format!("/admin/v1/tenants/{tenant}/plugins");
        let mut answer = self.admin_request("POST", &path, wasm).await?;
        let started = std::time::Instant::now();
        // The 202's status URL; the status it answers may not repeat it.
        let status = answer["status_url"].as_str().map(str::to_string);
        while answer["status"] == "compiling" {
            anyhow::ensure!(
                started.elapsed() < std::time::Duration::from_secs(300),
                "still compiling after 300 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let status = status.as_deref().context("202 without a status_url")?;
            answer = self.admin_request("GET", status, b"").await?;
        }
        anyhow::ensure!(answer["status"] != "failed", "upload failed: {answer}");
        answer["version"]
            .as_i64()
            .context("upload answer has no version")
    }

    /// How clients subscribe to this server.
    pub fn dialect(&self) -> Dialect {
        match self.kind {
            Kind::Herald | Kind::Raw => Dialect::Herald {
                tenant: TENANT.into(),
            },
            Kind::Nchan | Kind::Uws => Dialect::Bare {
                path: "/sub/{chs}".into(),
            },
            Kind::Python => Dialect::Bare {
                path: "/sub?ch={chs}".into(),
            },
        }
    }

    /// A keep-alive connection to the publish endpoint.
    pub fn publisher(&self) -> HttpConn {
        HttpConn::new(self.publish_addr)
    }

    /// Publishes `msgs` (channel, JSON payload): Herald, the raw baseline and
    /// the uWebSockets peer take them in one request (or one request each
    /// with `split`); nchan and Python take one request per message (their
    /// API has no batch of channels).
    pub async fn publish(
        &self,
        http: &mut HttpConn,
        msgs: &[(String, String)],
        split: bool,
    ) -> Published {
        let mut out = Published::default();
        let peer = matches!(self.kind, Kind::Nchan | Kind::Python);
        // uWebSockets takes Herald's batch body at `/pub`.
        let batch_path = match self.kind {
            Kind::Uws => "/pub".to_string(),
            _ => format!("/v1/t/{TENANT}/publish"),
        };
        if split || peer || msgs.len() == 1 {
            for (ch, data) in msgs {
                let (path, body) = match self.kind {
                    Kind::Herald | Kind::Raw => (
                        format!("/v1/t/{TENANT}/publish"),
                        format!(r#"{{"ch":"{ch}","data":{data}}}"#),
                    ),
                    Kind::Nchan | Kind::Python | Kind::Uws => (format!("/pub/{ch}"), data.clone()),
                };
                self.publish_one(http, &path, &body, 1, &mut out).await;
            }
        } else {
            let items: Vec<String> = msgs
                .iter()
                .map(|(ch, data)| format!(r#"{{"ch":"{ch}","data":{data}}}"#))
                .collect();
            let body = format!("[{}]", items.join(","));
            self.publish_one(http, &batch_path, &body, msgs.len() as u64, &mut out)
                .await;
        }
        out
    }

    async fn publish_one(
        &self,
        http: &mut HttpConn,
        path: &str,
        body: &str,
        messages: u64,
        out: &mut Published,
    ) {
        out.requests += 1;
        let key = (!self.publish_key.is_empty()).then_some(self.publish_key.as_str());
        let r = http.request("POST", path, key, body.as_bytes()).await;
        let err = match r {
            Ok(r) if (200..300).contains(&r.status) => match r.json() {
                Ok(v) => {
                    let (d, x) = delivered(&v);
                    out.messages += messages;
                    out.delivered += d;
                    out.dropped += x;
                    return;
                }
                Err(e) => format!("answer is not JSON: {e:#}: {}", r.text()),
            },
            Ok(r) => format!("status {}: {}", r.status, r.text()),
            Err(e) => format!("{e:#}"),
        };
        out.errors += 1;
        out.first_error.get_or_insert(err);
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let until = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.guard.exited() {
                bail!(
                    "{} exited at start ({status}); log:\n{}",
                    self.kind.as_str(),
                    procs::tail(&self.log, 20)
                );
            }
            let mut c = HttpConn::new(self.publish_addr);
            if let Ok(Ok(r)) = tokio::time::timeout(
                Duration::from_secs(1),
                c.request("GET", "/readyz", None, b""),
            )
            .await
            {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > until {
                bail!(
                    "{} not ready after {READY_TIMEOUT:?}; log:\n{}",
                    self.kind.as_str(),
                    procs::tail(&self.log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Fails if the server died (e.g. crashed under load), with its log tail.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for g in &mut self.others {
            if let Some(status) = g.exited() {
                bail!("{} died ({status})", g.name());
            }
        }
        if let Some(status) = self.guard.exited() {
            bail!(
                "{} died ({status}); log:\n{}",
                self.kind.as_str(),
                procs::tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// The server's processes: the ones started, and their children (nginx's worker).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.pid()];
        pids.extend(self.others.iter().map(|g| g.pid()));
        if self.kind == Kind::Nchan {
            pids.extend(procs::children(self.pid()));
        }
        pids
    }

    /// How many server processes share the listening port.
    pub fn processes(&self) -> usize {
        1 + self.others.len()
    }

    /// CPU seconds of every process of the server.
    pub fn cpu_secs(&self) -> anyhow::Result<f64> {
        self.pids().into_iter().map(procs::cpu_secs).sum()
    }

    /// (VmRSS, VmHWM) in KiB, summed over the server's processes.
    pub fn memory_kib(&self) -> anyhow::Result<(u64, u64)> {
        self.pids()
            .into_iter()
            .map(procs::memory_kib)
            .try_fold((0, 0), |a, m| m.map(|m| (a.0 + m.0, a.1 + m.1)))
    }

    /// Herald's `frames_sent`, `socket_writes` and lagging-reader holds
    /// counters for the tenant (holds 0 for a build without them).
    pub async fn write_counters(&self) -> Option<(f64, f64, f64)> {
        if self.kind != Kind::Herald {
            return None;
        }
        let r = HttpConn::new(self.addr)
            .request("GET", "/metrics", None, b"")
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&r.body);
        Some((
            metric(&text, "herald_frames_sent_total", TENANT)?,
            metric(&text, "herald_socket_writes_total", TENANT)?,
            metric(&text, "herald_lagging_reader_holds_total", TENANT).unwrap_or(0.0),
        ))
    }
}

/// `herald serve` on `addr` with its registry in `dir`/data and `admin` as token.
fn herald_command(bin: &Path, addr: SocketAddr, dir: &Path, admin: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .args(["--listen", &addr.to_string()])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--admin-token", admin]);
    cmd
}

/// Starts `cmd` with no input and its output (both streams) in `log`.
fn spawn_logged(cmd: &mut Command, log: &Path, what: &str) -> anyhow::Result<std::process::Child> {
    let logf = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .with_context(|| format!("starting {what}"))
}

/// Sum of `delivered` (Herald, raw, Python peer) or `subscribers` (nchan)
/// and of `dropped` (raw only) in a publish answer.
pub fn delivered(answer: &serde_json::Value) -> (u64, u64) {
    let one = |v: &serde_json::Value| {
        (
            v["delivered"]
                .as_u64()
                .or_else(|| v["subscribers"].as_u64())
                .unwrap_or(0),
            v["dropped"].as_u64().unwrap_or(0),
        )
    };
    match answer.get("results").and_then(|r| r.as_array()) {
        Some(items) => items
            .iter()
            .map(one)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        None => one(answer),
    }
}

/// Value of a Prometheus sample `name{…tenant="t"…} value`.
pub fn metric(text: &str, name: &str, tenant: &str) -> Option<f64> {
    let label = format!("tenant=\"{tenant}\"");
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        let rest = key.strip_prefix(name)?;
        (rest.starts_with('{') && rest.contains(&label)).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests;
