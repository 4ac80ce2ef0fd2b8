//! An SSE session: a one-way stream of events whose `id:` carries every
//! channel's position, a comment every heartbeat (queued by the node's
//! heartbeat through its handle), input read and dropped.
//!
//! Invariant: the `id:` of each message lists, for every channel in request
//! order, the last position of that channel written to the stream (or, before
//! its first, what the client resumed from), so `Last-Event-ID` resumes them
//! all, however the stream was cut.

use super::task::{Serve, Task};
use super::writer::{flush, load_and_flush, Framing, Unwritten};
use super::{queue_end, End, READ_BUDGET};
use crate::clock::now_ms;
use crate::fanout::queue::Wire;
use crate::fanout::session::{Channels, SessionHandle, SessionInfo};
use crate::fanout::Published;
use crate::proto::{self, sse, ws::close};
use crate::server::Admitted;
use crate::server::Server;
use crate::tenant::Tenant;
use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use std::future::Future;
use std::io;
use std::sync::Arc;
use tokio::net::TcpStream;

/// An SSE session's channels (in request order) and the positions it sent;
/// a stream of one channel keeps both inline.
pub struct SseState {
    channels: Channels,
    positions: SmallVec<[(u64, u64); 1]>,
}

impl SseState {
    /// Moves `m`'s channel to its position and appends the `id:` line that
    /// follows the event.
    pub(super) fn write_id_after(&mut self, m: &Published, ids: &mut BytesMut) {
        if let Some(i) = self.channels.iter().position(|c| **c == *m.ch) {
            self.positions[i] = (m.epoch, m.seq);
        }
        sse::write_id_line(ids, &self.positions);
    }
}

/// What an SSE request asked for, validated by the front door.
pub struct SseRequest {
    pub channels: Vec<String>,
    /// Positions from `Last-Event-ID`, one per channel.
    pub resume: Option<Vec<(u64, u64)>>,
    /// A `Last-Event-ID` came that this stream cannot read (another channel
    /// count, not Herald's): each channel starts live after a `gap` over
    /// everything before it.
    pub unreadable_id: bool,
    /// CORS headers of the response (the tenant's allowed origins).
    pub cors: Vec<(&'static str, String)>,
}

/// Runs an SSE stream until it ends. The response head was already written.
/// The stream's state is made here, before its task: what the request and
/// the handshake handed over is not kept in it.
pub fn run_sse(
    app: Arc<Server>,
    stream: TcpStream,
    req: SseRequest,
    admitted: Admitted,
) -> impl Future<Output = ()> + Send {
    let Admitted {
        slot,
        session,
        remote,
        origin,
        deflate: _,
    } = admitted;
    let tenant = slot.tenant.clone();
    let settings = tenant.settings();
    let audience = session
        .as_ref()
        .and_then(|s| s.audience.as_deref())
        .map(Arc::from);
    let info = SessionInfo::new(session.as_ref().map(|s| s.subject.as_str()), remote, origin);
    drop(session);
    let handle = SessionHandle::with_info(
        Wire::Sse,
        settings.limits.queue_bytes,
        settings.limits.slow_consumer,
        audience,
        info,
    );
    let history = settings.limits.history();
    drop(settings);
    tenant.metrics.opened_sse.increment(1);
    let mut state = SseState {
        channels: Channels::new(),
        positions: SmallVec::new(),
    };
    handle.deliver_raw(Bytes::from_static(b"retry: 2000\n\n"));
    for (i, ch) in req.channels.iter().enumerate() {
        let resume = req.resume.as_ref().map(|r| (r[i].1, Some(r[i].0)));
        let r = tenant
            .hub
            .subscribe(ch, &handle, resume, history, now_ms() as u64, |_, _| {});
        // Until this channel's first frame is written, the id carries what
        // the client already had: its replay (and gap) may still be queued
        // behind other channels' frames, and a stream cut before it is
        // written must bring it again. A fresh subscription has nothing to
        // replay: it starts live, at the head.
        let start = match &req.resume {
            Some(p) if p[i].0 == r.epoch => p[i].1,
            Some(_) => 0,
            None => r.head,
        };
        if req.unreadable_id && r.head > 0 {
            handle.deliver_ctrl("gap", &proto::encode_gap(ch, 1, r.head));
        }
        state.positions.push((r.epoch, start));
        state.channels.push(r.name.clone());
        handle.add_channel(r.name);
    }
    // What the request held is not kept for the stream's life.
    drop(req);
    tenant
        .metrics
        .subscriptions
        .increment(state.channels.len() as f64);
    let out = Unwritten::default();
    // Shutdown, deletion and access changes close the session through its
    // handle: no waiter of its own, no lock per frame.
    let registration = tenant.sessions.register(&handle);
    if let Some(status) = crate::source::status_for_new_session(&app.sources, &tenant) {
        handle.deliver_ctrl("status", &status);
    }
    let session = SseSession {
        tenant,
        handle,
        state,
        out,
        registration,
        parked: false,
    };
    Task::new(session, stream, slot)
}

/// Everything an SSE stream keeps besides its socket and slot.
struct SseSession {
    tenant: Arc<Tenant>,
    handle: Arc<SessionHandle>,
    state: SseState,
    out: Unwritten,
    /// Its key in the tenant's session registry.
    registration: usize,
    /// Told the handle it is parked (a backlog waits for the socket).
    parked: bool,
}

impl Serve for SseSession {
    fn waits(&self) -> (&SessionHandle, &Unwritten) {
        (&self.handle, &self.out)
    }

