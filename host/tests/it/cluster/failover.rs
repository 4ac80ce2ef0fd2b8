//! Nodes that go away: killed, drained for a deploy, processes sharing a port.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A node killed mid-stream: its clients reconnect to another node with the
/// `since`/`epoch` they hold and get what they missed — no gap, no
/// duplicate. The killed node, started again, catches up from its cursor.
#[tokio::test]
async fn a_killed_node_s_clients_resume_elsewhere() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let mut n = reg.nodes(&["a", "b", "c"]).await;
    let key = create(&n[1], json!({"id":"cl-fail","access":"public"})).await;
    for node in &n {
        within(PROPAGATION, "the tenant on every node", || async {
            node.ws("cl-fail", "").await.is_ok()
        })
        .await;
    }
    let mut ws = n[0].ws("cl-fail", "").await.unwrap();
    let ack = ws.sub("s", 1).await;
    let epoch = ack["epoch"].as_u64().unwrap();
    let publisher = Steady::start(&n[1], "cl-fail", &key, "s", Duration::from_millis(5));
    let before = msgs(&mut ws, 30).await;
    let a = n.remove(0);
    let killed = a.kill().await;
    // Message `answered` had not been answered yet, so the one after it was
    // published once A was dead: A never read it.
    let answered = publisher.sent() as usize;
    // Whatever was in flight to the client died with A.
    let last = before.last().unwrap()["seq"].as_u64().unwrap();
    let mut moved = n[1].ws("cl-fail", "").await.unwrap();
    moved
        .send(json!({"op":"sub","ch":"s","id":2,"since":last,"epoch":epoch}))
        .await;
    let ack = moved.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    assert_eq!(ack["epoch"], epoch, "epochs mean the same on every node");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = publisher.stop().await;
    let mut got: Vec<Value> = before.clone();
    catch_up(&mut moved, &mut got, published).await;
    for w in got.windows(2) {
        assert_eq!(w[1]["prev"], w[0]["seq"]);
    }

    // A again, on its stored cursor: it catches up with what was published
    // while it was down, so a client resuming there from a position it got
    // from B meanwhile misses nothing either.
    let a = Node::restart(killed).await;
    let mut back = a.ws("cl-fail", "").await.unwrap();
    let mid = &got[answered + 1];
    back.send(json!({"op":"sub","ch":"s","id":3,"since":mid["seq"],"epoch":epoch}))
        .await;
    let ack = back.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    let (s, v) = n[0]
        .publish("cl-fail", &key, json!({"ch":"s","data":{"i":published}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let mut tail = Vec::new();
    while tail
        .last()
        .is_none_or(|m: &Value| m["data"]["i"].as_u64() != Some(published))
    {
        let m = back.next().await;
        assert_ne!(m["op"], "gap", "no gap on the restarted node: {m}");
        if m["op"] == "msg" {
            tail.push(m);
        }
    }
    let want: Vec<u64> = (answered as u64 + 2..=published).collect();
    let is: Vec<u64> = tail
        .iter()
        .map(|m| m["data"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(is, want, "the restarted node caught up from its cursor");
    // From its cursor, not from the start: the log holds every row since the
    // tenant was made (a reader without a cursor starts there), and A had
    // delivered 30 rows, their batches' cursors stored, before it died.
    let (_, v) = a
        .admin(Method::GET, "/admin/v1/tenants/cl-fail/source", json!({}))
        .await;
    let read_again = v["health"]["records"].as_u64().unwrap();
    assert!(
        read_again + 20 <= published,
        "the restarted node read {read_again} of {} rows: not from its cursor; {v}",
        published + 1
    );
    a.kill().await;
    reg.finish(n).await;
}

/// A deploy: SIGTERM on A turns it not-ready at once while it still serves,
/// then its sessions close (1012) spread over the window, each client moves
/// to B with its `since`/`epoch` and misses nothing.
#[tokio::test]
async fn a_draining_node_lets_its_clients_go_gradually() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let a = reg
        .node_with("a", &["--drain-wait-secs", "1", "--drain-spread-secs", "2"])
        .await;
    let b = reg.node("b").await;
    let key = create(&b, json!({"id":"cl-drain","access":"public"})).await;
    within(PROPAGATION, "the tenant on A", || async {
        a.ws("cl-drain", "").await.is_ok()
    })
    .await;
    const CLIENTS: usize = 8;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut ws = a.ws("cl-drain", "").await.unwrap();
        let ack = ws.sub("d", 1).await;
        clients.push((ws, ack["epoch"].as_u64().unwrap()));
    }
    // An SSE client too: its stream ends with a `close` event carrying 1012.
    let mut sse = TcpStream::connect(("127.0.0.1", a.port)).await.unwrap();
    sse.write_all(
        b"GET /v1/t/cl-drain/sse?ch=d HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
    )
    .await
    .unwrap();
    let sse_closed = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match tokio::time::timeout(Duration::from_secs(15), sse.read(&mut buf)).await {
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
                other => panic!("the SSE stream was not ended: {other:?}"),
            }
        }
        String::from_utf8_lossy(&seen).to_string()
    });
    let publisher = Steady::start(&b, "cl-drain", &key, "d", Duration::from_millis(10));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = a.url("/readyz");
    let http = a.http.clone();
    let terminated = tokio::spawn(a.terminate());
    within(
        Duration::from_millis(500),
        "A not ready at once",
        || async {
            http.get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status() == 503)
        },
    )
    .await;
    let drained_at = Instant::now();
    // Each client reads until A closes it, then resumes on B.
    let mut tasks = Vec::new();
    for (mut ws, epoch) in clients {
        let b_port = b.port;
        tasks.push(tokio::spawn(async move {
            let mut got: Vec<Value> = Vec::new();
            let code = loop {
                match tokio::time::timeout(Duration::from_secs(10), ws.s.next()).await {
                    Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t)))) => {
                        let m: Value = serde_json::from_str(&t).unwrap();
                        if m["op"] == "msg" {
                            got.push(m);
                        }
                    }
                    Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(f))))) => {
                        break u16::from(f.code)
                    }
                    Ok(Some(Ok(_))) => {}
                    other => panic!("no close frame from the draining node: {other:?}"),
                }
            };
            let closed_after = drained_at.elapsed();
            let since = got.last().map_or(0, |m| m["seq"].as_u64().unwrap());
            let url = format!("ws://127.0.0.1:{b_port}/v1/t/cl-drain/ws");
            let (s, _) = tokio_tungstenite::connect_async(url).await.unwrap();
            let mut moved = Ws { s };
            moved
                .send(json!({"op":"sub","ch":"d","id":2,"since":since,"epoch":epoch}))
                .await;
            (code, closed_after, got, moved)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert!(terminated.await.unwrap().success(), "A exited cleanly");
    let stream = sse_closed.await.unwrap();
    let last = &stream[stream.rfind("event:").unwrap_or(0)..];
    assert!(
        last.contains("event: close") && last.contains(r#""code":1012"#),
        "the SSE stream's last event: {last}"
    );
    let published = publisher.stop().await;
    let mut closed: Vec<Duration> = results.iter().map(|r| r.1).collect();
    closed.sort();
    assert!(
        closed[0] >= Duration::from_millis(800),
        "nobody closed during the wait: {closed:?}"
    );
    assert!(
        closed[CLIENTS - 1] - closed[0] >= Duration::from_millis(1000),
        "closes spread over the window: {closed:?}"
    );
    for (code, _, mut got, mut moved) in results {
        assert_eq!(code, 1012, "a reconnect hint");
        catch_up(&mut moved, &mut got, published).await;
    }
    reg.finish([b]).await;
}

