//! The listener and the front door. This file: the front door's state
//! ([`Server`]: the node and [`ServerSettings`]), reading a connection's first
//! head and routing it, opening a WebSocket or SSE session once admitted
//! (`admission.rs`); the accept loops are `accept.rs`, TLS `tls.rs`.
//!
//! Owns: accepting connections, reading each connection's first request head,
//! and routing it: WebSocket upgrades and SSE streams become sessions here
//! (so they hold no HTTP-framework buffers while idle); everything else goes
//! to the axum router through hyper, and a session request arriving later on
//! that kept-alive connection is taken back from hyper (`http.rs`). Both paths
//! admit a session through the same checks ([`open_ws`], [`open_sse`]).
//! Invariants: over-capacity clients are answered at once (503 + Retry-After)
//! and never left in the accept queue; accept errors back off and are
//! counted, never spun on; no task outlives the shutdown deadline.

mod accept;
pub mod tls;
pub use accept::{accept_loop, accept_tls};
mod admission;
pub mod head;
mod http;
mod inline_wake;
mod peer_window;
mod prefixed;
pub mod session;
use admission::admit;

use crate::node::Node;
use crate::plugin;
use crate::proto::{self, sse, ws};
use crate::tenant::DoorSlot;
use axum::http::StatusCode;
use bytes::Bytes;
use head::{RequestHead, Route};
use std::collections::HashSet;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The front door's settings (from `herald serve`'s flags).
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// A request head's deadline, and a kept-alive connection's idle one.
    pub head_timeout: Duration,
    /// How long a kept-alive HTTP connection may live, busy or not.
    pub max_connection_age: Duration,
    /// A session's keep-alive (WebSocket ping, SSE comment) interval.
    pub heartbeat: Duration,
    /// SO_SNDBUF for accepted sockets; `None` keeps the kernel's autotuning.
    pub socket_send_buffer: Option<usize>,
    /// TLS handshakes in progress, in all and per client address (0: no bound).
    pub max_pending_connections: usize,
    pub max_pending_per_address: usize,
    /// `--echo-tenant`: this tenant's WebSocket sessions echo what they are
    /// sent (the Autobahn testsuite's testee; never set in production).
    pub echo_tenant: Option<String>,
}

/// The front door's state: the node it admits sessions to and its settings.
pub struct Server {
    pub node: Arc<Node>,
    pub settings: ServerSettings,
}

impl std::ops::Deref for Server {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

#[cfg(test)]
impl Server {
    /// A front door on a test node, with `herald serve`'s defaults.
    pub(crate) async fn for_tests() -> Arc<Server> {
        Arc::new(Server {
            node: Node::for_tests().await,
            settings: ServerSettings {
                head_timeout: Duration::from_secs(10),
                max_connection_age: Duration::from_secs(600),
                heartbeat: Duration::from_secs(25),
                socket_send_buffer: None,
                max_pending_connections: 16_384,
                max_pending_per_address: 0,
                echo_tenant: None,
            },
        })
    }
}

/// Reads the first request head and routes the connection.
pub(super) async fn front_door(
    app: Arc<Server>,
    mut stream: TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    door: DoorSlot,
) {
    let _ = stream.set_nodelay(true);
    if let Some(n) = app.settings.socket_send_buffer {
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(n);
    }
    let mut buf = Vec::with_capacity(1024);
    let head_timeout = app.settings.head_timeout;
    let read = tokio::select! {
        r = tokio::time::timeout(head_timeout, read_head(&mut stream, &mut buf)) => r,
        // At the door bound the oldest door makes way for a new connection.
        _ = door.evicted() => return,
    };
    let head = match read {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) | Err(_) => return,
        Ok(Err(HeadFailure::Io)) => return,
        Ok(Err(HeadFailure::Bad(e))) => {
            let status = match e {
                head::HeadError::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                head::HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
            };
            let body = error_body("bad_request", &e.to_string());
            respond(&mut stream, status, &[], &body).await;
            return;
        }
    };
    match head::route(&head) {
        Route::WebSocket { tenant } => match open_ws(&app, &head, &tenant, peer).await {
            Ok((hs, admitted)) => {
                let protocol = hs
                    .protocol
                    .map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n"))
                    .unwrap_or_default();
                let extensions = hs
                    .extensions
                    .as_ref()
                    .map(|e| format!("Sec-WebSocket-Extensions: {e}\r\n"))
                    .unwrap_or_default();
                let response = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n{protocol}{extensions}\r\n",
                    hs.accept
                );
                if stream.write_all(response.as_bytes()).await.is_err() {
                    return;
                }
                let early = buf[head.len..].to_vec();
                drop(buf);
                drop(door);
                start_ws(app, stream, early, admitted);
            }
            Err(r) => r.write_to(&mut stream).await,
        },
        Route::Sse { tenant } => match open_sse(&app, &head, &tenant, peer).await {
            Ok((req, admitted)) => {
                drop(door);
                start_sse(app, stream, req, admitted).await
            }
            Err(r) => r.write_to(&mut stream).await,
        },
        Route::Http => http::serve(app, stream, Bytes::from(buf), peer, router, door).await,
    }
}

