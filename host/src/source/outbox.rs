//! The `postgres_outbox` source: tails a tenant's outbox table in commit order.
//! In cluster mode the same reader tails an `http` tenant's rows of the
//! shared publish log (registry/log.rs) in the registry database, on the
//! cluster's pool, woken by the registry watch instead of a LISTEN of its own.
//!
//! Owns: connecting to the tenant's database, waking on NOTIFY (polling as
//! the safety net), reading rows past this node's cursor in batches, handing
//! them to ingest, and storing the cursor in the registry after each batch.
//!
//! Which rows are final is decided by transaction visibility, never by how
//! long a gap in ids has been open: ids are taken before commit, so a lower
//! id can become visible after a higher one. Every row carries the id of the
//! transaction that inserted it (`xid xid8 DEFAULT pg_current_xact_id()`);
//! the reader reads only rows whose xid is below the snapshot's xmin (every
//! transaction that old has ended, so that set of rows never changes), in
//! `(xid, id)` order, and its cursor is that pair. A transaction that stays
//! open holds back the rows committed after it: lag in the health
//! (`held_back`, `oldest_open_xact_ms`), never loss.
//!
//! Invariants: the stored cursor only moves past published rows, so a restart
//! neither loses nor repeats rows; the cursor belongs to one database (the
//! server's system identifier and the database name) and table; every wait on
//! the database (connect, query, NOTIFY) ends when the reader is stopped; any
//! database error marks the source stalled at once and retries with backoff;
//! lag that makes no progress for [`STALL_AFTER`] is stalled too. Never:
//! writes to the outbox table.

mod cursor;
mod shape;
mod sql;
mod stored;

use shape::add_xid;
pub use shape::{check, quoted_table};

use super::SourceContext;
use super::{set_state, Health, SourceConfig, SourceState};
use crate::clock::now_ms;
use crate::fanout::position::SourcePos;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::tenant::Tenant;
use parking_lot::Mutex;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{PgPool, Row};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use cursor::Cursor;
use sql::{decode, Backlog, OutboxRow, Sql};

/// No progress while lagging for this long means stalled.
pub const STALL_AFTER: Duration = Duration::from_millis(1500);
/// The NOTIFY channel the shipped trigger uses.
pub const NOTIFY_CHANNEL: &str = "herald_outbox";
/// `check` gives up on a database that has not answered by then.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Rows counted for `lag` and `held_back` at most (a longer backlog shows as this).
const COUNT_CAP: i64 = 100_000;
/// First re-check while rows are held back, doubling up to [`HOLD_RECHECK_MAX`]
/// (then the poll interval): a rollback sends no NOTIFY, and a short
/// transaction (most are: rows wait only for older inserts still committing)
/// should cost little delay.
const HOLD_RECHECK: Duration = Duration::from_millis(2);
const HOLD_RECHECK_MAX: Duration = Duration::from_millis(50);
/// How often the backlog (lag, held back, oldest open transaction) is
/// counted while rows flow; every idle wake-up counts it too.
const STATS_EVERY: Duration = Duration::from_millis(250);

/// Why an outbox cannot be used; the admin API answers with it.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("table name {0:?} is not a plain or schema-qualified identifier")]
    BadTable(String),
    #[error("cannot connect to the outbox database: {0}")]
    Connect(String),
    #[error("outbox table {table} is missing or lacks the expected columns (id, channel, key, payload, payload_bytes, headers, created_at, xid): {cause}")]
    Table { table: String, cause: String },
    #[error("outbox table {table} has no xid column, which Herald needs to tell which rows are final; add it with: {}", add_xid(table))]
    NoXid { table: String },
    #[error("outbox table {table} has an xid column of the wrong kind ({found}); it must be `xid8 NOT NULL DEFAULT pg_current_xact_id()`")]
    BadXid { table: String, found: String },
    #[error("outbox query failed: {0}")]
    Query(String),
    #[error("outbox table {table}: its ids start over (its id sequence is at {at}, this node read up to {read}): it was truncated with RESTART IDENTITY or made again; set the source again with a higher `generation` to start a new position space")]
    IdsStartOver { table: String, at: i64, read: i64 },
    #[error("the outbox reader was stopped")]
    Stopped,
}

