//! The postgres_outbox source against the throwaway Postgres the test script
//! starts: committed and rolled-back transactions, restart without loss or
//! duplicates, and a database outage that subscribers see as stalled/live.
//! Transaction visibility is in `visibility`, source changes in `switching`.

mod switching;
mod visibility;

use crate::helpers::*;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The `seq` of a row's first message (ARCHITECTURE.md, "Positions").
pub(crate) fn seq(id: i64) -> i64 {
    id * 1000
}

pub(crate) fn pg_url() -> Option<String> {
    match std::env::var("HERALD_TEST_POSTGRES_URL") {
        Ok(u) => Some(u),
        Err(_) => {
            assert!(
                std::env::var("HERALD_REQUIRE_POSTGRES").is_err(),
                "Postgres required but not configured"
            );
            eprintln!("skipping: HERALD_TEST_POSTGRES_URL not set");
            None
        }
    }
}

/// Creates an outbox table from the shipped migration, under its own name.
pub(crate) async fn outbox_table(url: &str) -> (PgPool, String) {
    let name = format!("ob_{}", rand::random::<u32>());
    (outbox_table_named(url, &name).await, name)
}

/// The shipped outbox table as `name` in the database at `url`.
async fn outbox_table_named(url: &str, name: &str) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap();
    let sql = include_str!("../../../migrations/outbox/herald_outbox.sql")
        .replace("herald_outbox", name)
        .replace(&format!("pg_notify('{name}'"), "pg_notify('herald_outbox'");
    sqlx::raw_sql(&sql).execute(&pool).await.unwrap();
    pool
}

/// `url` with a password in it (the test cluster trusts every login, so
/// any password connects).
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, host) = rest.split_once('@').unwrap();
    let user = user.split(':').next().unwrap();
    format!("{scheme}://{user}:{password}@{host}")
}

/// The tenant's source health, as the admin API shows it.
async fn health(h: &Host, tenant: &str) -> Value {
    h.admin(
        Method::GET,
        &format!("/admin/v1/tenants/{tenant}/source"),
        None,
    )
    .await
    .1["health"]
        .clone()
}

/// `msg` frames that arrive within `window` (other frames are skipped).
async fn msgs_within(ws: &mut Ws, window: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(m) = tokio::time::timeout_at(deadline, ws.next()).await {
        if m["op"] == "msg" {
            out.push(m);
        }
    }
    out
}

async fn insert(pool: &PgPool, table: &str, channel: &str, payload: Value) -> i64 {
    sqlx::query_scalar(&format!(
        "INSERT INTO {table} (channel, payload) VALUES ($1, $2::jsonb) RETURNING id"
    ))
    .bind(channel)
    .bind(payload.to_string())
    .fetch_one(pool)
    .await
    .unwrap()
}

pub(crate) async fn set_source(h: &Host, tenant: &str, url: &str, table: &str) -> (u16, Value) {
    let body = json!({"kind":"postgres_outbox","database_url":url,"table":table,"poll_ms":200});
    h.admin(
        Method::PUT,
        &format!("/admin/v1/tenants/{tenant}/source"),
        Some(body),
    )
    .await
}

/// Points `tenant` at the outbox `table`, waits until it is live, and
/// subscribes a client to `ch`.
pub(crate) async fn subscribed(h: &Host, tenant: &str, url: &str, table: &str, ch: &str) -> Ws {
    let (s, v) = set_source(h, tenant, url, table).await;
    assert_eq!(s, 200, "{v}");
    wait_live(h, tenant).await;
    let mut ws = h.ws(tenant).await;
    ws.sub(ch, 1).await;
    ws
}

/// Waits until the tenant's source reports live; returns its view.
pub(crate) async fn wait_live(h: &Host, tenant: &str) -> Value {
    wait_source(
        h,
        tenant,
        |h| h["state"] == "live",
        "source never became live",
    )
    .await
}