enum HeadFailure {
    Io,
    Bad(head::HeadError),
}

async fn read_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<RequestHead>, HeadFailure> {
    loop {
        // Read into the heap buffer: a stack array here would live in every
        // connection task's state for the connection's whole life.
        buf.reserve(2048);
        let n = stream.read_buf(buf).await.map_err(|_| HeadFailure::Io)?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(h) = head::parse_head(buf).map_err(HeadFailure::Bad)? {
            return Ok(Some(h));
        }
    }
}

pub fn error_body(code: &str, message: &str) -> String {
    serde_json::json!({"error": {"code": code, "message": message}}).to_string()
}

/// Writes a complete small HTTP response and closes the connection.
async fn respond(stream: &mut TcpStream, status: StatusCode, extra: &[(&str, String)], body: &str) {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(out.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// 1–5 s, so refused clients do not come back in one wave.
fn retry_after_secs() -> u64 {
    1 + rand::random::<u64>() % 5
}

/// A connection that passed admission: its slot and, for plugin tenants,
/// the session the plugin granted.
pub struct Admitted {
    pub slot: crate::tenant::ConnectionSlot,
    pub session: Option<Arc<plugin::Grant>>,
    /// The client's address (behind TLS, not the bridge's: server/tls.rs).
    pub remote: Option<SocketAddr>,
    /// The `Origin` it was admitted with: a change of the tenant's
    /// `allowed_origins` re-checks it (revocation).
    pub origin: Option<Box<str>>,
    /// permessage-deflate as agreed in the handshake (WebSocket only).
    pub deflate: Option<proto::deflate::Agreed>,
}

/// The WebSocket subprotocol Herald speaks; a browser client offers it
/// beside [`TOKEN_PROTOCOL`] and Herald answers with it.
pub const PROTOCOL: &str = "herald.v1";

/// Prefix of the subprotocol that carries a token (base64url, no padding):
/// browsers cannot set headers on a WebSocket, and a token there stays out
/// of URLs and access logs.
pub const TOKEN_PROTOCOL: &str = "herald.token.";

/// The subprotocols a WebSocket request offers.
fn offered_protocols(head: &RequestHead) -> impl Iterator<Item = &str> {
    head.headers
        .iter()
        .filter(|(n, _)| n == "sec-websocket-protocol")
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
}

/// The HTTP answer to a session request that does not become a session.
/// The front door writes it and closes; on a kept-alive connection hyper
/// sends it and the connection stays open.
struct Refused {
    status: StatusCode,
    extra: Vec<(&'static str, String)>,
    body: String,
}

impl Refused {
    fn new(status: StatusCode, code: &str, message: &str) -> Refused {
        Refused {
            status,
            extra: vec![],
            body: error_body(code, message),
        }
    }

    async fn write_to(self, stream: &mut TcpStream) {
        respond(stream, self.status, &self.extra, &self.body).await;
    }
}

fn busy(code: &str, message: &str) -> Refused {
    Refused {
        status: StatusCode::SERVICE_UNAVAILABLE,
        extra: vec![("Retry-After", retry_after_secs().to_string())],
        body: error_body(code, message),
    }
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Checks a WebSocket handshake request and admits it; returns the
/// `Sec-WebSocket-Accept` value and the admitted connection.
async fn open_ws(
    app: &Arc<Server>,
    head: &RequestHead,
    tenant: &str,
    peer: SocketAddr,
) -> Result<(Handshake, Admitted), Refused> {
    if head.header("sec-websocket-version").map(str::trim) != Some("13") {
        let mut r = Refused::new(
            StatusCode::UPGRADE_REQUIRED,
            "bad_request",
            "Sec-WebSocket-Version must be 13",
        );
        r.extra.push(("Sec-WebSocket-Version", "13".to_string()));
        return Err(r);
    }
    let Some(key) = head
        .header("sec-websocket-key")
        .filter(|k| k.trim().len() == 24)
    else {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "missing or invalid Sec-WebSocket-Key",
        ));
    };
    if !head.header_has_token("connection", "upgrade") {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "Connection header must include Upgrade",
        ));
    }
    // Cross-site WebSocket hijacking: a page elsewhere must not ride on the
    // cookies a browser sends along.
    if let Some(t) = app.tenants.get(tenant) {
        if t.settings().check_origin(head.header("origin")) == crate::tenant::OriginCheck::Refused {
            t.metrics.refused("origin_not_allowed");
            return Err(Refused::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "the tenant does not allow connections from this page's origin",
            ));
        }
    }
    let mut admitted = admit(app, tenant, "ws", head, peer).await?;
    // Compression only for a tenant that turned it on, and only as offered.
    if admitted.slot.tenant.settings().limits.deflate_min_bytes > 0 {
        admitted.deflate = proto::deflate::negotiate(
            head.headers
                .iter()
                .filter(|(n, _)| n == "sec-websocket-extensions")
                .map(|(_, v)| v.as_str()),
        );
    }
    let hs = Handshake {
        accept: ws::accept_key(key),
        protocol: offered_protocols(head)
            .any(|p| p == PROTOCOL)
            .then_some(PROTOCOL),
        extensions: admitted.deflate.map(|a| a.response()),
    };
    Ok((hs, admitted))
}

