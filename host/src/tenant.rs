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
use crate::fanout::session::{QueueClose, SessionHandle, SessionInfo};
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
use std::sync::Weak;
use std::time::{Duration, Instant};

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

/// Global connection accounting: the process-wide cap of sessions derived
/// from the open-files limit (or set lower by the operator), and the
/// sockets that are not sessions — before their handshake, or ordinary HTTP
/// connections ("doors") — each counted from accept until it becomes a
/// session or closes. Invariant: sessions + doors never pass `sockets_max`,
/// so the descriptors the sources, the registry and the process need are
/// never taken by clients; one client address holds at most
/// `per_address_max` doors (a socket past it is closed at accept).
pub struct Capacity {
    max: usize,
    current: AtomicUsize,
    doors: AtomicUsize,
    doors_max: usize,
    sockets_max: usize,
    doors_gauge: metrics::Gauge,
    /// Rung when a door closes: the accept loop waits on it while full.
    door_freed: tokio::sync::Notify,
    /// Doors per client address, and how many one address may hold (0: no
    /// bound): one address cannot take every door.
    per_address: parking_lot::Mutex<HashMap<std::net::IpAddr, u32>>,
    per_address_max: usize,
    /// Every door by age, each with the signal that closes it: at the bound
    /// the oldest makes way for a new connection ([`Capacity::evict_oldest`]).
    lineup: parking_lot::Mutex<std::collections::BTreeMap<u64, Arc<tokio::sync::Notify>>>,
    next_door: std::sync::atomic::AtomicU64,
}

/// A socket that is not (yet) a session; releasing is dropping.
pub struct DoorSlot {
    capacity: Arc<Capacity>,
    /// The client address it is counted under, once known.
    address: Option<std::net::IpAddr>,
    /// Its place in the lineup, and the signal that it is to close.
    seq: u64,
    evict: Arc<tokio::sync::Notify>,
}

impl DoorSlot {
    /// Counts the door under its client's address; false when that address
    /// already holds as many as it may (the socket is to be closed at once).
    pub fn claim(&mut self, address: std::net::IpAddr) -> bool {
        let max = self.capacity.per_address_max;
        if max == 0 {
            return true;
        }
        let mut map = self.capacity.per_address.lock();
        let n = map.entry(address).or_insert(0);
        if *n as usize >= max {
            return false;
        }
        *n += 1;
        self.address = Some(address);
        true
    }

    /// Resolves when this socket is to close to make way for a new one.
    pub fn evicted(&self) -> tokio::sync::futures::Notified<'_> {
        self.evict.notified()
    }
}

impl Drop for DoorSlot {
    fn drop(&mut self) {
        if let Some(a) = self.address {
            let mut map = self.capacity.per_address.lock();
            if let Some(n) = map.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&a);
                }
            }
        }
        self.capacity.lineup.lock().remove(&self.seq);
        self.capacity.doors.fetch_sub(1, Ordering::AcqRel);
        self.capacity.doors_gauge.decrement(1.0);
        self.capacity.door_freed.notify_one();
    }
}

/// Why a connection was refused before it became a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    GlobalConnections,
    TenantConnections,
    /// The tenant holds its share of the process (no `max_connections`).
    TenantShare,
    /// The tenant holds as many sessions from this client address as it may.
    AddressConnections,
    MemoryBudget,
    ShuttingDown,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::GlobalConnections => "global_connections",
            Refusal::TenantConnections => "tenant_connections",
            Refusal::TenantShare => "tenant_share",
            Refusal::AddressConnections => "address_connections",
            Refusal::MemoryBudget => "memory_budget",
            Refusal::ShuttingDown => "shutting_down",
        }
    }
}

impl Capacity {
    /// `max` sessions; doors unbounded but by the sockets (`max` + 50).
    pub fn new(max: usize) -> Arc<Capacity> {
        Capacity::with_doors(max, usize::MAX, max.saturating_add(50))
    }

    /// `max` sessions, at most `doors_max` other sockets, and at most
    /// `sockets_max` sockets of both kinds together.
    pub fn with_doors(max: usize, doors_max: usize, sockets_max: usize) -> Arc<Capacity> {
        Capacity::with_limits(max, doors_max, sockets_max, 0)
    }

