//! Each kind of bad input gets its own error frame, close code or status,
//! and no other session notices.

use crate::helpers::*;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn bad_frames_get_specific_errors_and_leave_others_alone() {
    let h = spawn_host().await;
    let key = h.public_tenant("bad-frames").await;
    let mut healthy = h.ws("bad-frames").await;
    healthy.sub("c", 1).await;
    let mut bad = h.ws("bad-frames").await;

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
    h.publish("bad-frames", &key, json!({"ch":"c","data":1}))
        .await;
    assert_eq!(healthy.next().await["seq"], 1);

    // An oversized frame closes with 1009.
    let big = "x".repeat(70_000);
    bad.send_raw(Message::Text(big.into())).await;
    let (code, reason) = bad.closed().await;
    assert_eq!(code, 1009, "{reason}");
    assert!(reason.contains("exceeds"), "{reason}");

    h.publish("bad-frames", &key, json!({"ch":"c","data":2}))
        .await;
    assert_eq!(healthy.next().await["seq"], 2);
    assert!(
        h.metric("herald_client_errors_total{tenant=\"bad-frames\"")
            .await
            >= 7.0
    );
    h.stop().await;
}

#[tokio::test]
async fn http_errors_name_the_problem() {
    let h = spawn_host().await;
    let key = h.public_tenant("acme").await;

    // Unknown tenant: 401 on the handshake (as a tenant refusing a caller
    // without credentials: tests/it/probing.rs).
    let err = tokio_tungstenite::connect_async(h.ws_url("nope"))
        .await
        .unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status(), 401),
        other => panic!("{other}"),
    }
    // Publish: an unknown tenant and a wrong key get the same 401, so tenant
    // ids cannot be probed with it.
    let (s, unknown) = h.publish("nope", &key, json!({"ch":"c","data":1})).await;
    let (s2, wrong) = h
        .publish("acme", "pk_wrong", json!({"ch":"c","data":1}))
        .await;
    assert_eq!((s, s2), (401, 401));
    assert_eq!(unknown, wrong);
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
    assert_eq!(h.sse("nope", "ch=a", None).await.status, 401);

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
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status(), 401),
        other => panic!("{other}"),
    }
    assert_eq!(h.sse("locked", "ch=a", None).await.status, 401);
    // With credentials, the reason.
    assert_eq!(h.sse("locked", "ch=a&token=t", None).await.status, 403);
    h.stop().await;
}

/// A publish is answered on its key before its body is read: a
/// wrong key announcing 4,000,000 bytes and sending none gets its 401 at once
/// (before, the server waited for the body for as long as it did not come).
#[tokio::test]
async fn a_wrong_key_is_answered_before_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = spawn_host().await;
    h.public_tenant("bodyless").await;
    for tenant in ["bodyless", "nope"] {
        let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
        let head = format!(
            "POST /v1/t/{tenant}/publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer pk_wrong\r\n\
             Content-Type: application/json\r\nContent-Length: 4000000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 512];
        let n = tokio::time::timeout(std::time::Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("an answer without the body")
            .unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 401"), "{tenant}: {text}");
    }
    h.stop().await;
}

/// `/metrics` lists every tenant id; with `--metrics-token` it
/// answers only a request that carries the token.
#[tokio::test]
async fn metrics_can_require_a_token() {
    let mut opts = HostOptions::new();
    opts.config.metrics_token = Some("metrics-token-0123456789".into());
    let h = spawn_with(opts).await;
    h.public_tenant("secret-tenant").await;
    let url = h.url("/metrics");
    for wrong in [None, Some("metrics-token-wrong")] {
        let mut req = h.http.get(&url);
        if let Some(t) = wrong {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert!(!r.text().await.unwrap().contains("secret-tenant"));
    }
    let r = h
        .http
        .get(&url)
        .bearer_auth("metrics-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("herald_connection_capacity"));
    h.stop().await;
}

/// A request head is at most 16 KiB, on the first request of a
/// connection and on every later one of a kept-alive connection (hyper's
/// own default took ~400 KB), and one that arrives whole in one write too.
#[tokio::test]
async fn request_heads_are_capped_at_16_kib_on_every_request() {
    use tokio::io::AsyncWriteExt;
    let h = spawn_host().await;
    let big = |n: usize| {
        format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(n)
        )
    };
    // Whole, in one write, on a first request.
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.write_all(big(20 * 1024).as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 431, "a first request");
    // The second request of a kept-alive connection.
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.write_all(big(10).as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    s.write_all(big(100 * 1024).as_bytes()).await.unwrap();
    assert_eq!(
        read_response(&mut s).await.status,
        431,
        "a kept-alive request"
    );
    // Just under the cap is fine, on both.
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.write_all(big(15 * 1024).as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    s.write_all(big(15 * 1024).as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    h.stop().await;
}

/// Reads server frames off `s` until a close frame; returns its code.
async fn close_code_of(s: &mut tokio::net::TcpStream) -> u16 {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("a close frame within 10 s")
            .unwrap();
        assert!(n > 0, "the connection ended without a close frame");
        buf.extend_from_slice(&chunk[..n]);
        while let Some(head) =
            herald::proto::ws::decode_frame(&mut buf, herald::proto::ws::Role::FromServer, 1 << 20)
                .unwrap()
        {
            let payload = buf[head.payload_start..head.frame_len()].to_vec();
            buf.drain(..head.frame_len());
            if head.opcode == herald::proto::ws::OpCode::Close {
                return u16::from_be_bytes([payload[0], payload[1]]);
            }
        }
    }
}

/// A live, subscribed session that sends a frame with a reserved bit set is
/// closed with 1002 (protocol error); one that sends text that is not UTF-8,
/// with 1007. (The Autobahn suite checks the same on an echoing session.)
#[tokio::test]
async fn a_live_session_is_closed_with_1002_and_1007_for_what_the_protocol_forbids() {
    use tokio::io::AsyncWriteExt;
    let h = spawn_host().await;
    h.public_tenant("codes").await;
    let mask = [0x11u8, 0x22, 0x33, 0x44];
    let masked = |first: u8, payload: &[u8]| {
        let mut f = vec![first, 0x80 | payload.len() as u8];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    };
    for (frame, want) in [
        // FIN + RSV1 + text: no extension was negotiated.
        (masked(0xC1, b"{}"), 1002),
        // FIN + text, an invalid UTF-8 sequence.
        (
            masked(0x81, &[0xce, 0xba, 0xe1, 0xbd, 0xb9, 0xcf, 0x83, 0xff]),
            1007,
        ),
    ] {
        let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
        let mut req = ws_upgrade_request("codes", "").into_bytes();
        req.extend(client_text_frame(r#"{"op":"sub","ch":"c","id":1}"#));
        s.write_all(&req).await.unwrap();
        assert_eq!(read_response(&mut s).await.status, 101);
        s.write_all(&frame).await.unwrap();
        assert_eq!(close_code_of(&mut s).await, want);
    }
    h.stop().await;
}
