//! The hostile figures (BENCHMARKS.md, "Hostile tenants, round 2"): for each
//! attack, a calm tenant's delivery delays without it (3 s) and under it
//! (4 s) on one `herald serve` process of the test build, and what the
//! attacker holds once it stops (the server's open descriptors against the
//! baseline). Bounds are generous (the suite runs beside it on two cores);
//! the printed figures are the record.

use crate::helpers::*;
use crate::plugins_lanes::{percentiles, publish_until, watch};
use crate::sandbox::{component, hostile_component, spin};
use reqwest::Method;
use serde_json::{json, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Calm delays (p50, p99, max µs) without and under `attack`, which runs
/// until the instant it is given and says what it did.
async fn calm_under<F, Fut>(node: &Node, calm: &str, attack: F) -> [(u64, u64, u64); 2]
where
    F: FnOnce(Instant) -> Fut,
    Fut: Future<Output = ()>,
{
    let (s, v) = node
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            json!({"id":calm,"access":"public"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let key = v["publish_key"].as_str().unwrap().to_string();
    let storm_start = Instant::now() + Duration::from_millis(3500);
    let storm_end = storm_start + Duration::from_secs(4);
    let until = storm_end + Duration::from_millis(500);
    let mut watchers = Vec::new();
    for _ in 0..10 {
        let ws = node.subscriber(calm, "c").await;
        watchers.push(tokio::spawn(watch(ws, storm_start, until)));
    }
    let quiet = publish_until(
        node,
        calm,
        &key,
        0,
        storm_start - Duration::from_millis(500),
    )
    .await;
    tokio::time::sleep_until(storm_start.into()).await;
    let (under, ()) = tokio::join!(
        publish_until(node, calm, &key, 1, storm_end),
        attack(storm_end)
    );
    let sent = [quiet, under];
    let mut delays = [Vec::new(), Vec::new()];
    for w in watchers {
        let seen = w.await.unwrap();
        for phase in 0..2 {
            assert_eq!(seen.delays_us[phase].len(), sent[phase], "phase {phase}");
            delays[phase].extend(&seen.delays_us[phase]);
        }
    }
    [
        percentiles(std::mem::take(&mut delays[0])),
        percentiles(std::mem::take(&mut delays[1])),
    ]
}

fn report(name: &str, calm: [(u64, u64, u64); 2], held: &str) {
    let ms = |us: u64| us as f64 / 1000.0;
    eprintln!(
        "FIGURE {name}: calm p50/p99/max {:.1}/{:.1}/{:.1} ms without, {:.1}/{:.1}/{:.1} ms under it; {held}",
        ms(calm[0].0),
        ms(calm[0].1),
        ms(calm[0].2),
        ms(calm[1].0),
        ms(calm[1].1),
        ms(calm[1].2)
    );
    assert!(calm[1].1 < 100_000, "{name}: calm p99 {} µs", calm[1].1);
}

/// Waits until the server's descriptors are back within `slack` of
/// `baseline`; how long that took.
async fn back_to(pid: u32, baseline: usize, slack: usize, within: Duration) -> Duration {
    let t = Instant::now();
    while descriptors(pid) > baseline + slack {
        assert!(
            t.elapsed() < within,
            "{} descriptors, baseline {baseline}",
            descriptors(pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.elapsed()
}

/// One line of a node's /metrics (0 when absent).
async fn node_metric(port: u16, name_and_labels: &str) -> f64 {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn from(ip: &str, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    connect_from(ip, std::net::SocketAddr::new([127, 0, 0, 1].into(), port)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_round_two_figures() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &[
            "--heartbeat-secs",
            "1",
            "--max-connections",
            "3000",
            "--max-pending-connections",
            "1024",
            "--head-timeout-secs",
            "2",
        ],
    )
    .await;
    let (pid, port) = (node.pid(), node.port);

    // Door exhaustion from one address: 2,000 sockets that send nothing.
    let baseline = descriptors(pid);
    let held = Arc::new(parking_lot::Mutex::new((0usize, 0usize)));
    let calm = calm_under(&node, "calm-doors", |end| {
        let held = held.clone();
        async move {
            let mut idle = Vec::new();
            for _ in 0..2000 {
                if let Ok(s) = from("127.0.0.9", port).await {
                    idle.push(s);
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let peak = descriptors(pid);
            // Another address still gets in at once.
            let t = Instant::now();
            let mut other = from("127.0.0.10", port).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(
                &mut other,
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
            let mut answer = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut other, &mut answer)
                .await
                .unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            *held.lock() = (peak - baseline, t.elapsed().as_millis() as usize);
            tokio::time::sleep_until(end.into()).await;
        }
    })
    .await;
    let took = back_to(pid, baseline, 40, Duration::from_secs(10)).await;
    let (peak, other_ms) = *held.lock();
    report(
        "doors from one address (2,000 silent sockets)",
        calm,
        &format!("server held {peak} descriptors more at the peak (per-address bound 512), another address answered in {other_ms} ms; back to the baseline {took:?} after the attack stopped"),
    );

    // A public tenant's anonymous flood: 32 clients from one address
    // connect and hold their sessions.
    let (s, v) = node
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            json!({"id":"flood","access":"public"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let baseline = descriptors(pid);
    let tally = Arc::new(parking_lot::Mutex::new((0usize, 0usize, 0usize)));
    let calm = calm_under(&node, "calm-flood", |end| {
        let tally = tally.clone();
        async move {
            let mut tasks = Vec::new();
            for _ in 0..32 {
                let tally = tally.clone();
                tasks.push(tokio::spawn(async move {
                    let mut sessions = Vec::new();
                    while Instant::now() < end {
                        let Ok(stream) = from("127.0.0.11", port).await else {
                            continue;
                        };
                        let url = format!("ws://127.0.0.1:{port}/v1/t/flood/ws");
                        match tokio_tungstenite::client_async(
                            url,
                            tokio_tungstenite::MaybeTlsStream::Plain(stream),
                        )
                        .await
                        {
                            Ok((s, _)) => {
                                tally.lock().0 += 1;
                                sessions.push(s);
                            }
                            Err(_) => {
                                tally.lock().1 += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    sessions.len()
                }));
            }
            // The server's own count of the tenant's sessions, at its peak.
            let mut peak = 0.0f64;
            while Instant::now() < end {
                peak = peak.max(node_metric(port, "herald_connections{tenant=\"flood\"}").await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for t in tasks {
                t.await.unwrap();
            }
            tally.lock().2 = peak as usize;
        }
    })
    .await;
    let took = back_to(pid, baseline, 40, Duration::from_secs(10)).await;
    let (admitted, refused, holding) = *tally.lock();
    assert!(
        holding <= 1000,
        "{holding} sessions from one address at once"
    );
    report(
        "public-tenant flood (32 clients, one address, sessions held)",
        calm,
        &format!("{admitted} admitted, at most {holding} at once (the per-address bound is 1,000; unread sessions end at the heartbeat), {refused} refused; back to the baseline {took:?} after"),
    );

    // The many-memories plugin, uploaded over and over.
    let (s, _) = node
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            json!({"id":"bomb","access":"public"}),
        )
        .await;
    assert_eq!(s, 201);
    let bomb = hostile_component(64, 0, 0);
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calm = calm_under(&node, "calm-bomb", |end| {
        let (refused, bomb, url) = (refused.clone(), bomb.clone(), node.url(""));
        async move {
            let http = reqwest::Client::new();
            while Instant::now() < end {
                let r = http
                    .post(format!("{url}/admin/v1/tenants/bomb/plugins"))
                    .bearer_auth(ADMIN)
                    .body(bomb.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 422);
                refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    })
    .await;
    let (_, list) = node
        .admin(Method::GET, "/admin/v1/tenants/bomb/plugins", Value::Null)
        .await;
    report(
        "many-memories plugin (64 memories, uploaded in a loop)",
        calm,
        &format!(
            "{} uploads refused (memory count too high), versions stored: {}",
            refused.load(std::sync::atomic::Ordering::Relaxed),
            list["plugins"].as_array().map_or(0, Vec::len)
        ),
    );

    // A start function that spins 40 ms, re-run by a trap on every other
    // subscribe: 16 clients in a loop.
    let (s, _) = node
        .admin(
            Method::POST,
            "/admin/v1/tenants",
            json!({"id":"spin","access":"plugin","limits":{"plugin_deadline_ms":500}}),
        )
        .await;
    assert_eq!(s, 201);
    let (s, v) = node.upload_plugin("spin", component("", &spin(40))).await;
    assert_eq!(s, 201, "{v}");
    let version = v["version"].as_i64().unwrap();
    let (s, _) = node
        .admin(
            Method::POST,
            &format!("/admin/v1/tenants/spin/plugins/{version}/activate"),
            Value::Null,
        )
        .await;
    assert_eq!(s, 200);
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calm = calm_under(&node, "calm-spin", |end| {
        let made = made.clone();
        async move {
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let made = made.clone();
                tasks.push(tokio::spawn(async move {
                    let url = format!("ws://127.0.0.1:{port}/v1/t/spin/ws");
                    while Instant::now() < end {
                        let Ok(mut ws) = ws_at(&url).await else {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        };
                        ws.send(json!({"op":"sub","ch":"x","id":1})).await;
                        let _ = ws.next().await;
                        ws.send(json!({"op":"sub","ch":"s","id":2})).await;
                        let _ = ws.next().await;
                        made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
    })
    .await;
    report(
        "spinning instantiation (40 ms start, instance dropped by a trap each round)",
        calm,
        &format!(
            "{} rounds of trap + new instance, each made on the tenant's plugin threads",
            made.load(std::sync::atomic::Ordering::Relaxed)
        ),
    );
    drop(node);
}
