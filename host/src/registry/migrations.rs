//! The registry's schema migrations, compiled into the binary.
//!
//! Each file of `migrations/{postgres,sqlite}` is listed here with
//! `include_str!` and handed to sqlx's migrator as the directory source would
//! (version and description from the file name, checksum of the text), so a
//! database migrated by an earlier build sees the same checksums. Listing
//! them by hand rather than through `sqlx::migrate!` keeps sqlx's macro
//! crates — a second build of sqlx's drivers and of tokio — out of every
//! build; the test below fails when a file is added without its line here.

use futures_util::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;

/// A set of migrations: (file name, SQL text).
#[derive(Debug, Clone, Copy)]
pub struct Embedded(pub &'static [(&'static str, &'static str)]);

macro_rules! embed {
    ($dir:literal: $($file:literal),* $(,)?) => {
        Embedded(&[$(($file, include_str!(concat!("../../../migrations/", $dir, "/", $file)))),*])
    };
}

pub const POSTGRES: Embedded = embed!("postgres":
    "0001_registry.sql",
    "0002_plugins.sql",
    "0003_sources.sql",
    "0004_cluster.sql",
    "0005_origins.sql",
    "0006_previous_plugin.sql",
    "0007_log_pruned.sql",
    "0008_publish_keys.sql",
    "0009_publish_receipts.sql",
);

pub const SQLITE: Embedded = embed!("sqlite":
    "0001_registry.sql",
    "0002_plugins.sql",
    "0003_sources.sql",
    "0004_cluster.sql",
    "0005_origins.sql",
    "0006_previous_plugin.sql",
    "0007_publish_receipts.sql",
);

impl Embedded {
    /// The migrations as sqlx's directory source reads them: `<version>_<description>.sql`,
    /// underscores of the description as spaces, `-- no-transaction` first
    /// to opt out of the transaction.
    pub fn migrations(self) -> Result<Vec<Migration>, String> {
        let mut out = Vec::with_capacity(self.0.len());
        for (name, sql) in self.0 {
            let (version, rest) = name
                .split_once('_')
                .ok_or_else(|| format!("migration {name:?}: not <version>_<description>.sql"))?;
            let version: i64 = version
                .parse()
                .map_err(|_| format!("migration {name:?}: the version is not an integer"))?;
            let kind = MigrationType::from_filename(rest);
            let description = rest.trim_end_matches(kind.suffix()).replace('_', " ");
            out.push(Migration::new(
                version,
                Cow::Owned(description),
                kind,
                Cow::Borrowed(*sql),
                sql.starts_with("-- no-transaction"),
            ));
        }
        out.sort_by_key(|m| m.version);
        Ok(out)
    }

    pub async fn migrator(self) -> Result<Migrator, sqlx::migrate::MigrateError> {
        Migrator::new(self).await
    }
}

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> BoxFuture<'static, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async move { self.migrations().map_err(BoxDynError::from) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every file of each migrations folder is embedded, and reads as
    /// sqlx's own directory source reads it (the checksums an earlier
    /// build, which used `sqlx::migrate!`, recorded in existing databases).
    #[tokio::test]
    async fn the_embedded_migrations_are_the_folders() {
        for (dir, embedded) in [("postgres", POSTGRES), ("sqlite", SQLITE)] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../migrations")
                .join(dir);
            let from_dir = Migrator::new(path.as_path()).await.unwrap();
            let ours = embedded.migrator().await.unwrap();
            let key = |m: &Migration| {
                (
                    m.version,
                    m.description.to_string(),
                    m.checksum.to_vec(),
                    m.no_tx,
                    m.migration_type.suffix(),
                )
            };
            let a: Vec<_> = from_dir.iter().map(key).collect();
            let b: Vec<_> = ours.iter().map(key).collect();
            assert_eq!(a, b, "migrations/{dir} and the embedded list differ");
            assert!(!b.is_empty());
        }
    }
}
