//! The shared publish log (cluster mode): `POST /v1/t/{t}/publish` on an
//! `http` tenant writes here and answers once the write committed; every
//! node, the receiving one included, delivers the rows through its log
//! reader (`source::outbox`, reading this table for the tenant), so every
//! node gives a message the same position (`seq` = id × 1000 + index).
//!
//! Invariants: a batch is one transaction, its ids in batch order, announced
//! (NOTIFY) at commit; one tenant's appends hold an advisory lock until they
//! commit, so its ids follow commit order; rows older than
//! `--cluster-log-retention-secs` are deleted. Never: delivers anything itself.

use super::{Cluster, PUBLISH_CHANNEL};
use crate::app::App;
use crate::source::Outgoing;
use std::sync::Arc;

/// The table, created by the registry's migrations (Postgres only).
pub const TABLE: &str = "herald_publish_log";

/// The first key of the advisory lock a tenant's appends take ("HLOG").
const LOG_LOCK: i32 = 0x484c_4f47;

/// Writes a batch in one transaction and announces it; returns each entry's
/// id, in order.
pub async fn append(
    cluster: &Cluster,
    tenant: &str,
    entries: &[Outgoing<'_>],
) -> Result<Vec<i64>, sqlx::Error> {
    // "" for none: the reader gives a record without a channel.
    let channels: Vec<&str> = entries.iter().map(|e| e.channel.unwrap_or("")).collect();
    let keys: Vec<Option<&str>> = entries.iter().map(|e| e.key).collect();
    let payloads: Vec<&[u8]> = entries.iter().map(|e| e.payload).collect();
    let mut tx = cluster.pool.begin().await?;
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
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(PUBLISH_CHANNEL)
        .bind(tenant)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    ids.sort_unstable();
    Ok(ids)
}

/// Deletes rows past the retention, once a minute (every node does; the
/// statement is idempotent).
pub(super) async fn prune(app: Arc<App>, cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(super::PRUNE_EVERY);
    let keep = cluster.config.log_retention.as_secs_f64();
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let r = sqlx::query(
            "DELETE FROM herald_publish_log WHERE created_at < now() - make_interval(secs => $1)",
        )
        .bind(keep)
        .execute(&cluster.pool)
        .await;
        match r {
            Ok(done) if done.rows_affected() > 0 => {
                tracing::debug!(rows = done.rows_affected(), "publish log pruned")
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "publish log not pruned"),
        }
    }
}
