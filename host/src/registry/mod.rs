//! The registry: tenants, plugin versions, settings, source cursors, the
//! cluster view and publish receipts, in SQLite (embedded default) or
//! Postgres; cluster mode's shared publish log (`log.rs`, Postgres only).
//!
//! Owns: the schema (migrations under `migrations/sqlite` and
//! `migrations/postgres`, the same tables on both) and every SQL statement.
//! Invariants: migrations run before any other query; errors callers branch on
//! (`Conflict`, `NotFound`) are variants, everything else is `Database`.
//! Must never be called while a fan-out lock is held.

use crate::clock::now_ms;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::path::Path;

pub mod cursors;
pub mod log;
mod migrations;
mod receipts;
pub use receipts::Claim;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0} already exists")]
    Conflict(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("registry data is corrupt: {0}")]
    Corrupt(String),
    #[error("registry database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("registry migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Which database backs the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A tenant row.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRecord {
    pub id: String,
    pub access: String,
    pub config: serde_json::Value,
    pub limits: serde_json::Value,
    pub publish_key_sha256: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The active plugin version, if any.
    pub active_plugin: Option<i64>,
    /// The tenant's conflation window (`{"window_ms":…,"channels":[…]}`).
    pub conflation: serde_json::Value,
    /// The tenant's ingest source (`{"kind":"http"}` unless set; written only
    /// through [`Registry::set_source`]).
    pub source: serde_json::Value,
    /// Browser origins its clients may come from (an array), or null: any.
    pub allowed_origins: serde_json::Value,
}

/// A stored plugin version (without its bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct PluginRecord {
    pub tenant_id: String,
    pub version: i64,
    pub sha256: String,
    pub size_bytes: i64,
    pub name: String,
    pub plugin_version: String,
    pub hooks: serde_json::Value,
    pub created_at_ms: i64,
}

/// A node as it last reported itself (the cluster view).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub id: String,
    pub version: String,
    pub address: String,
    pub started_at_ms: i64,
    pub heartbeat_at_ms: i64,
    pub connections: i64,
    /// `{"tenant": active plugin version}` as the node runs them.
    pub plugins: serde_json::Value,
}

const TENANT_COLUMNS: &str =
    "id, access, config, limits, publish_key_sha256, created_at, updated_at, active_plugin, conflation, source, allowed_origins";

#[derive(Clone)]
pub struct Registry {
    pool: AnyPool,
    backend: Backend,
}

/// An update or delete of one tenant's row: `NotFound` when no row matched.
fn found(rows_affected: u64, tenant: &str) -> Result<(), RegistryError> {
    if rows_affected == 0 {
        return Err(RegistryError::NotFound(format!("tenant {tenant:?}")));
    }
    Ok(())
}

impl Registry {
    /// Opens (creating when needed) and migrates the registry. `url` overrides
    /// the SQLite file in `data_dir`.
    pub async fn open(url: Option<&str>, data_dir: &Path) -> Result<Registry, RegistryError> {
        sqlx::any::install_default_drivers();
        let url = match url {
            Some(u) => u.to_string(),
            None => {
                // The registry holds tenants' keys' digests and source
                // credentials: the data dir is its user's alone.
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(data_dir)
                    .map_err(|e| {
                        RegistryError::Database(sqlx::Error::Configuration(
                            format!("cannot create data dir {}: {e}", data_dir.display()).into(),
                        ))
                    })?;
                // Made readable by its user alone before SQLite opens it
                // (its journal and WAL files take the same mode).
                let file = data_dir.join("registry.db");
                {
                    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
                    let made = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .mode(0o600)
                        .open(&file)
                        .and_then(|_| {
                            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                        });
                    made.map_err(|e| {
                        RegistryError::Database(sqlx::Error::Configuration(
                            format!("cannot create {}: {e}", file.display()).into(),
                        ))
                    })?;
                }
                format!("sqlite://{}?mode=rwc", file.display())
            }
        };
        let backend = if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            return Err(RegistryError::Database(sqlx::Error::Configuration(
                "database url must start with postgres:// or sqlite://".into(),
            )));
        };
        let max = if backend == Backend::Sqlite { 1 } else { 8 };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .connect(&url)
            .await?;
        match backend {
            Backend::Sqlite => migrations::SQLITE.migrator().await?.run(&pool).await?,
            Backend::Postgres => migrations::POSTGRES.migrator().await?.run(&pool).await?,
        }
        Ok(Registry { pool, backend })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    fn tenant_from_row(row: &AnyRow) -> Result<TenantRecord, RegistryError> {
        let json = |col: &str| -> Result<serde_json::Value, RegistryError> {
            let s: String = row.try_get(col)?;
            serde_json::from_str(&s)
                .map_err(|e| RegistryError::Corrupt(format!("tenants.{col}: {e}")))
        };
        Ok(TenantRecord {
            id: row.try_get("id")?,
            access: row.try_get("access")?,
            config: json("config")?,
            limits: json("limits")?,
            publish_key_sha256: row.try_get("publish_key_sha256")?,
            created_at_ms: row.try_get("created_at")?,
            updated_at_ms: row.try_get("updated_at")?,
            active_plugin: row.try_get("active_plugin")?,
            conflation: json("conflation")?,
            source: json("source")?,
            allowed_origins: json("allowed_origins")?,
        })
    }

