//! Every scenario at tiny scale, so the bench cannot rot: each run starts
//! its servers (Herald from this build, the raw baseline, nchan and the
//! Python and uWebSockets peers where the scenario compares them), checks that nothing was
//! lost, stops everything it started and records nothing.
//!
//! The peers come from `bench/peers/install.sh` (run by `scripts/test.sh`;
//! the bench itself runs it when a peer is missing). The outbox and cluster
//! scenarios run when `HERALD_TEST_POSTGRES_URL` names a Postgres.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// One scenario at a time: they share the two cores with each other's servers.
static SERIAL: Mutex<()> = Mutex::new(());

fn herald() -> PathBuf {
    // `cargo test --workspace` builds the herald binary (the host's
    // integration tests use it) beside this one.
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_bench"));
    bench.with_file_name("herald")
}

fn plugins() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/target/wasm32-wasip2/release")
}

/// Runs one scenario at smoke scale; returns what it printed.
fn smoke(args: &[&str]) -> String {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let herald = herald();
    assert!(
        herald.is_file(),
        "{} is missing: run `cargo build -p herald-host` (cargo test --workspace builds it)",
        herald.display()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .arg("--smoke")
        .arg("--no-record")
        .arg("--herald")
        .arg(&herald)
        .args(["--deadline-secs", "120"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running the bench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "bench {} failed ({}):\n{text}",
        args.join(" "),
        out.status
    );
    // Scenarios fail (non-zero exit) on a lost, late or out-of-order frame
    // at smoke scale; a success must still have reported something.
    assert!(
        text.contains("/s") || text.contains("KiB per connection"),
        "bench {} reported no figures:\n{text}",
        args.join(" ")
    );
    eprintln!("{text}");
    text
}

/// An ingest run fails (non-zero exit) on a repeated, out-of-order or lost
/// record; it must also have said that its check ran.
fn ingest_checked(args: &[&str]) {
    let text = smoke(args);
    assert!(
        text.contains("arrived once each and in order"),
        "bench {} did not report its order check:\n{text}",
        args.join(" ")
    );
}

#[test]
fn idle_ws_beside_peers() {
    smoke(&["idle", "--peers", "nchan,python,uws"]);
}

#[test]
fn idle_sse_beside_nchan() {
    smoke(&["idle", "--transport", "sse", "--peers", "nchan"]);
}

#[test]
fn idle_across_reuse_port_processes() {
    smoke(&["idle", "--processes", "2"]);
}

#[test]
fn fanout_beside_raw_and_peers() {
    smoke(&["fanout", "--baseline", "raw", "--peers", "nchan,python,uws"]);
}

/// Each server's own batch API (uWebSockets' `/pub` takes Herald's batch
/// body), two rounds of same-run pairs.
#[test]
fn fanout_native_batches_in_rounds() {
    smoke(&[
        "fanout",
        "--batch",
        "3",
        "--publish",
        "native",
        "--peers",
        "uws",
        "--repeat",
        "2",
    ]);
}

#[test]
fn fanout_rate_sweep_over_channels() {
    smoke(&[
        "fanout",
        "--channels",
        "10",
        "--subs-per-conn",
        "3",
        "--batch",
        "5",
        "--rates",
        "10,20",
        "--peers",
        "nchan",
    ]);
}

#[test]
fn ticker_with_conflation() {
    let plugin = plugins().join("ticker_conflate.wasm");
    smoke(&["ticker", "--plugin", plugin.to_str().unwrap()]);
}

#[test]
fn slow_consumers_beside_peers() {
    smoke(&["slow", "--peers", "nchan,python,uws"]);
}

#[test]
fn connect_rate_and_storm() {
    let p = plugins();
    smoke(&[
        "connect",
        "--plugins",
        p.to_str().unwrap(),
        "--peers",
        "nchan,python,uws",
    ]);
}

#[test]
fn hot_swap_under_load() {
    let p = plugins().join("herald_example_rust.wasm");
    smoke(&["swap", "--plugin", p.to_str().unwrap()]);
}

#[test]
fn plugin_costs() {
    let p = plugins();
    // `--also` measures another transform component beside ticker-conflate
    // (the JavaScript one is not built by the test command: ~400 MB of npm).
    let also = p.join("ticker_merge.wasm");
    smoke(&[
        "plugin",
        "--plugins",
        p.to_str().unwrap(),
        "--also",
        also.to_str().unwrap(),
    ]);
}

#[test]
fn kafka_ingest() {
    let p = plugins().join("ticker_conflate.wasm");
    ingest_checked(&[
        "ingest",
        "--source",
        "kafka",
        "--plugin",
        p.to_str().unwrap(),
    ]);
}

/// Whether the test script gave a Postgres; without one the `what` smoke
/// run is skipped, unless Postgres is required.
fn postgres(what: &str) -> bool {
    if std::env::var("HERALD_TEST_POSTGRES_URL").is_ok_and(|u| !u.is_empty()) {
        return true;
    }
    assert!(
        std::env::var("HERALD_REQUIRE_POSTGRES").as_deref() != Ok("1"),
        "HERALD_REQUIRE_POSTGRES=1 but HERALD_TEST_POSTGRES_URL is not set"
    );
    eprintln!("HERALD_TEST_POSTGRES_URL is not set; skipping the {what} smoke run");
    false
}

#[test]
fn outbox_ingest() {
    if !postgres("outbox") {
        return;
    }
    ingest_checked(&["ingest", "--source", "outbox"]);
}

#[test]
fn fanout_over_a_cluster() {
    if !postgres("cluster") {
        return;
    }
    let text = smoke(&["fanout", "--nodes", "1,2"]);
    assert!(
        text.contains("herald / cluster-2"),
        "no cluster figure:\n{text}"
    );
    let text = smoke(&[
        "fanout",
        "--nodes",
        "1",
        "--cluster-kafka-mock",
        "--cluster-only",
    ]);
    assert!(
        text.contains("cluster-kafka-1"),
        "no cluster-kafka figure:\n{text}"
    );
}
