//! The shared publish log (cluster mode): `POST /v1/t/{t}/publish` on an
//! `http` tenant writes here and answers once the write committed; every
//! node, the receiving one included, delivers the rows through its log
//! reader (`source::outbox`, reading this table for the tenant), so every
//! node gives a message the same position (`seq` = id × 1000 + index).
//!
//! Invariants: a batch is one transaction, its ids in batch order, announced
//! (NOTIFY) at commit; one tenant's appends hold an advisory lock until they
//! commit, so its ids follow commit order; rows older than
//! `--cluster-log-retention-secs` are deleted, and the last deleted row of
//! each tenant is recorded in the same statement. Never: delivers anything
//! itself.

use sqlx::PgPool;
use std::time::Duration;

/// Tenant ids with new rows in the publish log; sent by the publishing node.
pub const PUBLISH_CHANNEL: &str = "herald_publish";

/// `--cluster-kafka`: where `http` tenants' publishes are logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterKafka {
    pub brokers: String,
    pub prefix: String,
}

impl ClusterKafka {
    /// The topic of one tenant's publishes.
    pub fn topic(&self, tenant: &str) -> String {
        format!("{}{tenant}", self.prefix)
    }
}

/// One message an HTTP publish hands to the place every node reads it from
/// (this log, or a Kafka topic with `--cluster-kafka`).
pub struct Publication<'a> {
    /// `None` when the tenant's transform picks the channel.
    pub channel: Option<&'a str>,
    pub key: Option<&'a str>,
    pub payload: &'a [u8],
}

/// The shared publish log of a cluster: the registry database's pool and
/// how long rows are kept.
pub struct SharedLog {
    pub pool: PgPool,
    pub retention: Duration,
}

/// The table, created by the registry's migrations (Postgres only).
pub const TABLE: &str = "herald_publish_log";

/// The first key of the advisory lock a tenant's appends take ("HLOG").
const LOG_LOCK: i32 = 0x484c_4f47;

/// Why a batch was not appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("{0}")]
    Db(#[from] sqlx::Error),
    /// The idempotency key names a batch of another length.
    #[error("this Idempotency-Key was used for a batch of {0} messages")]
    KeyReused(usize),
}

