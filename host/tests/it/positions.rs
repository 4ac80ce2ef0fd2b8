//! The position model end to end (ARCHITECTURE.md, "Positions"): what a
//! client sees when sources, conflation, audiences and positions meet. Each
//! test is one case, against a real server, a real Postgres outbox or
//! librdkafka's mock cluster, and real compiled plugins.

use crate::helpers::*;
use crate::kafka::{pg_kafka, produce, test_producer, PgKafka};
use crate::outbox::{msgs, outbox_table, pg_url, seq, set_source, subscribed, wait_live};
use rdkafka::mocking::MockCluster;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::time::{Duration, Instant};

async fn insert(
    pool: &PgPool,
    table: &str,
    channel: &str,
    key: Option<&str>,
    payload: Value,
) -> i64 {
    sqlx::query_scalar(&format!(
        "INSERT INTO {table} (channel, key, payload) VALUES ($1, $2, $3::jsonb) RETURNING id"
    ))
    .bind(channel)
    .bind(key)
    .bind(payload.to_string())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `msg` frames for `within`, however many come.
async fn msgs_for(ws: &mut Ws, within: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    let end = tokio::time::Instant::now() + within;
    while let Ok(m) = tokio::time::timeout_at(end, ws.next()).await {
        if m["op"] == "msg" {
            out.push(m);
        }
    }
    out
}

fn data(ms: &[Value]) -> Vec<Value> {
    ms.iter().map(|m| m["data"].clone()).collect()
}

/// Item 1: rows keyed A, B, A in one window reach the client as B then A;
/// an unkeyed row goes out at once, after the held rows of its channel.
#[tokio::test]
async fn outbox_window_keeps_every_key_in_order() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.tenant(json!({"id":"pos-win","access":"public","conflation":{"window_ms":400}}))
        .await;
    let mut ws = subscribed(&h, "pos-win", &url, &table, "q").await;
    let mut tx = pool.begin().await.unwrap();
    for (key, v) in [("A", 1), ("B", 2), ("A", 3)] {
        sqlx::query(&format!(
            "INSERT INTO {table} (channel, key, payload) VALUES ('q', $1, $2::jsonb)"
        ))
        .bind(key)
        .bind(json!({"v": v}).to_string())
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let got = msgs(&mut ws, 2).await;
    assert_eq!(data(&got), [json!({"v":2}), json!({"v":3})], "{got:?}");
    assert_eq!(got[1]["prev"], got[0]["seq"]);
    // Keyed C waits; unkeyed D must not pass it, and neither is lost.
    insert(&pool, &table, "q", Some("C"), json!({"v":4})).await;
    insert(&pool, &table, "q", None, json!({"v":5})).await;
    let more = msgs(&mut ws, 2).await;
    assert_eq!(data(&more), [json!({"v":4}), json!({"v":5})], "{more:?}");
    assert_eq!(more[0]["prev"], got[1]["seq"]);
    assert_eq!(more[1]["prev"], more[0]["seq"]);
    assert!(msgs_for(&mut ws, Duration::from_millis(600))
        .await
        .is_empty());
    h.stop().await;
}

/// Item 2: a transform's two messages to one channel from one row both
/// arrive, at positions of their own.
#[tokio::test]
async fn one_row_two_messages_to_one_channel() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.public_tenant("pos-twice").await;
    h.install_plugin("pos-twice", "fixture_twice").await;
    let mut ws = subscribed(&h, "pos-twice", &url, &table, "q").await;
    let a = insert(&pool, &table, "q", None, json!(1)).await;
    let b = insert(&pool, &table, "q", None, json!(2)).await;
    let got = msgs(&mut ws, 4).await;
    assert_eq!(
        data(&got),
        [
            json!({"copy":1,"v":1}),
            json!({"copy":2,"v":1}),
            json!({"copy":1,"v":2}),
            json!({"copy":2,"v":2})
        ]
    );
    let seqs: Vec<i64> = got.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [a * 1000, a * 1000 + 1, b * 1000, b * 1000 + 1]);
    for w in got.windows(2) {
        assert_eq!(w[1]["prev"], w[0]["seq"]);
    }
    assert_eq!(
        h.metric("herald_source_duplicates_total{tenant=\"pos-twice\"}")
            .await,
        0.0
    );
    h.stop().await;
}

