//! The admin CLI (`herald tenant|plugin push…|source|publish|nodes|
//! connections|disconnect|history`) run as the binary against a real server:
//! tables and `key: value` lines by default, the server's JSON with `--json`,
//! one line on stderr and exit status 1 for every failure, and bad input
//! refused before any request.

use crate::helpers::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TOKENS: &str =
    r#"{"tokens": {"tok-alice": {"subject": "alice"}, "tok-bob": {"subject": "bob"}}}"#;

/// What one run of the binary did.
pub(crate) struct Out {
    pub(crate) args: Vec<String>,
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Out {
    /// Its stdout, asserting it succeeded.
    fn ok(&self) -> &str {
        assert_eq!(
            self.code,
            Some(0),
            "herald {:?} failed\nstdout: {}\nstderr: {}",
            self.args,
            self.stdout,
            self.stderr
        );
        &self.stdout
    }

    /// Its stdout as JSON, asserting it succeeded.
    fn json(&self) -> Value {
        let text = self.ok();
        serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("herald {:?} printed no JSON ({e}): {text}", self.args))
    }

    /// Its stderr, asserting it failed with status 1 and printed nothing else.
    fn err(&self) -> &str {
        assert_eq!(
            self.code,
            Some(1),
            "herald {:?} should have failed with 1\nstdout: {}\nstderr: {}",
            self.args,
            self.stdout,
            self.stderr
        );
        assert!(self.stdout.is_empty(), "{:?}: {}", self.args, self.stdout);
        &self.stderr
    }

    /// Asserts clap refused the command line (usage error, status 2).
    fn usage_error(&self) {
        assert_eq!(
            self.code,
            Some(2),
            "herald {:?} should have been refused by the parser\nstdout: {}\nstderr: {}",
            self.args,
            self.stdout,
            self.stderr
        );
    }
}

/// Runs the binary with `HERALD_URL=url`, the admin token (or none) and
/// `vars`, off the runtime (the server runs on it meanwhile).
pub(crate) async fn herald_at(
    url: &str,
    token: Option<&str>,
    vars: &[(&str, &str)],
    stdin: Option<&[u8]>,
    args: &[&str],
) -> Out {
    let url = url.to_string();
    let token = token.map(str::to_string);
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let stdin = stdin.map(<[u8]>::to_vec);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.args(&args)
            .env("HERALD_URL", url)
            .env_remove("HERALD_ADMIN_TOKEN")
            .env_remove("HERALD_PUBLISH_KEY")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = &token {
            cmd.env("HERALD_ADMIN_TOKEN", t);
        }
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("herald runs");
        if let Some(bytes) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().expect("stdin piped");
            pipe.write_all(&bytes).expect("write stdin");
        }
        let o = child.wait_with_output().expect("herald exits");
        Out {
            args,
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    })
    .await
    .expect("the blocking task ran")
}

/// Runs the binary against `h` with its admin token.
async fn cli(h: &Host, args: &[&str]) -> Out {
    herald_at(&h.url(""), Some(ADMIN), &[], None, args).await
}

/// The value of a `key: value` line.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

/// The cells (split on blanks) of the table row whose first cell is `first`.
fn row<'a>(text: &'a str, first: &str) -> Option<Vec<&'a str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
}

/// A component built by plugins/build.sh, by path.
fn wasm(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{}: run plugins/build.sh first",
        path.display()
    );
    path.to_str().unwrap().to_string()
}

/// A loopback URL nothing listens on.
fn dead_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

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

#[tokio::test]
async fn errors_are_one_line_with_the_server_code() {
    let h = spawn_host().await;
    for args in [
        &["tenant", "show", "nobody"][..],
        &["tenant", "delete", "nobody"],
        &["tenant", "rotate-key", "nobody"],
        &["source", "show", "nobody"],
        &["connections", "nobody"],
    ] {
        let out = cli(&h, args).await;
        let e = out.err();
        assert!(
            e.starts_with("herald: not_found: ") && e.trim_end().ends_with("(HTTP 404)"),
            "{args:?}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{args:?}: {e}");
    }

    // A wrong admin token, and none at all.
    let out = herald_at(
        &h.url(""),
        Some("not-the-admin-token-at-all"),
        &[],
        None,
        &["tenant", "list"],
    )
    .await;
    let e = out.err();
    assert!(
        e.starts_with("herald: unauthorized: ") && e.contains("(HTTP 401)"),
        "{e}"
    );
    let out = herald_at(&h.url(""), None, &[], None, &["tenant", "list"]).await;
    assert!(out.err().contains("admin token"), "{}", out.stderr);

    // --url wins over HERALD_URL.
    let dead = dead_url();
    let url = h.url("");
    let out = herald_at(
        &dead,
        Some(ADMIN),
        &[],
        None,
        &["tenant", "list", "--url", url.as_str()],
    )
    .await;
    assert!(out.ok().starts_with("ID "), "{}", out.stdout);

    // Nothing listening, and a URL this client cannot speak to.
    let out = herald_at(&dead, Some(ADMIN), &[], None, &["tenant", "list"]).await;
    let e = out.err();
    assert!(
        e.contains("cannot reach the server") && e.contains(&dead),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    let out = herald_at("ftp://127.0.0.1:1", Some(ADMIN), &[], None, &["nodes"]).await;
    assert!(out.err().contains("https://"), "{}", out.stderr);
    h.stop().await;
}

/// Every input is read and checked before a request: against a URL where
/// nothing listens, each of these fails on its input, never on the
/// connection.
#[tokio::test]
async fn bad_input_is_refused_before_any_request() {
    let dead = dead_url();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let at_missing = format!("@{}", missing.display());
    let missing = missing.to_str().unwrap().to_string();
    let text_file = dir.path().join("hello.wasm");
    std::fs::write(&text_file, "hello").unwrap();
    let text_file = text_file.to_str().unwrap().to_string();
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"a\": ").unwrap();
    let at_broken = format!("@{}", broken.display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["tenant", "create", "t", "--config", at_missing.as_str()],
            "missing.json",
        ),
        (
            vec!["tenant", "create", "t", "--config", at_broken.as_str()],
            "not valid JSON",
        ),
        (
            vec!["tenant", "create", "t", "--config", r#"{"a":"#],
            "not valid JSON",
        ),
        (
            vec!["tenant", "create", "t", "--limits", "[1]"],
            "JSON object",
        ),
        (
            vec!["tenant", "patch", "t", "--conflation", "7"],
            "JSON object",
        ),
        (vec!["tenant", "patch", "t"], "nothing to change"),
        (
            vec!["source", "set", "t", "--spec", at_missing.as_str()],
            "missing.json",
        ),
        (
            vec!["publish", "t", "--key", "k", "--data", "{bad"],
            "not valid JSON",
        ),
        (
            vec!["publish", "t", "--key", "k", "--data", "text"],
            "quotes",
        ),
        (
            vec!["publish", "t", "--key", "k", "--file", missing.as_str()],
            "missing.json",
        ),
        (
            vec!["publish", "t", "--key", "k", "--file", text_file.as_str()],
            "JSON object",
        ),
        (
            vec!["plugin", "push", "t", missing.as_str()],
            "missing.json",
        ),
        (
            vec!["plugin", "push", "t", text_file.as_str()],
            "not a wasm component",
        ),
        (vec!["history", "t", ".."], ".."),
    ];
    for (args, want) in cases {
        let out = herald_at(&dead, Some(ADMIN), &[], None, &args).await;
        let e = out.err();
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("cannot reach"), "{args:?} sent a request: {e}");
    }
}
