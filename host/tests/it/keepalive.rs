//! A kept-alive connection is not a door held for good. It serves
//! at most `server::http::MAX_REQUESTS` requests (the last answered with
//! `Connection: close`) and lives at most `max_connection_age`; with TLS, one
//! address cannot hold more handshakes than it may hold doors.

use crate::frontdoor::closed_within;
use crate::helpers::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

#[tokio::test]
async fn a_kept_alive_connection_serves_a_bounded_number_of_requests() {
    let h = spawn_host().await;
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let mut served = 0;
    for _ in 0..2000 {
        s.write_all(HEALTHZ).await.unwrap();
        let r = read_response(&mut s).await;
        assert_eq!(r.status, 200);
        served += 1;
        if r.header("connection") == Some("close") {
            break;
        }
    }
    assert_eq!(served, 1000, "requests on one connection");
    assert!(closed_within(&mut s, Duration::from_secs(2))
        .await
        .is_some());
    h.stop().await;
}

#[tokio::test]
async fn a_kept_alive_connection_lives_a_bounded_time() {
    let mut opts = HostOptions::new();
    opts.config.max_connection_age = Duration::from_secs(1);
    let h = spawn_with(opts).await;
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    // Busy all along: a request every 100 ms never lets it go idle.
    let t = std::time::Instant::now();
    let mut closed = false;
    let mut buf = [0u8; 4096];
    while t.elapsed() < Duration::from_secs(4) {
        if s.write_all(HEALTHZ).await.is_err() {
            closed = true;
            break;
        }
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("an answer or a close")
            .unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        if n == 0 || answer.contains("connection: close") {
            closed = n == 0
                || closed_within(&mut s, Duration::from_secs(2))
                    .await
                    .is_some();
            break;
        }
        assert!(answer.starts_with("http/1.1 200"), "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed, "open after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    h.stop().await;
}

/// With TLS, handshakes are bounded per client address as doors are: past
/// `--max-pending-per-address` handshakes in progress, another connection
/// from that address is closed at once; other addresses still get theirs.
#[tokio::test]
async fn one_address_cannot_take_every_tls_handshake() {
    use crate::tls::{self_signed, tls_to};
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path(), "herald");
    let mut opts = HostOptions::new();
    opts.config.tls = Some((cert.clone(), key));
    opts.config.max_pending_connections = 16;
    opts.config.max_pending_per_address = 3;
    opts.config.head_timeout = Duration::from_secs(10);
    let h = spawn_unchecked(opts);
    let addr = h.addr;
    let from = |ip: &'static str| async move { connect_from(ip, addr).await.unwrap() };
    // Handshakes that never send a ClientHello.
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(from("127.0.0.5").await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = from("127.0.0.5").await;
    assert!(
        closed_within(&mut fourth, Duration::from_secs(1))
            .await
            .is_some(),
        "a fourth handshake from the same address is closed at once"
    );
    // Another address completes its handshake and is served.
    let mut s = tls_to(&h, &cert).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(idle);
    h.stop().await;
}

/// At the bound on doors (sockets not yet sessions), a new connection is
/// not parked in the listen backlog behind sockets that dribble or idle:
/// the oldest door is closed for it (slow ones are the oldest), and the
/// newcomer is served.
#[tokio::test]
async fn at_the_door_bound_the_oldest_door_makes_way() {
    let mut opts = HostOptions::new();
    opts.config.max_pending_connections = 4;
    opts.config.max_pending_per_address = 0;
    opts.config.head_timeout = Duration::from_secs(10);
    let h = spawn_with(opts).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(h.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = std::time::Instant::now();
    let mut fresh = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    fresh
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(3), fresh.read_to_string(&mut answer))
        .await
        .expect("served, not parked behind idle sockets")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The oldest idle socket made way.
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(1))
            .await
            .is_some(),
        "the oldest door was closed"
    );
    h.stop().await;
}
