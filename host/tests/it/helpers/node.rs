//! A `herald serve` process of its own: cluster nodes, restarts, limits.

use super::{metric_at, publish_at, upload_at, ws_at, Ws, ADMIN, WAIT};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;

/// A `herald serve` process of its own (several make a cluster), to stop,
/// kill without a word, or start again on the same flags.
pub struct Node {
    child: tokio::process::Child,
    logs: Arc<Mutex<String>>,
    pub port: u16,
    pub http: reqwest::Client,
    dir: PathBuf,
    args: Vec<String>,
}

impl Node {
    /// Starts one on `dir` with `args` beyond the listener, admin token and
    /// data dir, and waits until it is ready.
    pub async fn start(dir: &std::path::Path, args: &[&str]) -> Node {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Node::spawn(dir.to_path_buf(), args, None, None).await
    }

    /// Starts one whose open-files limit (soft and hard) is `nofile`.
    pub async fn start_limited(dir: &std::path::Path, args: &[&str], nofile: u64) -> Node {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Node::spawn(dir.to_path_buf(), args, None, Some(nofile)).await
    }

    /// The process id (for reading /proc).
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// The process's resident memory now, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        kib * 1024
    }

    /// Starts one on a given port (several with `--reuse-port` share it).
    pub async fn start_on(dir: &std::path::Path, args: &[&str], port: u16) -> Node {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Node::spawn(dir.to_path_buf(), args, Some(port), None).await
    }

    async fn spawn(
        dir: PathBuf,
        args: Vec<String>,
        port: Option<u16>,
        nofile: Option<u64>,
    ) -> Node {
        let port = port.unwrap_or_else(|| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        });
        // prlimit sets the limit on itself and execs herald: one process.
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = tokio::process::Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}"))
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_herald"));
                c
            }
            None => tokio::process::Command::new(env!("CARGO_BIN_EXE_herald")),
        };
        let mut child = cmd
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-token",
                ADMIN,
                "--log",
                "warn",
            ])
            .arg("--data-dir")
            .arg(&dir)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(String::new()));
        // Its log (on stdout), kept for the test and shown with its output.
        let mut log = BufReader::new(child.stdout.take().unwrap()).lines();
        let kept = logs.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = log.next_line().await {
                eprintln!("{line}");
                let mut kept = kept.lock().unwrap();
                kept.push_str(&line);
                kept.push('\n');
            }
        });
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let deadline = tokio::time::Instant::now() + WAIT * 2;
        while !reqwest::get(&ready).await.is_ok_and(|r| r.status() == 200) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "herald did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Node {
            child,
            logs,
            port,
            http: reqwest::Client::new(),
            dir,
            args,
        }
    }

    /// What the process logged so far (at `warn`, on its stdout).
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// What the process logs, also after it ended.
    pub fn logs_handle(&self) -> Arc<Mutex<String>> {
        self.logs.clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub async fn admin(&self, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .request(method, self.url(path))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn publish(&self, tenant: &str, key: &str, body: Value) -> (u16, Value) {
        publish_at(
            &self.http,
            &self.url(&format!("/v1/t/{tenant}/publish")),
            key,
            body,
        )
        .await
    }

    /// The sum of the metric lines starting with `name_and_labels`.
    pub async fn metric(&self, name_and_labels: &str) -> f64 {
        metric_at(&self.http, &self.url("/metrics"), name_and_labels).await
    }

    /// Opens a WebSocket; the HTTP status and body when refused.
    pub async fn ws(&self, tenant: &str, query: &str) -> Result<Ws, (u16, Value)> {
        ws_at(&format!(
            "ws://127.0.0.1:{}/v1/t/{tenant}/ws?{query}",
            self.port
        ))
        .await
    }

    /// An SSE stream of `tenant` here (see [`super::sse_at`]).
    pub async fn sse(&self, tenant: &str, query: &str, last_event_id: Option<&str>) -> super::Sse {
        let addr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        super::sse_at(addr, tenant, query, last_event_id).await
    }

    pub async fn subscriber(&self, tenant: &str, ch: &str) -> Ws {
        let mut ws = self.ws(tenant, "").await.expect("ws connect");
        ws.sub(ch, 1).await;
        ws
    }

    pub async fn upload_plugin(&self, tenant: &str, bytes: Vec<u8>) -> (u16, Value) {
        upload_at(
            &self.http,
            &self.url(&format!("/admin/v1/tenants/{tenant}/plugins")),
            bytes,
        )
        .await
    }

    /// Ends the process at once (SIGKILL): nothing is flushed or stored.
    pub async fn kill(mut self) -> (PathBuf, Vec<String>, u16) {
        self.signal("KILL");
        self.child.wait().await.unwrap();
        (self.dir.clone(), self.args.clone(), self.port)
    }

    /// Asks the process to stop (SIGTERM) and waits for it to exit.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("herald exited after SIGTERM")
            .unwrap()
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Starts a node again where a killed one ran: same flags, data and port.
    pub async fn restart((dir, args, port): (PathBuf, Vec<String>, u16)) -> Node {
        Node::spawn(dir, args, Some(port), None).await
    }
}

/// A TCP connection to `addr` from the loopback address `ip` (127.0.0.0/8
/// is all this machine's: one test, many client addresses).
pub async fn connect_from(ip: &str, addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let ip: std::net::IpAddr = ip.parse().expect("an address");
    let s = tokio::net::TcpSocket::new_v4()?;
    s.bind(std::net::SocketAddr::new(ip, 0))?;
    s.connect(addr).await
}
