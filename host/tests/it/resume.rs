//! Resumes tried as a user would (ARCHITECTURE.md, "Positions"): a client
//! that saw position S of a channel, left, and comes back with `since: S`
//! after the node restarted, forgot the channel, or is another node, gets
//! every message it missed or a `gap` that names it — never silence.
//!
//! The oracle is the promise: every position published after S is either
//! among the client's `msg` frames or inside one of its `gap` frames, the
//! frames' `seq` increase, and nothing at or below S comes again.

use crate::helpers::*;
use crate::outbox::{outbox_table, pg_url, seq, set_source, wait_live, wait_source};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;

async fn insert(pool: &PgPool, table: &str, channel: &str, n: u64) -> i64 {
    sqlx::query_scalar(&format!(
        "INSERT INTO {table} (channel, payload) VALUES ($1, $2::jsonb) RETURNING id"
    ))
    .bind(channel)
    .bind(json!({ "n": n }).to_string())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Frames after a resume, up to and including the `msg` at `until`.
async fn frames_until(ws: &mut Ws, until: i64) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let f = ws.next().await;
        let done = f["op"] == "msg" && f["seq"].as_i64() == Some(until);
        out.push(f);
        if done {
            return out;
        }
    }
}

/// Checks the promise over `frames` for a client that had `since` and must
/// account for every position in `missed`.
fn assert_accounted(frames: &[Value], since: i64, missed: &[i64]) {
    let mut last = since;
    let mut gaps: Vec<(i64, i64)> = Vec::new();
    let mut got = Vec::new();
    for f in frames {
        match f["op"].as_str() {
            Some("gap") => {
                let (from, to) = (f["from"].as_i64().unwrap(), f["to"].as_i64().unwrap());
                assert!(from <= last + 1 && to >= from, "gap {f} after {last}");
                gaps.push((from, to));
                last = last.max(to);
            }
            Some("msg") => {
                let s = f["seq"].as_i64().unwrap();
                assert!(s > last, "seq {s} after {last}: {frames:?}");
                assert!(
                    f["prev"].as_i64().unwrap() <= last,
                    "a hole the client cannot see: {f} after {last}"
                );
                got.push(s);
                last = s;
            }
            _ => {}
        }
    }
    for m in missed {
        assert!(
            got.contains(m) || gaps.iter().any(|(a, b)| a <= m && m <= b),
            "position {m} was neither sent nor reported as a gap: {frames:?}"
        );
    }
}

/// Waits until the tenant's reader has read `records` rows in all.
async fn read(h: &Host, tenant: &str, records: u64) {
    let done = |health: &Value| health["records"].as_u64() >= Some(records);
    wait_source(h, tenant, done, "rows never read").await;
}

/// A host with a public `tenant` (created with `body`'s other fields) that
/// reads a fresh outbox table, live; `None` without a test Postgres.
async fn outbox_tenant(tenant: &str, body: Value) -> Option<(PgPool, String, Host)> {
    let url = pg_url()?;
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    let mut body = body;
    body["id"] = json!(tenant);
    body["access"] = json!("public");
    h.tenant(body).await;
    assert_eq!(set_source(&h, tenant, &url, &table).await.0, 200);
    wait_live(&h, tenant).await;
    Some((pool, table, h))
}

/// A client of `tenant` (reading the outbox `table`) that saw one row of
/// `c`: its epoch, the position it saw, and its socket.
async fn saw_one(h: &Host, pool: &PgPool, table: &str, tenant: &str) -> (Value, i64, Ws) {
    let mut ws = h.ws(tenant).await;
    let epoch = ws.sub("c", 1).await["epoch"].clone();
    let first = seq(insert(pool, table, "c", 0).await);
    let m = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(m["seq"].as_i64(), Some(first));
    (epoch, first, ws)
}

/// Three more rows of `c`, read by the tenant's reader: their positions.
async fn three_more(h: &Host, pool: &PgPool, table: &str, tenant: &str) -> Vec<i64> {
    let mut missed = Vec::new();
    for n in 1..=3 {
        missed.push(seq(insert(pool, table, "c", n).await));
    }
    read(h, tenant, 4).await;
    missed
}

