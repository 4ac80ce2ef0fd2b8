//! What a guest writes and what it may read. A plugin that prints
//! (a debugging author, a Python traceback, a Rust panic message) must not
//! panic a host thread, must stay on the fast path, and what it wrote must
//! reach the error of a call that fails; WASI's clocks and randomness must
//! not make a hook's output differ between instances (the WIT's promise).

use crate::helpers::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

/// Host panics, per thread, seen by a panic hook installed once (chaining
/// the default one). A `#[tokio::test]` runs the server's tasks on its own
/// thread, so a test counts the panics of its own server only.
fn panics_on(thread: ThreadId) -> usize {
    static SEEN: OnceLock<Mutex<Vec<ThreadId>>> = OnceLock::new();
    static HOOKED: AtomicUsize = AtomicUsize::new(0);
    let seen = SEEN.get_or_init(Default::default);
    if HOOKED.fetch_add(1, Ordering::SeqCst) == 0 {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(s) = SEEN.get() {
                s.lock().unwrap().push(std::thread::current().id());
            }
            previous(info);
        }));
    }
    let n = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|&&t| t == thread)
        .count();
    n
}

#[tokio::test]
async fn a_plugin_that_prints_panics_nothing() {
    let me = std::thread::current().id();
    let before = panics_on(me);
    let h = spawn_host().await;
    let t = "chatty";
    h.tenant(json!({"id":t,"access":"plugin"})).await;
    h.install_plugin(t, "fixture_chatty").await;
    for i in 0..10 {
        let mut ws = h.ws_with(t, "token=x").await.expect("admitted");
        let ok = ws.sub(&format!("c{i}"), 1).await;
        assert_eq!(ok["op"], "ack", "{ok}");
    }
    assert_eq!(
        panics_on(me) - before,
        0,
        "printing from a hook panicked a host thread"
    );
    // A call that prints, then traps: refused with the kind, and the host
    // still serves the next connection.
    let (s, v) = h.ws_with(t, "token=trap").await.err().unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("plugin_trap")),
        "{v}"
    );
    h.ws_with(t, "token=x").await.expect("still admitted");
    assert_eq!(panics_on(me) - before, 0);
    h.stop().await;
}

/// The publisher of a batch whose transform panicked reads why: the panic
/// message the guest wrote to stderr, not only "wasm backtrace".
#[tokio::test]
async fn a_trap_carries_what_the_guest_wrote() {
    let h = spawn_host().await;
    let t = "trap-text";
    let key = h.public_tenant(t).await;
    h.install_plugin(t, "fixture_panic").await;
    let (s, v) = h.publish(t, &key, json!({"ch":"c","data":1})).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"]["code"], "transform_failed");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("fixture panics in transform"),
        "the guest's own words are in the error: {message}"
    );
    h.stop().await;
}

/// Two instances of one plugin (two tenants) see the same frozen WASI wall
/// clock and draw the same random bytes: what a transform computes from
/// them cannot differ between the nodes that run it on the same records.
#[tokio::test]
async fn the_sandbox_has_no_clock_and_no_entropy() {
    let h = spawn_host().await;
    let mut seen = Vec::new();
    for t in ["entropy-a", "entropy-b"] {
        let key = h.public_tenant(t).await;
        h.install_plugin(t, "fixture_chatty").await;
        let mut ws = h.ws(t).await;
        ws.sub("c", 1).await;
        let (s, v) = h.publish(t, &key, json!({"ch":"c","data":1})).await;
        assert_eq!(s, 200, "{v}");
        let m = ws.next().await;
        seen.push(m["data"].clone());
    }
    assert_eq!(
        seen[0]["wall_ms"], 0,
        "WASI's wall clock is frozen: {seen:?}"
    );
    assert_eq!(
        seen[0]["hash"], seen[1]["hash"],
        "WASI's random bytes are the same in every instance"
    );
    h.stop().await;

    // And in another process (another node): a seed drawn per process would
    // pass the check above, and give two nodes different results.
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]).await;
    let (s, v) = node
        .admin(
            reqwest::Method::POST,
            "/admin/v1/tenants",
            json!({"id": "entropy-c", "access": "public"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let key = v["publish_key"].as_str().unwrap().to_string();
    let (s, v) = node
        .upload_plugin("entropy-c", plugin_wasm("fixture_chatty"))
        .await;
    assert_eq!(s, 201, "{v}");
    let path = format!(
        "/admin/v1/tenants/entropy-c/plugins/{}/activate",
        v["version"]
    );
    let (s, v) = node.admin(reqwest::Method::POST, &path, Value::Null).await;
    assert_eq!(s, 200, "{v}");
    let mut ws = node.ws("entropy-c", "").await.unwrap();
    ws.sub("c", 1).await;
    let (s, v) = node
        .publish("entropy-c", &key, json!({"ch":"c","data":1}))
        .await;
    assert_eq!(s, 200, "{v}");
    let m = ws.next().await;
    assert_eq!(
        m["data"]["hash"], seen[0]["hash"],
        "WASI's random bytes are the same in another process"
    );
}
