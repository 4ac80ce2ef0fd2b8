//! The `postgres_outbox` source: tails a tenant's outbox table by id.
//!
//! Owns: connecting to the tenant's database, waking on NOTIFY (polling as
//! the safety net), reading rows above this node's cursor in batches,
//! handing them to ingest, and storing the cursor in the registry after each
//! batch. Invariants: rows are delivered in id order and never past a gap
//! that may still fill (a transaction that took a lower id may not have
//! committed yet) until the gap has been open for [`GAP_HOLD`] (then it was
//! a rollback); the stored cursor only moves past published rows, so a
//! restart neither loses nor repeats rows; any database error marks the
//! source stalled at once and retries with backoff; a source with lag that
//! makes no progress for [`STALL_AFTER`] is stalled too.

use super::{set_state, Health, SourceConfig, SourceState};
use crate::app::App;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::registry::now_ms;
use crate::tenant::Tenant;
use parking_lot::Mutex;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{PgPool, Row};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a gap in ids may stay open before it is taken for a rollback.
pub const GAP_HOLD: Duration = Duration::from_millis(500);
/// No progress while lagging for this long means stalled.
pub const STALL_AFTER: Duration = Duration::from_millis(1500);
/// The NOTIFY channel the shipped trigger uses.
pub const NOTIFY_CHANNEL: &str = "herald_outbox";

/// Why an outbox cannot be used; the admin API answers with it.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("table name {0:?} is not a plain or schema-qualified identifier")]
    BadTable(String),
    #[error("cannot connect to the outbox database: {0}")]
    Connect(String),
    #[error("outbox table {table} is missing or lacks the expected columns (id, channel, key, payload, payload_bytes, headers, created_at): {cause}")]
    Table { table: String, cause: String },
    #[error("outbox query failed: {0}")]
    Query(String),
}

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

async fn connect(url: &str) -> Result<PgPool, OutboxError> {
    PgPoolOptions::new()
        .max_connections(2)
        // Short: an unreachable database must show as stalled within 2 s.
        .acquire_timeout(Duration::from_millis(800))
        .connect(url)
        .await
        .map_err(|e| OutboxError::Connect(e.to_string()))
}

/// Checks that the database is reachable and the table has the outbox shape.
pub async fn check(url: &str, table: &str) -> Result<(), OutboxError> {
    let quoted = quoted_table(table)?;
    let pool = tokio::time::timeout(Duration::from_secs(5), connect(url))
        .await
        .map_err(|_| OutboxError::Connect("timed out after 5 s".into()))??;
    let r = sqlx::query(&format!(
        "SELECT id, channel, key, payload, payload_bytes, headers, created_at FROM {quoted} WHERE false"
    ))
    .execute(&pool)
    .await;
    pool.close().await;
    r.map(|_| ()).map_err(|e| OutboxError::Table {
        table: table.to_string(),
        cause: e.to_string(),
    })
}

/// One row as read.
struct OutboxRow {
    id: i64,
    channel: String,
    key: Option<String>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    ts_ms: i64,
}

pub struct Reader {
    app: Arc<App>,
    tenant: Arc<Tenant>,
    url: String,
    table: String,
    batch: u32,
    poll: Duration,
    health: Arc<Mutex<Health>>,
    stop: CancellationToken,
}

impl Reader {
    pub fn new(
        app: Arc<App>,
        tenant: Arc<Tenant>,
        config: SourceConfig,
        health: Arc<Mutex<Health>>,
        stop: CancellationToken,
    ) -> Reader {
        let SourceConfig::PostgresOutbox {
            database_url,
            table,
            batch_size,
            poll_ms,
        } = config
        else {
            unreachable!("the outbox reader is only built for postgres_outbox sources")
        };
        Reader {
            app,
            tenant,
            url: database_url,
            table,
            batch: batch_size.unwrap_or(1000).clamp(1, 10_000),
            poll: Duration::from_millis(poll_ms.unwrap_or(1000).clamp(10, 60_000)),
            health,
            stop,
        }
    }

