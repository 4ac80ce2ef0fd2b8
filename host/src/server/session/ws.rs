//! A WebSocket session: frames from the client (ops, pings, close), frames to
//! it through the shared writer; the node's heartbeat pings it through its
//! handle (`SessionHandle::beat`), so it keeps no timer.
//!
//! Invariants: frames are decoded and acted on in order, a subscription that
//! waits for the plugin stops decoding until it is settled; a client silent
//! for two heartbeats is closed with 4002 within a third, one that answers
//! pings never is.

use super::task::{Serve, Task};
use super::writer::{flush, load_and_flush, send_queued, Deflate, Framing, Unwritten};
use super::{ask_plugin, check_subscribe, queue_end, End, SubCheck, SubRefusal, READ_BUDGET};
use crate::clock::{mono_ms, now_ms};
use crate::fanout::queue::Wire;
use crate::fanout::session::{SessionHandle, SessionInfo};
use crate::plugin::active::ActivePlugin;
use crate::plugin::Grant;
use crate::proto::ws::{self, close, Assembler, FrameError, Message, Role};
use crate::proto::{self, ClientOp, ErrorCode};
use crate::ratelimit::{OpBudget, OpVerdict};
use crate::server::Admitted;
use crate::server::Server;
use crate::tenant::Tenant;
use bytes::Bytes;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::Ready;
use tokio::net::TcpStream;

mod reader;

/// What a session needs from its tenant, copied once at connect.
struct SessionLimits {
    /// How long a frame (or a fragmented message) may take to complete.
    frame_deadline: Duration,
    max_subscriptions: usize,
    max_channels: usize,
    max_message_bytes: usize,
    ops_per_sec: f64,
    ops_burst: u32,
    /// The Autobahn testee (`--echo-tenant`): text and binary messages are
    /// sent back as they came instead of being read as client operations.
    echo: bool,
    /// permessage-deflate, as agreed in the handshake.
    deflate: Option<Deflate>,
}

/// State of a WebSocket session's reader.
struct WsReader {
    /// Bytes of a frame that has not fully arrived; empty (no allocation) when idle.
    partial: Vec<u8>,
    /// Since when a frame or message has been incomplete (a dribbling
    /// client holds its buffer only until the deadline).
    incomplete_since: Option<Instant>,
    assembler: Assembler,
    /// Who the tenant's plugin said this connection is.
    session: Option<Arc<Grant>>,
    /// Client operations left (every text, binary and ping frame costs one).
    ops: OpBudget,
}

/// A subscription waiting for the plugin's answer; the reader stops
/// decoding until it is settled, so frames keep their order.
struct PendingSub {
    ch: String,
    since: Option<u64>,
    epoch: Option<u64>,
    id: Option<u64>,
    plugin: Arc<ActivePlugin>,
}

/// A subscription's plugin round trip, boxed while it runs (a session that
/// waits for nothing else holds no room for it); it gives the subscription
/// back with its verdict.
type Asking = Pin<Box<dyn Future<Output = (PendingSub, Result<(), SubRefusal>)> + Send>>;

/// Runs a WebSocket session until it ends. `early` holds bytes the client
/// sent right after its handshake request. The session is made here, before
/// its task: what the handshake handed over is not kept in it.
pub fn run_ws(
    app: Arc<Server>,
    stream: TcpStream,
    early: Vec<u8>,
    admitted: Admitted,
) -> impl Future<Output = ()> + Send {
    let Admitted {
        slot,
        session,
        remote,
        origin,
        deflate,
    } = admitted;
    let s = WsSession::open(
        &app,
        slot.tenant.clone(),
        session,
        early,
        (remote, origin),
        deflate,
    );
    Task::new(s, stream, slot)
}

/// Everything a WebSocket session keeps besides its socket and slot.
struct WsSession {
    tenant: Arc<Tenant>,
    handle: Arc<SessionHandle>,
    limits: SessionLimits,
    reader: WsReader,
    out: Unwritten,
    /// Its key in the tenant's session registry.
    registration: usize,
    /// Told the handle it is parked (a backlog waits for the socket).
    parked: bool,
    /// The frames that came with the handshake were acted on.
    started: bool,
    /// A subscription waits for the plugin: nothing more is decoded (or
    /// waited for) until it is settled, so frames keep their order.
    asking: Option<Asking>,
}

impl WsSession {
    /// Makes the session's queue, registers it with its tenant and queues
    /// the source's status if it is stalled.
    fn open(
        server: &Server,
        tenant: Arc<Tenant>,
        session: Option<Arc<Grant>>,
        early: Vec<u8>,
        (remote, origin): (Option<std::net::SocketAddr>, Option<Box<str>>),
        deflate: Option<crate::proto::deflate::Agreed>,
    ) -> WsSession {
        let frame_deadline = server.settings.head_timeout;
        let sources = &server.sources;
        let echo = server.settings.echo_tenant.as_deref() == Some(&*tenant.id);
        let settings = tenant.settings();
        let ops_burst = settings.limits.client_ops_burst;
        let limits = SessionLimits {
            frame_deadline,
            max_subscriptions: settings.limits.max_subscriptions,
            max_channels: settings.limits.max_channels,
            max_message_bytes: settings.limits.max_message_bytes,
            ops_per_sec: settings.limits.client_ops_per_sec,
            ops_burst: settings.limits.client_ops_burst,
            echo,
            deflate: deflate.and_then(|a| {
                let min = settings.limits.deflate_min_bytes.min(u32::MAX as usize) as u32;
                Some(Deflate {
                    window_bits: a.server_window_bits,
                    min_bytes: std::num::NonZeroU32::new(min)?,
                })
            }),
        };
        let audience = session
            .as_ref()
            .and_then(|s| s.audience.as_deref())
            .map(Arc::from);
        let info = SessionInfo::new(session.as_ref().map(|s| s.subject.as_str()), remote, origin);
        let handle = SessionHandle::with_info(
            Wire::Ws,
            settings.limits.queue_bytes,
            settings.limits.slow_consumer,
            audience,
            info,
        );
        drop(settings);
        tenant.metrics.opened_ws.increment(1);
        // Shutdown, deletion and access changes close the session through its
        // handle: no waiter of its own, no lock per frame.
        let registration = tenant.sessions.register(&handle);
        if let Some(status) = crate::source::status_for_new_session(sources, &tenant) {
            handle.deliver_ctrl("status", &status);
        }
        WsSession {
            tenant,
            handle,
            limits,
            reader: WsReader {
                partial: early,
                incomplete_since: None,
                assembler: Assembler::default(),
                session,
                ops: OpBudget::new(ops_burst, Instant::now()),
            },
            out: Unwritten::default(),
            registration,
            parked: false,
            started: false,
            asking: None,
        }
    }

