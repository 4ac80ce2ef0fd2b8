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

mod tenants;
mod traffic;

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
