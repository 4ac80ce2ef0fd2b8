//! `POST /v1/t/{tenant}/publish`: one message or a batch, with the tenant's key.
//!
//! Owns the HTTP side of a publish (the key before the body, the body's
//! deadline and size, the Idempotency-Key header); what a publish does is
//! the publish service's (`publish.rs`).

use super::Api;
use super::{bearer, ApiError};
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;
use std::time::Duration;

pub(super) fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/v1/t/{tenant}/publish", post(publish))
        .route("/v1/t/{tenant}/ws", get(not_a_websocket_upgrade))
        .route(
            "/v1/t/{tenant}/sse",
            get(sse_with_body).options(sse_preflight),
        )
}

/// WebSocket upgrades become sessions in the front door (server/), on any
/// request of a connection; a GET that reaches the router was not one.
async fn not_a_websocket_upgrade(headers: HeaderMap) -> Response {
    let upgrade = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("websocket"));
    if upgrade {
        // Only a request with a body is routed here despite its Upgrade header.
        return ApiError::BadRequest("a WebSocket upgrade request has no body".into())
            .into_response();
    }
    let body = serde_json::json!({"error": {
        "code": "upgrade_required",
        "message": "this endpoint speaks WebSocket: send Upgrade: websocket",
    }});
    (
        StatusCode::UPGRADE_REQUIRED,
        [
            (header::UPGRADE, "websocket"),
            (header::CONNECTION, "Upgrade"),
        ],
        Json(body),
    )
        .into_response()
}

/// SSE GETs become streams in the front door; only one with a body gets here.
/// A browser's CORS preflight for an SSE request that sends headers
/// (`Authorization`, `Last-Event-ID`): allowed origins get the permissions,
/// others a 403 they cannot read.
async fn sse_preflight(
    State(app): State<Arc<Api>>,
    Path(tenant_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let settings = app.tenants.get(&tenant_id).map(|t| t.settings());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let (status, mut cors) = match crate::tenant::cors_headers(settings.as_deref(), origin) {
        Ok(h) => (StatusCode::NO_CONTENT, h),
        Err(h) => (StatusCode::FORBIDDEN, h),
    };
    if status == StatusCode::NO_CONTENT {
        cors.push(("Access-Control-Allow-Methods", "GET".into()));
        cors.push((
            "Access-Control-Allow-Headers",
            "authorization, last-event-id, cache-control".into(),
        ));
        cors.push(("Access-Control-Max-Age", "600".into()));
    }
    let mut resp = status.into_response();
    for (name, value) in cors {
        if let Ok(v) = header::HeaderValue::from_str(&value) {
            resp.headers_mut().insert(name, v);
        }
    }
    resp
}

async fn sse_with_body() -> ApiError {
    ApiError::BadRequest("an SSE request is a GET without a body".into())
}

/// How long a publish body may take to arrive once its key was accepted.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

#[utoipa::path(post, path = "/v1/t/{tenant}/publish", tag = "publish", security(("publishKey" = [])),
    params(("tenant" = String, Path, description = "tenant id"),
        ("Idempotency-Key" = Option<String>, Header, description = "cluster mode (the registry's log) and Kafka tenants: a batch published again under the same key (within the log's retention; on Kafka, a day) is answered as the first and written once; on Kafka, a batch answered 503 in part writes only what the brokers did not acknowledge")),
    request_body = super::doc::PublishBody,
    responses((status = 200, description = "published (or held in the conflation window); one result per item", body = super::doc::PublishAnswer),
        (status = 400, description = "bad body; nothing was published", body = super::doc::ErrorBody),
        (status = 401, description = "unknown tenant or wrong publish key", body = super::doc::ErrorBody),
        (status = 409, description = "the tenant reads from another source, or the Idempotency-Key named a batch of another length or is in flight", body = super::doc::ErrorBody),
        (status = 429, description = "rate limited (Retry-After)", body = super::doc::ErrorBody),
        (status = 502, description = "the tenant's transform failed; the batch was dead-lettered", body = super::doc::ErrorBody),
        (status = 503, description = "plugin loading or busy, or the log/topic did not confirm (Retry-After)", body = super::doc::ErrorBody)))]
pub(super) async fn publish(
    State(app): State<Arc<Api>>,
    Path(tenant_id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    // The key first, the body only then: an unauthenticated request is
    // answered at once and never buffered. An unknown tenant and a wrong key
    // get the same answer, so tenant ids cannot be probed.
    let tenant = app.tenants.get(&tenant_id).ok_or(ApiError::Unauthorized)?;
    match bearer(&parts.headers) {
        Some(k) if tenant.check_publish_key(k) => {}
        _ => {
            tenant.metrics.publish_rejected("unauthorized");
            return Err(ApiError::Unauthorized);
        }
    }
    let body: Bytes = match tokio::time::timeout(
        BODY_TIMEOUT,
        axum::body::to_bytes(body, super::MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return Err(ApiError::BadRequest(format!(
                "body: unreadable or over {} bytes",
                super::MAX_BODY_BYTES
            )))
        }
        Err(_) => return Err(ApiError::BodyTimeout(BODY_TIMEOUT)),
    };
    let key = idempotency_key(&parts.headers)?;
    let published =
        crate::publish::publish(&app.sources, &app.registry, &tenant, &body, key.as_deref())
            .await?;
    Ok((StatusCode::OK, Json(published.body())).into_response())
}

/// The `Idempotency-Key` header: 1 to 128 visible ASCII characters.
fn idempotency_key(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(k) if (1..=128).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(k.to_string()))
        }
        _ => Err(ApiError::BadRequest(
            "Idempotency-Key: 1 to 128 visible ASCII characters".into(),
        )),
    }
}
