//! The operator's tools over REST (a channel's history, this
//! node's live connections, disconnecting a subject or a session with a
//! close code, rolling a plugin back), a browser's token in the WebSocket
//! subprotocol, and an HTTP source that goes `stalled` when its publisher
//! goes silent.

use crate::helpers::*;
use base64::Engine as _;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const TOKENS: &str =
    r#"{"tokens": {"tok-alice": {"subject": "alice"}, "tok-bob": {"subject": "bob"}}}"#;

async fn example_tenant(h: &Host, id: &str) -> String {
    let key = h
        .tenant(json!({"id": id, "access": "plugin", "config": serde_json::from_str::<Value>(TOKENS).unwrap()}))
        .await;
    h.install_plugin(id, "herald_example_rust").await;
    key
}

/// A WebSocket that offers `protocols`; the server's chosen one, or the
/// HTTP status of a refusal.
async fn ws_offering(h: &Host, tenant: &str, protocols: &str) -> Result<(Ws, Option<String>), u16> {
    let mut req = h.ws_url(tenant).into_client_request().unwrap();
    if !protocols.is_empty() {
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((s, resp)) => {
            let chosen = resp
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().unwrap().to_string());
            Ok((Ws { s }, chosen))
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("websocket: {e}"),
    }
}

fn token_protocol(token: &str) -> String {
    format!(
        "herald.v1, herald.token.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
    )
}

/// Browsers cannot set headers on a WebSocket: the token rides in the
/// subprotocol, and the server answers `herald.v1` (a browser fails a
/// handshake that offered protocols and got none back).
#[tokio::test]
async fn a_token_in_the_websocket_subprotocol_is_the_credential() {
    let h = spawn_host().await;
    example_tenant(&h, "sp").await;
    let (mut ws, chosen) = ws_offering(&h, "sp", &token_protocol("tok-alice"))
        .await
        .expect("alice's token admits her");
    assert_eq!(chosen.as_deref(), Some("herald.v1"));
    let ack = ws.sub("user.alice", 1).await;
    assert_eq!(ack["op"], "ack", "{ack}");
    ws.send(json!({"op": "sub", "ch": "user.bob", "id": 2}))
        .await;
    let denied = next_op(&mut ws, "err", WAIT).await;
    assert_eq!(
        denied["code"], "forbidden",
        "the subject is alice's: {denied}"
    );
    // A wrong token there is refused like one anywhere else.
    assert_eq!(
        ws_offering(&h, "sp", &token_protocol("tok-mallory"))
            .await
            .err(),
        Some(403)
    );
    // Not base64url: passed on as written, and refused by the plugin.
    assert_eq!(
        ws_offering(&h, "sp", "herald.v1, herald.token.tok-alice!")
            .await
            .err(),
        Some(403)
    );
    // Clients that offer nothing get no subprotocol (as before).
    h.public_tenant("pub").await;
    let (_plain, none) = ws_offering(&h, "pub", "").await.unwrap();
    assert_eq!(none, None);
    h.stop().await;
}

