//! The shared half of a session: its bounded outbound queue, the signal
//! that wakes its writer, and its heartbeat (pings, the silence rule).
//!
//! Owns: what channels and the session's own reader push, and the decision
//! (through [`OutQueue`]) of what a full queue does. Invariants: a push never
//! blocks on I/O; once a session is closed nothing more is queued; the writer
//! is woken for every push that changed the queue, unless it is parked (a
//! backlog waits for its full socket: it takes the queue once the socket
//! drains, so a stalled reader costs a push under its policy and no
//! wake-up); a close always wakes it. The socket half lives in
//! `server::session`.

use super::queue::{Item, OutQueue, PushOutcome, Queued, SlowConsumer, Wire};
use super::Published;
use bytes::Bytes;
use herald_proto::{sse, ws};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// Why the host is closing a session from the queue side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueClose {
    /// The queue overflowed under the `disconnect` policy, or a single frame
    /// was larger than the whole queue.
    SlowConsumer,
    /// The session ended for another reason (the client left).
    Ended,
    /// The server is shutting down (close 1001).
    GoingAway,
    /// The node drains for a deploy (close 1012): the client should
    /// reconnect — the load balancer sends it to another node — and resume.
    Draining,
    /// The tenant was deleted or its access changed (close 4000).
    TenantGone,
    /// What admitted the session changed: its plugin version, the config
    /// the plugin reads, the allowed origins (close 4004, reconnect).
    Reauthorize,
    /// An operator disconnected it (`POST …/disconnect`) with this close code.
    Disconnected(u16),
    /// A WebSocket client sent nothing, not even a pong, for two heartbeats
    /// (close 4002; see [`SessionHandle::beat`]).
    Silent,
}

impl QueueClose {
    /// The session sends what it has queued before it closes.
    pub fn after_backlog(self) -> bool {
        matches!(self, QueueClose::GoingAway | QueueClose::Draining)
    }
}

/// What delivering one message to one session did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Queued,
    Conflated(usize),
    DroppedOldest(usize),
    /// This push closed the session; it should leave the channel.
    Disconnected,
    /// The session was already closed.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    queue: OutQueue,
    closed: Option<QueueClose>,
    /// The channels it is subscribed to (the session's reader keeps it; the
    /// operator's connection list reads it).
    channels: Channels,
    /// The writer waits for its socket with a backlog (see [`SessionHandle::park`]).
    parked: bool,
    /// A wake-up its writer has not taken yet ([`SessionHandle::poll_woken`]).
    woken: bool,
    /// The writer's task, while it waits; taken by the wake-up.
    waker: Option<Waker>,
}

impl State {
    /// Records a wake-up; the waker to wake once the lock is let go.
    fn wake(&mut self) -> Option<Waker> {
        self.woken = true;
        self.waker.take()
    }
}

/// Wakes the writer outside the handle's lock.
fn wake(w: Option<Waker>) {
    if let Some(w) = w {
        w.wake();
    }
}

/// The frame that pings a WebSocket client (it answers with a pong).
const PING: &[u8] = &[0x89, 0x00];

/// A session's channels, by the names the hub's channels hold. Most
/// sessions have one: it is kept inline, with no allocation of its own.
pub type Channels = SmallVec<[Arc<str>; 1]>;

/// Who a session is, for the operator (`GET …/connections`, `POST …/disconnect`).
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Unique on this node for its life (`s<n>` on the admin API).
    pub id: u64,
    /// The subject the tenant's plugin gave it; none on public tenants.
    pub subject: Option<Box<str>>,
    pub connected_at_ms: u64,
    pub remote: Option<std::net::SocketAddr>,
    /// The `Origin` header it was admitted with (browser pages).
    pub origin: Option<Box<str>>,
}

