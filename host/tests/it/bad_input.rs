//! Each kind of bad input gets its own error frame, close code or status,
//! and no other session notices.

use crate::helpers::*;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn bad_frames_get_specific_errors_and_leave_others_alone() {
    let h = spawn_host().await;
    let key = h.public_tenant("acme").await;
    let mut healthy = h.ws("acme").await;
    healthy.sub("c", 1).await;
    let mut bad = h.ws("acme").await;

    bad.send_raw(Message::Text("{not json".into())).await;
    assert_eq!(bad.next().await["code"], "bad_request");
    bad.send(json!({"op":"dance","id":4})).await;
    let e = bad.next().await;
    assert_eq!(
        (e["code"].as_str(), e["id"].as_u64()),
        (Some("unknown_op"), Some(4))
    );
    bad.send(json!({"op":"sub","ch":"no spaces","id":5})).await;
    let e = bad.next().await;
    assert_eq!(
        (e["code"].as_str(), e["id"].as_u64()),
        (Some("bad_channel"), Some(5))
    );
    bad.send(json!({"op":"sub","ch":"x".repeat(129),"id":6}))
        .await;
    assert_eq!(bad.next().await["code"], "bad_channel");
    bad.send(json!({"op":"unsub","ch":"never","id":7})).await;
    assert_eq!(bad.next().await["code"], "not_subscribed");
    bad.send_raw(Message::Binary(vec![1, 2, 3].into())).await;
    assert_eq!(bad.next().await["code"], "bad_request");

    // The healthy session is unaffected throughout.
    h.publish("acme", &key, json!({"ch":"c","data":1})).await;
    assert_eq!(healthy.next().await["seq"], 1);

    // An oversized frame closes with 1009.
    let big = "x".repeat(70_000);
    bad.send_raw(Message::Text(big.into())).await;
    let (code, reason) = bad.closed().await;
    assert_eq!(code, 1009, "{reason}");
    assert!(reason.contains("exceeds"), "{reason}");

    h.publish("acme", &key, json!({"ch":"c","data":2})).await;
    assert_eq!(healthy.next().await["seq"], 2);
    assert!(h.metric("herald_client_errors_total{tenant=\"acme\"").await >= 7.0);
    h.stop().await;
}

#[tokio::test]
async fn http_errors_name_the_problem() {
    let h = spawn_host().await;
    let key = h.public_tenant("acme").await;

    // Unknown tenant: 404 on handshake and publish.
    let err = tokio_tungstenite::connect_async(h.ws_url("nope"))
        .await
        .unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status(), 404),
        other => panic!("{other}"),
    }
    let (s, v) = h.publish("nope", &key, json!({"ch":"c","data":1})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (404, Some("not_found")));
    // Wrong or missing key: 401.
    let (s, _) = h
        .publish("acme", "pk_wrong", json!({"ch":"c","data":1}))
        .await;
    assert_eq!(s, 401);
    // Invalid bodies: 400 naming the field.
    let (s, v) = h
        .publish("acme", &key, json!({"ch":"bad channel","data":1}))
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().starts_with("ch:"),
        "{v}"
    );
    let (s, v) = h.publish("acme", &key, json!({"ch":"c"})).await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("data"),
        "{v}"
    );
    let (s, v) = h
        .publish(
            "acme",
            &key,
            json!([{"ch":"c","data":1},{"ch":"c","data":1,"extra":2}]),
        )
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("extra"),
        "{v}"
    );
    let (s, v) = h
        .publish("acme", &key, json!({"ch":"c","data":"x".repeat(70_000)}))
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().starts_with("data:"),
        "{v}"
    );
    // Nothing from the rejected batches was published.
    let (_, v) = h.publish("acme", &key, json!({"ch":"c","data":1})).await;
    assert_eq!(v["seq"], 1);

    // Admin without a token: 401; bad bodies: 400; duplicates: 409.
    let r = h.http.get(h.url("/admin/v1/tenants")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = h
        .http
        .get(h.url("/admin/v1/tenants"))
        .bearer_auth("wrong-token-wrong-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let (s, _) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({"id":"acme","access":"public"})),
        )
        .await;
    assert_eq!(s, 409);
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({"id":"Bad Id"})),
        )
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().starts_with("id:"),
        "{v}"
    );
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({"id":"x","acces":"public"})),
        )
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("acces"),
        "{v}"
    );
    let (s, v) = h
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            Some(json!({"id":"x","limits":{"queue_bytes":1}})),
        )
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue_bytes"),
        "{v}"
    );
    let (s, _) = h.admin(Method::GET, "/admin/v1/tenants/ghost", None).await;
    assert_eq!(s, 404);

    // SSE: missing or bad channels.
    assert_eq!(h.sse("acme", "", None).await.status, 400);
    assert_eq!(h.sse("acme", "ch=a%20b", None).await.status, 400);
    assert_eq!(h.sse("nope", "ch=a", None).await.status, 404);

    // Unknown routes: 404 with a JSON error.
    let r = h.http.get(h.url("/no/such/route")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");
    // A malformed request line gets 400 at once, not a hang.
    let mut raw = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut raw, b"\x01\x02 garbage\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(
        WAIT,
        tokio::io::AsyncReadExt::read_to_string(&mut raw, &mut answer),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // The OpenAPI document describes the admin and publish API.
    let doc: serde_json::Value = h
        .http
        .get(h.url("/admin/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/admin/v1/tenants"]["post"].is_object());
    assert!(doc["paths"]["/v1/t/{tenant}/publish"]["post"].is_object());
    h.stop().await;
}

#[tokio::test]
async fn plugin_access_without_plugin_fails_closed() {
    let h = spawn_host().await;
    h.tenant(json!({"id":"locked"})).await;
    let err = tokio_tungstenite::connect_async(h.ws_url("locked"))
        .await
        .unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status(), 403),
        other => panic!("{other}"),
    }
    assert_eq!(h.sse("locked", "ch=a", None).await.status, 403);
    h.stop().await;
}
