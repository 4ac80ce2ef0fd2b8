//! Changing a tenant's outbox source: the cursor belongs to one database and
//! table (another database with a table of the same name starts fresh, and
//! coming back resumes), and a reader stuck on a query its database never
//! answers never outlives the change.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tokio::io::AsyncWriteExt;

/// `url` with its database replaced by `db` (created when missing).
async fn other_database(url: &str, db: &str) -> String {
    let (server, _) = url.rsplit_once('/').unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(db)
            .fetch_one(&pool)
            .await
            .unwrap();
    if !exists {
        // Another test binary may have created it in the meantime.
        let _ = sqlx::query(&format!("CREATE DATABASE \"{db}\""))
            .execute(&pool)
            .await;
    }
    pool.close().await;
    format!("{server}/{db}")
}

/// Waits until the health says the cursor is at row `id`.
async fn wait_position(h: &Host, tenant: &str, id: i64) {
    let mut hl = Value::Null;
    for _ in 0..100 {
        hl = health(h, tenant).await;
        if hl["position"]
            .as_str()
            .is_some_and(|p| p.ends_with(&format!(":{id}")))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cursor never reached row {id}: {hl}");
}

#[tokio::test]
async fn outbox_cursor_is_kept_per_database() {
    let Some(url_a) = pg_url() else { return };
    let db_a = url_a.rsplit_once('/').unwrap().1.to_string();
    let url_b = other_database(&url_a, &format!("{db_a}_other")).await;
    let (pool_a, table) = outbox_table(&url_a).await;
    let pool_b = outbox_table_named(&url_b, &table).await;
    // Database A's ids are far ahead of B's.
    sqlx::query(&format!(
        "SELECT setval(pg_get_serial_sequence('{table}', 'id'), 1000)"
    ))
    .execute(&pool_a)
    .await
    .unwrap();

    let h = spawn_host().await;
    h.public_tenant("ob-dbs").await;
    let mut ws = subscribed(&h, "ob-dbs", &url_a, &table, "a").await;
    ws.sub("b", 2).await;
    let a1 = insert(&pool_a, &table, "a", json!("a1")).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["data"], "a1");
    wait_position(&h, "ob-dbs", a1).await;

    // B's table has a row before the switch: a new source starts at the end.
    insert(&pool_b, &table, "b", json!("b before")).await;
    assert_eq!(set_source(&h, "ob-dbs", &url_b, &table).await.0, 200);
    wait_live(&h, "ob-dbs").await;
    insert(&pool_b, &table, "b", json!("b1")).await;
    insert(&pool_b, &table, "b", json!("b2")).await;
    let got = msgs(&mut ws, 2).await;
    let data: Vec<&Value> = got.iter().map(|m| &m["data"]).collect();
    assert_eq!(data, [&json!("b1"), &json!("b2")]);

    // Back to A: it resumes after a1, so a row written meanwhile arrives.
    let a2 = insert(&pool_a, &table, "a", json!("a2")).await;
    assert_eq!(set_source(&h, "ob-dbs", &url_a, &table).await.0, 200);
    assert_eq!(msgs(&mut ws, 1).await[0]["data"], "a2");
    wait_position(&h, "ob-dbs", a2).await;
    h.stop().await;
}

/// A TCP proxy to Postgres that counts the client connections still open
/// (a client that closes its side is gone, whatever the server still does).
struct CountingProxy {
    port: u16,
    open: Arc<AtomicUsize>,
    _task: AbortOnDrop,
}

impl CountingProxy {
    async fn start(upstream: std::net::SocketAddr) -> CountingProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicUsize::new(0));
        let task = {
            let open = open.clone();
            tokio::spawn(async move {
                let mut conns = Vec::new();
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        continue;
                    };
                    open.fetch_add(1, Ordering::SeqCst);
                    conns.push(AbortOnDrop(tokio::spawn(pump(
                        client,
                        server,
                        open.clone(),
                    ))));
                }
            })
        };
        CountingProxy {
            port,
            open,
            _task: AbortOnDrop(task),
        }
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// One proxied connection; `open` drops when the client closes its side.
async fn pump(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    open: Arc<AtomicUsize>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let back = AbortOnDrop(tokio::spawn(async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
    }));
    let _ = tokio::io::copy(&mut cr, &mut sw).await;
    open.fetch_sub(1, Ordering::SeqCst);
    let _ = sw.shutdown().await;
    drop(back);
}

/// Waits (bounded) until `cond` holds.
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The old reader waits on a query its database never answers (a lock
/// wait); a source change neither waits for it nor leaves it running. The old
/// source is a server of its own: the lock's transaction would hold back
/// every outbox of its server (transaction ids are server-wide).
#[tokio::test]
async fn source_change_never_leaves_a_stuck_reader_running() {
    let Some(url) = pg_url() else { return };
    let pg = own_cluster().await;
    let (stuck_pool, stuck_table) = outbox_table(&pg.url()).await;
    let (pool, new_table) = outbox_table(&url).await;
    let proxy = CountingProxy::start(([127, 0, 0, 1], pg.port).into()).await;
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port);

    let h = spawn_host().await;
    h.public_tenant("ob-stuck").await;
    assert_eq!(
        set_source(&h, "ob-stuck", &via_proxy, &stuck_table).await.0,
        200
    );
    wait_live(&h, "ob-stuck").await;
    let mut ws = h.ws("ob-stuck").await;
    // Each table on a channel of its own: both number their rows from 1.
    ws.sub("old", 1).await;
    ws.sub("new", 2).await;
    insert(&stuck_pool, &stuck_table, "old", json!("through the proxy")).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["data"], "through the proxy");

    // The table is locked: the reader's next query waits and never returns.
    let mut lock = stuck_pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {stuck_table} IN ACCESS EXCLUSIVE MODE"
    ))
    .execute(&mut *lock)
    .await
    .unwrap();
    let mut waiting = false;
    for _ in 0..150 {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(format!("%{stuck_table}%"))
        .fetch_one(&stuck_pool)
        .await
        .unwrap();
        if n > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waiting, "the reader's query waits on the lock");

    let asked = Instant::now();
    let (s, v) = set_source(&h, "ob-stuck", &url, &new_table).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "the source change waited {:?} for the stuck reader",
        asked.elapsed()
    );
    wait_live(&h, "ob-stuck").await;
    insert(&pool, &new_table, "new", json!("new source")).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["data"], "new source");

    // The old reader is gone while its query would still be waiting: every
    // connection it had is closed ...
    until(
        Duration::from_secs(3),
        "the old reader's connections closed",
        || proxy.open() == 0,
    )
    .await;
    // ... and when the lock goes, a row in its table is not delivered.
    sqlx::query(&format!(
        "INSERT INTO {stuck_table} (channel, payload) VALUES ('old', '\"old source\"')"
    ))
    .execute(&mut *lock)
    .await
    .unwrap();
    lock.commit().await.unwrap();
    insert(&pool, &new_table, "new", json!("new source 2")).await;
    let mut got = msgs(&mut ws, 1).await;
    got.extend(msgs_within(&mut ws, Duration::from_millis(1000)).await);
    let data: Vec<&Value> = got.iter().map(|m| &m["data"]).collect();
    assert_eq!(data, [&json!("new source 2")]);
    assert_eq!(proxy.open(), 0, "no reconnect to the old source");
    h.stop().await;
    stuck_pool.close().await;
    drop(pg);
}
