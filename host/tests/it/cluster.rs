//! Cluster mode: three `herald serve` processes on one Postgres registry
//! (a database of its own per test), as users run them behind a load
//! balancer. Admin changes reach every node, a publish on one reaches the
//! subscribers of all with one `seq`, and a client that moves to another
//! node resumes without a gap.

use crate::helpers::*;
use crate::outbox::{msgs, pg_url};
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// What "within 1 s" is checked against: the promise, plus the time a
/// loaded test machine takes to answer the probe itself.
const PROPAGATION: Duration = Duration::from_millis(1500);

/// A fresh registry database on the test server and a directory for the
/// nodes' data; `finish` kills the nodes and drops the database.
struct Registry {
    admin: sqlx::PgPool,
    name: String,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Registry {
    async fn new() -> Option<Registry> {
        let base = pg_url()?;
        let admin = sqlx::PgPool::connect(&base).await.unwrap();
        let name = format!("herald_cluster_{:08x}", rand::random::<u32>());
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .unwrap();
        let (root, _) = base.rsplit_once('/').unwrap();
        let url = format!("{root}/{name}");
        let dir = tempfile::tempdir().unwrap();
        Some(Registry {
            admin,
            name,
            url,
            dir,
        })
    }

    /// A node of the cluster, reconciling every second.
    async fn node(&self, id: &str) -> Node {
        self.node_with(id, &[]).await
    }

    /// A node of the cluster with flags of its own.
    async fn node_with(&self, id: &str, extra: &[&str]) -> Node {
        self.node_via(id, &self.url, extra).await
    }

    /// A node reaching the registry at `url` (through a proxy).
    async fn node_via(&self, id: &str, url: &str, extra: &[&str]) -> Node {
        let mut args = vec![
            "--database-url",
            url,
            "--cluster",
            "--node-id",
            id,
            "--reconcile-secs",
            "1",
        ];
        args.extend_from_slice(extra);
        Node::start(&self.dir.path().join(id), &args).await
    }

    async fn nodes(&self, ids: &[&str]) -> Vec<Node> {
        let mut out = Vec::new();
        for id in ids {
            out.push(self.node(id).await);
        }
        out
    }

    async fn finish(self, nodes: impl IntoIterator<Item = Node>) {
        for n in nodes {
            n.kill().await;
        }
        let _ = sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&self.admin)
        .await;
    }
}

/// Publishes `{"i": n}` to `ch` through a node every `every` until stopped.
struct Steady {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<u64>,
}

impl Steady {
    fn start(via: &Node, tenant: &str, key: &str, ch: &str, every: Duration) -> Steady {
        let (stop, sent) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (http, url, key, ch) = (
            via.http.clone(),
            via.url(&format!("/v1/t/{tenant}/publish")),
            key.to_string(),
            ch.to_string(),
        );
        let (s, n) = (stop.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) && i < 3000 {
                let r = http
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&json!({"ch":ch,"data":{"i":i}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                i += 1;
                n.store(i, Ordering::SeqCst);
                tokio::time::sleep(every).await;
            }
            i
        });
        Steady { stop, sent, task }
    }