#[tokio::test]
async fn connections_are_listed_and_disconnected_by_subject_or_session() {
    let h = spawn_host().await;
    example_tenant(&h, "ops").await;
    let mut alice = h.ws_with("ops", "token=tok-alice").await.unwrap();
    assert_eq!(alice.sub("user.alice", 1).await["op"], "ack");
    assert_eq!(alice.sub("ticks.AAPL", 2).await["op"], "ack");
    let mut alice2 = h.ws_with("ops", "token=tok-alice").await.unwrap();
    assert_eq!(alice2.sub("public.news", 1).await["op"], "ack");
    let mut bob = h.ws_with("ops", "token=tok-bob").await.unwrap();
    assert_eq!(bob.sub("user.bob", 1).await["op"], "ack");

    let (s, list) = h
        .admin(Method::GET, "/admin/v1/tenants/ops/connections", None)
        .await;
    assert_eq!(s, 200, "{list}");
    let conns = list["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 3, "{list}");
    let first = &conns[0];
    assert_eq!(first["subject"], "alice");
    assert_eq!(first["transport"], "ws");
    assert_eq!(first["channels"], json!(["ticks.AAPL", "user.alice"]));
    assert!(first["queue_bytes"].is_u64());
    assert!(first["remote_addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert!(list["node"].is_string());
    // An unsubscribe shows at once.
    alice
        .send(json!({"op": "unsub", "ch": "ticks.AAPL", "id": 3}))
        .await;
    assert_eq!(next_op(&mut alice, "ack", WAIT).await["id"], 3);
    let (_, list) = h
        .admin(Method::GET, "/admin/v1/tenants/ops/connections", None)
        .await;
    assert_eq!(list["connections"][0]["channels"], json!(["user.alice"]));

    // One session, by its id, with the default code (4003: may reconnect).
    let bob_session = list["connections"][2]["session"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(list["connections"][2]["subject"], "bob");
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants/ops/disconnect",
            Some(json!({"session": bob_session})),
        )
        .await;
    assert_eq!(
        (s, v["disconnected"].as_u64(), v["code"].as_u64()),
        (200, Some(1), Some(4003)),
        "{v}"
    );
    assert_eq!(bob.closed().await.0, 4003);

    // Every session of a subject, with the code asked for.
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants/ops/disconnect",
            Some(json!({"subject": "alice", "code": 1008})),
        )
        .await;
    assert_eq!((s, v["disconnected"].as_u64()), (200, Some(2)), "{v}");
    assert_eq!(
        alice.closed().await,
        (1008, "disconnected by the operator".into())
    );
    assert_eq!(alice2.closed().await.0, 1008);
    let (_, list) = h
        .admin(Method::GET, "/admin/v1/tenants/ops/connections", None)
        .await;
    let left = tokio::time::timeout(WAIT, async {
        loop {
            let (_, l) = h
                .admin(Method::GET, "/admin/v1/tenants/ops/connections", None)
                .await;
            if l["connections"].as_array().unwrap().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(left.is_ok(), "closed sessions leave the list: {list}");

    // Bad requests change nothing and say why.
    for (body, want) in [
        (json!({}), "subject or the session"),
        (json!({"subject": "alice", "code": 1006}), "1006"),
        (json!({"session": "bob"}), "not a session id"),
        (json!({"subject": "alice", "colour": 1}), "unknown field"),
    ] {
        let (s, v) = h
            .admin(Method::POST, "/admin/v1/tenants/ops/disconnect", Some(body))
            .await;
        assert_eq!(s, 400, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(want),
            "{v}"
        );
    }
    let (s, _) = h
        .admin(Method::GET, "/admin/v1/tenants/nobody/connections", None)
        .await;
    assert_eq!(s, 404);
    h.stop().await;
}

/// An SSE stream is listed with its channels and ends on a disconnect.
#[tokio::test]
async fn an_sse_stream_is_listed_and_disconnected() {
    let h = spawn_host().await;
    h.public_tenant("pub").await;
    let mut sse = h.sse("pub", "ch=a&ch=b", None).await;
    let (_, list) = h
        .admin(Method::GET, "/admin/v1/tenants/pub/connections", None)
        .await;
    let c = &list["connections"][0];
    assert_eq!(
        (&c["transport"], &c["channels"], &c["subject"]),
        (&json!("sse"), &json!(["a", "b"]), &Value::Null)
    );
    let session = c["session"].as_str().unwrap();
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants/pub/disconnect",
            Some(json!({"session": session})),
        )
        .await;
    assert_eq!((s, v["disconnected"].as_u64()), (200, Some(1)));
    let ended = tokio::time::timeout(WAIT, async { while sse.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "the stream ends");
    h.stop().await;
}

#[tokio::test]
async fn history_is_read_over_rest_with_since_and_limit() {
    let h = spawn_host().await;
    let key = h.public_tenant("hist").await;
    for i in 1..=5 {
        let (s, v) = h
            .publish(
                "hist",
                &key,
                json!({"ch": "prices", "key": "k", "data": {"i": i}}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let get = |q: &str| {
        let path = format!("/admin/v1/tenants/hist/channels/prices/history{q}");
        let h = &h;
        async move { h.admin(Method::GET, &path, None).await }
    };
    let (s, all) = get("").await;
    assert_eq!(s, 200, "{all}");
    assert_eq!(
        (all["head"].as_u64(), all["oldest"].as_u64(), &all["more"]),
        (Some(5), Some(1), &json!(false))
    );
    let msgs = all["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 5);
    assert_eq!(msgs[0]["frame"]["data"], json!({"i": 1}));
    assert_eq!(msgs[4]["seq"], 5);
    assert_eq!(msgs[4]["prev"], 4);
    assert_eq!(msgs[4]["key"], "k");
    assert_eq!(msgs[4]["frame"]["op"], "msg");

    // What a client resuming from seq 2 would be replayed, two at a time.
    let (_, page) = get("?since=2&limit=2").await;
    let seqs: Vec<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!((seqs, &page["more"]), (vec![3, 4], &json!(true)));
    assert_eq!(page["epoch"], all["epoch"]);
    let (_, tail) = get("?since=5").await;
    assert_eq!(tail["messages"], json!([]));

    // The same history a subscriber resuming gets.
    let mut ws = h.ws("hist").await;
    ws.send(json!({"op": "sub", "ch": "prices", "since": 3, "epoch": all["epoch"], "id": 1}))
        .await;
    assert_eq!(next_op(&mut ws, "msg", WAIT).await["seq"], 4);

    for (q, want) in [
        ("?limit=0", 400),
        ("?limit=1001", 400),
        ("?since=x", 400),
        ("?colour=1", 400),
    ] {
        assert_eq!(get(q).await.0, want, "{q}");
    }
    let (s, v) = h
        .admin(
            Method::GET,
            "/admin/v1/tenants/hist/channels/nothing/history",
            None,
        )
        .await;
    assert_eq!((s, v["error"]["code"].as_str()), (404, Some("not_found")));
    let (s, _) = h
        .admin(
            Method::GET,
            "/admin/v1/tenants/hist/channels/bad%20name!/history",
            None,
        )
        .await;
    assert_eq!(s, 400);
    h.stop().await;
}

#[tokio::test]
async fn a_plugin_rolls_back_to_the_version_before() {
    let h = spawn_host().await;
    h.tenant(json!({"id": "rb", "access": "public"})).await;
    let (s, v) = h
        .admin(Method::POST, "/admin/v1/tenants/rb/plugins/rollback", None)
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{v}"
    );
    let v1 = h.install_plugin("rb", "ticker_conflate").await;
    let v2 = h.install_plugin("rb", "redact").await;
    let (s, v) = h
        .admin(Method::POST, "/admin/v1/tenants/rb/plugins/rollback", None)
        .await;
    assert_eq!(
        (s, v["active"].as_i64(), v["previous"].as_i64()),
        (200, Some(v1), Some(v2)),
        "{v}"
    );
    // Survives a restart (the registry holds it), and a second rollback undoes the first.
    let h = h.restart().await;
    let (s, v) = h
        .admin(Method::POST, "/admin/v1/tenants/rb/plugins/rollback", None)
        .await;
    assert_eq!((s, v["active"].as_i64()), (200, Some(v2)), "{v}");
    // Activating the active version again does not lose the one before.
    h.activate("rb", v2).await;
    let (_, v) = h
        .admin(Method::POST, "/admin/v1/tenants/rb/plugins/rollback", None)
        .await;
    assert_eq!(v["active"].as_i64(), Some(v1), "{v}");
    h.stop().await;
}

/// An HTTP source with `stall_after_ms` goes `stalled` when nothing was
/// published for that long and `live` again on the next publish; every
/// subscriber is told both.
#[tokio::test]
async fn a_silent_http_publisher_stalls_its_source() {
    let h = spawn_host().await;
    let key = h.public_tenant("quiet").await;
    let (s, v) = h
        .admin(
            Method::PUT,
            "/admin/v1/tenants/quiet/source",
            Some(json!({"kind": "http", "stall_after_ms": 300})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let mut ws = h.ws("quiet").await;
    assert_eq!(ws.sub("a", 1).await["op"], "ack");
    let stalled = next_op(&mut ws, "status", Duration::from_secs(3)).await;
    assert_eq!(stalled["state"], "stalled", "{stalled}");
    let (_, src) = h
        .admin(Method::GET, "/admin/v1/tenants/quiet/source", None)
        .await;
    assert_eq!(src["health"]["state"], "stalled");
    // A session connecting now is told at once.
    let mut late = h.ws("quiet").await;
    assert_eq!(next_op(&mut late, "status", WAIT).await["state"], "stalled");
    let (s, _) = h
        .publish("quiet", &key, json!({"ch": "a", "data": 1}))
        .await;
    assert_eq!(s, 200);
    let live = next_op(&mut ws, "status", WAIT).await;
    assert_eq!(live["state"], "live", "{live}");
    assert_eq!(next_op(&mut ws, "msg", WAIT).await["data"], 1);
    // Out of range is refused and changes nothing.
    let (s, _) = h
        .admin(
            Method::PUT,
            "/admin/v1/tenants/quiet/source",
            Some(json!({"kind": "http", "stall_after_ms": 5})),
        )
        .await;
    assert_eq!(s, 400);
    let (_, src) = h
        .admin(Method::GET, "/admin/v1/tenants/quiet/source", None)
        .await;
    assert_eq!(src["source"]["stall_after_ms"], 300);
    h.stop().await;
}

/// `--demo`: the page at `/`, the client at `/herald.js`, and ticks from
/// the built-in publisher through the publish path.
#[tokio::test]
async fn the_demo_serves_its_page_and_publishes_ticks() {
    let mut opts = HostOptions::new();
    opts.config.demo_tenant = true;
    opts.config.demo_interval = Some(Duration::from_millis(50));
    let h = spawn_with(opts).await;
    let page = h.http.get(h.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let js = h.http.get(h.url("/herald.js")).send().await.unwrap();
    assert!(js.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let mut ws = h.ws("demo").await;
    assert_eq!(ws.sub("ticks.AAPL", 1).await["op"], "ack");
    let m = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(m["data"]["sym"], "AAPL", "{m}");
    assert!(m["data"]["px"].is_f64());
    let next = next_op(&mut ws, "msg", WAIT).await;
    assert_eq!(next["prev"], m["seq"]);
    // Without --demo there is no page.
    let plain = spawn_host().await;
    assert_eq!(
        plain
            .http
            .get(plain.url("/"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    plain.stop().await;
    h.stop().await;
}