static NEXT_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl SessionInfo {
    pub fn new(
        subject: Option<&str>,
        remote: Option<std::net::SocketAddr>,
        origin: Option<Box<str>>,
    ) -> SessionInfo {
        SessionInfo {
            id: NEXT_SESSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            subject: subject.map(Box::from),
            connected_at_ms: herald_base::clock::now_ms() as u64,
            remote,
            origin,
        }
    }
}

#[derive(Debug)]
pub struct SessionHandle {
    info: SessionInfo,
    wire: Wire,
    limit_bytes: usize,
    policy: SlowConsumer,
    /// Set by the tenant's plugin at connect; selects message variants.
    audience: Option<Arc<str>>,
    state: Mutex<State>,
    /// When its client last sent a byte, in [`mono_ms`] (the session's
    /// reader records it; the heartbeat reads it).
    ///
    /// [`mono_ms`]: herald_base::clock::mono_ms
    heard_ms: AtomicU64,
}

impl SessionHandle {
    pub fn new(
        wire: Wire,
        limit_bytes: usize,
        policy: SlowConsumer,
        audience: Option<Arc<str>>,
    ) -> Arc<SessionHandle> {
        Self::with_info(
            wire,
            limit_bytes,
            policy,
            audience,
            SessionInfo::new(None, None, None),
        )
    }

    pub fn with_info(
        wire: Wire,
        limit_bytes: usize,
        policy: SlowConsumer,
        audience: Option<Arc<str>>,
        info: SessionInfo,
    ) -> Arc<SessionHandle> {
        Arc::new(SessionHandle {
            info,
            wire,
            limit_bytes,
            policy,
            audience,
            state: Mutex::default(),
            heard_ms: AtomicU64::new(herald_base::clock::mono_ms()),
        })
    }

    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// Records a subscription, by the name the hub returned
    /// ([`crate::SubscribeResult::name`]); false when it was there already.
    pub fn add_channel(&self, ch: Arc<str>) -> bool {
        let mut st = self.state.lock();
        if st.channels.iter().any(|c| **c == *ch) {
            return false;
        }
        st.channels.push(ch);
        true
    }

    /// Forgets a subscription; false when there was none.
    pub fn remove_channel(&self, ch: &str) -> bool {
        let mut st = self.state.lock();
        match st.channels.iter().position(|c| **c == *ch) {
            Some(i) => {
                st.channels.swap_remove(i);
                true
            }
            None => false,
        }
    }

    pub fn has_channel(&self, ch: &str) -> bool {
        self.state.lock().channels.iter().any(|c| **c == *ch)
    }

    pub fn channel_count(&self) -> usize {
        self.state.lock().channels.len()
    }

    /// The channels it is subscribed to now.
    pub fn channels(&self) -> Vec<Arc<str>> {
        self.state.lock().channels.to_vec()
    }

    /// Forgets every subscription and returns them (the session is leaving).
    pub fn take_channels(&self) -> Channels {
        std::mem::take(&mut self.state.lock().channels)
    }

    pub fn audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    pub fn wire(&self) -> Wire {
        self.wire
    }

    pub fn policy(&self) -> SlowConsumer {
        self.policy
    }

    fn push(&self, item: Item) -> Delivery {
        let mut st = self.state.lock();
        if st.closed.is_some() {
            return Delivery::Closed;
        }
        let d = match st
            .queue
            .push(item, self.wire, self.limit_bytes, self.policy)
        {
            PushOutcome::Queued => Delivery::Queued,
            PushOutcome::Conflated(n) => Delivery::Conflated(n),
            PushOutcome::DroppedOldest(n) => Delivery::DroppedOldest(n),
            PushOutcome::Overflow => {
                st.closed = Some(QueueClose::SlowConsumer);
                st.queue.take(self.wire);
                Delivery::Disconnected
            }
        };
        let waker = (!st.parked || d == Delivery::Disconnected)
            .then(|| st.wake())
            .flatten();
        drop(st);
        wake(waker);
        d
    }

