//! Plugin versions under `/admin/v1/tenants/{t}/plugins`: upload (validated
//! before it is stored; a large one in the background, polled at
//! `…/uploads/{sha256}`), list, activate (atomic swap; rollback is
//! activating an older version).
//!
//! Invariant: a version is stored only after it compiled, instantiated and
//! answered `describe` under the tenant's sandbox limits; activation swaps
//! the tenant's plugin only after the registry recorded it.

use super::Api;
use super::ApiError;
use crate::clock::now_ms;
use crate::plugin::active::{Activation, ActivePlugin};
use crate::plugin::{sha256_hex, PluginError};
use crate::plugin_host::{LoadError, UploadState, BACKGROUND_UPLOAD_BYTES};
use crate::registry::PluginRecord;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) fn routes() -> Router<Arc<Api>> {
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
        .route("/tenants/{tenant}/plugins/rollback", post(rollback))
        .route("/tenants/{tenant}/uploads/{sha256}", get(upload_status))
}

/// No plugin from now on (a plugin that does not load can be set aside:
/// a `public` tenant then serves without one, a `plugin` one refuses).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/plugins/deactivate", tag = "plugins", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, description = "no plugin from now on", body = super::doc::Activation), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn deactivate(
    State(app): State<Arc<Api>>,
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

#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/plugins", tag = "plugins", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    request_body(content = Vec<u8>, content_type = "application/wasm", description = "a wasm component (herald:plugin@0.1.0 or @0.2.0)"),
    responses((status = 201, description = "stored (compiled, not active)", body = super::doc::PluginVersionView),
        (status = 202, description = "over 1 MiB: compiling in the background; poll status_url", body = super::doc::UploadStatusView),
        (status = 400, description = "bad input; nothing changed", body = super::doc::ErrorBody), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody),
        (status = 422, description = "not a component Herald can run, or its hooks failed a check", body = super::doc::ErrorBody)))]
pub(super) async fn upload(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = super::live_tenant(&app, &id)?;
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
    if body.len() <= BACKGROUND_UPLOAD_BYTES {
        let answer = store_upload(&app, &id, body).await?;
        return Ok((StatusCode::CREATED, Json(answer)).into_response());
    }
    let sha256 = sha256_hex(&body);
    let status_url = format!("/admin/v1/tenants/{id}/uploads/{sha256}");
    let accepted = |since_ms: i64| {
        let body = json!({"status": "compiling", "sha256": sha256, "since_ms": since_ms, "status_url": status_url});
        let mut r = (StatusCode::ACCEPTED, Json(body)).into_response();
        if let Ok(v) = axum::http::HeaderValue::from_str(&status_url) {
            r.headers_mut().insert(axum::http::header::LOCATION, v);
        }
        r
    };
    if let Some(UploadState::Compiling { since_ms }) = app.plugins.uploads.begin(&id, &sha256) {
        // The same bytes are compiling already: the same answer.
        return Ok(accepted(since_ms));
    }
    let since = now_ms();
    let (task_app, task_id, task_sha) = (app.clone(), id.clone(), sha256.clone());
    app.tracker.spawn(async move {
        let state = match store_upload(&task_app, &task_id, body).await {
            Ok(answer) => UploadState::Stored(answer),
            Err(e) => {
                tracing::warn!(tenant = %task_id, sha256 = %task_sha, error = %e, "background plugin upload refused");
                UploadState::Failed {
                    code: e.code(),
                    message: e.to_string(),
                    at_ms: now_ms(),
                }
            }
        };
        task_app.plugins.uploads.finish(&task_id, &task_sha, state);
    });
    Ok(accepted(since))
}

/// `GET …/uploads/{sha256}`: a background upload's state. 200 with
/// `status` "compiling", "stored" (and the upload's answer: version, hooks…)
/// or "failed" (and the error); 404 if this node has none.
#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/uploads/{sha256}", tag = "plugins", security(("admin" = [])),
    params(("tenant" = String, Path, description = "tenant id"), ("sha256" = String, Path, description = "the upload's sha256 (hex)")),
    responses((status = 200, body = super::doc::UploadAnswer), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody),
        (status = 404, description = "no such upload", body = super::doc::ErrorBody)))]
