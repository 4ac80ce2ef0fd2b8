//! Outbox delivery decided by transaction visibility: a transaction that holds
//! its id for seconds is delivered in order (lag, never loss), a rollback holds
//! nothing back once it is over, a table without the `xid` column is refused
//! with the statement that fixes it, and a cursor stored by an older Herald
//! (a bare id) resumes after that id.

use super::*;
use herald::registry::Registry;
use std::time::Instant;

fn data(ms: &[Value]) -> Vec<Value> {
    ms.iter().map(|m| m["data"].clone()).collect()
}

/// Takes transaction ids until the next one ends in 9s (…999), so the ones
/// after it gain a digit.
async fn burn_xids_to_boundary(pool: &PgPool) {
    for _ in 0..20_000 {
        let x: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
            .fetch_one(pool)
            .await
            .unwrap();
        if 10i64.pow(x.to_string().len() as u32) - x == 2 {
            return;
        }
    }
    panic!("no digit boundary within 20,000 transaction ids");
}

#[tokio::test]
async fn outbox_delivers_a_slow_transaction_first_and_shows_it_as_lag() {
    if pg_url().is_none() {
        return;
    }
    // A server of its own: an open transaction holds back every outbox of
    // its server, the other tests' included.
    let pg = own_cluster().await;
    let url = pg.url();
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("ob-slow").await;
    let mut ws = subscribed(&h, "ob-slow", &url, &table, "c").await;

    // Transaction ids cross a digit boundary here (…999 → …1000): the order
    // is numeric, never textual.
    burn_xids_to_boundary(&pool).await;
    // The slow transaction takes its id (and xid) first and commits 5 s later;
    // three other transactions insert and commit after it meanwhile.
    let mut slow = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (channel, payload) VALUES ('c', '\"slow\"')"
    ))
    .execute(&mut *slow)
    .await
    .unwrap();
    for i in 0..3 {
        insert(&pool, &table, "c", json!(format!("after {i}"))).await;
    }
    let open_until = Instant::now() + Duration::from_secs(5);
    let mut early = Vec::new();
    let mut lag_seen = None;
    while Instant::now() < open_until {
        let hl = health(&h, "ob-slow").await;
        if hl["lag"] == 3 && hl["held_back"] == 3 && hl["oldest_open_xact_ms"].as_u64() > Some(0) {
            lag_seen = Some(hl);
        }
        early.extend(msgs_within(&mut ws, Duration::from_millis(200)).await);
    }
    slow.commit().await.unwrap();

    assert_eq!(
        data(&early),
        Vec::<Value>::new(),
        "nothing may pass the open transaction"
    );
    let got = msgs(&mut ws, 4).await;
    assert_eq!(
        data(&got),
        [
            json!("slow"),
            json!("after 0"),
            json!("after 1"),
            json!("after 2")
        ]
    );
    for w in got.windows(2) {
        assert_eq!(w[1]["prev"], w[0]["seq"], "no gap between them");
    }
    let lag_seen =
        lag_seen.expect("health showed the held rows as lag while the transaction was open");
    assert!(
        lag_seen["oldest_open_xact_ms"].as_u64().unwrap() < 10_000,
        "{lag_seen}"
    );
    // Caught up: no lag, nothing held.
    let mut hl = Value::Null;
    for _ in 0..40 {
        hl = health(&h, "ob-slow").await;
        if hl["lag"] == 0 && hl["held_back"] == 0 && hl["state"] == "live" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (&hl["lag"], &hl["held_back"], &hl["state"]),
        (&json!(0), &json!(0), &json!("live")),
        "{hl}"
    );
    assert!(hl["oldest_open_xact_ms"].is_null(), "{hl}");
    h.stop().await;
    pool.close().await;
    drop(pg);
}

#[tokio::test]
async fn outbox_rollback_holds_nothing_back_once_it_is_over() {
    if pg_url().is_none() {
        return;
    }
    // A server of its own: an open transaction holds back every outbox of
    // its server, the other tests' included.
    let pg = own_cluster().await;
    let url = pg.url();
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("ob-rb").await;
    let mut ws = subscribed(&h, "ob-rb", &url, &table, "c").await;

    let mut doomed = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (channel, payload) VALUES ('c', '\"rolled back\"')"
    ))
    .execute(&mut *doomed)
    .await
    .unwrap();
    insert(&pool, &table, "c", json!("later")).await;
    // The reader has seen the committed row and holds it behind the open one.
    let mut held = false;
    for _ in 0..100 {
        if health(&h, "ob-rb").await["held_back"] == 1 {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        held,
        "the committed row is held back while the other transaction is open"
    );
    assert_eq!(
        data(&msgs_within(&mut ws, Duration::from_millis(300)).await),
        Vec::<Value>::new()
    );
    doomed.rollback().await.unwrap();
    // No NOTIFY comes from a rollback: the reader re-checks on its own.
    let rolled_back = Instant::now();
    let got = msgs(&mut ws, 1).await;
    assert_eq!(data(&got), [json!("later")]);
    assert!(
        rolled_back.elapsed() < Duration::from_secs(2),
        "delivered {:?} after the rollback",
        rolled_back.elapsed()
    );
    h.stop().await;
    pool.close().await;
    drop(pg);
}

