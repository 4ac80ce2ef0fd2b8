//! Unit tests of the outbox source: table names and the operator's statements.

use super::*;

#[test]
fn table_names_are_checked_and_quoted() {
    assert_eq!(quoted_table("herald_outbox").unwrap(), "\"herald_outbox\"");
    assert_eq!(
        quoted_table("app.outbox_1").unwrap(),
        "\"app\".\"outbox_1\""
    );
    for bad in ["", "a.b.c", "1abc", "x; DROP TABLE y", "a-b", "\"q\""] {
        assert!(quoted_table(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_missing_column_error_names_the_statement_to_run() {
    let e = OutboxError::NoXid {
        table: "app.Outbox".into(),
    }
    .to_string();
    assert!(
        e.contains("ALTER TABLE \"app\".\"Outbox\" ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();"),
        "{e}"
    );
    assert!(
        e.contains("CREATE INDEX CONCURRENTLY outbox_xid_id ON \"app\".\"Outbox\" (xid, id);"),
        "{e}"
    );
}
