//! An SSE session: a one-way stream of events whose `id:` carries every
//! channel's position, a comment every heartbeat, input read and dropped.
//!
//! Invariant: the `id:` of each message lists, for every channel in request
//! order, the last position of that channel written to the stream (or, before
//! its first, what the client resumed from), so `Last-Event-ID` resumes them
//! all, however the stream was cut.

use super::writer::{finish, flush, interest, load_and_flush, Framing, Unwritten};
use super::{queue_end, End, READ_BUDGET};
use crate::clock::now_ms;
use crate::fanout::queue::Wire;
use crate::fanout::session::{SessionHandle, SessionInfo};
use crate::fanout::Published;
use crate::proto::{self, sse, ws::close};
use crate::server::Admitted;
use crate::server::Server;
use bytes::{Bytes, BytesMut};
use std::io;
use std::sync::Arc;
use tokio::net::TcpStream;

/// An SSE session's channels (in request order) and the positions it sent.
pub struct SseState {
    channels: Vec<Arc<str>>,
    positions: Vec<(u64, u64)>,
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
pub async fn run_sse(app: Arc<Server>, stream: TcpStream, req: SseRequest, admitted: Admitted) {
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
        channels: Vec::with_capacity(req.channels.len()),
        positions: Vec::new(),
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
        state.channels.push(ch.as_str().into());
        handle.add_channel(ch);
    }
    tenant
        .metrics
        .subscriptions
        .increment(state.channels.len() as f64);
    let mut out = Unwritten::default();
    // Shutdown, deletion and access changes close the session through its
    // handle: no waiter of its own, no lock per frame.
    let registration = tenant.sessions.register(&handle);
    if let Some(status) = crate::source::status_for_new_session(&app.sources, &tenant) {
        handle.deliver_ctrl("status", &status);
    }
    let heartbeat = app.settings.heartbeat;
    let hb = tokio::time::sleep(heartbeat);
    tokio::pin!(hb);
    let mut end = None;
    let mut parked = false;
    while end.is_none() {
        tokio::select! {
            biased;
            r = stream.ready(interest(&out)) => {
                end = match r {
                    Ok(ready) if ready.is_writable() && !out.is_empty() => flush(&stream, &mut out, &tenant)
                        .and_then(|()| if out.is_empty() { load_and_flush(&stream, &handle, &mut out, &tenant, Framing::Sse(&mut state)) } else { Ok(()) })
                        .err(),
                    Ok(_) => None,
                    Err(_) => Some(End::Io),
                };
                if end.is_none() && r.is_ok_and(|ready| ready.is_readable()) {
                    end = discard_input(&stream).err();
                }
            }
            // Also while the socket is full: a close from outside must not wait for it.
            _ = handle.woken() => {
                if out.end_hold() {
                    // The pacer unparked the handle (or a close woke it early).
                    handle.park(false);
                    parked = false;
                }
                if let Some(reason) = handle.close_reason().filter(|r| !r.after_backlog()) {
                    end = Some(queue_end(reason, handle.policy().as_str()));
                } else if out.is_empty() {
                    end = load_and_flush(&stream, &handle, &mut out, &tenant, Framing::Sse(&mut state)).err();
                }
            }
            _ = &mut hb => {
                handle.deliver_raw(Bytes::from_static(sse::HEARTBEAT));
                hb.as_mut().reset(tokio::time::Instant::now() + heartbeat);
            }
        }
        // A backlog waits for the socket, or the writer holds off for a
        // lagging reader: parked, pushes need not wake the stream.
        // Unparked, what was pushed meanwhile woke nobody: take it.
        while end.is_none() && out.parks() != parked {
            parked = out.parks();
            handle.park(parked);
            if parked {
                break;
            }
            end = load_and_flush(
                &stream,
                &handle,
                &mut out,
                &tenant,
                Framing::Sse(&mut state),
            )
            .err();
        }
        if end.is_none() && out.take_new_hold() {
            tenant.metrics.lagging.increment(1);
            tenant.sessions.hold(&handle);
        }
    }
    let end = end.expect("loop exits only with an end");
    for ch in &state.channels {
        tenant.hub.unsubscribe(ch, &handle);
    }
    tenant
        .metrics
        .subscriptions
        .decrement(state.channels.len() as f64);
    handle.close();
    tenant.sessions.deregister(registration);
    tenant.metrics.closed(end.label());
    // An SSE stream ends by closing; a reason travels as a last event.
    let last = match &end {
        End::Close(code, reason) if *code != close::NORMAL => {
            let json = format!(
                "{{\"op\":\"close\",\"code\":{code},\"reason\":{}}}",
                serde_json::Value::String(reason.clone())
            );
            Some(sse::encode_event("close", &json))
        }
        _ => None,
    };
    finish(stream, out, last).await;
    drop(slot);
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
