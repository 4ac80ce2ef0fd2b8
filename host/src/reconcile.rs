//! Makes this node's live tenants what the registry says.
//!
//! Owns: turning a tenant's row (or its absence) into the live tenant — its
//! settings, active plugin and source — for the admin API after its own
//! write, and for cluster mode after a NOTIFY or on the periodic pass.
//! Invariants: idempotent (a row already applied reloads nothing, restarts
//! no reader, closes no session); every change reads the row *after* taking
//! the tenant's turn, so changes of one tenant apply one at a time and the
//! last applied is the registry's latest; never called under a fan-out lock.
//! Never writes the registry.

use crate::node::Node;
use crate::registry::{RegistryError, TenantRecord};
use crate::source::{self, SourceConfig};
use crate::tenant::{Tenant, TenantSettings};
use std::sync::Arc;

/// What a change did to the live tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Unchanged,
    Created,
    Updated,
    Removed,
}

/// Applies the registry's row of tenant `id` (or its absence) now.
pub async fn tenant(app: &Node, id: &str) -> Result<(Change, Option<Arc<Tenant>>), RegistryError> {
    let _turn = app.turns.take(id).await;
    let change = match app.registry.get_tenant(id).await {
        Ok(rec) => apply(app, &rec).await,
        Err(RegistryError::NotFound(_)) => (forget(app, id).await, None),
        Err(e) => return Err(e),
    };
    drop(_turn);
    if change.0 == Change::Removed {
        app.turns.release(id);
    }
    Ok(change)
}

/// Compares every live tenant with the registry; returns how many changed.
pub async fn all(app: &Node) -> Result<usize, RegistryError> {
    let rows = app.registry.list_tenants().await?;
    let mut changed = 0;
    let listed: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    for t in app.tenants.all() {
        if !listed.contains(&*t.id) {
            let (c, _) = tenant(app, &t.id).await?;
            changed += usize::from(c != Change::Unchanged);
        }
    }
    for rec in &rows {
        // The common case costs no query: the live tenant is this row.
        if applied(app, rec) {
            continue;
        }
        let _turn = app.turns.take(&rec.id).await;
        // The row as it is now: a change may have landed since the list.
        let change = match app.registry.get_tenant(&rec.id).await {
            Ok(rec) => apply(app, &rec).await.0,
            Err(RegistryError::NotFound(_)) => forget(app, &rec.id).await,
            Err(e) => return Err(e),
        };
        changed += usize::from(change != Change::Unchanged);
    }
    Ok(changed)
}

/// Whether the live tenant already is `rec` (a row this node cannot use
/// counts as applied: it was logged when it was read first).
fn applied(app: &Node, rec: &TenantRecord) -> bool {
    let Some(t) = app.tenants.get(&rec.id) else {
        return false;
    };
    let Ok(settings) = TenantSettings::from_record(rec, &app.defaults) else {
        return true;
    };
    let source: SourceConfig = serde_json::from_value(rec.source.clone()).unwrap_or_default();
    *t.settings() == settings
        && t.plugin().map(|p| p.version) == rec.active_plugin
        && app.sources.slot(&t.id).config == source
}

/// Removes the live tenant: its sessions close with 4000 and its reader
/// stops — awaited (within the stop grace) under the tenant's turn, so a
/// tenant made again under the same id never has two readers — and then
/// this node's positions for the id are deleted again: the registry deleted
/// them with the row, and the reader stores where it got to as it stops.
async fn forget(app: &Node, id: &str) -> Change {
    match app.tenants.remove(id) {
        Some(t) => {
            t.shut();
            source::stopped(&app.sources, id, true).await;
            if let Err(e) = app.sources.ctx.cursors.forget(id).await {
                tracing::warn!(tenant = %id, error = %e, "the deleted tenant's positions on this node could not be deleted; a tenant made again under its id may start where it stopped");
            }
            app.evict_compiled();
            tracing::info!(tenant = %id, "tenant removed");
            Change::Removed
        }
        None => Change::Unchanged,
    }
}

