//! Receipts of keyed publishes (`Idempotency-Key` on a Kafka tenant): what
//! an earlier attempt under a key got written, and whether one is in flight.
//!
//! Invariants: one attempt per key at a time (the claim); a receipt records
//! only what the brokers acknowledged; receipts older than the keep are
//! deleted when the tenant's next keyed publish claims one.

use super::{Registry, RegistryError};
use crate::clock::now_ms;
use sqlx::Row;

/// What a keyed publish found when it claimed its key.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key is this attempt's: new (`None`), or with what earlier
    /// attempts recorded (the receipt as stored).
    Ours(Option<String>),
    /// Another attempt under the key has not settled yet.
    InFlight,
}

impl Registry {
    /// Claims `key` of `tenant` for `hold_ms` (a new receipt starts as
    /// `empty`); receipts older than `keep_ms` are forgotten first.
    pub async fn claim_receipt(
        &self,
        tenant: &str,
        key: &str,
        empty: &str,
        hold_ms: i64,
        keep_ms: i64,
    ) -> Result<Claim, RegistryError> {
        let now = now_ms();
        sqlx::query("DELETE FROM publish_receipts WHERE tenant_id = $1 AND created_at < $2")
            .bind(tenant)
            .bind(now - keep_ms)
            .execute(&self.pool)
            .await?;
        let made = sqlx::query(
            "INSERT INTO publish_receipts (tenant_id, key, written, claimed_until, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, key) DO NOTHING",
        )
        .bind(tenant)
        .bind(key)
        .bind(empty)
        .bind(now + hold_ms)
        .bind(now)
        .execute(&self.pool)
        .await?;
        if made.rows_affected() == 1 {
            return Ok(Claim::Ours(None));
        }
        let row = sqlx::query(
            "UPDATE publish_receipts SET claimed_until = $3 \
             WHERE tenant_id = $1 AND key = $2 AND claimed_until <= $4 RETURNING written",
        )
        .bind(tenant)
        .bind(key)
        .bind(now + hold_ms)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            Some(r) => Claim::Ours(Some(r.try_get("written")?)),
            None => Claim::InFlight,
        })
    }

    /// Records what the attempt holding `key` got written, and releases it.
    pub async fn settle_receipt(
        &self,
        tenant: &str,
        key: &str,
        written: &str,
    ) -> Result<(), RegistryError> {
        sqlx::query(
            "UPDATE publish_receipts SET written = $3, claimed_until = 0 \
             WHERE tenant_id = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(key)
        .bind(written)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
