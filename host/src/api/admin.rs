//! Admin REST under `/admin/v1` (bearer admin token, checked by the router).
//!
//! Invariant: the registry is written first and the live tenant changed only
//! after the write succeeded, so a failed write changes nothing.

use super::Api;
use super::{parse_json, ApiError};
use crate::clock::now_ms;
use crate::node::Node;
use crate::proto;
use crate::reconcile;
use crate::registry::TenantRecord;
use crate::secret::{hex, key_digest, new_secret};
use crate::source::SourceConfig;
use crate::tenant::{Access, LimitOverrides, Tenant, TenantLimits, TenantSettings};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/tenants", post(create).get(list))
        .route("/tenants/{tenant}", get(show).patch(update).delete(remove))
        .route("/tenants/{tenant}/publish-key", post(rotate_key))
        .route("/tenants/{tenant}/source", get(show_source).put(set_source))
        .route("/nodes", get(nodes))
}

/// The cluster view: every node that has reported to the registry, with
/// what it runs; `alive` while its heartbeat is recent.
#[utoipa::path(get, path = "/admin/v1/nodes", tag = "tenants", security(("admin" = [])),
    responses((status = 200, description = "every node that reported to the registry", body = super::doc::NodeList), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody)))]
pub(super) async fn nodes(State(app): State<Arc<Api>>) -> Result<Json<Value>, ApiError> {
    let now = now_ms();
    let stale = 3 * crate::cluster::HEARTBEAT_EVERY.as_millis() as i64;
    let nodes: Vec<Value> = app
        .registry
        .list_nodes()
        .await?
        .into_iter()
        .map(|n| {
            json!({
                "id": n.id,
                "version": n.version,
                "address": n.address,
                "started_at_ms": n.started_at_ms,
                "last_heartbeat_ms": n.heartbeat_at_ms,
                "alive": now - n.heartbeat_at_ms <= stale,
                "connections": n.connections,
                "plugins": n.plugins,
            })
        })
        .collect();
    Ok(Json(json!({ "self": app.node_id, "nodes": nodes })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateTenant {
    /// 1-64 characters of a-z 0-9 _ -.
    id: String,
    #[serde(default)]
    #[schema(value_type = String, example = "public")]
    access: Access,
    /// The plugin's config: any JSON object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    config: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<crate::tenant::LimitOverrides>)]
    limits: Option<Value>,
    /// `{"window_ms": …, "channels": […]}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    conflation: Option<Value>,
    /// Browser origins its clients may come from; absent or null: any.
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>)]
    allowed_origins: Option<Value>,
}

/// A field that may be set to `null` (`Some(Null)`), not only left out (`None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PatchTenant {
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    access: Option<Access>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    config: Option<Value>,
    /// JSON merge patch over the stored overrides: `null` removes one.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    limits: Option<Value>,
    /// Replaces the conflation window (`{}` turns it off).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    conflation: Option<Value>,
    /// Replaces the allowed origins; `null` allows any again.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    allowed_origins: Option<Value>,
}

fn view(rec: &TenantRecord, tenant: Option<&Tenant>) -> Value {
    let mut v = json!({
        "id": rec.id,
        "access": rec.access,
        "config": rec.config,
        "limits": rec.limits,
        "conflation": rec.conflation,
        "allowed_origins": rec.allowed_origins,
        "active_plugin": rec.active_plugin,
        "created_at_ms": rec.created_at_ms,
        "updated_at_ms": rec.updated_at_ms,
    });
    if let Some(t) = tenant {
        let s = t.settings();
        v["effective_limits"] = serde_json::to_value(&s.limits).unwrap_or(Value::Null);
        v["connections"] = json!(t.connections());
        v["channels"] = json!(t.hub.channel_count());
    }
    v
}

fn check_config(config: &Value) -> Result<(), ApiError> {
    if !config.is_object() {
        return Err(ApiError::BadRequest("config: must be a JSON object".into()));
    }
    Ok(())
}

fn check_limits(app: &Node, limits: &Value) -> Result<(), ApiError> {
    let o: LimitOverrides = serde_json::from_value(limits.clone())
        .map_err(|e| ApiError::BadRequest(format!("limits: {e}")))?;
    o.apply(&app.defaults).map_err(ApiError::BadRequest)?;
    Ok(())
}