/// Writes a batch in one transaction and announces it; returns each entry's
/// id, in order. With an idempotency `key` that a batch of this tenant was
/// appended under before (within the log's retention), nothing is written:
/// the ids of that batch are returned, so a retry after a lost answer logs
/// nothing twice.
impl SharedLog {
    pub async fn append(
        &self,
        tenant: &str,
        entries: &[Publication<'_>],
        key: Option<&str>,
    ) -> Result<Vec<i64>, AppendError> {
        // "" for none: the reader gives a record without a channel.
        let channels: Vec<&str> = entries.iter().map(|e| e.channel.unwrap_or("")).collect();
        let keys: Vec<Option<&str>> = entries.iter().map(|e| e.key).collect();
        let payloads: Vec<&[u8]> = entries.iter().map(|e| e.payload).collect();
        let mut tx = self.pool.begin().await?;
        if let Some(key) = key {
            // The first to claim the key writes; a concurrent claim waits for
            // it to commit (the primary key), then reads what it wrote.
            let claimed: Option<i32> = sqlx::query_scalar(
                "INSERT INTO herald_publish_keys (tenant_id, key) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING RETURNING 1",
            )
            .bind(tenant)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            if claimed.is_none() {
                let ids: Option<Vec<i64>> = sqlx::query_scalar(
                    "SELECT ids FROM herald_publish_keys WHERE tenant_id = $1 AND key = $2",
                )
                .bind(tenant)
                .bind(key)
                .fetch_one(&mut *tx)
                .await?;
                let ids = ids.unwrap_or_default();
                if ids.len() != entries.len() {
                    return Err(AppendError::KeyReused(ids.len()));
                }
                return Ok(ids);
            }
        }
        // One tenant's appends one at a time, until commit: its ids are then in
        // commit (and xid) order, which is the order every reader reads in, so
        // concurrent publishers never make a channel rebase (ARCHITECTURE.md,
        // "Positions"). Other tenants' appends do not wait (a hash collision
        // only makes two tenants take turns). The lock is the join's one row:
        // no row reaches the insert, so no id is drawn, before it is held; in
        // the same statement, it costs a single publisher no round trip.
        let mut ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO herald_publish_log (tenant_id, channel, key, payload_bytes) \
         SELECT $1, c, k, p FROM (SELECT pg_advisory_xact_lock($5, hashtext($1))) AS turn, \
         UNNEST($2::text[], $3::text[], $4::bytea[]) WITH ORDINALITY AS u(c, k, p, n) \
         ORDER BY n RETURNING id",
        )
        .bind(tenant)
        .bind(&channels)
        .bind(&keys)
        .bind(&payloads)
        .bind(LOG_LOCK)
        .fetch_all(&mut *tx)
        .await?;
        ids.sort_unstable();
        if let Some(key) = key {
            sqlx::query(
                "UPDATE herald_publish_keys SET ids = $3 WHERE tenant_id = $1 AND key = $2",
            )
            .bind(tenant)
            .bind(key)
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(PUBLISH_CHANNEL)
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// How often `prune` is due: every half retention, at least once a minute.
    pub fn prune_every(&self) -> Duration {
        (self.retention / 2).clamp(Duration::from_millis(500), Duration::from_secs(60))
    }

    /// Deletes rows past the retention (every node does, on `prune_every`; the
    /// statement is idempotent), and records per tenant the last row it
    /// deleted: a reader whose cursor is below that mark may have missed rows,
    /// and says so (`source::outbox`) instead of reading on past the hole.
    pub async fn prune(&self) {
        let keep = self.retention.as_secs_f64();
        {
            let r = sqlx::query(
            "WITH gone AS (\
                DELETE FROM herald_publish_log WHERE created_at < now() - make_interval(secs => $1) \
                RETURNING tenant_id, xid, id), \
             last AS (\
                SELECT DISTINCT ON (tenant_id) tenant_id, xid, id, max(id) OVER (PARTITION BY tenant_id) AS max_id \
                FROM gone ORDER BY tenant_id, xid DESC, id DESC) \
             INSERT INTO herald_publish_log_pruned AS p (tenant_id, xid, id, max_id) \
             SELECT tenant_id, xid, id, max_id FROM last \
             ON CONFLICT (tenant_id) DO UPDATE SET \
                xid = CASE WHEN (EXCLUDED.xid, EXCLUDED.id) > (p.xid, p.id) THEN EXCLUDED.xid ELSE p.xid END, \
                id = CASE WHEN (EXCLUDED.xid, EXCLUDED.id) > (p.xid, p.id) THEN EXCLUDED.id ELSE p.id END, \
                max_id = greatest(p.max_id, EXCLUDED.max_id)",
        )
        .bind(keep)
        .execute(&self.pool)
        .await;
            match r {
                Ok(done) if done.rows_affected() > 0 => {
                    tracing::debug!(tenants = done.rows_affected(), "publish log pruned")
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "publish log not pruned"),
            }
            // Idempotency keys live as long as the rows they name.
            let r = sqlx::query(
            "DELETE FROM herald_publish_keys WHERE created_at < now() - make_interval(secs => $1)",
        )
        .bind(keep)
        .execute(&self.pool)
        .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "publish keys not pruned");
            }
        }
    }

    /// The last row retention deleted of `tenant`'s log, in `(xid, id)` order,
    /// and the highest id it deleted; `None` when it deleted none.
    pub async fn pruned(&self, tenant: &str) -> Result<Option<(String, i64, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT xid::text, id, max_id FROM herald_publish_log_pruned WHERE tenant_id = $1",
        )
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await
    }
}
