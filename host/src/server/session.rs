//! The socket half of a session: reading client frames, writing queued frames.
//!
//! Owns: one connection after its handshake, for WebSocket and SSE alike.
//! Invariants: an idle session holds no read or write buffer (reads go through
//! a stack buffer inside a synchronous step; a partial frame is the only thing
//! kept); everything queued is written with as few `writev` calls as possible;
//! the session never waits on anything but its own socket, its queue and its
//! timers; on every exit path it leaves all channels and releases its slot.

use crate::app::App;
use crate::fanout::queue::{Item, Wire};
use crate::fanout::session::{QueueClose, SessionHandle};
use crate::plugin::active::ActivePlugin;
use crate::plugin::Session;
use crate::proto::ws::{self, close, Assembler, FrameError, Message, Role};
use crate::proto::{self, sse, ClientOp, ErrorCode};
use crate::registry::now_ms;
use crate::server::Admitted;
use crate::tenant::{Access, Tenant};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Most bytes read from one socket before yielding to other sessions.
const READ_BUDGET: usize = 64 * 1024;
/// Slices handed to one `writev`.
const MAX_IOV: usize = 64;
const PING_FRAME: &[u8] = &[0x89, 0x00];

/// Frames taken from the queue and not yet fully written.
#[derive(Default)]
struct Outbox {
    bufs: VecDeque<Bytes>,
}

