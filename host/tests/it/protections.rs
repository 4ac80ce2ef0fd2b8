//! The protections that exist, proven on a real process — the
//! memory budget refuses at once and does not overshoot, the open-files
//! limit caps connections at once — while existing clients keep receiving.

use crate::helpers::*;
use reqwest::Method;
use serde_json::json;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connects `n` clients from `tasks` tasks at once; returns the clients
/// that got in, and the refusals by code (each must come at once).
async fn flood(url: String, n: usize, tasks: usize) -> (Vec<Ws>, Vec<String>) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (url, next) = (url.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            let (mut held, mut refused) = (Vec::new(), Vec::new());
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let t = Instant::now();
                match ws_at(&url).await {
                    Ok(ws) => held.push(ws),
                    Err((503, v)) => {
                        assert!(t.elapsed() < Duration::from_secs(2), "refused at once");
                        refused.push(v["error"]["code"].as_str().unwrap_or("").to_string());
                    }
                    Err(other) => panic!("{other:?}"),
                }
            }
            (held, refused)
        }));
    }
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for h in handles {
        let (a, b) = h.await.unwrap();
        held.extend(a);
        refused.extend(b);
    }
    (held, refused)
}

async fn public(node: &Node, id: &str) -> String {
    let (s, v) = node
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            // The floods here come from one address and test the process's
            // own bounds: a public tenant's default shares would refuse first.
            json!({"id":id,"access":"public",
                   "limits":{"connection_share_percent":100,"max_connections_per_address":100000}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    v["publish_key"].as_str().unwrap().to_string()
}

async fn still_receive(node: &Node, key: &str, existing: &mut [Ws]) {
    let (s, v) = node
        .publish("guard", key, json!({"ch":"c","data":"still"}))
        .await;
    assert_eq!(s, 200, "{v}");
    for ws in existing {
        assert_eq!(ws.next().await["data"], "still");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_memory_budget_refuses_at_once_and_does_not_overshoot() {
    herald::raise_nofile_limit().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // What this build holds at rest, then a budget a few MiB above it.
    let probe = Node::start(dir.path(), &[]).await;
    let base = probe.rss_bytes();
    drop(probe.kill().await);
    let budget_mib = base / (1 << 20) + 8;
    let budget = budget_mib << 20;
    let node = Node::start(
        dir.path(),
        &["--memory-budget-mib", &budget_mib.to_string()],
    )
    .await;
    let key = public(&node, "guard").await;
    let mut existing = Vec::new();
    for _ in 0..5 {
        existing.push(node.subscriber("guard", "c").await);
    }
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = {
        let (peak, pid) = (peak.clone(), node.pid());
        tokio::spawn(async move {
            loop {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    if let Some(kib) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().strip_suffix("kB"))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                    {
                        peak.fetch_max(kib * 1024, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let url = format!("ws://127.0.0.1:{}/v1/t/guard/ws", node.port);
    let (held, refused) = flood(url, 8000, 64).await;
    sampling.abort();
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "budget {budget_mib} MiB (at rest {} KiB): {} admitted, {} refused, peak RSS {} KiB ({:.2}x the budget)",
        base >> 10,
        held.len(),
        refused.len(),
        peak >> 10,
        peak as f64 / budget as f64
    );
    assert!(!refused.is_empty(), "the budget refused");
    assert!(refused.iter().all(|c| c == "memory_budget"), "{refused:?}");
    assert!(
        peak <= budget + budget / 20,
        "RSS peaked at {peak} bytes, over the {budget}-byte budget"
    );
    still_receive(&node, &key, &mut existing).await;
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_open_files_limit_caps_connections_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // 300 descriptors: 200 sessions (100 kept back), sockets stop at 250.
    let node = Node::start_limited(dir.path(), &[], 300).await;
    assert_eq!(node.metric("herald_connection_capacity").await, 200.0);
    let key = public(&node, "guard").await;
    let mut existing = Vec::new();
    for _ in 0..10 {
        existing.push(node.subscriber("guard", "c").await);
    }
    let url = format!("ws://127.0.0.1:{}/v1/t/guard/ws", node.port);
    let t = Instant::now();
    let (held, refused) = flood(url, 240, 32).await;
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(held.len(), 190, "the capacity, less the 10 already in");
    assert_eq!(refused.len(), 50);
    assert!(
        refused.iter().all(|c| c == "global_connections"),
        "{refused:?}"
    );
    still_receive(&node, &key, &mut existing).await;
    // Closing them frees their slots: as soon as the server has seen the
    // closes (polled: on a loaded machine that takes more than a moment).
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match node.ws("guard", "").await {
            Ok(_) => break,
            Err(e) if Instant::now() >= deadline => panic!("no slot freed after 5 s: {e:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
