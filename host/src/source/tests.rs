//! Unit tests of source configs: parsing and credentials hidden.

use super::*;

#[test]
fn configs_parse_and_redact() {
    let c: SourceConfig = serde_json::from_str(
        r#"{"kind":"postgres_outbox","database_url":"postgres://u:pw@h:5/db","table":"herald_outbox"}"#,
    )
    .unwrap();
    assert_eq!(c.kind(), "postgres_outbox");
    assert_eq!(c.redacted()["database_url"], "postgres://u:***@h:5/db");
    assert_eq!(
        serde_json::from_str::<SourceConfig>(r#"{"kind":"http"}"#).unwrap(),
        SourceConfig::default()
    );
    assert_eq!(
        serde_json::from_str::<SourceConfig>(r#"{"kind":"http","stall_after_ms":3000}"#).unwrap(),
        SourceConfig::Http {
            stall_after_ms: Some(3000)
        }
    );
    let e = serde_json::from_str::<SourceConfig>(r#"{"kind":"postgres_outbox","table":"t"}"#)
        .unwrap_err();
    assert!(e.to_string().contains("database_url"), "{e}");
    assert!(serde_json::from_str::<SourceConfig>(r#"{"kind":"carrier_pigeon"}"#).is_err());
    assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
}

/// No part of a secret in a source URL is shown.
#[test]
fn every_credential_in_a_url_is_hidden() {
    for (url, shown) in [
        ("postgres://u:p@ss@h:5/db", "postgres://u:***@h:5/db"),
        (
            "postgres://u:pw@h/db?sslmode=require&password=x&sslpassword=y",
            "postgres://u:***@h/db?sslmode=require&password=***&sslpassword=***",
        ),
        (
            "postgres://h/db?user=u&password=hunter2#f",
            "postgres://h/db?user=u&password=***#f",
        ),
        ("postgres://u@h/db", "postgres://u@h/db"),
        (
            "postgres://u:pw@h?application_name=a",
            "postgres://u:***@h?application_name=a",
        ),
        (
            "postgres://h/db?Auth_Token=t",
            "postgres://h/db?Auth_Token=***",
        ),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
}

#[test]
fn a_generation_names_another_position_space() {
    let parse = |s: &str| serde_json::from_str::<SourceConfig>(s).unwrap();
    let seed = |c: &SourceConfig| c.epoch_seed("t", 1, false);
    let kafka = r#"{"kind":"kafka","brokers":"b","topics":["t"]}"#;
    let kafka_0 = r#"{"kind":"kafka","brokers":"b","topics":["t"],"generation":0}"#;
    let kafka_1 = r#"{"kind":"kafka","brokers":"b","topics":["t"],"generation":1}"#;
    // Sources set before generations existed keep their space.
    assert_eq!(seed(&parse(kafka)), seed(&parse(kafka_0)));
    assert_ne!(seed(&parse(kafka)), seed(&parse(kafka_1)));
    // Generation 0 is not shown; another is.
    assert!(serde_json::to_value(parse(kafka_0))
        .unwrap()
        .get("generation")
        .is_none());
    assert_eq!(
        serde_json::to_value(parse(kafka_1)).unwrap()["generation"],
        1
    );
    let outbox = r#"{"kind":"postgres_outbox","database_url":"postgres://h/d","table":"o"}"#;
    let outbox_2 =
        r#"{"kind":"postgres_outbox","database_url":"postgres://h/d","table":"o","generation":2}"#;
    assert_ne!(seed(&parse(outbox)), seed(&parse(outbox_2)));
}

/// Readers that do not stop when told (a query that hangs, a broker that
/// does not answer) cost a shutdown one grace, not one per tenant.
#[tokio::test]
async fn every_reader_stops_under_one_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let sources = Sources::new(SourceContext {
        cursors: crate::registry::cursors::CursorStore::new(
            crate::registry::Registry::open(None, dir.path())
                .await
                .unwrap(),
            "n",
        ),
        log: None,
        log_kafka: None,
        shutdown: CancellationToken::new(),
        tracker: TaskTracker::new(),
    });
    for i in 0..3 {
        // Ignores its stop token.
        sources.slot(&format!("stuck-{i}")).done =
            Some(tokio::spawn(tokio::time::sleep(Duration::from_secs(30))));
    }
    let started = std::time::Instant::now();
    stopped_all(&sources).await;
    let took = started.elapsed();
    assert!(
        took < STOP_GRACE + Duration::from_secs(1),
        "{took:?} for three stuck readers (one grace is {STOP_GRACE:?})"
    );
}
