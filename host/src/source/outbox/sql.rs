//! The outbox reader's SQL: its statements for one table (or one tenant's
//! rows of the cluster's publish log), the backlog it counts, and a row as
//! read. Every statement reads only below the snapshot's xmin, in
//! `(xid, id)` order (see the parent module).

use super::cursor::Cursor;
use super::{query_err, OutboxError};
use sqlx::Row;

/// The reader's statements for one table.
pub(super) struct Sql {
    pub(super) read: [String; 2],
    pub(super) stats: [String; 2],
    pub(super) end: String,
}

impl Sql {
    /// The statements for table `t`; `only` restricts them to one tenant's
    /// rows (the shared publish log).
    pub(super) fn new(t: &str, only: Option<&str>) -> Sql {
        // Tenant ids are [a-z0-9_-] (proto::validate_tenant_id): safe as a literal.
        let only = only.map_or(String::new(), |id| format!("tenant_id = '{id}' AND "));
        // $1 xid and $2 id of the cursor, $3 a limit; while taking over a
        // bare id also $4 after_id and $5 until_xid.
        let legacy = |on: bool| {
            if on {
                " AND (id > $4 OR xid >= $5::text::xid8)"
            } else {
                ""
            }
        };
        let read = |on| {
            format!(
                "SELECT id, xid::text AS xid_text, channel, key, COALESCE(payload::text, '') AS payload, payload_bytes, \
                 headers::text AS headers, (extract(epoch from created_at) * 1000)::bigint AS ts FROM {t} \
                 WHERE {only}(xid, id) > ($1::text::xid8, $2) AND xid < (SELECT pg_snapshot_xmin(pg_current_snapshot())){} \
                 ORDER BY xid, id LIMIT $3",
                legacy(on)
            )
        };
        // The counts walk the (xid, id) index in order: without ORDER BY the
        // generic plan of a prepared statement scanned the whole table (25 ms
        // at 200k rows, and growing), which held every row back that long.
        let stats = |on| {
            let after = format!("{only}(xid, id) > ($1::text::xid8, $2){}", legacy(on));
            format!(
                "WITH h AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS horizon) SELECT \
                 (SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {after} ORDER BY xid, id LIMIT $3) p) AS pending, \
                 (SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {after} AND xid >= h.horizon ORDER BY xid, id LIMIT $3) q) AS held, \
                 (SELECT (extract(epoch from clock_timestamp() - a.xact_start) * 1000)::bigint FROM pg_stat_activity a \
                  WHERE a.backend_xid IS NOT NULL AND a.xact_start IS NOT NULL \
                  ORDER BY age(a.backend_xid) DESC LIMIT 1) AS oldest_ms FROM h"
            )
        };
        Sql {
            read: [read(false), read(true)],
            stats: [stats(false), stats(true)],
            end: format!(
                "SELECT xid::text AS xid_text, id FROM {t} WHERE {only}xid < (SELECT pg_snapshot_xmin(pg_current_snapshot())) \
                 ORDER BY xid DESC, id DESC LIMIT 1"
            ),
        }
    }

    /// `statement` with the cursor (and limit) bound.
    pub(super) fn bind<'q>(
        statement: &'q [String; 2],
        c: &Cursor,
        limit: i64,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let q = sqlx::query(&statement[usize::from(c.legacy.is_some())])
            .bind(c.xid.to_string())
            .bind(c.id)
            .bind(limit);
        match c.legacy {
            Some(l) => q.bind(l.after_id).bind(l.until_xid.to_string()),
            None => q,
        }
    }
}

/// What is left beyond the cursor, as the database sees it now.
pub(super) struct Backlog {
    /// Committed rows not yet delivered (up to [`COUNT_CAP`]).
    pub(super) pending: u64,
    /// Of those, the ones behind a transaction still open.
    pub(super) held: u64,
    /// Age of the oldest open transaction that has written anything, when
    /// the database shows it to this user.
    pub(super) oldest_ms: Option<u64>,
}

/// One row as read.
pub(super) struct OutboxRow {
    pub(super) id: i64,
    pub(super) xid: u64,
    pub(super) channel: String,
    pub(super) key: Option<String>,
    pub(super) value: Vec<u8>,
    pub(super) headers: Vec<(String, Vec<u8>)>,
    pub(super) ts_ms: i64,
}

pub(super) fn parse_xid(s: &str) -> Result<u64, OutboxError> {
    s.parse()
        .map_err(|_| OutboxError::Query(format!("not a transaction id: {s:?}")))
}

pub(super) fn decode(row: &sqlx::postgres::PgRow) -> Result<OutboxRow, OutboxError> {
    let payload: String = row.try_get("payload").map_err(query_err)?;
    let bytes: Option<Vec<u8>> = row.try_get("payload_bytes").map_err(query_err)?;
    let headers: Option<String> = row.try_get("headers").map_err(query_err)?;
    let headers = headers
        .and_then(|h| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&h).ok())
        .map(|m| {
            m.into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        serde_json::Value::String(s) => s.into_bytes(),
                        other => other.to_string().into_bytes(),
                    };
                    (k, v)
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(OutboxRow {
        id: row.try_get("id").map_err(query_err)?,
        xid: parse_xid(&row.try_get::<String, _>("xid_text").map_err(query_err)?)?,
        channel: row.try_get("channel").map_err(query_err)?,
        key: row.try_get("key").map_err(query_err)?,
        value: bytes.unwrap_or_else(|| payload.into_bytes()),
        headers,
        ts_ms: row.try_get("ts").map_err(query_err)?,
    })
}
