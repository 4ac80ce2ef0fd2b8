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

mod admin;
mod claims;
mod delivery;
mod failover;

/// What the README's "admin changes reach every node within milliseconds"
/// is held to: a second. [`within`] checks it against when its probes began,
/// so a loaded test machine's slow probes do not count against it.
const PROPAGATION: Duration = Duration::from_secs(1);

/// A fresh registry database on the test server and a directory for the
/// nodes' data; `finish` kills the nodes and drops the database. One cluster
/// test runs at a time (the nextest group `cluster`, .config/nextest.toml):
/// each runs two or three debug-build servers, and several at once on two
/// cores made delivery within the tests' deadlines a matter of luck.
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

    /// A proxy to the registry the test can cut and restore, and the
    /// registry's URL through it.
    async fn cut_proxy(&self) -> (admin::Cut, String) {
        let target: SocketAddr = {
            let rest = self.url.split_once('@').unwrap().1;
            let hostport = rest.split_once('/').unwrap().0;
            tokio::net::lookup_host(hostport)
                .await
                .unwrap()
                .next()
                .unwrap()
        };
        let proxy = admin::Cut::new(target).await;
        let (scheme_user, rest) = self.url.split_once('@').unwrap();
        let path = rest.split_once('/').unwrap().1;
        let via = format!("{scheme_user}@{}/{path}", proxy.addr);
        (proxy, via)
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

/// Polls `probe` until it holds; panics with `what` when a probe that began
/// `within` or later after the call still failed. What is checked is the
/// feature (the change was still missing at that instant), not the machine:
/// a probe that began in time and was slow to answer is not held against it.
async fn within<F, Fut>(within: Duration, what: &str, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        let began = start.elapsed();
        if probe().await {
            return start.elapsed();
        }
        assert!(
            began < within,
            "{what} not within {within:?}: a probe begun {began:?} after the change still failed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A public tenant made through `a`, once `b` serves it too; its key.
async fn served_by_both(a: &Node, b: &Node, id: &str) -> String {
    let key = create(a, json!({"id":id,"access":"public"})).await;
    within(PROPAGATION, "the tenant on b", || async {
        b.ws(id, "").await.is_ok()
    })
    .await;
    key
}

async fn create(n: &Node, body: Value) -> String {
    let (s, v) = n.admin(Method::POST, "/admin/v1/tenants", body).await;
    assert_eq!(s, 201, "{v}");
    v["publish_key"].as_str().unwrap().to_string()
}