    /// As [`with_doors`](Self::with_doors), and at most `per_address_max`
    /// doors for one client address (0: no bound).
    pub fn with_limits(
        max: usize,
        doors_max: usize,
        sockets_max: usize,
        per_address_max: usize,
    ) -> Arc<Capacity> {
        Arc::new(Capacity {
            max,
            current: AtomicUsize::new(0),
            doors: AtomicUsize::new(0),
            doors_max,
            sockets_max,
            doors_gauge: metrics::gauge!("herald_pending_connections"),
            door_freed: tokio::sync::Notify::new(),
            per_address: parking_lot::Mutex::new(HashMap::new()),
            per_address_max,
            lineup: parking_lot::Mutex::new(std::collections::BTreeMap::new()),
            next_door: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Resolves when a door may have freed (or after `poll`, for sessions
    /// that closed, which do not ring).
    pub async fn door_freed(&self, poll: std::time::Duration) {
        let _ = tokio::time::timeout(poll, self.door_freed.notified()).await;
    }

    /// Counts a socket about to be accepted, or says to wait: too many
    /// sockets are not sessions yet (slowloris), or sessions and these
    /// together would take descriptors the process needs.
    pub fn enter(self: &Arc<Self>) -> Option<DoorSlot> {
        let (doors_max, sockets_max) = (self.doors_max, self.sockets_max);
        let sessions = self.current.load(Ordering::Acquire);
        self.doors
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                (d < doors_max && sessions + d < sockets_max).then_some(d + 1)
            })
            .ok()?;
        self.doors_gauge.increment(1.0);
        let seq = self.next_door.fetch_add(1, Ordering::Relaxed);
        let evict = Arc::new(tokio::sync::Notify::new());
        self.lineup.lock().insert(seq, evict.clone());
        Some(DoorSlot {
            capacity: self.clone(),
            address: None,
            seq,
            evict,
        })
    }

    /// Tells the oldest door to close (it goes when its task sees the
    /// signal: at once while it waits for a head or idles between requests,
    /// after the response it is writing otherwise). False when there is none.
    pub fn evict_oldest(&self) -> bool {
        let oldest = self.lineup.lock().pop_first();
        match oldest {
            Some((_, evict)) => {
                evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Sockets counted as doors now.
    pub fn doors(&self) -> usize {
        self.doors.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Takes a global and a tenant slot, or neither.
    pub fn acquire(self: &Arc<Self>, tenant: &Arc<Tenant>) -> Result<ConnectionSlot, Refusal> {
        self.acquire_from(tenant, None)
    }

    /// A session slot for a client at `address`: within the process's
    /// capacity, the tenant's cap (its `max_connections`, else its share of
    /// the capacity) and its bound per client address.
    pub fn acquire_from(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        address: Option<std::net::IpAddr>,
    ) -> Result<ConnectionSlot, Refusal> {
        let max = self.max;
        if self
            .current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Refusal::GlobalConnections);
        }
        let settings = tenant.settings();
        let limits = &settings.limits;
        let cap = limits.session_cap(settings.access, max);
        if !tenant.try_acquire(Some(cap)) {
            self.current.fetch_sub(1, Ordering::AcqRel);
            return Err(if limits.max_connections.is_some() {
                Refusal::TenantConnections
            } else {
                Refusal::TenantShare
            });
        }
        tenant.metrics.connections.increment(1.0);
        let mut slot = ConnectionSlot {
            capacity: self.clone(),
            tenant: tenant.clone(),
            address: None,
        };
        if let (Some(ip), Some(per)) = (address, limits.per_address_cap(settings.access)) {
            let mut map = tenant.per_address.lock();
            let n = map.entry(ip).or_insert(0);
            if *n as usize >= per {
                drop(map);
                // Dropping the slot gives back what it took.
                drop(slot);
                return Err(Refusal::AddressConnections);
            }
            *n += 1;
            slot.address = Some(ip);
        }
        Ok(slot)
    }
}

/// Held by a session for its whole life; releasing is dropping.
pub struct ConnectionSlot {
    capacity: Arc<Capacity>,
    pub tenant: Arc<Tenant>,
    /// The client address it counts under (public tenants).
    address: Option<std::net::IpAddr>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.capacity.current.fetch_sub(1, Ordering::AcqRel);
        self.tenant.connections.fetch_sub(1, Ordering::AcqRel);
        if let Some(ip) = self.address {
            let mut map = self.tenant.per_address.lock();
            if let Some(n) = map.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&ip);
                }
            }
        }
        self.tenant.metrics.connections.decrement(1.0);
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

/// The live sessions of a tenant.
#[derive(Default)]
pub struct SessionRegistry {
    inner: Mutex<(slab::Slab<Weak<SessionHandle>>, Option<QueueClose>)>,
}

impl SessionRegistry {
    /// Registers a session; one registered after a final close is closed at once.
    pub fn register(&self, h: &Arc<SessionHandle>) -> usize {
        let mut g = self.inner.lock();
        if let Some(reason) = g.1 {
            h.close_with(reason);
        }
        g.0.insert(Arc::downgrade(h))
    }

    pub fn deregister(&self, key: usize) {
        self.inner.lock().0.try_remove(key);
    }

    /// Closes every registered session with `reason`; `terminal` also closes
    /// any session that registers later (tenant deleted, server stopping).
    pub fn close_all(&self, reason: QueueClose, terminal: bool) {
        let handles: Vec<Arc<SessionHandle>> = {
            let mut g = self.inner.lock();
            if terminal {
                g.1 = Some(reason);
            }
            g.0.iter().filter_map(|(_, w)| w.upgrade()).collect()
        };
        for h in handles {
            h.close_with(reason);
        }
    }

    /// Closes the live sessions whose [`SessionInfo`] matches `which`.
    pub fn close_where(&self, reason: QueueClose, which: impl Fn(&SessionInfo) -> bool) {
        for h in self.handles() {
            if which(h.info()) {
                h.close_with(reason);
            }
        }
    }

    /// The live sessions now.
    pub fn handles(&self) -> Vec<Arc<SessionHandle>> {
        self.inner
            .lock()
            .0
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Bytes queued for every live session together.
    pub fn queued_bytes(&self) -> usize {
        self.handles().iter().map(|h| h.queued_bytes()).sum()
    }

    /// Queues a control frame for every live session (source status).
    pub fn broadcast(&self, op: &str, json: &str) {
        for h in self.handles() {
            h.deliver_ctrl(op, json);
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