    /// Publishes answered so far.
    fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Stops; returns how many were published.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Reads a client that moved to another node until it has the last of
/// `published` messages (`{"i": n}`): no `gap` on the way, and `got` (what
/// it had before the move, then this) is every message once, in order.
async fn catch_up(moved: &mut Ws, got: &mut Vec<Value>, published: u64) {
    let next = |got: &Vec<Value>| {
        got.last()
            .map_or(0, |m| m["data"]["i"].as_u64().unwrap() + 1)
    };
    while next(got) < published {
        let m = moved.next().await;
        assert_ne!(m["op"], "gap", "no gap after the move: {m}");
        if m["op"] == "msg" {
            got.push(m);
        }
    }
    let is: Vec<u64> = got
        .iter()
        .map(|m| m["data"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(is, (0..published).collect::<Vec<_>>(), "every message once");
}

/// Polls `probe` until it holds; panics with `what` after `within`.
async fn within<F, Fut>(within: Duration, what: &str, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if probe().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what} not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create(n: &Node, body: Value) -> String {
    let (s, v) = n.admin(Method::POST, "/admin/v1/tenants", body).await;
    assert_eq!(s, 201, "{v}");
    v["publish_key"].as_str().unwrap().to_string()
}

/// A tenant created, re-keyed, given a plugin and deleted through one node
/// takes effect on the others within a second: the key rotated through B
/// stops working on A and C, the plugin activated on B runs on A and C, and
/// deletion through C closes the tenant's sessions on A and B.
#[tokio::test]
async fn admin_changes_reach_every_node() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let n = reg.nodes(&["a", "b", "c"]).await;
    let (a, b, c) = (&n[0], &n[1], &n[2]);

    let key = create(a, json!({"id":"cl-admin","access":"public"})).await;
    for other in [b, c] {
        within(
            PROPAGATION,
            "a tenant created on A served by B and C",
            || async { other.ws("cl-admin", "").await.is_ok() },
        )
        .await;
    }

    // The key rotated through B: the old one stops working everywhere.
    let (s, v) = b
        .admin(
            Method::POST,
            "/admin/v1/tenants/cl-admin/publish-key",
            json!({}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let fresh = v["publish_key"].as_str().unwrap().to_string();
    let msg = json!({"ch":"k","data":1});
    for other in [a, c] {
        within(
            PROPAGATION,
            "the rotated key refused on A and C",
            || async { other.publish("cl-admin", &key, msg.clone()).await.0 == 401 },
        )
        .await;
        assert_eq!(other.publish("cl-admin", &fresh, msg.clone()).await.0, 200);
    }

    // A plugin activated through B runs on A and C: ticker-merge adds `last`.
    let (s, up) = b
        .upload_plugin("cl-admin", plugin_wasm("ticker_merge"))
        .await;
    assert_eq!(s, 201, "{up}");
    let version = up["version"].as_i64().unwrap();
    let path = format!("/admin/v1/tenants/cl-admin/plugins/{version}/activate");
    assert_eq!(b.admin(Method::POST, &path, json!({})).await.0, 200);
    for other in [a, c] {
        let mut ws = other.subscriber("cl-admin", "ticks").await;
        let tick = json!({"ch":"ticks","data":{"sym":"X","px":1}});
        let start = Instant::now();
        loop {
            assert_eq!(other.publish("cl-admin", &fresh, tick.clone()).await.0, 200);
            if msgs(&mut ws, 1).await[0]["data"].get("last").is_some() {
                break;
            }
            assert!(
                start.elapsed() < PROPAGATION,
                "the plugin activated on B not running on A and C within {PROPAGATION:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // Deleted through C: sessions on A and B are closed with 4000.
    let mut on_a = a.subscriber("cl-admin", "x").await;
    let mut on_b = b.subscriber("cl-admin", "x").await;
    let (s, _) = c
        .admin(Method::DELETE, "/admin/v1/tenants/cl-admin", json!({}))
        .await;
    assert_eq!(s, 204);
    for ws in [&mut on_a, &mut on_b] {
        let closed = tokio::time::timeout(PROPAGATION, ws.closed())
            .await
            .expect("closed within 1 s");
        assert_eq!(closed.0, 4000);
    }
    for other in [a, b] {
        assert_eq!(other.ws("cl-admin", "").await.err().map(|e| e.0), Some(404));
    }

    // The cluster view lists every node with what it runs.
    let (s, view) = a.admin(Method::GET, "/admin/v1/nodes", json!({})).await;
    assert_eq!(s, 200, "{view}");
    let mut ids: Vec<&str> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["a", "b", "c"], "{view}");
    reg.finish(n).await;
}

/// A publish through A reaches subscribers on A, B and C in order and with
/// the same `seq` on every node: it goes through the registry's log, and
/// every node (A too) delivers it from there.
#[tokio::test]
async fn a_publish_reaches_every_node_with_one_seq() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let n = reg.nodes(&["a", "b", "c"]).await;
    let key = create(&n[0], json!({"id":"cl-pub","access":"public"})).await;
    let mut subs = Vec::new();
    for node in &n {
        let ws = within(PROPAGATION, "the tenant on every node", || async {
            node.ws("cl-pub", "").await.is_ok()
        })
        .await;
        let _ = ws;
        subs.push(node.subscriber("cl-pub", "t").await);
    }
    let mut answered = Vec::new();
    for i in 0..20 {
        let via = &n[i % 3];
        let (s, v) = via
            .publish("cl-pub", &key, json!({"ch":"t","data":{"i":i}}))
            .await;
        assert_eq!(s, 200, "{v}");
        answered.push(v["seq"].as_u64().expect("the answer carries the seq"));
    }
    let mut seen: Vec<Vec<(u64, u64, Value)>> = Vec::new();
    for ws in subs.iter_mut() {
        let got = msgs(ws, 20).await;
        seen.push(
            got.iter()
                .map(|m| {
                    (
                        m["seq"].as_u64().unwrap(),
                        m["prev"].as_u64().unwrap(),
                        m["data"]["i"].clone(),
                    )
                })
                .collect(),
        );
    }
    let order: Vec<Value> = (0..20).map(|i| json!(i)).collect();
    for (node, got) in seen.iter().enumerate() {
        let data: Vec<Value> = got.iter().map(|g| g.2.clone()).collect();
        assert_eq!(data, order, "node {node}: every message, in order");
        for w in got.windows(2) {
            assert_eq!(w[1].1, w[0].0, "node {node}: prev chains");
        }
        let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            seqs, answered,
            "node {node}: the seqs the publishes answered"
        );
    }
    reg.finish(n).await;
}

/// A node killed mid-stream: its clients reconnect to another node with the
/// `since`/`epoch` they hold and get what they missed — no gap, no
/// duplicate. The killed node, started again, catches up from its cursor.
#[tokio::test]
async fn a_killed_node_s_clients_resume_elsewhere() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let mut n = reg.nodes(&["a", "b", "c"]).await;
    let key = create(&n[1], json!({"id":"cl-fail","access":"public"})).await;
    for node in &n {
        within(PROPAGATION, "the tenant on every node", || async {
            node.ws("cl-fail", "").await.is_ok()
        })
        .await;
    }
    let mut ws = n[0].ws("cl-fail", "").await.unwrap();
    let ack = ws.sub("s", 1).await;
    let epoch = ack["epoch"].as_u64().unwrap();
    let publisher = Steady::start(&n[1], "cl-fail", &key, "s", Duration::from_millis(5));
    let before = msgs(&mut ws, 30).await;
    let a = n.remove(0);
    let killed = a.kill().await;
    // Message `answered` had not been answered yet, so the one after it was
    // published once A was dead: A never read it.
    let answered = publisher.sent() as usize;
    // Whatever was in flight to the client died with A.
    let last = before.last().unwrap()["seq"].as_u64().unwrap();
    let mut moved = n[1].ws("cl-fail", "").await.unwrap();
    moved
        .send(json!({"op":"sub","ch":"s","id":2,"since":last,"epoch":epoch}))
        .await;
    let ack = moved.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    assert_eq!(ack["epoch"], epoch, "epochs mean the same on every node");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = publisher.stop().await;
    let mut got: Vec<Value> = before.clone();
    catch_up(&mut moved, &mut got, published).await;
    for w in got.windows(2) {
        assert_eq!(w[1]["prev"], w[0]["seq"]);
    }

    // A again, on its stored cursor: it catches up with what was published
    // while it was down, so a client resuming there from a position it got
    // from B meanwhile misses nothing either.
    let a = Node::restart(killed).await;
    let mut back = a.ws("cl-fail", "").await.unwrap();
    let mid = &got[answered + 1];
    back.send(json!({"op":"sub","ch":"s","id":3,"since":mid["seq"],"epoch":epoch}))
        .await;
    let ack = back.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    let (s, v) = n[0]
        .publish("cl-fail", &key, json!({"ch":"s","data":{"i":published}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let mut tail = Vec::new();
    while tail
        .last()
        .is_none_or(|m: &Value| m["data"]["i"].as_u64() != Some(published))
    {
        let m = back.next().await;
        assert_ne!(m["op"], "gap", "no gap on the restarted node: {m}");
        if m["op"] == "msg" {
            tail.push(m);
        }
    }
    let want: Vec<u64> = (answered as u64 + 2..=published).collect();
    let is: Vec<u64> = tail
        .iter()
        .map(|m| m["data"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(is, want, "the restarted node caught up from its cursor");
    a.kill().await;
    reg.finish(n).await;
}

/// A loopback proxy to the registry that the test can cut and restore.
struct Cut {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    conns: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Cut {
    async fn new(target: SocketAddr) -> Cut {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let conns: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (o, c) = (open.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue;
                }
                c.lock().push(tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }));
            }
        });
        Cut { addr, open, conns }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self.conns.lock().drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// The registry connection of one node cut and restored: while cut the
/// node says so (`/readyz`, metrics) and keeps serving what it has; changes
/// made meanwhile through another node take effect once it is back.
#[tokio::test]
async fn a_cut_registry_connection_reconciles() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let b = reg.node("b").await;
    let target: SocketAddr = {
        let rest = reg.url.split_once('@').unwrap().1;
        let hostport = rest.split_once('/').unwrap().0;
        tokio::net::lookup_host(hostport)
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let proxy = Cut::new(target).await;
    let via_proxy = {
        let (scheme_user, rest) = reg.url.split_once('@').unwrap();
        let path = rest.split_once('/').unwrap().1;
        format!("{scheme_user}@{}/{path}", proxy.addr)
    };
    let a = reg.node_via("a", &via_proxy, &[]).await;
    let gone_key = create(&b, json!({"id":"cl-gone","access":"public"})).await;
    let kept_key = create(&b, json!({"id":"cl-kept","access":"public"})).await;
    for t in ["cl-gone", "cl-kept"] {
        within(PROPAGATION, "the tenants on A", || async {
            a.ws(t, "").await.is_ok()
        })
        .await;
    }
    let mut on_a = a.subscriber("cl-gone", "x").await;

    proxy.cut();
    within(
        Duration::from_secs(5),
        "A saying its registry is down",
        || async {
            let r = a.http.get(a.url("/readyz")).send().await.unwrap();
            let ok = r.status() == 200;
            let body: Value = r.json().await.unwrap_or(Value::Null);
            ok && body["registry"] == "unreachable"
        },
    )
    .await;
    assert_eq!(
        a.metric("herald_registry_up").await,
        0.0,
        "the metric says so too"
    );
    // Meanwhile, through B: one tenant deleted, the other's key rotated.
    assert_eq!(
        b.admin(Method::DELETE, "/admin/v1/tenants/cl-gone", json!({}))
            .await
            .0,
        204
    );
    let (s, _) = b
        .admin(
            Method::POST,
            "/admin/v1/tenants/cl-kept/publish-key",
            json!({}),
        )
        .await;
    assert_eq!(s, 200);
    // A keeps serving what it has while it cannot know better.
    assert!(a.ws("cl-kept", "").await.is_ok());
    on_a.send(json!({"op":"ping","id":9})).await;
    // (A `status` frame may come first: the tenant's log reader stalled.)
    next_op(&mut on_a, "pong", WAIT).await;

    proxy.restore();
    let took = within(Duration::from_secs(5), "A reconciled", || async {
        a.ws("cl-gone", "").await.err().map(|e| e.0) == Some(404)
    })
    .await;
    assert_eq!(on_a.closed().await.0, 4000, "its sessions closed");
    within(PROPAGATION, "the old key refused on A", || async {
        a.publish("cl-kept", &kept_key, json!({"ch":"x","data":1}))
            .await
            .0
            == 401
    })
    .await;
    let _ = (gone_key, took);
    within(
        Duration::from_secs(3),
        "A saying its registry is back",
        || async {
            let body: Value = a
                .http
                .get(a.url("/readyz"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap_or(Value::Null);
            body["registry"] == "ok"
        },
    )
    .await;
    reg.finish([a, b]).await;
}

/// A deploy: SIGTERM on A turns it not-ready at once while it still serves,
/// then its sessions close (1012) spread over the window, each client moves
/// to B with its `since`/`epoch` and misses nothing.
#[tokio::test]
async fn a_draining_node_lets_its_clients_go_gradually() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let a = reg
        .node_with("a", &["--drain-wait-secs", "1", "--drain-spread-secs", "2"])
        .await;
    let b = reg.node("b").await;
    let key = create(&b, json!({"id":"cl-drain","access":"public"})).await;
    within(PROPAGATION, "the tenant on A", || async {
        a.ws("cl-drain", "").await.is_ok()
    })
    .await;
    const CLIENTS: usize = 8;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut ws = a.ws("cl-drain", "").await.unwrap();
        let ack = ws.sub("d", 1).await;
        clients.push((ws, ack["epoch"].as_u64().unwrap()));
    }
    let publisher = Steady::start(&b, "cl-drain", &key, "d", Duration::from_millis(10));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = a.url("/readyz");
    let http = a.http.clone();
    let terminated = tokio::spawn(a.terminate());
    within(
        Duration::from_millis(500),
        "A not ready at once",
        || async {
            http.get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status() == 503)
        },
    )
    .await;
    let drained_at = Instant::now();
    // Each client reads until A closes it, then resumes on B.
    let mut tasks = Vec::new();
    for (mut ws, epoch) in clients {
        let b_port = b.port;
        tasks.push(tokio::spawn(async move {
            let mut got: Vec<Value> = Vec::new();
            let code = loop {
                match tokio::time::timeout(Duration::from_secs(10), ws.s.next()).await {
                    Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t)))) => {
                        let m: Value = serde_json::from_str(&t).unwrap();
                        if m["op"] == "msg" {
                            got.push(m);
                        }
                    }
                    Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(f))))) => {
                        break u16::from(f.code)
                    }
                    Ok(Some(Ok(_))) => {}
                    other => panic!("no close frame from the draining node: {other:?}"),
                }
            };
            let closed_after = drained_at.elapsed();
            let since = got.last().map_or(0, |m| m["seq"].as_u64().unwrap());
            let url = format!("ws://127.0.0.1:{b_port}/v1/t/cl-drain/ws");
            let (s, _) = tokio_tungstenite::connect_async(url).await.unwrap();
            let mut moved = Ws { s };
            moved
                .send(json!({"op":"sub","ch":"d","id":2,"since":since,"epoch":epoch}))
                .await;
            (code, closed_after, got, moved)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert!(terminated.await.unwrap().success(), "A exited cleanly");
    let published = publisher.stop().await;
    let mut closed: Vec<Duration> = results.iter().map(|r| r.1).collect();
    closed.sort();
    assert!(
        closed[0] >= Duration::from_millis(800),
        "nobody closed during the wait: {closed:?}"
    );
    assert!(
        closed[CLIENTS - 1] - closed[0] >= Duration::from_millis(1000),
        "closes spread over the window: {closed:?}"
    );
    for (code, _, mut got, mut moved) in results {
        assert_eq!(code, 1012, "a reconnect hint");
        catch_up(&mut moved, &mut got, published).await;
    }
    reg.finish([b]).await;
}

/// Several processes on one machine share a port (SO_REUSEPORT): the kernel
/// spreads connections over them, each a node of the cluster with its own
/// open-files limit and cores, and a publish reaches clients on all of them.
#[tokio::test]
async fn processes_share_a_port() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut procs = Vec::new();
    for id in ["p1", "p2"] {
        let args = [
            "--database-url",
            reg.url.as_str(),
            "--cluster",
            "--node-id",
            id,
            "--reuse-port",
        ];
        procs.push(Node::start_on(&reg.dir.path().join(id), &args, port).await);
    }
    let key = create(&procs[0], json!({"id":"cl-port","access":"public"})).await;
    // Whichever process a connection lands on, the tenant is there.
    within(PROPAGATION, "the tenant on both processes", || async {
        for _ in 0..12 {
            if procs[0].ws("cl-port", "").await.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    let mut clients = Vec::new();
    for _ in 0..24 {
        clients.push(procs[0].subscriber("cl-port", "p").await);
    }
    let (s, v) = procs[1]
        .publish("cl-port", &key, json!({"ch":"p","data":"hi"}))
        .await;
    assert_eq!(s, 200, "{v}");
    for ws in clients.iter_mut() {
        assert_eq!(msgs(ws, 1).await[0]["data"], "hi");
    }
    // The cluster view shows both processes holding some of the clients.
    within(
        Duration::from_secs(6),
        "connections on both processes",
        || async {
            let (_, view) = procs[0]
                .admin(Method::GET, "/admin/v1/nodes", json!({}))
                .await;
            let counts: Vec<i64> = view["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["connections"].as_i64())
                .collect();
            counts.len() == 2 && counts.iter().all(|&c| c > 0) && counts.iter().sum::<i64>() == 24
        },
    )
    .await;
    reg.finish(procs).await;
}

/// A node that starts reading a tenant after its first publishes (the
/// tenant was created and published to through another node a moment ago)
/// still delivers them: its history has them for a client resuming there.
#[tokio::test]
async fn a_node_new_to_a_tenant_reads_its_first_rows() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let a = reg.node("a").await;
    let key = create(&a, json!({"id":"cl-new","access":"public"})).await;
    let mut answered = Vec::new();
    for i in 0..5 {
        let (s, v) = a
            .publish("cl-new", &key, json!({"ch":"n","data":{"i":i}}))
            .await;
        assert_eq!(s, 200, "{v}");
        answered.push(v["seq"].clone());
    }
    let b = reg.node("b").await;
    let mut ws = b.ws("cl-new", "").await.unwrap();
    let start = Instant::now();
    for id in 1.. {
        ws.send(json!({"op":"sub","ch":"n","id":id,"since":0}))
            .await;
        let ack = ws.next().await;
        assert_eq!(ack["op"], "ack", "{ack}");
        let mut got = Vec::new();
        while let Ok(m) = tokio::time::timeout(Duration::from_millis(200), ws.next()).await {
            if m["op"] == "msg" {
                got.push(m["seq"].clone());
            }
        }
        if got == answered {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "B's history lacks the first rows: {got:?}, published {answered:?}"
        );
        ws.send(json!({"op":"unsub","ch":"n","id":1000 + id})).await;
        let _ = ws.next().await;
    }
    reg.finish([a, b]).await;
}

/// A Kafka tenant in a cluster: a publish through either node is produced
/// into the topic, and both nodes deliver it at the same position.
#[tokio::test]
async fn a_kafka_publish_has_one_seq_on_every_node() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic("cl-k", 1, 1).unwrap();
    let a = reg.node("a").await;
    let b = reg.node("b").await;
    let key = create(&a, json!({"id":"cl-kafka","access":"public"})).await;
    let source = json!({"kind":"kafka","brokers":kafka.bootstrap_servers(),"topics":["cl-k"]});
    let (s, v) = a
        .admin(Method::PUT, "/admin/v1/tenants/cl-kafka/source", source)
        .await;
    assert_eq!(s, 200, "{v}");
    for n in [&a, &b] {
        within(
            Duration::from_secs(5),
            "the Kafka source live on both",
            || async {
                let (_, v) = n
                    .admin(Method::GET, "/admin/v1/tenants/cl-kafka/source", json!({}))
                    .await;
                v["source"]["kind"] == "kafka" && v["health"]["state"] == "live"
            },
        )
        .await;
    }
    let mut subs = [
        a.subscriber("cl-kafka", "k").await,
        b.subscriber("cl-kafka", "k").await,
    ];
    let mut answered = Vec::new();
    for i in 0..6 {
        let via = if i % 2 == 0 { &a } else { &b };
        let (s, v) = via
            .publish("cl-kafka", &key, json!({"ch":"k","data":{"i":i}}))
            .await;
        assert_eq!(s, 200, "{v}");
        answered.push(v["seq"].clone());
    }
    for ws in subs.iter_mut() {
        let got = msgs(ws, 6).await;
        let seqs: Vec<Value> = got.iter().map(|m| m["seq"].clone()).collect();
        assert_eq!(seqs, answered, "the same positions on both nodes");
    }
    reg.finish([a, b]).await;
}

/// A change that sends no NOTIFY (written with the triggers off: a restore,
/// a replica promoted) is found by the periodic reconcile.
#[tokio::test]
async fn the_periodic_reconcile_finds_a_silent_change() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let a = reg.node("a").await;
    let key = create(&a, json!({"id":"cl-quiet","access":"public"})).await;
    create(&a, json!({"id":"cl-quiet2","access":"public"})).await;
    let db = sqlx::PgPool::connect(&reg.url).await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE tenants DISABLE TRIGGER herald_tenants_notify; \
         UPDATE tenants SET publish_key_sha256 = repeat('0', 64) WHERE id = 'cl-quiet'; \
         DELETE FROM tenants WHERE id = 'cl-quiet2'; \
         ALTER TABLE tenants ENABLE TRIGGER herald_tenants_notify;",
    )
    .execute(&db)
    .await
    .unwrap();
    // --reconcile-secs 1: within about a second both are applied.
    within(
        Duration::from_secs(4),
        "the silent changes applied",
        || async {
            a.publish("cl-quiet", &key, json!({"ch":"q","data":1}))
                .await
                .0
                == 401
                && a.ws("cl-quiet2", "").await.err().map(|e| e.0) == Some(404)
        },
    )
    .await;
    db.close().await;
    reg.finish([a]).await;
}