    /// The writer says it has a backlog waiting for a full socket (`true`)
    /// or none (`false`). While parked, pushes do not wake it: it takes the
    /// queue itself once its socket drains. Unpark before taking the queue,
    /// so a push after the take wakes it.
    pub fn park(&self, parked: bool) {
        self.state.lock().parked = parked;
    }

    /// Unparks and wakes the writer (its hold on a lagging reader is over).
    pub fn release(&self) {
        let mut st = self.state.lock();
        st.parked = false;
        let waker = st.wake();
        drop(st);
        wake(waker);
    }

    pub fn deliver_msg(&self, m: &Arc<Published>) -> Delivery {
        self.push(Item::Msg(m.clone()))
    }

    /// Queues a control frame (`op` names the SSE event), encoded for this
    /// session's wire format.
    pub fn deliver_ctrl(&self, op: &str, json: &str) -> Delivery {
        let bytes = match self.wire {
            Wire::Ws => ws::encode_frame(ws::OpCode::Text, json.as_bytes()),
            Wire::Sse => sse::encode_event(op, json),
        };
        self.push(Item::Ctrl(bytes))
    }

    /// Queues bytes already in this session's wire format (pong, heartbeat).
    pub fn deliver_raw(&self, bytes: Bytes) -> Delivery {
        self.push(Item::Ctrl(bytes))
    }

    /// Everything queued so far; the writer sends it in as few writes as it can.
    pub fn take_queued(&self) -> Queued {
        self.state.lock().queue.take(self.wire)
    }

    /// What the writer does on a wake-up, under one lock: the close reason if
    /// the session was closed, else everything queued.
    /// A session the server is leaving (1001) first sends what was queued
    /// before it was closed: held messages flushed at shutdown reach it.
    pub fn take_or_close(&self) -> Result<Queued, QueueClose> {
        let mut st = self.state.lock();
        match st.closed {
            Some(QueueClose::GoingAway) if !st.queue.is_empty() => {
                let items = st.queue.take(self.wire);
                // Come back for the close once these are written.
                let waker = st.wake();
                drop(st);
                wake(waker);
                Ok(items)
            }
            Some(reason) => Err(reason),
            None => Ok(st.queue.take(self.wire)),
        }
    }

    pub fn queued_bytes(&self) -> usize {
        self.state.lock().queue.bytes()
    }

    pub fn close_reason(&self) -> Option<QueueClose> {
        self.state.lock().closed
    }

