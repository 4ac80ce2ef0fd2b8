//! The README's five-minute tour works as written. Every
//! `herald …` command of its "Five minutes with Herald" section is run, as
//! it stands there, against a `--demo` server, with the placeholders the
//! tour tells the reader to fill (`adm_…`, `pk_…`) filled in.

use crate::helpers::*;
use std::process::Command;
use std::time::Duration;

/// The tour's command lines (continuations joined, comments dropped).
fn tour_commands(readme: &str) -> Vec<String> {
    let start = readme
        .find("## Five minutes with Herald")
        .expect("the README has the tour");
    let section = &readme[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in section[..end].lines() {
        let l = line.trim();
        if pending.is_empty() && !l.starts_with("herald ") {
            continue;
        }
        let (body, more) = match l.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (l, false),
        };
        pending.push_str(body);
        pending.push(' ');
        if !more {
            let cmd = match pending.find("  #") {
                Some(i) => pending[..i].to_string(),
                None => pending.clone(),
            };
            out.push(cmd.trim().to_string());
            pending.clear();
        }
    }
    out
}

#[tokio::test]
async fn the_readme_tour_works_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let commands = tour_commands(&readme);
    assert!(commands.len() >= 6, "{commands:?}");
    let mut opts = HostOptions::new();
    opts.config.demo_tenant = true;
    opts.config.demo_interval = Some(Duration::from_millis(50));
    let h = spawn_with(opts).await;
    // The open demo page of step 2.
    let mut page = h.ws("demo").await;
    assert_eq!(page.sub("ticks.AAPL", 1).await["op"], "ack");
    next_op(&mut page, "msg", WAIT).await;
    let url = h.url("");
    let url = url.trim_end_matches('/').to_string();
    let out = tokio::task::spawn_blocking(move || {
        let bin = env!("CARGO_BIN_EXE_herald");
        let mut acme_key = String::new();
        let mut said = Vec::new();
        for cmd in &commands {
            let line = cmd
                .replacen("herald ", &format!("{bin} "), 1)
                .replace("pk_…", &acme_key);
            let run = Command::new("bash")
                .arg("-c")
                .arg(&line)
                .current_dir(&root)
                .env("HERALD_URL", &url)
                .env("HERALD_ADMIN_TOKEN", ADMIN)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&run.stdout).to_string();
            assert!(
                run.status.success(),
                "the tour's `{cmd}` failed:\n{stdout}{}",
                String::from_utf8_lossy(&run.stderr)
            );
            if cmd.starts_with("herald tenant create acme") {
                acme_key = stdout
                    .split_whitespace()
                    .find(|w| w.starts_with("pk_"))
                    .unwrap_or_else(|| panic!("create prints the publish key: {stdout}"))
                    .to_string();
            }
            said.push((cmd.clone(), stdout));
        }
        said
    })
    .await
    .unwrap();
    let shown = |prefix: &str| {
        &out.iter()
            .find(|(c, _)| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("the tour runs `{prefix}`"))
            .1
    };
    assert!(shown("herald tenant list").contains("demo"));
    assert!(shown("herald connections demo").contains("ticks.AAPL"));
    assert!(shown("herald history demo ticks.AAPL").contains("AAPL"));
    // The message published through the plugin arrived where the tour says.
    let (_, hist) = h
        .admin(
            reqwest::Method::GET,
            "/admin/v1/tenants/acme/channels/ticks.AAPL/history",
            None,
        )
        .await;
    assert_eq!(
        hist["messages"][0]["frame"]["data"],
        serde_json::json!({"sym": "AAPL", "px": "187.2"}),
        "{hist}"
    );
    // Step 4's inline command: `herald disconnect acme --subject alice`
    // closes the page's session (4003: disconnected, may reconnect).
    let disconnect = inline_command(&readme, "herald disconnect ");
    let mut alice = h
        .ws_with("acme", "token=tok-alice")
        .await
        .expect("alice connects with the tour's token");
    alice.sub("ticks.AAPL", 1).await;
    let line = disconnect.replacen("herald ", &format!("{} ", env!("CARGO_BIN_EXE_herald")), 1);
    let u = h.url("").trim_end_matches('/').to_string();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg("-c")
            .arg(&line)
            .env("HERALD_URL", &u)
            .env("HERALD_ADMIN_TOKEN", ADMIN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        run.status.success(),
        "`{disconnect}`: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        alice.closed().await.0,
        4003,
        "`{disconnect}` closed the session"
    );
    h.stop().await;
}

/// The first inline (backticked) command of the tour that starts with `prefix`.
fn inline_command(readme: &str, prefix: &str) -> String {
    let tour = &readme[readme.find("## Five minutes with Herald").unwrap()..];
    let at = tour
        .find(&format!("`{prefix}"))
        .unwrap_or_else(|| panic!("the tour shows `{prefix}…`"));
    let rest = &tour[at + 1..];
    // Markdown may wrap it: one space between words, as a reader types it.
    rest[..rest.find('`').unwrap()]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
