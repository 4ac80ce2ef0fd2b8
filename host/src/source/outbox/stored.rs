//! Where an outbox (or publish log) reader is: its stored cursor (loading,
//! taking over an older Herald's, storing it never past a held row), the
//! registry key it is kept under, and the log's pruned mark it must not
//! read past in silence (ARCHITECTURE.md, "Positions").
//!
//! Invariants: a stored cursor only moves past rows that were published or
//! are held by a conflation window below it; its `read` is never below the
//! highest id delivered through it. Never: reads the outbox table's rows.

use super::cursor::{Cursor, Legacy, Stored};
use super::sql::{parse_xid, OutboxRow, Sql};
use super::{query_err, Origin, OutboxError, Reader, LOG_CATCH_UP};
use sqlx::{PgPool, Row};

impl Reader {
    /// The log reader: rows that retention deleted past the cursor were never
    /// read here (the node was down or behind for longer than the log keeps
    /// rows). Checked after every batch read: a deletion that hid rows from
    /// the read had committed its mark before it. The rows up to the mark are
    /// a gap for every session (`Hub::skip_to`), the cursor moves past them,
    /// and what `rows` holds up to the mark is dropped with them.
    pub(super) async fn past_pruned(
        &self,
        cursor: &mut Cursor,
        key: &str,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<(), OutboxError> {
        let Origin::Log(log) = &self.origin else {
            return Ok(());
        };
        let mark = self
            .or_stop(async { log.pruned(&self.tenant.id).await.map_err(query_err) })
            .await?;
        let Some((xid, id, max_id)) = mark else {
            return Ok(());
        };
        let xid = parse_xid(&xid)?;
        if (xid, id) <= (cursor.xid, cursor.id) {
            return Ok(());
        }
        tracing::warn!(tenant = %self.tenant.id, from = cursor.id, to = id, "publish log rows were deleted by retention before this node read them; subscribers are told of the gap");
        self.tenant.hub.skip_to(0, max_id.max(0) as u64);
        rows.retain(|r| (r.xid, r.id) > (xid, id));
        *cursor = Cursor {
            xid,
            id,
            legacy: None,
            read: Some(cursor.read.unwrap_or(0).max(max_id)),
            upto: cursor.upto.filter(|&u| u > (xid, id)),
        };
        self.store_cursor(key, cursor).await?;
        {
            let mut h = self.health.lock();
            h.errors += 1;
            h.last_error = Some(format!(
                "publish log rows up to id {id} were deleted by retention before this node read them"
            ));
        }
        Ok(())
    }

    /// The stored cursor for this database and table; a cursor an older
    /// Herald kept under the table name alone is taken over once (and marked
    /// moved, so another database with that table name does not take it
    /// too); with none, the end of what is final now (a new source starts at
    /// the latest row, like a Kafka consumer at "latest").
    pub(super) async fn load_cursor(
        &self,
        pool: &PgPool,
        sql: &Sql,
        key: &str,
    ) -> Result<(Cursor, bool), OutboxError> {
        let registry_err = |e| OutboxError::Query(format!("reading the cursor: {e}"));
        let tenant = &self.tenant.id;
        let old_key = format!("outbox:{}", self.table);
        let mut taken_over = false;
        let mut stored = self
            .ctx
            .cursors
            .get(tenant, key)
            .await
            .map_err(registry_err)?
            .as_deref()
            .and_then(Cursor::parse);
        if stored.is_none() && self.generation == 0 {
            stored = self
                .ctx
                .cursors
                .get(tenant, &old_key)
                .await
                .map_err(registry_err)?
                .as_deref()
                .and_then(Cursor::parse);
            taken_over = stored.is_some();
        }
        // Without a stored cursor the reader begins past rows it never read.
        let fresh = stored.is_none();
        let cursor = match stored {
            Some(Stored::Current(c)) => c,
            Some(Stored::BareId(after_id)) => {
                // Every row an older Herald delivered was committed before
                // now, so its transaction is below this snapshot's xmax.
                let until: String =
                    sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
                        .fetch_one(pool)
                        .await
                        .map_err(query_err)?;
                Cursor {
                    legacy: Some(Legacy {
                        after_id,
                        until_xid: parse_xid(&until)?,
                    }),
                    // An older Herald delivered in id order: up to this id.
                    read: Some(after_id),
                    ..Cursor::START
                }
            }
            None => match self.log_start(pool).await? {
                Some(c) => c,
                None => match sqlx::query(&sql.end)
                    .fetch_optional(pool)
                    .await
                    .map_err(query_err)?
                {
                    Some(r) => {
                        let id = r.try_get("id").map_err(query_err)?;
                        Cursor {
                            xid: parse_xid(
                                &r.try_get::<String, _>("xid_text").map_err(query_err)?,
                            )?,
                            id,
                            legacy: None,
                            read: Some(id),
                            upto: None,
                        }
                    }
                    None => Cursor::START,
                },
            },
        };
        self.store_cursor(key, &cursor).await?;
        if taken_over {
            self.ctx
                .cursors
                .put(tenant, &old_key, &format!("moved to {key}"))
                .await
                .map_err(|e| OutboxError::Query(format!("storing the cursor: {e}")))?;
        }
        Ok((cursor, fresh))
    }

    /// Where a log reader without a cursor starts: after the tenant's last
    /// row logged before it was created or more than [`LOG_CATCH_UP`] ago,
    /// so a tenant created through another node loses none of its first rows
    /// (rows logged before this node started reading are read, not skipped).
    /// One query: a row committed meanwhile is newer than the window's start,
    /// so it comes after the cursor. `None`: an outbox (which starts at its
    /// latest row).
    pub(super) async fn log_start(&self, pool: &PgPool) -> Result<Option<Cursor>, OutboxError> {
        if !matches!(self.origin, Origin::Log(_)) {
            return Ok(None);
        }
        let created = self.created_at_ms;
        let before: Option<(String, i64)> = sqlx::query_as(
            "SELECT xid::text, id FROM herald_publish_log WHERE tenant_id = $1 \
             AND created_at < greatest(to_timestamp($2::float8 / 1000), now() - make_interval(secs => $3)) \
             ORDER BY xid DESC, id DESC LIMIT 1",
        )
        .bind(&*self.tenant.id)
        .bind(created as f64)
        .bind(LOG_CATCH_UP.as_secs_f64())
        .fetch_optional(pool)
        .await
        .map_err(query_err)?;
        match before {
            Some((xid, id)) => Ok(Some(Cursor {
                xid: parse_xid(&xid)?,
                id,
                legacy: None,
                read: Some(id),
                upto: None,
            })),
            None => Ok(Some(Cursor::START)),
        }
    }

    pub(super) async fn store_cursor(&self, key: &str, cursor: &Cursor) -> Result<(), OutboxError> {
        self.ctx
            .cursors
            .put(&self.tenant.id, key, &cursor.encode())
            .await
            .map_err(|e| OutboxError::Query(format!("storing the cursor: {e}")))
    }

    /// The cursor to store: `last`, or just before the lowest row a
    /// conflation window still holds, so a crash re-reads it rather than
    /// losing it (the rows between are duplicates then). A take-over cursor
    /// (`legacy`) is stored as it is.
    pub(super) fn held_back(&self, last: Cursor) -> Cursor {
        let lowest = self.tenant.conflator.lock().lowest_held();
        match lowest.iter().find(|(stream, _)| *stream == 0) {
            Some(&(_, (xid, id)))
                if last.legacy.is_none() && (xid, id as i64) <= (last.xid, last.id) =>
            {
                Cursor {
                    xid,
                    id: id as i64 - 1,
                    legacy: None,
                    read: last.read,
                    // Rows up to the last one delivered come again after a
                    // crash as re-reads, not as late rows.
                    upto: Some(last.upto.unwrap_or((last.xid, last.id))),
                }
            }
            _ => last,
        }
    }
}

/// The registry key of this node's cursor: the database (the server's system
/// identifier, which replicas share, and the database name) and the table.
/// Credentials and host names are not part of it: the same database reached
/// another way keeps its cursor.
pub(super) async fn source_key(pool: &PgPool, table: &str) -> Result<String, OutboxError> {
    let r = sqlx::query(
        "SELECT (SELECT system_identifier::text FROM pg_control_system()) AS system, current_database() AS db",
    )
    .fetch_one(pool)
    .await;
    let r = match r {
        Ok(r) => r,
        // pg_control_system() may be withheld from the user: the server's
        // address then stands for the server.
        Err(_) => sqlx::query(
            "SELECT COALESCE(host(inet_server_addr()), 'local') || ':' || current_setting('port') AS system, \
             current_database() AS db",
        )
        .fetch_one(pool)
        .await
        .map_err(query_err)?,
    };
    let system: String = r.try_get("system").map_err(query_err)?;
    let db: String = r.try_get("db").map_err(query_err)?;
    Ok(format!("outbox:{system}/{db}/{table}"))
}
