//! A WebSocket session: frames from the client (ops, pings, close), frames to
//! it through the shared writer, pings every heartbeat.
//!
//! Invariants: frames are decoded and acted on in order, a subscription that
//! waits for the plugin stops decoding until it is settled; a client silent
//! for two heartbeats is closed with 4002, one that answers pings never is.

use super::writer::{finish, flush, interest, load_and_flush, send_queued, Outbox};
use super::{ask_plugin, check_subscribe, queue_end, End, SubCheck, SubRefusal, READ_BUDGET};
use crate::app::App;
use crate::clock::now_ms;
use crate::fanout::queue::Wire;
use crate::fanout::session::{SessionHandle, SessionInfo};
use crate::plugin::active::ActivePlugin;
use crate::plugin::Session;
use crate::proto::ws::{self, close, Assembler, FrameError, Message, Role};
use crate::proto::{self, ClientOp, ErrorCode};
use crate::ratelimit::{OpBudget, OpVerdict};
use crate::server::Admitted;
use crate::tenant::Tenant;
use bytes::Bytes;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::Ready;
use tokio::net::TcpStream;

const PING_FRAME: &[u8] = &[0x89, 0x00];

/// What a session needs from its tenant, copied once at connect.
struct SessionLimits {
    /// How long a frame (or a fragmented message) may take to complete.
    frame_deadline: Duration,
    max_subscriptions: usize,
    max_channels: usize,
    max_message_bytes: usize,
    ops_per_sec: f64,
    ops_burst: u32,
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
    session: Option<Arc<Session>>,
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
    let Admitted {
        slot,
        session,
        remote,
        origin,
    } = admitted;
    let mut s = WsSession::open(
        slot.tenant.clone(),
        session,
        early,
        app.config.head_timeout,
        remote,
        origin,
    );
    let end = match s.read_early().await {
        Ok(()) => s.serve(&stream, app.config.heartbeat).await,
        Err(end) => end,
    };
    let last = s.leave(&end);
    finish(stream, std::mem::take(&mut s.out), last).await;
    drop(slot);
}

/// Everything a WebSocket session keeps besides its socket and slot.
struct WsSession {
    tenant: Arc<Tenant>,
    handle: Arc<SessionHandle>,
    limits: SessionLimits,
    reader: WsReader,
    out: Outbox,
    /// Its key in the tenant's session registry.
    registration: usize,
    /// When the client last sent a byte (a pong counts).
    last_seen: Instant,
    /// Told the handle it is parked (a backlog waits for the socket).
    parked: bool,
}

