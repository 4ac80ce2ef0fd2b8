//! One client connection of the load generator, WebSocket or SSE.
//!
//! Owns: connecting from a chosen loopback source address, the handshake,
//! subscribing (and waiting for every ack), then reading until told to stop:
//! answering pings, checking `seq`/`prev` per channel and recording
//! publish-to-receive latency from the payload's `t` (Unix nanoseconds).
//! Runs on a worker's single-threaded runtime; the stats it writes are shared
//! with the other connections of that worker without locks.

use crate::track::{SeqTracker, Stats};
use anyhow::{bail, Context as _};
use herald_proto::ws::{decode_frame_with, encode_client_frame, OpCode, Role};
use serde::Deserialize;
use std::borrow::Cow;
use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// The client's masking key; the protocol only needs one, not a secret one.
const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
/// A valid `Sec-WebSocket-Key` (16 bytes, base64); the same for every client.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// Largest frame a client accepts.
const MAX_FRAME: usize = 1 << 20;
/// Time for connect + handshake + acks of one connection.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Ws,
    Sse,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Ws => "ws",
            Transport::Sse => "sse",
        }
    }
}

/// Which protocol the server speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dialect {
    /// Herald's v1 protocol (and the raw baseline's copy of it): `sub` ops
    /// with acks, `msg` envelopes carrying `seq`/`prev`.
    Herald { tenant: String },
    /// A peer that delivers the published payload itself (nchan, Python
    /// websockets): channels are named in the request path, where `{chs}` in
    /// this template becomes the comma-separated list; order is checked
    /// from the payload's own `ch`/`n`.
    Bare { path: String },
}

impl Dialect {
    /// The request path for subscribing to `channels` over `transport`.
    pub fn path(&self, transport: Transport, channels: &[String]) -> String {
        match self {
            Dialect::Herald { tenant } => match transport {
                Transport::Ws => format!("/v1/t/{tenant}/ws"),
                Transport::Sse => {
                    let q: Vec<String> = channels.iter().map(|c| format!("ch={c}")).collect();
                    format!("/v1/t/{tenant}/sse?{}", q.join("&"))
                }
            },
            Dialect::Bare { path } => path.replace("{chs}", &channels.join(",")),
        }
    }
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ConnSpec {
    pub target: SocketAddr,
    pub source: IpAddr,
    pub dialect: Dialect,
    pub transport: Transport,
    /// SO_RCVBUF to ask for (None: the kernel's default, as an ordinary
    /// client has). A small one makes a client that stops reading push back
    /// on the server after kilobytes instead of a hundred or more.
    pub rcvbuf: Option<u32>,
    /// Offer permessage-deflate (RFC 7692) and inflate what comes compressed.
    pub deflate: bool,
}

pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The server frames a client looks at; other fields are skipped.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(borrow, default)]
    ch: Option<Cow<'a, str>>,
    seq: Option<u64>,
    prev: Option<u64>,
    id: Option<u64>,
    #[serde(borrow, default)]
    data: Option<Payload<'a>>,
    #[serde(borrow, default)]
    code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    msg: Option<Cow<'a, str>>,
}

/// The bench's payload: `{"t":<unix nanos>,"ch":"c0","n":7,…}`.
#[derive(Deserialize)]
struct Payload<'a> {
    t: Option<u64>,
    #[serde(borrow, default)]
    ch: Option<Cow<'a, str>>,
    n: Option<u64>,
}

/// What one server frame was, for the caller's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Ack { id: Option<u64> },
    Msg,
    Err(String),
    Other,
}

