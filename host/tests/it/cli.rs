//! `herald plugin test` runs a component's hooks without a server and
//! reports outputs, refusals, guest output and failures by name, and fails
//! when a hook did. (`herald plugin new` and its build scripts, in the four
//! languages, are run as the guides say in guides.rs.)

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn herald(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .output()
        .expect("herald runs")
}

/// `plugin test --json`: the report, the exit code and what it said on stderr.
fn plugin_test(component: &Path, extra: &[&str]) -> (Value, Option<i32>, String) {
    let mut args = vec!["plugin", "test", component.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = herald(&args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("--json prints JSON ({e}): {err}"));
    (report, out.status.code(), err)
}

fn records(dir: &Path, lines: &[Value]) -> String {
    let path = dir.join("records.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    path.to_str().unwrap().to_string()
}

/// The example's hostile cases, as `plugin test` reports them: the
/// guest's output beside each call, failures by kind with what the guest
/// wrote, and a record that alone is too slow refused, not the batch.
#[test]
fn plugin_test_reports_failures_by_name_with_the_guest_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let component = root.join("plugins/target/example/c.wasm");
    let tmp = tempfile::tempdir().unwrap();
    let recs = records(
        tmp.path(),
        &[
            json!({"value":{"sym":"abc","px":"1"}}),
            json!({"value":{"sym":"PRINT","px":"2"}}),
            json!({"value":{"sym":"LOOP","px":"3"}}),
        ],
    );
    let config = r#"{"tokens":{},"hostile":true}"#;
    let cache = tmp.path().join("cache");
    let cache = cache.to_str().unwrap();
    let (r, code, err) = plugin_test(
        &component,
        &[
            "--config",
            config,
            "--records",
            &recs,
            "--connect",
            r#"{"credentials":"hostile-throw"}"#,
            "--subscribe",
            "ticks.A",
            "--cache-dir",
            cache,
        ],
    );
    // A trapped hook fails the command (it exited 0), after the report,
    // and the summary names each failed call.
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("connect (trap)"), "{err}");
    assert!(err.contains("transform of record 2 (timeout)"), "{err}");
    // The subscribe ran without a granted session, and says as whom.
    assert_eq!(
        r["subscribe_as"],
        json!({"subject": "test", "because": "the connect failed"}),
        "{r}"
    );
    assert_eq!(r["compiled"], "now", "{r}");
    assert_eq!(r["connect"]["error"], "trap", "{r}");
    assert!(
        r["connect"]["message"]
            .as_str()
            .unwrap()
            .contains("herald-example: thrown on request"),
        "{r}"
    );
    assert_eq!(r["subscribe"][0]["allowed"], true);
    let t = &r["transform"];
    assert_eq!(t["messages"].as_array().unwrap().len(), 2, "{t}");
    assert_eq!(
        (
            t["refused"][0]["record"].as_u64(),
            t["refused"][0]["kind"].as_str()
        ),
        (Some(2), Some("timeout")),
        "{t}"
    );
    assert!(
        t["output"]
            .as_str()
            .unwrap()
            .contains("herald-example: transform printed 1"),
        "{t}"
    );
    // Run again: the compiled component comes from the cache, and the
    // report says so (it said "compiled" on a cache hit). Calls that only
    // answer — a denial included — pass.
    let (r, code, err) = plugin_test(
        &component,
        &[
            "--config",
            r#"{"tokens":{"t1":"alice"}}"#,
            "--connect",
            r#"{"credentials":"nope"}"#,
            "--cache-dir",
            cache,
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(r["compiled"], "cache", "{r}");
    assert_eq!(r["connect"]["allowed"], false, "{r}");
    let text = herald(&[
        "plugin",
        "test",
        component.to_str().unwrap(),
        "--cache-dir",
        cache,
        "--subscribe",
        "ticks.A",
    ]);
    let said = String::from_utf8_lossy(&text.stdout);
    assert!(said.contains("loaded compiled from the cache"), "{said}");
    assert!(!said.contains("compiled in"), "{said}");
    assert!(
        said.contains("subscribes run as subject \"test\": there is no --connect"),
        "{said}"
    );
    // A file that is not a component is a clear error, not a panic.
    let bogus = tmp.path().join("x.wasm");
    std::fs::write(&bogus, b"not wasm").unwrap();
    let out = herald(&["plugin", "test", bogus.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not compile"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