    /// Asks the plugin about a subscription that waits for it.
    fn ask(&mut self, pending: Option<PendingSub>) {
        let Some(sub) = pending else { return };
        let (tenant, grant) = (self.tenant.clone(), self.reader.session.clone());
        self.asking = Some(Box::pin(async move {
            let verdict = ask_plugin(&tenant, sub.plugin.clone(), grant, &sub.ch).await;
            (sub, verdict)
        }));
    }

    /// The frames that came with the handshake, or those that followed a
    /// subscription the plugin just settled: decoded now.
    fn resume(&mut self) -> Result<(), End> {
        let pending = self
            .reader
            .resume(&self.tenant, &self.handle, &self.limits)?;
        self.ask(pending);
        Ok(())
    }
}

impl Serve for WsSession {
    fn waits(&self) -> (&SessionHandle, &Unwritten) {
        (&self.handle, &self.out)
    }

    fn parking(&mut self) -> (&mut bool, &mut Unwritten, &Arc<SessionHandle>, &Tenant) {
        (&mut self.parked, &mut self.out, &self.handle, &self.tenant)
    }

    /// Takes what is queued and writes it (compressed as agreed).
    fn take_and_send(&mut self, stream: &TcpStream) -> Result<(), End> {
        let framing = Framing::Ws(self.limits.deflate);
        load_and_flush(stream, &self.handle, &mut self.out, &self.tenant, framing)
    }

    /// The queue changed: send what it holds, unless a backlog is still
    /// waiting for the socket, or end if it was closed.
    fn on_woken(&mut self, stream: &TcpStream) -> Result<(), End> {
        // The heartbeat's ping wakes it too: a frame left incomplete is
        // timed at least that often.
        self.reader.check_incomplete(self.limits.frame_deadline)?;
        self.unhold();
        let policy = self.handle.policy();
        if self.out.is_empty() {
            match self.handle.take_or_close() {
                Ok(items) => send_queued(
                    stream,
                    items,
                    &mut self.out,
                    &self.tenant,
                    Framing::Ws(self.limits.deflate),
                ),
                Err(reason) => Err(queue_end(reason, policy.as_str())),
            }
        } else {
            // Going away waits for the backlog: `on_ready` ends it once sent.
            match self.handle.close_reason() {
                Some(reason) if !reason.after_backlog() => Err(queue_end(reason, policy.as_str())),
                _ => Ok(()),
            }
        }
    }

    /// The socket can take bytes (write the backlog) or has some (read and
    /// act on client frames).
    fn on_ready(&mut self, stream: &TcpStream, ready: Ready) -> Result<(), End> {
        if ready.is_writable() && !self.out.is_empty() {
            flush(stream, &mut self.out, &self.tenant)?;
            // Once the backlog is out, send what queued meanwhile: its
            // wake-up may already have been used.
            if self.out.is_empty() {
                self.take_and_send(stream)?;
            }
        }
        if ready.is_readable() {
            let (got, pending) =
                self.reader
                    .on_readable(stream, &self.tenant, &self.handle, &self.limits)?;
            if got {
                self.handle.heard(mono_ms());
            }
            self.reader.check_incomplete(self.limits.frame_deadline)?;
            self.ask(pending);
        }
        Ok(())
    }

    fn poll_own(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<(), End>>> {
        if !self.started {
            self.started = true;
            return Poll::Ready(Some(self.resume()));
        }
        let Some(asking) = &mut self.asking else {
            return Poll::Ready(None);
        };
        let (sub, verdict) = ready!(asking.as_mut().poll(cx));
        self.asking = None;
        self.reader
            .complete_sub(sub, verdict, &self.tenant, &self.handle);
        Poll::Ready(Some(self.resume()))
    }

    /// Leaves every channel and the tenant's registry, counts the end, and
    /// returns the backlog and the close frame to send.
    fn leave(&mut self, end: &End) -> (Unwritten, Option<Bytes>) {
        let tenant = &self.tenant;
        let subs = self.handle.take_channels();
        for ch in &subs {
            tenant.hub.unsubscribe(ch, &self.handle);
        }
        tenant.metrics.subscriptions.decrement(subs.len() as f64);
        self.handle.close();
        tenant.sessions.deregister(self.registration);
        tenant.metrics.closed(end.label());
        tracing::debug!(tenant = %tenant.id, reason = end.label(), "websocket session ended");
        let last = match end {
            End::Close(code, reason) => Some(ws::encode_close(*code, reason)),
            End::PeerClosed(Some(code)) => Some(ws::encode_close(*code, "")),
            End::PeerClosed(None) => Some(ws::encode_close(close::NORMAL, "")),
            End::Io => None,
        };
        (std::mem::take(&mut self.out), last)
    }
}
