use super::*;
use clap::{CommandFactory as _, Parser};

/// The tree as config.rs builds it: these commands flattened beside others.
#[derive(Debug, Parser)]
#[command(name = "herald")]
struct TestCli {
    #[command(subcommand)]
    cmd: TestCommand,
}

#[derive(Debug, clap::Subcommand)]
#[allow(clippy::large_enum_variant)]
enum TestCommand {
    #[command(flatten)]
    Admin(AdminCommand),
    Push(PushArgs),
    Activate(ActivateArgs),
}

fn parse(args: &[&str]) -> Result<TestCommand, clap::Error> {
    TestCli::try_parse_from(std::iter::once("herald").chain(args.iter().copied())).map(|c| c.cmd)
}

#[test]
fn the_command_trees_are_valid() {
    TestCli::command().debug_assert();
    crate::cli::Cli::command().debug_assert();
}

#[test]
fn the_parser_takes_the_documented_forms() {
    match parse(&[
        "tenant",
        "create",
        "t",
        "--access",
        "public",
        "--allowed-origin",
        "https://a",
        "--allowed-origin",
        "https://b",
        "--json",
    ]) {
        Ok(TestCommand::Admin(AdminCommand::Tenant(TenantCommand::Create(a)))) => {
            assert_eq!(a.id, "t");
            assert_eq!(a.settings.access, Some(AccessArg::Public));
            assert_eq!(a.settings.allowed_origins, ["https://a", "https://b"]);
            assert!(a.remote.json);
        }
        other => panic!("{other:?}"),
    }
    match parse(&["tenant", "rotate-key", "t", "--admin-token", "x"]) {
        Ok(TestCommand::Admin(AdminCommand::Tenant(TenantCommand::RotateKey(a)))) => {
            assert_eq!(a.remote.admin_token.as_deref(), Some("x"));
        }
        other => panic!("{other:?}"),
    }
    match parse(&["history", "t", "prices", "--since", "3", "--limit", "2"]) {
        Ok(TestCommand::Admin(AdminCommand::History(a))) => {
            assert_eq!((a.since, a.limit), (Some(3), Some(2)));
            assert_eq!(a.channel, "prices");
        }
        other => panic!("{other:?}"),
    }
    match parse(&["publish", "t", "--key", "k", "--data", "-1", "--ch", "c"]) {
        Ok(TestCommand::Admin(AdminCommand::Publish(a))) => {
            assert_eq!(a.data.as_deref(), Some("-1"));
            assert_eq!(a.ch.as_deref(), Some("c"));
        }
        other => panic!("{other:?}"),
    }
    match parse(&["push", "t", "x.wasm", "--activate"]) {
        Ok(TestCommand::Push(a)) => assert!(a.activate),
        other => panic!("{other:?}"),
    }
    match parse(&["activate", "t", "3"]) {
        Ok(TestCommand::Activate(a)) => assert_eq!((a.tenant.as_str(), a.version), ("t", 3)),
        other => panic!("{other:?}"),
    }
    assert!(parse(&["source", "set", "t", "--http", "--stall-after-ms", "500"]).is_ok());
    assert!(parse(&["disconnect", "t", "--subject", "a", "--code", "4001"]).is_ok());
    assert!(parse(&["publish", "t", "--key", "k", "--file", "-"]).is_ok());
}

