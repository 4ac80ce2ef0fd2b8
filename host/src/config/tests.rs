//! Unit tests of the serve flags: ranges, secrets by file, defaults.
use super::*;
use clap::Parser as _;

/// Secrets can come from files (no argv, no environment a
/// `ps` or `/proc/…/environ` shows): one line, its line break dropped;
/// not both ways at once.
#[test]
fn secrets_can_be_given_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "a-token-from-a-file-0123\n").unwrap();
    let url = dir.path().join("db-url");
    std::fs::write(&url, "postgres://u:pw@db/herald\n").unwrap();
    let metrics = dir.path().join("metrics-token");
    std::fs::write(&metrics, "metrics-from-a-file-0123").unwrap();
    let c = parse(&[
        "--admin-token-file",
        token.to_str().unwrap(),
        "--database-url-file",
        url.to_str().unwrap(),
        "--metrics-token-file",
        metrics.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(c.admin_token.as_deref(), Some("a-token-from-a-file-0123"));
    assert_eq!(c.database_url.as_deref(), Some("postgres://u:pw@db/herald"));
    assert_eq!(c.metrics_token.as_deref(), Some("metrics-from-a-file-0123"));
    // Both ways, or a file that is not there: a clear error.
    assert!(parse(&[
        "--admin-token",
        "x".repeat(16).as_str(),
        "--admin-token-file",
        token.to_str().unwrap()
    ])
    .is_err());
    let e = parse(&["--admin-token-file", "/nonexistent/token"]).unwrap_err();
    assert!(e.contains("--admin-token-file"), "{e}");
    std::fs::write(&token, "short\n").unwrap();
    let e = parse(&["--admin-token-file", token.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("at least 16"), "{e}");
}

fn parse(args: &[&str]) -> Result<Config, String> {
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }
    let mut v = vec!["herald"];
    v.extend_from_slice(args);
    let Serve { args } = Serve::try_parse_from(v).map_err(|e| e.to_string())?;
    args.to_config()
}

#[test]
fn defaults_are_valid() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.limits.slow_consumer, SlowConsumer::Conflate);
    assert_eq!(c.heartbeat, Duration::from_secs(25));
    assert_eq!(c.socket_send_buffer, Some(65_536));
}

#[test]
fn socket_send_buffer_zero_means_kernel_autotuning() {
    assert_eq!(
        parse(&["--socket-send-buffer", "0"])
            .unwrap()
            .socket_send_buffer,
        None
    );
    assert!(parse(&["--socket-send-buffer", "100"])
        .unwrap_err()
        .contains("--socket-send-buffer"));
}

#[test]
fn bad_flags_name_themselves() {
    assert!(parse(&["--slow-consumer", "explode"])
        .unwrap_err()
        .contains("explode"));
    assert!(parse(&["--queue-bytes", "100"])
        .unwrap_err()
        .contains("--queue-bytes"));
    assert!(parse(&["--database-url", "postgres://x"])
        .unwrap_err()
        .contains("--admin-token"));
    assert!(parse(&["--cluster"]).unwrap_err().contains("Postgres"));
    assert!(parse(&["--admin-token", "short"])
        .unwrap_err()
        .contains("16"));
    assert_eq!(
        parse(&["--slow-consumer", "drop-oldest"])
            .unwrap()
            .limits
            .slow_consumer,
        SlowConsumer::DropOldest
    );
}
