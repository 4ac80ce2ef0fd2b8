//! A WebSocket session's reading side: frames decoded from what the socket
//! gave (partial frames under a deadline), client operations acted on
//! (subscribe with resume, unsubscribe, ping), refusals as `err` frames.

use super::*;

impl WsReader {
    /// Ends a session whose frame or fragmented message has been incomplete
    /// for longer than `deadline` (its bytes are bounded by the frame size;
    /// this bounds how long they are held).
    pub(super) fn check_incomplete(&mut self, deadline: Duration) -> Result<(), End> {
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
    pub(super) fn on_readable(
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
    pub(super) fn resume(
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

    pub(super) fn consume(
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

    pub(super) fn consume_slice(
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
    pub(super) fn decode_all(
        &mut self,
        data: &mut [u8],
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
        limits: &SessionLimits,
    ) -> Result<(usize, Option<PendingSub>), End> {
        let mut used = 0;
        loop {
            let head = match ws::decode_frame_with(
                &mut data[used..],
                Role::FromClient,
                limits.max_message_bytes,
                limits.deflate.is_some(),
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
            if limits.echo {
                match msg {
                    Some(Message::Text(t)) => {
                        handle.deliver_raw(echo_frame(ws::OpCode::Text, &t, limits));
                    }
                    Some(Message::Binary(b)) => {
                        handle.deliver_raw(echo_frame(ws::OpCode::Binary, &b, limits));
                    }
                    Some(Message::Ping(p)) => {
                        handle.deliver_raw(ws::encode_frame(ws::OpCode::Pong, &p));
                    }
                    Some(Message::Close(code)) => return Err(End::PeerClosed(code)),
                    None | Some(Message::Pong) => {}
                }
                continue;
            }
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

    pub(super) fn on_op(
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

    pub(super) fn complete_sub(
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
    pub(super) fn subscribe(
        &mut self,
        ch: String,
        since: Option<u64>,
        epoch: Option<u64>,
        id: Option<u64>,
        tenant: &Tenant,
        handle: &Arc<SessionHandle>,
    ) {
        let history = tenant.settings().limits.history();
        let joined = tenant.hub.subscribe(
            &ch,
            handle,
            since.map(|s| (s, epoch)),
            history,
            now_ms() as u64,
            |ep, head| {
                handle.deliver_ctrl("ack", &proto::encode_ack(id, Some((&ch, ep, head))));
            },
        );
        if handle.add_channel(joined.name) {
            tenant.metrics.subscriptions.increment(1.0);
        }
    }
}

/// Answers a client operation with `err` `code`, counted by code.
pub(super) fn refuse(
    code: ErrorCode,
    msg: &str,
    id: Option<u64>,
    tenant: &Tenant,
    handle: &SessionHandle,
) {
    tenant.metrics.client_error(code.as_str());
    handle.deliver_ctrl("err", &proto::encode_err(id, code, msg));
}

pub(super) fn refuse_sub(r: SubRefusal, id: Option<u64>, tenant: &Tenant, handle: &SessionHandle) {
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
        SubRefusal::Busy => {
            let msg = "the tenant's plugin threads and queue are full; try again later";
            handle.deliver_ctrl("err", &proto::encode_err(id, ErrorCode::PluginBusy, msg));
        }
        SubRefusal::Failed(kind) => {
            let msg = format!("the tenant's plugin failed ({kind}); try again later");
            handle.deliver_ctrl("err", &proto::encode_err(id, ErrorCode::PluginError, &msg));
        }
    }
}

/// The echo testee's answer: compressed as the session agreed.
fn echo_frame(op: ws::OpCode, payload: &[u8], limits: &SessionLimits) -> Bytes {
    match limits.deflate {
        Some(d) if d.applies_to(payload.len()) => {
            let mut z = Vec::new();
            if crate::proto::deflate::compress(payload, d.window_bits, &mut z) {
                ws::encode_compressed_frame(op, &z)
            } else {
                ws::encode_frame(op, payload)
            }
        }
        _ => ws::encode_frame(op, payload),
    }
}

pub(super) fn frame_error(e: FrameError, tenant: &Tenant) -> End {
    tenant.metrics.client_error(match e {
        FrameError::TooBig { .. } => "too_big",
        FrameError::BadUtf8 => "bad_utf8",
        FrameError::BadDeflate => "bad_deflate",
        FrameError::Protocol(_) => "protocol",
    });
    End::Close(e.close_code(), e.to_string())
}
