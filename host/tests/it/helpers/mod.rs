//! Test harness: a real Herald on port 0 with a fresh registry, and real
//! WebSocket / SSE / HTTP clients over loopback.

use futures_util::{SinkExt, StreamExt};
use herald::config::Config;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

pub const ADMIN: &str = "test-admin-token-0123456789";
pub const WAIT: Duration = Duration::from_secs(5);

mod node;
pub use node::{connect_from, Node};

pub struct Host {
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    pub data_dir: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

pub struct HostOptions {
    pub config: Config,
    pub dir: Option<tempfile::TempDir>,
}

impl HostOptions {
    pub fn new() -> HostOptions {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::for_data_dir(dir.path());
        config.admin_token = Some(ADMIN.into());
        config.shutdown_grace = Duration::from_secs(3);
        config.compiled_dir = Some(shared_compiled());
        HostOptions {
            config,
            dir: Some(dir),
        }
    }

    /// Compiled components kept in the data dir, not shared: for the tests
    /// of compiling and of what the data dir holds.
    pub fn own_compiled(mut self) -> HostOptions {
        self.config.compiled_dir = None;
        self
    }
}

/// The compiled components every test host shares, by sha256, across tests
/// and runs (a large one takes 10-30 s to compile; the artifact cache
/// checks each file's MAC and wasmtime's version before loading it).
pub fn shared_compiled() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/herald-test-compiled")
}

pub async fn spawn_host() -> Host {
    spawn_with(HostOptions::new()).await
}

pub async fn spawn_with(opts: HostOptions) -> Host {
    let (host, _) = spawn_unready(opts).await;
    wait_ready(&host).await;
    host
}

/// Starts a host and returns once it listens (/healthz), before it is ready.
pub async fn spawn_unready(opts: HostOptions) -> (Host, ()) {
    let host = spawn_unchecked(opts);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(r) = host.http.get(host.url("/healthz")).send().await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "host did not listen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (host, ())
}

/// Starts a host without waiting for anything (its listener is bound:
/// connections wait in the backlog until it serves).
pub fn spawn_unchecked(opts: HostOptions) -> Host {
    let listener = herald::bind("127.0.0.1:0".parse().unwrap(), 1024, false).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let data_dir = opts.config.data_dir.clone();
    let task = tokio::spawn(herald::run(opts.config, listener, async {
        let _ = rx.await;
    }));
    Host {
        addr,
        http: reqwest::Client::new(),
        stop: Some(tx),
        task: Some(task),
        data_dir,
        _dir: opts.dir,
    }
}