/// What a 101 answer carries besides the fixed headers.
pub(super) struct Handshake {
    pub accept: String,
    /// The subprotocol chosen; a client that offered `herald.v1` gets it
    /// (a browser fails a handshake that offered protocols and got none).
    pub protocol: Option<&'static str>,
    /// `Sec-WebSocket-Extensions` of the answer (permessage-deflate).
    pub extensions: Option<String>,
}

/// Runs an admitted WebSocket session whose 101 was sent. `early` holds
/// bytes the client sent after its handshake request.
fn start_ws(app: Arc<Server>, stream: TcpStream, early: Vec<u8>, admitted: Admitted) {
    // A task of its own, sized by the session alone, not by the handshake states.
    let tracker = app.tracker.clone();
    tracker.spawn(session::run_ws(app, stream, early, admitted));
}

/// Checks an SSE request (channels, resume position, subscription rights)
/// and admits it.
/// Admits an SSE stream; its response, and every refusal, carries the
/// tenant's CORS headers, so an allowed page can read a 401 or 403 too.
async fn open_sse(
    app: &Arc<Server>,
    head: &RequestHead,
    tenant_id: &str,
    peer: SocketAddr,
) -> Result<(session::SseRequest, Admitted), Refused> {
    let tenant = app.tenants.get(tenant_id);
    let settings = tenant.as_ref().map(|t| t.settings());
    let cors = match crate::tenant::cors_headers(settings.as_deref(), head.header("origin")) {
        Ok(h) => h,
        Err(h) => {
            if let Some(t) = &tenant {
                t.metrics.refused("origin_not_allowed");
            }
            let mut r = Refused::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "the tenant does not allow streams to this page's origin",
            );
            r.extra.extend(h);
            return Err(r);
        }
    };
    match check_sse(app, head, tenant_id, peer).await {
        Ok((mut req, admitted)) => {
            req.cors = cors;
            Ok((req, admitted))
        }
        Err(mut r) => {
            r.extra.extend(cors);
            Err(r)
        }
    }
}

