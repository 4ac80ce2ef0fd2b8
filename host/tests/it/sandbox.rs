//! The sandbox counts what a component makes, not only how far its memories
//! grow: core instances, linear memories and tables per instance are capped,
//! and table elements count against the memory budget. Each hostile
//! component below is refused at upload with a named error while another
//! tenant keeps serving; the same component under the caps is accepted, so
//! the caps are what refuse it.

use crate::helpers::*;
use serde_json::{json, Value};
use wit_parser::Resolve;

/// The core module of a minimal plugin (the shape wit-component's dummy
/// module has for the herald WIT): `describe` answers name "sandbox",
/// version "1" and both authorize hooks, which allow everything (subject
/// "sandbox") but trap on the channel "x"; the rest trap. `{extra}` adds definitions; `{init}` is the
/// body of `_initialize`, which the component runs at instantiation.
const MODULE: &str = r#"(module
  (type (;0;) (func (param i32 i32 i32)))
  (type (;1;) (func (result i64)))
  (type (;2;) (func (param i32)))
  (type (;3;) (func (result i32)))
  (type (;4;) (func (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (type (;5;) (func (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (type (;6;) (func (param i32 i32) (result i32)))
  (type (;7;) (func (param i32 i32 i32 i32) (result i32)))
  (type (;8;) (func (param i32 i32 i32 i32 i32 i32) (result i32)))
  (type (;9;) (func))
  (import "herald:plugin/host@0.2.0" "log" (func (;0;) (type 0)))
  (import "herald:plugin/host@0.2.0" "now-ms" (func (;1;) (type 1)))
  (import "herald:plugin/host@0.2.0" "config" (func (;2;) (type 2)))
  (memory (;0;) 1)
  (global $heap (mut i32) (i32.const 4096))
  (export "herald:plugin/guest@0.2.0#describe" (func 3))
  (export "cabi_post_herald:plugin/guest@0.2.0#describe" (func 4))
  (export "herald:plugin/guest@0.2.0#authorize-connect" (func 5))
  (export "cabi_post_herald:plugin/guest@0.2.0#authorize-connect" (func 6))
  (export "herald:plugin/guest@0.2.0#authorize-subscribe" (func 7))
  (export "cabi_post_herald:plugin/guest@0.2.0#authorize-subscribe" (func 8))
  (export "herald:plugin/guest@0.2.0#transform" (func 9))
  (export "cabi_post_herald:plugin/guest@0.2.0#transform" (func 10))
  (export "herald:plugin/guest@0.2.0#transform-flat" (func 11))
  (export "cabi_post_herald:plugin/guest@0.2.0#transform-flat" (func 12))
  (export "herald:plugin/guest@0.2.0#merge" (func 13))
  (export "cabi_post_herald:plugin/guest@0.2.0#merge" (func 14))
  (export "memory" (memory 0))
  (export "cabi_realloc" (func 15))
  (export "_initialize" (func 16))
  ;; info { name: (1100, 7), version: (1110, 1), hooks: both authorize hooks }
  (data (i32.const 1024) "\4c\04\00\00\07\00\00\00\56\04\00\00\01\00\00\00\03")
  (data (i32.const 1100) "sandbox")
  (data (i32.const 1110) "1")
  (data (i32.const 3076) "\4c\04\00\00\07")
  (func (;3;) (type 3) (result i32) i32.const 1024)
  (func (;4;) (type 2) (param i32))
  ;; result<session, denial> at 3072: ok, subject "sandbox", no audience or attributes
  (func (;5;) (type 4) (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    {connect}
    i32.const 3072)
  (func (;6;) (type 2) (param i32))
  ;; result<_, denial> at 2048, all zeros: ok; the channel "x" traps
  (func (;7;) (type 5) (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    local.get 8
    i32.const 1
    i32.eq
    if
      local.get 7
      i32.load8_u
      i32.const 120
      i32.eq
      if
        unreachable
      end
    end
    i32.const 2048)
  (func (;8;) (type 2) (param i32))
  (func (;9;) (type 6) (param i32 i32) (result i32) unreachable)
  (func (;10;) (type 2) (param i32))
  (func (;11;) (type 7) (param i32 i32 i32 i32) (result i32) unreachable)
  (func (;12;) (type 2) (param i32))
  (func (;13;) (type 8) (param i32 i32 i32 i32 i32 i32) (result i32) unreachable)
  (func (;14;) (type 2) (param i32))
  ;; A bump allocator that never frees (one call per instance is small).
  (func (;15;) (type 7) (param i32 i32 i32 i32) (result i32) (local i32)
    global.get $heap
    i32.const 7
    i32.add
    i32.const -8
    i32.and
    local.tee 4
    local.get 3
    i32.add
    global.set $heap
    local.get 4)
  (func (;16;) (type 9) (local i64)
    {init})
  {extra}
)"#;

/// A plugin component built from [`MODULE`].
pub fn component(extra: &str, init: &str) -> Vec<u8> {
    component_with(extra, init, "")
}

/// [`component`] whose authorize-connect runs `connect` first.
pub fn component_with(extra: &str, init: &str, connect: &str) -> Vec<u8> {
    let wit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/wit");
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve.push_path(&wit).expect("the plugin WIT");
    let world = resolve.select_world(&[pkg], Some("plugin")).unwrap();
    let text = MODULE
        .replace("{extra}", extra)
        .replace("{init}", init)
        .replace("{connect}", connect);
    let mut core = wat::parse_str(&text).unwrap();
    wit_component::embed_component_metadata(
        &mut core,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .module(&core)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

/// [`component`] with `memories` more linear memories and `tables` tables
/// of `elements` elements each.
pub(crate) fn hostile_component(memories: usize, tables: usize, elements: u64) -> Vec<u8> {
    let mut extra = String::new();
    for _ in 0..memories {
        extra.push_str("  (memory 1)\n");
    }
    for _ in 0..tables {
        extra.push_str(&format!("  (table {elements} funcref)\n"));
    }
    component(&extra, "")
}

/// Uploads `bytes` to a fresh tenant: the answer's status and error message.
async fn upload(h: &Host, tenant: &str, bytes: Vec<u8>) -> (u16, String) {
    h.tenant(json!({"id":tenant,"access":"public","limits":{"plugin_memory_bytes": 64 << 20}}))
        .await;
    let (s, v): (u16, Value) = h.upload_plugin(tenant, bytes).await;
    (
        s,
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test]
async fn components_that_make_too_much_are_refused_by_name() {
    let h = spawn_host().await;
    let calm = h.public_tenant("calm").await;
    let mut ws = h.ws("calm").await;
    ws.sub("c", 1).await;

    // Under the caps: instantiated and described.
    let (s, m) = upload(&h, "control", hostile_component(6, 20, 1000)).await;
    assert_eq!(s, 201, "{m}");

    let cases = [
        (
            "memories",
            hostile_component(64, 0, 0),
            "memory count too high",
        ),
        (
            "tables",
            hostile_component(0, 90, 10),
            "table count too high",
        ),
        // 20 tables of 2^20 elements: 160 MiB of table under a 64 MiB budget.
        (
            "table-bytes",
            hostile_component(0, 20, 1 << 20),
            "memory cap of 67108864 bytes",
        ),
        (
            "huge-table",
            hostile_component(0, 1, 1 << 24),
            "memory cap of 67108864 bytes",
        ),
    ];
    for (n, (name, bytes, named)) in cases.into_iter().enumerate() {
        let (s, m) = upload(&h, &format!("hostile-{name}"), bytes).await;
        assert_eq!(s, 422, "{name}: {m}");
        assert!(m.contains(named), "{name}: {m}");
        // The calm tenant serves on.
        h.publish("calm", &calm, json!({"ch":"c","data":n})).await;
        assert_eq!(ws.next().await["data"], json!(n), "{name}");
    }
    h.stop().await;
}

/// `_initialize` that spins for `ms` milliseconds of the host's clock.
pub(crate) fn spin(ms: u64) -> String {
    format!(
        "call 1 local.set 0
    loop
      call 1 local.get 0 i64.sub i64.const {ms} i64.lt_u br_if 0
    end"
    )
}

/// A component whose instantiation takes 400 ms (a start function that
/// spins, well inside its 3 s deadline) while clients subscribe at once
/// after a trap dropped the pooled instance. Instances are made
/// on the tenant's plugin threads, so another tenant's messages still go
/// out at once; before, one was made on the runtime worker (one here, so
/// "every worker"), under the full deadline, and everything waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_slow_instantiation_never_holds_a_runtime_worker() {
    let h = spawn_host().await;
    let calm = h.public_tenant("calm").await;
    let mut ws = h.ws("calm").await;
    ws.sub("c", 1).await;
    let limits = json!({"plugin_deadline_ms": 3000, "plugin_threads": 2});
    h.tenant(json!({"id":"slow-start","access":"plugin","limits":limits}))
        .await;
    let (s, v) = h
        .upload_plugin("slow-start", component("", &spin(400)))
        .await;
    assert_eq!(s, 201, "{v}");
    h.activate("slow-start", v["version"].as_i64().unwrap())
        .await;

    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(h.ws("slow-start").await);
    }
    // A trap drops the pooled instance: the next call needs a new one.
    clients[0].send(json!({"op":"sub","ch":"x","id":99})).await;
    let e = clients[0].next().await;
    assert_eq!(e["code"], "plugin_error", "{e}");
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(json!({"op":"sub","ch":"s","id":i})).await;
    }
    let mut worst = std::time::Duration::ZERO;
    for n in 0..12u64 {
        let t = std::time::Instant::now();
        h.publish("calm", &calm, json!({"ch":"c","data":n})).await;
        assert_eq!(ws.next().await["data"], json!(n));
        worst = worst.max(t.elapsed());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Every subscription is answered (some after waiting for a thread).
    for c in &mut clients {
        let ack = c.next().await;
        assert_eq!(ack["op"], "ack", "{ack}");
    }
    assert!(
        worst < std::time::Duration::from_millis(150),
        "a calm tenant's publish took {worst:?} while another tenant's instances were made"
    );
    h.stop().await;
}