pub(super) async fn upload_status(
    State(app): State<Arc<Api>>,
    Path((id, sha)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    match app.plugins.uploads.get(&id, &sha) {
        None => Err(ApiError::NotFound(format!(
            "no upload of {sha} for tenant {id:?} on this node in the last hour"
        ))),
        Some(UploadState::Compiling { since_ms }) => Ok(Json(
            json!({"status": "compiling", "sha256": sha, "since_ms": since_ms}),
        )),
        Some(UploadState::Stored(mut answer)) => {
            answer["status"] = json!("stored");
            Ok(Json(answer))
        }
        Some(UploadState::Failed { code, message, .. }) => Ok(Json(
            json!({"status": "failed", "sha256": sha, "error": {"code": code, "message": message}}),
        )),
    }
}

/// Compiles, loads and checks a component under the tenant's sandbox, then
/// stores it as the tenant's next version; the upload's answer.
async fn store_upload(app: &Arc<Api>, id: &str, body: Bytes) -> Result<Value, ApiError> {
    let tenant = super::live_tenant(app, id)?;
    let settings = tenant.settings();
    let sha256 = sha256_hex(&body);
    let activation = Activation {
        version: 0,
        sha256: sha256.clone(),
        tenant: tenant.id.clone(),
        config: settings.config.to_string().into(),
        limits: settings.limits.sandbox(),
    };
    let runtime = app.plugins.runtime.clone();
    let bytes = body.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let component = runtime.compile(&bytes)?;
        ActivePlugin::load(&runtime, &component, activation)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("validation thread failed: {e}")))?
    .map_err(plugin_error)?;
    let rec = PluginRecord {
        tenant_id: id.to_string(),
        version: 0,
        sha256: sha256.clone(),
        size_bytes: body.len() as i64,
        name: checked.info.name.clone(),
        plugin_version: checked.info.version.clone(),
        hooks: serde_json::to_value(checked.info.hooks).unwrap_or(Value::Null),
        created_at_ms: now_ms(),
    };
    let version = app.registry.add_plugin(&rec, &body).await?;
    let (contract, encoding) = (checked.info.contract, checked.info.encoding);
    // Compiled and on disk; it stays compiled in memory as the tenant's
    // newest upload (its activation usually follows), older ones not.
    drop(checked);
    tenant.plugin_uploaded(sha256.clone());
    app.evict_compiled();
    tracing::info!(tenant = %id, version, %sha256, name = %rec.name, "plugin version uploaded");
    Ok(json!({
        "version": version,
        "sha256": sha256,
        "size_bytes": rec.size_bytes,
        "name": rec.name,
        "plugin_version": rec.plugin_version,
        "hooks": rec.hooks,
        "contract": contract,
        "transform_encoding": rec.hooks["transform"].as_bool().unwrap_or(false).then_some(encoding),
        "created_at_ms": rec.created_at_ms,
    }))
}

#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/plugins", tag = "plugins", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, body = super::doc::PluginList), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn list(
    State(app): State<Arc<Api>>,
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
                // Compiled in this node's memory (else on disk, or not yet).
                "compiled": app.plugins.runtime.is_compiled(&p.sha256),
            })
        })
        .collect();
    Ok(Json(
        json!({ "active": tenant.active_plugin, "versions": versions }),
    ))
}

/// Activates the version that was active before the current one (a second
/// rollback undoes the first).
#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/plugins/rollback", tag = "plugins", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, description = "the version active before the current one is active again", body = super::doc::Activation), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody),
        (status = 409, description = "no previous version", body = super::doc::ErrorBody)))]
pub(super) async fn rollback(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let Some(version) = app.registry.previous_plugin(&id).await? else {
        return Err(ApiError::Conflict(format!(
            "tenant {id:?} has no previous plugin version to roll back to"
        )));
    };
    activate(State(app), Path((id, version))).await
}

#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/plugins/{version}/activate", tag = "plugins", security(("admin" = [])),
    params(("tenant" = String, Path, description = "tenant id"), ("version" = i64, Path, description = "a stored version")),
    responses((status = 200, body = super::doc::Activation), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody),
        (status = 404, description = "no such tenant or version", body = super::doc::ErrorBody),
        (status = 422, description = "the version does not load here", body = super::doc::ErrorBody)))]
pub(super) async fn activate(
    State(app): State<Arc<Api>>,
    Path((id, version)): Path<(String, i64)>,
) -> Result<Json<Value>, ApiError> {
    let tenant = super::live_tenant(&app, &id)?;
    // Loaded first: a version that does not load here is refused unrecorded.
    let loaded = app.load_plugin(&tenant, version).await?;
    let info = loaded.info.clone();
    // Then recorded and applied as every change is (`reconcile`, under the
    // tenant's turn): it runs with the config the tenant has then, even when
    // a change landed while it was checked. The checked load is what it
    // applies unless such a change landed (`PluginHost::load`).
    app.plugins.stage(&id, loaded);
    let recorded = app.registry.set_active_plugin(&id, Some(version)).await;
    let applied = match recorded {
        Ok(()) => crate::reconcile::tenant(&app, &id).await,
        Err(e) => Err(e),
    };
    app.plugins.unstage(&id);
    let (_, tenant) = applied?;
    if tenant.and_then(|t| t.plugin()).map(|p| p.version) != Some(version) {
        return Err(ApiError::Unprocessable(format!(
            "version {version} is recorded as active but did not load with the tenant's current config; the tenant refuses connections and publishes until it does (see the log)"
        )));
    }
    let previous = app.registry.previous_plugin(&id).await?;
    tracing::info!(tenant = %id, version, ?previous, "plugin version activated");
    Ok(Json(
        json!({ "active": version, "previous": previous, "name": info.name, "hooks": info.hooks, "contract": info.contract }),
    ))
}
