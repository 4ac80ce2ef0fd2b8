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

use super::writer::{finish, Unwritten};
use super::End;
use crate::tenant::ConnectionSlot;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::net::TcpStream;

/// Turns one poll of a session may take before it lets the worker run
/// other tasks (a queue that keeps being pushed to would never let it go).
const TURNS_PER_POLL: usize = 32;

/// What the task needs of a kind of session (WebSocket, SSE).
pub(super) trait Serve: Unpin {
    /// One turn: acts on what is ready and returns `Continue`, waits
    /// (`Pending`, with the waits registered with `cx`), or ends.
    fn turn(&mut self, cx: &mut Context<'_>, stream: &TcpStream) -> Poll<Turn>;

    /// Leaves its channels and its tenant's registry, counts the end, and
    /// returns what must still be written: the backlog and the last frame.
    fn leave(&mut self, end: &End) -> (Unwritten, Option<Bytes>);
}

/// What one turn of a session did.
pub(super) enum Turn {
    /// It acted; the next turn may find more to do.
    Continue,
    /// The session ended.
    End(End),
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
            match ready!(this.session.turn(cx, stream)) {
                Turn::Continue => {}
                Turn::End(end) => {
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