/// Applies one JSON frame (a WS text frame or an SSE `data:`) to the tracker
/// and the stats. Pure apart from its arguments; `now_ns` is the receive time.
pub fn on_json(text: &[u8], now_ns: u64, tracker: &mut SeqTracker, stats: &mut Stats) -> Event {
    stats.frames += 1;
    let f: Frame<'_> = match serde_json::from_slice(text) {
        Ok(f) => f,
        Err(_) => {
            stats.bad += 1;
            return Event::Other;
        }
    };
    match &*f.op {
        "msg" => {
            stats.msgs += 1;
            match (f.ch.as_deref(), f.seq, f.prev) {
                (Some(ch), Some(seq), Some(prev)) => {
                    stats.count_check(tracker.on_msg(ch, seq, prev))
                }
                _ => stats.bad += 1,
            }
            match f.data.as_ref().and_then(|d| d.t) {
                Some(t) => stats.latency_us.record(now_ns.saturating_sub(t) / 1000),
                None => stats.bad += 1,
            }
            Event::Msg
        }
        "ack" => {
            if let (Some(ch), Some(seq)) = (f.ch.as_deref(), f.seq) {
                tracker.start(ch, Some(seq));
            }
            Event::Ack { id: f.id }
        }
        "err" | "gap" => {
            stats.server_errors += 1;
            Event::Err(format!(
                "{} {}: {}",
                f.op,
                f.code.as_deref().unwrap_or(""),
                f.msg.as_deref().unwrap_or("")
            ))
        }
        _ => Event::Other,
    }
}

/// Applies one payload delivered as-is by a peer (nchan, Python websockets):
/// order is checked from the publisher's per-channel counter `n`.
pub fn on_bare(text: &[u8], now_ns: u64, tracker: &mut SeqTracker, stats: &mut Stats) -> Event {
    stats.frames += 1;
    let p: Payload<'_> = match serde_json::from_slice(text) {
        Ok(p) => p,
        Err(_) => {
            stats.bad += 1;
            return Event::Other;
        }
    };
    stats.msgs += 1;
    match (p.ch.as_deref(), p.n) {
        (Some(ch), Some(n)) if n > 0 => stats.count_check(tracker.on_msg(ch, n, n - 1)),
        _ => stats.bad += 1,
    }
    match p.t {
        Some(t) => stats.latency_us.record(now_ns.saturating_sub(t) / 1000),
        None => stats.bad += 1,
    }
    Event::Msg
}

/// How a connection's reading ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The worker was told to stop.
    Stopped,
    /// The worker was told to drop every connection and reconnect at once.
    Storm,
    /// The server closed it, or it failed.
    Closed,
}

/// An open, subscribed connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    tracker: SeqTracker,
    transport: Transport,
    bare: bool,
    /// permessage-deflate was agreed.
    deflate: bool,
}

