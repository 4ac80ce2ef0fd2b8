//! The writer both kinds of session share: what was taken from the queue and
//! not yet written, `send` of shared frames, the last words before close,
//! and the session's waits ([`poll_wake`]).
//!
//! Invariants: a frame is borrowed from the channel's encoded `Bytes`, never
//! copied, unless the socket took only part of it; the backlog is empty (no
//! allocation) once written; nothing here waits but [`finish`], which is
//! bounded ([`poll_wake`] registers the session's waits, it does not wait).

use super::sse::SseState;
use super::End;
use crate::fanout::queue::{Item, Queued};
use crate::fanout::session::SessionHandle;
use crate::fanout::Published;
use crate::tenant::Tenant;
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, Ready};
use tokio::net::TcpStream;

/// Slices handed to one `sendmsg`.
const MAX_IOV: usize = 64;

/// Writes `bufs` (the first [`MAX_IOV`] of them) as the socket takes
/// them, without waiting: `send` for one (most writes: a frame of a quiet
/// channel, with no iovec array to fill), `sendmsg` for several.
/// Not `writev`: a socket's write through the file layer pays for the
/// file's position lock and `vfs_writev` on every frame (0.57 µs more per
/// frame than a `send` in the profile against the bench's raw server).
fn send<'a>(
    stream: &TcpStream,
    mut bufs: impl ExactSizeIterator<Item = &'a [u8]>,
) -> io::Result<usize> {
    let sock = socket2::SockRef::from(stream);
    if bufs.len() == 1 {
        let one = bufs.next().expect("one buffer");
        return stream.try_io(tokio::io::Interest::WRITABLE, || sock.send(one));
    }
    let mut slices = [IoSlice::new(&[]); MAX_IOV];
    let mut n = 0;
    for (slot, b) in slices.iter_mut().zip(bufs) {
        *slot = IoSlice::new(b);
        n += 1;
    }
    stream.try_io(tokio::io::Interest::WRITABLE, || {
        sock.send_vectored(&slices[..n])
    })
}

/// Bytes written between two looks at the peer's receive window.
const WINDOW_CHECK_BYTES: u32 = 16 * 1024;

/// How long the writer of a lagging reader holds off between writes (the
/// node's pacer releases held sessions at this interval).
pub const LAG_PACE: Duration = Duration::from_millis(100);

/// Frames taken from the queue and not yet fully written, and whether the
/// reader keeps up.
pub(super) struct Unwritten {
    bufs: VecDeque<Bytes>,
    /// Bytes written since the peer's window was last looked at.
    unchecked: u32,
    /// The largest window the peer advertised so far, in KiB (the session
    /// state stays small).
    widest_kib: u16,
    hold: Hold,
}

/// A reader falling behind (its window below three quarters of the widest
/// it showed, at two looks in a row: one that reads keeps it at its widest,
/// or gets it back by the next look; one that stopped shrinks it once its
/// buffer holds some 100 KiB; see `peer_window.rs`) is written to once per
/// [`LAG_PACE`], everything queued in one write, instead of once per
/// message: a client that stopped reading costs a few writes while its
/// buffers fill, not one per message for every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// Written as frames come.
    No,
    /// The window was low at the last look (or the writer was holding off
    /// until now): low again at the next, and the writer holds off.
    Low,
    /// Just found lagging: the session must park and ask the pacer.
    New,
    /// Parked, waiting for the pacer.
    Waiting,
}

impl Default for Unwritten {
    fn default() -> Self {
        Unwritten {
            bufs: VecDeque::new(),
            // The first write looks at the window: the widest starts there.
            unchecked: WINDOW_CHECK_BYTES,
            widest_kib: 0,
            hold: Hold::No,
        }
    }
}

/// permessage-deflate as a WebSocket session agreed to it: messages of at
/// least `min_bytes` go compressed within a window of 2^`window_bits`.
/// Eight bytes (`Option` of it too): it lives in every session's state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deflate {
    pub window_bits: u8,
    pub min_bytes: std::num::NonZeroU32,
}

/// How a session's queued items go on the wire.
pub(super) enum Framing<'a> {
    /// WebSocket frames, compressed as the session agreed.
    Ws(Option<Deflate>),
    /// SSE events, each message with its `id:` line.
    Sse(&'a mut SseState),
}

impl Deflate {
    pub(super) fn applies_to(&self, len: usize) -> bool {
        len >= self.min_bytes.get() as usize
    }

    fn applies(&self, m: &Published) -> bool {
        self.applies_to(crate::proto::ws::server_frame_payload(&m.ws).len())
    }