/// Waits until the tenant's source health satisfies `done`; returns the
/// source's view.
pub(crate) async fn wait_source(
    h: &Host,
    tenant: &str,
    done: impl Fn(&Value) -> bool,
    what: &str,
) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, v) = h
            .admin(
                Method::GET,
                &format!("/admin/v1/tenants/{tenant}/source"),
                None,
            )
            .await;
        if done(&v["health"]) {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Messages until `n` `msg` frames arrived; returns them (status frames kept apart).
pub(crate) async fn msgs(ws: &mut Ws, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    while out.len() < n {
        let m = ws.next().await;
        if m["op"] == "msg" {
            out.push(m);
        }
    }
    out
}

#[tokio::test]
async fn outbox_delivers_committed_rows_in_order() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("ob").await;

    // Bad configurations are refused with the reason.
    let (s, v) = set_source(&h, "ob", &url, "no_such_table").await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no_such_table"),
        "{v}"
    );
    let (s, v) = set_source(&h, "ob", "postgres://postgres@127.0.0.1:1/x", &table).await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("connect"),
        "{v}"
    );
    let (s, v) = set_source(&h, "ob", &url, "x; DROP TABLE y").await;
    assert_eq!(s, 400, "{v}");

    // The password never comes back, neither in the answer nor in GET.
    let secret = with_password(&url, "s3cret-pw");
    let (s, v) = set_source(&h, "ob", &secret, &table).await;
    assert_eq!(s, 200, "{v}");
    let shown = health(&h, "ob").await;
    for answer in [
        &v,
        &h.admin(Method::GET, "/admin/v1/tenants/ob/source", None)
            .await
            .1,
    ] {
        let shown_url = answer["source"]["database_url"].as_str().unwrap();
        assert_eq!(shown_url, with_password(&url, "***"), "{answer}");
        assert!(!answer.to_string().contains("s3cret-pw"), "{answer}");
    }
    assert!(!shown.to_string().contains("s3cret-pw"), "{shown}");
    wait_live(&h, "ob").await;
    let mut ws = h.ws("ob").await;
    ws.sub("orders", 1).await;

    let mut tx = pool.begin().await.unwrap();
    for i in 1..=3 {
        sqlx::query(&format!(
            "INSERT INTO {table} (channel, key, payload) VALUES ('orders', 'k', $1::jsonb)"
        ))
        .bind(json!({"n": i}).to_string())
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (channel, payload) VALUES ('orders', '{{\"n\":\"rolled back\"}}')"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    insert(&pool, &table, "bad channel name", json!({"n": "bad"})).await;
    sqlx::query(&format!("INSERT INTO {table} (channel, payload_bytes, headers) VALUES ('orders', $1, '{{\"h\":\"v\"}}')"))
        .bind(vec![0u8, 255, 10])
        .execute(&pool)
        .await
        .unwrap();
    let last = insert(&pool, &table, "orders", json!({"n": 5})).await;

    let got = msgs(&mut ws, 5).await;
    let data: Vec<Value> = got.iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data[..3], [json!({"n":1}), json!({"n":2}), json!({"n":3})]);
    assert_eq!(
        (data[3].as_str(), got[3]["enc"].as_str()),
        (Some("AP8K"), Some("base64"))
    );
    assert_eq!(data[4], json!({"n":5}));
    // seq is the outbox id × 1000; prev links each message to the one before.
    let seqs: Vec<i64> = got.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(*seqs.last().unwrap(), seq(last));
    for w in got.windows(2) {
        assert_eq!(w[1]["prev"], w[0]["seq"]);
    }
    assert!(
        h.metric("herald_plugin_dead_letters_total{tenant=\"ob\",kind=\"bad_record\"}")
            .await
            >= 1.0
    );
    // The health's position is the cursor, `xid:id` of the last row.
    let at_last = |h: &Value| {
        h["position"]
            .as_str()
            .is_some_and(|p| p.ends_with(&format!(":{last}")))
            && h["lag"] == 0
    };
    let mut health = Value::Null;
    for _ in 0..40 {
        health = h
            .admin(Method::GET, "/admin/v1/tenants/ob/source", None)
            .await
            .1["health"]
            .clone();
        if at_last(&health) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(at_last(&health), "{health}");
    // Back to HTTP: the outbox reader stops, nothing else changes.
    let (s, _) = h
        .admin(
            Method::PUT,
            "/admin/v1/tenants/ob/source",
            Some(json!({"kind":"http"})),
        )
        .await;
    assert_eq!(s, 200);
    insert(&pool, &table, "orders", json!({"n": "after switch"})).await;
    ws.send(json!({"op":"ping","id":9})).await;
    // The switch told the subscriber its channel's new epoch (an `ack`
    // without an id); after that, no outbox row.
    let mut f = ws.next().await;
    if f["op"] == "ack" && f["id"].is_null() {
        f = ws.next().await;
    }
    assert_eq!(
        f["op"], "pong",
        "no outbox row after switching to http: {f}"
    );
    // A reader that kept running would deliver the row within its poll
    // interval (200 ms here) even without a NOTIFY: nothing may come in 2 s.
    let quiet = tokio::time::timeout(Duration::from_secs(2), ws.next()).await;
    assert!(
        quiet.is_err(),
        "a frame after switching to http: {:?}",
        quiet.ok()
    );
    h.stop().await;
}