impl Outbox {
    fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// Writes as much as the socket takes. `Ok(true)` when everything went.
    fn flush(&mut self, stream: &TcpStream, writes: &mut u64) -> io::Result<bool> {
        while !self.bufs.is_empty() {
            let mut slices = [IoSlice::new(&[]); MAX_IOV];
            let n = self.bufs.len().min(MAX_IOV);
            for (slot, b) in slices.iter_mut().zip(self.bufs.iter()) {
                *slot = IoSlice::new(b);
            }
            match stream.try_write_vectored(&slices[..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut written) => {
                    *writes += 1;
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
        self.bufs = VecDeque::new();
        Ok(true)
    }
}

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
                close::GOING_AWAY => "shutdown",
                close::TENANT_GONE => "tenant_gone",
                close::SLOW_CONSUMER => "slow_consumer",
                close::HEARTBEAT_TIMEOUT => "heartbeat_timeout",
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
        QueueClose::TenantGone => End::Close(
            close::TENANT_GONE,
            "tenant removed or its access changed".into(),
        ),
    }
}

/// What a session needs from its tenant, copied once at connect.
struct SessionLimits {
    max_subscriptions: usize,
    max_message_bytes: usize,
}

/// State of a WebSocket session's reader.
struct WsReader {
    /// Bytes of a frame that has not fully arrived; empty (no allocation) when idle.
    partial: Vec<u8>,
    assembler: Assembler,
    subs: Vec<Arc<str>>,
    /// Who the tenant's plugin said this connection is.
    session: Option<Arc<Session>>,
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubRefusal {
    /// The plugin (or the absence of one) said no: (code, message).
    Denied(String, String),
    /// The plugin failed; the subscription fails closed. Carries the error kind.
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
    session: Option<Arc<Session>>,
    channel: &str,
) -> Result<(), SubRefusal> {
    let session = session.unwrap_or_else(|| {
        Arc::new(Session {
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
            tracing::warn!(tenant = %tenant.id, kind = e.kind(), error = %e, "authorize-subscribe failed; subscription refused");
            Err(SubRefusal::Failed(e.kind()))
        }
    }
}

/// Asks whether `session` may subscribe to `channel` (the tenant's plugin
/// decides for "plugin" tenants).
pub async fn authorize_subscribe(
    tenant: &Tenant,
    session: Option<Arc<Session>>,
    channel: &str,
) -> Result<(), SubRefusal> {
    match check_subscribe(tenant) {
        SubCheck::Allowed => Ok(()),
        SubCheck::Refused(r) => Err(r),
        SubCheck::AskPlugin(p) => ask_plugin(tenant, p, session, channel).await,
    }
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

/// Settles pending subscriptions one by one, decoding what followed each.
async fn settle(
    reader: &mut WsReader,
    mut pending: Option<PendingSub>,
    tenant: &Tenant,
    handle: &Arc<SessionHandle>,
    limits: &SessionLimits,
) -> Result<(), End> {
    while let Some(p) = pending.take() {
        let verdict = ask_plugin(tenant, p.plugin.clone(), reader.session.clone(), &p.ch).await;
        reader.complete_sub(p, verdict, tenant, handle);
        pending = reader.resume(tenant, handle, limits)?;
    }
    Ok(())
}

/// Runs a WebSocket session until it ends. `early` holds bytes the client
/// sent right after its handshake request.
pub async fn run_ws(app: Arc<App>, stream: TcpStream, early: Vec<u8>, admitted: Admitted) {
    let Admitted { slot, session } = admitted;
    let tenant = slot.tenant.clone();
    let settings = tenant.settings();
    let limits = SessionLimits {
        max_subscriptions: settings.limits.max_subscriptions,
        max_message_bytes: settings.limits.max_message_bytes,
    };
    let audience = session
        .as_ref()
        .and_then(|s| s.audience.as_deref())
        .map(Arc::from);
    let handle = SessionHandle::new(
        Wire::Ws,
        settings.limits.queue_bytes,
        settings.limits.slow_consumer,
        audience,
    );
    drop(settings);
    tenant.metrics.opened_ws.increment(1);
    let mut reader = WsReader {
        partial: early,
        assembler: Assembler::default(),
        subs: Vec::new(),
        session,
    };
    let mut out = Outbox::default();
    // Shutdown, deletion and access changes close the session through its
    // handle: no waiter of its own, no lock per frame.
    let registration = tenant.sessions.register(&handle);
    if let Some(status) = crate::source::status_for_new_session(&tenant) {
        handle.deliver_ctrl("status", &status);
    }
    let heartbeat = app.config.heartbeat;
    let hb = tokio::time::sleep(heartbeat);
    tokio::pin!(hb);
    let mut last_seen = Instant::now();

    // Bytes that arrived with the handshake are processed before waiting.
    let mut end = match reader.resume(&tenant, &handle, &limits) {
        // Boxed: a plugin round trip is rare, and its state must not
        // enlarge every idle session.
        Ok(pending) => Box::pin(settle(&mut reader, pending, &tenant, &handle, &limits))
            .await
            .err(),
        Err(e) => Some(e),
    };

    {
        // The waits live across turns and are re-armed only after they fire
        // (or, for the socket, when the direction of interest changes): a
        // fresh wait would register itself again under a lock on every frame.
        let woken = handle.woken();
        tokio::pin!(woken);
        let mut want = interest(&out);
        let ready = stream.ready(want);
        tokio::pin!(ready);
        while end.is_none() {
            tokio::select! {
                biased;
                // Also while the socket is full: a close from outside must not wait for it.
                _ = &mut woken => {
                    woken.set(handle.woken());
                    if out.is_empty() {
                        end = match handle.take_or_close() {
                            Ok(items) => send_queued(&stream, items, &mut out, &tenant, None).err(),
                            Err(reason) => Some(queue_end(reason, handle.policy().as_str())),
                        };
                    } else if let Some(reason) = handle.close_reason() {
                        end = Some(queue_end(reason, handle.policy().as_str()));
                    }
                }
                // One readiness wait for both directions keeps the idle session small.
                r = &mut ready => {
                    ready.set(stream.ready(want));
                    let ready = match r {
                        Ok(ready) => ready,
                        Err(_) => {
                            end = Some(End::Io);
                            continue;
                        }
                    };
                    if ready.is_writable() && !out.is_empty() {
                        // Once the backlog is out, send what queued meanwhile: its
                        // wake-up may already have been used.
                        end = flush(&stream, &mut out, &tenant)
                            .and_then(|()| if out.is_empty() { load_and_flush(&stream, &handle, &mut out, &tenant, None) } else { Ok(()) })
                            .err();
                    }
                    if end.is_none() && ready.is_readable() {
                        match reader.on_readable(&stream, &tenant, &handle, &limits) {
                            Ok((got, pending)) => {
                                if got {
                                    last_seen = Instant::now();
                                }
                                if pending.is_some() {
                                    end = Box::pin(settle(&mut reader, pending, &tenant, &handle, &limits)).await.err();
                                }
                            }
                            Err(e) => end = Some(e),
                        }
                    }
                }
                _ = &mut hb => {
                    // Two heartbeats without a byte: a client that answers pings
                    // sent one pong per heartbeat, so this is a dead one.
                    if last_seen.elapsed() >= heartbeat * 2 {
                        end = Some(End::Close(close::HEARTBEAT_TIMEOUT, "no frame from client within the heartbeat timeout".into()));
                    } else {
                        handle.deliver_raw(Bytes::from_static(PING_FRAME));
                    }
                    hb.as_mut().reset(tokio::time::Instant::now() + heartbeat);
                }
            }
            if interest(&out) != want {
                want = interest(&out);
                ready.set(stream.ready(want));
            }
        }
    }
    let end = end.expect("loop exits only with an end");
    for ch in &reader.subs {
        tenant.hub.unsubscribe(ch, &handle);
    }
    tenant
        .metrics
        .subscriptions
        .decrement(reader.subs.len() as f64);
    handle.close();
    tenant.sessions.deregister(registration);
    tenant.metrics.closed(end.label());
    tracing::debug!(tenant = %tenant.id, reason = end.label(), "websocket session ended");
    let frame = match &end {
        End::Close(code, reason) => Some(ws::encode_close(*code, reason)),
        End::PeerClosed(Some(code)) => Some(ws::encode_close(*code, "")),
        End::PeerClosed(None) => Some(ws::encode_close(close::NORMAL, "")),
        End::Io => None,
    };
    finish(stream, out, frame).await;
    drop(slot);
}

/// Best effort: sends what was pending and the final frame within a second,
/// then closes the socket.
async fn finish(mut stream: TcpStream, mut out: Outbox, last: Option<Bytes>) {
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

/// Readable always; writable too while frames wait for socket space.
fn interest(out: &Outbox) -> Interest {
    if out.is_empty() {
        Interest::READABLE
    } else {
        Interest::READABLE | Interest::WRITABLE
    }
}

fn flush(stream: &TcpStream, out: &mut Outbox, tenant: &Tenant) -> Result<(), End> {
    let mut writes = 0;
    let r = out.flush(stream, &mut writes);
    tenant.metrics.writes.increment(writes);
    r.map(|_| ()).map_err(|_| End::Io)
}

/// Moves everything queued into the outbox (SSE messages get their id line)
/// and writes it.
fn load_and_flush(
    stream: &TcpStream,
    handle: &SessionHandle,
    out: &mut Outbox,
    tenant: &Tenant,
    sse: Option<&mut SseState>,
) -> Result<(), End> {
    send_queued(stream, handle.take_queued(), out, tenant, sse)
}

/// Writes frames taken from the queue (SSE messages get their id line).
fn send_queued(
    stream: &TcpStream,
    items: VecDeque<Item>,
    out: &mut Outbox,
    tenant: &Tenant,
    mut sse: Option<&mut SseState>,
) -> Result<(), End> {
    if items.is_empty() {
        return Ok(());
    }
    tenant.metrics.frames_sent.increment(items.len() as u64);
    if sse.is_none() && out.is_empty() {
        return write_direct(stream, items, out, tenant);
    }
    let mut ids = BytesMut::new();
    let mut id_ranges = Vec::new();
    for item in items {
        match item {
            Item::Ctrl(b) => out.bufs.push_back(b),
            Item::Msg(m) => match sse.as_deref_mut() {
                None => out.bufs.push_back(m.ws.clone()),
                Some(state) => {
                    out.bufs.push_back(m.sse.clone());
                    if let Some(i) = state.channels.iter().position(|c| **c == *m.ch) {
                        state.positions[i] = (m.epoch, m.seq);
                    }
                    let start = ids.len();
                    sse::write_id_line(&mut ids, &state.positions);
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
/// `writev`; only what the socket did not take is copied into the outbox.
fn write_direct(
    stream: &TcpStream,
    items: VecDeque<Item>,
    out: &mut Outbox,
    tenant: &Tenant,
) -> Result<(), End> {
    fn bytes(i: &Item) -> &Bytes {
        match i {
            Item::Msg(m) => &m.ws,
            Item::Ctrl(b) => b,
        }
    }
    let mut slices = [IoSlice::new(&[]); MAX_IOV];
    let n = items.len().min(MAX_IOV);
    for (slot, it) in slices.iter_mut().zip(items.iter()) {
        *slot = IoSlice::new(bytes(it));
    }
    let mut written = match stream.try_write_vectored(&slices[..n]) {
        Ok(w) => {
            tenant.metrics.writes.increment(1);
            w
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(_) => return Err(End::Io),
    };
    for it in &items {
        let b = bytes(it);
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

impl WsReader {
    /// Reads what the socket has (bounded), decoding and acting on frames.
    /// Returns whether any byte arrived, and a subscription that waits for
    /// the plugin (reading stops there until it is settled).
    fn on_readable(
        &mut self,
        stream: &TcpStream,
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Result<(bool, Option<PendingSub>), End> {
        let mut buf = [0u8; 4096];
        let mut total = 0;
        while total < READ_BUDGET {
            match stream.try_read(&mut buf) {
                Ok(0) => return Err(End::PeerClosed(None)),
                Ok(n) => {
                    total += n;
                    let pending = if self.partial.is_empty() {
                        self.consume_slice(&mut buf[..n], tenant, handle, limits)?
                    } else {
                        let mut joined = std::mem::take(&mut self.partial);
                        joined.extend_from_slice(&buf[..n]);
                        self.consume(joined, tenant, handle, limits)?
                    };
                    if pending.is_some() {
                        return Ok((true, pending));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return Err(End::Io),
            }
        }
        Ok((total > 0, None))
    }

    /// Decodes what is left in `partial` (after a settled subscription).
    fn resume(
        &mut self,
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Result<Option<PendingSub>, End> {
        if self.partial.is_empty() {
            return Ok(None);
        }
        let data = std::mem::take(&mut self.partial);
        self.consume(data, tenant, handle, limits)
    }

    fn consume(
        &mut self,
        mut data: Vec<u8>,
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Result<Option<PendingSub>, End> {
        let (used, pending) = self.decode_all(&mut data, tenant, handle, limits)?;
        data.drain(..used);
        self.partial = if data.is_empty() { Vec::new() } else { data };
        Ok(pending)
    }

    fn consume_slice(
        &mut self,
        data: &mut [u8],
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Result<Option<PendingSub>, End> {
        let (used, pending) = self.decode_all(data, tenant, handle, limits)?;
        if used < data.len() {
            self.partial = data[used..].to_vec();
        }
        Ok(pending)
    }

    /// Decodes complete frames from the start of `data`; returns the bytes
    /// used, stopping after a subscription that waits for the plugin.
    fn decode_all(
        &mut self,
        data: &mut [u8],
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Result<(usize, Option<PendingSub>), End> {
        let mut used = 0;
        loop {
            let head = match ws::decode_frame(
                &mut data[used..],
                Role::FromClient,
                limits.max_message_bytes,
            ) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok((used, None)),
                Err(e) => return Err(frame_error(e, tenant)),
            };
            let payload = &data[used + head.payload_start..used + head.frame_len()];
            let msg = self
                .assembler
                .push(head, payload, limits.max_message_bytes)
                .map_err(|e| frame_error(e, tenant))?;
            used += head.frame_len();
            match msg {
                None | Some(Message::Pong) => {}
                Some(Message::Close(code)) => return Err(End::PeerClosed(code)),
                Some(Message::Ping(p)) => {
                    handle.deliver_raw(ws::encode_frame(ws::OpCode::Pong, &p));
                }
                Some(Message::Binary(_)) => {
                    tenant.metrics.client_error(ErrorCode::BadRequest.as_str());
                    handle.deliver_ctrl(
                        "err",
                        &proto::encode_err(
                            None,
                            ErrorCode::BadRequest,
                            "binary frames are not part of the protocol; send JSON text frames",
                        ),
                    );
                }
                Some(Message::Text(t)) => {
                    if let Some(p) = self.on_op(&t, tenant, handle, limits) {
                        return Ok((used, Some(p)));
                    }
                }
            }
        }
    }

    fn on_op(
        &mut self,
        text: &[u8],
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Option<PendingSub> {
        let op = match proto::parse_client_op(text) {
            Ok(op) => op,
            Err(e) => {
                tenant.metrics.client_error(e.code.as_str());
                handle.deliver_ctrl("err", &proto::encode_err(e.id, e.code, &e.msg));
                return None;
            }
        };
        match op {
            ClientOp::Ping { id } => {
                handle.deliver_ctrl("pong", &proto::encode_pong(id));
            }
            ClientOp::Sub {
                ch,
                since,
                epoch,
                id,
            } => {
                let already = self.subs.iter().any(|c| **c == *ch);
                if !already && self.subs.len() >= limits.max_subscriptions {
                    tenant
                        .metrics
                        .client_error(ErrorCode::TooManySubscriptions.as_str());
                    let msg = format!(
                        "at most {} subscriptions per connection",
                        limits.max_subscriptions
                    );
                    handle.deliver_ctrl(
                        "err",
                        &proto::encode_err(id, ErrorCode::TooManySubscriptions, &msg),
                    );
                    return None;
                }
                if already {
                    self.subscribe(ch, since, epoch, id, tenant, handle);
                    return None;
                }
                match check_subscribe(tenant) {
                    SubCheck::Allowed => self.subscribe(ch, since, epoch, id, tenant, handle),
                    SubCheck::Refused(r) => refuse_sub(r, id, tenant, handle),
                    SubCheck::AskPlugin(plugin) => {
                        return Some(PendingSub {
                            ch,
                            since,
                            epoch,
                            id,
                            plugin,
                        })
                    }
                }
            }
            ClientOp::Unsub { ch, id } => match self.subs.iter().position(|c| **c == *ch) {
                Some(i) => {
                    self.subs.swap_remove(i);
                    tenant.hub.unsubscribe(&ch, handle);
                    tenant.metrics.subscriptions.decrement(1.0);
                    handle.deliver_ctrl("ack", &proto::encode_ack(id, None));
                }
                None => {
                    tenant
                        .metrics
                        .client_error(ErrorCode::NotSubscribed.as_str());
                    let msg = format!("not subscribed to {ch:?}");
                    handle.deliver_ctrl(
                        "err",
                        &proto::encode_err(id, ErrorCode::NotSubscribed, &msg),
                    );
                }
            },
        }
        None
    }

    fn complete_sub(
        &mut self,
        p: PendingSub,
        verdict: Result<(), SubRefusal>,
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
    ) {
        match verdict {
            Ok(()) => self.subscribe(p.ch, p.since, p.epoch, p.id, tenant, handle),
            Err(r) => refuse_sub(r, p.id, tenant, handle),
        }
    }

    /// Joins the channel (replaying history when resuming) and acknowledges.
    fn subscribe(
        &mut self,
        ch: String,
        since: Option<u64>,
        epoch: Option<u64>,
        id: Option<u64>,
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
    ) {
        let history = tenant.settings().limits.history();
        tenant.hub.subscribe(
            &ch,
            handle,
            since.map(|s| (s, epoch)),
            history,
            now_ms() as u64,
            |ep, head| {
                handle.deliver_ctrl("ack", &proto::encode_ack(id, Some((&ch, ep, head))));
            },
        );
        if !self.subs.iter().any(|c| **c == *ch) {
            tenant.metrics.subscriptions.increment(1.0);
            self.subs.push(ch.into());
        }
    }
}

fn refuse_sub(r: SubRefusal, id: Option<u64>, tenant: &Tenant, handle: &SessionHandle) {
    match r {
        SubRefusal::Denied(code, msg) => {
            tenant.metrics.client_error(ErrorCode::Forbidden.as_str());
            let msg = format!("{code}: {msg}");
            handle.deliver_ctrl("err", &proto::encode_err(id, ErrorCode::Forbidden, &msg));
        }
        SubRefusal::Failed(kind) => {
            let msg = format!("the tenant's plugin failed ({kind}); try again later");
            handle.deliver_ctrl("err", &proto::encode_err(id, ErrorCode::PluginError, &msg));
        }
    }
}

fn frame_error(e: FrameError, tenant: &Tenant) -> End {
    tenant.metrics.client_error(match e {
        FrameError::TooBig { .. } => "too_big",
        FrameError::BadUtf8 => "bad_utf8",
        FrameError::Protocol(_) => "protocol",
    });
    End::Close(e.close_code(), e.to_string())
}

/// An SSE session's channels (in request order) and the positions it sent.
pub struct SseState {
    channels: Vec<Arc<str>>,
    positions: Vec<(u64, u64)>,
}

/// What an SSE request asked for, validated by the front door.
pub struct SseRequest {
    pub channels: Vec<String>,
    /// Positions from `Last-Event-ID`, one per channel.
    pub resume: Option<Vec<(u64, u64)>>,
}

/// Runs an SSE stream until it ends. The response head was already written.
pub async fn run_sse(app: Arc<App>, stream: TcpStream, req: SseRequest, admitted: Admitted) {
    let Admitted { slot, session } = admitted;
    let tenant = slot.tenant.clone();
    let settings = tenant.settings();
    let audience = session
        .as_ref()
        .and_then(|s| s.audience.as_deref())
        .map(Arc::from);
    drop(session);
    let handle = SessionHandle::new(
        Wire::Sse,
        settings.limits.queue_bytes,
        settings.limits.slow_consumer,
        audience,
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
        // Until a message arrives, the id carries where the stream started.
        let start = match &req.resume {
            Some(p) if p[i].0 == r.epoch => p[i].1.max(r.head),
            _ => r.head,
        };
        state.positions.push((r.epoch, start));
        state.channels.push(ch.as_str().into());
    }
    tenant
        .metrics
        .subscriptions
        .increment(state.channels.len() as f64);
    let mut out = Outbox::default();
    // Shutdown, deletion and access changes close the session through its
    // handle: no waiter of its own, no lock per frame.
    let registration = tenant.sessions.register(&handle);
    if let Some(status) = crate::source::status_for_new_session(&tenant) {
        handle.deliver_ctrl("status", &status);
    }
    let heartbeat = app.config.heartbeat;
    let hb = tokio::time::sleep(heartbeat);
    tokio::pin!(hb);
    let mut end = None;
    while end.is_none() {
        tokio::select! {
            biased;
            r = stream.ready(interest(&out)) => {
                end = match r {
                    Ok(ready) if ready.is_writable() && !out.is_empty() => flush(&stream, &mut out, &tenant)
                        .and_then(|()| if out.is_empty() { load_and_flush(&stream, &handle, &mut out, &tenant, Some(&mut state)) } else { Ok(()) })
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
                if let Some(reason) = handle.close_reason() {
                    end = Some(queue_end(reason, handle.policy().as_str()));
                } else if out.is_empty() {
                    end = load_and_flush(&stream, &handle, &mut out, &tenant, Some(&mut state)).err();
                }
            }
            _ = &mut hb => {
                handle.deliver_raw(Bytes::from_static(sse::HEARTBEAT));
                hb.as_mut().reset(tokio::time::Instant::now() + heartbeat);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The state a session task keeps for its whole life. Idle memory per
    /// connection is this plus the socket registration and the shared handle,
    /// so it is guarded here; the benchmark measures the whole process.
    #[tokio::test]
    async fn session_futures_stay_small() {
        let app = crate::app::App::for_tests().await;
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
        };
        let sse = std::mem::size_of_val(&run_sse(
            app.clone(),
            stream,
            req,
            Admitted {
                slot,
                session: None,
            },
        ));
        eprintln!("session futures: ws {ws} B, sse {sse} B");
        assert!(ws <= 1280, "websocket session future is {ws} bytes");
        assert!(sse <= 1280, "sse session future is {sse} bytes");
    }
}
