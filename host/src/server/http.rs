//! Ordinary HTTP through hyper, and sessions on a kept-alive connection.
//!
//! Owns: serving a connection whose first request was not a session, and
//! taking the socket back from hyper when a later request is one (pooling
//! clients — curl, reqwest, httpx, Go, Java — send their SSE request or
//! WebSocket upgrade on a connection that already served a publish or a
//! health check). Each request's head is routed like the front door routes
//! a first one; a WebSocket upgrade or an SSE GET is admitted here with the
//! same checks, and a refusal is an ordinary response on a connection that
//! stays open. An admitted session ends hyper's connection after this
//! response (a 101 for WebSocket, written by hyper; for SSE a placeholder
//! that the socket discards, since the session writes its own head), and the
//! raw socket plus any bytes hyper had read past the request go to the
//! session. Invariant: a session never runs inside hyper — its connection
//! state and buffers are dropped before the session starts, so the session
//! is as lean as one that arrived first on its connection.

use super::head::{self, RequestHead, Route};
use super::prefixed::Prefixed;
use super::{open_sse, open_ws, session, start_sse, start_ws, Admitted, Refused};
use crate::server::Server;
use crate::tenant::DoorSlot;
use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower::ServiceExt;

/// What a connection becomes once hyper has answered its last request.
enum Takeover {
    Ws(Admitted),
    Sse(session::SseRequest, Admitted),
}

/// Shared by a connection's service (which admits a session) and its task
/// (which starts it when hyper is done).
struct Handoff {
    takeover: parking_lot::Mutex<Option<Takeover>>,
    /// Set with an SSE takeover: the socket drops hyper's placeholder response.
    discard_writes: Arc<AtomicBool>,
}

