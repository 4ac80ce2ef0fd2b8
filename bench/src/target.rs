//! The server under test: a Herald process, or the bench's own raw baseline.
//!
//! Owns: starting the server on a free loopback port with a fresh data
//! directory, waiting for `/readyz`, creating the public `bench` tenant and
//! keeping its publish key, reading the server's RSS, CPU and (Herald only)
//! Prometheus counters. The process is held by a [`ChildGuard`]; its log goes
//! to a file whose tail is shown when start-up fails.

use crate::http::HttpConn;
use crate::procs::{self, ChildGuard, TempDir};
use anyhow::{bail, Context as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub const TENANT: &str = "bench";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Herald,
    Raw,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Herald => "herald",
            Kind::Raw => "raw",
        }
    }
}

pub struct Target {
    pub kind: Kind,
    pub addr: SocketAddr,
    pub publish_key: String,
    /// The admin token Herald was started with (empty for the raw server).
    pub admin: String,
    guard: ChildGuard,
    log: PathBuf,
    // Dropped after `guard` (field order): the process is gone before its directory.
    _dir: TempDir,
}

impl Target {
    /// Starts `herald serve` and creates the public tenant.
    pub async fn herald(bin: &Path, extra_args: &[String]) -> anyhow::Result<Target> {
        if !bin.is_file() {
            bail!("{} not found; build it with `cargo build --release -p herald-host` or pass --herald", bin.display());
        }
        let dir = TempDir::new("herald-bench")?;
        let port = procs::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let admin = format!("bench-admin-{}", crate::client::now_nanos());
        let log = dir.path().join("herald.log");
        let logf = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .arg("serve")
            .args(["--listen", &addr.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--admin-token", &admin])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut t = Target {
            kind: Kind::Herald,
            addr,
            publish_key: String::new(),
            admin: admin.clone(),
            guard: ChildGuard::new("herald", child),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        let body = serde_json::json!({"id": TENANT, "access": "public"}).to_string();
        let r = HttpConn::new(addr)
            .request("POST", "/admin/v1/tenants", Some(&admin), body.as_bytes())
            .await?;
        if r.status != 201 {
            bail!(
                "creating tenant {TENANT}: status {}: {}",
                r.status,
                r.text()
            );
        }
        t.publish_key = r.json()?["publish_key"]
            .as_str()
            .context("tenant has no publish_key")?
            .to_string();
        Ok(t)
    }

    /// Uploads a plugin component to the bench tenant and activates it.
    pub async fn install_plugin(&self, path: &Path) -> anyhow::Result<()> {
        let wasm = std::fs::read(path)
            .with_context(|| format!("{}: run plugins/build.sh first", path.display()))?;
        let mut http = HttpConn::new(self.addr);
        let r = http
            .request(
                "POST",
                &format!("/admin/v1/tenants/{TENANT}/plugins"),
                Some(&self.admin),
                &wasm,
            )
            .await?;
        if r.status != 201 {
            bail!("uploading {}: {} {}", path.display(), r.status, r.text());
        }
        let version = r.json()?["version"]
            .as_i64()
            .context("upload answer has no version")?;
        let path = format!("/admin/v1/tenants/{TENANT}/plugins/{version}/activate");
        let r = http.request("POST", &path, Some(&self.admin), b"").await?;
        if r.status != 200 {
            bail!("activating the plugin: {} {}", r.status, r.text());
        }
        Ok(())
    }

    /// Starts `bench raw-server` (this binary) as the baseline.
    pub async fn raw() -> anyhow::Result<Target> {
        let exe = std::env::current_exe().context("finding the bench binary")?;
        let dir = TempDir::new("raw-bench")?;
        let port = procs::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = dir.path().join("raw.log");
        let logf = std::fs::File::create(&log)?;
        let child = Command::new(exe)
            .arg("raw-server")
            .args(["--listen", &addr.to_string()])
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .context("starting the raw baseline server")?;
        let mut t = Target {
            kind: Kind::Raw,
            addr,
            publish_key: "raw".into(),
            admin: String::new(),
            guard: ChildGuard::new("raw-server", child),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        Ok(t)
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
            let mut c = HttpConn::new(self.addr);
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
        if let Some(status) = self.guard.exited() {
            bail!(
                "{} died ({status}); log:\n{}",
                self.kind.as_str(),
                procs::tail(&self.log, 30)
            );
        }
        Ok(())
    }

    pub fn cpu_secs(&self) -> anyhow::Result<f64> {
        procs::cpu_secs(self.pid())
    }

    /// (VmRSS, VmHWM) in KiB.
    pub fn memory_kib(&self) -> anyhow::Result<(u64, u64)> {
        procs::memory_kib(self.pid())
    }

    /// Herald's `frames_sent` and `socket_writes` counters for the tenant.
    pub async fn write_counters(&self) -> Option<(f64, f64)> {
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
        ))
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
mod tests {
    use super::*;

    #[test]
    fn reads_prometheus_samples() {
        let text = "# TYPE herald_frames_sent_total counter\n\
                    herald_frames_sent_total{tenant=\"other\"} 5\n\
                    herald_frames_sent_total{tenant=\"bench\"} 12345\n\
                    herald_frames_sent_total_x{tenant=\"bench\"} 1\n\
                    herald_socket_writes_total{tenant=\"bench\"} 678\n";
        assert_eq!(
            metric(text, "herald_frames_sent_total", "bench"),
            Some(12345.0)
        );
        assert_eq!(
            metric(text, "herald_socket_writes_total", "bench"),
            Some(678.0)
        );
        assert_eq!(metric(text, "herald_socket_writes_total", "none"), None);
    }
}
