//! The demo page and the browser client in a real browser —
//! headless Chromium (Debian's, driven by playwright-core from npm)
//! against `herald serve --demo` processes the script starts itself:
//! values update, a disconnect resumes without loss, a restart is survived
//! (every position delivered or shown as a gap), a silent publisher turns
//! the badge "stalled", a denied token shows the server's error, and a
//! page from another origin is served or refused by the tenant's allowed
//! origins. The script is clients/js/test/browser.mjs; it keeps a
//! screenshot at docs/demo.png.

use std::path::Path;
use std::process::Command;

#[tokio::test]
async fn the_demo_and_the_client_work_in_a_real_browser() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("clients/js/test/browser.mjs");
    let driver = root.join("clients/js/test/node_modules/playwright-core");
    let chromium = Path::new("/usr/bin/chromium");
    if !(chromium.exists() && driver.exists()) {
        assert!(
            std::env::var_os("HERALD_REQUIRE_BROWSER").is_none(),
            "HERALD_REQUIRE_BROWSER is set but {} or {} is missing (scripts/test.sh installs both)",
            chromium.display(),
            driver.display()
        );
        eprintln!("skipped: no Chromium or playwright-core (scripts/test.sh installs them)");
        return;
    }
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(&script)
            .env("HERALD_BIN", env!("CARGO_BIN_EXE_herald"))
            .current_dir(&root)
            .output()
            .expect("node runs")
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser test failed:\n{said}");
    assert!(!said.contains("FAIL"), "{said}");
    // Where the test command installed everything, a case may not skip
    // (an unbuilt example plugin is a failure there, not a skip).
    if std::env::var_os("HERALD_REQUIRE_BROWSER").is_some() {
        assert!(!said.contains("SKIP"), "a case skipped:\n{said}");
    }
}
