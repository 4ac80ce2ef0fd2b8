//! A session's task, polled by hand: the session's state, its socket and its
//! connection slot, and nothing else while it waits.
//!
//! Invariant: a waiting session holds no future of its own. Its waits are
//! registrations others keep (the handle keeps the task's waker, the
//! socket's registration its reader's and writer's: [`super::writer::poll_wake`]),
//! its heartbeat is the node's (`SessionHandle::beat`), and the rare waits
//! (a plugin's verdict, the last words before close) are boxed only while
//! they run. An `async fn` would keep its arguments beside its locals and
//! every wait's future beside both; this is what makes an idle connection
//! cost what `bench idle` reports.

use super::writer::{finish, poll_wake, Unwritten, Wake};
use super::End;
use crate::fanout::session::SessionHandle;
use crate::tenant::{ConnectionSlot, Tenant};
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::Ready;
use tokio::net::TcpStream;

/// Turns one poll of a session may take before it lets the worker run
/// other tasks (a queue that keeps being pushed to would never let it go).
const TURNS_PER_POLL: usize = 32;

/// What the task needs of a kind of session (WebSocket, SSE).
pub(super) trait Serve: Unpin {
    /// Its handle and its backlog: what its waits are polled on.
    fn waits(&self) -> (&SessionHandle, &Unwritten);

    /// Work of its own that comes before its waits (WebSocket: the frames
    /// that came with the handshake, a plugin's verdict): `Ready(None)`
    /// when there is none.
    fn poll_own(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Result<(), End>>> {
        Poll::Ready(None)
    }

    /// Its queue changed or it was closed.
    fn on_woken(&mut self, stream: &TcpStream) -> Result<(), End>;

    /// Its socket can take the backlog, or has bytes to read.
    fn on_ready(&mut self, stream: &TcpStream, ready: Ready) -> Result<(), End>;

    /// What its parking reads and changes: whether it told its handle it is
    /// parked, its backlog, its handle and its tenant.
    fn parking(&mut self) -> (&mut bool, &mut Unwritten, &Arc<SessionHandle>, &Tenant);

    /// Takes what is queued and writes it, framed for its wire.
    fn take_and_send(&mut self, stream: &TcpStream) -> Result<(), End>;

    /// On a wake-up: a writer held off for a lagging reader was released
    /// (the pacer unparked the handle, or a close woke it early), so the
    /// handle is told it is no longer parked.
    fn unhold(&mut self) {
        let (parked, out, handle, _) = self.parking();
        if out.end_hold() {
            handle.park(false);
            *parked = false;
        }
    }

    /// After every turn: a backlog waits for the socket, or the writer
    /// holds off for a lagging reader: parked, pushes need not wake it (the
    /// drained socket or the pacer will). Unparked, what was pushed
    /// meanwhile woke nobody, so it is taken now.
    fn repark(&mut self, stream: &TcpStream) -> Result<(), End> {
        loop {
            let (parked, out, handle, tenant) = self.parking();
            let park = out.parks();
            if park != *parked {
                *parked = park;
                handle.park(park);
                if !park {
                    self.take_and_send(stream)?;
                    continue;
                }
            }
            // A lagging reader: parked above, woken by the pacer.
            if out.take_new_hold() {
                tenant.metrics.lagging.increment(1);
                tenant.sessions.hold(handle);
            }
            return Ok(());
        }
    }

    /// Leaves its channels and its tenant's registry, counts the end, and
    /// returns what must still be written: the backlog and the last frame.
    fn leave(&mut self, end: &End) -> (Unwritten, Option<Bytes>);
}

/// One turn of a session: its own work, or else what its waits found, then
/// its parking. `Pending` with the waits registered with `cx`.
fn turn<S: Serve>(s: &mut S, cx: &mut Context<'_>, stream: &TcpStream) -> Poll<Result<(), End>> {
    let step = match ready!(s.poll_own(cx)) {
        Some(step) => step,
        None => {
            let (handle, out) = s.waits();
            match ready!(poll_wake(cx, handle, stream, out)) {
                Ok(Wake::Queue) => s.on_woken(stream),
                Ok(Wake::Socket(ready)) => s.on_ready(stream, ready),
                Err(end) => Err(end),
            }
        }
    };
    Poll::Ready(step.and_then(|()| s.repark(stream)))
}

/// A session's task: serves until the session ends, then writes its last
/// words (bounded) and lets its slot go.
pub(super) struct Task<S> {
    session: S,
    /// Taken by the last words.
    stream: Option<TcpStream>,
    /// Let go with the task, after the last words.
    _slot: ConnectionSlot,
    closing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<S: Serve> Task<S> {
    pub(super) fn new(session: S, stream: TcpStream, slot: ConnectionSlot) -> Task<S> {
        Task {
            session,
            stream: Some(stream),
            _slot: slot,
            closing: None,
        }
    }
}

impl<S: Serve> Future for Task<S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if let Some(closing) = &mut this.closing {
            // The slot is let go with the task, after the last words.
            return closing.as_mut().poll(cx);
        }
        let Some(stream) = &this.stream else {
            return Poll::Ready(());
        };
        for _ in 0..TURNS_PER_POLL {
            match ready!(turn(&mut this.session, cx, stream)) {
                Ok(()) => {}
                Err(end) => {
                    let (out, last) = this.session.leave(&end);
                    let stream = this
                        .stream
                        .take()
                        .expect("the stream is there until the end");
                    this.closing = Some(Box::pin(finish(stream, out, last)));
                    return Pin::new(this).poll(cx);
                }
            }
        }
        // Busy: let the worker run others, and come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