    fn parking(&mut self) -> (&mut bool, &mut Unwritten, &Arc<SessionHandle>, &Tenant) {
        (&mut self.parked, &mut self.out, &self.handle, &self.tenant)
    }

    /// Takes what is queued and writes it, each message with its id line.
    fn take_and_send(&mut self, stream: &TcpStream) -> Result<(), End> {
        let framing = Framing::Sse(&mut self.state);
        load_and_flush(stream, &self.handle, &mut self.out, &self.tenant, framing)
    }

    /// The socket can take the backlog, or has input to drop.
    fn on_ready(&mut self, stream: &TcpStream, ready: tokio::io::Ready) -> Result<(), End> {
        if ready.is_writable() && !self.out.is_empty() {
            flush(stream, &mut self.out, &self.tenant)?;
            if self.out.is_empty() {
                self.take_and_send(stream)?;
            }
        }
        if ready.is_readable() {
            discard_input(stream)?;
        }
        Ok(())
    }

    /// The queue changed: send it (unless a backlog waits for the socket),
    /// or end if it was closed. Also while the socket is full: a close from
    /// outside must not wait for it.
    fn on_woken(&mut self, stream: &TcpStream) -> Result<(), End> {
        self.unhold();
        if let Some(reason) = self.handle.close_reason().filter(|r| !r.after_backlog()) {
            return Err(queue_end(reason, self.handle.policy().as_str()));
        }
        if self.out.is_empty() {
            self.take_and_send(stream)?;
        }
        Ok(())
    }

    /// Leaves every channel and the tenant's registry, counts the end, and
    /// returns the backlog and the last event: an SSE stream ends by
    /// closing, and a reason travels as a `close` event.
    fn leave(&mut self, end: &End) -> (Unwritten, Option<Bytes>) {
        let tenant = &self.tenant;
        for ch in &self.state.channels {
            tenant.hub.unsubscribe(ch, &self.handle);
        }
        tenant
            .metrics
            .subscriptions
            .decrement(self.state.channels.len() as f64);
        self.handle.close();
        tenant.sessions.deregister(self.registration);
        tenant.metrics.closed(end.label());
        let last = match end {
            End::Close(code, reason) if *code != close::NORMAL => {
                let json = format!(
                    "{{\"op\":\"close\",\"code\":{code},\"reason\":{}}}",
                    serde_json::Value::String(reason.clone())
                );
                Some(sse::encode_event("close", &json))
            }
            _ => None,
        };
        (std::mem::take(&mut self.out), last)
    }
}

/// An SSE client sends nothing after its request; read and drop anything it
/// does send, and notice when it goes away.
fn discard_input(stream: &TcpStream) -> Result<(), End> {
    let mut buf = [0u8; 512];
    let mut total = 0;
    while total < READ_BUDGET {
        match stream.try_read(&mut buf) {
            Ok(0) => return Err(End::PeerClosed(None)),
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(_) => return Err(End::Io),
        }
    }
    Ok(())
}
