//! Sources, publishing, history, connections and nodes through the CLI.

use super::*;

#[tokio::test]
async fn a_source_is_set_and_shown() {
    let h = spawn_host().await;
    h.public_tenant("cli-src").await;
    let out = cli(
        &h,
        &[
            "source",
            "set",
            "cli-src",
            "--http",
            "--stall-after-ms",
            "60000",
        ],
    )
    .await;
    let text = out.ok();
    assert_eq!(field(text, "source.kind"), Some("http"), "{text}");
    assert_eq!(
        field(text, "source.stall_after_ms"),
        Some("60000"),
        "{text}"
    );
    assert!(field(text, "health.state").is_some(), "{text}");
    let v = cli(&h, &["source", "show", "cli-src", "--json"])
        .await
        .json();
    assert_eq!(
        v["source"],
        json!({"kind": "http", "stall_after_ms": 60000}),
        "{v}"
    );
    assert!(v["health"]["state"].is_string(), "{v}");

    // A spec from a file.
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("source.json");
    std::fs::write(&spec, r#"{"kind": "http"}"#).unwrap();
    let at_spec = format!("@{}", spec.display());
    let v = cli(
        &h,
        &[
            "source",
            "set",
            "cli-src",
            "--spec",
            at_spec.as_str(),
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(v["source"], json!({"kind": "http"}), "{v}");
    let out = cli(&h, &["source", "show", "cli-src"]).await;
    assert_eq!(field(out.ok(), "source.kind"), Some("http"));

    // The server's refusal; the parser's.
    let bad = cli(
        &h,
        &[
            "source",
            "set",
            "cli-src",
            "--spec",
            r#"{"kind": "pigeon"}"#,
        ],
    )
    .await;
    assert!(bad.err().contains("bad_request"), "{}", bad.stderr);
    cli(
        &h,
        &[
            "source",
            "set",
            "cli-src",
            "--http",
            "--spec",
            r#"{"kind": "http"}"#,
        ],
    )
    .await
    .usage_error();
    cli(&h, &["source", "set", "cli-src"]).await.usage_error();
    let gone = cli(&h, &["source", "show", "nobody"]).await;
    assert!(gone.err().contains("not_found"), "{}", gone.stderr);
    h.stop().await;
}

#[tokio::test]
async fn published_messages_show_in_history() {
    let h = spawn_host().await;
    let key = h.public_tenant("cli-pub").await;

    // One message, with the key as a flag.
    let out = cli(
        &h,
        &[
            "publish",
            "cli-pub",
            "--key",
            key.as_str(),
            "--ch",
            "prices",
            "--data",
            r#"{"px": 1.5}"#,
            "--key-id",
            "AAPL",
        ],
    )
    .await;
    let text = out.ok();
    assert_eq!(field(text, "ch"), Some("prices"), "{text}");
    assert_eq!(field(text, "seq"), Some("1"), "{text}");

    // A batch from a file, the key from the environment.
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"ch": "prices", "data": {"px": 2}}, {"ch": "prices", "data": {"px": 3}, "key": "AAPL"}]"#,
    )
    .unwrap();
    let v = herald_at(
        &h.url(""),
        None,
        &[("HERALD_PUBLISH_KEY", key.as_str())],
        None,
        &[
            "publish",
            "cli-pub",
            "--file",
            batch.to_str().unwrap(),
            "--json",
        ],
    )
    .await
    .json();
    let results = v["results"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(results.len(), 2, "{v}");
    assert_eq!(
        (results[0]["seq"].as_u64(), results[1]["seq"].as_u64()),
        (Some(2), Some(3))
    );

    // One from stdin.
    let out = herald_at(
        &h.url(""),
        None,
        &[],
        Some(br#"{"ch": "prices", "data": "four"}"#),
        &["publish", "cli-pub", "--key", key.as_str(), "--file", "-"],
    )
    .await;
    assert_eq!(field(out.ok(), "seq"), Some("4"), "{}", out.stdout);

    // History: a table of what a resume would replay.
    let out = cli(&h, &["history", "cli-pub", "prices"]).await;
    let text = out.ok();
    assert_eq!(field(text, "channel"), Some("prices"), "{text}");
    assert_eq!(field(text, "head"), Some("4"), "{text}");
    let first = row(text, "1").unwrap_or_else(|| panic!("{text}"));
    assert!(first.contains(&"AAPL"), "{text}");
    assert!(first.contains(&r#"{"px":1.5}"#), "{text}");
    let fourth = row(text, "4").unwrap_or_else(|| panic!("{text}"));
    assert!(fourth.contains(&r#""four""#), "{text}");

    let v = cli(
        &h,
        &[
            "history", "cli-pub", "prices", "--since", "1", "--limit", "2", "--json",
        ],
    )
    .await
    .json();
    let seqs: Vec<u64> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["seq"].as_u64())
        .collect();
    assert_eq!(seqs, [2, 3], "{v}");
    assert_eq!(
        (&v["more"], &v["head"], &v["channel"]),
        (&json!(true), &json!(4), &json!("prices"))
    );
    assert_eq!(v["messages"][0]["frame"]["data"], json!({"px": 2}), "{v}");

    // Refusals.
    let none = cli(&h, &["history", "cli-pub", "nothing"]).await;
    assert!(none.err().contains("not_found"), "{}", none.stderr);
    let zero = cli(&h, &["history", "cli-pub", "prices", "--limit", "0"]).await;
    assert!(zero.err().contains("bad_request"), "{}", zero.stderr);
    let wrong = cli(
        &h,
        &[
            "publish", "cli-pub", "--key", "pk_wrong", "--ch", "x", "--data", "1",
        ],
    )
    .await;
    let e = wrong.err();
    assert!(
        e.contains("unauthorized") && e.contains("(HTTP 401)"),
        "{e}"
    );
    cli(&h, &["publish", "cli-pub", "--key", key.as_str()])
        .await
        .usage_error();
    h.stop().await;
}

#[tokio::test]
async fn connections_are_listed_and_disconnected_with_the_code_asked_for() {
    let h = spawn_host().await;
    cli(
        &h,
        &[
            "tenant", "create", "cli-ops", "--access", "plugin", "--config", TOKENS,
        ],
    )
    .await
    .ok();
    let example = wasm("herald_example_rust");
    cli(
        &h,
        &["plugin", "push", "cli-ops", example.as_str(), "--activate"],
    )
    .await
    .ok();
    let mut alice = h
        .ws_with("cli-ops", "token=tok-alice")
        .await
        .unwrap_or_else(|(s, v)| panic!("alice refused: {s} {v}"));
    assert_eq!(alice.sub("user.alice", 1).await["op"], "ack");
    let mut bob = h
        .ws_with("cli-ops", "token=tok-bob")
        .await
        .unwrap_or_else(|(s, v)| panic!("bob refused: {s} {v}"));
    assert_eq!(bob.sub("user.bob", 1).await["op"], "ack");

    let out = cli(&h, &["connections", "cli-ops"]).await;
    let text = out.ok();
    assert!(field(text, "node").is_some(), "{text}");
    assert!(text.contains("SESSION"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("alice"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("user.alice") && line.contains("ws"), "{line}");
    let v = cli(&h, &["connections", "cli-ops", "--json"]).await.json();
    let conns = v["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 2, "{v}");
    let a = conns
        .iter()
        .find(|c| c["subject"] == "alice")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        (&a["channels"], &a["transport"]),
        (&json!(["user.alice"]), &json!("ws"))
    );
    let bob_session = conns
        .iter()
        .find(|c| c["subject"] == "bob")
        .and_then(|c| c["session"].as_str())
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();

    // By subject, with the code asked for: the client sees that code.
    let out = cli(
        &h,
        &[
            "disconnect",
            "cli-ops",
            "--subject",
            "alice",
            "--code",
            "4001",
        ],
    )
    .await;
    let text = out.ok();
    assert_eq!(field(text, "disconnected"), Some("1"), "{text}");
    assert_eq!(field(text, "code"), Some("4001"), "{text}");
    assert_eq!(alice.closed().await.0, 4001);

    // By session, with the server's default code.
    let v = cli(
        &h,
        &[
            "disconnect",
            "cli-ops",
            "--session",
            bob_session.as_str(),
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(
        (v["disconnected"].as_u64(), v["code"].as_u64()),
        (Some(1), Some(4003)),
        "{v}"
    );
    assert_eq!(bob.closed().await.0, 4003);

    // Refusals.
    let bad = cli(
        &h,
        &[
            "disconnect",
            "cli-ops",
            "--subject",
            "alice",
            "--code",
            "1006",
        ],
    )
    .await;
    assert!(bad.err().contains("bad_request"), "{}", bad.stderr);
    cli(
        &h,
        &["disconnect", "cli-ops", "--subject", "a", "--session", "s1"],
    )
    .await
    .usage_error();
    cli(&h, &["disconnect", "cli-ops"]).await.usage_error();
    let gone = cli(&h, &["connections", "nobody"]).await;
    assert!(gone.err().contains("not_found"), "{}", gone.stderr);
    h.stop().await;
}

#[tokio::test]
async fn nodes_lists_this_node() {
    let h = spawn_host().await;
    // The first heartbeat is written at start; wait for it if need be.
    let deadline = tokio::time::Instant::now() + WAIT;
    let v = loop {
        let v = cli(&h, &["nodes", "--json"]).await.json();
        if v["nodes"].as_array().is_some_and(|n| !n.is_empty()) {
            break v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no node reported: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let me = v["self"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    assert!(
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == me.as_str()),
        "{v}"
    );
    let out = cli(&h, &["nodes"]).await;
    let text = out.ok();
    assert!(text.starts_with("ID "), "{text}");
    let r = row(text, &me).unwrap_or_else(|| panic!("{text}"));
    assert_eq!((r[1], r[2]), ("*", "yes"), "{text}");
    h.stop().await;
}
