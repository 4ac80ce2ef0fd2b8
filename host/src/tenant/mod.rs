//! Tenants at run time: limits, access mode, publish key, connection counts,
//! and each tenant's fan-out hub.
//!
//! Owns: the in-memory view of the registry's tenants and the per-tenant
//! counters. Invariants: a tenant's `Hub` lives as long as the tenant, so an
//! admin change of limits or access never orphans a subscriber; connection
//! slots are RAII guards, so a count cannot leak when a session ends by any
//! path. Must never block on the registry while holding a lock.

use crate::fanout::conflate::{ConflationSettings, Conflator};
use crate::fanout::queue::SlowConsumer;
use crate::fanout::session::QueueClose;
use crate::fanout::{HistoryLimits, Hub};
use crate::metrics::TenantMetrics;
use crate::plugin::active::ActivePlugin;
use crate::plugin::SandboxLimits;
use crate::ratelimit::TokenBucket;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod capacity;
mod sessions;
pub use capacity::{Capacity, ConnectionSlot, DoorSlot, Refusal};
pub use sessions::SessionRegistry;

/// Who may connect and subscribe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Anyone may connect and subscribe.
    Public,
    /// The tenant's plugin decides; with no active plugin every connect is refused.
    #[default]
    Plugin,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::Plugin => "plugin",
        }
    }
}

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
}

/// A public tenant's default share of the process's sessions (percent).
pub const PUBLIC_SHARE_PERCENT: u8 = 50;
/// A public tenant's default sessions per client address (a large NAT
/// still fits; one machine cannot take the tenant).
pub const PUBLIC_PER_ADDRESS: usize = 1000;

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

/// What the admin API may change; swapped as a whole.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSettings {
    pub access: Access,
    pub config: serde_json::Value,
    pub overrides: LimitOverrides,
    pub limits: TenantLimits,
    pub publish_key_sha256: [u8; 32],
    pub conflation: ConflationSettings,
    /// Browser origins (`scheme://host[:port]`, lowercase) its clients may
    /// come from; `None`: any.
    pub allowed_origins: Option<Vec<String>>,
}

/// What a tenant says of a request's `Origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginCheck {
    /// The tenant allows any origin.
    Any,
    /// The request names an origin the tenant lists (echoed in CORS).
    Allowed(String),
    /// The tenant lists origins and the request sent none (not a browser
    /// page: browsers always send one on WebSocket and cross-origin fetches).
    Absent,
    /// The request's origin is not one the tenant lists.
    Refused,
}

impl TenantSettings {
    pub fn check_origin(&self, origin: Option<&str>) -> OriginCheck {
        let Some(list) = &self.allowed_origins else {
            return OriginCheck::Any;
        };
        match origin {
            None => OriginCheck::Absent,
            Some(o) => {
                let o = o.trim().to_ascii_lowercase();
                if list.contains(&o) {
                    OriginCheck::Allowed(o)
                } else {
                    OriginCheck::Refused
                }
            }
        }
    }
}