/// Makes the live tenant match `rec`. A row this node cannot use is logged
/// and leaves the live tenant as it was.
async fn apply(app: &Node, rec: &TenantRecord) -> (Change, Option<Arc<Tenant>>) {
    let settings = match TenantSettings::from_record(rec, &app.defaults) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(tenant = %rec.id, error = %e, "tenant in the registry is invalid; not applied");
            return (Change::Unchanged, app.tenants.get(&rec.id));
        }
    };
    let source: SourceConfig = match serde_json::from_value(rec.source.clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(tenant = %rec.id, error = %e, "stored source is invalid; the tenant ingests over HTTP only");
            SourceConfig::default()
        }
    };
    let (tenant, mut change) = match app.tenants.get(&rec.id) {
        Some(t) => (t, Change::Unchanged),
        None => (Tenant::new(&rec.id, settings.clone()), Change::Created),
    };
    // A load made with another config or sandbox than the tenant's (an
    // activation that raced a change) is loaded again.
    let mut reload = tenant
        .plugin()
        .is_some_and(|p| !p.loaded_with(&settings.config.to_string(), settings.limits.sandbox()));
    if change == Change::Unchanged {
        let old = tenant.settings();
        if *old != settings {
            // The plugin reads its config and runs under the sandbox limits
            // given at load: the active version is loaded again with new ones.
            reload |=
                old.config != settings.config || old.limits.sandbox() != settings.limits.sandbox();
            tenant.update(settings);
            change = Change::Updated;
        }
    }
    let live = tenant.plugin().map(|p| p.version);
    let starting = app
        .plugins
        .starting
        .load(std::sync::atomic::Ordering::Acquire);
    if tenant.plugin_loading() {
        // A background load of the start is running: it activates (or
        // fails) on its own; the next pass after it settles the rest.
        tenant.set_wanted_plugin(rec.active_plugin);
    } else if let (true, true, Some(v)) = (starting, live.is_none(), rec.active_plugin) {
        // At start the server listens first: the tenant says
        // `plugin_loading` until `PluginHost::load_deferred` has loaded it.
        tenant.set_wanted_plugin(Some(v));
        tenant.set_plugin_loading(true);
        app.plugins.deferred.lock().push((tenant.clone(), v));
    } else if live != rec.active_plugin || (reload && live.is_some()) {
        match rec.active_plugin {
            None => {
                tenant.activate(None);
            }
            Some(v) => match app.load_plugin(&tenant, v).await {
                Ok(p) => {
                    tenant.activate(Some(p));
                    app.evict_compiled();
                }
                // Until the active version runs here (the next pass tries
                // again) the tenant refuses connections, publishes and source
                // records with `plugin_unavailable`: it never serves as if it
                // had no plugin. A reload with a new config that fails keeps
                // the running load of the same version.
                Err(e) => {
                    tenant.set_wanted_plugin(Some(v));
                    tracing::error!(tenant = %rec.id, version = v, error = %e, "the active plugin failed to load; the tenant refuses connections and publishes until it loads")
                }
            },
        }
        change = change.max_with(Change::Updated);
    } else {
        // What runs is what the registry wants (a version that failed to
        // load was deactivated since, for one).
        tenant.set_wanted_plugin(rec.active_plugin);
    }
    if change == Change::Created {
        app.tenants.insert(tenant.clone());
        tracing::info!(tenant = %rec.id, "tenant loaded");
    }
    let running = app.sources.slot(&tenant.id).config.clone();
    if change == Change::Created || running != source {
        source::start(&app.sources, &tenant, source, rec.created_at_ms).await;
        change = change.max_with(Change::Updated);
    }
    (change, Some(tenant))
}

impl Change {
    /// `Created` stays created; anything else becomes `to`.
    fn max_with(self, to: Change) -> Change {
        if self == Change::Created {
            self
        } else {
            to
        }
    }
}
