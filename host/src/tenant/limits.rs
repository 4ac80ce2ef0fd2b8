//! A tenant's limits: the effective set, the overrides stored in the
//! registry (unknown fields refused) and the checks that refuse values that
//! cannot work; a public tenant's default shares of the process.

use super::Access;
use crate::fanout::queue::SlowConsumer;
use crate::fanout::HistoryLimits;
use crate::plugin::SandboxLimits;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Effective limits of a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TenantLimits {
    pub max_connections: Option<usize>,
    /// Share (percent) of the process's session capacity the tenant may
    /// hold when `max_connections` is not set; `None`: 50 for a public
    /// tenant, 100 for a plugin one ([`TenantLimits::session_cap`]).
    pub connection_share_percent: Option<u8>,
    /// Sessions from one client address; `None`: 1000 for a public tenant,
    /// no bound for a plugin one.
    pub max_connections_per_address: Option<usize>,
    pub max_subscriptions: usize,
    pub max_message_bytes: usize,
    pub queue_bytes: usize,
    pub slow_consumer: SlowConsumer,
    pub publish_rate: f64,
    pub publish_burst: u32,
    pub history_size: usize,
    pub history_ttl_ms: u64,
    /// Encoded bytes one channel's history may hold, and all the tenant's
    /// channels' histories together.
    pub history_bytes: usize,
    pub history_total_bytes: usize,
    /// Channels a tenant's subscribers may bring into being; a subscribe
    /// past it gets `err` `too_many_channels`.
    pub max_channels: usize,
    /// Bytes the conflation window may hold (besides at most 100,000
    /// entries); a message past it is published at once instead.
    pub conflation_max_bytes: usize,
    /// Share of the process memory budget (percent) the tenant's queues,
    /// histories and window may hold: near the budget, only tenants past
    /// their share are refused new connections.
    pub memory_share_percent: u8,
    pub plugin_memory_bytes: usize,
    pub plugin_deadline_ms: u64,
    pub plugin_max_bytes: usize,
    /// Blocking threads the tenant's plugin calls may use at once, and the
    /// calls that may wait for one (past it: 503 `plugin_busy`).
    pub plugin_threads: usize,
    pub plugin_queue: usize,
    /// Client operations (frames) per second per WebSocket connection, and
    /// the burst above it (a client subscribing to all its channels at once).
    pub client_ops_per_sec: f64,
    pub client_ops_burst: u32,
    /// permessage-deflate (RFC 7692): messages of at least this many bytes
    /// go compressed to WebSocket clients that offered it; 0 turns it off
    /// (the handshake then agrees to no compression).
    pub deflate_min_bytes: usize,
}

/// A public tenant's default share of the process's sessions (percent).
pub const PUBLIC_SHARE_PERCENT: u8 = 50;
/// A public tenant's default sessions per client address (a large NAT
/// still fits; one machine cannot take the tenant).
pub const PUBLIC_PER_ADDRESS: usize = 1000;

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits::DEFAULT
    }
}

impl TenantLimits {
    /// The defaults of `herald serve`'s limit flags (config.rs takes its
    /// defaults from here): a tenant's limits where nothing overrides them.
    pub const DEFAULT: TenantLimits = TenantLimits {
        max_connections: None,
        connection_share_percent: None,
        max_connections_per_address: None,
        max_subscriptions: 128,
        max_message_bytes: 65_536,
        queue_bytes: 262_144,
        slow_consumer: SlowConsumer::Conflate,
        publish_rate: 10_000.0,
        publish_burst: 20_000,
        history_size: 100,
        history_ttl_ms: 300_000,
        history_bytes: 1 << 20,
        history_total_bytes: 256 << 20,
        max_channels: 100_000,
        conflation_max_bytes: 64 << 20,
        memory_share_percent: 50,
        plugin_memory_bytes: 64 << 20,
        plugin_deadline_ms: 100,
        plugin_max_bytes: 32 << 20,
        plugin_threads: 2,
        plugin_queue: 64,
        client_ops_per_sec: 50.0,
        client_ops_burst: 300,
        deflate_min_bytes: 0,
    };
}

impl TenantLimits {
    /// The most sessions the tenant may hold in a process of `capacity`:
    /// its `max_connections`, else its share of the capacity.
    pub fn session_cap(&self, access: Access, capacity: usize) -> usize {
        if let Some(m) = self.max_connections {
            return m;
        }
        let share = self.connection_share_percent.unwrap_or(match access {
            Access::Public => PUBLIC_SHARE_PERCENT,
            Access::Plugin => 100,
        });
        if share >= 100 {
            return usize::MAX;
        }
        (capacity / 100).saturating_mul(share as usize) + (capacity % 100) * share as usize / 100
    }

    /// The most sessions the tenant may hold from one client address.
    pub fn per_address_cap(&self, access: Access) -> Option<usize> {
        self.max_connections_per_address.or(match access {
            Access::Public => Some(PUBLIC_PER_ADDRESS),
            Access::Plugin => None,
        })
    }

    pub fn history(&self) -> HistoryLimits {
        HistoryLimits {
            max_messages: self.history_size,
            max_age_ms: self.history_ttl_ms,
            max_bytes: self.history_bytes,
            tenant_max_bytes: self.history_total_bytes,
        }
    }

    pub fn sandbox(&self) -> SandboxLimits {
        SandboxLimits {
            memory_bytes: self.plugin_memory_bytes,
            deadline: Duration::from_millis(self.plugin_deadline_ms),
            threads: self.plugin_threads,
            queue: self.plugin_queue,
        }
    }
}