async fn check_sse(
    app: &Arc<Server>,
    head: &RequestHead,
    tenant_id: &str,
    peer: SocketAddr,
) -> Result<(session::SseRequest, Admitted), Refused> {
    let mut channels = Vec::new();
    let mut last_event_id = head.header("last-event-id").map(str::to_string);
    for (k, v) in head.query_pairs() {
        match k.as_str() {
            "ch" => channels.push(v),
            "last_event_id" if last_event_id.is_none() => last_event_id = Some(v),
            _ => {}
        }
    }
    if channels.is_empty() {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "at least one `ch` query parameter is required",
        ));
    }
    for ch in &channels {
        if let Err(e) = proto::validate_channel(ch) {
            let msg = format!("channel {:?}: {e}", truncate(ch));
            return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_channel", &msg));
        }
    }
    // Each channel once, in first-seen order: the order of the `id:` positions.
    let mut seen = HashSet::with_capacity(channels.len());
    channels.retain(|ch| seen.insert(ch.clone()));
    drop(seen);
    if let Some(t) = app.tenants.get(tenant_id) {
        let max = t.settings().limits.max_subscriptions;
        if channels.len() > max {
            return Err(Refused::new(
                StatusCode::BAD_REQUEST,
                "too_many_subscriptions",
                &format!("at most {max} channels per stream"),
            ));
        }
        let max = t.settings().limits.max_channels;
        if channels.iter().any(|ch| !t.hub.may_open(ch, max)) {
            t.metrics.refused("too_many_channels");
            return Err(Refused::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_channels",
                &format!("the tenant has {max} channels, as many as its subscribers may open"),
            ));
        }
    }
    let unreadable_id = last_event_id.is_some();
    let resume = last_event_id.and_then(|id| sse::parse_last_event_id(&id, channels.len()));
    // An id this stream cannot read (another channel count, not Herald's):
    // what the client had is unknown, and it is told so.
    let unreadable_id = unreadable_id && resume.is_none();
    let admitted = admit(app, tenant_id, "sse", head, peer).await?;
    for ch in &channels {
        if let Err(refusal) =
            session::authorize_subscribe(&admitted.slot.tenant, admitted.session.clone(), ch).await
        {
            return Err(match refusal {
                session::SubRefusal::Denied(code, msg) => {
                    Refused::new(StatusCode::FORBIDDEN, &code, &msg)
                }
                session::SubRefusal::Busy => busy(
                    "plugin_busy",
                    "the tenant's plugin threads and queue are full; try again later",
                ),
                session::SubRefusal::Failed(kind) => busy(
                    &format!("plugin_{kind}"),
                    "the tenant's plugin failed to authorize this subscription",
                ),
            });
        }
    }
    Ok((
        session::SseRequest {
            channels,
            resume,
            unreadable_id,
            cors: Vec::new(),
        },
        admitted,
    ))
}

/// Sends the SSE response head and runs the admitted stream.
async fn start_sse(
    app: Arc<Server>,
    mut stream: TcpStream,
    req: session::SseRequest,
    admitted: Admitted,
) {
    let mut head_out = String::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
         X-Accel-Buffering: no\r\nConnection: close\r\n",
    );
    for (name, value) in &req.cors {
        head_out.push_str(&format!("{name}: {value}\r\n"));
    }
    head_out.push_str("\r\n");
    if stream.write_all(head_out.as_bytes()).await.is_err() {
        return;
    }
    let tracker = app.tracker.clone();
    tracker.spawn(session::run_sse(app, stream, req, admitted));
}
