//! `bench raw-server`: the same-run baseline, a minimal WebSocket fan-out
//! server with ONE `write()` per frame per subscriber and nothing else.
//!
//! Owns: the handshake (same request Herald accepts), `sub` ops answered with
//! an ack, `POST /v1/t/{t}/publish` (same body and answer shape as Herald, no
//! key check), `GET /readyz`. A publish encodes the frame once and writes it
//! to each subscriber's socket right there, from the publishing task: no
//! queue, no task wake-up, no batching. A socket that cannot take a frame
//! whole loses that frame (counted in `dropped`) — the baseline measures the
//! cost of the write itself, not a delivery guarantee.

use herald_proto::ws::{self, decode_frame, encode_frame, OpCode, Role};
use herald_proto::{self as proto, ClientOp, PayloadKind};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

#[derive(Debug, Clone, clap::Args)]
pub struct RawArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

struct RawChannel {
    seq: u64,
    subs: Vec<Arc<TcpStream>>,
}

#[derive(Default)]
struct Hub {
    channels: Mutex<HashMap<String, RawChannel>>,
}

#[derive(Deserialize)]
struct Item {
    ch: String,
    data: Box<RawValue>,
}

pub fn main(args: RawArgs) -> anyhow::Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(serve(args.listen))
}

async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let sock = TcpSocket::new_v4()?;
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    let listener = sock.listen(4096)?;
    let hub = Arc::new(Hub::default());
    eprintln!("raw-server listening on {addr}");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                eprintln!("raw-server: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(hub.clone(), stream));
    }
}

/// Routes one connection by its first request.
async fn connection(hub: Arc<Hub>, mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let (head_len, req) = match read_request(&mut stream, &mut buf).await {
            Some(r) => r,
            None => return,
        };
        if req.upgrade {
            buf.drain(..head_len);
            let response = format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
                ws::accept_key(&req.key)
            );
            if stream.write_all(response.as_bytes()).await.is_ok() {
                ws_session(hub, stream, buf).await;
            }
            return;
        }
        // Plain HTTP, keep-alive: wait for the whole body.
        let total = head_len + req.content_length;
        while buf.len() < total {
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let body: Vec<u8> = buf[head_len..total].to_vec();
        buf.drain(..total);
        let (status, answer) = if req.method == "GET" && req.path == "/readyz" {
            ("200 OK", "{\"ready\":true}".to_string())
        } else if req.method == "POST" && req.path.ends_with("/publish") {
            match publish(&hub, &body) {
                Ok(a) => ("200 OK", a),
                Err(e) => (
                    "400 Bad Request",
                    serde_json::json!({"error": {"code": "bad_request", "message": e}}).to_string(),
                ),
            }
        } else {
            (
                "404 Not Found",
                "{\"error\":{\"code\":\"not_found\",\"message\":\"raw server\"}}".to_string(),
            )
        };
        let out = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if stream.write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}

struct Request {
    method: String,
    path: String,
    content_length: usize,
    upgrade: bool,
    key: String,
}

async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, Request)> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Request::new(&mut headers);
        match r.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                let mut req = Request {
                    method: r.method.unwrap_or("").to_string(),
                    path: r.path.unwrap_or("").to_string(),
                    content_length: 0,
                    upgrade: false,
                    key: String::new(),
                };
                for h in r.headers.iter() {
                    let v = std::str::from_utf8(h.value).unwrap_or("").trim();
                    if h.name.eq_ignore_ascii_case("content-length") {
                        req.content_length = v.parse().unwrap_or(0);
                    } else if h.name.eq_ignore_ascii_case("upgrade") {
                        req.upgrade = v.eq_ignore_ascii_case("websocket");
                    } else if h.name.eq_ignore_ascii_case("sec-websocket-key") {
                        req.key = v.to_string();
                    }
                }
                return Some((n, req));
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return None,
        }
        if buf.len() > 16 * 1024 {
            return None;
        }
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Publishes a body of one item or an array; writes every frame to every
/// subscriber with one `write()` each. Answers like Herald's publish API.
fn publish(hub: &Hub, body: &[u8]) -> Result<String, String> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let (items, batch) = match first {
        Some(b'[') => (
            serde_json::from_slice::<Vec<Item>>(body).map_err(|e| e.to_string())?,
            true,
        ),
        Some(b'{') => (
            vec![serde_json::from_slice::<Item>(body).map_err(|e| e.to_string())?],
            false,
        ),
        _ => return Err("body must be a JSON object or array".into()),
    };
    let mut results = Vec::with_capacity(items.len());
    for item in &items {
        let mut map = hub.channels.lock().unwrap_or_else(|p| p.into_inner());
        let chan = map.entry(item.ch.clone()).or_insert_with(|| RawChannel {
            seq: 0,
            subs: Vec::new(),
        });
        let prev = chan.seq;
        chan.seq += 1;
        let seq = chan.seq;
        let json = proto::encode_msg(
            &item.ch,
            seq,
            prev,
            item.data.get().as_bytes(),
            PayloadKind::Json,
        );
        let frame = encode_frame(OpCode::Text, json.as_bytes());
        let (mut delivered, mut dropped) = (0u64, 0u64);
        chan.subs.retain(|s| match s.try_write(&frame) {
            Ok(n) if n == frame.len() => {
                delivered += 1;
                true
            }
            // Part of a frame went out: this stream is no longer valid WebSocket.
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                dropped += 1;
                true
            }
            Err(_) => false,
        });
        results.push(serde_json::json!({"ch": item.ch, "seq": seq, "delivered": delivered, "dropped": dropped}));
    }
    let answer = if batch {
        serde_json::json!({ "results": results })
    } else {
        results.pop().unwrap_or_default()
    };
    Ok(answer.to_string())
}

/// Reads client frames; answers `sub` with an ack; leaves every channel at the end.
async fn ws_session(hub: Arc<Hub>, stream: TcpStream, early: Vec<u8>) {
    let stream = Arc::new(stream);
    let mut partial = early;
    let mut joined: Vec<String> = Vec::new();
    'outer: loop {
        if !partial.is_empty() {
            let mut used = 0;
            loop {
                let head = match decode_frame(&mut partial[used..], Role::FromClient, 65_536) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(_) => break 'outer,
                };
                let payload = &partial[used + head.payload_start..used + head.frame_len()];
                match head.opcode {
                    OpCode::Close => break 'outer,
                    OpCode::Text => {
                        if let Ok(ClientOp::Sub { ch, id, .. }) = proto::parse_client_op(payload) {
                            let mut map = hub.channels.lock().unwrap_or_else(|p| p.into_inner());
                            let chan = map.entry(ch.clone()).or_insert_with(|| RawChannel {
                                seq: 0,
                                subs: Vec::new(),
                            });
                            // The ack is written under the channel lock, so it precedes every message.
                            let ack = encode_frame(
                                OpCode::Text,
                                proto::encode_ack(id, Some((&ch, 1, chan.seq))).as_bytes(),
                            );
                            let _ = stream.try_write(&ack);
                            if !joined.contains(&ch) {
                                chan.subs.push(stream.clone());
                                joined.push(ch);
                            }
                        }
                    }
                    _ => {}
                }
                used += head.frame_len();
            }
            partial.drain(..used);
        }
        if stream.readable().await.is_err() {
            break;
        }
        let mut chunk = [0u8; 4096];
        match stream.try_read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => partial.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
    }
    let mut map = hub.channels.lock().unwrap_or_else(|p| p.into_inner());
    for ch in &joined {
        if let Some(c) = map.get_mut(ch) {
            c.subs.retain(|s| !Arc::ptr_eq(s, &stream));
        }
    }
}
