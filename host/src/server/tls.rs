//! Optional TLS (`--tls-cert`, `--tls-key`) for deployments without a
//! terminating proxy.
//!
//! Owns: the public listener when TLS is on. Each connection's handshake
//! (rustls, ring; bounded in number by `--max-pending-connections`, per
//! client address by `--max-pending-per-address`, and in time by
//! `--head-timeout-secs`) is done here, and the plaintext is bridged
//! over loopback to a private listener that the ordinary accept loop serves:
//! every session, limit and refusal path is the same with and without TLS.
//! Invariants: the front door sees the client's own address, not the
//! bridge's (each bridge registers its loopback address before it connects,
//! and the accept side takes that entry once); the private listener serves
//! only bridges (a connection from an address no bridge registered is
//! closed unread); a TLS session holds three sockets (client, and both ends
//! of the bridge), so the connection capacity derived from the open-files
//! limit is a third of the plaintext one; a failed handshake costs nothing
//! past its deadline; once either side of a bridge ends (the front door gave
//! up on a silent client, the session closed, the client left), the other
//! gets [`GRACE`] to finish, then both close: a client that goes silent
//! after its handshake is held no longer than the head timeout plus that.
//!
//! The trade, and why: sessions are written against `TcpStream` readiness
//! (`send`/`sendmsg` of queued frames, see session/writer.rs) so that an
//! idle session holds no buffer; TLS inside them would need a stream of its
//! own through every path. The bridge costs a TLS session two loopback
//! sockets and the copy buffers (tens of KiB): for the largest deployments a
//! terminating proxy in front stays the cheaper choice.

use crate::server::Server;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_rustls::rustls;

/// How long one direction of a bridge may go on after the other ended.
const GRACE: Duration = Duration::from_secs(2);
/// How long a bridge waits for the private listener to take it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Keep-alive probes on public TLS sockets: a peer that vanished without a
/// word is found within minutes, not hours.
const KEEPALIVE: Duration = Duration::from_secs(60);

/// The server's certificate chain and key, read and checked at start.
pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::Context as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--tls-cert {}: not PEM certificates", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("--tls-cert {}: no certificate in it", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}: no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("--tls-cert and --tls-key do not make a usable pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Where the accept loop takes TLS connections from: the private listener,
/// with each bridge's client address restored.
pub struct TlsFront {
    internal: TcpListener,
    peers: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
}

impl super::accept::Accept for TlsFront {
    async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            let (stream, bridge) = self.internal.accept().await?;
            // Only a bridge of this process: anything else on loopback that
            // found the port is dropped unread.
            if let Some(peer) = self.peers.lock().remove(&bridge) {
                return Ok((stream, peer));
            }
            crate::metrics::accept_error("tls_unknown_bridge");
        }
    }
}

/// Starts terminating TLS on `public`; returns what the accept loop reads.
pub fn start(
    app: &Arc<Server>,
    public: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> io::Result<TlsFront> {
    let internal = std::net::TcpListener::bind("127.0.0.1:0")?;
    internal.set_nonblocking(true)?;
    let internal = TcpListener::from_std(internal)?;
    let to = internal.local_addr()?;
    let peers = Arc::new(Mutex::new(HashMap::new()));
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    app.tracker
        .spawn(terminate(app.clone(), public, acceptor, to, peers.clone()));
    Ok(TlsFront { internal, peers })
}

async fn terminate(
    app: Arc<Server>,
    public: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    to: SocketAddr,
    peers: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
) {
    let mut backoff = Duration::from_millis(5);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(
        app.settings.max_pending_connections.max(1),
    ));
    let deadline = app.settings.head_timeout;
    let per_address = Arc::new(crate::tenant::PerAddress::default());
    let per_address_max = match app.settings.max_pending_per_address {
        0 => usize::MAX,
        n => n,
    };
    loop {
        let permit = tokio::select! {
            _ = app.accepting.cancelled() => return,
            p = handshakes.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (tcp, peer) = tokio::select! {
            _ = app.accepting.cancelled() => return,
            r = public.accept() => match r {
                Ok(c) => {
                    backoff = Duration::from_millis(5);
                    c
                }
                Err(e) => {
                    // As the plain accept loop: out of descriptors (or
                    // memory) is not retried in a spin.
                    tracing::debug!(error = %e, "TLS accept failed");
                    crate::metrics::accept_error("tls");
                    tokio::select! {
                        _ = app.accepting.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        // One address may have as many handshakes going as it may hold
        // doors: past that its connection is closed at once.
        let Some(claim) = Claim::new(&per_address, peer.ip(), per_address_max) else {
            crate::metrics::refused_global("address_handshakes");
            drop(tcp);
            continue;
        };
        let (acceptor, peers) = (acceptor.clone(), peers.clone());
        let send_buffer = app.settings.socket_send_buffer;
        app.tracker.spawn(async move {
            let _ = tcp.set_nodelay(true);
            let sock = socket2::SockRef::from(&tcp);
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(KEEPALIVE)
                .with_interval(Duration::from_secs(10));
            let _ = sock.set_tcp_keepalive(&keepalive);
            if let Some(n) = send_buffer {
                let _ = sock.set_send_buffer_size(n);
            }
            let Ok(Ok(mut tls)) = tokio::time::timeout(deadline, acceptor.accept(tcp)).await else {
                return;
            };
            drop((permit, claim));
            let _ = bridge(&mut tls, peer, to, &peers).await;
        });
    }
}

/// One handshake counted under its client's address until dropped.
struct Claim(Arc<crate::tenant::PerAddress>, std::net::IpAddr);

impl Claim {
    fn new(
        open: &Arc<crate::tenant::PerAddress>,
        ip: std::net::IpAddr,
        max: usize,
    ) -> Option<Claim> {
        open.claim(ip, max).then(|| Claim(open.clone(), ip))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// Carries one TLS connection's plaintext to the private listener and back,
/// until either side ends and the other has had its grace.
async fn bridge(
    tls: &mut tokio_rustls::server::TlsStream<TcpStream>,
    peer: SocketAddr,
    to: SocketAddr,
    peers: &Mutex<HashMap<SocketAddr, SocketAddr>>,
) -> io::Result<()> {
    let sock = TcpSocket::new_v4()?;
    sock.bind("127.0.0.1:0".parse().expect("an address"))?;
    let local = sock.local_addr()?;
    peers.lock().insert(local, peer);
    let mut inner = match tokio::time::timeout(CONNECT_TIMEOUT, sock.connect(to)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            peers.lock().remove(&local);
            return Err(e);
        }
        Err(_) => {
            peers.lock().remove(&local);
            return Err(io::ErrorKind::TimedOut.into());
        }
    };
    let _ = inner.set_nodelay(true);
    let (mut tls_read, mut tls_write) = tokio::io::split(tls);
    let (mut inner_read, mut inner_write) = inner.split();
    let up = async {
        let r = tokio::io::copy(&mut tls_read, &mut inner_write).await;
        let _ = inner_write.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy(&mut inner_read, &mut tls_write).await;
        let _ = tls_write.shutdown().await;
        r
    };
    tokio::pin!(up, down);
    // Copying stops at EOF or an error on either side; the other direction
    // may still finish what it carries (a response, a close frame), briefly.
    tokio::select! {
        _ = &mut up => { let _ = tokio::time::timeout(GRACE, &mut down).await; }
        _ = &mut down => { let _ = tokio::time::timeout(GRACE, &mut up).await; }
    }
    Ok(())
}
