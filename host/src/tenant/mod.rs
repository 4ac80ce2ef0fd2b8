//! Tenants at run time: `Tenant` (its settings as pure data, fan-out hub,
//! conflation window, active plugin slot, publish bucket, sessions, counters)
//! and `Tenants`, the live ones by id; `TenantSettings::from_record` turns a
//! registry row into settings. limits.rs: limits, overrides, defaults;
//! origins.rs: allowed origins and CORS; capacity.rs: process and tenant
//! capacity, per-address bounds, RAII slots.
//!
//! Owns: the in-memory view of the registry's tenants and the per-tenant
//! counters. Invariants: a tenant's `Hub` lives as long as the tenant, so an
//! admin change of limits or access never orphans a subscriber; connection
//! slots are RAII guards, so a count cannot leak when a session ends by any
//! path. Must never block on the registry while holding a lock.

use crate::fanout::conflate::{ConflationSettings, Conflator};
use crate::fanout::session::QueueClose;
use crate::fanout::Hub;
use crate::metrics::TenantMetrics;
use crate::plugin::active::ActivePlugin;
use crate::ratelimit::TokenBucket;
use crate::registry::TenantRecord;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod capacity;
mod limits;
mod origins;
mod plugin_slot;

pub use crate::fanout::registry::SessionRegistry;
pub use capacity::{Capacity, ConnectionSlot, DoorSlot, PerAddress, Refusal};
pub use limits::{LimitOverrides, TenantLimits, PUBLIC_PER_ADDRESS, PUBLIC_SHARE_PERCENT};
pub use origins::{cors_headers, parse_origins, Headers, OriginCheck};
pub use plugin_slot::{PluginSlot, PluginState};

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

impl TenantSettings {
    /// A tenant row turned into live settings (its limit overrides over
    /// `defaults`), or why it cannot be.
    pub fn from_record(
        rec: &TenantRecord,
        defaults: &TenantLimits,
    ) -> Result<TenantSettings, String> {
        let access: Access = serde_json::from_value(serde_json::Value::String(rec.access.clone()))
            .map_err(|_| format!("access {:?} is not public or plugin", rec.access))?;
        let overrides: LimitOverrides =
            serde_json::from_value(rec.limits.clone()).map_err(|e| format!("limits: {e}"))?;
        let limits = overrides.apply(defaults)?;
        let digest = crate::secret::digest_from_hex(&rec.publish_key_sha256)
            .ok_or("publish key digest is not 64 hex digits")?;
        let conflation: ConflationSettings = serde_json::from_value(rec.conflation.clone())
            .map_err(|e| format!("conflation: {e}"))?;
        conflation.validate()?;
        let allowed_origins = parse_origins(&rec.allowed_origins)?;
        Ok(TenantSettings {
            access,
            config: rec.config.clone(),
            overrides,
            limits,
            publish_key_sha256: digest,
            conflation,
            allowed_origins,
        })
    }
}

/// A live tenant.
pub struct Tenant {
    pub id: Arc<str>,
    settings: RwLock<Arc<TenantSettings>>,
    pub hub: Hub,
    connections: AtomicUsize,
    /// Sessions per client address, where the tenant bounds them.
    per_address: PerAddress,
    rate: Mutex<TokenBucket>,
    /// Every live session, so deletion, an access change or shutdown can
    /// close them; no per-session waiter needed.
    pub sessions: SessionRegistry,
    pub metrics: TenantMetrics,
    /// The active plugin and the version the registry wants.
    plugin: PluginSlot,
    /// Keyed messages waiting for the conflation window to close.
    pub conflator: Mutex<Conflator>,
    /// When the conflation window last closed.
    pub last_flush: Mutex<Instant>,
    /// Messages ingest published at the channel's next position because
    /// their source position was behind it (a source's health shows its share).
    pub rebased: std::sync::atomic::AtomicU64,
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
            per_address: PerAddress::default(),
            rate: Mutex::new(rate),
            sessions: SessionRegistry::default(),
            metrics: TenantMetrics::new(id),
            plugin: PluginSlot::default(),
            conflator: Mutex::new(Conflator::with_limits(
                crate::fanout::conflate::MAX_HELD,
                window_bytes,
            )),
            last_flush: Mutex::new(Instant::now()),
            rebased: Default::default(),
            log_written: tokio::sync::Notify::new(),
            over_share: AtomicBool::new(false),
            history_full_logged: Default::default(),
        })
    }

    pub fn plugin(&self) -> Option<Arc<ActivePlugin>> {
        self.plugin.active()
    }

    /// Where the tenant's plugin stands ([`PluginState`]).
    pub fn plugin_state(&self) -> PluginState {
        self.plugin.state()
    }

    /// Records the version the registry says is active (it failed to load
    /// here, or it is the one running).
    pub fn set_wanted_plugin(&self, version: Option<i64>) {
        self.plugin.want(version);
    }

    /// Makes `p` the active plugin and the one the registry wants, in one
    /// step: nobody sees the one without the other. On a plugin tenant, the
    /// sessions the old version admitted are authorized again by the new one.
    pub fn activate(&self, p: Option<Arc<ActivePlugin>>) -> Option<Arc<ActivePlugin>> {
        let (old, changed) = self.plugin.activate(p);
        if changed && self.settings.read().access == Access::Plugin {
            self.sessions.close_all(QueueClose::Reauthorize, false);
        }
        old
    }

    /// The sha256s of the components this tenant runs, may roll back to,
    /// or uploaded last (kept compiled: `PluginHost::evict_compiled`).
    pub fn plugin_shas(&self) -> impl Iterator<Item = String> {
        self.plugin.shas()
    }

    /// Records the tenant's newest upload, kept compiled until a newer one.
    pub fn plugin_uploaded(&self, sha256: String) {
        self.plugin.uploaded(sha256);
    }

    /// Marks a background load of the wanted version as running or done.
    pub fn set_plugin_loading(&self, loading: bool) {
        self.plugin.set_loading(loading);
    }

    /// Whether the wanted version is still being loaded (at start).
    pub fn plugin_loading(&self) -> bool {
        matches!(self.plugin.state(), PluginState::Loading(_))
    }

    /// The active version when it is not the one loaded here.
    pub fn plugin_unavailable(&self) -> Option<i64> {
        match self.plugin.state() {
            PluginState::Loading(v) | PluginState::Unavailable(v) => Some(v),
            PluginState::None | PluginState::Serving(_) => None,
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
    use crate::fanout::queue::SlowConsumer;

    pub(crate) fn defaults() -> TenantLimits {
        TenantLimits::DEFAULT
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
