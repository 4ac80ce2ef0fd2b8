//! Admin changes on every node: propagation, a cut registry connection, the periodic reconcile.

use super::*;

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
        let ws = tokio::sync::Mutex::new(other.subscriber("cl-admin", "ticks").await);
        let tick = json!({"ch":"ticks","data":{"sym":"X","px":1}});
        within(
            PROPAGATION,
            "the plugin activated on B running on A and C",
            || async {
                assert_eq!(other.publish("cl-admin", &fresh, tick.clone()).await.0, 200);
                msgs(&mut *ws.lock().await, 1).await[0]["data"]
                    .get("last")
                    .is_some()
            },
        )
        .await;
    }

    // The nodes view (README: id, version, address, last heartbeat, `alive`,
    // the plugin version each runs per tenant): every node reports, with
    // its next heartbeat, the version it now runs.
    let heartbeat = Duration::from_secs(2);
    within(
        3 * heartbeat,
        "each node reports the plugin it runs",
        || async {
            let view = a.admin(Method::GET, "/admin/v1/nodes", json!({})).await.1;
            let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
            nodes.len() == 3
                && nodes.iter().all(|n| {
                    n["plugins"]["cl-admin"] == version
                        && n["alive"] == true
                        && n["version"] == env!("CARGO_PKG_VERSION")
                        && n["address"].is_string()
                })
        },
    )
    .await;

    // Deleted through C: sessions on A and B are closed with 4000.
    let mut on_a = a.subscriber("cl-admin", "x").await;
    let mut on_b = b.subscriber("cl-admin", "x").await;
    let (s, _) = c
        .admin(Method::DELETE, "/admin/v1/tenants/cl-admin", json!({}))
        .await;
    assert_eq!(s, 204);
    for other in [a, b] {
        within(
            PROPAGATION,
            "the tenant deleted on C gone from A and B (an unknown tenant: 401)",
            || async { other.ws("cl-admin", "").await.err().map(|e| e.0) == Some(401) },
        )
        .await;
    }
    // How soon is checked above; this wait only bounds a loaded machine's
    // delivery of the close.
    for ws in [&mut on_a, &mut on_b] {
        let closed = tokio::time::timeout(Duration::from_secs(10), ws.closed())
            .await
            .expect("closed");
        assert_eq!(closed.0, 4000);
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
    // A node that stops heartbeating turns `alive: false` after three missed
    // heartbeats (6 s), and stays listed.
    let mut n = n;
    let killed = n.pop().unwrap().kill().await;
    let a = &n[0];
    let took = within(
        4 * heartbeat,
        "the killed node shown as not alive",
        || async {
            let view = a.admin(Method::GET, "/admin/v1/nodes", json!({})).await.1;
            view["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["id"] == "c" && n["alive"] == false)
        },
    )
    .await;
    assert!(took >= 2 * heartbeat, "not alive after {took:?}: too soon");
    drop(killed);
    reg.finish(n).await;
}

/// A loopback proxy to the registry that the test can cut and restore.
pub(super) struct Cut {
    pub(super) addr: SocketAddr,
    open: Arc<AtomicBool>,
    conns: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Cut {
    pub(super) async fn new(target: SocketAddr) -> Cut {
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

    pub(super) fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self.conns.lock().drain(..) {
            c.abort();
        }
    }

    pub(super) fn restore(&self) {
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
    let (proxy, via_proxy) = reg.cut_proxy().await;
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
        a.ws("cl-gone", "").await.err().map(|e| e.0) == Some(401)
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
                && a.ws("cl-quiet2", "").await.err().map(|e| e.0) == Some(401)
        },
    )
    .await;
    db.close().await;
    reg.finish([a]).await;
}
