//! Claims of the README's cluster section that the other files do not
//! test: a publish the log cannot take is `503 log_unavailable` and
//! publishes nothing; an uploaded plugin is compiled by every node ahead of
//! its activation; an SSE client resumes on another node with its
//! `Last-Event-ID`; `--cluster-kafka` asks the brokers for its topic.

use super::*;

/// README: HTTP publish "answers once it committed (503 `log_unavailable` if
/// it cannot)". A's registry connection cut: a publish through A is refused
/// so, and once it is back nothing of it reaches a subscriber on B — the
/// next publish is the next message.
#[tokio::test]
async fn a_publish_the_log_cannot_take_is_503_and_publishes_nothing() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let (cut, via) = reg.cut_proxy().await;
    let a = reg.node_via("a", &via, &[]).await;
    let b = reg.node("b").await;
    let key = served_by_both(&a, &b, "cl-unav").await;
    let mut on_b = b.subscriber("cl-unav", "t").await;
    let (s, v) = a.publish("cl-unav", &key, json!({"ch":"t","data":1})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(msgs(&mut on_b, 1).await[0]["data"], 1);

    cut.cut();
    let (s, v) = a.publish("cl-unav", &key, json!({"ch":"t","data":2})).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("log_unavailable")),
        "{v}"
    );
    cut.restore();
    within(
        Duration::from_secs(10),
        "A's registry connection back",
        || async {
            a.publish("cl-unav", &key, json!({"ch":"t","data":3}))
                .await
                .0
                == 200
        },
    )
    .await;
    let next = msgs(&mut on_b, 1).await;
    assert_eq!(
        next[0]["data"], 3,
        "the refused publish was not logged: {next:?}"
    );
    reg.finish([a, b]).await;
}

/// README: "An uploaded plugin is compiled by every node ahead of its
/// activation." An upload through A (not activated) is compiled by B
/// before anyone activates it; the activation then runs on B without
/// compiling again.
#[tokio::test]
async fn an_uploaded_plugin_is_compiled_by_every_node_before_activation() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let (a, b) = (reg.node("a").await, reg.node("b").await);
    served_by_both(&a, &b, "cl-pre").await;
    let compiles = "herald_plugin_compiles_total";
    let before = b.metric(compiles).await;
    let (s, up) = a.upload_plugin("cl-pre", plugin_wasm("ticker_merge")).await;
    assert_eq!(s, 201, "{up}");
    within(
        Duration::from_secs(20),
        "B compiled the version uploaded through A",
        || async { b.metric(compiles).await > before },
    )
    .await;
    let compiled = b.metric(compiles).await;
    let version = up["version"].as_i64().unwrap();
    let path = format!("/admin/v1/tenants/cl-pre/plugins/{version}/activate");
    assert_eq!(a.admin(Method::POST, &path, json!({})).await.0, 200);
    // ticker-merge adds `last` to a tick: B runs it.
    let ws = tokio::sync::Mutex::new(b.subscriber("cl-pre", "ticks").await);
    let key = b
        .admin(
            Method::POST,
            "/admin/v1/tenants/cl-pre/publish-key",
            json!({}),
        )
        .await
        .1["publish_key"]
        .as_str()
        .unwrap()
        .to_string();
    let tick = json!({"ch":"ticks","data":{"sym":"X","px":1}});
    within(Duration::from_secs(10), "the activation on B", || async {
        assert_eq!(b.publish("cl-pre", &key, tick.clone()).await.0, 200);
        msgs(&mut *ws.lock().await, 1).await[0]["data"]
            .get("last")
            .is_some()
    })
    .await;
    assert_eq!(
        b.metric(compiles).await,
        compiled,
        "B compiled again at activation"
    );
    reg.finish([a, b]).await;
}

