//! A property-based API fuzzer (schemathesis, from PyPI) in smoke
//! form against the generated OpenAPI document: every operation is called
//! with the document's examples and generated input; no answer may be a
//! 5xx, and every answer must match the document. scripts/test.sh installs
//! it and sets HERALD_SCHEMATHESIS to its `st`.

use crate::helpers::*;
use std::process::Command;
use std::time::Duration;

#[tokio::test]
async fn generated_requests_get_no_5xx_and_documented_answers() {
    let st = match std::env::var("HERALD_SCHEMATHESIS") {
        Ok(st) => st,
        Err(_) => {
            assert!(
                std::env::var_os("HERALD_REQUIRE_SCHEMATHESIS").is_none(),
                "HERALD_REQUIRE_SCHEMATHESIS is set but HERALD_SCHEMATHESIS is not"
            );
            eprintln!("skipped: no schemathesis (scripts/test.sh installs it)");
            return;
        }
    };
    let mut opts = HostOptions::new();
    opts.config.demo_tenant = true;
    opts.config.demo_interval = Some(Duration::from_millis(100));
    let h = spawn_with(opts).await;
    // Operations that change or remove the tenant they name: each gets a
    // tenant of its own, so the rest are fuzzed against a `demo` that is
    // still there (one shared tenant, deleted early, answered 404 to all
    // that came after).
    const DESTRUCTIVE: &[&str] = &[
        "update",
        "remove",
        "rotate_key",
        "set_source",
        "deactivate",
        "rollback",
        "activate",
    ];
    let url = h.url("/admin/v1/openapi.json");
    let mut exclude = vec!["upload"];
    exclude.extend_from_slice(DESTRUCTIVE);
    let mut runs: Vec<(String, Vec<String>)> = vec![(
        "demo".into(),
        exclude
            .iter()
            .flat_map(|op| ["--exclude-operation-id".to_string(), op.to_string()])
            .collect(),
    )];
    for op in DESTRUCTIVE {
        let tenant = format!("st-{}", op.replace('_', "-"));
        h.public_tenant(&tenant).await;
        runs.push((
            tenant,
            vec!["--include-operation-id".to_string(), op.to_string()],
        ));
    }
    for (tenant, filter) in runs {
        let dir = tempfile::tempdir().unwrap();
        // Path parameters name a tenant that exists, so calls reach past the 404.
        std::fs::write(
            dir.path().join("schemathesis.toml"),
            format!(
                "[parameters]\n\"path.tenant\" = \"{tenant}\"\n\"path.channel\" = \"ticks.AAPL\"\n"
            ),
        )
        .unwrap();
        let (st, url) = (st.clone(), url.clone());
        let out = tokio::task::spawn_blocking(move || {
            // The whole run under one bound: a hang is a failure, not a stuck run.
            Command::new("timeout")
                .args(["--kill-after=10", "300", &st])
                .args(["run", &url])
                .args(["-H", &format!("Authorization: Bearer {ADMIN}")])
                .args(["-c", "not_a_server_error,response_schema_conformance"])
                .args(["-n", "25", "--phases", "examples,fuzzing"])
                .args(&filter)
                .arg("--generation-deterministic")
                .args(["--request-timeout", "10"])
                .current_dir(dir.path())
                .output()
                .expect("schemathesis runs")
        })
        .await
        .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        eprintln!("{tenant}: {said}{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "schemathesis found failures ({tenant}):\n{said}"
        );
        assert!(said.contains("passed"), "{said}");
    }
    h.stop().await;
}