/// Refuses a table whose ids started over below `read` (what this node read
/// before): its id sequence is behind it. A table without a sequence on
/// `id`, or one not used since it was reset, is not checked.
async fn ids_go_on(pool: &PgPool, quoted: &str, table: &str, read: i64) -> Result<(), OutboxError> {
    let at: Option<i64> =
        sqlx::query_scalar("SELECT pg_sequence_last_value(pg_get_serial_sequence($1, 'id'))")
            .bind(quoted)
            .fetch_one(pool)
            .await
            .map_err(query_err)?;
    match at {
        Some(at) if at < read => Err(OutboxError::IdsStartOver {
            table: table.to_string(),
            at,
            read,
        }),
        _ => Ok(()),
    }
}

fn connect_err(e: sqlx::Error) -> OutboxError {
    OutboxError::Connect(e.to_string())
}

fn query_err(e: sqlx::Error) -> OutboxError {
    OutboxError::Query(e.to_string())
}

async fn connect(url: &str) -> Result<PgPool, OutboxError> {
    PgPoolOptions::new()
        // One for NOTIFY, one for queries.
        .max_connections(2)
        // Short: an unreachable database must show as stalled within 2 s.
        .acquire_timeout(Duration::from_millis(800))
        .connect(url)
        .await
        .map_err(connect_err)
}

/// A pool that is closed when dropped. Closing marks it at once, so a
/// connection whose query was cancelled is closed rather than pinged (on a
/// database that does not answer, the ping would hold it open for good).
struct Db(PgPool);

impl Drop for Db {
    fn drop(&mut self) {
        let pool = self.0.clone();
        drop(pool.close());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), pool.close()).await;
            });
        }
    }
}

/// Which table a reader tails.
enum Origin {
    /// The tenant's own outbox, in its database.
    Outbox { url: String },
    /// Cluster mode: the tenant's rows of the shared publish log in the
    /// registry database, woken by the registry watch.
    Log(Arc<crate::registry::log::SharedLog>),
}

/// A pool of the reader's own (closed when dropped) or the cluster's.
enum Conn {
    Own(Db),
    Shared(PgPool),
}

impl Conn {
    fn pool(&self) -> &PgPool {
        match self {
            Conn::Own(db) => &db.0,
            Conn::Shared(p) => p,
        }
    }
}

/// What wakes a reader that has read everything: its own LISTEN, or the
/// cluster watch ringing the tenant's bell.
enum Wake<'a> {
    Listen(PgListener),
    Bell(&'a tokio::sync::Notify),
}

impl Wake<'_> {
    async fn rung(&mut self) -> Result<(), OutboxError> {
        match self {
            Wake::Listen(l) => l.recv().await.map(drop).map_err(connect_err),
            Wake::Bell(n) => {
                n.notified().await;
                Ok(())
            }
        }
    }
}

/// The log reader's safety-net poll: the watch rings on every NOTIFY and
/// on every reconnect, and rows held back behind an open transaction are
/// re-checked on their own schedule (`HOLD_RECHECK`), so this only covers a
/// notification lost on a live connection. Long: every tenant of every node
/// polls the one registry.
const LOG_POLL: Duration = Duration::from_secs(30);
/// How far back a log reader without a cursor (a node new to the tenant)
/// starts reading: a tenant just created elsewhere loses none of its first
/// rows, and a node joining later replays seconds, not the log's retention.
const LOG_CATCH_UP: Duration = Duration::from_secs(10);

