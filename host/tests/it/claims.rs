//! Claims of the README that no other file tests: the publish body's bound
//! (408), TLS 1.2 beside 1.3, Server-Sent Events over TLS, and `plugin_busy`
//! for a publish past the tenant's plugin threads and queue.

use crate::helpers::*;
use crate::tls::{self_signed, spawn_tls};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

/// README: the publish key is checked before the body is read, and "the body
/// then has 10 s to arrive, else 408" — and nothing of it is published.
#[tokio::test]
async fn a_publish_body_that_never_arrives_is_408_and_publishes_nothing() {
    let h = spawn_host().await;
    let key = h.public_tenant("slowbody").await;
    let mut ws = h.ws("slowbody").await;
    ws.sub("c", 1).await;
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let body = br#"{"ch":"c","data":1}"#;
    let head = format!(
        "POST /v1/t/slowbody/publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // Half the body, then silence.
    s.write_all(&body[..8]).await.unwrap();
    let t = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") || !answer.ends_with(b"}") {
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
            .await
            .expect("answered within the bound")
            .unwrap();
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(15)).contains(&took),
        "the body had 10 s: answered after {took:?}"
    );
    // Nothing reached the subscriber; the tenant publishes on.
    let (st, v) = h
        .publish("slowbody", &key, json!({"ch":"c","data":2}))
        .await;
    assert_eq!(st, 200, "{v}");
    let m = ws.next().await;
    assert_eq!((m["seq"].as_u64(), &m["data"]), (Some(1), &json!(2)), "{m}");
    h.stop().await;
}

/// A client that speaks only TLS 1.2 (README: "TLS 1.2 and 1.3") gets a
/// session, and Server-Sent Events run over TLS like WebSocket sessions.
#[tokio::test]
async fn tls_1_2_clients_and_sse_over_tls_are_served() {
    use rustls::pki_types::pem::PemObject;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path(), "herald");
    let h = spawn_tls(&cert, &key).await;
    let (s, v) = {
        // The admin API over the harness's plain client would fail: go
        // through TLS with the same connector shape as a 1.2-only client.
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_file_iter(&cert).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let only_12 = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(only_12));
        let tcp = TcpStream::connect(h.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector
            .connect(name, tcp)
            .await
            .expect("a TLS 1.2 handshake");
        assert_eq!(
            tls.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
        let body = json!({"id":"tls12","access":"public"}).to_string();
        let req = format!(
            "POST /admin/v1/tenants HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(req.as_bytes()).await.unwrap();
        let mut answer = String::new();
        let _ = tls.read_to_string(&mut answer).await;
        let status: u16 = answer[9..12].parse().unwrap();
        let json: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or("null"))
            .unwrap_or(Value::Null);
        (status, json)
    };
    assert_eq!(s, 201, "{v}");
    let publish_key = v["publish_key"].as_str().unwrap().to_string();

    // An SSE stream over TLS (1.3 here), then a publish over TLS: the event
    // arrives on the stream.
    let mut sse = crate::tls::tls_to(&h, &cert).await;
    sse.write_all(
        b"GET /v1/t/tls12/sse?ch=c HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n",
    )
    .await
    .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, sse.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(
        seen.to_ascii_lowercase().contains("text/event-stream"),
        "{seen}"
    );
    let mut publish = crate::tls::tls_to(&h, &cert).await;
    let body = json!({"ch":"c","data":{"over":"tls"}}).to_string();
    let req = format!(
        "POST /v1/t/tls12/publish HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {publish_key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    publish.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let _ = publish.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let deadline = Instant::now() + WAIT;
    while !seen.contains(r#"{"over":"tls"}"#) {
        assert!(Instant::now() < deadline, "no event over TLS: {seen}");
        let n = tokio::time::timeout(WAIT, sse.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    h.stop().await;
}

/// README: past `plugin_threads` calls at once and `plugin_queue` waiting, a
/// publish gets `plugin_busy` (503, nothing published) — not a wait without
/// end — and the one in the transform is published.
#[tokio::test]
async fn a_publish_past_the_plugin_threads_and_queue_is_plugin_busy() {
    let h = spawn_host().await;
    let limits = json!({"plugin_threads": 1, "plugin_queue": 0, "plugin_deadline_ms": 5000});
    let key = h
        .tenant(json!({"id":"busy","access":"public","config":{"record_ms":1500},"limits":limits}))
        .await;
    h.install_plugin("busy", "fixture_slow").await;
    let mut ws = h.ws("busy").await;
    ws.sub("c", 1).await;
    let first = {
        let (http, url, key) = (h.http.clone(), h.url("/v1/t/busy/publish"), key.clone());
        tokio::spawn(async move {
            publish_at(&http, &url, &key, json!({"ch":"c","data":"first"})).await
        })
    };
    // The first is in its 1.5 s transform on the one plugin thread.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (s, v) = h
        .publish("busy", &key, json!({"ch":"c","data":"second"}))
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("plugin_busy")),
        "{v}"
    );
    let (s, v) = first.await.unwrap();
    assert_eq!(s, 200, "{v}");
    let m = ws.next().await;
    assert_eq!(m["data"], "first", "{m}");
    h.stop().await;
}
