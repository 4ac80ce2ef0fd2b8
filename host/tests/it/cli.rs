//! `herald plugin new` scaffolds a plugin that builds with its own
//! script, and `herald plugin test` runs its hooks without a server and
//! reports outputs, refusals, guest output and failures by name.

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn herald(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .output()
        .expect("herald runs")
}

fn plugin_test(component: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["plugin", "test", component.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = herald(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints JSON")
}

fn records(dir: &Path, lines: &[Value]) -> String {
    let path = dir.join("records.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    path.to_str().unwrap().to_string()
}

/// Scaffolds `lang`, builds it with the script it came with, and checks
/// what `plugin test` says about the template's own rules.
fn scaffold_builds_and_runs(lang: &str, env: &[(&str, String)]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("my-plugin");
    let out = herald(&["plugin", "new", lang, dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("build.sh"), "{said}");
    // A second `new` into it is refused: nothing is overwritten.
    let again = herald(&["plugin", "new", lang, dir.to_str().unwrap()]);
    assert!(!again.status.success());
    let mut build = Command::new("bash");
    build.arg(dir.join("build.sh"));
    for (k, v) in env {
        build.env(k, v);
    }
    let built = build.output().unwrap();
    assert!(
        built.status.success(),
        "{lang} build: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    let component = dir.join("target/plugin.wasm");
    let recs = records(
        tmp.path(),
        &[
            json!({"value":{"n":1},"channel":"public.x","key":"k1"}),
            json!({"text":"plain","channel":"public.y"}),
        ],
    );
    let config = r#"{"tokens":{"secret-1":"alice"}}"#;
    let r = plugin_test(
        &component,
        &[
            "--config",
            config,
            "--connect",
            r#"{"credentials":"secret-1"}"#,
            "--records",
            &recs,
            "--deadline-ms",
            "1000",
        ],
    );
    assert_eq!(r["describe"]["contract"], "herald:plugin@0.2.0", "{r}");
    assert_eq!(r["connect"]["allowed"], true, "{r}");
    assert_eq!(r["connect"]["subject"], "alice");
    let msgs = r["transform"]["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "{r}");
    assert_eq!(
        (&msgs[0]["channel"], &msgs[0]["key"], &msgs[0]["payload"]),
        (&json!("public.x"), &json!("k1"), &json!(r#"{"n":1}"#))
    );
    assert_eq!(
        (&msgs[1]["channel"], &msgs[1]["payload"]),
        (&json!("public.y"), &json!("plain"))
    );
    let r = plugin_test(
        &component,
        &["--config", config, "--connect", r#"{"credentials":"nope"}"#],
    );
    assert_eq!(
        (
            r["connect"]["allowed"].as_bool(),
            r["connect"]["code"].as_str()
        ),
        (Some(false), Some("invalid_token"))
    );
}

#[test]
fn a_c_scaffold_builds_and_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The example's build installed the toolchain; reuse its npm tools.
    let tools = root.join("plugins/target/example/c-tools");
    scaffold_builds_and_runs("c", &[("HERALD_C_TOOLS", tools.display().to_string())]);
}

#[test]
fn a_python_scaffold_builds_and_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = root.join("plugins/target/example/python-venv");
    scaffold_builds_and_runs("python", &[("HERALD_PY_VENV", venv.display().to_string())]);
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
    let r = plugin_test(
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
        ],
    );
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
