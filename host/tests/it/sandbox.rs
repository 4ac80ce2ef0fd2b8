//! The sandbox counts what a component makes, not only how far its memories
//! grow: core instances, linear memories and tables per instance are capped,
//! and table elements count against the memory budget. Each hostile
//! component below is refused at upload with a named error while another
//! tenant keeps serving; the same component under the caps gets as far as
//! its (trapping) `describe`, so the caps are what refuse it.

use crate::helpers::*;
use serde_json::{json, Value};
use wit_parser::{LiftLowerAbi, ManglingAndAbi, Resolve};

/// A component exporting the plugin contract whose core module also
/// defines `memories` extra linear memories and `tables` extra tables of
/// `elements` elements each. Its functions trap (`unreachable`).
fn hostile_component(memories: usize, tables: usize, elements: u64) -> Vec<u8> {
    let wit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/wit");
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve.push_path(&wit).expect("the plugin WIT");
    let world = resolve.select_world(&[pkg], Some("plugin")).unwrap();
    let module =
        wit_component::dummy_module(&resolve, world, ManglingAndAbi::Legacy(LiftLowerAbi::Sync));
    let mut text = wasmprinter::print_bytes(&module).unwrap();
    let end = text.rfind(')').unwrap();
    let mut extra = String::new();
    for _ in 0..memories {
        extra.push_str("  (memory 1)\n");
    }
    for _ in 0..tables {
        extra.push_str(&format!("  (table {elements} funcref)\n"));
    }
    text.insert_str(end, &extra);
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

    // Under the caps: instantiated, then `describe` traps.
    let (s, m) = upload(&h, "control", hostile_component(2, 2, 1000)).await;
    assert_eq!(s, 422, "{m}");
    assert!(m.contains("unreachable"), "{m}");

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
