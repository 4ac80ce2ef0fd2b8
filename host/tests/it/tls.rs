//! Optional TLS (`--tls-cert`, `--tls-key`). A WebSocket and an
//! HTTP publish over TLS with a certificate the client trusts; the operator
//! sees the client's own address (not the loopback bridge's); plaintext on
//! the TLS port gets nothing; a key that does not match is refused at start.

use crate::helpers::*;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

pub(crate) fn self_signed(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

pub(crate) fn connector(cert: &Path) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

pub(crate) async fn tls_to(
    h: &Host,
    cert: &Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector(cert)
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// A host serving TLS with `cert`, once it is ready (the harness's
/// readiness poll is plain HTTP: this one polls over TLS).
pub(crate) async fn spawn_tls(cert: &Path, key: &Path) -> Host {
    let mut opts = HostOptions::new();
    opts.config.tls = Some((cert.to_path_buf(), key.to_path_buf()));
    let h = spawn_unchecked(opts);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut s = tls_to(&h, cert).await;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer).await;
        if answer.starts_with("HTTP/1.1 200") {
            return h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready over TLS: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sessions_and_publishes_run_over_tls() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path(), "herald");
    let h = spawn_tls(&cert, &key).await;
    let mut admin = tls_to(&h, &cert).await;
    let body = json!({"id": "sec", "access": "public"}).to_string();
    admin
        .write_all(
            format!(
                "POST /admin/v1/tenants HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    admin.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let created: serde_json::Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let key = created["publish_key"].as_str().unwrap().to_string();

    let tls = tls_to(&h, &cert).await;
    let local = tls.get_ref().0.local_addr().unwrap();
    let (s, _) = tokio_tungstenite::client_async("wss://localhost/v1/t/sec/ws", tls)
        .await
        .expect("a WebSocket over TLS");
    let mut ws = WsOver { s };
    ws.send(json!({"op": "sub", "ch": "a", "id": 1})).await;
    assert_eq!(ws.next_op("ack").await["ch"], "a");

    let mut publish = tls_to(&h, &cert).await;
    let body = json!({"ch": "a", "data": {"over": "tls"}}).to_string();
    publish
        .write_all(
            format!(
                "POST /v1/t/sec/publish HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    publish.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(ws.next_op("msg").await["data"], json!({"over": "tls"}));

    // The operator sees the client's address, not the bridge's.
    let mut list = tls_to(&h, &cert).await;
    list.write_all(
        format!("GET /admin/v1/tenants/sec/connections HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = String::new();
    list.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.contains(&format!("\"remote_addr\":\"{local}\"")),
        "{local}: {answer}"
    );

    // Plaintext on the TLS port is not served.
    let mut plain = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut got)).await;
    assert!(!String::from_utf8_lossy(&got).contains("ok"), "{got:?}");
    h.stop().await;
}

#[tokio::test]
async fn a_key_that_does_not_match_its_certificate_is_refused_at_start() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, _) = self_signed(certs.path(), "one");
    let (_, other_key) = self_signed(certs.path(), "two");
    let dir = tempfile::tempdir().unwrap();
    let mut config = herald::config::Config::for_data_dir(dir.path());
    config.admin_token = Some(ADMIN.into());
    config.tls = Some((cert, other_key));
    let listener = herald::bind("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
    let err = herald::run(config, listener, std::future::pending())
        .await
        .expect_err("refused");
    assert!(
        format!("{err:#}").contains("--tls-cert and --tls-key"),
        "{err:#}"
    );
}

/// A WebSocket over any stream (the harness's `Ws` is over plain TCP).
struct WsOver<S> {
    s: tokio_tungstenite::WebSocketStream<S>,
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> WsOver<S> {
    async fn send(&mut self, v: serde_json::Value) {
        use futures_util::SinkExt;
        self.s
            .send(tokio_tungstenite::tungstenite::Message::Text(
                v.to_string().into(),
            ))
            .await
            .unwrap();
    }

    async fn next_op(&mut self, op: &str) -> serde_json::Value {
        use futures_util::StreamExt;
        loop {
            let m = tokio::time::timeout(WAIT, self.s.next())
                .await
                .expect("a frame in time")
                .expect("open")
                .unwrap();
            if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                if v["op"] == op {
                    return v;
                }
            }
        }
    }
}

/// 300 clients that finish the TLS handshake and then go silent, never
/// closing, are not held for ever: once the front door gives up on them
/// (the head timeout), the bridge closes too, within a short grace. Counted
/// on a Herald process of its own: its open descriptors come back down.
#[tokio::test]
async fn silent_tls_clients_are_not_held_for_ever() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path(), "herald");
    let data = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--admin-token",
            ADMIN,
            "--log",
            "warn",
            "--head-timeout-secs",
            "1",
        ])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--data-dir")
        .arg(data.path())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let handshake = || async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector(&cert).connect(name, tcp).await.ok()
    };
    let deadline = tokio::time::Instant::now() + WAIT * 2;
    loop {
        if let Some(mut s) = handshake().await {
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            if out.starts_with(b"HTTP/1.1 200") {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "herald did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = fds();
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(handshake().await.expect("handshake"));
    }
    let held = fds();
    let since = std::time::Instant::now();
    assert!(
        held >= before + 300,
        "the connections are held: {before} → {held}"
    );
    // The head timeout (1 s), the bridge's grace, and a margin.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(8);
    loop {
        let now = fds();
        if now <= before + 5 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} descriptors still held for 300 silent clients ({before} before)",
            now - before
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // BENCHMARKS.md, "Hostile tenants, round 2".
    eprintln!(
        "FIGURE silent TLS (300 clients, handshake then nothing, head timeout 1 s): server descriptors {before} → {held} → back within 5 of {before} {:?} after",
        since.elapsed()
    );
    drop(silent);
    let _ = child.kill().await;
}

/// The admin token never crosses a network in clear. The CLI
/// speaks TLS (trusting the system's roots, or `--ca-cert`), refuses a
/// certificate it cannot verify, and will not send the token over plain
/// HTTP to anything but loopback unless told to (`--allow-http`).
#[tokio::test]
async fn the_cli_speaks_tls_and_keeps_the_token_off_plain_http() {
    use crate::cli_admin::herald_at;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path(), "herald");
    let h = spawn_tls(&cert, &key).await;
    let url = format!("https://localhost:{}", h.addr.port());
    let trusted = [("HERALD_CA_CERT", cert.to_str().unwrap())];
    let o = herald_at(&url, Some(ADMIN), &trusted, None, &["tenant", "list"]).await;
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    let o = herald_at(&url, Some(ADMIN), &[], None, &["tenant", "list"]).await;
    assert_ne!(o.code, Some(0), "an unverified certificate was trusted");
    assert!(o.stderr.contains("certificate"), "{}", o.stderr);
    h.stop().await;

    let far = "http://herald.invalid:8080";
    let o = herald_at(far, Some(ADMIN), &[], None, &["tenant", "list"]).await;
    assert_ne!(o.code, Some(0));
    assert!(o.stderr.contains("--allow-http"), "{}", o.stderr);
}