    fn source_key(&self) -> String {
        format!("outbox:{}", self.table)
    }

    /// Runs until stopped: connect, tail, and on any error mark stalled and retry.
    pub async fn run(self) {
        super::keep_reading(&self.tenant, &self.health, &self.stop, "outbox", || {
            self.tail()
        })
        .await
    }

    /// One connected session of tailing; returns only on error or stop.
    async fn tail(&self) -> Result<(), OutboxError> {
        let quoted = quoted_table(&self.table)?;
        let pool = connect(&self.url).await?;
        let mut listener = PgListener::connect(&self.url)
            .await
            .map_err(|e| OutboxError::Connect(e.to_string()))?;
        listener
            .listen(NOTIFY_CHANNEL)
            .await
            .map_err(|e| OutboxError::Connect(e.to_string()))?;
        let mut cursor = self.load_cursor(&pool, &quoted).await?;
        let select = format!(
            "SELECT id, channel, key, COALESCE(payload::text, '') AS payload, payload_bytes, headers::text AS headers, \
             (extract(epoch from created_at) * 1000)::bigint AS ts FROM {quoted} WHERE id > $1 ORDER BY id LIMIT $2"
        );
        let max_id = format!("SELECT COALESCE(MAX(id), 0) AS m FROM {quoted}");
        let mut gap_since: Option<(i64, Instant)> = None;
        let mut last_progress = Instant::now();
        loop {
            if self.stop.is_cancelled() {
                return Ok(());
            }
            let rows = sqlx::query(&select)
                .bind(cursor)
                .bind(i64::from(self.batch))
                .fetch_all(&pool)
                .await
                .map_err(|e| OutboxError::Query(e.to_string()))?;
            let head: i64 = sqlx::query(&max_id)
                .fetch_one(&pool)
                .await
                .and_then(|r| r.try_get("m"))
                .map_err(|e| OutboxError::Query(e.to_string()))?;
            // Reachable again: say so before the backlog, so a client learns
            // of the recovery and then sees the messages it missed.
            if self.health.lock().state != SourceState::Live
                && last_progress.elapsed() <= STALL_AFTER
            {
                set_state(&self.tenant, &self.health, SourceState::Live, None);
            }
            // Rows up to the first gap that may still fill.
            let mut ready = Vec::with_capacity(rows.len());
            let mut expected = cursor + 1;
            let mut holding = false;
            for row in &rows {
                let id: i64 = row
                    .try_get("id")
                    .map_err(|e| OutboxError::Query(e.to_string()))?;
                if id != expected {
                    match gap_since {
                        Some((at, since)) if at == expected && since.elapsed() >= GAP_HOLD => {}
                        Some((at, _)) if at == expected => {
                            holding = true;
                            break;
                        }
                        _ => {
                            gap_since = Some((expected, Instant::now()));
                            holding = true;
                            break;
                        }
                    }
                }
                ready.push(decode(row)?);
                expected = id + 1;
            }
            if !ready.is_empty() {
                cursor = self.deliver(ready).await?;
                last_progress = Instant::now();
            }
            let lag = (head - cursor).max(0) as u64;
            {
                let mut h = self.health.lock();
                h.lag = Some(lag);
                h.position = Some(cursor.to_string());
            }
            self.tenant.metrics.source_lag.set(lag as f64);
            if lag > 0 && last_progress.elapsed() > STALL_AFTER {
                set_state(
                    &self.tenant,
                    &self.health,
                    SourceState::Stalled,
                    Some("lagging without progress".into()),
                );
            } else {
                set_state(&self.tenant, &self.health, SourceState::Live, None);
            }
            // A full batch means more is waiting; a held gap is re-checked soon.
            if rows.len() as u32 == self.batch && !holding {
                continue;
            }
            let wait = if holding {
                Duration::from_millis(50)
            } else {
                self.poll
            };
            tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                n = listener.recv() => {
                    n.map_err(|e| OutboxError::Connect(e.to_string()))?;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The stored cursor, or the table's current end on first start (a new
    /// source starts at the latest row, like a Kafka consumer at "latest").
    async fn load_cursor(&self, pool: &PgPool, quoted: &str) -> Result<i64, OutboxError> {
        let node = &self.app.config.node_id;
        let stored = self
            .app
            .registry
            .cursor(&self.tenant.id, node, &self.source_key())
            .await
            .map_err(|e| OutboxError::Query(format!("reading the cursor: {e}")))?;
        if let Some(p) = stored.and_then(|s| s.parse::<i64>().ok()) {
            return Ok(p);
        }
        let end: i64 = sqlx::query(&format!("SELECT COALESCE(MAX(id), 0) AS m FROM {quoted}"))
            .fetch_one(pool)
            .await
            .and_then(|r| r.try_get("m"))
            .map_err(|e| OutboxError::Table {
                table: self.table.clone(),
                cause: e.to_string(),
            })?;
        self.store_cursor(end).await?;
        Ok(end)
    }

    async fn store_cursor(&self, cursor: i64) -> Result<(), OutboxError> {
        self.app
            .registry
            .put_cursor(
                &self.tenant.id,
                &self.app.config.node_id,
                &self.source_key(),
                &cursor.to_string(),
            )
            .await
            .map_err(|e| OutboxError::Query(format!("storing the cursor: {e}")))
    }

    /// Publishes a batch through ingest, then stores the cursor past it.
    async fn deliver(&self, rows: Vec<OutboxRow>) -> Result<i64, OutboxError> {
        let last = rows.last().map_or(0, |r| r.id);
        let n = rows.len() as u64;
        let tenant = self.tenant.clone();
        let run = move || {
            let records: Vec<SourceRecord<'_>> = rows
                .iter()
                .map(|r| SourceRecord {
                    timestamp_ms: r.ts_ms.max(0) as u64,
                    position: Some(crate::fanout::position::SourcePos {
                        stream: 0,
                        order: (0, r.id as u64),
                        number: r.id as u64,
                    }),
                    key: r.key.as_deref().map(str::as_bytes),
                    value: &r.value,
                    channel: Some(&r.channel),
                    headers: &r.headers,
                })
                .collect();
            ingest::ingest(&tenant, &records)
        };
        let result = ingest::run_batch(&self.tenant, run).await;
        // A failed transform dead-letters the batch (counted in ingest); the
        // source moves on rather than retrying the same rows forever.
        if let Err(e) = result {
            tracing::warn!(tenant = %self.tenant.id, kind = e.kind(), first = last - n as i64 + 1, last, "outbox batch dead-lettered");
        }
        self.tenant.metrics.source_records.increment(n);
        self.store_cursor(last).await?;
        {
            let mut h = self.health.lock();
            h.records += n;
            h.last_record_ms = Some(now_ms() as u64);
            h.position = Some(last.to_string());
        }
        Ok(last)
    }
}

fn decode(row: &sqlx::postgres::PgRow) -> Result<OutboxRow, OutboxError> {
    let q = |e: sqlx::Error| OutboxError::Query(e.to_string());
    let payload: String = row.try_get("payload").map_err(q)?;
    let bytes: Option<Vec<u8>> = row.try_get("payload_bytes").map_err(q)?;
    let headers: Option<String> = row.try_get("headers").map_err(q)?;
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
        id: row.try_get("id").map_err(q)?,
        channel: row.try_get("channel").map_err(q)?,
        key: row.try_get("key").map_err(q)?,
        value: bytes.unwrap_or_else(|| payload.into_bytes()),
        headers,
        ts_ms: row.try_get("ts").map_err(q)?,
    })
}

#[cfg(test)]
mod tests {
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
}