#[tokio::test]
async fn outbox_resumes_after_restart_without_loss_or_duplicates() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("ob").await;
    let mut ws = subscribed(&h, "ob", &url, &table, "c").await;
    let a = insert(&pool, &table, "c", json!(1)).await;
    let b = insert(&pool, &table, "c", json!(2)).await;
    let got = msgs(&mut ws, 2).await;
    assert_eq!(
        (got[0]["seq"].as_i64(), got[1]["seq"].as_i64()),
        (Some(seq(a)), Some(seq(b)))
    );
    drop(ws);
    let h2 = {
        let dir = h.data_dir.clone();
        let stopped = h.stop().await;
        // Written while no Herald runs.
        let mut ids = Vec::new();
        for i in 3..=5 {
            ids.push(insert(&pool, &table, "c", json!(i)).await);
        }
        let mut opts = HostOptions::new();
        opts.config.data_dir = dir;
        opts.dir = stopped;
        (spawn_with(opts).await, ids)
    };
    let (h, ids) = h2;
    let mut ws = h.ws("ob").await;
    // Resume after the last position seen: the rows written while down
    // arrive (from history or live), each once.
    ws.send(json!({"op":"sub","ch":"c","since":seq(b),"id":1}))
        .await;
    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        let m = ws.next().await;
        if m["op"] == "msg" {
            seqs.push(m["seq"].as_i64().unwrap());
        }
    }
    assert_eq!(seqs, ids.iter().map(|&i| seq(i)).collect::<Vec<_>>());
    let after = insert(&pool, &table, "c", json!(6)).await;
    let m = msgs(&mut ws, 1).await;
    assert_eq!(
        (m[0]["seq"].as_i64(), m[0]["prev"].as_i64()),
        (Some(seq(after)), Some(seq(ids[2])))
    );
    h.stop().await;
}

/// A TCP proxy to Postgres that the test can cut and restore.
struct Proxy {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(port: u16, upstream: std::net::SocketAddr) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let conns = Arc::new(parking_lot::Mutex::new(Vec::new()));
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let c = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                conns.lock().push(AbortOnDrop(c));
            }
        });
        Proxy { port, task }
    }

    fn cut(self) -> u16 {
        self.task.abort();
        self.port
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[tokio::test]
async fn outbox_outage_is_pushed_as_stalled_then_live() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let u = url.strip_prefix("postgres://").unwrap();
    let (creds, rest) = u.split_once('@').unwrap();
    let (hostport, db) = rest.split_once('/').unwrap();
    let upstream: std::net::SocketAddr = hostport.parse().unwrap();
    let proxy = Proxy::start(0, upstream).await;
    let via_proxy = format!("postgres://{creds}@127.0.0.1:{}/{db}", proxy.port);

    let h = spawn_host().await;
    h.public_tenant("ob").await;
    let mut ws = subscribed(&h, "ob", &via_proxy, &table, "c").await;
    let first = insert(&pool, &table, "c", json!("before")).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["seq"].as_i64(), Some(seq(first)));

    let port = proxy.cut();
    let stalled = next_op(&mut ws, "status", Duration::from_secs(3)).await;
    assert_eq!(
        (stalled["source"].as_str(), stalled["state"].as_str()),
        (Some("postgres_outbox"), Some("stalled"))
    );
    // A client that connects during the outage is told at once.
    let mut late = h.ws("ob").await;
    assert_eq!(late.next().await["state"], "stalled");
    let during: Vec<i64> = vec![
        insert(&pool, &table, "c", json!("during 1")).await,
        insert(&pool, &table, "c", json!("during 2")).await,
    ];
    tokio::time::sleep(Duration::from_millis(500)).await;

    let _proxy = Proxy::start(port, upstream).await;
    let live = next_op(&mut ws, "status", Duration::from_secs(4)).await;
    assert_eq!(live["state"], "live");
    let after = insert(&pool, &table, "c", json!("after")).await;
    let got = msgs(&mut ws, 3).await;
    let seqs: Vec<i64> = got.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [seq(during[0]), seq(during[1]), seq(after)]);
    assert_eq!(
        got[0]["prev"].as_i64(),
        Some(seq(first)),
        "no gap across the outage"
    );
    h.stop().await;
}

