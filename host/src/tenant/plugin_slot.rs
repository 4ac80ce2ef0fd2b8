//! A tenant's plugin slot: the version running here and the one the
//! registry wants, as one small state machine.
//!
//! States ([`PluginState`]): `None` (the registry wants no plugin),
//! `Serving(v)` (v runs and is the one wanted), `Loading(v)` (v is wanted and
//! its load at start is running), `Unavailable(v)` (v is wanted and does not
//! run here: its load failed, or it is another version than the one
//! running). Transitions: `want` (the registry's choice, recorded when a load
//! failed or the running one is right), `activate` (a load finished: running
//! and wanted change together, under one lock), `set_loading` (the start's
//! deferred load begins or ends). Invariant: a tenant whose wanted version
//! does not run here refuses connections, publishes and source records — it
//! never runs as if it had no plugin, nor on another version than wanted.

use crate::plugin::active::ActivePlugin;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

/// Where a tenant's plugin stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginState {
    None,
    Serving(i64),
    Loading(i64),
    Unavailable(i64),
}

#[derive(Default)]
pub struct PluginSlot {
    /// The active plugin version; swapped whole, so calls in flight finish
    /// on the version they started with.
    active: RwLock<Option<Arc<ActivePlugin>>>,
    /// The version the registry says is active (0: none).
    wanted: AtomicI64,
    /// The sha256 of the version the active one replaced: kept compiled for
    /// a rollback, beside the active one (`PluginHost::evict_compiled`).
    previous: Mutex<Option<String>>,
    /// The sha256 of the tenant's newest upload (through this node, or
    /// announced by another): kept compiled for the activation that
    /// usually follows, which then neither reads the component nor loads
    /// its artifact from disk (80-100 ms for a Python or JavaScript one).
    uploaded: Mutex<Option<String>>,
    /// A load of the wanted version is running in the background (at start):
    /// refusals say `plugin_loading`, not `plugin_unavailable`.
    loading: AtomicBool,
}

impl PluginSlot {
    pub fn active(&self) -> Option<Arc<ActivePlugin>> {
        self.active.read().clone()
    }

    pub fn state(&self) -> PluginState {
        let g = self.active.read();
        let wanted = self.wanted.load(Ordering::Acquire);
        match &*g {
            _ if wanted == 0 => PluginState::None,
            Some(p) if p.version == wanted => PluginState::Serving(wanted),
            _ if self.loading.load(Ordering::Acquire) => PluginState::Loading(wanted),
            _ => PluginState::Unavailable(wanted),
        }
    }

    /// Records the version the registry wants.
    pub fn want(&self, version: Option<i64>) {
        let _g = self.active.write();
        self.wanted.store(version.unwrap_or(0), Ordering::Release);
    }

    /// Makes `p` the active plugin and the wanted one at once; returns the
    /// one it replaced and whether the running version changed.
    pub fn activate(&self, p: Option<Arc<ActivePlugin>>) -> (Option<Arc<ActivePlugin>>, bool) {
        let mut g = self.active.write();
        self.wanted
            .store(p.as_ref().map_or(0, |p| p.version), Ordering::Release);
        let old = std::mem::replace(&mut *g, p);
        let sha = |a: &Option<Arc<ActivePlugin>>| a.as_ref().map(|p| p.sha256.clone());
        if old.is_some() && sha(&old) != sha(&g) {
            *self.previous.lock() = sha(&old);
        }
        let version = |p: &Option<Arc<ActivePlugin>>| p.as_ref().map(|p| p.version);
        let changed = old.is_some() && version(&old) != version(&g);
        (old, changed)
    }

    /// The sha256s of the components the tenant runs, may roll back to, or
    /// uploaded last.
    pub fn shas(&self) -> impl Iterator<Item = String> {
        let active = self.active().map(|p| p.sha256.clone());
        let previous = self.previous.lock().clone();
        let uploaded = self.uploaded.lock().clone();
        active.into_iter().chain(previous).chain(uploaded)
    }

    /// Records the tenant's newest upload.
    pub fn uploaded(&self, sha256: String) {
        *self.uploaded.lock() = Some(sha256);
    }

    pub fn set_loading(&self, loading: bool) {
        self.loading.store(loading, Ordering::Release);
    }
}