/// Serves `stream` (whose first head, `prefix`, the front door already
/// read) with the router until the client closes, the server shuts down, or a
/// request becomes a session.
pub(super) async fn serve(
    app: Arc<Server>,
    stream: TcpStream,
    prefix: Bytes,
    peer: SocketAddr,
    router: axum::Router,
    door: DoorSlot,
) {
    let handoff = Arc::new(Handoff {
        takeover: parking_lot::Mutex::new(None),
        discard_writes: Arc::new(AtomicBool::new(false)),
    });
    let io = TokioIo::new(Prefixed::new(
        prefix,
        stream,
        handoff.discard_writes.clone(),
    ));
    let service = Door {
        app: app.clone(),
        router,
        peer,
        handoff: handoff.clone(),
        served: AtomicU32::new(0),
    };
    let mut conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // hyper 1.12 runs this from the end of a response too: a kept-alive
        // connection idle this long is closed, like one dribbling a head.
        .header_read_timeout(app.settings.head_timeout)
        // Every request's head under the front door's cap (hyper's default
        // buffer takes ~400 KB of head on a kept-alive connection); hyper
        // answers a larger one 431.
        .max_buf_size(super::head::MAX_HEAD_BYTES)
        .serve_connection(io, service);
    // Past its age the connection ends after the request it is serving
    // (at once when idle), however busy it is kept.
    // So does a connection told to make way for a new one at the door
    // bound (server/accept.rs).
    let mut age = Box::pin(tokio::time::sleep(app.settings.max_connection_age));
    let mut evicted = Box::pin(door.evicted());
    let mut ending = false;
    // Without shutdown: when a request became a session, the socket must
    // come back open.
    let done = tokio::select! {
        r = std::future::poll_fn(|cx| {
            if !ending
                && (age.as_mut().poll(cx).is_ready() || evicted.as_mut().poll(cx).is_ready())
            {
                ending = true;
                Pin::new(&mut conn).graceful_shutdown();
            }
            conn.poll_without_shutdown(cx)
        }) => r,
        _ = app.shutdown.cancelled() => {
            Pin::new(&mut conn).graceful_shutdown();
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)),
            )
            .await;
            return;
        }
    };
    if let Err(e) = done {
        tracing::trace!(error = %e, "http connection ended with an error");
        return;
    }
    drop(evicted);
    let parts = conn.into_parts();
    let (unread, mut stream) = parts.io.into_inner().into_parts();
    let takeover = handoff.takeover.lock().take();
    // A session is counted as one from here; a closing socket no longer.
    drop(door);
    match takeover {
        None => {
            let _ = tokio::time::timeout(Duration::from_secs(2), stream.shutdown()).await;
        }
        Some(Takeover::Ws(admitted)) => {
            // Frames the client sent right after its upgrade request.
            let mut early = parts.read_buf.to_vec();
            early.extend_from_slice(&unread);
            drop(parts.read_buf);
            start_ws(app, stream, early, admitted);
        }
        Some(Takeover::Sse(req, admitted)) => start_sse(app, stream, req, admitted).await,
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// The per-connection service: session requests are admitted here, every
/// other request goes to the router.
struct Door {
    app: Arc<Server>,
    router: axum::Router,
    peer: SocketAddr,
    handoff: Arc<Handoff>,
    /// Requests this connection has been given.
    served: AtomicU32,
}

/// Requests one kept-alive connection serves; the last is answered with
/// `Connection: close` (nginx's `keepalive_requests` default).
pub const MAX_REQUESTS: u32 = 1000;

impl hyper::service::Service<Request<Incoming>> for Door {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn call(&self, req: Request<Incoming>) -> BoxFuture {
        // Only a GET under /v1/t/ can be a session; nothing else pays for a head copy.
        let head = (req.method() == axum::http::Method::GET
            && req.uri().path().starts_with("/v1/t/"))
        .then(|| RequestHead::from_http(&req));
        let route = head.as_ref().map_or(Route::Http, head::route);
        let (app, peer, handoff) = (self.app.clone(), self.peer, self.handoff.clone());
        let last = self.served.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_REQUESTS;
        match (route, head) {
            (Route::WebSocket { tenant }, Some(head)) => Box::pin(async move {
                Ok(match open_ws(&app, &head, &tenant, peer).await {
                    Ok((hs, admitted)) => {
                        *handoff.takeover.lock() = Some(Takeover::Ws(admitted));
                        switching_protocols(&hs)
                    }
                    Err(r) => closing(refusal(r), last),
                })
            }),
            (Route::Sse { tenant }, Some(head)) => Box::pin(async move {
                Ok(match open_sse(&app, &head, &tenant, peer).await {
                    Ok((sse, admitted)) => {
                        *handoff.takeover.lock() = Some(Takeover::Sse(sse, admitted));
                        // Hyper writes this response into the void; clients that
                        // pool connections do not pipeline, so nothing of an
                        // earlier response is still waiting in hyper's buffer.
                        handoff.discard_writes.store(true, Ordering::Release);
                        placeholder()
                    }
                    Err(r) => closing(refusal(r), last),
                })
            }),
            _ => {
                let router = self.router.clone();
                Box::pin(async move { Ok(closing(router.oneshot(req).await?, last)) })
            }
        }
    }
}

fn switching_protocols(hs: &super::Handshake) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&hs.accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = hs.protocol {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            header::HeaderValue::from_static(p),
        );
    }
    if let Some(v) = hs
        .extensions
        .as_deref()
        .and_then(|e| header::HeaderValue::from_str(e).ok())
    {
        h.insert(header::SEC_WEBSOCKET_EXTENSIONS, v);
    }
    r
}

/// Ends hyper's connection after this request; never reaches the client.
fn placeholder() -> Response<Body> {
    let mut r = Response::new(Body::empty());
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// `r`, with `Connection: close` when it is the connection's last.
fn closing(mut r: Response<Body>, last: bool) -> Response<Body> {
    if last {
        r.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    r
}

/// A refusal as an ordinary response: the connection stays usable.
fn refusal(r: Refused) -> Response<Body> {
    let mut resp = Response::new(Body::from(r.body));
    *resp.status_mut() = r.status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    for (name, value) in r.extra {
        if let Ok(v) = header::HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    resp
}