/// Resumes `c` on `ws` from `since`; then, up to a new row, checks that
/// every position in `missed` was sent or reported.
async fn resume_accounts_for(
    ws: &mut Ws,
    (pool, table): (&PgPool, &str),
    (epoch, since): (&Value, i64),
    missed: &[i64],
) {
    ws.send(json!({"op":"sub","ch":"c","id":9,"since":since,"epoch":epoch}))
        .await;
    let ack = ws.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    let marker = seq(insert(pool, table, "c", 4).await);
    let frames = frames_until(ws, marker).await;
    assert_accounted(&frames, since, missed);
}

/// A client saw S and left; three rows came and were read; the node
/// restarted (its history is gone, its reader resumes from its cursor past
/// them). Resuming with S must not come back empty-handed and silent.
#[tokio::test]
async fn a_resume_after_a_restart_reports_what_the_node_forgot() {
    let Some((pool, table, h)) = outbox_tenant("rs-restart", json!({})).await else {
        return;
    };
    let (epoch, first, ws) = saw_one(&h, &pool, &table, "rs-restart").await;
    drop(ws);
    let missed = three_more(&h, &pool, &table, "rs-restart").await;
    let h = h.restart().await;
    wait_live(&h, "rs-restart").await;
    let mut ws = h.ws("rs-restart").await;
    resume_accounts_for(&mut ws, (&pool, &table), (&epoch, first), &missed).await;
    h.stop().await;
}

/// A late row: a transaction drew id 1, another that began writing before
/// it inserted id 2 and committed; the node read id 2 (the client saw it),
/// restarted, and only then did id 1 commit. On the restarted node the row
/// comes below what it read before (its channels are gone): it must reach
/// the client that resumes from id 2, not sit below its position.
#[tokio::test]
async fn a_row_committed_late_across_a_restart_reaches_a_resuming_client() {
    let Some((pool, table, h)) = outbox_tenant("rs-late", json!({})).await else {
        return;
    };
    let mut ws = h.ws("rs-late").await;
    let epoch = ws.sub("c", 1).await["epoch"].clone();
    // `early` takes its xid first; `late` draws id 1 after it, under a
    // later xid; `early` inserts id 2 and commits; `late` stays open.
    let mut early = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *early)
        .await
        .unwrap();
    let mut late = pool.begin().await.unwrap();
    let sql =
        format!("INSERT INTO {table} (channel, payload) VALUES ('c', $1::jsonb) RETURNING id");
    let row = |n: u64| sqlx::query_scalar::<_, i64>(&sql).bind(json!({ "n": n }).to_string());
    let id_late = row(1).fetch_one(&mut *late).await.unwrap();
    let id_early = row(2).fetch_one(&mut *early).await.unwrap();
    assert!(id_late < id_early);
    early.commit().await.unwrap();
    let m = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(
        (m["data"]["n"].as_u64(), m["seq"].as_i64()),
        (Some(2), Some(seq(id_early)))
    );
    drop(ws);
    let h = h.restart().await;
    wait_live(&h, "rs-late").await;
    late.commit().await.unwrap();
    read(&h, "rs-late", 1).await;
    let mut ws = h.ws("rs-late").await;
    ws.send(json!({"op":"sub","ch":"c","id":9,"since":seq(id_early),"epoch":epoch}))
        .await;
    let ack = ws.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    // Row 1 arrives: on a new epoch (its positions are not the old one's),
    // which the client sees and reports as a gap.
    let m = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(m["data"]["n"], 1, "{m}");
    assert_ne!(ack["epoch"], epoch, "{ack}");
    h.stop().await;
}

/// With `history_size: 0` a channel is dropped at its last unsubscribe: a
/// resume then finds a channel that knows nothing of the rows published
/// before it was dropped, and must say so.
#[tokio::test]
async fn a_resume_on_a_forgotten_channel_reports_the_gap() {
    let body = json!({"limits":{"history_size":0}});
    let Some((pool, table, h)) = outbox_tenant("rs-forgot", body).await else {
        return;
    };
    let (epoch, first, mut ws) = saw_one(&h, &pool, &table, "rs-forgot").await;
    ws.send(json!({"op":"unsub","ch":"c","id":2})).await;
    assert_eq!(ws.next().await["op"], "ack");
    let missed = three_more(&h, &pool, &table, "rs-forgot").await;
    // Someone else looks in and leaves: the last unsubscribe drops the
    // channel (it keeps no history), and with it what it knew.
    let mut other = h.ws("rs-forgot").await;
    other.sub("c", 1).await;
    other.send(json!({"op":"unsub","ch":"c","id":2})).await;
    assert_eq!(other.next().await["op"], "ack");
    resume_accounts_for(&mut ws, (&pool, &table), (&epoch, first), &missed).await;
    h.stop().await;
}

