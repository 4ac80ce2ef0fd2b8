//! The Autobahn testsuite (autobahntestsuite 0.8.2, the field's public
//! yardstick for WebSocket servers), cases 1-10 and permessage-deflate's
//! 12.x and 13.x (a subset in the test run), against Herald's own
//! session path: a tenant started with `--echo-tenant` echoes what its
//! sessions are sent, through the same frame codec, reassembly, UTF-8
//! checks, ping/pong, close handshake, queue and writer as every session.
//! Every case must be OK, NON-STRICT or INFORMATIONAL; the report is kept
//! in target/autobahn/. scripts/test.sh installs the suite (under Python
//! 2.7) and sets HERALD_AUTOBAHN to its `wstest`.

use crate::helpers::*;
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_autobahn_cases_pass_on_the_session_path() {
    let wstest = match std::env::var("HERALD_AUTOBAHN") {
        Ok(w) => w,
        Err(_) => {
            assert!(
                std::env::var("HERALD_REQUIRE_AUTOBAHN").is_err(),
                "HERALD_REQUIRE_AUTOBAHN is set but HERALD_AUTOBAHN is not"
            );
            eprintln!("skipped: no Autobahn testsuite (scripts/test.sh installs it)");
            return;
        }
    };
    let mut opts = HostOptions::new();
    opts.config.echo_tenant = Some("autobahn".into());
    let h = spawn_with(opts).await;
    // Room for the suite's largest messages (16 MiB in 9.1.6 and 9.2.6).
    let big = 20usize << 20;
    let (status, body) = h
        .admin(
            reqwest::Method::POST,
            "/admin/v1/tenants",
            Some(json!({
                "id": "autobahn",
                "access": "public",
                "limits": {
                    "max_message_bytes": big,
                    "queue_bytes": 4 * big,
                    "history_bytes": big,
                    "history_total_bytes": big,
                    "conflation_max_bytes": big,
                    "client_ops_per_sec": 100000.0,
                    "client_ops_burst": 100000,
                    // permessage-deflate for every message (cases 12, 13).
                    "deflate_min_bytes": 1,
                },
            })),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    let report = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/autobahn");
    let _ = std::fs::remove_dir_all(&report);
    std::fs::create_dir_all(&report).unwrap();
    // Cases 1-10 whole; of the compression cases (1,000 messages each, up
    // to 128 KiB: about 1.3 s a case here), those of 1 KiB whole and 8 KiB
    // in 256-byte fragments for every test file (12.x) and every offer and
    // answer (13.x). All of 12.x and 13.x:
    // HERALD_AUTOBAHN_CASES='12.*,13.*' (BENCHMARKS.md).
    let cases: Vec<String> = match std::env::var("HERALD_AUTOBAHN_CASES") {
        Ok(list) => list.split(',').map(|c| c.trim().to_string()).collect(),
        Err(_) => (1..=10)
            .map(|i| format!("{i}.*"))
            .chain((1..=5).flat_map(|j| [4, 11].map(|i| format!("12.{j}.{i}"))))
            .chain((1..=7).flat_map(|j| [4, 11].map(|i| format!("13.{j}.{i}"))))
            // 64 KiB of a bitmap: miniz_oxide once left a sync flush
            // unfinished on such a message, and its echo came back short.
            .chain(["12.2.9".to_string()])
            .collect(),
    };
    let spec = json!({
        "outdir": report.join("report"),
        "servers": [{"agent": "Herald", "url": h.ws_url("autobahn")}],
        "cases": cases,
        "exclude-cases": [],
        "exclude-agent-cases": {},
    });
    std::fs::write(report.join("fuzzingclient.json"), spec.to_string()).unwrap();
    let dir = report.clone();
    let out = tokio::task::spawn_blocking(move || {
        // The whole suite under one bound: a hang is a failure, not a stuck run.
        Command::new("timeout")
            .args(["--kill-after=10", "900", &wstest])
            .args(["-m", "fuzzingclient", "-s", "fuzzingclient.json"])
            .current_dir(&dir)
            .output()
            .expect("wstest runs")
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "wstest failed ({}):\n{said}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(report.join("report/index.json")).expect("the suite's report"),
    )
    .unwrap();
    let cases = index["Herald"].as_object().expect("cases of agent Herald");
    assert!(
        cases.len() > 300 || std::env::var("HERALD_AUTOBAHN_CASES").is_ok(),
        "{} cases run",
        cases.len()
    );
    assert!(
        cases.keys().any(|c| c.starts_with("13."))
            || std::env::var("HERALD_AUTOBAHN_CASES").is_ok(),
        "the compression cases ran"
    );
    let mut bad = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for (case, r) in cases {
        let behavior = r["behavior"].as_str().unwrap_or("?");
        *counts.entry(behavior.to_string()).or_default() += 1;
        if !matches!(behavior, "OK" | "NON-STRICT" | "INFORMATIONAL") {
            bad.push(format!(
                "{case}: {behavior} (close: {})",
                r["behaviorClose"]
            ));
        }
    }
    eprintln!(
        "autobahn: {} cases, {counts:?}; report in {}",
        cases.len(),
        report.display()
    );
    assert!(bad.is_empty(), "cases that failed:\n{}", bad.join("\n"));
    tokio::time::timeout(Duration::from_secs(30), h.stop())
        .await
        .unwrap();
}