/// A Postgres cluster of this test's own (initdb as the postgres user, as the
/// test script does), so it can be stopped and started without disturbing
/// the other tests. Stopped and removed on drop.
struct OwnCluster {
    dir: tempfile::TempDir,
    port: u16,
    bin: std::path::PathBuf,
}

impl OwnCluster {
    fn run(&self, tool: &str, args: &[&str]) -> bool {
        std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(tool))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn start() -> OwnCluster {
        let bin = pg_bin();
        let dir = tempfile::tempdir().unwrap();
        assert!(std::process::Command::new("chown")
            .arg("postgres")
            .arg(dir.path())
            .status()
            .unwrap()
            .success());
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let c = OwnCluster { dir, port, bin };
        let data = c.dir.path().join("data");
        assert!(
            c.run(
                "initdb",
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "-A",
                    "trust",
                    "-U",
                    "postgres"
                ]
            ),
            "initdb"
        );
        assert!(c.pg_ctl("start"), "pg_ctl start");
        c
    }

    fn pg_ctl(&self, action: &str) -> bool {
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("log");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let mut args = vec![
            "-D",
            data.to_str().unwrap(),
            "-l",
            log.to_str().unwrap(),
            "-w",
            "-m",
            "fast",
        ];
        if action == "start" {
            args.extend(["-o", &opts]);
        }
        args.push(action);
        self.run("pg_ctl", &args)
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// The PostgreSQL binaries: `PG_BIN` (scripts/test.sh exports the ones it
/// started the test cluster with), else the newest installed version.
fn pg_bin() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("PG_BIN") {
        return bin.into();
    }
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .expect("PG_BIN is not set and no PostgreSQL is installed under /usr/lib/postgresql")
}

/// [`OwnCluster::start`] off the runtime.
async fn own_cluster() -> OwnCluster {
    tokio::task::spawn_blocking(OwnCluster::start)
        .await
        .unwrap()
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        self.pg_ctl("stop");
    }
}

/// A real Postgres restart: stalled while it is down, live when it is back,
/// and no row lost across it.
#[tokio::test]
async fn outbox_postgres_restart_is_pushed_as_stalled_then_live() {
    if pg_url().is_none() {
        return;
    }
    let pg = own_cluster().await;
    let url = pg.url();
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("ob").await;
    let mut ws = subscribed(&h, "ob", &url, &table, "c").await;
    let first = insert(&pool, &table, "c", json!("before")).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["seq"].as_i64(), Some(seq(first)));
    pool.close().await;

    let pg = tokio::task::spawn_blocking(move || {
        assert!(pg.pg_ctl("stop"), "pg_ctl stop");
        pg
    })
    .await
    .unwrap();
    let stalled = next_op(&mut ws, "status", Duration::from_secs(3)).await;
    assert_eq!(stalled["state"], "stalled");
    let pg = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(2));
        assert!(pg.pg_ctl("start"), "pg_ctl start");
        pg
    })
    .await
    .unwrap();
    let live = next_op(&mut ws, "status", Duration::from_secs(4)).await;
    assert_eq!(live["state"], "live");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let after = insert(&pool, &table, "c", json!("after")).await;
    let m = msgs(&mut ws, 1).await;
    assert_eq!(
        (m[0]["seq"].as_i64(), m[0]["prev"].as_i64()),
        (Some(seq(after)), Some(seq(first)))
    );
    pool.close().await;
    h.stop().await;
    drop(pg);
}