/// A create body as the tenant row it would store, checked as the live
/// tenant will be (`TenantSettings::from_record`), with the publish key's digest.
/// Pure: fuzzed in `crate::fuzz`.
pub fn record_from_create(
    defaults: &TenantLimits,
    body: &[u8],
    publish_key_sha256: String,
    now: i64,
) -> Result<TenantRecord, ApiError> {
    let req: CreateTenant = parse_json(body)?;
    if !proto::validate_tenant_id(&req.id) {
        return Err(ApiError::BadRequest(
            "id: must be 1-64 characters of a-z 0-9 _ -".into(),
        ));
    }
    let config_v = req.config.unwrap_or_else(|| json!({}));
    check_config(&config_v)?;
    let limits = req.limits.unwrap_or_else(|| json!({}));
    let o: LimitOverrides = serde_json::from_value(limits.clone())
        .map_err(|e| ApiError::BadRequest(format!("limits: {e}")))?;
    o.apply(defaults).map_err(ApiError::BadRequest)?;
    let rec = TenantRecord {
        id: req.id,
        access: req.access.as_str().into(),
        config: config_v,
        limits,
        publish_key_sha256,
        created_at_ms: now,
        updated_at_ms: now,
        active_plugin: None,
        conflation: req.conflation.unwrap_or_else(|| json!({})),
        source: json!({"kind": "http"}),
        allowed_origins: req.allowed_origins.unwrap_or(Value::Null),
    };
    TenantSettings::from_record(&rec, defaults).map_err(ApiError::BadRequest)?;
    Ok(rec)
}

#[utoipa::path(post, path = "/admin/v1/tenants", tag = "tenants", security(("admin" = [])),
    request_body = CreateTenant,
    responses((status = 201, description = "created; the publish key is shown once", body = super::doc::TenantView), (status = 400, description = "bad input; nothing changed", body = super::doc::ErrorBody), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody),
        (status = 409, description = "a tenant with this id exists", body = super::doc::ErrorBody)))]
pub(super) async fn create(State(app): State<Arc<Api>>, body: Bytes) -> Result<Response, ApiError> {
    let key = new_secret("pk_");
    let rec = record_from_create(&app.defaults, &body, hex(&key_digest(&key)), now_ms())?;
    app.registry.create_tenant(&rec).await?;
    let (_, tenant) = reconcile::tenant(&app, &rec.id).await?;
    tracing::info!(tenant = %rec.id, access = %rec.access, "tenant created");
    let mut body = view(&rec, tenant.as_deref());
    body["publish_key"] = json!(key);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[utoipa::path(get, path = "/admin/v1/tenants", tag = "tenants", security(("admin" = [])),
    responses((status = 200, description = "every tenant", body = super::doc::TenantList), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody)))]
pub(super) async fn list(State(app): State<Arc<Api>>) -> Result<Json<Value>, ApiError> {
    let rows = app.registry.list_tenants().await?;
    let items: Vec<Value> = rows
        .iter()
        .map(|r| view(r, app.tenants.get(&r.id).as_deref()))
        .collect();
    Ok(Json(json!({ "tenants": items })))
}

#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}", tag = "tenants", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, body = super::doc::TenantView), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn show(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let rec = app.registry.get_tenant(&id).await?;
    Ok(Json(view(&rec, app.tenants.get(&id).as_deref())))
}

/// Reads the tenant's row, applies `change` and writes it back unless
/// another write landed in between, in which case it reads the new row and
/// applies `change` again: concurrent changes of different fields all hold.
async fn rewrite(
    app: &Node,
    id: &str,
    change: impl Fn(&mut TenantRecord) -> Result<(), ApiError>,
) -> Result<TenantRecord, ApiError> {
    for _ in 0..32 {
        let mut rec = app.registry.get_tenant(id).await?;
        let seen = rec.updated_at_ms;
        change(&mut rec)?;
        rec.updated_at_ms = now_ms().max(seen + 1);
        TenantSettings::from_record(&rec, &app.defaults).map_err(ApiError::BadRequest)?;
        if app.registry.update_tenant_if(&rec, seen).await? {
            return Ok(rec);
        }
    }
    Err(ApiError::Conflict(format!(
        "tenant {id:?} kept changing under this change; try again"
    )))
}

fn merge_patch(target: &mut Value, patch: &Value) {
    if let (Some(t), Some(p)) = (target.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

#[utoipa::path(patch, path = "/admin/v1/tenants/{tenant}", tag = "tenants", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    request_body = PatchTenant,
    responses((status = 200, body = super::doc::TenantView), (status = 400, description = "bad input; nothing changed", body = super::doc::ErrorBody), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody), (status = 409, description = "the tenant kept changing under this change (32 tries); nothing changed", body = super::doc::ErrorBody)))]
