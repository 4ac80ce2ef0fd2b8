//! What an outbox table must look like before Herald tails it: a quoted,
//! checked name, the columns, and the `xid8` column (with the statements
//! an operator runs to add it). Never: writes to the table.

use super::{connect, query_err, Db, OutboxError, CHECK_TIMEOUT};
use sqlx::PgPool;

/// `name` or `schema.name`, each `[A-Za-z_][A-Za-z0-9_]*`, quoted for SQL.
pub fn quoted_table(table: &str) -> Result<String, OutboxError> {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = table.split('.').collect();
    if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| ok(p)) {
        return Err(OutboxError::BadTable(table.to_string()));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// The statements that add the xid column (and the reader's index) to a
/// table made before it existed, for the operator to run.
pub(super) fn add_xid(table: &str) -> String {
    // As typed when that names the same table (lower case), quoted otherwise.
    let name = if table.chars().any(|c| c.is_ascii_uppercase()) {
        quoted_table(table).unwrap_or_else(|_| table.to_string())
    } else {
        table.to_string()
    };
    let index = format!("{}_xid_id", table.rsplit('.').next().unwrap_or(table)).to_lowercase();
    format!(
        "ALTER TABLE {name} ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id(); \
         CREATE INDEX CONCURRENTLY {index} ON {name} (xid, id);"
    )
}

/// Checks that the database is reachable and the table has the outbox shape,
/// the xid column included.
pub async fn check(url: &str, table: &str) -> Result<(), OutboxError> {
    let quoted = quoted_table(table)?;
    tokio::time::timeout(CHECK_TIMEOUT, async {
        let db = Db(connect(url).await?);
        shape(&db.0, table, &quoted).await
    })
    .await
    .map_err(|_| OutboxError::Connect(format!("timed out after {CHECK_TIMEOUT:?}")))?
}

async fn shape(pool: &PgPool, table: &str, quoted: &str) -> Result<(), OutboxError> {
    sqlx::query(&format!(
        "SELECT id, channel, key, payload, payload_bytes, headers, created_at FROM {quoted} WHERE false"
    ))
    .execute(pool)
    .await
    .map_err(|e| OutboxError::Table {
        table: table.to_string(),
        cause: e.to_string(),
    })?;
    let xid: Option<(String, bool, Option<String>, bool)> = sqlx::query_as(
        "SELECT format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid), \
         EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute b ON b.attrelid = i.indrelid AND b.attname = 'id' \
                 WHERE i.indrelid = a.attrelid AND i.indkey[0] = a.attnum AND i.indkey[1] = b.attnum) \
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attrelid = $1::regclass AND a.attname = 'xid' AND NOT a.attisdropped",
    )
    .bind(quoted)
    .fetch_optional(pool)
    .await
    .map_err(query_err)?;
    match xid {
        None => Err(OutboxError::NoXid {
            table: table.to_string(),
        }),
        Some((ty, true, Some(default), indexed))
            if ty == "xid8" && default == "pg_current_xact_id()" =>
        {
            if !indexed {
                tracing::warn!(%table, "outbox table has no index on (xid, id): every read scans it; {}", add_xid(table));
            }
            Ok(())
        }
        Some((ty, not_null, default, _)) => Err(OutboxError::BadXid {
            table: table.to_string(),
            found: format!(
                "{ty}{}{}",
                if not_null { " NOT NULL" } else { "" },
                default.map(|d| format!(" DEFAULT {d}")).unwrap_or_default()
            ),
        }),
    }
}
