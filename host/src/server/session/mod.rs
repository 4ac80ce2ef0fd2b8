//! The socket half of a session: reading client frames, writing queued frames.
//! This file: how a session ends ([`End`], close codes and reasons), a
//! client's subscribe rights (the plugin's grant, authorize-subscribe).
//!
//! Owns: one connection after its handshake, for WebSocket (`ws.rs`: its
//! turns; `ws/reader.rs`: frames and client ops) and SSE (`sse.rs`: one-way
//! stream, `id:` positions) alike; both run as a hand-polled task
//! (`task.rs`), write through the same writer (`writer.rs`) and end through
//! [`End`]. Invariants: an idle session holds no read or write buffer, no
//! timer and no future of its own (reads go through a stack buffer inside a
//! synchronous step; a partial frame is the only thing kept); everything
//! queued is written with as few `send`/`sendmsg` calls as possible; the session
//! never waits on anything but its own socket, its queue and, while a
//! subscription is asked about, its plugin's verdict; on every exit path it
//! leaves all channels and releases its slot.

mod sse;
mod task;
mod writer;
mod ws;

pub use sse::{run_sse, SseRequest};
pub use writer::LAG_PACE;
pub use ws::run_ws;

use crate::fanout::session::QueueClose;
use crate::plugin::active::ActivePlugin;
use crate::plugin::Grant;
use crate::proto::ws::close;
use crate::tenant::{Access, Tenant};
use std::sync::Arc;

/// Most bytes read from one socket before yielding to other sessions.
const READ_BUDGET: usize = 64 * 1024;

/// Why a session ended; decides the close frame and the metric label.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// The peer closed the connection or sent a close frame.
    PeerClosed(Option<u16>),
    /// The host closes with this code and reason.
    Close(u16, String),
    /// The socket failed; nothing more can be sent.
    Io,
}

impl End {
    fn label(&self) -> &'static str {
        match self {
            End::PeerClosed(_) => "peer",
            End::Io => "io_error",
            End::Close(code, _) => match *code {
                close::GOING_AWAY | close::SERVICE_RESTART => "shutdown",
                close::TENANT_GONE => "tenant_gone",
                close::SLOW_CONSUMER => "slow_consumer",
                close::HEARTBEAT_TIMEOUT => "heartbeat_timeout",
                close::DISCONNECTED => "disconnected",
                close::TOO_BIG => "too_big",
                _ => "protocol",
            },
        }
    }
}

