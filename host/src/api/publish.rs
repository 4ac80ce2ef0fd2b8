//! `POST /v1/t/{tenant}/publish`: one message or a batch, with the tenant's key.
//!
//! Invariant: the whole batch is validated (channel names, payload sizes,
//! conflation keys, rate) before any message is published.

use super::{bearer, ApiError};
use crate::app::App;
use crate::fanout::deliver::Fate;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::proto;
use crate::registry::now_ms;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishItem {
    ch: String,
    data: Box<RawValue>,
    #[serde(default)]
    key: Option<String>,
}

pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/t/{tenant}/publish", post(publish))
        .route("/v1/t/{tenant}/ws", get(reconnect))
        .route("/v1/t/{tenant}/sse", get(reconnect))
}

/// A WebSocket or SSE request that arrived on a reused keep-alive connection
/// reached the router instead of the front door: send the client to a fresh
/// connection, where it becomes a lean session.
async fn reconnect(uri: axum::http::Uri) -> Response {
    let location = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    (
        StatusCode::TEMPORARY_REDIRECT,
        [
            (header::LOCATION, location),
            (header::CONNECTION, "close".to_string()),
        ],
    )
        .into_response()
}

async fn publish(
    State(app): State<Arc<App>>,
    Path(tenant_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = app
        .tenants
        .get(&tenant_id)
        .ok_or_else(|| ApiError::NotFound(format!("tenant {tenant_id:?} not found")))?;
    match bearer(&headers) {
        Some(k) if tenant.check_publish_key(k) => {}
        _ => {
            tenant.metrics.publish_rejected("unauthorized");
            return Err(ApiError::Unauthorized);
        }
    }
    // Positions come from one source per tenant: a publish beside an outbox or
    // Kafka would move channels ahead of rows still to come.
    let source = tenant.source.lock().config.kind();
    if source != "http" {
        tenant.metrics.publish_rejected("source_not_http");
        return Err(ApiError::SourceNotHttp(tenant.id.to_string(), source));
    }
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let (items, batch) = match first {
        Some(b'[') => (super::parse_json::<Vec<PublishItem>>(&body)?, true),
        Some(b'{') => (vec![super::parse_json::<PublishItem>(&body)?], false),
        _ => {
            return Err(ApiError::BadRequest(
                "body must be a JSON object or an array of objects".into(),
            ))
        }
    };
    if items.is_empty() {
        return Err(ApiError::BadRequest("batch is empty".into()));
    }
    let limits = tenant.settings().limits.clone();
    for (i, item) in items.iter().enumerate() {
        let at = if batch {
            format!("[{i}].")
        } else {
            String::new()
        };
        proto::validate_channel(&item.ch)
            .map_err(|e| ApiError::BadRequest(format!("{at}ch: {e}")))?;
        let size = item.data.get().len();
        if size > limits.max_message_bytes {
            tenant.metrics.publish_rejected("too_big");
            return Err(ApiError::BadRequest(format!(
                "{at}data: {size} bytes exceeds the limit of {} bytes",
                limits.max_message_bytes
            )));
        }
        if let Some(k) = &item.key {
            if k.is_empty() || k.len() > 128 {
                return Err(ApiError::BadRequest(format!(
                    "{at}key: must be 1-128 bytes"
                )));
            }
        }
    }
    if let Err(wait) = tenant.take_publish_tokens(items.len() as u32) {
        tenant.metrics.publish_rejected("rate_limited");
        return Err(ApiError::RateLimited(wait));
    }
    let now = now_ms() as u64;
    let run = {
        let tenant = tenant.clone();
        move || {
            let records: Vec<SourceRecord<'_>> = items
                .iter()
                .map(|i| SourceRecord {
                    timestamp_ms: now,
                    position: None,
                    key: i.key.as_deref().map(str::as_bytes),
                    value: i.data.get().as_bytes(),
                    channel: Some(&i.ch),
                    headers: &[],
                })
                .collect();
            ingest::ingest(&tenant, &records)
        }
    };
    // Where plugin work runs, and when a batch may be retried: ingest::run_batch.
    let outcomes = ingest::run_batch(&tenant, run)
        .await
        .map_err(|e| ApiError::TransformFailed(e.kind(), e.to_string()))?;
    let mut results: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| match o.fate {
            Fate::Published { seq, delivered } => {
                serde_json::json!({"ch": o.channel, "seq": seq, "delivered": delivered})
            }
            Fate::Held => serde_json::json!({"ch": o.channel, "seq": null, "held": true}),
            // HTTP publishes carry no source position; kept for completeness.
            Fate::Duplicate => serde_json::json!({"ch": o.channel, "seq": null, "duplicate": true}),
        })
        .collect();
    let body = if batch || results.len() != 1 {
        serde_json::json!({ "results": results })
    } else {
        results.pop().unwrap_or_default()
    };
    Ok((StatusCode::OK, Json(body)).into_response())
}