#[test]
fn the_parser_refuses_what_does_not_go_together() {
    for bad in [
        &[
            "tenant",
            "patch",
            "t",
            "--allowed-origin",
            "a",
            "--clear-allowed-origins",
        ][..],
        &["tenant", "create", "t", "--access", "secret"],
        &["publish", "t", "--key", "k"],
        &["publish", "t", "--key", "k", "--data", "1", "--file", "f"],
        &["publish", "t", "--key", "k", "--ch", "c", "--file", "f"],
        &["disconnect", "t"],
        &["disconnect", "t", "--subject", "a", "--session", "s1"],
        &["disconnect", "t", "--subject", "a", "--code", "70000"],
        &["source", "set", "t"],
        &["source", "set", "t", "--http", "--spec", "{}"],
        &[
            "source",
            "set",
            "t",
            "--spec",
            "{}",
            "--stall-after-ms",
            "5",
        ],
        &["activate", "t", "-1"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn json_arguments_are_inline_or_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("c.json");
    std::fs::write(&good, r#"{"k": [1, 2]}"#).unwrap();
    let at = format!("@{}", good.display());
    assert_eq!(json_arg("--config", &at).unwrap(), json!({"k": [1, 2]}));
    assert_eq!(json_arg("--config", r#"{"k":1}"#).unwrap(), json!({"k": 1}));

    let missing = format!("@{}", dir.path().join("missing.json").display());
    let e = json_arg("--config", &missing).unwrap_err().to_string();
    assert!(e.contains("--config") && e.contains("missing.json"), "{e}");

    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{nope").unwrap();
    let e = json_arg("--limits", &format!("@{}", broken.display()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not valid JSON") && e.contains("broken.json"),
        "{e}"
    );
    assert!(json_arg("--config", "{\"a\":").is_err());

    let e = json_object_arg("--limits", "[1]").unwrap_err().to_string();
    assert!(e.contains("JSON object") && e.contains("an array"), "{e}");
}

#[test]
fn tenant_bodies_carry_only_what_was_given() {
    let s = TenantSettings {
        access: Some(AccessArg::Plugin),
        config: Some(r#"{"a":1}"#.into()),
        limits: None,
        conflation: Some("{}".into()),
        allowed_origins: vec!["https://x".into()],
    };
    assert_eq!(
        tenant_body(Some("t"), &s, false).unwrap(),
        json!({"id": "t", "access": "plugin", "config": {"a": 1}, "conflation": {}, "allowed_origins": ["https://x"]})
    );
    assert_eq!(
        tenant_body(None, &TenantSettings::default(), true).unwrap(),
        json!({"allowed_origins": null})
    );
    assert_eq!(
        tenant_body(None, &TenantSettings::default(), false).unwrap(),
        json!({})
    );
    let bad = TenantSettings {
        limits: Some("[1]".into()),
        ..TenantSettings::default()
    };
    let e = tenant_body(None, &bad, false).unwrap_err().to_string();
    assert!(e.contains("--limits"), "{e}");
}

#[test]
fn publish_items_keep_the_data_as_written() {
    assert_eq!(
        publish_item(Some("a"), " {\"b\": 1, \"a\": 2.50} ", None).unwrap(),
        r#"{"ch":"a","data":{"b": 1, "a": 2.50}}"#
    );
    assert_eq!(
        publish_item(None, "\"text\"", Some("k")).unwrap(),
        r#"{"data":"text","key":"k"}"#
    );
    let e = publish_item(Some("a"), "text", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("quotes"), "{e}");
    assert!(check_publish_body(r#"[{"ch":"a","data":1}]"#, "f").is_ok());
    assert!(check_publish_body(r#" {"ch":"a","data":1}"#, "f").is_ok());
    for bad in ["1", "{bad", "", "[1,"] {
        assert!(check_publish_body(bad, "f").is_err(), "{bad:?}");
    }
}

#[test]
fn urls_are_built_from_encoded_segments() {
    let base = base_url("http://h:1").unwrap();
    assert_eq!(
        endpoint(&base, &["admin", "v1", "tenants", "a/b c"])
            .unwrap()
            .as_str(),
        "http://h:1/admin/v1/tenants/a%2Fb%20c"
    );
    let prefixed = base_url("http://h:1/herald/?x=1").unwrap();
    assert_eq!(
        endpoint(&prefixed, &["admin", "v1", "nodes"])
            .unwrap()
            .as_str(),
        "http://h:1/herald/admin/v1/nodes"
    );
    assert!(endpoint(&base, &["admin", ".."]).is_err());
    assert!(endpoint(&base, &["tenants", ""]).is_err());
    assert_eq!(
        history_url(&base, "t", "prices", Some(2), Some(10))
            .unwrap()
            .as_str(),
        "http://h:1/admin/v1/tenants/t/channels/prices/history?since=2&limit=10"
    );
    assert_eq!(
        history_url(&base, "t", "prices", None, None)
            .unwrap()
            .as_str(),
        "http://h:1/admin/v1/tenants/t/channels/prices/history"
    );
    assert!(base_url("https://h:1").is_ok());
    for bad in ["ftp://h:1", "localhost:8080", "not a url", ""] {
        assert!(base_url(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        resolve(&prefixed, "/admin/v1/tenants/t/uploads/ab")
            .unwrap()
            .as_str(),
        "http://h:1/herald/admin/v1/tenants/t/uploads/ab"
    );
    assert_eq!(
        resolve(&base, "http://h:1/admin/v1/x").unwrap().as_str(),
        "http://h:1/admin/v1/x"
    );
    assert!(resolve(&base, "http://elsewhere/admin/v1/x").is_err());
}

#[test]
fn answers_are_parsed_and_errors_named() {
    let e = answer(
        404,
        br#"{"error":{"code":"not_found","message":"tenant \"x\" not found"}}"#,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"not_found: tenant "x" not found (HTTP 404)"#
    );
    let e = answer(502, b"<html>\nbad gateway</html>")
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 502") && e.contains("bad gateway"), "{e}");
    assert_eq!(answer(204, b"").unwrap().value, Value::Null);
    let ok = answer(200, br#"{"a":1}"#).unwrap();
    assert_eq!((ok.status, ok.text.as_str()), (200, r#"{"a":1}"#));
    assert_eq!(ok.value, json!({"a": 1}));
    assert!(matches!(answer(200, b"nope"), Err(CliError::Protocol(_))));
}

#[test]
fn tables_align_their_columns() {
    let rows = vec![
        vec!["a".to_string(), "public".to_string()],
        vec!["long-id".to_string(), "plugin".to_string()],
    ];
    assert_eq!(
        table(&["ID", "ACCESS"], &rows),
        format!(
            "ID{}ACCESS\na{}public\nlong-id  plugin\n",
            " ".repeat(7),
            " ".repeat(8)
        )
    );
    // An empty last cell leaves no trailing blanks; no rows: the header.
    assert_eq!(
        table(&["A", "B"], &[vec!["x".into(), String::new()]]),
        "A  B\nx\n"
    );
    assert_eq!(table(&["A", "B"], &[]), "A  B\n");
}

#[test]
fn objects_become_aligned_key_value_lines() {
    let v = json!({
        "id": "t",
        "limits": {},
        "config": {"a": {"b": 1}},
        "created_at_ms": 0,
        "allowed_origins": null,
        "tags": ["x", "y"],
    });
    let text = key_values(
        &v,
        &["id", "allowed_origins", "config", "created_at_ms", "limits"],
    );
    // "allowed_origins:" is the widest key: 16 characters.
    let line = |k: &str, v: &str| {
        let key = format!("{k}:");
        format!("{key:<16} {v}\n")
    };
    let want = [
        line("id", "t"),
        line("allowed_origins", "-"),
        line("config.a.b", "1"),
        line("created_at_ms", "0 (1970-01-01T00:00:00Z)"),
        line("limits", "{}"),
        line("tags", "x, y"),
    ]
    .concat();
    assert_eq!(text, want);
}

#[test]
fn timestamps_are_shown_in_utc() {
    assert_eq!(utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(utc(1_700_000_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(utc(951_782_400_999), "2000-02-29T00:00:00Z");
    assert_eq!(utc(-1), "1969-12-31T23:59:59Z");
    assert!(is_timestamp("health.since_ms") && is_timestamp("created_at_ms"));
    assert!(!is_timestamp("stall_after_ms") && !is_timestamp("history_ttl_ms"));
}

#[test]
fn lists_render_as_tables() {
    let v = json!({"node": "n1", "channel": "prices", "epoch": 7, "head": 2, "oldest": 1, "more": false,
    "messages": [
        {"seq": 1, "prev": 0, "at_ms": 0, "key": "AAPL", "audiences": null,
         "frame": {"op": "msg", "ch": "prices", "seq": 1, "data": {"px": 1.5}}},
        {"seq": 2, "prev": 1, "at_ms": 1000, "key": null, "audiences": ["gold"], "data": "plain"},
    ]});
    let text = history_text(&v);
    assert!(text.starts_with("channel: prices\n"), "{text}");
    assert!(!text.contains("messages"), "{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.starts_with("SEQ"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert_eq!(
        rows[1],
        [
            "1",
            "0",
            "1970-01-01T00:00:00Z",
            "AAPL",
            "-",
            r#"{"px":1.5}"#
        ]
    );
    assert_eq!(
        rows[2],
        ["2", "1", "1970-01-01T00:00:01Z", "-", "gold", r#""plain""#]
    );

    let v = json!({"node": "n1", "connections": [{"session": "s4", "subject": null, "transport": "sse",
        "channels": ["a", "b"], "queue_bytes": 0, "connected_at_ms": 0, "remote_addr": "127.0.0.1:5"}]});
    let text = connections_text(&v);
    assert!(text.starts_with("node: n1\n\nSESSION"), "{text}");
    let row: Vec<&str> = text
        .lines()
        .next_back()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        row,
        [
            "s4",
            "-",
            "sse",
            "a,b",
            "0",
            "1970-01-01T00:00:00Z",
            "127.0.0.1:5"
        ]
    );

    let v = json!({"active": 2, "versions": [
        {"version": 1, "active": false, "name": "a", "plugin_version": "0.1.0", "hooks": {"connect": true, "transform": false},
         "size_bytes": 10, "sha256": "0123456789abcdef", "compiled": true, "created_at_ms": 0},
        {"version": 2, "active": true, "name": "b", "plugin_version": "0.2.0", "hooks": {"connect": true, "transform": true},
         "size_bytes": 20, "sha256": "fedcba9876543210", "compiled": false, "created_at_ms": 0}]});
    let text = plugins_table(&v);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[1],
        [
            "1",
            "a",
            "0.1.0",
            "connect",
            "10",
            "0123456789ab",
            "yes",
            "1970-01-01T00:00:00Z"
        ]
    );
    assert_eq!(rows[2][..3], ["2", "*", "b"]);
    assert_eq!(rows[2][4], "connect,transform");

    let v = json!({"self": "n1", "nodes": [{"id": "n1", "alive": true, "address": "a:1", "version": "0.1.0",
        "connections": 3, "plugins": {"t": 1}, "started_at_ms": 0, "last_heartbeat_ms": 0}]});
    let text = nodes_table(&v);
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..7], ["n1", "*", "yes", "a:1", "0.1.0", "3", "1"]);

    let v = json!({"results": [{"ch": "a", "seq": 1, "delivered": 2}, {"ch": "a", "seq": null, "held": true}]});
    let text = publish_text(&v);
    assert_eq!(
        text,
        table(
            &["CH", "SEQ", "RESULT"],
            &[
                vec!["a".into(), "1".into(), "delivered=2".into()],
                vec!["a".into(), "-".into(), "held=true".into()],
            ]
        )
    );
    let tenants = json!({"tenants": [{"id": "t", "access": "public", "active_plugin": null, "allowed_origins": null, "created_at_ms": 0}]});
    let row: Vec<String> = tenants_table(&tenants)
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        row,
        ["t", "public", "-", "-", "-", "any", "1970-01-01T00:00:00Z"]
    );
}