fn queue_end(reason: QueueClose, policy: &str) -> End {
    match reason {
        QueueClose::SlowConsumer => End::Close(
            close::SLOW_CONSUMER,
            format!("slow consumer: outbound queue full (policy {policy})"),
        ),
        QueueClose::Ended => End::Close(close::NORMAL, String::new()),
        QueueClose::GoingAway => End::Close(close::GOING_AWAY, "server shutting down".into()),
        QueueClose::Draining => End::Close(
            close::SERVICE_RESTART,
            "node draining: reconnect and resume with since/epoch".into(),
        ),
        QueueClose::TenantGone => End::Close(
            close::TENANT_GONE,
            "tenant removed or its access changed".into(),
        ),
        QueueClose::Reauthorize => End::Close(
            close::REAUTHORIZE,
            "what admitted this session changed: reconnect to be authorized again".into(),
        ),
        QueueClose::Disconnected(code) => End::Close(code, "disconnected by the operator".into()),
        QueueClose::Silent => End::Close(
            close::HEARTBEAT_TIMEOUT,
            "no frame from client within the heartbeat timeout".into(),
        ),
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubRefusal {
    /// The plugin (or the absence of one) said no: (code, message).
    Denied(String, String),
    /// The tenant's plugin threads and queue were full: try again later.
    Busy,
    /// The plugin failed; the subscription fails closed. Carries the error
    /// kind (`PluginError::kind`).
    Failed(&'static str),
}

/// What the host can say about a subscription before asking a plugin.
enum SubCheck {
    Allowed,
    Refused(SubRefusal),
    AskPlugin(Arc<ActivePlugin>),
}

/// Public tenants, and plugins without the hook, allow everything; a
/// "plugin" tenant without an active plugin refuses.
fn check_subscribe(tenant: &Tenant) -> SubCheck {
    if tenant.settings().access == Access::Public {
        return SubCheck::Allowed;
    }
    match tenant.plugin() {
        None => SubCheck::Refused(SubRefusal::Denied(
            "no_active_plugin".into(),
            "the tenant has no active plugin".into(),
        )),
        Some(p) if !p.info.hooks.authorize_subscribe => SubCheck::Allowed,
        Some(p) => SubCheck::AskPlugin(p),
    }
}

async fn ask_plugin(
    tenant: &Tenant,
    p: Arc<ActivePlugin>,
    session: Option<Arc<Grant>>,
    channel: &str,
) -> Result<(), SubRefusal> {
    let session = session.unwrap_or_else(|| {
        Arc::new(Grant {
            subject: "anonymous".into(),
            audience: None,
            attributes: Vec::new(),
        })
    });
    match p
        .authorize_subscribe_async(session, channel.to_string())
        .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(d)) => Err(SubRefusal::Denied(d.code, d.message)),
        Err(e) => {
            tenant
                .metrics
                .plugin_failure("authorize_subscribe", e.kind());
            if matches!(e, crate::plugin::PluginError::Busy(_)) {
                return Err(SubRefusal::Busy);
            }
            tracing::warn!(tenant = %tenant.id, kind = e.kind(), error = %e.for_log(), "authorize-subscribe failed; subscription refused");
            Err(SubRefusal::Failed(e.kind()))
        }
    }
}

/// Asks whether `session` may subscribe to `channel` (the tenant's plugin
/// decides for "plugin" tenants).
pub async fn authorize_subscribe(
    tenant: &Tenant,
    session: Option<Arc<Grant>>,
    channel: &str,
) -> Result<(), SubRefusal> {
    match check_subscribe(tenant) {
        SubCheck::Allowed => Ok(()),
        SubCheck::Refused(r) => Err(r),
        SubCheck::AskPlugin(p) => ask_plugin(tenant, p, session, channel).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Admitted;
    use tokio::net::TcpStream;

    /// The state a session task keeps for its whole life. Idle memory per
    /// connection is this plus the socket registration and the shared handle,
    /// so it is guarded here; the benchmark measures the whole process.
    /// The size is the task's (`Task<WsSession>`, `Task<SseSession>`): it is
    /// the same in debug and release builds, having no `async fn` inside.
    #[tokio::test]
    async fn session_futures_stay_small() {
        let app = crate::server::Server::for_tests().await;
        let tenant = crate::tenant::tests::public_tenant("t");
        let slot = app.capacity.acquire(&tenant).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let fut = run_ws(
            app.clone(),
            stream,
            Vec::new(),
            Admitted {
                slot,
                session: None,
                remote: None,
                origin: None,
                deflate: None,
            },
        );
        let ws = std::mem::size_of_val(&fut);
        drop(fut);
        let slot = app.capacity.acquire(&tenant).unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let req = SseRequest {
            channels: vec!["a".into()],
            resume: None,
            unreadable_id: false,
            cors: Vec::new(),
        };
        let sse = std::mem::size_of_val(&run_sse(
            app.clone(),
            stream,
            req,
            Admitted {
                slot,
                session: None,
                remote: None,
                origin: None,
                deflate: None,
            },
        ));
        eprintln!("session futures: ws {ws} B, sse {sse} B");
        // The rest of a connection's memory that is ours (bench idle
        // measures the whole): the shared handle (its Arc counts included),
        // the tenant registry's weak slot.
        let handle = std::mem::size_of::<crate::fanout::session::SessionHandle>() + 16;
        let slot = std::mem::size_of::<
            Option<std::sync::Weak<crate::fanout::session::SessionHandle>>,
        >() + 8;
        eprintln!("per connection besides the future: handle {handle} B, registry slot {slot} B");
        // tokio's task cell is aligned to 128 bytes: its header (32), the
        // scheduler and id (16), the task tracker's token (8) and its trailer
        // (48) around the future. Up to 400 bytes the whole task takes 512
        // (it took 1,408 when a session was an `async fn` with a timer and
        // two wait futures: 1,280 bytes).
        assert!(ws <= 400, "websocket session future is {ws} bytes");
        assert!(sse <= 400, "sse session future is {sse} bytes");
    }
}
