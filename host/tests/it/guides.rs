//! Each plugin guide's "From scaffold to serving" works as written, in all
//! four languages: every command of the section is run as it stands, in an
//! empty folder, against a running server (its URL and the publish key
//! `tenant create` printed filled in, as the section tells the reader), and
//! the client the section connects sees the message it publishes. The
//! toolchains the example build installed are reused through the build
//! scripts' own variables (`HERALD_PY_VENV`, `HERALD_C_TOOLS`,
//! `CARGO_TARGET_DIR`), and compiled components through the CLI's
//! `HERALD_PLUGIN_CACHE`; nothing else is changed.

use crate::helpers::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One command of a guide's section and the comment beside it.
struct Step {
    cmd: String,
    comment: String,
}

/// The section's command lines (indented code, continuations joined),
/// each split from its trailing `  # comment`.
fn section_steps(guide: &str) -> Vec<Step> {
    let start = guide
        .find("## From scaffold to serving")
        .expect("the guide has the section");
    let section = &guide[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in section[..end].lines() {
        if !line.starts_with("    ") {
            continue;
        }
        let l = line.trim();
        let (body, more) = match l.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (l, false),
        };
        pending.push_str(body);
        pending.push(' ');
        if !more {
            let (cmd, comment) = match pending.find("  #") {
                Some(i) => (&pending[..i], pending[i + 3..].trim()),
                None => (pending.as_str(), ""),
            };
            out.push(Step {
                cmd: cmd.trim().to_string(),
                comment: comment.to_string(),
            });
            pending.clear();
        }
    }
    out
}

/// Runs a shell command line in `dir`; its stdout, or a panic with both
/// outputs when it fails.
fn sh(line: &str, dir: &Path, env: &[(String, String)]) -> String {
    let mut c = Command::new("bash");
    c.arg("-c").arg(line).current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "`{line}` failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn the_guide_works_as_written(lang: &str, toolchain: &[(&str, PathBuf)]) {
    let root = root();
    let guide = std::fs::read_to_string(root.join(format!("docs/plugins/{lang}.md"))).unwrap();
    let steps = section_steps(&guide);
    assert!(steps.len() >= 8, "{lang}: {:?}", steps.len());
    let h = spawn_host().await;
    let url = h.url("");
    let url = url.trim_end_matches('/').to_string();
    let ws_base = url.replacen("http://", "ws://", 1);
    let work = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_herald");
    let mut env: Vec<(String, String)> = vec![
        ("HERALD_URL".into(), url.clone()),
        ("HERALD_ADMIN_TOKEN".into(), ADMIN.into()),
        // Not the user's own cache: the one the test servers share, so the
        // push loads what `plugin test` compiled (by sha256) instead of
        // compiling the component a second time.
        (
            "HERALD_PLUGIN_CACHE".into(),
            shared_compiled().display().to_string(),
        ),
    ];
    for (k, v) in toolchain {
        env.push((k.to_string(), v.display().to_string()));
    }
    let mut publish_key = String::new();
    let mut client: Option<Ws> = None;
    let mut tested = false;
    let mut published = false;
    for step in &steps {
        if let Some(rest) = step.cmd.strip_prefix("websocat ") {
            let at = rest.trim().trim_matches('\'');
            let at = at.replacen("ws://127.0.0.1:8080", &ws_base, 1);
            let mut ws = ws_at(&at)
                .await
                .unwrap_or_else(|e| panic!("{lang}: `{}` refused: {e:?}", step.cmd));
            let send = step
                .comment
                .strip_prefix("then send ")
                .expect("the comment says what to send");
            let frame: Value = serde_json::from_str(send).unwrap();
            ws.send(frame).await;
            let ack = ws.next().await;
            assert_eq!(ack["op"], "ack", "{lang}: {ack}");
            client = Some(ws);
            continue;
        }
        let line = step
            .cmd
            .replacen("herald ", &format!("{bin} "), 1)
            .replace("pk_…", &publish_key);
        let l = line.clone();
        let dir = work.path().to_path_buf();
        let e = env.clone();
        let said = tokio::task::spawn_blocking(move || sh(&l, &dir, &e))
            .await
            .unwrap();
        if step.cmd.starts_with("herald plugin test") {
            // The session the connect granted, the log line the template
            // writes on connect, the subscribe and the transform's message.
            assert!(
                said.contains("connect: allowed: subject \"alice\""),
                "{lang}: {said}"
            );
            assert!(said.contains("log info: connect: alice"), "{lang}: {said}");
            assert!(
                said.contains("subscribe public.news: allowed"),
                "{lang}: {said}"
            );
            assert!(
                said.contains("1 messages, 0 records refused"),
                "{lang}: {said}"
            );
            assert!(said.contains("-> public.news key=k1"), "{lang}: {said}");
            assert!(
                said.contains("compiled in") || said.contains("loaded compiled from the cache"),
                "{lang}: {said}"
            );
            tested = true;
        }
        if step.cmd.starts_with("herald tenant create") {
            publish_key = said
                .split_whitespace()
                .find(|w| w.starts_with("pk_"))
                .unwrap_or_else(|| panic!("{lang}: create prints the publish key: {said}"))
                .to_string();
        }
        if step.cmd.starts_with("herald publish") {
            let ws = client
                .as_mut()
                .expect("the section connects before it publishes");
            let m = next_op(ws, "msg", Duration::from_secs(10)).await;
            assert_eq!(
                (&m["ch"], &m["data"]),
                (&json!("public.news"), &json!({"n": 2})),
                "{lang}: {m}"
            );
            published = true;
        }
    }
    assert!(
        tested && published,
        "{lang}: the section tests and publishes"
    );
    h.stop().await;
}