async fn connect(spec: &ConnSpec) -> anyhow::Result<TcpStream> {
    let sock = match spec.source {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // Close with RST so thousands of closed client ports do not sit in
    // TIME_WAIT and starve the next run's source ports.
    sock.set_zero_linger()?;
    if let Some(bytes) = spec.rcvbuf {
        sock.set_recv_buffer_size(bytes)?;
    }
    sock.bind(SocketAddr::new(spec.source, 0))
        .with_context(|| format!("binding {}", spec.source))?;
    let stream = sock
        .connect(spec.target)
        .await
        .with_context(|| format!("connecting to {}", spec.target))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reads until a complete response head; returns (status, head length).
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<(u16, usize)> {
    loop {
        if let Some(h) = crate::http::parse_head(buf)? {
            return Ok((h.status, h.head_len));
        }
        if buf.len() > 16 * 1024 {
            bail!("response head longer than 16 KiB");
        }
        if stream.read_buf(buf).await? == 0 {
            bail!("connection closed during the handshake");
        }
    }
}

impl Conn {
    /// Connects, completes the handshake and subscribes to `channels`.
    pub async fn open(
        spec: &ConnSpec,
        channels: &[String],
        stats: &RefCell<Stats>,
    ) -> anyhow::Result<Conn> {
        let mut stream = connect(spec).await?;
        let mut buf = Vec::with_capacity(2048);
        let path = spec.dialect.path(spec.transport, channels);
        let bare = matches!(spec.dialect, Dialect::Bare { .. });
        let (req, want) = match spec.transport {
            Transport::Ws => (
                format!(
                    "GET {path} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                     Sec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\n{}\r\n",
                    spec.target,
                    if spec.deflate {
                        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
                    } else {
                        ""
                    }
                ),
                101,
            ),
            Transport::Sse => (
                format!(
                    "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
                    spec.target
                ),
                200,
            ),
        };
        stream.write_all(req.as_bytes()).await?;
        let (status, head_len) = read_head(&mut stream, &mut buf).await?;
        if status != want {
            bail!(
                "handshake answered {status}: {}",
                String::from_utf8_lossy(&buf[head_len..]).trim()
            );
        }
        // Compressed frames are read only where the server agreed.
        let deflate = spec.deflate
            && String::from_utf8_lossy(&buf[..head_len])
                .to_ascii_lowercase()
                .contains("sec-websocket-extensions: permessage-deflate");
        buf.drain(..head_len);
        let mut conn = Conn {
            stream,
            buf,
            tracker: SeqTracker::default(),
            transport: spec.transport,
            bare,
            deflate,
        };
        if bare || spec.transport == Transport::Sse {
            // No acks: positions start at each channel's first message.
            for ch in channels {
                conn.tracker.start(ch, None);
            }
            return Ok(conn);
        }
        let mut subs = Vec::new();
        for (i, ch) in channels.iter().enumerate() {
            let op = serde_json::json!({"op": "sub", "ch": ch, "id": i + 1}).to_string();
            subs.extend_from_slice(&encode_client_frame(OpCode::Text, op.as_bytes(), MASK));
        }
        conn.stream.write_all(&subs).await?;
        let mut acked = 0;
        while acked < channels.len() {
            if conn.stream.read_buf(&mut conn.buf).await? == 0 {
                bail!("closed before all subscriptions were acknowledged");
            }
            let mut st = stats.borrow_mut();
            let (events, _) = conn.process_ws(&mut st)?;
            for e in events {
                match e {
                    Event::Ack { .. } => acked += 1,
                    Event::Err(m) => bail!("subscribe refused: {m}"),
                    _ => {}
                }
            }
        }
        Ok(conn)
    }

    /// Decodes every complete WS frame in the buffer. Returns the events and
    /// the bytes to send back (pongs); `Err` on a protocol error or close.
    fn process_ws(&mut self, stats: &mut Stats) -> anyhow::Result<(Vec<Event>, Vec<u8>)> {
        let mut events = Vec::new();
        let mut reply = Vec::new();
        let mut pos = 0;
        let now = now_nanos();
        let result = loop {
            let head = match decode_frame_with(
                &mut self.buf[pos..],
                Role::FromServer,
                MAX_FRAME,
                self.deflate,
            ) {
                Ok(Some(h)) => h,
                Ok(None) => break Ok(()),
                Err(e) => break Err(anyhow::anyhow!("bad frame from server: {e}")),
            };
            let wire = &self.buf[pos + head.payload_start..pos + head.frame_len()];
            let inflated;
            let payload = if head.compressed {
                match herald_proto::deflate::inflate(wire, MAX_FRAME) {
                    Ok(p) => {
                        inflated = p;
                        &inflated[..]
                    }
                    Err(e) => break Err(anyhow::anyhow!("bad compressed frame: {e}")),
                }
            } else {
                wire
            };
            match head.opcode {
                OpCode::Text | OpCode::Binary if self.bare => {
                    events.push(on_bare(payload, now, &mut self.tracker, stats))
                }
                OpCode::Text => events.push(on_json(payload, now, &mut self.tracker, stats)),
                OpCode::Ping => {
                    stats.pings += 1;
                    reply.extend_from_slice(&encode_client_frame(OpCode::Pong, payload, MASK));
                }
                OpCode::Close => {
                    let code = if payload.len() >= 2 {
                        u16::from_be_bytes([payload[0], payload[1]])
                    } else {
                        1005
                    };
                    stats.count_close(code);
                    break Err(anyhow::anyhow!("server closed with code {code}"));
                }
                _ => {}
            }
            pos += head.frame_len();
        };
        self.buf.drain(..pos);
        result.map(|_| (events, reply))
    }

    /// Handles every complete SSE event in the buffer; `Err` on a close event.
    fn process_sse(&mut self, stats: &mut Stats) -> anyhow::Result<()> {
        let now = now_nanos();
        let mut pos = 0;
        let mut result = Ok(());
        while let Some(end) = find(&self.buf[pos..], b"\n\n") {
            let block = &self.buf[pos..pos + end];
            pos += end + 2;
            let mut event: &[u8] = b"message";
            let mut data: Vec<u8> = Vec::new();
            let mut lines = 0;
            for line in block.split(|b| *b == b'\n') {
                if let Some(v) = line.strip_prefix(b"event:") {
                    event = v.trim_ascii();
                } else if let Some(v) = line.strip_prefix(b"data:") {
                    if lines > 0 {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(v.strip_prefix(b" ").unwrap_or(v));
                    lines += 1;
                } else if line.starts_with(b":") {
                    stats.pings += 1;
                }
            }
            if lines == 0 {
                continue;
            }
            if event == b"close" {
                stats.count_close(4000);
                result = Err(anyhow::anyhow!(
                    "server ended the stream: {}",
                    String::from_utf8_lossy(&data)
                ));
                break;
            }
            if self.bare {
                on_bare(&data, now, &mut self.tracker, stats);
            } else {
                on_json(&data, now, &mut self.tracker, stats);
            }
        }
        self.buf.drain(..pos);
        result
    }

    /// Reads until `stop` turns true, a storm is called (`storm` changes) or
    /// the connection ends. With `read` false it never reads (a client that
    /// stopped reading), so the server's writes pile up.
    pub async fn run(
        mut self,
        mut stop: watch::Receiver<bool>,
        mut storm: watch::Receiver<u64>,
        stats: Rc<RefCell<Stats>>,
        read: bool,
    ) -> End {
        storm.mark_unchanged();
        // Anything that arrived with the acks is handled first.
        if read && !self.buf.is_empty() && self.step(&stats).await.is_err() {
            stats.borrow_mut().closed_early += 1;
            return End::Closed;
        }
        loop {
            if *stop.borrow() {
                return End::Stopped;
            }
            tokio::select! {
                biased;
                _ = stop.changed() => return End::Stopped,
                _ = storm.changed() => return End::Storm,
                r = self.stream.read_buf(&mut self.buf), if read => {
                    let ended = match r {
                        Ok(0) | Err(_) => true,
                        Ok(n) => {
                            stats.borrow_mut().wire_bytes += n as u64;
                            self.step(&stats).await.is_err()
                        }
                    };
                    if ended {
                        stats.borrow_mut().closed_early += 1;
                        return End::Closed;
                    }
                }
            }
        }
    }

    async fn step(&mut self, stats: &RefCell<Stats>) -> anyhow::Result<()> {
        match self.transport {
            Transport::Ws => {
                let (_, reply) = self.process_ws(&mut stats.borrow_mut())?;
                if !reply.is_empty() {
                    self.stream.write_all(&reply).await?;
                }
            }
            Transport::Sse => self.process_sse(&mut stats.borrow_mut())?,
        }
        if self.buf.capacity() > 64 * 1024 && self.buf.len() < 4096 {
            self.buf.shrink_to(8192);
        }
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_frames_update_stats() {
        let mut tr = SeqTracker::default();
        let mut st = Stats::default();
        let ack = br#"{"op":"ack","id":1,"ch":"c","epoch":9,"seq":4}"#;
        assert_eq!(
            on_json(ack, 0, &mut tr, &mut st),
            Event::Ack { id: Some(1) }
        );
        let t = 1_000_000_000u64;
        let m =
            format!(r#"{{"op":"msg","ch":"c","seq":5,"prev":4,"data":{{"t":{t},"pad":"xx\"y"}}}}"#);
        assert_eq!(
            on_json(m.as_bytes(), t + 2_500_000, &mut tr, &mut st),
            Event::Msg
        );
        let m = format!(r#"{{"op":"msg","ch":"c","seq":8,"prev":7,"data":{{"t":{t}}}}}"#);
        on_json(m.as_bytes(), t + 1_000, &mut tr, &mut st);
        assert_eq!(
            (st.frames, st.msgs, st.gaps, st.missing, st.bad),
            (3, 2, 1, 2, 0)
        );
        assert_eq!(st.latency_us.max(), 2500);
        let e = on_json(
            br#"{"op":"err","id":2,"code":"forbidden","msg":"no \"way\""}"#,
            0,
            &mut tr,
            &mut st,
        );
        assert_eq!(e, Event::Err("err forbidden: no \"way\"".into()));
        on_json(b"not json", 0, &mut tr, &mut st);
        assert_eq!(st.bad, 1);
    }
}
