//! The front door: sessions on any request of a connection, the answers it
//! gives before a session exists, SSE channel lists and resume.

use crate::helpers::*;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads a streaming reqwest body until `needle` has arrived; returns all text.
async fn read_until(resp: &mut reqwest::Response, needle: &str) -> String {
    let mut text = String::new();
    tokio::time::timeout(WAIT, async {
        while !text.contains(needle) {
            let chunk = resp.chunk().await.unwrap().expect("stream still open");
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{needle:?} not seen within {WAIT:?}; got {text:?}"));
    text
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

#[tokio::test]
async fn sse_on_a_pooled_connection_becomes_a_session() {
    let h = spawn_host().await;
    let key = h.public_tenant("fd-pool").await;
    let proxy = CountingProxy::start(h.addr).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let base = format!("http://{}", proxy.addr);
    let r = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let mut sse = client
        .get(format!("{base}/v1/t/fd-pool/sse?ch=a"))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    assert_eq!(
        sse.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    // The session is live (the retry hint comes first), then a message.
    read_until(&mut sse, "retry:").await;
    h.publish("fd-pool", &key, json!({"ch":"a","data":{"n":1}}))
        .await;
    let text = read_until(&mut sse, "id: ").await;
    assert!(
        text.contains("event: msg\ndata: {\"op\":\"msg\",\"ch\":\"a\",\"seq\":1"),
        "{text}"
    );
    assert_eq!(
        proxy.accepted(),
        1,
        "both requests went over one connection"
    );
    assert_eq!(
        h.metric("herald_connections_opened_total{tenant=\"fd-pool\",transport=\"sse\"}")
            .await,
        1.0
    );
    h.stop().await;
}

#[tokio::test]
async fn websocket_upgrade_after_a_keep_alive_request_on_one_socket() {
    let h = spawn_host().await;
    let key = h.public_tenant("fd-raw").await;
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(HEALTHZ).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 200, "{r:?}");
    // The upgrade and a first frame in one write: the frame must not be lost
    // in the HTTP layer's read buffer.
    let mut req = ws_upgrade_request("fd-raw", "").into_bytes();
    req.extend(client_text_frame(r#"{"op":"sub","ch":"c","id":1}"#));
    s.write_all(&req).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 101, "{r:?}");
    assert_eq!(
        r.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    let mut ws = ws_from_upgraded(s).await;
    let ack = ws.next().await;
    assert_eq!(
        (ack["op"].as_str(), ack["id"].as_u64()),
        (Some("ack"), Some(1))
    );
    h.publish("fd-raw", &key, json!({"ch":"c","data":7})).await;
    let m = ws.next().await;
    assert_eq!((m["seq"].as_u64(), m["data"].as_u64()), (Some(1), Some(7)));
    ws.send(json!({"op":"ping","id":2})).await;
    assert_eq!(ws.next().await, json!({"op":"pong","id":2}));
    assert_eq!(
        h.metric("herald_connections_opened_total{tenant=\"fd-raw\",transport=\"ws\"}")
            .await,
        1.0
    );
    h.stop().await;
}

#[tokio::test]
async fn sse_pipelined_behind_a_request_gets_both_answers() {
    let h = spawn_host().await;
    let key = h.public_tenant("fd-pipe").await;
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    let mut both = HEALTHZ.to_vec();
    both.extend_from_slice(b"GET /v1/t/fd-pipe/sse?ch=c HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(&both).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]), "{r:?}");
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let mut text = String::new();
    tokio::time::timeout(WAIT, async {
        while !text.contains("retry:") {
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "stream ended: {text:?}");
            text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        }
        h.publish("fd-pipe", &key, json!({"ch":"c","data":1})).await;
        while !text.contains("\"seq\":1") {
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "stream ended: {text:?}");
            text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no message on the stream: {text:?}"));
    h.stop().await;
}

#[tokio::test]
async fn refusals_on_a_later_request_keep_the_connection() {
    let h = spawn_host().await;
    h.public_tenant("fd-refuse").await;
    // First request of a connection: the front door answers and closes.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"GET /v1/t/fd-nobody/sse?ch=a HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 401, "{r:?}");
    // A later request: the same answers, and the connection stays usable.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    s.write_all(b"GET /v1/t/fd-nobody/sse?ch=a HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 401, "{r:?}");
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    s.write_all(b"GET /v1/t/fd-refuse/sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.status, 400);
    s.write_all(ws_upgrade_request("fd-nobody", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.status, 401);
    let bad_version = ws_upgrade_request("fd-refuse", "").replace("Version: 13", "Version: 8");
    s.write_all(bad_version.as_bytes()).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(
        (r.status, r.header("sec-websocket-version")),
        (426, Some("13")),
        "{r:?}"
    );
    // A tenant that fails closed refuses on a later request too.
    h.tenant(json!({"id": "fd-locked"})).await;
    s.write_all(b"GET /v1/t/fd-locked/sse?ch=a HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 401, "{r:?}");
    s.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    h.stop().await;
}

#[tokio::test]
async fn plain_get_to_ws_is_426_not_a_redirect() {
    let h = spawn_host().await;
    h.public_tenant("fd-426").await;
    let plain = b"GET /v1/t/fd-426/ws HTTP/1.1\r\nHost: x\r\n\r\n";
    // As the first request of a connection.
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    s.write_all(plain).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(
        (r.status, r.header("upgrade")),
        (426, Some("websocket")),
        "{r:?}"
    );
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["code"], "upgrade_required", "{body}");
    // As a later one, on the same connection.
    s.write_all(plain).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(
        (r.status, r.header("upgrade")),
        (426, Some("websocket")),
        "{r:?}"
    );
    // A client that follows redirects gets the answer, not a loop.
    let r = h.http.get(h.url("/v1/t/fd-426/ws")).send().await.unwrap();
    assert_eq!(r.status(), 426);
    h.stop().await;
}

#[tokio::test]
async fn sse_repeated_channel_is_subscribed_once() {
    let h = spawn_host().await;
    let key = h.public_tenant("fd-dedup").await;
    let mut s = h.sse("fd-dedup", "ch=a&ch=b&ch=a", None).await;
    assert_eq!(s.status, 200);
    h.publish("fd-dedup", &key, json!({"ch":"a","data":1}))
        .await;
    h.publish("fd-dedup", &key, json!({"ch":"b","data":2}))
        .await;
    let e = s.next().await.unwrap();
    assert_eq!(
        (e.data["ch"].as_str(), e.data["seq"].as_u64()),
        (Some("a"), Some(1))
    );
    // One position per distinct channel, in first-seen order.
    let id = e.id.unwrap();
    assert_eq!(id.split(',').count(), 2, "{id}");
    let e = s.next().await.unwrap();
    assert_eq!(e.data["ch"], "b", "a second copy of a arrived: {e:?}");
    assert_eq!(
        h.metric("herald_subscriptions{tenant=\"fd-dedup\"}").await,
        2.0
    );
    h.stop().await;
}

#[tokio::test]
async fn sse_resumes_from_the_last_event_id_query_parameter() {
    let h = spawn_host().await;
    let key = h.public_tenant("fd-resume").await;
    let mut s = h.sse("fd-resume", "ch=c", None).await;
    h.publish("fd-resume", &key, json!({"ch":"c","data":1}))
        .await;
    let id = s.next().await.unwrap().id.unwrap();
    drop(s);
    h.publish("fd-resume", &key, json!({"ch":"c","data":2}))
        .await;
    h.publish("fd-resume", &key, json!({"ch":"c","data":3}))
        .await;
    let mut s = h
        .sse("fd-resume", &format!("ch=c&last_event_id={id}"), None)
        .await;
    assert_eq!(s.status, 200);
    for seq in [2, 3] {
        assert_eq!(s.next().await.unwrap().data["seq"], seq);
    }
    h.stop().await;
}

/// Waits for the server to close `stream` (EOF or reset); how long it took.
pub(crate) async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t = Instant::now();
    let mut b = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|_| t.elapsed())
}

/// Sockets that never finish a request head (slowloris) are
/// counted and bounded; each slow one is closed at the head deadline however
/// it dribbles, and past the bound a new connection does not wait
/// for that: the oldest slow one is closed to make way for it.
#[tokio::test]
async fn slowloris_sockets_are_bounded_and_timed_out() {
    let mut opts = HostOptions::new();
    opts.config.max_pending_connections = 4;
    opts.config.head_timeout = Duration::from_secs(1);
    let h = spawn_with(opts).await;
    h.public_tenant("loris").await;
    // Let the admin client's kept-alive connection reach its deadline.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let start = Instant::now();
    let mut dribblers = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(h.addr).await.unwrap();
        s.write_all(b"GET /v1/t/loris/ws HTTP/1.1\r\nHo")
            .await
            .unwrap();
        dribblers.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A fifth is served at once: the oldest slow one makes way for it.
    let mut fifth = TcpStream::connect(h.addr).await.unwrap();
    fifth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let r = read_response(&mut fifth).await;
        (r.status, Instant::now())
    });
    // They keep dribbling a byte every 100 ms; the deadline still closes them.
    let mut open = dribblers.len();
    while open > 0 && start.elapsed() < Duration::from_secs(3) {
        open = 0;
        for s in &mut dribblers {
            if s.write_all(b"s").await.is_ok() {
                open += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &mut dribblers {
        assert!(
            closed_within(s, Duration::from_secs(1)).await.is_some(),
            "closed at the head deadline"
        );
    }
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "{:?}",
        start.elapsed()
    );
    let (status, answered) = waiting.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        answered.duration_since(start) < Duration::from_millis(900),
        "the fifth waited for the deadline: {:?}",
        answered.duration_since(start)
    );
    // The bound freed: a client gets in.
    let mut ws = h.ws("loris").await;
    ws.sub("c", 1).await;
    h.stop().await;
}

/// A kept-alive HTTP connection that stays idle after its
/// response is closed at the deadline, like one that never sent a head.
#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed() {
    let mut opts = HostOptions::new();
    opts.config.head_timeout = Duration::from_secs(1);
    let h = spawn_with(opts).await;
    let mut s = TcpStream::connect(h.addr).await.unwrap();
    for _ in 0..2 {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut s).await;
        assert_eq!(r.status, 200);
    }
    let idle = closed_within(&mut s, Duration::from_secs(3))
        .await
        .expect("closed while idle");
    assert!(idle >= Duration::from_millis(800), "{idle:?}");
    h.stop().await;
}

/// A client dribbling one frame holds its partial buffer only
/// until the deadline, then is closed with 1008 (before: for as long as it
/// kept dribbling).
#[tokio::test]
async fn a_dribbled_frame_is_cut_off_at_the_deadline() {
    let mut opts = HostOptions::new();
    opts.config.head_timeout = Duration::from_secs(1);
    let h = spawn_with(opts).await;
    h.public_tenant("dribble").await;
    let mut s = raw_ws_session(h.addr, "dribble").await;
    // A masked text frame announcing 1,000 bytes, sent a byte at a time.
    s.write_all(&[0x81, 0x80 | 126, 0x03, 0xE8, 1, 2, 3, 4])
        .await
        .unwrap();
    let start = Instant::now();
    let (mut rd, mut wr) = s.into_split();
    let dribble = tokio::spawn(async move {
        for _ in 0..60 {
            if wr.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got)).await;
    let took = start.elapsed();
    dribble.abort();
    // The server's frames: find its close and read the code.
    let mut i = 0;
    let mut code = None;
    while i + 2 <= got.len() {
        let (op, len) = (got[i] & 0x0F, (got[i + 1] & 0x7F) as usize);
        let (start, len) = match len {
            126 => (i + 4, u16::from_be_bytes([got[i + 2], got[i + 3]]) as usize),
            n => (i + 2, n),
        };
        if op == 0x8 && len >= 2 {
            code = Some(u16::from_be_bytes([got[start], got[start + 1]]));
        }
        i = start + len;
    }
    assert_eq!(code, Some(1008), "{got:?}");
    assert!(
        took < Duration::from_millis(2500),
        "cut off at the deadline, not after {took:?}"
    );
    h.stop().await;
}

/// With `--admin-listen` the admin API has a door of its own that
/// no client load can fill: while every client door of the main listener is
/// taken, an operator still gets answers there; and the main listener no
/// longer serves `/admin`.
#[tokio::test]
async fn the_admin_listener_answers_while_client_doors_are_full() {
    let admin_addr: std::net::SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut opts = HostOptions::new();
    opts.config.max_pending_connections = 4;
    opts.config.head_timeout = Duration::from_secs(10);
    opts.config.admin_listen = Some(admin_addr);
    let h = spawn_with(opts).await;
    let admin = |path: &str| {
        reqwest::Client::new()
            .get(format!("http://{admin_addr}{path}"))
            .bearer_auth(ADMIN)
            .timeout(Duration::from_secs(2))
            .send()
    };
    let r = admin("/admin/v1/tenants")
        .await
        .expect("the admin listener answers");
    assert_eq!(r.status(), 200);
    // The main listener: no admin API.
    let r = h
        .http
        .get(h.url("/admin/v1/tenants"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Every client door taken by sockets that send nothing.
    let mut idle = Vec::new();
    for _ in 0..6 {
        idle.push(TcpStream::connect(h.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let r = admin("/admin/v1/tenants")
        .await
        .expect("answered with the doors full");
    assert_eq!(r.status(), 200);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let r = admin("/readyz").await.unwrap();
    assert_eq!(r.status(), 200);
    drop(idle);
    h.stop().await;
}

/// One address cannot take every door. Past
/// `--max-pending-per-address` sockets that are not sessions yet, another
/// from the same address is closed at once (not parked in the backlog),
/// while other addresses are served.
#[tokio::test]
async fn one_address_cannot_take_every_door() {
    let mut opts = HostOptions::new();
    opts.config.max_pending_connections = 16;
    opts.config.max_pending_per_address = 3;
    opts.config.head_timeout = Duration::from_secs(10);
    let h = spawn_with(opts).await;
    // Let the harness's own kept-alive connection go.
    drop(h.http.clone());
    let addr = h.addr;
    let from = |ip: &'static str| async move { connect_from(ip, addr).await.unwrap() };
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(from("127.0.0.3").await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = from("127.0.0.3").await;
    assert!(
        closed_within(&mut fourth, Duration::from_secs(1))
            .await
            .is_some(),
        "a fourth socket from the same address is closed at once"
    );
    let mut other = from("127.0.0.4").await;
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_response(&mut other).await.status,
        200,
        "another address"
    );
    // One of the three leaves: the address has a door again.
    idle.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = from("127.0.0.3").await;
    again
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut again).await.status, 200);
    h.stop().await;
}