    /// Marks the session closed so channels stop queueing to it.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed.get_or_insert(QueueClose::Ended);
        st.queue.take(self.wire);
    }

    /// Closes the session from outside (shutdown, tenant change) and wakes
    /// its task, which sends the matching close code (after what is queued,
    /// when the server is going away).
    pub fn close_with(&self, reason: QueueClose) {
        let mut st = self.state.lock();
        if st.closed.is_some() {
            return;
        }
        st.closed = Some(reason);
        if reason != QueueClose::GoingAway {
            st.queue.take(self.wire);
        }
        let waker = st.wake();
        drop(st);
        wake(waker);
    }

    /// Ready once the queue changed (or the session was closed) since the
    /// last time it was ready; otherwise the task in `cx` is woken then.
    /// One waiting task at a time: the session's own.
    pub fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if std::mem::take(&mut st.woken) {
            return Poll::Ready(());
        }
        match &mut st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Resolves once something was queued since the last wake-up (the
    /// sessions poll [`SessionHandle::poll_woken`] themselves).
    #[cfg(test)]
    pub(crate) async fn woken(&self) {
        std::future::poll_fn(|cx| self.poll_woken(cx)).await
    }

    /// The client sent something: it is alive.
    pub fn heard(&self, now_ms: u64) {
        self.heard_ms.store(now_ms, Ordering::Relaxed);
    }

    /// One heartbeat of this session (the node beats every session once
    /// per heartbeat; see `SessionRegistry::beat`): a WebSocket client
    /// that sent nothing for `silent_ms` is closed ([`QueueClose::Silent`]),
    /// any other is sent a ping (WebSocket: a client that answers pings is
    /// never silent) or a comment (SSE: keeps proxies from timing out).
    /// The session holds no timer of its own: an idle one is its state only.
    pub fn beat(&self, now_ms: u64, silent_ms: u64) {
        match self.wire {
            Wire::Ws => {
                let heard = self.heard_ms.load(Ordering::Relaxed);
                if now_ms.saturating_sub(heard) >= silent_ms {
                    self.close_with(QueueClose::Silent);
                } else {
                    self.deliver_raw(Bytes::from_static(PING));
                }
            }
            Wire::Sse => {
                self.deliver_raw(Bytes::from_static(sse::HEARTBEAT));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woke(h: &SessionHandle) -> bool {
        tokio::time::timeout(Duration::from_millis(20), h.woken())
            .await
            .is_ok()
    }

    /// A writer parked on a full socket is not woken per push (a
    /// stalled reader costs a push under its policy, no wake-up), but is for
    /// a close; unparked it is woken again.
    #[tokio::test]
    async fn a_parked_writer_is_woken_only_to_close() {
        let h = SessionHandle::new(Wire::Ws, 64, SlowConsumer::DropOldest, None);
        h.deliver_raw(Bytes::from_static(b"a"));
        assert!(woke(&h).await);
        h.park(true);
        for seq in 1..=100 {
            let m = Arc::new(Published::for_test("c", seq, None, 10));
            assert_ne!(h.deliver_msg(&m), Delivery::Disconnected);
        }
        assert!(!woke(&h).await, "no wake-up per push while parked");
        assert!(!h.take_queued().is_empty(), "the pushes were queued");
        h.park(false);
        h.deliver_raw(Bytes::from_static(b"b"));
        assert!(woke(&h).await);
        h.park(true);
        h.close_with(QueueClose::TenantGone);
        assert!(woke(&h).await, "a close always wakes");

        // Overflow under `disconnect` wakes a parked writer too.
        let d = SessionHandle::new(Wire::Ws, 16, SlowConsumer::Disconnect, None);
        d.park(true);
        let m = |seq| Arc::new(Published::for_test("c", seq, None, 10));
        assert_eq!(d.deliver_msg(&m(1)), Delivery::Queued);
        assert!(!woke(&d).await);
        assert_eq!(d.deliver_msg(&m(2)), Delivery::Disconnected);
        assert!(woke(&d).await);
    }

    /// The heartbeat without a timer per session: a WebSocket client heard
    /// within the silence bound is pinged, one silent past it is closed
    /// (woken, even parked behind a backlog: a client that neither reads
    /// nor sends is not held for good); an SSE stream gets a comment.
    #[tokio::test]
    async fn a_beat_pings_the_heard_and_closes_the_silent() {
        let h = SessionHandle::new(Wire::Ws, 1 << 16, SlowConsumer::DropOldest, None);
        h.heard(1_000);
        h.beat(1_000 + 599, 600);
        assert!(woke(&h).await);
        let items = h.take_queued();
        assert!(matches!(&items.first(), Some(Item::Ctrl(b)) if &b[..] == PING));
        assert_eq!(h.close_reason(), None);

        h.park(true);
        h.beat(1_000 + 600, 600);
        assert_eq!(h.close_reason(), Some(QueueClose::Silent));
        assert!(
            woke(&h).await,
            "a silent session is woken to close, parked or not"
        );

        let s = SessionHandle::new(Wire::Sse, 1 << 16, SlowConsumer::DropOldest, None);
        s.beat(u64::MAX, 0);
        assert_eq!(
            s.close_reason(),
            None,
            "SSE clients send nothing: never silent"
        );
        assert!(
            matches!(&s.take_queued().first(), Some(Item::Ctrl(b)) if &b[..] == sse::HEARTBEAT)
        );
    }
}