    /// The frame this session sends for `m`; a compression is counted.
    fn frame(&self, m: &Published, tenant: &Tenant) -> Bytes {
        if !self.applies(m) {
            return m.ws.clone();
        }
        let (b, made) = m.ws_deflated(self.window_bits);
        if made {
            tenant.metrics.deflated.increment(1);
        }
        b
    }
}

impl Unwritten {
    pub(super) fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The session's handle must be parked: a backlog waits for the
    /// socket, or the writer holds off for a lagging reader.
    pub(super) fn parks(&self) -> bool {
        !self.bufs.is_empty() || matches!(self.hold, Hold::New | Hold::Waiting)
    }

    /// Whether the reader was just found lagging (once: the session then
    /// parks and hands its handle to the pacer).
    pub(super) fn take_new_hold(&mut self) -> bool {
        if self.hold == Hold::New {
            self.hold = Hold::Waiting;
            return true;
        }
        false
    }

    /// The pacer's wake-up (or any other): write again, and look at the
    /// window after that write. True if the writer was holding off.
    pub(super) fn end_hold(&mut self) -> bool {
        let held = matches!(self.hold, Hold::New | Hold::Waiting);
        if held {
            // Still low after this write: hold off again at once.
            self.hold = Hold::Low;
            self.unchecked = WINDOW_CHECK_BYTES;
        }
        held
    }

    /// Counts `n` bytes written; every [`WINDOW_CHECK_BYTES`] (and after
    /// the first write after a hold) looks at the peer's window and holds
    /// the writer if it was below three quarters of the widest seen at this
    /// look and the one before.
    fn wrote(&mut self, n: usize, stream: &TcpStream) {
        self.unchecked = self.unchecked.saturating_add(n as u32);
        if self.unchecked < WINDOW_CHECK_BYTES {
            return;
        }
        self.unchecked = 0;
        let Some(window) = crate::server::peer_window::peer_window(stream) else {
            return;
        };
        let kib = (window / 1024).min(u32::from(u16::MAX)) as u16;
        self.widest_kib = self.widest_kib.max(kib);
        let low = u32::from(kib) * 4 < u32::from(self.widest_kib) * 3;
        self.hold = match (self.hold, low) {
            (Hold::No, true) => Hold::Low,
            (Hold::Low, true) => Hold::New,
            (Hold::Low, false) => Hold::No,
            (h, _) => h,
        };
    }

    /// Writes as much as the socket takes. `Ok(true)` when everything went.
    fn flush(&mut self, stream: &TcpStream, writes: &mut u64) -> io::Result<bool> {
        while !self.bufs.is_empty() {
            match send(stream, self.bufs.iter().map(|b| &b[..])) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut written) => {
                    *writes += 1;
                    self.wrote(written, stream);
                    while written > 0 {
                        let front = self
                            .bufs
                            .front_mut()
                            .expect("written bytes came from queued buffers");
                        if written >= front.len() {
                            written -= front.len();
                            self.bufs.pop_front();
                        } else {
                            front.advance(written);
                            written = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        // Emptied: drop its allocation (an idle session holds no buffer).
        self.bufs = VecDeque::new();
        Ok(true)
    }
}

/// Best effort: sends what was pending and the final frame within a second,
/// then closes the socket.
pub(super) async fn finish(mut stream: TcpStream, mut out: Unwritten, last: Option<Bytes>) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(b) = out.bufs.pop_front() {
            stream.write_all(&b).await?;
        }
        if let Some(last) = last {
            stream.write_all(&last).await?;
        }
        stream.shutdown().await
    })
    .await;
}

/// What a session's loop woke for.
pub(super) enum Wake {
    /// Its queue changed or it was closed.
    Queue,
    /// Its socket can be read, or written (only asked while a backlog waits).
    Socket(Ready),
}

/// A session's waits, polled together: its queue first (a close from
/// outside must not wait for a full socket), then its socket, readable
/// always and writable while frames wait for socket space. None is a future
/// of its own: the handle keeps the task's waker, the socket's registration
/// its reader's and writer's, so a session that waits holds its state only.
pub(super) fn poll_wake(
    cx: &mut Context<'_>,
    handle: &SessionHandle,
    stream: &TcpStream,
    out: &Unwritten,
) -> Poll<Result<Wake, End>> {
    if handle.poll_woken(cx).is_ready() {
        return Poll::Ready(Ok(Wake::Queue));
    }
    let mut ready = Ready::EMPTY;
    if !out.is_empty() {
        match stream.poll_write_ready(cx) {
            Poll::Ready(Ok(())) => ready |= Ready::WRITABLE,
            Poll::Ready(Err(_)) => return Poll::Ready(Err(End::Io)),
            Poll::Pending => {}
        }
    }
    match stream.poll_read_ready(cx) {
        Poll::Ready(Ok(())) => ready |= Ready::READABLE,
        Poll::Ready(Err(_)) => return Poll::Ready(Err(End::Io)),
        Poll::Pending => {}
    }
    if ready.is_empty() {
        Poll::Pending
    } else {
        Poll::Ready(Ok(Wake::Socket(ready)))
    }
}