/// Item 3: HTTP publish beside an outbox is refused and moves nothing; a
/// new source's rows are delivered even where its ids are below the old
/// source's positions, in an epoch of its own that subscribers are told.
#[tokio::test]
async fn http_publish_beside_a_source_is_refused_and_a_new_source_is_not_a_duplicate() {
    let Some(url) = pg_url() else { return };
    let (pool, first) = outbox_table(&url).await;
    let (pool2, second) = outbox_table(&url).await;
    let h = spawn_host().await;
    let key = h.public_tenant("pos-src").await;
    let mut ws = subscribed(&h, "pos-src", &url, &first, "q").await;
    let (s, v) = h
        .publish("pos-src", &key, json!({"ch":"q","data":{"http":1}}))
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["code"], "source_not_http", "{v}");
    for i in 0..3 {
        insert(&pool, &first, "q", None, json!({"first": i})).await;
    }
    let got = msgs(&mut ws, 3).await;
    assert_eq!(
        data(&got)[0],
        json!({"first":0}),
        "the refused publish took no position"
    );
    // The second table starts at id 1, below the positions the first gave.
    assert_eq!(set_source(&h, "pos-src", &url, &second).await.0, 200);
    wait_live(&h, "pos-src").await;
    let id = insert(&pool2, &second, "q", None, json!({"second": 0})).await;
    // Another position space: the subscriber is told the new epoch before
    // any message of it, and the chain starts again there.
    let (ack, next) = ack_then_msg(&mut ws).await;
    assert!(ack["epoch"].as_u64().is_some(), "{ack}");
    assert_eq!(data(std::slice::from_ref(&next)), [json!({"second":0})]);
    assert_eq!(next["seq"].as_i64(), Some(seq(id)));
    assert_eq!(next["prev"], 0, "{next}");
    // Back on HTTP (this node's own positions): a new epoch again.
    let (s, _) = h
        .admin(
            Method::PUT,
            "/admin/v1/tenants/pos-src/source",
            Some(json!({"kind":"http"})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = h
        .publish("pos-src", &key, json!({"ch":"q","data":{"http":2}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (again, last) = ack_then_msg(&mut ws).await;
    assert_ne!(again["epoch"], ack["epoch"], "{again}");
    assert_eq!(
        (last["seq"].as_i64(), last["prev"].as_i64()),
        (Some(1), Some(0))
    );
    h.stop().await;
}

/// An `ack` without an id (the channel's epoch changed), then a `msg`.
async fn ack_then_msg(ws: &mut Ws) -> (Value, Value) {
    let ack = next_op(ws, "ack", WAIT).await;
    assert!(ack["id"].is_null(), "{ack}");
    assert_eq!(ack["ch"], "q", "{ack}");
    let m = next_op(ws, "msg", WAIT).await;
    (ack, m)
}

/// Item 8: resuming with sparse positions reports a gap only for what is
/// missing.
#[tokio::test]
async fn resume_with_sparse_positions_has_no_spurious_gap() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let h = spawn_host().await;
    h.tenant(json!({"id":"pos-sparse","access":"public","limits":{"history_size":2}}))
        .await;
    let mut ws = subscribed(&h, "pos-sparse", &url, &table, "q").await;
    // Rows for another channel in between make q's positions sparse.
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(insert(&pool, &table, "q", None, json!({"i": i})).await);
        insert(&pool, &table, "other", None, json!({})).await;
    }
    let got = msgs(&mut ws, 3).await;
    let first = got[0]["seq"].as_u64().unwrap();
    // History holds the last two; a client that saw the first misses nothing.
    let mut again = h.ws("pos-sparse").await;
    again
        .send(json!({"op":"sub","ch":"q","since":first,"id":2}))
        .await;
    let ack = again.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    let mut epoch_again = h.ws("pos-sparse").await;
    epoch_again
        .send(json!({"op":"sub","ch":"q","since":first,"epoch":ack["epoch"],"id":3}))
        .await;
    for ws in [&mut again, &mut epoch_again] {
        let mut frames = Vec::new();
        while frames.len() < 2 {
            let m = ws.next().await;
            assert_ne!(m["op"], "gap", "spurious gap: {m}");
            if m["op"] == "msg" {
                frames.push(m);
            }
        }
        assert_eq!(frames[0]["prev"].as_u64(), Some(first));
        assert_eq!(data(&frames), [json!({"i":1}), json!({"i":2})]);
    }
    h.stop().await;
}

/// Item 9: a message for another audience is not a gap in what a session
/// sees (redact sends nothing to `basic` for a payload that is not an object).
#[tokio::test]
async fn a_message_for_another_audience_is_no_gap() {
    let h = spawn_host().await;
    let config = json!({"tokens":{"tp":"pro","tb":"basic"},"redact_fields":["bid"]});
    let key = h.tenant(json!({"id":"pos-aud","config":config})).await;
    h.install_plugin("pos-aud", "redact").await;
    let mut pro = h.ws_with("pos-aud", "token=tp").await.ok().unwrap();
    let mut basic = h.ws_with("pos-aud", "token=tb").await.ok().unwrap();
    pro.sub("q", 1).await;
    basic.sub("q", 1).await;
    for data in [json!({"px":1,"bid":2}), json!(7), json!({"px":3,"bid":4})] {
        assert_eq!(
            h.publish("pos-aud", &key, json!({"ch":"q","data":data}))
                .await
                .0,
            200
        );
    }
    let p = msgs(&mut pro, 3).await;
    let b = msgs(&mut basic, 2).await;
    let chain = |ms: &[Value]| {
        ms.iter()
            .map(|m| (m["seq"].as_u64(), m["prev"].as_u64()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        chain(&p),
        [(Some(1), Some(0)), (Some(2), Some(1)), (Some(3), Some(2))]
    );
    assert_eq!(
        chain(&b),
        [(Some(1), Some(0)), (Some(3), Some(1))],
        "basic never had 2: no gap"
    );
    assert_eq!(data(&b), [json!({"px":1}), json!({"px":3})]);
    h.stop().await;
}

/// Item 5: a shutdown publishes what a conflation window holds, and the
/// session sends it before closing with 1001.
#[tokio::test]
async fn shutdown_loses_no_held_message() {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":"pos-stop","access":"public","conflation":{"window_ms":30000}}))
        .await;
    let mut ws = h.ws("pos-stop").await;
    ws.sub("q", 1).await;
    for (k, v) in [("A", 1), ("B", 2), ("A", 3)] {
        let (s, r) = h
            .publish("pos-stop", &key, json!({"ch":"q","key":k,"data":{"v":v}}))
            .await;
        assert_eq!((s, r["held"].clone()), (200, json!(true)));
    }
    h.stop().await;
    let got = msgs(&mut ws, 2).await;
    assert_eq!(data(&got), [json!({"v":2}), json!({"v":3})]);
    assert_eq!(ws.closed().await.0, 1001);
}

/// Item 6: records re-read after a failed position save are duplicates
/// (their positions come from Kafka), not new messages under new seqs.
#[tokio::test]
async fn kafka_rereads_are_duplicates() {
    let Some(PgKafka {
        pg,
        cluster,
        producer,
        tenant,
        h,
    }) = pg_kafka("pos-ticks", "pos-k").await
    else {
        return;
    };
    let brokers = cluster.bootstrap_servers();
    let body = json!({"kind":"kafka","brokers":brokers,"topics":["pos-ticks"],"start":"earliest"});
    let (s, v) = h
        .admin(
            Method::PUT,
            &format!("/admin/v1/tenants/{tenant}/source"),
            Some(body),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws(&tenant).await;
    ws.sub("t", 1).await;
    for n in 0..3 {
        produce(&producer, "pos-ticks", "t", n).await;
    }
    let mut got = msgs(&mut ws, 3).await;
    // Let the positions past them be stored, then make every later save fail.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let pool = PgPool::connect(&pg).await.unwrap();
    let fail = format!("fail_{}", tenant.replace('-', "_"));
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION {fail}() RETURNS trigger AS $$ BEGIN \
           IF NEW.tenant_id = '{tenant}' THEN RAISE EXCEPTION 'test: saves fail'; END IF; RETURN NEW; END; $$ LANGUAGE plpgsql;
         CREATE TRIGGER {fail} BEFORE INSERT OR UPDATE ON ingest_cursors FOR EACH ROW EXECUTE FUNCTION {fail}();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let before = h
        .metric(&format!(
            "herald_source_duplicates_total{{tenant=\"{tenant}\"}}"
        ))
        .await;
    for n in 3..6 {
        produce(&producer, "pos-ticks", "t", n).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The failed save turns the reader over; it cannot reconnect (a new
    // connection stores its positions first) until saves work again.
    let source = format!("/admin/v1/tenants/{tenant}/source");
    let deadline = Instant::now() + WAIT;
    while h.admin(Method::GET, &source, None).await.1["health"]["state"] != "stalled" {
        assert!(
            Instant::now() < deadline,
            "a failing position save never showed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::raw_sql(&format!(
        "DROP TRIGGER {fail} ON ingest_cursors; DROP FUNCTION {fail}();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    // Back on its stored positions, the reader reads 3.. again.
    let deadline = Instant::now() + WAIT;
    while h
        .metric(&format!(
            "herald_source_duplicates_total{{tenant=\"{tenant}\"}}"
        ))
        .await
        == before
    {
        assert!(
            Instant::now() < deadline,
            "no re-read record was counted as a duplicate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    produce(&producer, "pos-ticks", "t", 6).await;
    let mut rest = Vec::new();
    while rest.last().is_none_or(|m: &Value| m["data"]["n"] != 6) {
        rest.extend(msgs(&mut ws, 1).await);
    }
    got.extend(rest);
    let ns: Vec<u64> = got
        .iter()
        .map(|m| m["data"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, [0, 1, 2, 3, 4, 5, 6], "every record once, in order");
    for (i, w) in got.windows(2).enumerate() {
        assert_eq!(w[1]["prev"], w[0]["seq"], "at {i}");
    }
    // Positions are the offsets (+1) × 1000: the same on every node.
    assert_eq!(got[0]["seq"], 1000);
    assert_eq!(got[6]["seq"], 7000);
    h.stop().await;
}

/// Item 6: one channel fed by two partitions loses nothing, and the case is
/// visible (metric, source health).
#[tokio::test]
async fn kafka_partitions_into_one_channel_are_visible_not_lost() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("pos-two", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer = test_producer(&brokers);
    let h = spawn_host().await;
    h.public_tenant("pos-two").await;
    let body = json!({"kind":"kafka","brokers":brokers,"topics":["pos-two"],"start":"earliest"});
    let (s, v) = h
        .admin(Method::PUT, "/admin/v1/tenants/pos-two/source", Some(body))
        .await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws("pos-two").await;
    ws.sub("t", 1).await;
    // Partition 0 runs ahead; partition 1's offsets are below it.
    for (partition, n) in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (0, 6)] {
        let payload = json!({"n": n}).to_string();
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: "channel",
            value: Some("t"),
        });
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to("pos-two")
                    .partition(partition)
                    .payload(&payload)
                    .headers(headers),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        // One record at a time: the order between partitions is the test's.
        let m = msgs(&mut ws, 1).await;
        assert_eq!(m[0]["data"]["n"], n, "{m:?}");
    }
    let (_, v) = h
        .admin(Method::GET, "/admin/v1/tenants/pos-two/source", None)
        .await;
    assert_eq!(v["health"]["rebased"], 2, "{v}");
    assert_eq!(
        h.metric("herald_source_rebased_total{tenant=\"pos-two\"}")
            .await,
        2.0
    );
    h.stop().await;
}

impl Node {
    /// A public tenant with a 4 s window on channel `q`, reading from
    /// `source`, live (messages to other channels are not held).
    async fn windowed_tenant(&self, id: &str, source: Value) {
        let body =
            json!({"id":id,"access":"public","conflation":{"window_ms":4000,"channels":["q"]}});
        assert_eq!(
            self.admin(Method::POST, "/admin/v1/tenants", body).await.0,
            201
        );
        let path = format!("/admin/v1/tenants/{id}/source");
        let (s, v) = self.admin(Method::PUT, &path, source).await;
        assert_eq!(s, 200, "{v}");
        self.wait_health(id, |h| h["state"] == "live", "the source never went live")
            .await;
    }

    async fn wait_health(&self, id: &str, done: impl Fn(&Value) -> bool, what: &str) {
        let path = format!("/admin/v1/tenants/{id}/source");
        let deadline = Instant::now() + WAIT;
        loop {
            let h = self.admin(Method::GET, &path, json!({})).await.1["health"].clone();
            if done(&h) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {h}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The source read exactly `records` since this process started (what
    /// it read again after a crash), and reads no more within a poll.
    async fn records_read_are(&self, id: &str, records: u64) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let path = format!("/admin/v1/tenants/{id}/source");
        let h = self.admin(Method::GET, &path, json!({})).await.1["health"].clone();
        assert_eq!(h["records"].as_u64(), Some(records), "{h}");
    }

    async fn read(&self, id: &str, records: u64) {
        self.wait_health(
            id,
            |h| h["records"].as_u64() >= Some(records),
            "records never read",
        )
        .await;
    }
}

/// A crash loses nothing a conflation window held: the outbox cursor stored
/// stays below the held rows, so the restarted node reads them again — and
/// only them: a row delivered before them is not read again, so a node that
/// never moved its cursor past the start fails here (the table is fresh, so
/// reading it from the start would give the held rows too).
#[tokio::test]
async fn a_crash_loses_no_held_message() {
    let Some(url) = pg_url() else { return };
    let (pool, table) = outbox_table(&url).await;
    let dir = tempfile::tempdir().unwrap();
    let first = Node::start(dir.path(), &[]).await;
    let source = json!({"kind":"postgres_outbox","database_url":url,"table":table,"poll_ms":100});
    first.windowed_tenant("pos-crash", source).await;
    // A row no window holds: delivered, and the cursor moves past it.
    insert(&pool, &table, "early", Some("E"), json!({"v":0})).await;
    first.read("pos-crash", 1).await;
    // The rows are read and held in the 4 s window…
    let a = insert(&pool, &table, "q", Some("A"), json!({"v":1})).await;
    let b = insert(&pool, &table, "q", Some("B"), json!({"v":2})).await;
    first.read("pos-crash", 3).await;
    // …when the node dies without a word.
    first.kill().await;
    let second = Node::start(dir.path(), &[]).await;
    let mut ws = second.subscriber("pos-crash", "q").await;
    let got = msgs(&mut ws, 2).await;
    assert_eq!(data(&got), [json!({"v":1}), json!({"v":2})]);
    assert_eq!(
        (got[0]["seq"].as_i64(), got[1]["seq"].as_i64()),
        (Some(a * 1000), Some(b * 1000)),
        "the same positions as before the crash"
    );
    second.records_read_are("pos-crash", 2).await;
}

/// The same for Kafka: the positions stored stay at the records a window
/// holds, so the restarted node reads them again — and not the record
/// delivered before them (a node that never stored a position would read
/// the topic from `earliest` again).
#[tokio::test]
async fn a_crash_loses_no_held_kafka_record() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("pos-crash", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let producer = test_producer(&brokers);
    let dir = tempfile::tempdir().unwrap();
    let first = Node::start(dir.path(), &[]).await;
    let source =
        json!({"kind":"kafka","brokers":brokers,"topics":["pos-crash"],"start":"earliest"});
    first.windowed_tenant("pos-kcrash", source).await;
    produce(&producer, "pos-crash", "early", 100).await;
    first.read("pos-kcrash", 1).await;
    // Positions are stored with a batch, at most every 200 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 0..2 {
        produce(&producer, "pos-crash", "q", n).await;
    }
    first.read("pos-kcrash", 3).await;
    // A later batch stores the positions again (still below the held ones).
    tokio::time::sleep(Duration::from_millis(300)).await;
    produce(&producer, "pos-crash", "q", 2).await;
    first.read("pos-kcrash", 4).await;
    first.kill().await;
    let second = Node::start(dir.path(), &[]).await;
    let mut ws = second.subscriber("pos-kcrash", "q").await;
    let got = msgs(&mut ws, 3).await;
    let ns: Vec<u64> = got
        .iter()
        .map(|m| m["data"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, [0, 1, 2]);
    second.records_read_are("pos-kcrash", 3).await;
}

/// HTTP publish into a topic of several partitions: one channel's messages
/// with different conflation keys go to one partition (the channel's), so
/// they arrive in publish order with one chain and the `seq` each publish
/// was answered with — no rebase.
#[tokio::test]
async fn http_publish_into_several_partitions_keeps_a_channel_in_one() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("pos-parts", 4, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let h = spawn_host().await;
    let key = h.public_tenant("pos-parts").await;
    read_topics(&h, "pos-parts", &brokers, json!(["pos-parts"])).await;
    let mut ws = h.ws("pos-parts").await;
    ws.sub("t", 1).await;
    let mut answered = Vec::new();
    for n in 0..12u64 {
        let (s, v) = h
            .publish(
                "pos-parts",
                &key,
                json!({"ch":"t","key":format!("k{n}"),"data":{"n":n}}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        answered.push(v["seq"].as_u64().expect("the answer names the seq"));
    }
    let got = msgs(&mut ws, 12).await;
    let ns: Vec<u64> = got
        .iter()
        .map(|m| m["data"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (0..12).collect::<Vec<_>>(), "publish order");
    for w in got.windows(2) {
        assert_eq!(w[1]["prev"], w[0]["seq"], "one chain: {got:?}");
    }
    let seqs: Vec<u64> = got.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, answered, "the answered seq is the delivered one");
    let (_, v) = h
        .admin(Method::GET, "/admin/v1/tenants/pos-parts/source", None)
        .await;
    assert_eq!(v["health"]["rebased"], 0, "{v}");
    h.stop().await;
}

/// Adding a topic keeps the positions this node stored for the others
/// (they are kept per Kafka cluster, not per topic list): nothing read
/// before is read again.
#[tokio::test]
async fn adding_a_topic_keeps_the_other_topics_positions() {
    let cluster = MockCluster::new(1).unwrap();
    for t in ["pos-ka", "pos-kb"] {
        cluster.create_topic(t, 1, 1).unwrap();
    }
    let brokers = cluster.bootstrap_servers();
    let producer = test_producer(&brokers);
    let h = spawn_host().await;
    h.public_tenant("pos-addtopic").await;
    read_topics(&h, "pos-addtopic", &brokers, json!(["pos-ka"])).await;
    let mut ws = h.ws("pos-addtopic").await;
    ws.sub("c", 1).await;
    for n in 0..2 {
        produce(&producer, "pos-ka", "c", n).await;
    }
    assert_eq!(msgs(&mut ws, 2).await.len(), 2);
    // Positions are stored at most every 200 ms.
    tokio::time::sleep(Duration::from_millis(400)).await;
    produce(&producer, "pos-ka", "c", 2).await;
    assert_eq!(msgs(&mut ws, 1).await[0]["data"]["n"], 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    read_topics(&h, "pos-addtopic", &brokers, json!(["pos-ka", "pos-kb"])).await;
    produce(&producer, "pos-ka", "c", 3).await;
    let next = msgs(&mut ws, 1).await;
    assert_eq!(next[0]["data"]["n"], 3, "nothing read again: {next:?}");
    h.stop().await;
}

/// Points `tenant` at `topics` of `brokers` from their earliest records and
/// waits until it is live.
async fn read_topics(h: &Host, tenant: &str, brokers: &str, topics: Value) {
    let body = json!({"kind":"kafka","brokers":brokers,"topics":topics,"start":"earliest"});
    let path = format!("/admin/v1/tenants/{tenant}/source");
    let (s, v) = h.admin(Method::PUT, &path, Some(body)).await;
    assert_eq!(s, 200, "{v}");
    wait_live(h, tenant).await;
}