#[tokio::test]
async fn outbox_refuses_a_table_without_the_xid_column() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    sqlx::query(&format!("ALTER TABLE {table} DROP COLUMN xid"))
        .execute(&pool)
        .await
        .unwrap();
    let h = spawn_host().await;
    h.public_tenant("ob-noxid").await;
    let (s, v) = set_source(&h, "ob-noxid", &url, &table).await;
    assert_eq!(s, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!(
            "ALTER TABLE {table} ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id()"
        )),
        "{msg}"
    );
    // A column of that name but the wrong kind is refused too.
    sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN xid bigint"))
        .execute(&pool)
        .await
        .unwrap();
    let (s, v) = set_source(&h, "ob-noxid", &url, &table).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("xid8"),
        "{v}"
    );
    h.stop().await;
}

/// A node upgraded from a Herald that kept a bare id as its cursor (under the
/// table name alone) resumes after that id: the rows above it are delivered,
/// the ones at or below it are not, and new rows follow.
#[tokio::test]
async fn outbox_resumes_a_cursor_stored_as_a_bare_id() {
    let Some(url) = pg_url() else { return };
    // The table as an older Herald shipped it, upgraded with the statement
    // `check()` names: every existing row gets the same xid.
    let (pool, table) = outbox_table(&url).await;
    sqlx::query(&format!("ALTER TABLE {table} DROP COLUMN xid"))
        .execute(&pool)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 1..=5 {
        ids.push(insert(&pool, &table, "c", json!(i)).await);
    }
    sqlx::query(&format!(
        "ALTER TABLE {table} ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id()"
    ))
    .execute(&pool)
    .await
    .unwrap();

    let h = spawn_host().await;
    h.public_tenant("ob-legacy").await;
    let dir = h.data_dir.clone();
    let node = {
        let stopped = h.stop().await;
        let reg = Registry::open(None, &dir).await.unwrap();
        let source =
            json!({"kind":"postgres_outbox","database_url":url,"table":table,"poll_ms":200});
        reg.set_source("ob-legacy", &source).await.unwrap();
        let node = herald::config::Config::for_data_dir(&dir).node_id;
        reg.put_cursor(
            "ob-legacy",
            &node,
            &format!("outbox:{table}"),
            &ids[2].to_string(),
        )
        .await
        .unwrap();
        reg.close().await;
        stopped
    };
    let mut opts = HostOptions::new();
    opts.config.data_dir = dir;
    opts.dir = node;
    let h = spawn_with(opts).await;
    let mut ws = h.ws("ob-legacy").await;
    // Rows 4 and 5 may already be in history: replay everything there is.
    ws.send(json!({"op":"sub","ch":"c","since":0,"id":1})).await;
    let got = msgs(&mut ws, 2).await;
    assert_eq!(data(&got), [json!(4), json!(5)]);
    insert(&pool, &table, "c", json!(6)).await;
    assert_eq!(data(&msgs(&mut ws, 1).await), [json!(6)]);
    // Resumed, then moved on to the new format: a restart repeats nothing.
    // (A repeat at start would sit in the new hub's history: replay it all.)
    let h = h.restart().await;
    let mut ws = h.ws("ob-legacy").await;
    ws.send(json!({"op":"sub","ch":"c","since":0,"id":1})).await;
    insert(&pool, &table, "c", json!(7)).await;
    assert_eq!(data(&msgs(&mut ws, 1).await), [json!(7)]);
    h.stop().await;
}

/// Delivery follows transactions, so ids can go down: a transaction that
/// took its xid first (a business write) but inserted its outbox row last
/// comes before a younger transaction's lower id. Both are delivered.
#[tokio::test]
async fn outbox_delivers_rows_whose_id_order_and_transaction_order_differ() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("ob-order").await;
    let mut ws = subscribed(&h, "ob-order", &url, &table, "c").await;

    let mut older = pool.begin().await.unwrap();
    let _: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut *older)
        .await
        .unwrap();
    let low_id = insert(&pool, &table, "c", json!("younger transaction")).await;
    let high_id: i64 = sqlx::query_scalar(&format!(
        "INSERT INTO {table} (channel, payload) VALUES ('c', '\"older transaction\"') RETURNING id"
    ))
    .fetch_one(&mut *older)
    .await
    .unwrap();
    older.commit().await.unwrap();
    assert!(low_id < high_id);

    let got = tokio::time::timeout(Duration::from_secs(3), msgs(&mut ws, 2)).await;
    assert_eq!(
        h.metric("herald_source_duplicates_total{tenant=\"ob-order\"}")
            .await,
        0.0,
        "a row taken for a duplicate"
    );
    let got = got.expect("both rows delivered");
    assert_eq!(
        data(&got),
        [json!("older transaction"), json!("younger transaction")]
    );
    assert_eq!(got[1]["prev"], got[0]["seq"], "no gap between them");
    h.stop().await;
}