/// Per-tenant overrides as stored in the registry; absent fields use the
/// global defaults. Unknown fields are refused so a typo cannot pass silently.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_share_percent: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_address: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_subscriptions: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_consumer: Option<SlowConsumer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_total_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_channels: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflation_max_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_share_percent: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_memory_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_deadline_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_max_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_threads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_queue: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ops_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ops_burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deflate_min_bytes: Option<usize>,
}

impl LimitOverrides {
    /// Applies the overrides to `defaults`, refusing values that cannot work.
    pub fn apply(&self, defaults: &TenantLimits) -> Result<TenantLimits, String> {
        let l = TenantLimits {
            max_connections: self.max_connections.or(defaults.max_connections),
            connection_share_percent: self
                .connection_share_percent
                .or(defaults.connection_share_percent),
            max_connections_per_address: self
                .max_connections_per_address
                .or(defaults.max_connections_per_address),
            max_subscriptions: self.max_subscriptions.unwrap_or(defaults.max_subscriptions),
            max_message_bytes: self.max_message_bytes.unwrap_or(defaults.max_message_bytes),
            queue_bytes: self.queue_bytes.unwrap_or(defaults.queue_bytes),
            slow_consumer: self.slow_consumer.unwrap_or(defaults.slow_consumer),
            publish_rate: self.publish_rate.unwrap_or(defaults.publish_rate),
            publish_burst: self.publish_burst.unwrap_or(defaults.publish_burst),
            history_size: self.history_size.unwrap_or(defaults.history_size),
            history_ttl_ms: self.history_ttl_ms.unwrap_or(defaults.history_ttl_ms),
            history_bytes: self.history_bytes.unwrap_or(defaults.history_bytes),
            history_total_bytes: self
                .history_total_bytes
                .unwrap_or(defaults.history_total_bytes),
            max_channels: self.max_channels.unwrap_or(defaults.max_channels),
            conflation_max_bytes: self
                .conflation_max_bytes
                .unwrap_or(defaults.conflation_max_bytes),
            memory_share_percent: self
                .memory_share_percent
                .unwrap_or(defaults.memory_share_percent),
            plugin_memory_bytes: self
                .plugin_memory_bytes
                .unwrap_or(defaults.plugin_memory_bytes),
            plugin_deadline_ms: self
                .plugin_deadline_ms
                .unwrap_or(defaults.plugin_deadline_ms),
            plugin_max_bytes: self.plugin_max_bytes.unwrap_or(defaults.plugin_max_bytes),
            plugin_threads: self.plugin_threads.unwrap_or(defaults.plugin_threads),
            plugin_queue: self.plugin_queue.unwrap_or(defaults.plugin_queue),
            client_ops_per_sec: self
                .client_ops_per_sec
                .unwrap_or(defaults.client_ops_per_sec),
            client_ops_burst: self.client_ops_burst.unwrap_or(defaults.client_ops_burst),
            deflate_min_bytes: self.deflate_min_bytes.unwrap_or(defaults.deflate_min_bytes),
        };
        if !(l.client_ops_per_sec > 0.0 && l.client_ops_per_sec.is_finite())
            || l.client_ops_burst == 0
        {
            return Err("limits.client_ops_per_sec must be a positive number and limits.client_ops_burst at least 1".into());
        }
        if l.max_message_bytes < 64 {
            return Err("limits.max_message_bytes must be at least 64".into());
        }
        if l.queue_bytes < l.max_message_bytes {
            return Err("limits.queue_bytes must be at least limits.max_message_bytes".into());
        }
        if !(l.publish_rate > 0.0 && l.publish_rate.is_finite()) {
            return Err("limits.publish_rate must be a positive number".into());
        }
        if l.history_size > 100_000 {
            return Err("limits.history_size must be at most 100000".into());
        }
        if l.history_bytes < l.max_message_bytes || l.history_total_bytes < l.history_bytes {
            return Err("limits.history_bytes must be at least limits.max_message_bytes, and limits.history_total_bytes at least limits.history_bytes".into());
        }
        if !(1..=10_000_000).contains(&l.max_channels) {
            return Err("limits.max_channels must be between 1 and 10000000".into());
        }
        if l.conflation_max_bytes < l.max_message_bytes {
            return Err(
                "limits.conflation_max_bytes must be at least limits.max_message_bytes".into(),
            );
        }
        if l.connection_share_percent
            .is_some_and(|p| !(1..=100).contains(&p))
        {
            return Err("limits.connection_share_percent must be between 1 and 100".into());
        }
        if l.max_connections_per_address == Some(0) {
            return Err("limits.max_connections_per_address must be at least 1".into());
        }
        if !(1..=100).contains(&l.memory_share_percent) {
            return Err("limits.memory_share_percent must be between 1 and 100".into());
        }
        if !(1 << 20..=4 << 30).contains(&l.plugin_memory_bytes) {
            return Err("limits.plugin_memory_bytes must be between 1 MiB and 4 GiB".into());
        }
        if !(1..=10_000).contains(&l.plugin_deadline_ms) {
            return Err("limits.plugin_deadline_ms must be between 1 and 10000".into());
        }
        if !(1..=16).contains(&l.plugin_threads) || l.plugin_queue > 10_000 {
            return Err("limits.plugin_threads must be between 1 and 16 and limits.plugin_queue at most 10000".into());
        }
        if !(1024..=256 << 20).contains(&l.plugin_max_bytes) {
            return Err("limits.plugin_max_bytes must be between 1 KiB and 256 MiB".into());
        }
        Ok(l)
    }
}