/// The server's own sweeper (every 10 s) drops a channel whose history
/// expired and that nobody reads: a client that saw S before and resumes
/// after it must be told of the rows it missed, not answered as if there
/// were none.
#[tokio::test]
async fn a_resume_after_the_sweeper_dropped_the_channel_reports_the_gap() {
    let body = json!({"limits":{"history_ttl_ms":200}});
    let Some((pool, table, h)) = outbox_tenant("rs-swept", body).await else {
        return;
    };
    let (epoch, first, mut ws) = saw_one(&h, &pool, &table, "rs-swept").await;
    ws.send(json!({"op":"unsub","ch":"c","id":2})).await;
    assert_eq!(ws.next().await["op"], "ack");
    let missed = three_more(&h, &pool, &table, "rs-swept").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    loop {
        let (_, v) = h
            .admin(Method::GET, "/admin/v1/tenants/rs-swept", None)
            .await;
        if v["channels"] == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper never dropped the channel: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    resume_accounts_for(&mut ws, (&pool, &table), (&epoch, first), &missed).await;
    h.stop().await;
}

/// An SSE stream of two channels cut in the middle of its replay, resumed as
/// EventSource does (the last `id:` received): every message of both
/// channels arrives once. A channel's position in `id:` may advance only when
/// that channel's frame is written, not while its replay is still queued.
#[tokio::test]
async fn an_sse_stream_cut_mid_replay_resumes_every_channel() {
    let h = spawn_host().await;
    let key = h.public_tenant("rs-sse").await;
    let publish = |ch: &'static str, n: u64| {
        let h = &h;
        let key = key.clone();
        async move {
            let (s, v) = h
                .publish("rs-sse", &key, json!({"ch":ch,"data":{"ch":ch,"n":n}}))
                .await;
            assert_eq!(s, 200, "{v}");
        }
    };
    let mut got: Vec<(String, u64)> = Vec::new();
    let mut last_id = None;
    // A client that reads `take` messages, remembering the last id.
    async fn read(
        sse: &mut Sse,
        take: usize,
        got: &mut Vec<(String, u64)>,
        last_id: &mut Option<String>,
    ) {
        let mut n = 0;
        while n < take {
            let e = sse.next().await.expect("the stream goes on");
            if e.id.is_some() {
                *last_id = e.id.clone();
            }
            if e.event == "msg" {
                got.push((
                    e.data["data"]["ch"].as_str().unwrap().to_string(),
                    e.data["data"]["n"].as_u64().unwrap(),
                ));
                n += 1;
            }
        }
    }
    let mut sse = h.sse("rs-sse", "ch=a&ch=b", None).await;
    assert_eq!(sse.status, 200);
    publish("a", 1).await;
    publish("b", 1).await;
    read(&mut sse, 2, &mut got, &mut last_id).await;
    drop(sse);
    for n in 2..=3 {
        publish("a", n).await;
        publish("b", n).await;
    }
    // Back: the replay of both channels is queued; the stream is cut after
    // its first event.
    let mut sse = h.sse("rs-sse", "ch=a&ch=b", last_id.as_deref()).await;
    read(&mut sse, 1, &mut got, &mut last_id).await;
    drop(sse);
    let mut sse = h.sse("rs-sse", "ch=a&ch=b", last_id.as_deref()).await;
    publish("a", 4).await;
    publish("b", 4).await;
    let want: usize = 8;
    read(&mut sse, want - got.len(), &mut got, &mut last_id).await;
    for ch in ["a", "b"] {
        let ns: Vec<u64> = got.iter().filter(|g| g.0 == ch).map(|g| g.1).collect();
        assert_eq!(
            ns,
            [1, 2, 3, 4],
            "channel {ch}: every message once, in order: {got:?}"
        );
    }
    h.stop().await;
}

