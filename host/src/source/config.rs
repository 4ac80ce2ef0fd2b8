//! What a tenant reads from (`PUT /admin/v1/tenants/{t}/source`): the
//! configuration, what names its positions alike on every node (its epoch
//! seed, its generation), and the configuration as the API shows it.

use super::kafka;
use super::redact_url;
use serde::{Deserialize, Serialize};

/// What a tenant reads from, as set by `PUT /admin/v1/tenants/{t}/source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceConfig {
    /// Only `POST /v1/t/{t}/publish`.
    Http {
        /// The publisher is expected to publish at least this often: with
        /// nothing published for this long the source is `stalled` (clients
        /// get a `status` frame), and `live` again on the next publish.
        /// Absent: an HTTP source is always live.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stall_after_ms: Option<u64>,
    },
    /// Tail an outbox table (shape in migrations/outbox/herald_outbox.sql).
    PostgresOutbox {
        database_url: String,
        table: String,
        /// Rows read per query (default 1000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_size: Option<u32>,
        /// Safety-net polling interval when no NOTIFY arrives (default 1000 ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        poll_ms: Option<u64>,
        /// Raise it when the source's positions start over (the table truncated with RESTART IDENTITY, or made again): another
        /// position space. Every channel gets a new epoch (subscribers are
        /// told by an `ack`; a resume from the old epoch is a gap) and
        /// positions stored under another generation are not used. Default 0.
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: u32,
    },
    /// Read every partition of `topics` (a broadcast consumer).
    Kafka {
        /// `bootstrap.servers`
        brokers: String,
        topics: Vec<String>,
        /// "latest" (default), "earliest", or a timestamp in ms.
        #[serde(default)]
        #[schema(value_type = Object)]
        start: kafka::KafkaStart,
        /// Without a transform: "header:<name>" (default "header:channel"), "key" or "topic".
        #[serde(default, skip_serializing_if = "Option::is_none")]
        channel_from: Option<String>,
        /// librdkafka properties for every client of this source (TLS, SASL,
        /// tuning); secrets are shown as "***".
        #[serde(default, skip_serializing_if = "kafka::KafkaOptions::is_empty")]
        #[schema(value_type = Object)]
        options: kafka::KafkaOptions,
        /// Raise it when the source's positions start over (a topic deleted and made again): another
        /// position space. Every channel gets a new epoch (subscribers are
        /// told by an `ack`; a resume from the old epoch is a gap) and
        /// positions stored under another generation are not used. Default 0.
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: u32,
    },
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig::Http {
            stall_after_ms: None,
        }
    }
}

impl SourceConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Http { .. } => "http",
            SourceConfig::PostgresOutbox { .. } => "postgres_outbox",
            SourceConfig::Kafka { .. } => "kafka",
        }
    }

    /// What names this source's positions alike on every node (ARCHITECTURE.md,
    /// "Positions"): outbox and Kafka positions come from the source, and in
    /// cluster mode so do HTTP publishes (the shared log). `None`: the
    /// positions are this node's own (HTTP publish on a node of its own).
    /// The same source set again gives the same seed; tuning options and
    /// credentials are not part of it. The tenant's creation time is: a
    /// tenant deleted and made again under the same id is another position
    /// space, even on the same source.
    pub fn epoch_seed(&self, tenant: &str, created_at_ms: i64, cluster: bool) -> Option<u64> {
        let identity = match self {
            SourceConfig::Http { .. } if cluster => "http log".to_string(),
            SourceConfig::Http { .. } => return None,
            SourceConfig::PostgresOutbox {
                database_url,
                table,
                generation,
                ..
            } => format!(
                "postgres_outbox {} {table}{}",
                redact_url(database_url),
                generation_suffix(*generation)
            ),
            SourceConfig::Kafka {
                brokers,
                topics,
                generation,
                ..
            } => format!(
                "kafka {brokers} {}{}",
                topics.join(","),
                generation_suffix(*generation)
            ),
        };
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(format!("{tenant}\n{created_at_ms}\n{identity}").as_bytes());
        Some(u64::from_be_bytes(d[..8].try_into().unwrap_or_default()))
    }

    /// The configuration with credentials removed, for API answers and logs.
    pub fn redacted(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        match self {
            SourceConfig::PostgresOutbox { database_url, .. } => {
                v["database_url"] = serde_json::Value::String(redact_url(database_url));
            }
            SourceConfig::Kafka { options, .. } if !options.is_empty() => {
                v["options"] = options.redacted();
            }
            _ => {}
        }
        v
    }
}

/// What a source's `generation` adds to the names of its positions (its
/// epoch seed, its stored positions' key): nothing for 0, so sources set
/// before generations existed keep theirs.
pub fn generation_suffix(generation: u32) -> String {
    if generation == 0 {
        String::new()
    } else {
        format!("#g{generation}")
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