/// Waits for /readyz (every plugin of the start loaded; compiling a large
/// one takes seconds).
pub async fn wait_ready(host: &Host) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = host.http.get(host.url("/readyz")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "host did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Host {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn ws_url(&self, tenant: &str) -> String {
        format!("ws://{}/v1/t/{tenant}/ws", self.addr)
    }

    /// Stops the host and waits for `run` to return; gives back the data dir.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        self.stop.take().unwrap().send(()).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), self.task.take().unwrap())
            .await
            .expect("run returned within the deadline")
            .unwrap();
        r.expect("run succeeded");
        self._dir.take()
    }

    /// Stops the host and starts a new one on the same registry.
    pub async fn restart(self) -> Host {
        let data_dir = self.data_dir.clone();
        let dir = self.stop().await;
        let mut opts = HostOptions::new();
        opts.config.data_dir = data_dir;
        opts.dir = dir;
        spawn_with(opts).await
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path)).bearer_auth(ADMIN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let v = r.json().await.unwrap_or(Value::Null);
        (status, v)
    }

    /// Creates a tenant and returns its publish key.
    pub async fn tenant(&self, body: Value) -> String {
        let (s, v) = self
            .admin(reqwest::Method::POST, "/admin/v1/tenants", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
        v["publish_key"].as_str().unwrap().to_string()
    }

    pub async fn public_tenant(&self, id: &str) -> String {
        self.tenant(json!({"id": id, "access": "public"})).await
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

    pub async fn metric(&self, name_and_labels: &str) -> f64 {
        metric_at(&self.http, &self.url("/metrics"), name_and_labels).await
    }

    /// Uploads a component built from plugins/; returns (status, body).
    pub async fn upload_plugin(&self, tenant: &str, bytes: Vec<u8>) -> (u16, Value) {
        upload_at(
            &self.http,
            &self.url(&format!("/admin/v1/tenants/{tenant}/plugins")),
            bytes,
        )
        .await
    }

    /// Uploads and activates a plugin; returns its version.
    pub async fn install_plugin(&self, tenant: &str, name: &str) -> i64 {
        let (s, v) = self.upload_plugin(tenant, plugin_wasm(name)).await;
        assert_eq!(s, 201, "{v}");
        let version = v["version"].as_i64().unwrap();
        self.activate(tenant, version).await;
        version
    }

    pub async fn activate(&self, tenant: &str, version: i64) {
        let path = format!("/admin/v1/tenants/{tenant}/plugins/{version}/activate");
        let (s, v) = self.admin(reqwest::Method::POST, &path, None).await;
        assert_eq!(s, 200, "{v}");
    }

    /// Connects with a token in the query; returns the HTTP status on refusal.
    pub async fn ws_with(&self, tenant: &str, query: &str) -> Result<Ws, (u16, Value)> {
        ws_at(&format!("{}?{query}", self.ws_url(tenant))).await
    }

    pub async fn ws(&self, tenant: &str) -> Ws {
        let (s, _) = tokio_tungstenite::connect_async(self.ws_url(tenant))
            .await
            .expect("ws connect");
        Ws { s }
    }

    pub async fn sse(&self, tenant: &str, query: &str, last_event_id: Option<&str>) -> Sse {
        sse_at(self.addr, tenant, query, last_event_id).await
    }
}

/// An SSE stream of `tenant` on the server at `addr`, resumed from
/// `last_event_id` when given; its status and headers read.
pub async fn sse_at(
    addr: SocketAddr,
    tenant: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> Sse {
    {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut req = format!(
            "GET /v1/t/{tenant}/sse?{query} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
        );
        if let Some(id) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut r = BufReader::new(stream);
        let mut status = String::new();
        r.read_line(&mut status).await.unwrap();
        let code: u16 = status
            .split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .parse()
            .unwrap();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await.unwrap() == 0 || line == "\r\n" {
                break;
            }
        }
        Sse { r, status: code }
    }
}

/// The sum of the lines of the metrics at `url` starting with `name_and_labels`.
async fn metric_at(http: &reqwest::Client, url: &str, name_and_labels: &str) -> f64 {
    let text = http.get(url).send().await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|l| l.starts_with(name_and_labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `POST url` with a publish key and a JSON body; (status, body).
pub async fn publish_at(http: &reqwest::Client, url: &str, key: &str, body: Value) -> (u16, Value) {
    let r = http
        .post(url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `POST url` with the admin token and a component's bytes; (status, body).
/// Uploads a component. A large one is accepted (202) and compiled in the
/// background: this polls its status and answers as the synchronous path
/// would (201 and the version, or 422 and the error).
async fn upload_at(http: &reqwest::Client, url: &str, bytes: Vec<u8>) -> (u16, Value) {
    let (s, v) = upload_once(http, url, bytes).await;
    if s != 202 {
        return (s, v);
    }
    let origin = url.split("/admin/").next().unwrap_or_default();
    let status_url = format!("{origin}{}", v["status_url"].as_str().unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let r = http
            .get(&status_url)
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        match v["status"].as_str() {
            Some("stored") => return (201, v),
            Some("failed") => return (422, v),
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "upload still compiling: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One upload request: (status, body), 202 included.
pub async fn upload_once(http: &reqwest::Client, url: &str, bytes: Vec<u8>) -> (u16, Value) {
    let r = http
        .post(url)
        .bearer_auth(ADMIN)
        .body(bytes)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// A WebSocket to `url`; the HTTP status and JSON body when refused.
pub async fn ws_at(url: &str) -> Result<Ws, (u16, Value)> {
    match tokio_tungstenite::connect_async(url).await {
        Ok((s, _)) => Ok(Ws { s }),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = r
                .body()
                .as_ref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            Err((r.status().as_u16(), body))
        }
        Err(e) => panic!("{e}"),
    }
}

/// A subscriber of `c` whose socket has a tiny receive buffer and that
/// never reads: its queue fills under the tenant's slow-consumer policy.
pub async fn stalled_subscriber(h: &Host, tenant: &str) -> Ws {
    stalled_subscriber_at(h.addr, &h.ws_url(tenant)).await
}

/// [`stalled_subscriber`] of the server at `addr`, `url` its tenant's.
pub async fn stalled_subscriber_at(addr: SocketAddr, url: &str) -> Ws {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = sock.connect(addr).await.unwrap();
    let plain = tokio_tungstenite::MaybeTlsStream::Plain(stream);
    let (s, _) = tokio_tungstenite::client_async(url, plain).await.unwrap();
    let mut ws = Ws { s };
    ws.sub("c", 1).await;
    ws
}

/// A component built by plugins/build.sh (the test script builds them).
pub fn plugin_wasm(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run plugins/build.sh first", path.display()))
}

/// The example plugin's component in `lang` (plugins/example/SPEC.md), as
/// plugins/example/<lang>/build.sh wrote it (Rust: the plugins workspace's
/// build).
pub fn example_component(lang: &str) -> Vec<u8> {
    if lang == "rust" {
        return plugin_wasm("herald_example_rust");
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/target/example")
        .join(format!("{lang}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run plugins/example/build.sh first",
            path.display()
        )
    })
}

pub struct Ws {
    pub s: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
}

impl Ws {
    pub async fn send(&mut self, v: Value) {
        self.s
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    pub async fn send_raw(&mut self, m: Message) {
        self.s.send(m).await.unwrap();
    }

    /// The next JSON text frame (pings are answered by tungstenite).
    pub async fn next(&mut self) -> Value {
        self.next_within(WAIT).await
    }

    /// The next text frame, each read given `within`.
    pub async fn next_within(&mut self, within: Duration) -> Value {
        loop {
            let m = tokio::time::timeout(within, self.s.next())
                .await
                .expect("frame within deadline");
            match m.expect("stream open").expect("frame") {
                Message::Text(t) => return serde_json::from_str(&t).unwrap(),
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("unexpected frame {other:?}"),
            }
        }
    }

    pub async fn sub(&mut self, ch: &str, id: u64) -> Value {
        self.send(json!({"op":"sub","ch":ch,"id":id})).await;
        let ack = self.next().await;
        assert_eq!(ack["op"], "ack", "{ack}");
        assert_eq!(ack["id"], id);
        ack
    }

    /// Waits for the server's close frame; returns its code and reason.
    pub async fn closed(&mut self) -> (u16, String) {
        loop {
            let m = tokio::time::timeout(WAIT, self.s.next())
                .await
                .expect("close within deadline");
            match m {
                Some(Ok(Message::Close(Some(f)))) => {
                    return (u16::from(f.code), f.reason.to_string())
                }
                Some(Ok(Message::Close(None))) => {
                    return (u16::from(CloseCode::Status), String::new())
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => panic!("error instead of close: {e}"),
                None => panic!("stream ended without a close frame"),
            }
        }
    }
}

pub struct Sse {
    r: BufReader<TcpStream>,
    pub status: u16,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event: String,
    pub data: Value,
    pub id: Option<String>,
}

impl Sse {
    /// The next event with a `data:` field (comments and `retry:` skipped);
    /// `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Event> {
        let mut event = String::new();
        let mut data = String::new();
        let mut id = None;
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(WAIT, self.r.read_line(&mut line))
                .await
                .expect("sse line within deadline")
                .ok()?;
            if n == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if !data.is_empty() {
                    return Some(Event {
                        event,
                        data: serde_json::from_str(&data).unwrap(),
                        id,
                    });
                }
                continue;
            }
            if let Some(v) = line.strip_prefix("event: ") {
                event = v.to_string();
            } else if let Some(v) = line.strip_prefix("data: ") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v);
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            }
        }
    }
}

/// The next frame with `op`; frames of other ops before it are skipped.
pub async fn next_op(ws: &mut Ws, op: &str, within: Duration) -> Value {
    tokio::time::timeout(within, async {
        loop {
            let m = ws.next_within(within).await;
            if m["op"] == op {
                return m;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {op} frame within {within:?}"))
}

impl Sse {
    /// The next raw line of the stream without its line ending (comments
    /// and `retry:` included); `None` when the stream ended.
    pub async fn next_line(&mut self) -> Option<String> {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, self.r.read_line(&mut line))
            .await
            .expect("sse line within deadline")
            .ok()?;
        (n > 0).then(|| line.trim_end_matches(['\r', '\n']).to_string())
    }
}

/// A loopback TCP proxy in front of `target` that counts the connections
/// clients open through it: proof of how many sockets a pooled client used.
pub struct CountingProxy {
    pub addr: SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl CountingProxy {
    pub async fn start(target: SocketAddr) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        CountingProxy {
            addr,
            accepted,
            task,
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response read off a raw socket: status, lower-cased headers, body.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response head (byte by byte, so nothing after it is consumed)
/// and, unless it is a 101 or an event stream, its `Content-Length` body.
pub async fn read_response(stream: &mut TcpStream) -> RawResponse {
    use tokio::io::AsyncReadExt;
    tokio::time::timeout(WAIT, async {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = stream.read(&mut b).await.expect("read response head");
            assert!(n == 1, "connection closed inside a response head: {head:?}");
            head.push(b[0]);
            assert!(head.len() < 16 * 1024, "response head too long");
        }
        let text = String::from_utf8(head).unwrap();
        let mut lines = text.split("\r\n");
        let status = lines.next().unwrap().split_whitespace().nth(1).unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut r = RawResponse {
            status: status.parse().unwrap(),
            headers,
            body: Vec::new(),
        };
        let len = r
            .header("content-length")
            .map(|v| v.parse::<usize>().unwrap());
        if let Some(len) = len {
            r.body = vec![0; len];
            stream.read_exact(&mut r.body).await.expect("read body");
        }
        r
    })
    .await
    .expect("response within deadline")
}

/// A WebSocket upgrade request for `tenant` (HTTP/1.1, fixed key).
pub fn ws_upgrade_request(tenant: &str, extra_headers: &str) -> String {
    format!(
        "GET /v1/t/{tenant}/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
    )
}

/// A raw socket upgraded to a WebSocket session of `tenant` (101 checked),
/// for tests that write and read frames by hand.
pub async fn raw_ws_session(addr: SocketAddr, tenant: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(ws_upgrade_request(tenant, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.status, 101);
    s
}

/// One masked client text frame (payload under 126 bytes).
pub fn client_text_frame(text: &str) -> Vec<u8> {
    let mask = [0x1u8, 0x2, 0x3, 0x4];
    assert!(text.len() < 126);
    let mut f = vec![0x81, 0x80 | text.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Turns a socket whose 101 was already read into a WebSocket client.
pub async fn ws_from_upgraded(stream: TcpStream) -> Ws {
    let s = tokio_tungstenite::WebSocketStream::from_raw_socket(
        tokio_tungstenite::MaybeTlsStream::Plain(stream),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    Ws { s }
}
