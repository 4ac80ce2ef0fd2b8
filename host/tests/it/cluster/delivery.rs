//! One position everywhere: publishes through the registry's log, Kafka and `--cluster-kafka`.

use super::*;

/// A publish through A reaches subscribers on A, B and C in order and with
/// the same `seq` on every node: it goes through the registry's log, and
/// every node (A too) delivers it from there.
#[tokio::test]
async fn a_publish_reaches_every_node_with_one_seq() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let n = reg.nodes(&["a", "b", "c"]).await;
    let key = create(&n[0], json!({"id":"cl-pub","access":"public"})).await;
    let mut subs = Vec::new();
    for node in &n {
        let ws = within(PROPAGATION, "the tenant on every node", || async {
            node.ws("cl-pub", "").await.is_ok()
        })
        .await;
        let _ = ws;
        subs.push(node.subscriber("cl-pub", "t").await);
    }
    let mut answered = Vec::new();
    for i in 0..20 {
        let via = &n[i % 3];
        let (s, v) = via
            .publish("cl-pub", &key, json!({"ch":"t","data":{"i":i}}))
            .await;
        assert_eq!(s, 200, "{v}");
        answered.push(v["seq"].as_u64().expect("the answer carries the seq"));
    }
    let mut seen: Vec<Vec<(u64, u64, Value)>> = Vec::new();
    for ws in subs.iter_mut() {
        let got = msgs(ws, 20).await;
        seen.push(
            got.iter()
                .map(|m| {
                    (
                        m["seq"].as_u64().unwrap(),
                        m["prev"].as_u64().unwrap(),
                        m["data"]["i"].clone(),
                    )
                })
                .collect(),
        );
    }
    let order: Vec<Value> = (0..20).map(|i| json!(i)).collect();
    for (node, got) in seen.iter().enumerate() {
        let data: Vec<Value> = got.iter().map(|g| g.2.clone()).collect();
        assert_eq!(data, order, "node {node}: every message, in order");
        for w in got.windows(2) {
            assert_eq!(w[1].1, w[0].0, "node {node}: prev chains");
        }
        let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            seqs, answered,
            "node {node}: the seqs the publishes answered"
        );
    }
    reg.finish(n).await;
}

/// A node that starts reading a tenant after its first publishes (the
/// tenant was created and published to through another node a moment ago)
/// still delivers them: its history has them for a client resuming there.
#[tokio::test]
async fn a_node_new_to_a_tenant_reads_its_first_rows() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let a = reg.node("a").await;
    let key = create(&a, json!({"id":"cl-new","access":"public"})).await;
    let mut answered = Vec::new();
    for i in 0..5 {
        let (s, v) = a
            .publish("cl-new", &key, json!({"ch":"n","data":{"i":i}}))
            .await;
        assert_eq!(s, 200, "{v}");
        answered.push(v["seq"].clone());
    }
    let b = reg.node("b").await;
    let mut ws = b.ws("cl-new", "").await.unwrap();
    let start = Instant::now();
    for id in 1.. {
        ws.send(json!({"op":"sub","ch":"n","id":id,"since":0}))
            .await;
        let ack = ws.next().await;
        assert_eq!(ack["op"], "ack", "{ack}");
        let mut got = Vec::new();
        while let Ok(m) = tokio::time::timeout(Duration::from_millis(200), ws.next()).await {
            if m["op"] == "msg" {
                got.push(m["seq"].clone());
            }
        }
        if got == answered {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "B's history lacks the first rows: {got:?}, published {answered:?}"
        );
        ws.send(json!({"op":"unsub","ch":"n","id":1000 + id})).await;
        let _ = ws.next().await;
    }
    reg.finish([a, b]).await;
}

/// A Kafka tenant in a cluster: a publish through either node is produced
/// into the topic, and both nodes deliver it at the same position.
#[tokio::test]
async fn a_kafka_publish_has_one_seq_on_every_node() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic("cl-k", 1, 1).unwrap();
    let a = reg.node("a").await;
    let b = reg.node("b").await;
    let key = create(&a, json!({"id":"cl-kafka","access":"public"})).await;
    let source = json!({"kind":"kafka","brokers":kafka.bootstrap_servers(),"topics":["cl-k"]});
    let (s, v) = a
        .admin(Method::PUT, "/admin/v1/tenants/cl-kafka/source", source)
        .await;
    assert_eq!(s, 200, "{v}");
    one_seq_through_kafka(&a, &b, "cl-kafka", &key, "k").await;
    reg.finish([a, b]).await;
}

