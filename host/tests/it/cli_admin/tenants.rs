//! Tenants and plugins through the CLI: create, list, show, patch, rotate,
//! delete; push, list, activate, roll back; a background upload polled.

use super::*;

#[tokio::test]
async fn tenants_are_created_listed_shown_patched_rotated_and_deleted() {
    let h = spawn_host().await;
    let out = cli(
        &h,
        &[
            "tenant",
            "create",
            "cli-a",
            "--access",
            "public",
            "--config",
            r#"{"x": 1}"#,
            "--limits",
            r#"{"max_subscriptions": 10}"#,
            "--allowed-origin",
            "https://a.example",
            "--allowed-origin",
            "https://b.example",
        ],
    )
    .await;
    let text = out.ok();
    assert_eq!(field(text, "id"), Some("cli-a"), "{text}");
    assert_eq!(field(text, "access"), Some("public"), "{text}");
    assert_eq!(
        field(text, "allowed_origins"),
        Some("https://a.example, https://b.example"),
        "{text}"
    );
    assert_eq!(field(text, "config.x"), Some("1"), "{text}");
    assert_eq!(
        field(text, "limits.max_subscriptions"),
        Some("10"),
        "{text}"
    );
    let key_a = field(text, "publish_key").unwrap().to_string();
    assert!(key_a.starts_with("pk_"), "{text}");

    // The config from a file, the answer as JSON.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"tokens": {"t": {"subject": "s"}}}"#).unwrap();
    let at_config = format!("@{}", config.display());
    let v = cli(
        &h,
        &[
            "tenant",
            "create",
            "cli-b",
            "--config",
            at_config.as_str(),
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(v["id"], "cli-b", "{v}");
    assert_eq!(v["access"], "plugin", "the server's default: {v}");
    assert_eq!(v["config"]["tokens"]["t"]["subject"], "s", "{v}");
    assert!(v["publish_key"].as_str().unwrap().starts_with("pk_"), "{v}");
    let again = cli(&h, &["tenant", "create", "cli-b"]).await;
    let e = again.err();
    assert!(
        e.starts_with("herald: conflict: ") && e.contains("(HTTP 409)"),
        "{e}"
    );

    // The list: a table with both, and as JSON.
    let out = cli(&h, &["tenant", "list"]).await;
    let text = out.ok();
    assert!(text.starts_with("ID "), "{text}");
    let a = row(text, "cli-a").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(a[1], "public", "{text}");
    let b = row(text, "cli-b").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(b[1], "plugin", "{text}");
    let v = cli(&h, &["tenant", "list", "--json"]).await.json();
    let ids: Vec<&str> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert!(ids.contains(&"cli-a") && ids.contains(&"cli-b"), "{v}");

    // One tenant.
    let out = cli(&h, &["tenant", "show", "cli-a"]).await;
    let text = out.ok();
    assert_eq!(field(text, "access"), Some("public"), "{text}");
    assert_eq!(field(text, "connections"), Some("0"), "{text}");
    assert!(
        field(text, "effective_limits.max_subscriptions").is_some(),
        "{text}"
    );
    let v = cli(&h, &["tenant", "show", "cli-a", "--json"]).await.json();
    assert_eq!(
        v["allowed_origins"],
        json!(["https://a.example", "https://b.example"])
    );
    assert_eq!(v["limits"], json!({"max_subscriptions": 10}));
    assert_eq!(v["effective_limits"]["max_subscriptions"], 10);

    // Patch: only what is given changes; limits are a merge patch.
    let v = cli(
        &h,
        &[
            "tenant",
            "patch",
            "cli-a",
            "--access",
            "plugin",
            "--limits",
            r#"{"max_subscriptions": null, "max_channels": 50}"#,
            "--clear-allowed-origins",
            "--json",
        ],
    )
    .await
    .json();
    assert_eq!(v["access"], "plugin", "{v}");
    assert_eq!(v["allowed_origins"], Value::Null, "{v}");
    assert_eq!(v["limits"], json!({"max_channels": 50}), "{v}");
    assert_eq!(v["config"], json!({"x": 1}), "untouched: {v}");
    let out = cli(
        &h,
        &[
            "tenant",
            "patch",
            "cli-a",
            "--allowed-origin",
            "https://c.example",
        ],
    )
    .await;
    assert_eq!(
        field(out.ok(), "allowed_origins"),
        Some("https://c.example")
    );
    cli(
        &h,
        &[
            "tenant",
            "patch",
            "cli-a",
            "--allowed-origin",
            "https://c.example",
            "--clear-allowed-origins",
        ],
    )
    .await
    .usage_error();
    let nothing = cli(&h, &["tenant", "patch", "cli-a"]).await;
    assert!(nothing.err().contains("nothing to change"));

    // A new key; the old one stops working.
    let v = cli(&h, &["tenant", "rotate-key", "cli-a", "--json"])
        .await
        .json();
    assert_eq!(v["id"], "cli-a");
    let key_new = v["publish_key"].as_str().unwrap().to_string();
    assert!(key_new.starts_with("pk_") && key_new != key_a, "{v}");
    let (s, _) = h
        .publish("cli-a", &key_a, json!({"ch": "x", "data": 1}))
        .await;
    assert_eq!(s, 401, "the old key is refused");
    let out = cli(&h, &["tenant", "rotate-key", "cli-a"]).await;
    let shown = field(out.ok(), "publish_key").unwrap();
    assert!(shown.starts_with("pk_") && shown != key_new);

    // Delete.
    let out = cli(&h, &["tenant", "delete", "cli-b"]).await;
    assert!(out.ok().contains("cli-b"), "{}", out.stdout);
    let gone = cli(&h, &["tenant", "show", "cli-b"]).await;
    let e = gone.err();
    assert!(
        e.starts_with("herald: not_found: ") && e.trim_end().ends_with("(HTTP 404)"),
        "{e}"
    );
    let v = cli(&h, &["tenant", "delete", "cli-a", "--json"])
        .await
        .json();
    assert_eq!(v, json!({"id": "cli-a", "deleted": true}));
    let out = cli(&h, &["tenant", "list"]).await;
    let text = out.ok();
    assert!(
        row(text, "cli-a").is_none() && row(text, "cli-b").is_none(),
        "{text}"
    );
    h.stop().await;
}

#[tokio::test]
async fn plugins_are_pushed_listed_activated_and_rolled_back() {
    let h = spawn_host().await;
    h.public_tenant("cli-pl").await;
    let (first, second) = (wasm("ticker_conflate"), wasm("redact"));
    let v = cli(
        &h,
        &[
            "plugin",
            "push",
            "cli-pl",
            first.as_str(),
            "--activate",
            "--json",
        ],
    )
    .await
    .json();
    let v1 = v["upload"]["version"]
        .as_i64()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(v["upload"]["sha256"].is_string(), "{v}");
    assert_eq!(v["activation"]["active"].as_i64(), Some(v1), "{v}");

    let out = cli(&h, &["plugin", "push", "cli-pl", second.as_str()]).await;
    let text = out.ok();
    let v2: i64 = field(text, "version")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert_ne!(v1, v2);
    assert!(field(text, "sha256").is_some(), "{text}");
    assert!(field(text, "active").is_none(), "not activated: {text}");

    // The list: both, the active one marked.
    let out = cli(&h, &["plugin", "list", "cli-pl"]).await;
    let text = out.ok();
    assert!(text.starts_with("VERSION "), "{text}");
    let r1 = row(text, &v1.to_string()).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(r1[1], "*", "{text}");
    let r2 = row(text, &v2.to_string()).unwrap_or_else(|| panic!("{text}"));
    assert_ne!(r2[1], "*", "{text}");
    let v = cli(&h, &["plugin", "list", "cli-pl", "--json"])
        .await
        .json();
    assert_eq!(v["active"].as_i64(), Some(v1), "{v}");
    assert_eq!(v["versions"].as_array().unwrap().len(), 2, "{v}");

    // Activate the second, roll back to the first, and back again.
    let v2_arg = v2.to_string();
    let v = cli(
        &h,
        &["plugin", "activate", "cli-pl", v2_arg.as_str(), "--json"],
    )
    .await
    .json();
    assert_eq!(
        (v["active"].as_i64(), v["previous"].as_i64()),
        (Some(v2), Some(v1)),
        "{v}"
    );
    let out = cli(&h, &["plugin", "rollback", "cli-pl"]).await;
    let text = out.ok();
    assert_eq!(
        field(text, "active"),
        Some(v1.to_string().as_str()),
        "{text}"
    );
    assert_eq!(
        field(text, "previous"),
        Some(v2.to_string().as_str()),
        "{text}"
    );
    let v = cli(&h, &["plugin", "rollback", "cli-pl", "--json"])
        .await
        .json();
    assert_eq!(v["active"].as_i64(), Some(v2), "{v}");

    // Refusals name the server's code.
    let e = cli(&h, &["plugin", "activate", "cli-pl", "999"]).await;
    assert!(e.err().contains("not_found"), "{}", e.stderr);
    let e = cli(&h, &["plugin", "list", "nobody"]).await;
    assert!(e.err().contains("not_found"), "{}", e.stderr);
    h.public_tenant("cli-none").await;
    let e = cli(&h, &["plugin", "rollback", "cli-none"]).await;
    assert!(e.err().contains("conflict: "), "{}", e.stderr);
    h.stop().await;
}

/// A component over 1 MiB is answered 202 and compiled in the background:
/// `push` polls its status until stored (then activates) or failed. A
/// stand-in server answers as Herald does, so the test needs no 1 MiB
/// component.
#[tokio::test]
async fn a_background_upload_is_polled_until_stored_or_failed() {
    use axum::extract::Path as UrlPath;
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::Json;

    let polls = Arc::new(AtomicUsize::new(0));
    let counter = polls.clone();
    let app = axum::Router::new()
        .route(
            "/admin/v1/tenants/{t}/plugins",
            post(|UrlPath(t): UrlPath<String>| async move {
                (
                    StatusCode::ACCEPTED,
                    Json(
                        json!({"status": "compiling", "sha256": "abc", "since_ms": 1,
                        "status_url": format!("/admin/v1/tenants/{t}/uploads/abc")}),
                    ),
                )
            }),
        )
        .route(
            "/admin/v1/tenants/{t}/uploads/{sha}",
            get(move |UrlPath((t, sha)): UrlPath<(String, String)>| {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Json(json!({"status": "compiling", "sha256": sha, "since_ms": 1}))
                    } else if t == "bad" {
                        Json(json!({"status": "failed", "sha256": sha,
                                "error": {"code": "unprocessable", "message": "not a component"}}))
                    } else {
                        Json(json!({"status": "stored", "version": 7, "sha256": sha,
                                "name": "big", "hooks": {"transform": true}}))
                    }
                }
            }),
        )
        .route(
            "/admin/v1/tenants/{t}/plugins/{v}/activate",
            post(|UrlPath((_t, v)): UrlPath<(String, i64)>| async move {
                Json(json!({"active": v, "previous": null}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.wasm");
    std::fs::write(&file, b"\0asm\x01\0\0\0").unwrap();
    let file = file.to_str().unwrap();
    let v = herald_at(
        &url,
        Some(ADMIN),
        &[],
        None,
        &["plugin", "push", "fake", file, "--activate", "--json"],
    )
    .await
    .json();
    assert_eq!(v["upload"]["status"], "stored", "{v}");
    assert_eq!(v["upload"]["version"], 7, "{v}");
    assert_eq!(v["activation"]["active"], 7, "{v}");
    assert!(polls.load(Ordering::SeqCst) >= 2, "it polled until stored");

    let out = herald_at(
        &url,
        Some(ADMIN),
        &[],
        None,
        &["plugin", "push", "bad", file],
    )
    .await;
    let e = out.err();
    assert!(e.contains("background"), "it said it waits: {e}");
    assert!(e.contains("herald: unprocessable: not a component"), "{e}");
    server.abort();
}
