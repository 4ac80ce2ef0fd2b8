//! A first start as the README tells it, configured by `HERALD_*`
//! variables alone: the generated admin token is printed once (and works),
//! a second start on the same data dir prints none and keeps it; the
//! variables reach the flags they name.

use crate::helpers::*;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Starts `herald serve` with no flags, only `env`; returns the child and
/// what it printed on stdout until it was ready.
async fn serve_by_env(env: &[(&str, String)], port: u16) -> (tokio::process::Child, Vec<String>) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.arg("serve")
        .env_remove("HERALD_ADMIN_TOKEN")
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let _ = tx.send(l);
        }
    });
    let ready = format!("http://127.0.0.1:{port}/readyz");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !reqwest::get(&ready).await.is_ok_and(|r| r.status() == 200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "herald did not start on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What it printed before it was ready (the token is printed first).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut said = Vec::new();
    while let Ok(l) = rx.try_recv() {
        said.push(l);
    }
    (child, said)
}

async fn stop(mut child: tokio::process::Child) {
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("herald exited after SIGTERM")
        .unwrap();
}

async fn tenants_status(port: u16, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/admin/v1/tenants"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_first_start_prints_its_admin_token_once_and_reads_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = [
        ("HERALD_LISTEN", format!("127.0.0.1:{port}")),
        ("HERALD_DATA_DIR", dir.path().display().to_string()),
        ("HERALD_NODE_ID", "node-from-env".to_string()),
        ("HERALD_MAX_SUBSCRIPTIONS", "2".to_string()),
    ];
    let (child, said) = serve_by_env(&env, port).await;
    let line = said
        .iter()
        .find(|l| l.contains("generated admin token (shown once"))
        .unwrap_or_else(|| panic!("no generated token printed: {said:?}"));
    let token = line.rsplit(' ').next().unwrap().to_string();
    assert!(token.starts_with("adm_"), "{line}");
    assert_eq!(tenants_status(port, &token).await, 200);
    assert_eq!(tenants_status(port, "adm_wrong").await, 401);

    // The variables reached their flags: the node's name, and a tenant's
    // subscription limit (a third subscribe is refused).
    let ready: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["node"], "node-from-env");
    let (status, _) = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/admin/v1/tenants"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"id": "env", "access": "public"}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(status, 201);
    let mut ws = ws_at(&format!("ws://127.0.0.1:{port}/v1/t/env/ws"))
        .await
        .unwrap();
    assert_eq!(ws.sub("a", 1).await["op"], "ack");
    assert_eq!(ws.sub("b", 2).await["op"], "ack");
    ws.send(serde_json::json!({"op": "sub", "ch": "c", "id": 3}))
        .await;
    let third = ws.next().await;
    assert_eq!(third["op"], "err", "{third}");
    drop(ws);
    stop(child).await;

    // Started again on the same data dir: no new token, the old one works.
    let (child, said) = serve_by_env(&env, port).await;
    assert!(
        !said.iter().any(|l| l.contains("admin token")),
        "a second start printed a token: {said:?}"
    );
    assert_eq!(tenants_status(port, &token).await, 200);
    stop(child).await;
}