/// Several processes on one machine share a port (SO_REUSEPORT): the kernel
/// spreads connections over them, each a node of the cluster with its own
/// open-files limit and cores, and a publish reaches clients on all of them.
#[tokio::test]
async fn processes_share_a_port() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut procs = Vec::new();
    for id in ["p1", "p2"] {
        let args = [
            "--database-url",
            reg.url.as_str(),
            "--cluster",
            "--node-id",
            id,
            "--reuse-port",
        ];
        procs.push(Node::start_on(&reg.dir.path().join(id), &args, port).await);
    }
    let key = create(&procs[0], json!({"id":"cl-port","access":"public"})).await;
    // Whichever process a connection lands on, the tenant is there.
    within(PROPAGATION, "the tenant on both processes", || async {
        for _ in 0..12 {
            if procs[0].ws("cl-port", "").await.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    let mut clients = Vec::new();
    for _ in 0..24 {
        clients.push(procs[0].subscriber("cl-port", "p").await);
    }
    let (s, v) = procs[1]
        .publish("cl-port", &key, json!({"ch":"p","data":"hi"}))
        .await;
    assert_eq!(s, 200, "{v}");
    for ws in clients.iter_mut() {
        assert_eq!(msgs(ws, 1).await[0]["data"], "hi");
    }
    // The cluster view shows both processes holding some of the clients.
    within(
        Duration::from_secs(6),
        "connections on both processes",
        || async {
            let (_, view) = procs[0]
                .admin(Method::GET, "/admin/v1/nodes", json!({}))
                .await;
            let counts: Vec<i64> = view["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["connections"].as_i64())
                .collect();
            counts.len() == 2 && counts.iter().all(|&c| c > 0) && counts.iter().sum::<i64>() == 24
        },
    )
    .await;
    reg.finish(procs).await;
}