pub(super) fn flush(stream: &TcpStream, out: &mut Unwritten, tenant: &Tenant) -> Result<(), End> {
    let mut writes = 0;
    let r = out.flush(stream, &mut writes);
    tenant.metrics.writes.increment(writes);
    r.map(|_| ()).map_err(|_| End::Io)
}

/// Moves everything queued into the outbox (SSE messages get their id line)
/// and writes it; ends the session once it was closed and nothing it must
/// still send is queued.
pub(super) fn load_and_flush(
    stream: &TcpStream,
    handle: &SessionHandle,
    out: &mut Unwritten,
    tenant: &Tenant,
    framing: Framing<'_>,
) -> Result<(), End> {
    match handle.take_or_close() {
        Ok(items) => send_queued(stream, items, out, tenant, framing),
        Err(reason) => Err(super::queue_end(reason, handle.policy().as_str())),
    }
}

/// Writes frames taken from the queue (SSE messages get their id line).
pub(super) fn send_queued(
    stream: &TcpStream,
    items: Queued,
    out: &mut Unwritten,
    tenant: &Tenant,
    mut framing: Framing<'_>,
) -> Result<(), End> {
    if items.is_empty() {
        return Ok(());
    }
    tenant.metrics.frames_sent.increment(items.len() as u64);
    if let Framing::Ws(deflate) = framing {
        // A window of its own (rare) makes frames for this session alone.
        let shared =
            deflate.is_none_or(|d| d.window_bits >= crate::proto::deflate::MAX_WINDOW_BITS);
        if out.is_empty() && shared {
            return write_direct(stream, items, out, tenant, deflate);
        }
    }
    let mut ids = BytesMut::new();
    let mut id_ranges = Vec::new();
    for item in items {
        match item {
            Item::Ctrl(b) => out.bufs.push_back(b),
            Item::Msg(m) => match &mut framing {
                Framing::Ws(deflate) => {
                    let frame = match deflate {
                        Some(d) => d.frame(&m, tenant),
                        None => m.ws.clone(),
                    };
                    out.bufs.push_back(frame)
                }
                Framing::Sse(state) => {
                    out.bufs.push_back(m.sse.clone());
                    let start = ids.len();
                    state.write_id_after(&m, &mut ids);
                    // Placeholder, replaced below once `ids` is frozen.
                    id_ranges.push((out.bufs.len(), start, ids.len()));
                    out.bufs.push_back(Bytes::new());
                }
            },
        }
    }
    if !id_ranges.is_empty() {
        let ids = ids.freeze();
        for (at, start, end) in id_ranges {
            out.bufs[at] = ids.slice(start..end);
        }
    }
    flush(stream, out, tenant)
}

/// Writes queued WebSocket frames straight from the shared buffers with one
/// `send`; only what the socket did not take is copied into the outbox.
fn write_direct(
    stream: &TcpStream,
    items: Queued,
    out: &mut Unwritten,
    tenant: &Tenant,
    deflate: Option<Deflate>,
) -> Result<(), End> {
    // Compressed frames are made (or found made) first, then borrowed
    // from the message like plain ones.
    let deflate = deflate.filter(|d| {
        items
            .iter()
            .any(|i| matches!(i, Item::Msg(m) if d.applies(m)))
    });
    // Only the first session to send a message compresses it; the rest
    // find it made and pay no clone here.
    if let Some(d) = deflate {
        for it in &items {
            if let Item::Msg(m) = it {
                if m.deflated.get().is_none() {
                    d.frame(m, tenant);
                }
            }
        }
    }
    fn wire(i: &Item, deflate: Option<Deflate>) -> &Bytes {
        match i {
            Item::Msg(m) => match (deflate, m.deflated.get()) {
                (Some(d), Some(z)) if d.applies(m) => z,
                _ => &m.ws,
            },
            Item::Ctrl(b) => b,
        }
    }
    let sent = send(stream, items.iter().map(|it| &wire(it, deflate)[..]));
    let mut written = match sent {
        Ok(w) => {
            tenant.metrics.writes.increment(1);
            out.wrote(w, stream);
            w
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(_) => return Err(End::Io),
    };
    for it in &items {
        let b = wire(it, deflate);
        if written >= b.len() {
            written -= b.len();
            continue;
        }
        let mut rest = b.clone();
        rest.advance(written);
        written = 0;
        out.bufs.push_back(rest);
    }
    if out.is_empty() {
        Ok(())
    } else {
        flush(stream, out, tenant)
    }
}
