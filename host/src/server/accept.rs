//! The accept loop: counts each socket from accept (a `DoorSlot`), waits
//! in the listen backlog while as many as allowed are not sessions, and
//! backs off 5 ms → 1 s on accept errors (EMFILE and the like), counted by
//! kind, instead of spinning.

use super::front_door;
use super::inline_wake::InlineWake;
use crate::metrics;
use crate::server::Server;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Accepts until the node stops accepting (drain or shutdown). Each
/// connection runs on the app's task tracker.
pub async fn accept_loop(app: Arc<Server>, listener: TcpListener, router: axum::Router) {
    accept_from(app, listener, router).await
}

/// The accept loop over TLS connections (`--tls-cert`): the plaintext of
/// each, bridged by `tls.rs`, with its client's address.
pub async fn accept_tls(app: Arc<Server>, front: super::tls::TlsFront, router: axum::Router) {
    accept_from(app, front, router).await
}

/// Where connections come from: the listener, or a test's stand-in that
/// fails the way an exhausted process does.
pub(super) trait Accept {
    fn accept(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    fn accept(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send {
        TcpListener::accept(self)
    }
}

/// The accept loop over any [`Accept`].
pub(super) async fn accept_from(app: Arc<Server>, listener: impl Accept, router: axum::Router) {
    let mut backoff = Duration::from_millis(5);
    let mut last_warn: Option<tokio::time::Instant> = None;
    let mut last_full: Option<tokio::time::Instant> = None;
    loop {
        // Counted from here until it is a session or gone. While as many
        // sockets as allowed are not sessions yet (slowloris, idle kept-alive
        // connections, a storm of handshakes), the oldest of them is closed
        // to make way: a new connection waits in the listen backlog only
        // until then (or, with no door left to close, until a socket goes).
        let door = loop {
            if let Some(d) = app.capacity.enter() {
                break Some(d);
            }
            if app.capacity.evict_oldest() {
                metrics::refused_global("door_evicted");
            }
            if last_full.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                tracing::warn!(pending = app.capacity.doors(), "as many sockets as allowed are not sessions yet; the oldest make way for new connections");
                last_full = Some(tokio::time::Instant::now());
            }
            tokio::select! {
                _ = app.accepting.cancelled() => break None,
                _ = app.capacity.door_freed(Duration::from_millis(50)) => {}
            }
        };
        let Some(door) = door else { break };
        let accepted = tokio::select! {
            _ = app.accepting.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(5);
                let mut door = door;
                if !door.claim(peer.ip()) {
                    // One address holds as many doors as it may: closed at
                    // once, so the others' doors stay free.
                    metrics::refused_global("address_doors");
                    drop(stream);
                    continue;
                }
                let app2 = app.clone();
                let router = router.clone();
                // Hyper wakes its task from inside its poll on every request
                // (inline_wake.rs): polled again there, not handed to another worker.
                app.tracker.spawn(InlineWake::new(front_door(
                    app2, stream, peer, router, door,
                )));
            }
            Err(e) => {
                let kind = classify_accept_error(&e);
                metrics::accept_error(kind);
                if kind == "aborted" {
                    continue;
                }
                if last_warn.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                    tracing::warn!(error = %e, kind, backoff_ms = backoff.as_millis() as u64, "accept failed; backing off");
                    last_warn = Some(tokio::time::Instant::now());
                }
                tokio::select! {
                    _ = app.accepting.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn classify_accept_error(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        // EMFILE and ENFILE: out of file descriptors (process, system).
        Some(24) => "emfile",
        Some(23) => "enfile",
        // ENOBUFS, ENOMEM.
        Some(105) | Some(12) => "no_memory",
        _ => match e.kind() {
            io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted => "aborted",
            _ => "other",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener that first fails like a process out of descriptors.
    struct Exhausted {
        real: TcpListener,
        errors_left: AtomicUsize,
        calls: Arc<AtomicUsize>,
    }

    impl Accept for Exhausted {
        async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self
                .errors_left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(io::Error::from_raw_os_error(24));
            }
            self.real.accept().await
        }
    }

    /// Accept errors back off (5, 10, 20, 40, 80 ms) instead of
    /// spinning, are classified, and the loop serves again afterwards.
    #[tokio::test]
    async fn emfile_backs_off_then_serves() {
        let app = Server::for_tests().await;
        let real = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = real.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let listener = Exhausted {
            real,
            errors_left: AtomicUsize::new(5),
            calls: calls.clone(),
        };
        assert_eq!(
            classify_accept_error(&io::Error::from_raw_os_error(24)),
            "emfile"
        );
        let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let started = std::time::Instant::now();
        let task = tokio::spawn(accept_from(app.clone(), listener, router));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).await.unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(150), "backed off: {took:?}");
        // Five failures, the accept that served and the one waiting now:
        // no spinning.
        let n = calls.load(Ordering::Relaxed);
        assert!((6..=7).contains(&n), "{n} accept calls");
        app.accepting.cancel();
        task.await.unwrap();
    }
}