/// Response headers as (name, value).
pub type Headers = Vec<(&'static str, String)>;

/// The CORS headers of an SSE response (or preflight) for a request from
/// `origin` to a tenant with `settings` (`None`: no such tenant, whose 404
/// any page may read). `Err` with the headers of a refusal when the tenant
/// does not allow the origin: no `Access-Control-Allow-Origin`, so the page
/// cannot read it.
pub fn cors_headers(
    settings: Option<&TenantSettings>,
    origin: Option<&str>,
) -> Result<Headers, Headers> {
    let any = || vec![("Access-Control-Allow-Origin", "*".to_string())];
    let Some(s) = settings else {
        return Ok(any());
    };
    let vary = ("Vary", "Origin".to_string());
    match s.check_origin(origin) {
        OriginCheck::Any => Ok(any()),
        OriginCheck::Allowed(o) => Ok(vec![
            ("Access-Control-Allow-Origin", o),
            ("Access-Control-Allow-Credentials", "true".to_string()),
            vary,
        ]),
        OriginCheck::Absent => Ok(vec![vary]),
        OriginCheck::Refused => Err(vec![vary]),
    }
}

/// Reads a tenant's `allowed_origins` (null, or an array of at most 100
/// origins of the form `http(s)://host[:port]`, no path), lowercased.
pub fn parse_origins(v: &serde_json::Value) -> Result<Option<Vec<String>>, String> {
    let items = match v {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Array(items) => items,
        _ => return Err("allowed_origins: must be an array of origins, or null for any".into()),
    };
    if items.len() > 100 {
        return Err("allowed_origins: at most 100 origins".into());
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Some(s) = item.as_str() else {
            return Err("allowed_origins: each must be a string".into());
        };
        let o = s.to_ascii_lowercase();
        let host = o
            .strip_prefix("https://")
            .or_else(|| o.strip_prefix("http://"))
            .ok_or_else(|| format!("allowed_origins: {s:?} must start with https:// or http://"))?;
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        if !valid {
            return Err(format!(
                "allowed_origins: {s:?} must be scheme://host[:port], without a path"
            ));
        }
        out.push(o);
    }
    Ok(Some(out))
}

/// A live tenant.
pub struct Tenant {
    pub id: Arc<str>,
    settings: RwLock<Arc<TenantSettings>>,
    pub hub: Hub,
    connections: AtomicUsize,
    /// Sessions per client address, where the tenant bounds them.
    per_address: Mutex<HashMap<std::net::IpAddr, u32>>,
    rate: Mutex<TokenBucket>,
    /// Every live session, so deletion, an access change or shutdown can
    /// close them; no per-session waiter needed.
    pub sessions: SessionRegistry,
    pub metrics: TenantMetrics,
    /// The active plugin version; swapped whole, so calls in flight finish on
    /// the version they started with.
    plugin: RwLock<Option<Arc<ActivePlugin>>>,
    /// The version the registry says is active (0: none). While the loaded
    /// one is not it, the tenant refuses connections, publishes and source
    /// records (`plugin_unavailable`): it never runs as if it had no plugin.
    wanted_plugin: std::sync::atomic::AtomicI64,
    /// The sha256 of the version the active one replaced: kept compiled for
    /// a rollback, beside the active one (`App::evict_compiled`).
    previous_plugin: Mutex<Option<String>>,
    /// A load of the wanted version is running in the background (at
    /// start): refusals say `plugin_loading`, not `plugin_unavailable`.
    plugin_loading: AtomicBool,
    /// Keyed messages waiting for the conflation window to close.
    pub conflator: Mutex<Conflator>,
    /// When the conflation window last closed.
    pub last_flush: Mutex<Instant>,
    /// The running ingest source and its health.
    pub source: Mutex<crate::source::SourceSlot>,
    /// Cluster mode: rung when the registry announces new rows of this
    /// tenant in the shared publish log (its reader waits on it).
    pub log_written: tokio::sync::Notify,
    /// Near the process memory budget, this tenant holds more than its
    /// share (`watch_memory`): its new connections are refused.
    over_share: AtomicBool,
    /// "Histories full" is logged once a minute.
    pub history_full_logged: crate::metrics::LogEvery,
}

impl Tenant {
    pub fn new(id: &str, settings: TenantSettings) -> Arc<Tenant> {
        let rate = TokenBucket::new(
            settings.limits.publish_rate,
            settings.limits.publish_burst,
            Instant::now(),
        );
        let window_bytes = settings.limits.conflation_max_bytes;
        Arc::new(Tenant {
            id: id.into(),
            settings: RwLock::new(Arc::new(settings)),
            hub: Hub::default(),
            connections: AtomicUsize::new(0),
            per_address: Mutex::new(HashMap::new()),
            rate: Mutex::new(rate),
            sessions: SessionRegistry::default(),
            metrics: TenantMetrics::new(id),
            plugin: RwLock::new(None),
            wanted_plugin: std::sync::atomic::AtomicI64::new(0),
            previous_plugin: Mutex::new(None),
            plugin_loading: AtomicBool::new(false),
            conflator: Mutex::new(Conflator::with_limits(
                crate::fanout::conflate::MAX_HELD,
                window_bytes,
            )),
            last_flush: Mutex::new(Instant::now()),
            source: Mutex::new(crate::source::SourceSlot::default()),
            log_written: tokio::sync::Notify::new(),
            over_share: AtomicBool::new(false),
            history_full_logged: Default::default(),
        })
    }

    pub fn plugin(&self) -> Option<Arc<ActivePlugin>> {
        self.plugin.read().clone()
    }

    /// Records the version the registry says is active (it failed to load
    /// here, or it is the one running).
    pub fn set_wanted_plugin(&self, version: Option<i64>) {
        let _g = self.plugin.write();
        self.wanted_plugin
            .store(version.unwrap_or(0), Ordering::Release);
    }

    /// Makes `p` the active plugin and the one the registry wants, in one
    /// step: nobody sees the one without the other.
    pub fn activate(&self, p: Option<Arc<ActivePlugin>>) -> Option<Arc<ActivePlugin>> {
        let mut g = self.plugin.write();
        self.wanted_plugin
            .store(p.as_ref().map_or(0, |p| p.version), Ordering::Release);
        let old = std::mem::replace(&mut *g, p);
        let same = |a: &Option<Arc<ActivePlugin>>, b: &Option<Arc<ActivePlugin>>| {
            a.as_ref().map(|p| &p.sha256) == b.as_ref().map(|p| &p.sha256)
        };
        if old.is_some() && !same(&old, &g) {
            *self.previous_plugin.lock() = old.as_ref().map(|p| p.sha256.clone());
        }
        let version = |p: &Option<Arc<ActivePlugin>>| p.as_ref().map(|p| p.version);
        let revoke = old.is_some()
            && version(&old) != version(&g)
            && self.settings.read().access == Access::Plugin;
        drop(g);
        if revoke {
            // Sessions the old version admitted are authorized again by the new one.
            self.sessions.close_all(QueueClose::Reauthorize, false);
        }
        old
    }

    /// The sha256s of the components this tenant runs or may roll back to.
    pub fn plugin_shas(&self) -> impl Iterator<Item = String> {
        let active = self.plugin().map(|p| p.sha256.clone());
        let previous = self.previous_plugin.lock().clone();
        active.into_iter().chain(previous)
    }

    /// Marks a background load of the wanted version as running or done.
    pub fn set_plugin_loading(&self, loading: bool) {
        self.plugin_loading.store(loading, Ordering::Release);
    }

    /// Whether the wanted version is still being loaded (at start).
    pub fn plugin_loading(&self) -> bool {
        self.plugin_loading.load(Ordering::Acquire)
    }

    /// The active version when it is not the one loaded here.
    pub fn plugin_unavailable(&self) -> Option<i64> {
        let g = self.plugin.read();
        let wanted = self.wanted_plugin.load(Ordering::Acquire);
        match &*g {
            _ if wanted == 0 => None,
            Some(p) if p.version == wanted => None,
            _ => Some(wanted),
        }
    }

    pub fn settings(&self) -> Arc<TenantSettings> {
        self.settings.read().clone()
    }

    /// Installs new settings; closes every session when access changed, and
    /// those the change concerns when the config or allowed origins did.
    pub fn update(&self, new: TenantSettings) {
        let old = std::mem::replace(&mut *self.settings.write(), Arc::new(new.clone()));
        self.conflator
            .lock()
            .set_max_bytes(new.limits.conflation_max_bytes);
        *self.rate.lock() = TokenBucket::new(
            new.limits.publish_rate,
            new.limits.publish_burst,
            Instant::now(),
        );
        if old.access != new.access {
            self.sessions.close_all(QueueClose::TenantGone, false);
            return;
        }
        // Revocation: a session stays only while what admitted it holds.
        let by_plugin = new.access == Access::Plugin;
        if by_plugin && old.config != new.config {
            // The plugin that admitted them reads the config.
            self.sessions.close_all(QueueClose::Reauthorize, false);
        } else if old.allowed_origins != new.allowed_origins {
            // Pages whose origin is now refused; on a plugin tenant every
            // page (which credentials count depends on the list).
            self.sessions.close_where(QueueClose::Reauthorize, |info| {
                info.origin
                    .as_deref()
                    .is_some_and(|o| by_plugin || new.check_origin(Some(o)) == OriginCheck::Refused)
            });
        }
    }

    /// Closes every session of this tenant, now and later (deletion).
    pub fn shut(&self) {
        self.sessions.close_all(QueueClose::TenantGone, true);
    }

    pub fn check_publish_key(&self, presented: &str) -> bool {
        let want = self.settings.read().publish_key_sha256;
        crate::secret::matches(&want, presented)
    }

    /// Takes `n` publish tokens or says how long to wait.
    pub fn take_publish_tokens(&self, n: u32) -> Result<(), Duration> {
        self.rate.lock().try_take(n, Instant::now())
    }

    /// Bytes this tenant holds in memory the host can count: session
    /// queues, channel histories and the conflation window. Walks the
    /// sessions: called once a second, only near the memory budget.
    pub fn accounted_bytes(&self) -> usize {
        let window = self.conflator.try_lock().map_or(0, |c| c.bytes());
        self.hub.history_bytes() + window + self.sessions.queued_bytes()
    }

    pub fn over_share(&self) -> bool {
        self.over_share.load(Ordering::Relaxed)
    }

    pub fn set_over_share(&self, over: bool) {
        self.over_share.store(over, Ordering::Relaxed);
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    fn try_acquire(&self, max: Option<usize>) -> bool {
        let max = max.unwrap_or(usize::MAX);
        self.connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }
}

/// All tenants, by id.
#[derive(Default)]
pub struct Tenants {
    map: RwLock<HashMap<Arc<str>, Arc<Tenant>>>,
}

impl Tenants {
    pub fn get(&self, id: &str) -> Option<Arc<Tenant>> {
        self.map.read().get(id).cloned()
    }

    pub fn insert(&self, t: Arc<Tenant>) {
        self.map.write().insert(t.id.clone(), t);
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Tenant>> {
        self.map.write().remove(id)
    }

    pub fn all(&self) -> Vec<Arc<Tenant>> {
        self.map.read().values().cloned().collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn defaults() -> TenantLimits {
        crate::config::Config::for_data_dir("/nonexistent").limits
    }

    pub(crate) fn public_tenant(id: &str) -> Arc<Tenant> {
        let settings = TenantSettings {
            access: Access::Public,
            config: serde_json::json!({}),
            overrides: LimitOverrides::default(),
            limits: defaults(),
            publish_key_sha256: crate::secret::key_digest("k"),
            conflation: ConflationSettings::default(),
            allowed_origins: None,
        };
        Tenant::new(id, settings)
    }

    #[test]
    fn overrides_apply_and_validate() {
        let d = defaults();
        let o: LimitOverrides =
            serde_json::from_str(r#"{"queue_bytes":100000,"slow_consumer":"disconnect"}"#).unwrap();
        let l = o.apply(&d).unwrap();
        assert_eq!(l.queue_bytes, 100_000);
        assert_eq!(l.slow_consumer, SlowConsumer::Disconnect);
        assert_eq!(l.max_subscriptions, d.max_subscriptions);
        assert!(serde_json::from_str::<LimitOverrides>(r#"{"queue_byte":1}"#).is_err());
        let bad = LimitOverrides {
            queue_bytes: Some(10),
            ..Default::default()
        };
        assert!(bad.apply(&d).unwrap_err().contains("queue_bytes"));
    }

    #[test]
    fn slots_are_released_on_drop() {
        let mut limits = defaults();
        limits.max_connections = Some(1);
        let t = Tenant::new(
            "t",
            TenantSettings {
                access: Access::Public,
                config: serde_json::json!({}),
                overrides: LimitOverrides::default(),
                limits,
                publish_key_sha256: crate::secret::key_digest("k"),
                conflation: ConflationSettings::default(),
                allowed_origins: None,
            },
        );
        let cap = Capacity::new(2);
        let a = cap.acquire(&t).unwrap();
        assert_eq!(cap.acquire(&t).err(), Some(Refusal::TenantConnections));
        assert_eq!(cap.current(), 1);
        drop(a);
        assert_eq!((cap.current(), t.connections()), (0, 0));
        assert!(t.check_publish_key("k"));
        assert!(!t.check_publish_key("K"));
    }
}