/// `--cluster-kafka`: an `http` tenant's publishes go through a Kafka topic
/// of its own instead of the registry's table, with one seq on every node.
/// (librdkafka's mock cluster does not take CreateTopics, so the topic is
/// made here as an operator would where Herald may not create topics.)
#[tokio::test]
async fn publishes_through_cluster_kafka_have_one_seq() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic("herald.publish.cl-ck", 1, 1).unwrap();
    let brokers = kafka.bootstrap_servers();
    let a = reg.node_with("a", &["--cluster-kafka", &brokers]).await;
    let b = reg.node_with("b", &["--cluster-kafka", &brokers]).await;
    let key = create(&a, json!({"id":"cl-ck","access":"public"})).await;
    for n in [&a, &b] {
        within(
            Duration::from_secs(5),
            "the publish topic read on both",
            || async {
                let (_, v) = n
                    .admin(Method::GET, "/admin/v1/tenants/cl-ck/source", json!({}))
                    .await;
                v["health"]["partitions"] == 1 && v["health"]["state"] == "live"
            },
        )
        .await;
    }
    let mut subs = [
        a.subscriber("cl-ck", "t").await,
        b.subscriber("cl-ck", "t").await,
    ];
    let mut answered = Vec::new();
    for i in 0..6 {
        let via = if i % 2 == 0 { &a } else { &b };
        let body = json!({"ch":"t","data":{"i":i},"key":format!("k{}", i % 2)});
        let (s, v) = via.publish("cl-ck", &key, body).await;
        assert_eq!(s, 200, "{v}");
        assert!(v.get("offset").is_some(), "went through Kafka: {v}");
        answered.push(v["seq"].clone());
    }
    for ws in subs.iter_mut() {
        let got = msgs(ws, 6).await;
        let seqs: Vec<Value> = got.iter().map(|m| m["seq"].clone()).collect();
        assert_eq!(seqs, answered, "the same positions on both nodes");
        let is: Vec<Value> = got.iter().map(|m| m["data"]["i"].clone()).collect();
        assert_eq!(is, (0..6).map(|i| json!(i)).collect::<Vec<_>>());
    }
    reg.finish([a, b]).await;
}