/// A `Last-Event-ID` this stream cannot read (written for another channel
/// list) does not start the stream live in silence: each channel that has
/// had messages begins with a `gap` over them.
#[tokio::test]
async fn an_sse_id_for_other_channels_is_a_gap_not_silence() {
    let h = spawn_host().await;
    let key = h.public_tenant("rs-sse-id").await;
    for n in 1..=2 {
        let (s, _) = h
            .publish("rs-sse-id", &key, json!({"ch":"a","data":{"n":n}}))
            .await;
        assert_eq!(s, 200);
    }
    let mut sse = h.sse("rs-sse-id", "ch=a", Some("5:1,6:1")).await;
    assert_eq!(sse.status, 200);
    let e = sse.next().await.unwrap();
    assert_eq!(e.event, "gap", "{e:?}");
    assert_eq!(
        (e.data["from"].as_u64(), e.data["to"].as_u64()),
        (Some(1), Some(2))
    );
    h.stop().await;
}

/// A tenant deleted and made again under the same id, on the same outbox, is
/// another position space: its channels have another epoch, and its reader
/// starts afresh (the old incarnation's cursor went with it), so rows written
/// while the tenant did not exist are not delivered as if they were its own.
#[tokio::test]
async fn a_tenant_made_again_is_another_position_space() {
    let Some((pool, table, h)) = outbox_tenant("rs-again", json!({})).await else {
        return;
    };
    let (first_epoch, _, ws) = saw_one(&h, &pool, &table, "rs-again").await;
    drop(ws);
    let (s, _) = h
        .admin(Method::DELETE, "/admin/v1/tenants/rs-again", None)
        .await;
    assert_eq!(s, 204);
    // Written while no tenant reads the outbox.
    insert(&pool, &table, "c", 1).await;
    h.public_tenant("rs-again").await;
    let url = pg_url().expect("the test Postgres");
    assert_eq!(set_source(&h, "rs-again", &url, &table).await.0, 200);
    wait_live(&h, "rs-again").await;
    let mut ws = h.ws("rs-again").await;
    let ack = ws.sub("c", 1).await;
    assert_ne!(ack["epoch"], first_epoch, "another position space");
    let next = seq(insert(&pool, &table, "c", 2).await);
    let m = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(
        (m["seq"].as_i64(), m["data"]["n"].as_u64()),
        (Some(next), Some(2)),
        "the row written meanwhile is not this tenant's: {m}"
    );
    h.stop().await;
}

/// A table truncated with `RESTART IDENTITY` while its reader was away: its
/// ids start over below what this node read. Reading on would take the new
/// rows for positions of the old space (rebases, or re-reads): the source
/// stalls and says why, until a higher `generation` starts a new space.
#[tokio::test]
async fn an_outbox_whose_ids_start_over_stalls_until_a_new_generation() {
    let Some((pool, table, h)) = outbox_tenant("rs-trunc", json!({})).await else {
        return;
    };
    for n in 0..3 {
        insert(&pool, &table, "c", n).await;
    }
    read(&h, "rs-trunc", 3).await;
    let data_dir = h.data_dir.clone();
    let dir = h.stop().await;
    sqlx::query(&format!("TRUNCATE {table} RESTART IDENTITY"))
        .execute(&pool)
        .await
        .unwrap();
    insert(&pool, &table, "c", 10).await;
    let mut opts = HostOptions::new();
    opts.config.data_dir = data_dir;
    opts.dir = dir;
    let h = spawn_with(opts).await;
    let v = wait_source(
        &h,
        "rs-trunc",
        |health| health["state"] == "stalled",
        "read on over ids that started again",
    )
    .await;
    let why = v["health"]["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("start over") && why.contains("generation"),
        "{v}"
    );
    let url = pg_url().unwrap();
    let body = json!({"kind":"postgres_outbox","database_url":url,"table":table,"poll_ms":200,"generation":1});
    let (s, v) = h
        .admin(Method::PUT, "/admin/v1/tenants/rs-trunc/source", Some(body))
        .await;
    assert_eq!(s, 200, "{v}");
    wait_live(&h, "rs-trunc").await;
    let mut ws = h.ws("rs-trunc").await;
    ws.sub("c", 1).await;
    insert(&pool, &table, "c", 11).await;
    let m = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(m["data"]["n"], 11, "{m}");
    h.stop().await;
}