impl WsSession {
    /// Makes the session's queue, registers it with its tenant and queues
    /// the source's status if it is stalled.
    fn open(
        tenant: Arc<Tenant>,
        session: Option<Arc<Session>>,
        early: Vec<u8>,
        frame_deadline: Duration,
        remote: Option<std::net::SocketAddr>,
        origin: Option<Box<str>>,
    ) -> WsSession {
        let settings = tenant.settings();
        let ops_burst = settings.limits.client_ops_burst;
        let limits = SessionLimits {
            frame_deadline,
            max_subscriptions: settings.limits.max_subscriptions,
            max_channels: settings.limits.max_channels,
            max_message_bytes: settings.limits.max_message_bytes,
            ops_per_sec: settings.limits.client_ops_per_sec,
            ops_burst: settings.limits.client_ops_burst,
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
        if let Some(status) = crate::source::status_for_new_session(&tenant) {
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
            out: Outbox::default(),
            registration,
            last_seen: Instant::now(),
            parked: false,
        }
    }

    /// Acts on the frames that arrived with the handshake, before any wait.
    async fn read_early(&mut self) -> Result<(), End> {
        let pending = self
            .reader
            .resume(&self.tenant, &self.handle, &self.limits)?;
        self.settle(pending).await
    }

    /// Waits for the queue, the socket and the heartbeat until the session ends.
    async fn serve(&mut self, stream: &TcpStream, heartbeat: Duration) -> End {
        let hb = tokio::time::sleep(heartbeat);
        tokio::pin!(hb);
        // The waits live across turns and are re-armed only after they fire
        // (or, for the socket, when the direction of interest changes): a
        // fresh wait would register itself again under a lock on every frame.
        let handle = self.handle.clone();
        let woken = handle.woken();
        tokio::pin!(woken);
        let mut want = interest(&self.out);
        let ready = stream.ready(want);
        tokio::pin!(ready);
        loop {
            let step = tokio::select! {
                biased;
                // Also while the socket is full: a close from outside must not wait for it.
                _ = &mut woken => {
                    woken.set(handle.woken());
                    self.on_woken(stream)
                }
                // One readiness wait for both directions keeps the idle session small.
                r = &mut ready => {
                    ready.set(stream.ready(want));
                    match r {
                        Ok(r) => self.on_ready(stream, r).await,
                        Err(_) => Err(End::Io),
                    }
                }
                _ = &mut hb => {
                    hb.as_mut().reset(tokio::time::Instant::now() + heartbeat);
                    self.on_heartbeat(heartbeat)
                }
            };
            if let Err(end) = step {
                return end;
            }
            if let Err(end) = self.repark(stream) {
                return end;
            }
            if interest(&self.out) != want {
                want = interest(&self.out);
                ready.set(stream.ready(want));
            }
        }
    }

    /// A backlog waits for the socket: parked, pushes need not wake us (the
    /// drained socket will). Unparked, what was pushed meanwhile woke
    /// nobody, so it is taken now.
    fn repark(&mut self, stream: &TcpStream) -> Result<(), End> {
        loop {
            let backlog = !self.out.is_empty();
            if backlog == self.parked {
                return Ok(());
            }
            self.parked = backlog;
            self.handle.park(backlog);
            if backlog {
                return Ok(());
            }
            load_and_flush(stream, &self.handle, &mut self.out, &self.tenant, None)?;
            if self.out.is_empty() {
                return Ok(());
            }
        }
    }

    /// The queue changed: send what it holds, unless a backlog is still
    /// waiting for the socket, or end if it was closed.
    fn on_woken(&mut self, stream: &TcpStream) -> Result<(), End> {
        let policy = self.handle.policy();
        if self.out.is_empty() {
            match self.handle.take_or_close() {
                Ok(items) => send_queued(stream, items, &mut self.out, &self.tenant, None),
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
    async fn on_ready(&mut self, stream: &TcpStream, ready: Ready) -> Result<(), End> {
        if ready.is_writable() && !self.out.is_empty() {
            flush(stream, &mut self.out, &self.tenant)?;
            // Once the backlog is out, send what queued meanwhile: its
            // wake-up may already have been used.
            if self.out.is_empty() {
                load_and_flush(stream, &self.handle, &mut self.out, &self.tenant, None)?;
            }
        }
        if ready.is_readable() {
            let (got, pending) =
                self.reader
                    .on_readable(stream, &self.tenant, &self.handle, &self.limits)?;
            if got {
                self.last_seen = Instant::now();
            }
            self.reader.check_incomplete(self.limits.frame_deadline)?;
            self.settle(pending).await?;
        }
        Ok(())
    }

    /// Pings, or ends a client silent for two heartbeats: one that answers
    /// pings sends a pong every heartbeat.
    fn on_heartbeat(&mut self, heartbeat: Duration) -> Result<(), End> {
        self.reader.check_incomplete(self.limits.frame_deadline)?;
        if self.last_seen.elapsed() >= heartbeat * 2 {
            return Err(End::Close(
                close::HEARTBEAT_TIMEOUT,
                "no frame from client within the heartbeat timeout".into(),
            ));
        }
        self.handle.deliver_raw(Bytes::from_static(PING_FRAME));
        Ok(())
    }

    /// Settles a subscription waiting for the plugin (and what followed it).
    async fn settle(&mut self, pending: Option<PendingSub>) -> Result<(), End> {
        if pending.is_none() {
            return Ok(());
        }
        // Boxed: a plugin round trip is rare, and its state must not
        // enlarge every idle session.
        Box::pin(settle(
            &mut self.reader,
            pending,
            &self.tenant,
            &self.handle,
            &self.limits,
        ))
        .await
    }

    /// Leaves every channel and the tenant's registry, counts the end, and
    /// returns the close frame to send.
    fn leave(&mut self, end: &End) -> Option<Bytes> {
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
        match end {
            End::Close(code, reason) => Some(ws::encode_close(*code, reason)),
            End::PeerClosed(Some(code)) => Some(ws::encode_close(*code, "")),
            End::PeerClosed(None) => Some(ws::encode_close(close::NORMAL, "")),
            End::Io => None,
        }
    }
}

impl WsReader {
    /// Ends a session whose frame or fragmented message has been incomplete
    /// for longer than `deadline` (its bytes are bounded by the frame size;
    /// this bounds how long they are held).
    fn check_incomplete(&mut self, deadline: Duration) -> Result<(), End> {
        let incomplete = !self.partial.is_empty() || self.assembler.in_progress();
        match (incomplete, self.incomplete_since) {
            (false, _) => self.incomplete_since = None,
            (true, None) => self.incomplete_since = Some(Instant::now()),
            (true, Some(since)) if since.elapsed() > deadline => {
                return Err(End::Close(
                    close::POLICY,
                    format!("a frame did not complete within {} s", deadline.as_secs()),
                ))
            }
            (true, Some(_)) => {}
        }
        Ok(())
    }

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
            if matches!(
                msg,
                Some(Message::Text(_) | Message::Binary(_) | Message::Ping(_))
            ) {
                match self
                    .ops
                    .take(limits.ops_per_sec, limits.ops_burst, Instant::now())
                {
                    OpVerdict::Allowed => {}
                    OpVerdict::Refused => {
                        refuse(
                            ErrorCode::RateLimited,
                            "too many operations on this connection; slow down",
                            None,
                            tenant,
                            handle,
                        );
                        continue;
                    }
                    OpVerdict::Close => {
                        tracing::info!(tenant = %tenant.id, "a connection kept sending past its operation budget; closed");
                        return Err(End::Close(close::POLICY, "too many operations".into()));
                    }
                }
            }
            match msg {
                None | Some(Message::Pong) => {}
                Some(Message::Close(code)) => return Err(End::PeerClosed(code)),
                Some(Message::Ping(p)) => {
                    handle.deliver_raw(ws::encode_frame(ws::OpCode::Pong, &p));
                }
                Some(Message::Binary(_)) => {
                    refuse(
                        ErrorCode::BadRequest,
                        "binary frames are not part of the protocol; send JSON text frames",
                        None,
                        tenant,
                        handle,
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
                let already = handle.has_channel(&ch);
                if !already && handle.channel_count() >= limits.max_subscriptions {
                    let msg = format!(
                        "at most {} subscriptions per connection",
                        limits.max_subscriptions
                    );
                    refuse(ErrorCode::TooManySubscriptions, &msg, id, tenant, handle);
                    return None;
                }
                if already {
                    self.subscribe(ch, since, epoch, id, tenant, handle);
                    return None;
                }
                if !tenant.hub.may_open(&ch, limits.max_channels) {
                    let msg = format!(
                        "the tenant has {} channels, as many as its subscribers may open",
                        limits.max_channels
                    );
                    refuse(ErrorCode::TooManyChannels, &msg, id, tenant, handle);
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
            ClientOp::Unsub { ch, id } => match handle.remove_channel(&ch) {
                true => {
                    tenant.hub.unsubscribe(&ch, handle);
                    tenant.metrics.subscriptions.decrement(1.0);
                    handle.deliver_ctrl("ack", &proto::encode_ack(id, None));
                }
                false => {
                    let msg = format!("not subscribed to {ch:?}");
                    refuse(ErrorCode::NotSubscribed, &msg, id, tenant, handle);
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
        if handle.add_channel(&ch) {
            tenant.metrics.subscriptions.increment(1.0);
        }
    }
}

/// Answers a client operation with `err` `code`, counted by code.
fn refuse(code: ErrorCode, msg: &str, id: Option<u64>, tenant: &Tenant, handle: &SessionHandle) {
    tenant.metrics.client_error(code.as_str());
    handle.deliver_ctrl("err", &proto::encode_err(id, code, msg));
}

fn refuse_sub(r: SubRefusal, id: Option<u64>, tenant: &Tenant, handle: &SessionHandle) {
    match r {
        SubRefusal::Denied(code, msg) => {
            refuse(
                ErrorCode::Forbidden,
                &format!("{code}: {msg}"),
                id,
                tenant,
                handle,
            );
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