#[tokio::test]
async fn the_rust_guide_works_as_written() {
    // A target dir kept across runs: the SDK's dependencies compile once.
    let target = root().join("target/guides-rust");
    the_guide_works_as_written("rust", &[("CARGO_TARGET_DIR", target)]).await;
}

#[tokio::test]
async fn the_python_guide_works_as_written() {
    let venv = root().join("plugins/target/example/python-venv");
    the_guide_works_as_written("python", &[("HERALD_PY_VENV", venv)]).await;
}

#[tokio::test]
async fn the_js_guide_works_as_written() {
    the_guide_works_as_written("js", &[]).await;
}

#[tokio::test]
async fn the_c_guide_works_as_written() {
    let tools = root().join("plugins/target/example/c-tools");
    the_guide_works_as_written("c", &[("HERALD_C_TOOLS", tools)]).await;
}

/// `herald publish` of a record the tenant's transform drops says that
/// nothing was published and fails, where it printed an empty table and
/// exited 0.
#[tokio::test]
async fn publishing_a_record_the_transform_drops_fails_and_says_so() {
    let h = spawn_host().await;
    let key = h.public_tenant("acme").await;
    h.install_plugin("acme", "herald_example_rust").await;
    let url = h.url("");
    let run = |data: &'static str| {
        let url = url.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_herald"))
                .args(["publish", "acme", "--key", &key, "--data", data])
                .env("HERALD_URL", url.trim_end_matches('/'))
                .output()
                .unwrap()
        })
    };
    // The example's transform drops a record without a `sym` (SPEC.md).
    let dropped = run(r#"{"px": "1"}"#).await.unwrap();
    let err = String::from_utf8_lossy(&dropped.stderr);
    assert_eq!(dropped.status.code(), Some(1), "{err}");
    assert!(err.contains("nothing was published"), "{err}");
    let kept = run(r#"{"sym": "AAPL", "px": "1"}"#).await.unwrap();
    assert!(
        kept.status.success(),
        "{}",
        String::from_utf8_lossy(&kept.stderr)
    );
    assert!(String::from_utf8_lossy(&kept.stdout).contains("ticks.AAPL"));
    h.stop().await;
}