pub(super) async fn update(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: PatchTenant = parse_json(&body)?;
    let rec = rewrite(&app, &id, |rec| {
        if let Some(a) = req.access {
            rec.access = a.as_str().into();
        }
        if let Some(c) = &req.config {
            check_config(c)?;
            rec.config = c.clone();
        }
        if let Some(c) = &req.conflation {
            rec.conflation = c.clone();
        }
        if let Some(o) = &req.allowed_origins {
            rec.allowed_origins = o.clone();
        }
        if let Some(l) = &req.limits {
            if !l.is_object() {
                return Err(ApiError::BadRequest("limits: must be a JSON object".into()));
            }
            merge_patch(&mut rec.limits, l);
            check_limits(&app, &rec.limits)?;
        }
        Ok(())
    })
    .await?;
    // Applied as every other node applies it (a changed config or sandbox
    // reloads the active plugin with the new ones).
    let (_, tenant) = reconcile::tenant(&app, &id).await?;
    tracing::info!(tenant = %id, "tenant updated");
    Ok(Json(view(&rec, tenant.as_deref())))
}

#[utoipa::path(delete, path = "/admin/v1/tenants/{tenant}", tag = "tenants", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 204, description = "deleted; its sessions are closed (4000)"), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn remove(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.registry.delete_tenant(&id).await?;
    reconcile::tenant(&app, &id).await?;
    tracing::info!(tenant = %id, "tenant deleted");
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/publish-key", tag = "tenants", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, description = "a new publish key (shown once); the old one stops working", body = super::doc::RotatedKey), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn rotate_key(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let key = new_secret("pk_");
    rewrite(&app, &id, |rec| {
        rec.publish_key_sha256 = hex(&key_digest(&key));
        Ok(())
    })
    .await?;
    reconcile::tenant(&app, &id).await?;
    Ok(Json(json!({ "id": id, "publish_key": key })))
}

fn source_view(app: &Node, t: &Tenant) -> Value {
    let (config, health) = app.sources.view(t);
    let health = serde_json::to_value(&health).unwrap_or(Value::Null);
    json!({ "source": config.redacted(), "health": health })
}

#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/source", tag = "tenants", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, body = super::doc::SourceView), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn show_source(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let t = super::live_tenant(&app, &id)?;
    Ok(Json(source_view(&app, &t)))
}

/// Checks the new source (reachable, table shape), stores it, then swaps the
/// running source: the old one stops before the new one starts.
#[utoipa::path(put, path = "/admin/v1/tenants/{tenant}/source", tag = "tenants", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    request_body = crate::source::SourceConfig,
    responses((status = 200, description = "the source in force; the old reader stopped before the new one started", body = super::doc::SourceView), (status = 400, description = "bad input; nothing changed", body = super::doc::ErrorBody), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody),
        (status = 422, description = "the source cannot be used (unreachable, wrong table shape, …)", body = super::doc::ErrorBody)))]
pub(super) async fn set_source(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let config: SourceConfig = parse_json(&body)?;
    // A tenant of the registry: the checks below take a while.
    app.registry.get_tenant(&id).await?;
    match &config {
        SourceConfig::Http {
            stall_after_ms: Some(ms),
        } => {
            if app.cluster.is_some() {
                return Err(ApiError::Unprocessable(
                    "stall_after_ms is for a node of its own; in cluster mode the shared log's health is the source's".into(),
                ));
            }
            if !(100..=86_400_000).contains(ms) {
                return Err(ApiError::BadRequest(
                    "stall_after_ms must be 100 to 86400000 (one day)".into(),
                ));
            }
        }
        SourceConfig::Http { .. } => {}
        SourceConfig::PostgresOutbox {
            database_url,
            table,
            ..
        } => crate::source::outbox::check(database_url, table)
            .await
            .map_err(|e| ApiError::BadRequest(e.to_string()))?,
        SourceConfig::Kafka {
            brokers,
            topics,
            channel_from,
            options,
            ..
        } => {
            crate::source::kafka::ChannelFrom::parse(channel_from.as_deref())
                .map_err(ApiError::BadRequest)?;
            crate::source::kafka::check(brokers, topics, options)
                .await
                .map_err(ApiError::BadRequest)?
        }
    }
    app.registry
        .set_source(&id, &serde_json::to_value(&config).unwrap_or_default())
        .await?;
    let (_, t) = reconcile::tenant(&app, &id).await?;
    let t = t.ok_or_else(|| ApiError::NotFound(format!("tenant {id:?} not found")))?;
    tracing::info!(tenant = %id, kind = app.sources.slot(&id).config.kind(), "source changed");
    Ok(Json(source_view(&app, &t)))
}