/// README: a client "that reconnects to another node with its `since`/`epoch`
/// (or `Last-Event-ID`) gets what it missed with no duplicate". An SSE
/// stream on A reads two messages; four are published while it is away;
/// it resumes on B with its last event id and gets exactly the four, then
/// what comes next.
#[tokio::test]
async fn an_sse_client_resumes_on_another_node_with_its_last_event_id() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let (a, b) = (reg.node("a").await, reg.node("b").await);
    let key = served_by_both(&a, &b, "cl-sse").await;
    let publish = |n: u64| {
        let (a, key) = (&a, key.clone());
        async move {
            let (s, v) = a
                .publish("cl-sse", &key, json!({"ch":"t","data":{"n":n}}))
                .await;
            assert_eq!(s, 200, "{v}");
        }
    };
    let mut sse = a.sse("cl-sse", "ch=t", None).await;
    assert_eq!(sse.status, 200);
    let mut got = Vec::new();
    let mut last_id = None;
    async fn read(sse: &mut Sse, n: usize, got: &mut Vec<u64>, last: &mut Option<String>) {
        while got.len() < n {
            let e = sse.next().await.expect("stream open");
            if e.event == "msg" {
                got.push(e.data["data"]["n"].as_u64().unwrap());
                *last = e.id.clone();
            }
        }
    }
    publish(1).await;
    publish(2).await;
    read(&mut sse, 2, &mut got, &mut last_id).await;
    drop(sse);
    for n in 3..=6 {
        publish(n).await;
    }
    let mut sse = b.sse("cl-sse", "ch=t", last_id.as_deref()).await;
    assert_eq!(sse.status, 200);
    read(&mut sse, 6, &mut got, &mut last_id).await;
    publish(7).await;
    read(&mut sse, 7, &mut got, &mut last_id).await;
    assert_eq!(got, [1, 2, 3, 4, 5, 6, 7], "every message once, in order");
    reg.finish([a, b]).await;
}

/// README: with `--cluster-kafka` the log is a topic per tenant that
/// "Herald creates where the brokers allow, else create it yourself".
/// librdkafka's mock cluster answers no CreateTopics: the node asks, says
/// in its log that the topic was not created, and the tenant's publishes
/// are refused (never answered as published) until the operator creates
/// it; then they flow.
#[tokio::test]
async fn cluster_kafka_asks_for_its_topic_and_waits_for_the_operator_where_refused() {
    let Some(reg) = Registry::new().await else {
        return;
    };
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    let brokers = kafka.bootstrap_servers();
    let a = reg.node_with("a", &["--cluster-kafka", &brokers]).await;
    let key = create(&a, json!({"id":"cl-topic","access":"public"})).await;
    within(Duration::from_secs(20), "A asked for the topic", || async {
        a.logs().contains("the publish topic was not created")
            || a.logs().contains("did not answer the topic creation")
    })
    .await;
    within(
        Duration::from_secs(20),
        "the log stalled, saying why",
        || async {
            let (_, v) = a
                .admin(Method::GET, "/admin/v1/tenants/cl-topic/source", json!({}))
                .await;
            v["health"]["state"] == "stalled"
                && v["health"]["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("UNKNOWN_TOPIC"))
        },
    )
    .await;
    let (s, v) = a
        .publish("cl-topic", &key, json!({"ch":"t","data":0}))
        .await;
    assert_eq!(s, 503, "answered as published without a topic: {v}");
    kafka.create_topic("herald.publish.cl-topic", 1, 1).unwrap();
    within(
        Duration::from_secs(20),
        "publishes flow once the topic exists",
        || async {
            a.publish("cl-topic", &key, json!({"ch":"t","data":1}))
                .await
                .0
                == 200
        },
    )
    .await;
    let mut ws = a.subscriber("cl-topic", "t").await;
    let (s, v) = a
        .publish("cl-topic", &key, json!({"ch":"t","data":2}))
        .await;
    assert_eq!(s, 200, "{v}");
    // A publish answered 503 "may still be delivered once" (README): the 1s
    // tried while the reader started may come first; then the 2.
    loop {
        let data = msgs(&mut ws, 1).await[0]["data"].clone();
        if data == 2 {
            break;
        }
        assert_eq!(data, 1, "only what was published");
    }
    reg.finish([a]).await;
}