    pub async fn list_tenants(&self) -> Result<Vec<TenantRecord>, RegistryError> {
        let rows = sqlx::query(&format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Self::tenant_from_row).collect()
    }

    pub async fn get_tenant(&self, id: &str) -> Result<TenantRecord, RegistryError> {
        let row = sqlx::query(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| RegistryError::NotFound(format!("tenant {id:?}")))?;
        Self::tenant_from_row(&row)
    }

    pub async fn create_tenant(&self, t: &TenantRecord) -> Result<(), RegistryError> {
        let r = sqlx::query(
            "INSERT INTO tenants (id, access, config, limits, publish_key_sha256, created_at, updated_at, conflation, allowed_origins, source) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&t.id)
        .bind(&t.access)
        .bind(t.config.to_string())
        .bind(t.limits.to_string())
        .bind(&t.publish_key_sha256)
        .bind(t.created_at_ms)
        .bind(t.updated_at_ms)
        .bind(t.conflation.to_string())
        .bind(t.allowed_origins.to_string())
        .bind(t.source.to_string())
        .execute(&self.pool)
        .await;
        match r {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(RegistryError::Conflict(format!("tenant {:?}", t.id)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `t` only while the row's `updated_at` is still `seen` (what
    /// the writer read): false when another write landed in between (read
    /// again and reapply), `NotFound` when the tenant is gone. The caller
    /// sets `t.updated_at_ms` past `seen`, so every such write moves it.
    pub async fn update_tenant_if(
        &self,
        t: &TenantRecord,
        seen: i64,
    ) -> Result<bool, RegistryError> {
        debug_assert!(t.updated_at_ms > seen);
        let r = sqlx::query(
            "UPDATE tenants SET access = $1, config = $2, limits = $3, publish_key_sha256 = $4, updated_at = $5, \
             conflation = $6, allowed_origins = $7 WHERE id = $8 AND updated_at = $9",
        )
        .bind(&t.access)
        .bind(t.config.to_string())
        .bind(t.limits.to_string())
        .bind(&t.publish_key_sha256)
        .bind(t.updated_at_ms)
        .bind(t.conflation.to_string())
        .bind(t.allowed_origins.to_string())
        .bind(&t.id)
        .bind(seen)
        .execute(&self.pool)
        .await?;
        if r.rows_affected() == 1 {
            return Ok(true);
        }
        self.get_tenant(&t.id).await.map(|_| false)
    }

    pub async fn delete_tenant(&self, id: &str) -> Result<(), RegistryError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM plugins WHERE tenant_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        // Its readers' positions go with it: a tenant made again under the
        // same id starts afresh, never at another source's offsets.
        sqlx::query("DELETE FROM ingest_cursors WHERE tenant_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM publish_receipts WHERE tenant_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if matches!(self.backend, Backend::Postgres) {
            // The shared log of cluster mode (Postgres only).
            for table in [
                "herald_publish_log",
                "herald_publish_log_pruned",
                "herald_publish_keys",
            ] {
                sqlx::query(&format!("DELETE FROM {table} WHERE tenant_id = $1"))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        let r = sqlx::query("DELETE FROM tenants WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        found(r.rows_affected(), id)?;
        tx.commit().await?;
        Ok(())
    }

    /// Stores a validated plugin version as the tenant's next version number.
    pub async fn add_plugin(
        &self,
        p: &PluginRecord,
        component: &[u8],
    ) -> Result<i64, RegistryError> {
        let mut tx = self.pool.begin().await?;
        let exists = sqlx::query("SELECT id FROM tenants WHERE id = $1")
            .bind(&p.tenant_id)
            .fetch_optional(&mut *tx)
            .await?;
        if exists.is_none() {
            return Err(RegistryError::NotFound(format!("tenant {:?}", p.tenant_id)));
        }
        let row =
            sqlx::query("SELECT COALESCE(MAX(version), 0) AS v FROM plugins WHERE tenant_id = $1")
                .bind(&p.tenant_id)
                .fetch_one(&mut *tx)
                .await?;
        let version: i64 = row.try_get::<i64, _>("v")? + 1;
        sqlx::query(
            "INSERT INTO plugins (tenant_id, version, sha256, size_bytes, component, name, plugin_version, hooks, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&p.tenant_id)
        .bind(version)
        .bind(&p.sha256)
        .bind(p.size_bytes)
        .bind(component)
        .bind(&p.name)
        .bind(&p.plugin_version)
        .bind(p.hooks.to_string())
        .bind(p.created_at_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    pub async fn list_plugins(&self, tenant: &str) -> Result<Vec<PluginRecord>, RegistryError> {
        let rows = sqlx::query(
            "SELECT tenant_id, version, sha256, size_bytes, name, plugin_version, hooks, created_at \
             FROM plugins WHERE tenant_id = $1 ORDER BY version",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let hooks: String = r.try_get("hooks")?;
                Ok(PluginRecord {
                    tenant_id: r.try_get("tenant_id")?,
                    version: r.try_get("version")?,
                    sha256: r.try_get("sha256")?,
                    size_bytes: r.try_get("size_bytes")?,
                    name: r.try_get("name")?,
                    plugin_version: r.try_get("plugin_version")?,
                    hooks: serde_json::from_str(&hooks)
                        .map_err(|e| RegistryError::Corrupt(format!("plugins.hooks: {e}")))?,
                    created_at_ms: r.try_get("created_at")?,
                })
            })
            .collect()
    }

    /// The sha256 (hex) of one version's component.
    pub async fn plugin_sha256(&self, tenant: &str, version: i64) -> Result<String, RegistryError> {
        let row = sqlx::query("SELECT sha256 FROM plugins WHERE tenant_id = $1 AND version = $2")
            .bind(tenant)
            .bind(version)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| {
                RegistryError::NotFound(format!("plugin version {version} of tenant {tenant:?}"))
            })?;
        Ok(row.try_get("sha256")?)
    }

    /// The component bytes of one version.
    pub async fn plugin_component(
        &self,
        tenant: &str,
        version: i64,
    ) -> Result<Vec<u8>, RegistryError> {
        let row =
            sqlx::query("SELECT component FROM plugins WHERE tenant_id = $1 AND version = $2")
                .bind(tenant)
                .bind(version)
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| {
                    RegistryError::NotFound(format!(
                        "plugin version {version} of tenant {tenant:?}"
                    ))
                })?;
        Ok(row.try_get("component")?)
    }

    pub async fn set_active_plugin(
        &self,
        tenant: &str,
        version: Option<i64>,
    ) -> Result<(), RegistryError> {
        // The version it replaces becomes the previous one (what a rollback
        // activates); activating the active version again changes nothing.
        let r = sqlx::query(
            "UPDATE tenants SET previous_plugin = CASE WHEN COALESCE(active_plugin, -1) <> COALESCE($1, -1) \
             THEN active_plugin ELSE previous_plugin END, active_plugin = $1, updated_at = $2 WHERE id = $3",
        )
        .bind(version)
        .bind(now_ms())
        .bind(tenant)
        .execute(&self.pool)
        .await?;
        found(r.rows_affected(), tenant)
    }

    /// The version active before the current one, if any.
    pub async fn previous_plugin(&self, tenant: &str) -> Result<Option<i64>, RegistryError> {
        let row: Option<(Option<i64>,)> =
            sqlx::query_as("SELECT previous_plugin FROM tenants WHERE id = $1")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
        match row {
            Some((v,)) => Ok(v),
            None => Err(RegistryError::NotFound(format!("tenant {tenant:?}"))),
        }
    }

    pub async fn set_source(
        &self,
        tenant: &str,
        source: &serde_json::Value,
    ) -> Result<(), RegistryError> {
        let r = sqlx::query("UPDATE tenants SET source = $1, updated_at = $2 WHERE id = $3")
            .bind(source.to_string())
            .bind(now_ms())
            .bind(tenant)
            .execute(&self.pool)
            .await?;
        found(r.rows_affected(), tenant)
    }

    /// This node's stored position in a tenant's source, if any.
    pub async fn cursor(
        &self,
        tenant: &str,
        node: &str,
        source_key: &str,
    ) -> Result<Option<String>, RegistryError> {
        let row = sqlx::query(
            "SELECT position FROM ingest_cursors WHERE tenant_id = $1 AND node_id = $2 AND source_key = $3",
        )
        .bind(tenant)
        .bind(node)
        .bind(source_key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get("position")).transpose()?)
    }

    /// Deletes this node's positions in a tenant's sources.
    pub async fn delete_cursors(&self, tenant: &str, node: &str) -> Result<(), RegistryError> {
        sqlx::query("DELETE FROM ingest_cursors WHERE tenant_id = $1 AND node_id = $2")
            .bind(tenant)
            .bind(node)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn put_cursor(
        &self,
        tenant: &str,
        node: &str,
        source_key: &str,
        position: &str,
    ) -> Result<(), RegistryError> {
        sqlx::query(
            "INSERT INTO ingest_cursors (tenant_id, node_id, source_key, position, updated_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant_id, node_id, source_key) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at",
        )
        .bind(tenant)
        .bind(node)
        .bind(source_key)
        .bind(position)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records this node's heartbeat (and what it runs).
    pub async fn put_node(&self, n: &NodeRecord) -> Result<(), RegistryError> {
        sqlx::query(
            "INSERT INTO nodes (id, version, address, started_at, heartbeat_at, connections, plugins) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO UPDATE SET version = excluded.version, \
             address = excluded.address, started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, \
             connections = excluded.connections, plugins = excluded.plugins",
        )
        .bind(&n.id)
        .bind(&n.version)
        .bind(&n.address)
        .bind(n.started_at_ms)
        .bind(n.heartbeat_at_ms)
        .bind(n.connections)
        .bind(n.plugins.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every node that has reported, most recent heartbeat first.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, RegistryError> {
        let rows = sqlx::query(
            "SELECT id, version, address, started_at, heartbeat_at, connections, plugins FROM nodes \
             ORDER BY heartbeat_at DESC, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let plugins: String = r.try_get("plugins")?;
                Ok(NodeRecord {
                    id: r.try_get("id")?,
                    version: r.try_get("version")?,
                    address: r.try_get("address")?,
                    started_at_ms: r.try_get("started_at")?,
                    heartbeat_at_ms: r.try_get("heartbeat_at")?,
                    connections: r.try_get("connections")?,
                    plugins: serde_json::from_str(&plugins)
                        .map_err(|e| RegistryError::Corrupt(format!("nodes.plugins: {e}")))?,
                })
            })
            .collect()
    }

    pub async fn get_setting(&self, name: &str) -> Result<Option<String>, RegistryError> {
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get("value")).transpose()?)
    }

    pub async fn put_setting(&self, name: &str, value: &str) -> Result<(), RegistryError> {
        sqlx::query(
            "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        )
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
