//! Plugin versions under `/admin/v1/tenants/{t}/plugins`: upload (validated
//! before it is stored), list, activate (atomic swap; rollback is activating
//! an older version).
//!
//! Invariant: a version is stored only after it compiled, instantiated and
//! answered `describe` under the tenant's sandbox limits; activation swaps
//! the tenant's plugin only after the registry recorded it.

use super::ApiError;
use crate::app::{App, LoadError};
use crate::plugin::active::{Activation, ActivePlugin};
use crate::plugin::{sha256_hex, PluginError};
use crate::registry::{now_ms, PluginRecord};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(
            "/tenants/{tenant}/plugins",
            get(list)
                .post(upload)
                .layer(DefaultBodyLimit::max(256 << 20)),
        )
        .route(
            "/tenants/{tenant}/plugins/{version}/activate",
            post(activate),
        )
        .route("/tenants/{tenant}/plugins/deactivate", post(deactivate))
}

/// No plugin from now on (a plugin that does not load can be set aside:
/// a `public` tenant then serves without one, a `plugin` one refuses).
async fn deactivate(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    app.registry.set_active_plugin(&id, None).await?;
    crate::reconcile::tenant(&app, &id).await?;
    tracing::info!(tenant = %id, "plugin deactivated");
    Ok(Json(json!({ "active": null })))
}

fn plugin_error(e: PluginError) -> ApiError {
    ApiError::Unprocessable(format!("{} ({})", e, e.kind()))
}

impl From<LoadError> for ApiError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Registry(r) => r.into(),
            LoadError::Plugin(p) => plugin_error(p),
        }
    }
}

async fn upload(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = app
        .tenants
        .get(&id)
        .ok_or_else(|| ApiError::NotFound(format!("tenant {id:?} not found")))?;
    let settings = tenant.settings();
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "body must be the component's bytes".into(),
        ));
    }
    if body.len() > settings.limits.plugin_max_bytes {
        return Err(ApiError::BadRequest(format!(
            "component of {} bytes exceeds limits.plugin_max_bytes ({})",
            body.len(),
            settings.limits.plugin_max_bytes
        )));
    }
    let sha256 = sha256_hex(&body);
    let activation = Activation {
        version: 0,
        sha256: sha256.clone(),
        tenant: tenant.id.clone(),
        config: settings.config.to_string().into(),
        limits: settings.limits.sandbox(),
    };
    let runtime = app.plugins.clone();
    let bytes = body.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let component = runtime.compile(&bytes)?;
        ActivePlugin::load(&runtime, &component, activation)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("validation thread failed: {e}")))?
    .map_err(plugin_error)?;
    let rec = PluginRecord {
        tenant_id: id.clone(),
        version: 0,
        sha256: sha256.clone(),
        size_bytes: body.len() as i64,
        name: checked.info.name.clone(),
        plugin_version: checked.info.version.clone(),
        hooks: serde_json::to_value(checked.info.hooks).unwrap_or(Value::Null),
        created_at_ms: now_ms(),
    };
    let version = app.registry.add_plugin(&rec, &body).await?;
    tracing::info!(tenant = %id, version, %sha256, name = %rec.name, "plugin version uploaded");
    let body = json!({
        "version": version,
        "sha256": sha256,
        "size_bytes": rec.size_bytes,
        "name": rec.name,
        "plugin_version": rec.plugin_version,
        "hooks": rec.hooks,
        "contract": checked.info.contract,
        "transform_encoding": checked.info.hooks.transform.then_some(checked.info.encoding),
    });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn list(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.registry.get_tenant(&id).await?;
    let versions: Vec<Value> = app
        .registry
        .list_plugins(&id)
        .await?
        .into_iter()
        .map(|p| {
            json!({
                "version": p.version,
                "sha256": p.sha256,
                "size_bytes": p.size_bytes,
                "name": p.name,
                "plugin_version": p.plugin_version,
                "hooks": p.hooks,
                "created_at_ms": p.created_at_ms,
                "active": tenant.active_plugin == Some(p.version),
            })
        })
        .collect();
    Ok(Json(
        json!({ "active": tenant.active_plugin, "versions": versions }),
    ))
}

async fn activate(
    State(app): State<Arc<App>>,
    Path((id, version)): Path<(String, i64)>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app
        .tenants
        .get(&id)
        .ok_or_else(|| ApiError::NotFound(format!("tenant {id:?} not found")))?;
    // Loaded first: a version that does not load here is refused unrecorded.
    let loaded = app.load_plugin(&tenant, version).await?;
    let info = loaded.info.clone();
    let previous = {
        let _turn = app.turns.take(&id).await;
        app.registry.set_active_plugin(&id, Some(version)).await?;
        tenant.activate(Some(loaded)).map(|p| p.version)
    };
    tracing::info!(tenant = %id, version, ?previous, "plugin version activated");
    Ok(Json(
        json!({ "active": version, "previous": previous, "name": info.name, "hooks": info.hooks, "contract": info.contract }),
    ))
}
