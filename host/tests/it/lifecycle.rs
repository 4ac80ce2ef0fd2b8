//! Restart, tenant changes, shutdown: nothing is lost that should survive,
//! and every session is told why it ends.

use crate::helpers::*;
use reqwest::Method;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn registry_survives_restart() {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":"keep","access":"public","config":{"a":1},"limits":{"history_size":7}}))
        .await;
    let h = h.restart().await;
    let (s, v) = h.admin(Method::GET, "/admin/v1/tenants/keep", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["config"], json!({"a":1}));
    assert_eq!(v["effective_limits"]["history_size"], 7);
    let mut ws = h.ws("keep").await;
    ws.sub("c", 1).await;
    assert_eq!(
        h.publish("keep", &key, json!({"ch":"c","data":1})).await.0,
        200
    );
    assert_eq!(ws.next().await["seq"], 1);
    h.stop().await;
}

#[tokio::test]
async fn admin_changes_apply_live() {
    let h = spawn_host().await;
    let key = h.public_tenant("t").await;
    let mut ws = h.ws("t").await;
    ws.sub("c", 1).await;
    // Changing limits keeps sessions and subscriptions.
    let (s, v) = h
        .admin(
            Method::PATCH,
            "/admin/v1/tenants/t",
            Some(json!({"limits":{"history_size":3}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["limits"], json!({"history_size":3}));
    h.publish("t", &key, json!({"ch":"c","data":1})).await;
    assert_eq!(ws.next().await["seq"], 1);
    // Rotating the key invalidates the old one.
    let (_, v) = h
        .admin(Method::POST, "/admin/v1/tenants/t/publish-key", None)
        .await;
    let new_key = v["publish_key"].as_str().unwrap();
    assert_eq!(
        h.publish("t", &key, json!({"ch":"c","data":1})).await.0,
        401
    );
    assert_eq!(
        h.publish("t", new_key, json!({"ch":"c","data":2})).await.0,
        200
    );
    assert_eq!(ws.next().await["seq"], 2);
    // Switching access to plugin closes sessions with 4000 (fail closed).
    let (s, _) = h
        .admin(
            Method::PATCH,
            "/admin/v1/tenants/t",
            Some(json!({"access":"plugin"})),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(ws.closed().await.0, 4000);
    // Deleting a tenant closes its sessions and forgets it.
    h.public_tenant("gone").await;
    let mut g = h.ws("gone").await;
    g.sub("c", 1).await;
    let (s, _) = h
        .admin(Method::DELETE, "/admin/v1/tenants/gone", None)
        .await;
    assert_eq!(s, 204);
    assert_eq!(g.closed().await.0, 4000);
    // Publishing to it is refused as a wrong key is (tenant ids are not probed).
    assert_eq!(
        h.publish("gone", new_key, json!({"ch":"c","data":1}))
            .await
            .0,
        401
    );
    // Gone: answered as an unknown tenant (401 to a caller without credentials).
    assert_eq!(h.ws_with("gone", "").await.err().map(|e| e.0), Some(401));
    let (_, v) = h.admin(Method::GET, "/admin/v1/tenants", None).await;
    assert_eq!(v["tenants"].as_array().unwrap().len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn shutdown_closes_sessions_with_1001_and_ends_sse() {
    let h = spawn_host().await;
    h.public_tenant("t").await;
    let mut ws = h.ws("t").await;
    ws.sub("c", 1).await;
    let mut sse = h.sse("t", "ch=c", None).await;
    let stopper = tokio::spawn(h.stop());
    assert_eq!(ws.closed().await.0, 1001);
    // The SSE stream ends (after an optional close event).
    let mut ended = false;
    for _ in 0..3 {
        match sse.next().await {
            None => {
                ended = true;
                break;
            }
            Some(e) => assert_eq!(e.event, "close"),
        }
    }
    assert!(ended);
    stopper.await.unwrap();
}

/// The real binary: SIGTERM drains sessions with 1001 and exits 0.
#[tokio::test]
async fn sigterm_drains_the_real_binary() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--demo"]).await;
    let mut ws = node.subscriber("demo", "c").await;
    let status = node.terminate().await;
    assert_eq!(ws.closed().await.0, 1001);
    assert!(status.success(), "{status}");
}

/// `--shutdown-grace-secs`: sessions get that long to send what they have
/// queued and close; one whose client stopped reading (its socket full)
/// does not hold the process past it. With a grace of 2 s the node exits
/// after it (it waited for the stuck session) and well before the 10 s
/// default, saying it dropped the session.
#[tokio::test]
async fn a_stuck_session_holds_shutdown_no_longer_than_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--shutdown-grace-secs", "2"]).await;
    let (s, v) = node
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            json!({"id":"grace","access":"public","limits":{"slow_consumer":"drop-oldest"}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let key = v["publish_key"].as_str().unwrap().to_string();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", node.port).parse().unwrap();
    let _stuck = stalled_subscriber_at(addr, &format!("ws://{addr}/v1/t/grace/ws")).await;
    let big = "x".repeat(60_000);
    for _ in 0..40 {
        let (s, v) = node
            .publish("grace", &key, json!({"ch":"c","data":big}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = std::time::Instant::now();
    let logs = node.logs_handle();
    let status = node.terminate().await;
    let took = asked.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(8),
        "exited {took:?} after SIGTERM with a 2 s grace and a stuck session"
    );
    // Its stderr may still be on its way to the test's reader.
    let said = "sessions still open at the shutdown deadline";
    for _ in 0..100 {
        if logs.lock().unwrap().contains(said) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no {said:?} in {}", logs.lock().unwrap());
}

/// The same host on a Postgres registry, when the test script provides one.
#[tokio::test]
async fn postgres_registry_end_to_end() {
    let Ok(url) = std::env::var("HERALD_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("HERALD_REQUIRE_POSTGRES").is_err(),
            "Postgres required but not configured"
        );
        eprintln!("skipping: HERALD_TEST_POSTGRES_URL not set");
        return;
    };
    let id = format!("pg{}", rand_suffix());
    let mut opts = HostOptions::new();
    opts.config.database_url = Some(url.clone());
    let h = spawn_with(opts).await;
    let key = h.tenant(json!({"id": id, "access":"public"})).await;
    h.stop().await;
    let mut opts = HostOptions::new();
    opts.config.database_url = Some(url);
    let h = spawn_with(opts).await;
    let mut ws = h.ws(&id).await;
    ws.sub("c", 1).await;
    assert_eq!(
        h.publish(&id, &key, json!({"ch":"c","data":1})).await.0,
        200
    );
    assert_eq!(ws.next().await["seq"], 1);
    assert_eq!(
        h.admin(Method::DELETE, &format!("/admin/v1/tenants/{id}"), None)
            .await
            .0,
        204
    );
    h.stop().await;
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

/// The data dir, the SQLite registry in it and the compiled
/// plugins' directory are their user's alone.
#[tokio::test]
async fn the_data_dir_and_registry_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("herald-data");
    let mut opts = HostOptions::new().own_compiled();
    opts.config.data_dir = data.clone();
    let h = spawn_with(opts).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "the data dir");
    assert_eq!(mode(&data.join("registry.db")), 0o600, "the registry");
    assert_eq!(mode(&data.join("compiled")), 0o700, "compiled plugins");
    h.stop().await;
}

/// Two PATCHes of different fields at once both hold: a PATCH is a
/// read-modify-write of the tenant's row, and a write that another landed
/// under is read again and reapplied, never written over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_of_different_fields_both_hold() {
    let h = spawn_host().await;
    h.public_tenant("both").await;
    for round in 0..40u64 {
        let config = h.admin(
            Method::PATCH,
            "/admin/v1/tenants/both",
            Some(json!({"config":{"round":round}})),
        );
        let limits = h.admin(
            Method::PATCH,
            "/admin/v1/tenants/both",
            Some(json!({"limits":{"max_subscriptions":100 + round}})),
        );
        let ((s1, v1), (s2, v2)) = tokio::join!(config, limits);
        assert_eq!((s1, s2), (200, 200), "{v1} {v2}");
        let (_, v) = h.admin(Method::GET, "/admin/v1/tenants/both", None).await;
        assert_eq!(
            (
                v["config"]["round"].as_u64(),
                v["limits"]["max_subscriptions"].as_u64()
            ),
            (Some(round), Some(100 + round)),
            "round {round}: one PATCH was lost: {v}"
        );
    }
    h.stop().await;
}

/// A deleted tenant's positions go with it, even those its reader stores
/// as it stops: a tenant made again under the same id starts afresh, never
/// at the old reader's offsets, and only once that reader has ended.
#[tokio::test]
async fn a_deleted_tenants_reader_leaves_no_position_behind() {
    let Some(url) = crate::outbox::pg_url() else {
        return;
    };
    let h = spawn_host().await;
    h.public_tenant("again").await;
    let (pool, table) = crate::outbox::outbox_table(&url).await;
    let mut ws = crate::outbox::subscribed(&h, "again", &url, &table, "c").await;
    for n in 0..3 {
        sqlx::query(&format!(
            "INSERT INTO {table} (channel, payload) VALUES ('c', $1::jsonb)"
        ))
        .bind(json!({ "n": n }).to_string())
        .execute(&pool)
        .await
        .unwrap();
    }
    crate::outbox::msgs(&mut ws, 3).await;
    // Rows arriving as the tenant goes: its reader is mid-batch when told
    // to stop, and stores where it got to.
    let writer = {
        let (pool, table) = (pool.clone(), table.clone());
        tokio::spawn(async move {
            for _ in 0..40 {
                sqlx::query(&format!(
                    "INSERT INTO {table} (channel, payload) SELECT 'c', jsonb_build_object('n', g) FROM generate_series(1, 500) g"
                ))
                .execute(&pool)
                .await
                .unwrap();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, _) = h
        .admin(Method::DELETE, "/admin/v1/tenants/again", None)
        .await;
    writer.await.unwrap();
    assert_eq!(s, 204);
    // Whatever the stopping reader does, it has done by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let db = format!(
        "sqlite://{}?mode=ro",
        h.data_dir.join("registry.db").display()
    );
    let registry = sqlx::SqlitePool::connect(&db).await.unwrap();
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ingest_cursors WHERE tenant_id = 'again'")
            .fetch_one(&registry)
            .await
            .unwrap();
    registry.close().await;
    assert_eq!(left, 0, "positions of the deleted tenant were stored again");
    h.stop().await;
}

/// An activation and a config change at once: the version that ends up
/// running runs with the config that ends up stored. The plugin reads its
/// config (jwt-auth's secret), so a version loaded with the config before
/// the change, and installed after it, would refuse tokens of the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_beside_a_config_change_runs_the_new_config() {
    use crate::plugins::{jwt, now_s};
    let h = spawn_host().await;
    h.tenant(json!({"id":"race","config":{"secret":"secret-0-0123456789"}}))
        .await;
    let (s, v) = h.upload_plugin("race", plugin_wasm("jwt_auth")).await;
    assert_eq!(s, 201, "{v}");
    let path = format!("/admin/v1/tenants/race/plugins/{}/activate", v["version"]);
    for round in 1..=30u64 {
        let secret = format!("secret-{round}-0123456789");
        let activate = h.admin(Method::POST, &path, None);
        let patch = h.admin(
            Method::PATCH,
            "/admin/v1/tenants/race",
            Some(json!({"config":{"secret":secret}})),
        );
        let ((s1, v1), (s2, v2)) = tokio::join!(activate, patch);
        assert_eq!((s1, s2), (200, 200), "{v1} {v2}");
        let token = jwt(json!({"sub":"a","exp":now_s()+60}), &secret);
        let admitted = h.ws_with("race", &format!("token={token}")).await;
        assert!(
            admitted.is_ok(),
            "round {round}: the running version refused a token of the stored config: {:?}",
            admitted.err()
        );
        // Off again, so the next round's activation loads anew.
        let (s, v) = h
            .admin(
                Method::POST,
                "/admin/v1/tenants/race/plugins/deactivate",
                None,
            )
            .await;
        assert_eq!(s, 200, "{v}");
    }
    h.stop().await;
}