/// `--cluster-kafka`: an `http` tenant's publishes go through a Kafka topic
/// of its own instead of the registry's table, with one seq on every node.
/// (librdkafka's mock cluster does not take CreateTopics, so the topic is
/// made here as an operator would where Herald may not create topics.)
#[tokio::test]
async fn publishes_through_cluster_kafka_have_one_seq() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic("herald.publish.cl-ck", 1, 1).unwrap();
    let brokers = kafka.bootstrap_servers();
    let a = reg.node_with("a", &["--cluster-kafka", &brokers]).await;
    let b = reg.node_with("b", &["--cluster-kafka", &brokers]).await;
    let key = create(&a, json!({"id":"cl-ck","access":"public"})).await;
    one_seq_through_kafka(&a, &b, "cl-ck", &key, "t").await;
    reg.finish([a, b]).await;
}

/// Waits until the Kafka reader of `tenant` is live on both nodes (with one
/// partition), publishes six keyed messages to `ch` through A and B in turn
/// (each answered from Kafka), and checks that both nodes deliver all six
/// in order at the seqs the publishes answered.
async fn one_seq_through_kafka(a: &Node, b: &Node, tenant: &str, key: &str, ch: &str) {
    let path = format!("/admin/v1/tenants/{tenant}/source");
    for n in [a, b] {
        within(
            Duration::from_secs(5),
            "the Kafka reader live on both",
            || async {
                let (_, v) = n.admin(Method::GET, &path, json!({})).await;
                v["health"]["partitions"] == 1 && v["health"]["state"] == "live"
            },
        )
        .await;
    }
    let mut subs = [
        a.subscriber(tenant, ch).await,
        b.subscriber(tenant, ch).await,
    ];
    let mut answered = Vec::new();
    for i in 0..6 {
        let via = if i % 2 == 0 { a } else { b };
        let body = json!({"ch":ch,"data":{"i":i},"key":format!("k{}", i % 2)});
        let (s, v) = via.publish(tenant, key, body).await;
        assert_eq!(s, 200, "{v}");
        assert!(v.get("offset").is_some(), "went through Kafka: {v}");
        answered.push(v["seq"].clone());
    }
    for ws in subs.iter_mut() {
        let got = msgs(ws, 6).await;
        let seqs: Vec<Value> = got.iter().map(|m| m["seq"].clone()).collect();
        assert_eq!(seqs, answered, "the same positions on both nodes");
        let is: Vec<Value> = got.iter().map(|m| m["data"]["i"].clone()).collect();
        assert_eq!(is, (0..6).map(|i| json!(i)).collect::<Vec<_>>());
    }
}