pub struct Reader {
    ctx: Arc<SourceContext>,
    tenant: Arc<Tenant>,
    origin: Origin,
    table: String,
    batch: u32,
    poll: Duration,
    /// The source's `generation`: part of the cursor's registry key.
    generation: u32,
    /// When the tenant was made (a log reader without a cursor starts no
    /// earlier than that).
    created_at_ms: i64,
    health: Arc<Mutex<Health>>,
    stop: CancellationToken,
}

impl Reader {
    pub fn new(
        ctx: Arc<SourceContext>,
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
            generation,
        } = config
        else {
            unreachable!("the outbox reader is only built for postgres_outbox sources")
        };
        Reader {
            ctx,
            tenant,
            origin: Origin::Outbox { url: database_url },
            table,
            batch: batch_size.unwrap_or(1000).clamp(1, 10_000),
            poll: Duration::from_millis(poll_ms.unwrap_or(1000).clamp(10, 60_000)),
            generation,
            created_at_ms: 0,
            health,
            stop,
        }
    }

    /// The reader of the tenant's rows in the cluster's publish log.
    pub fn for_log(
        ctx: Arc<SourceContext>,
        tenant: Arc<Tenant>,
        log: Arc<crate::registry::log::SharedLog>,
        created_at_ms: i64,
        health: Arc<Mutex<Health>>,
        stop: CancellationToken,
    ) -> Reader {
        Reader {
            ctx,
            tenant,
            origin: Origin::Log(log),
            table: crate::registry::log::TABLE.to_string(),
            batch: 1000,
            poll: LOG_POLL,
            generation: 0,
            created_at_ms,
            health,
            stop,
        }
    }

    /// Runs until stopped: connect, tail, and on any error mark stalled and retry.
    pub async fn run(self) {
        super::keep_reading(&self.tenant, &self.health, &self.stop, "outbox", || async {
            match self.tail().await {
                Err(OutboxError::Stopped) => Ok(()),
                r => r,
            }
        })
        .await
    }

    /// `work`, unless the reader is stopped first.
    async fn or_stop<T>(
        &self,
        work: impl Future<Output = Result<T, OutboxError>>,
    ) -> Result<T, OutboxError> {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => Err(OutboxError::Stopped),
            r = work => r,
        }
    }

    /// One connected session of tailing; returns only on error or stop.
    async fn tail(&self) -> Result<(), OutboxError> {
        let quoted = quoted_table(&self.table)?;
        let (sql, conn) = match &self.origin {
            Origin::Outbox { url } => (
                Sql::new(&quoted, None),
                Conn::Own(Db(self.or_stop(connect(url)).await?)),
            ),
            Origin::Log(log) => (
                Sql::new(&quoted, Some(&self.tenant.id)),
                Conn::Shared(log.pool.clone()),
            ),
        };
        let pool = conn.pool();
        let mut listener = match &self.origin {
            Origin::Outbox { .. } => Wake::Listen(
                self.or_stop(async {
                    let mut l = PgListener::connect_with(pool).await.map_err(connect_err)?;
                    l.listen(NOTIFY_CHANNEL).await.map_err(connect_err)?;
                    Ok(l)
                })
                .await?,
            ),
            Origin::Log(_) => Wake::Bell(&self.tenant.log_written),
        };
        let key = self.or_stop(stored::source_key(pool, &self.table)).await?
            + &super::generation_suffix(self.generation);
        let (mut cursor, fresh) = self.or_stop(self.load_cursor(pool, &sql, &key)).await?;
        if let (Origin::Outbox { .. }, false, Some(read)) = (&self.origin, fresh, cursor.read) {
            self.or_stop(ids_go_on(pool, &quoted, &self.table, read))
                .await?;
        }
        // Where this node's knowledge of the source starts (ARCHITECTURE.md,
        // "Positions"): every id up to it was read by an earlier process, or
        // lies before where this node began. A cursor from a Herald that did
        // not keep it: the table's highest id stands for it (too high is a
        // gap reported too eagerly, never one missed), once: the next stored
        // cursor keeps it.
        let read = match cursor.read {
            Some(r) => r,
            None => {
                let r: Option<i64> = self
                    .or_stop(async {
                        sqlx::query_scalar(&format!("SELECT max(id) FROM {quoted}"))
                            .fetch_one(pool)
                            .await
                            .map_err(query_err)
                    })
                    .await?;
                let r = r.unwrap_or(0).max(cursor.id);
                cursor.read = Some(r);
                r
            }
        };
        self.tenant.hub.reading_from(read.max(0) as u64, 1, fresh);
        // Rows after the last one an earlier process delivered (or after
        // where a new node begins) are new here: a late one among them is
        // told apart from a re-read (`Hub::read_after`). Not for a cursor
        // taken over from a Herald that delivered in id order.
        if cursor.legacy.is_none() {
            self.tenant.hub.read_after(cursor.last_read());
        }
        self.past_pruned(&mut cursor, &key, &mut Vec::new()).await?;
        let mut last_progress = Instant::now();
        let mut held_since: Option<Instant> = None;
        let mut recheck = HOLD_RECHECK;
        let mut stats_at = Instant::now() - STATS_EVERY;
        let mut held_before = false;
        loop {
            let rows = self
                .or_stop(async {
                    let rows = Sql::bind(&sql.read, &cursor, i64::from(self.batch))
                        .fetch_all(pool)
                        .await
                        .map_err(query_err)?;
                    rows.iter().map(decode).collect::<Result<Vec<_>, _>>()
                })
                .await?;
            // Reachable again: say so before the backlog, so a client learns
            // of the recovery and then sees the messages it missed.
            if self.health.lock().state != SourceState::Live
                && last_progress.elapsed() <= STALL_AFTER
            {
                set_state(&self.tenant, &self.health, SourceState::Live, None);
            }
            let read = rows.len();
            let mut rows = rows;
            if read > 0 {
                self.past_pruned(&mut cursor, &key, &mut rows).await?;
            }
            if !rows.is_empty() {
                cursor = self.deliver(rows, cursor, &key).await?;
                last_progress = Instant::now();
                if read as u32 == self.batch {
                    // More is waiting: read on, count what is left later.
                    let mut h = self.health.lock();
                    h.lag = h.lag.map(|l| l.saturating_sub(read as u64));
                    continue;
                }
            }
            // The backlog query (counts, pg_stat_activity) costs milliseconds:
            // while rows flow it runs a few times a second, not per batch.
            if read > 0 && stats_at.elapsed() < STATS_EVERY {
                let wait = if held_before {
                    recheck.min(self.poll)
                } else {
                    self.poll
                };
                tokio::select! {
                    _ = self.stop.cancelled() => return Ok(()),
                    n = listener.rung() => n?,
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            stats_at = Instant::now();
            let backlog = self
                .or_stop(async {
                    let r = Sql::bind(&sql.stats, &cursor, COUNT_CAP)
                        .fetch_one(pool)
                        .await
                        .map_err(query_err)?;
                    let count = |c: &str| r.try_get::<i64, _>(c).map(|n| n.max(0) as u64);
                    Ok(Backlog {
                        pending: count("pending").map_err(query_err)?,
                        held: count("held").map_err(query_err)?,
                        oldest_ms: r
                            .try_get::<Option<i64>, _>("oldest_ms")
                            .map_err(query_err)?
                            .map(|m| m.max(0) as u64),
                    })
                })
                .await?;
            self.report(&backlog, &cursor, last_progress, &mut held_since);
            held_before = backlog.held > 0;
            // While rows are held back, look again soon (a rollback sends no
            // NOTIFY), less often the longer the transaction stays open.
            let wait = if backlog.held > 0 {
                let w = recheck.min(self.poll);
                recheck = (recheck * 2).min(HOLD_RECHECK_MAX.min(self.poll));
                w
            } else {
                recheck = HOLD_RECHECK;
                self.poll
            };
            tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                n = listener.rung() => n?,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Health and metrics from the backlog; lag that does not move is a stall.
    fn report(
        &self,
        backlog: &Backlog,
        cursor: &Cursor,
        last_progress: Instant,
        held_since: &mut Option<Instant>,
    ) {
        // The database's figure when it shows one, else how long this reader
        // has seen rows held (less than the truth, never more).
        let oldest = if backlog.held > 0 {
            let seen = held_since.get_or_insert_with(Instant::now).elapsed();
            Some(backlog.oldest_ms.unwrap_or(0).max(seen.as_millis() as u64))
        } else {
            *held_since = None;
            None
        };
        let stalled = {
            let mut h = self.health.lock();
            h.lag = Some(backlog.pending);
            h.held_back = Some(backlog.held);
            h.oldest_open_xact_ms = oldest;
            h.position = Some(cursor.shown());
            h.state == SourceState::Stalled
        };
        self.tenant.metrics.source_lag.set(backlog.pending as f64);
        if backlog.pending > 0 && last_progress.elapsed() > STALL_AFTER {
            let why = match oldest {
                Some(ms) => format!(
                    "{} committed rows held back behind a transaction open for {ms} ms",
                    backlog.held
                ),
                None => "lagging without progress".to_string(),
            };
            // The reason is recorded once per stall, not once per look.
            let why = (!stalled).then_some(why);
            set_state(&self.tenant, &self.health, SourceState::Stalled, why);
        } else {
            set_state(&self.tenant, &self.health, SourceState::Live, None);
        }
    }

    /// Publishes a batch through ingest, then stores the cursor past it.
    /// Not cut short by a stop: a batch handed to ingest is finished.
    async fn deliver(
        &self,
        rows: Vec<OutboxRow>,
        cursor: Cursor,
        key: &str,
    ) -> Result<Cursor, OutboxError> {
        let (first, mut last) = match (rows.first(), rows.last()) {
            (Some(f), Some(l)) => (f.id, cursor.past(l.xid, l.id)),
            _ => return Ok(cursor),
        };
        // Ids follow commit order only loosely: the batch's highest may be
        // any of its rows.
        let top = rows.iter().map(|r| r.id).max().unwrap_or(last.id);
        last.read = last.read.map(|r| r.max(top));
        let n = rows.len() as u64;
        let tenant = self.tenant.clone();
        let run = move || {
            let records: Vec<SourceRecord<'_>> = rows
                .iter()
                .map(|r| SourceRecord {
                    timestamp_ms: r.ts_ms.max(0) as u64,
                    position: Some(SourcePos {
                        stream: 0,
                        order: (r.xid, r.id as u64),
                        number: r.id as u64,
                    }),
                    key: r.key.as_deref().map(str::as_bytes),
                    value: &r.value,
                    // An empty channel is none (the publish log's way to
                    // leave it to the transform).
                    channel: Some(r.channel.as_str()).filter(|c| !c.is_empty()),
                    headers: &r.headers,
                })
                .collect();
            ingest::ingest(&tenant, &records)
        };
        let result = ingest::run_batch(
            &self.tenant,
            crate::plugin::active::Patience::Unbounded,
            run,
        )
        .await;
        // Without its plugin the tenant takes nothing: the reader stalls and
        // reads these rows again from the stored cursor once it is back.
        if let Err(e @ crate::plugin::PluginError::Unavailable(_)) = &result {
            return Err(OutboxError::Query(e.to_string()));
        }
        // A failed transform dead-letters the batch (counted in ingest); the
        // source moves on rather than retrying the same rows forever.
        if let Err(e) = result {
            tracing::warn!(tenant = %self.tenant.id, kind = e.kind(), first, last = last.id, "outbox batch dead-lettered");
        }
        self.tenant.metrics.source_records.increment(n);
        self.store_cursor(key, &self.held_back(last)).await?;
        {
            let mut h = self.health.lock();
            h.records += n;
            h.last_record_ms = Some(now_ms() as u64);
            h.position = Some(last.shown());
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests;