/// Four publishers, two on each node, post batches of 50 at once: the log's
/// appends commit in id order, so no channel rebases, both nodes end on the
/// epoch every subscriber was acked, and a client that moves from A to B
/// resumes there without a gap and without a repeat.
#[tokio::test]
async fn concurrent_batches_on_two_nodes_keep_one_epoch() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let n = reg.nodes(&["a", "b"]).await;
    let key = create(&n[0], json!({"id":"cl-conc","access":"public"})).await;
    let mut subs = Vec::new();
    let mut epochs = Vec::new();
    for node in &n {
        within(PROPAGATION, "the tenant on every node", || async {
            node.ws("cl-conc", "").await.is_ok()
        })
        .await;
        let mut ws = node.ws("cl-conc", "").await.unwrap();
        epochs.push(ws.sub("t", 1).await["epoch"].clone());
        subs.push(ws);
    }
    assert_eq!(epochs[0], epochs[1], "one epoch on both nodes");
    const BATCHES: usize = 30;
    const PER: usize = 50;
    let post = |poster: usize| {
        let node = poster % 2;
        let (http, url, key) = (
            n[node].http.clone(),
            n[node].url("/v1/t/cl-conc/publish"),
            key.clone(),
        );
        async move {
            for b in 0..BATCHES {
                let batch: Vec<Value> = (0..PER)
                    .map(|i| json!({"ch":"t","data":{"p":poster,"b":b,"i":i}}))
                    .collect();
                let r = http
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&batch)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }
    };
    // Two publishers on each node.
    tokio::join!(post(0), post(1), post(2), post(3));
    let total = 4 * BATCHES * PER;
    let mut seqs = Vec::new();
    for (i, ws) in subs.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < total {
            let f = ws.next().await;
            assert_ne!(f["op"], "gap", "node {i}: {f}");
            assert!(
                f["op"] != "ack",
                "node {i}: the channel's epoch changed under it: {f}"
            );
            if f["op"] == "msg" {
                got.push(f);
            }
        }
        for w in got.windows(2) {
            assert_eq!(w[1]["prev"], w[0]["seq"], "node {i}: prev chains");
        }
        seqs.push(
            got.iter()
                .map(|m| m["seq"].as_u64().unwrap())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(seqs[0], seqs[1], "the same positions on both nodes");
    for node in &n {
        let (s, v) = node
            .admin(
                Method::GET,
                "/admin/v1/tenants/cl-conc/channels/t/history?since=0&limit=1",
                json!({}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["epoch"], epochs[0], "{v}");
        let (_, src) = node
            .admin(Method::GET, "/admin/v1/tenants/cl-conc/source", json!({}))
            .await;
        assert_eq!(src["health"]["rebased"], 0, "{src}");
    }
    // A client of A moves to B with A's last position: nothing is missing.
    let last = *seqs[0].last().unwrap();
    let mut moved = n[1].ws("cl-conc", "").await.unwrap();
    moved
        .send(json!({"op":"sub","ch":"t","id":2,"since":last,"epoch":epochs[0]}))
        .await;
    let ack = moved.next().await;
    assert_eq!(ack["op"], "ack", "{ack}");
    assert_eq!(ack["epoch"], epochs[0], "{ack}");
    moved.send(json!({"op":"ping","id":3})).await;
    let f = moved.next().await;
    assert_eq!(f["op"], "pong", "no gap and no repeat after the move: {f}");
    reg.finish(n).await;
}

/// A node down for longer than the log keeps rows: when it comes back, the
/// rows retention deleted meanwhile were never read there. A client that
/// resumes on it is told they are a gap, then gets what comes next.
#[tokio::test]
async fn a_node_back_after_the_retention_reports_the_pruned_rows() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let retention = ["--cluster-log-retention-secs", "2"];
    let a = reg.node_with("a", &retention).await;
    let b = reg.node_with("b", &retention).await;
    let key = served_by_both(&a, &b, "cl-ret").await;
    let mut ws = b.ws("cl-ret", "").await.unwrap();
    let epoch = ws.sub("t", 1).await["epoch"].clone();
    let (s, v) = a
        .publish("cl-ret", &key, json!({"ch":"t","data":{"n":0}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let seen = next_op(&mut ws, "msg", WAIT).await["seq"].as_u64().unwrap();
    drop(ws);
    let down = b.kill().await;
    let mut missed = Vec::new();
    for n in 1..=3 {
        let (s, v) = a
            .publish("cl-ret", &key, json!({"ch":"t","data":{"n":n}}))
            .await;
        assert_eq!(s, 200, "{v}");
        missed.push(v["seq"].as_u64().unwrap());
    }
    // Past the retention and a prune or two: the three rows are gone.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let b = Node::restart(down).await;
    let mut ws = b.ws("cl-ret", "").await.unwrap();
    ws.send(json!({"op":"sub","ch":"t","id":2,"since":seen,"epoch":epoch}))
        .await;
    assert_eq!(ws.next().await["op"], "ack");
    let (s, v) = a
        .publish("cl-ret", &key, json!({"ch":"t","data":{"n":4}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let marker = v["seq"].as_u64().unwrap();
    let mut gaps = Vec::new();
    let mut got = Vec::new();
    loop {
        let f = ws.next().await;
        match f["op"].as_str() {
            Some("gap") => gaps.push((f["from"].as_u64().unwrap(), f["to"].as_u64().unwrap())),
            Some("msg") => {
                let s = f["seq"].as_u64().unwrap();
                assert!(s > seen, "{f}");
                got.push(s);
                if s == marker {
                    break;
                }
            }
            _ => {}
        }
    }
    for m in missed {
        assert!(
            got.contains(&m) || gaps.iter().any(|(a, b)| *a <= m && m <= *b),
            "{m} neither sent nor reported: got {got:?}, gaps {gaps:?}"
        );
    }
    reg.finish([a, b]).await;
}

/// A node behind the client (its registry connection cut, so its log reader
/// has not read what the client saw on another node): the client that moves
/// there is sent nothing twice and no false gap, and once the node catches
/// up, only what came after.
#[tokio::test]
async fn a_node_behind_the_client_sends_only_what_comes_after() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let (proxy, via_proxy) = reg.cut_proxy().await;
    let a = reg.node("a").await;
    let b = reg.node_via("b", &via_proxy, &[]).await;
    let key = served_by_both(&a, &b, "cl-behind").await;
    let mut on_a = a.ws("cl-behind", "").await.unwrap();
    let epoch = on_a.sub("t", 1).await["epoch"].clone();
    proxy.cut();
    let mut last = 0;
    for n in 0..3 {
        let (s, v) = a
            .publish("cl-behind", &key, json!({"ch":"t","data":{"n":n}}))
            .await;
        assert_eq!(s, 200, "{v}");
        last = next_op(&mut on_a, "msg", WAIT).await["seq"]
            .as_u64()
            .unwrap();
    }
    // B has read none of them: the client moves there with A's position.
    let mut on_b = b.ws("cl-behind", "").await.unwrap();
    on_b.send(json!({"op":"sub","ch":"t","id":2,"since":last,"epoch":epoch}))
        .await;
    let ack = next_op(&mut on_b, "ack", WAIT).await;
    assert_eq!(
        (&ack["epoch"], ack["seq"].as_u64()),
        (&epoch, Some(last)),
        "{ack}"
    );
    let (s, v) = a
        .publish("cl-behind", &key, json!({"ch":"t","data":{"n":3}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let after = v["seq"].as_u64().unwrap();
    proxy.restore();
    // B catches up: the three it read late are the client's already.
    loop {
        let f = on_b.next().await;
        assert_ne!(f["op"], "gap", "no false gap: {f}");
        if f["op"] == "msg" {
            assert_eq!(f["seq"].as_u64(), Some(after), "only what came after: {f}");
            assert_eq!(f["data"]["n"], 3);
            break;
        }
    }
    reg.finish([a, b]).await;
}

/// A batch published again under its `Idempotency-Key` (a retry after the
/// answer was lost) is answered with the same positions and logged once:
/// subscribers get each message once. The key for a batch of another length
/// is refused.
#[tokio::test]
async fn a_retried_batch_with_its_key_is_logged_once() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let a = reg.node("a").await;
    let key = create(&a, json!({"id":"cl-idem","access":"public"})).await;
    let mut ws = a.ws("cl-idem", "").await.unwrap();
    ws.sub("t", 1).await;
    let batch = json!([{"ch":"t","data":{"n":1}},{"ch":"t","data":{"n":2}}]);
    let post = |body: Value, idem: &'static str| {
        let (http, url, key) = (a.http.clone(), a.url("/v1/t/cl-idem/publish"), key.clone());
        async move {
            let r = http
                .post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", idem)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (s, first) = post(batch.clone(), "order-17").await;
    assert_eq!(s, 200, "{first}");
    let (s, again) = post(batch.clone(), "order-17").await;
    assert_eq!(s, 200, "{again}");
    let seqs = |v: &Value| -> Vec<u64> {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["seq"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(seqs(&first), seqs(&again), "the same answer");
    let (s, v) = post(json!([{"ch":"t","data":{"n":3}}]), "order-17").await;
    assert_eq!(s, 409, "{v}");
    let (s, v) = post(json!({"ch":"t","data":{"n":3}}), "order-18").await;
    assert_eq!(s, 200, "{v}");
    let got = msgs(&mut ws, 3).await;
    let ns: Vec<u64> = got
        .iter()
        .map(|m| m["data"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, [1, 2, 3], "each message once");
    reg.finish([a]).await;
}
