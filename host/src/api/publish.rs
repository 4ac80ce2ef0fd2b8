//! `POST /v1/t/{tenant}/publish`: one message or a batch, with the tenant's key.
//!
//! Invariant: the whole batch is validated (channel names, payload sizes,
//! conflation keys, rate) before any message is published.

use super::{bearer, ApiError};
use crate::app::App;
use crate::clock::now_ms;
use crate::fanout::deliver::Fate;
use crate::fanout::position::MESSAGES_PER_RECORD;
use crate::ingest;
use crate::plugin::batch::SourceRecord;
use crate::plugin::PluginError;
use crate::proto;
use crate::registry::log::Publication;
use crate::registry::log::{self, SharedLog};
use crate::source::kafka::produce::{ProduceError, Publisher};
use crate::tenant::Tenant;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::Duration;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishItem {
    /// The channel (`[A-Za-z0-9_.:@-]{1,128}`); may be left out when the
    /// tenant's transform picks the channel.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.:@-]{1,128}$")]
    ch: Option<String>,
    /// Any JSON value; delivered as written.
    #[schema(value_type = Object)]
    data: Box<RawValue>,
    /// Conflation key, 1-128 bytes.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128)]
    key: Option<String>,
}

pub(super) fn routes() -> Router<Arc<App>> {
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
    State(app): State<Arc<App>>,
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

/// Why a publish body was refused (the message names the item and field).
#[derive(Debug, thiserror::Error)]
pub enum ItemsError {
    #[error("{0}")]
    Bad(String),
    #[error("{0}")]
    TooBig(String),
}

/// Parses and checks a publish body: one message object or a non-empty
/// array of them, each with a valid channel (or none, when
/// `channel_required` is false: the tenant's transform picks it), a payload
/// within `max_message_bytes` and a key of 1-128 bytes. Returns the items
/// and whether the body was a batch. Pure: fuzzed in `crate::fuzz`.
pub fn read_items(
    body: &[u8],
    max_message_bytes: usize,
    channel_required: bool,
) -> Result<(Vec<PublishItem>, bool), ItemsError> {
    let bad = |e: ApiError| ItemsError::Bad(e.to_string());
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let (items, batch) = match first {
        Some(b'[') => (
            super::parse_json::<Vec<PublishItem>>(body).map_err(bad)?,
            true,
        ),
        Some(b'{') => (
            vec![super::parse_json::<PublishItem>(body).map_err(bad)?],
            false,
        ),
        _ => {
            return Err(ItemsError::Bad(
                "body must be a JSON object or an array of objects".into(),
            ))
        }
    };
    if items.is_empty() {
        return Err(ItemsError::Bad("batch is empty".into()));
    }
    for (i, item) in items.iter().enumerate() {
        let at = if batch {
            format!("[{i}].")
        } else {
            String::new()
        };
        match &item.ch {
            Some(ch) => {
                proto::validate_channel(ch).map_err(|e| ItemsError::Bad(format!("{at}ch: {e}")))?
            }
            None if channel_required => {
                return Err(ItemsError::Bad(format!(
                    "{at}ch: required (the tenant has no transform to pick a channel)"
                )))
            }
            None => {}
        }
        let size = item.data.get().len();
        if size > max_message_bytes {
            return Err(ItemsError::TooBig(format!(
                "{at}data: {size} bytes exceeds the limit of {max_message_bytes} bytes"
            )));
        }
        if let Some(k) = &item.key {
            if k.is_empty() || k.len() > 128 {
                return Err(ItemsError::Bad(format!("{at}key: must be 1-128 bytes")));
            }
        }
    }
    Ok((items, batch))
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
    State(app): State<Arc<App>>,
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
    publish_body(&app, &tenant, &body, key.as_deref()).await
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

/// Publishes a body whose key was accepted: the one path of HTTP publish
/// (and of the demo's built-in publisher), whatever the tenant's source.
pub(crate) async fn publish_body(
    app: &App,
    tenant: &Arc<Tenant>,
    body: &[u8],
    key: Option<&str>,
) -> Result<Response, ApiError> {
    if let Some(version) = tenant.plugin_unavailable() {
        if tenant.plugin_loading() {
            tenant.metrics.publish_rejected("plugin_loading");
            return Err(ApiError::PluginLoading(version));
        }
        tenant.metrics.publish_rejected("plugin_unavailable");
        return Err(ApiError::PluginUnavailable(version));
    }
    // Positions come from one source per tenant: a publish beside an outbox
    // would move channels ahead of rows still to come; into Kafka it goes
    // through the topic.
    let (source, kafka) = app.sources.publish_route(&tenant.id);
    if source != "http" && kafka.is_none() {
        tenant.metrics.publish_rejected("source_not_http");
        return Err(ApiError::SourceNotHttp(tenant.id.to_string(), source));
    }
    let transform = tenant.plugin().is_some_and(|p| p.info.hooks.transform);
    let (items, batch) = read_items(body, tenant.settings().limits.max_message_bytes, !transform)
        .inspect_err(|e| {
            if matches!(e, ItemsError::TooBig(_)) {
                tenant.metrics.publish_rejected("too_big");
            }
        })
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if let Err(wait) = tenant.take_publish_tokens(items.len() as u32) {
        tenant.metrics.publish_rejected("rate_limited");
        return Err(ApiError::RateLimited(wait));
    }
    if let Some(kafka) = kafka {
        return produced(app, &kafka, tenant, &items, batch, key).await;
    }
    if let Some(cluster) = &app.cluster {
        return logged(&cluster.log, tenant, &items, batch, key).await;
    }
    let now = now_ms() as u64;
    // The publisher is heard: a source stalled by its silence is live
    // again, told before the message it brings.
    crate::source::http_published(&app.sources, tenant, items.len());
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
                    channel: i.ch.as_deref(),
                    headers: &[],
                })
                .collect();
            ingest::ingest(&tenant, &records)
        }
    };
    // Where plugin work runs, and when a batch may be retried: ingest::run_batch.
    let outcomes = ingest::run_batch(tenant, crate::plugin::active::Patience::Bounded, run)
        .await
        .map_err(|e| match e {
            PluginError::Busy(_) => {
                tenant.metrics.publish_rejected("plugin_busy");
                ApiError::PluginBusy
            }
            e => ApiError::TransformFailed(e.kind(), e.to_string()),
        })?;
    let results: Vec<serde_json::Value> = outcomes
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
    Ok(answer(results, batch))
}

/// How long a publish on a Kafka tenant waits for this node's reader to know
/// where it starts (a source just set, a node starting).
const READER_START_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A Kafka tenant: the batch is produced into its topic, answered once the
/// brokers acknowledged every record; every node delivers it from there at
/// offset + 1.
async fn produced(
    app: &App,
    kafka: &Publisher,
    tenant: &Tenant,
    items: &[PublishItem],
    batch: bool,
    key: Option<&str>,
) -> Result<Response, ApiError> {
    // Not before this node's reader knows where it starts: a record produced
    // earlier could fall before a `latest` it resolves later, and reach no
    // subscriber here.
    let deadline = tokio::time::Instant::now() + READER_START_WAIT;
    while !tenant.hub.started() {
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::SourceUnavailable(
                "Kafka topic",
                "this node's reader has not started yet; try again".into(),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let written = match key {
        None => kafka
            .publish(&outgoing(items))
            .await
            .map_err(produce_error)?,
        Some(key) => produced_once(app, kafka, tenant, items, key).await?,
    };
    let placed = written.iter().map(|w| {
        let at = serde_json::json!({"partition": w.partition, "offset": w.offset});
        (w.offset as u64 + 1, at)
    });
    Ok(answer(positioned(tenant, items, placed), batch))
}

fn produce_error(e: ProduceError) -> ApiError {
    match e {
        ProduceError::Bad(m) => ApiError::BadRequest(m),
        ProduceError::Unavailable(m) => ApiError::SourceUnavailable("Kafka topic", m),
    }
}

/// How long a keyed publish holds its key: past the producer's delivery
/// timeout, so an attempt still waiting for the brokers is never joined by
/// its retry; a process that died holding a key frees it after this.
const RECEIPT_HOLD_MS: i64 = 30_000;
/// How long a key is remembered: a retry comes within a day.
const RECEIPT_KEEP_MS: i64 = 24 * 3600 * 1000;

/// A keyed batch into a Kafka tenant's topic: only the items that no
/// earlier attempt under `key` got acknowledged are produced, and what the
/// brokers acknowledged is recorded before answering, so a retry after a
/// lost answer or a `503` writes nothing twice. A record acknowledged in the
/// instant the process died is not in the receipt and would be written
/// again (the brokers' idempotence does not span producers).
async fn produced_once(
    app: &App,
    kafka: &Publisher,
    tenant: &Tenant,
    items: &[PublishItem],
    key: &str,
) -> Result<Vec<crate::source::kafka::produce::Written>, ApiError> {
    use crate::registry::Claim;
    use crate::source::kafka::produce::Written;
    let out = outgoing(items);
    // Nothing is claimed for a batch that cannot be produced.
    kafka.check(&out).map_err(produce_error)?;
    let empty = serde_json::to_string(&vec![None::<Written>; items.len()]).unwrap_or_default();
    let unavailable = |e: crate::registry::RegistryError| {
        ApiError::SourceUnavailable("Kafka topic", format!("Idempotency-Key: {e}"))
    };
    let claimed = app
        .registry
        .claim_receipt(&tenant.id, key, &empty, RECEIPT_HOLD_MS, RECEIPT_KEEP_MS)
        .await
        .map_err(unavailable)?;
    let stored = match claimed {
        Claim::InFlight => {
            return Err(ApiError::Conflict(
                "a publish under this Idempotency-Key is still in flight; try again".into(),
            ))
        }
        Claim::Ours(stored) => stored,
    };
    let mut slots: Vec<Option<Written>> = stored
        .as_deref()
        .map_or(Ok(vec![None; items.len()]), serde_json::from_str)
        .unwrap_or_default();
    if slots.len() != items.len() {
        let before = stored.unwrap_or_default();
        let _ = app.registry.settle_receipt(&tenant.id, key, &before).await;
        return Err(ApiError::Conflict(format!(
            "this Idempotency-Key was used for a batch of {} messages",
            slots.len()
        )));
    }
    let missing: Vec<usize> = (0..items.len()).filter(|&i| slots[i].is_none()).collect();
    let produced = if missing.is_empty() {
        Ok(Vec::new())
    } else {
        kafka.produce(&out, &missing).await
    };
    let mut failed = Vec::new();
    if let Ok(each) = &produced {
        for (&i, r) in missing.iter().zip(each) {
            match r {
                Ok(w) => slots[i] = Some(*w),
                Err(e) => failed.push(format!("[{i}]: {e}")),
            }
        }
    }
    let receipt = serde_json::to_string(&slots).unwrap_or_default();
    app.registry
        .settle_receipt(&tenant.id, key, &receipt)
        .await
        .map_err(unavailable)?;
    produced.map_err(produce_error)?;
    if !failed.is_empty() {
        return Err(ApiError::SourceUnavailable(
            "Kafka topic",
            format!(
                "{} of {} records not acknowledged by the brokers ({}); the others were: send the batch again under the same Idempotency-Key to write only these",
                failed.len(),
                items.len(),
                failed.join("; ")
            ),
        ));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// Cluster mode: the batch goes into the shared log, answered once it is
/// committed there; every node (this one too) delivers it from the log at
/// its row id.
async fn logged(
    log: &SharedLog,
    tenant: &Tenant,
    items: &[PublishItem],
    batch: bool,
    key: Option<&str>,
) -> Result<Response, ApiError> {
    let ids = log
        .append(&tenant.id, &outgoing(items), key)
        .await
        .map_err(|e| match e {
            log::AppendError::KeyReused(_) => ApiError::Conflict(e.to_string()),
            log::AppendError::Db(e) => ApiError::SourceUnavailable("publish log", e.to_string()),
        })?;
    let placed = ids.iter().map(|&id| {
        (
            id as u64,
            serde_json::json!({"position": id, "logged": true}),
        )
    });
    Ok(answer(positioned(tenant, items, placed), batch))
}

fn outgoing(items: &[PublishItem]) -> Vec<Publication<'_>> {
    items
        .iter()
        .map(|i| Publication {
            channel: i.ch.as_deref(),
            key: i.key.as_deref(),
            payload: i.data.get().as_bytes(),
        })
        .collect()
}

/// The answer for items placed in a source at (number, where): each record's
/// message is published at number × 1000 on every node, unless the tenant's
/// transform makes other messages of it (then `seq` is null).
fn positioned(
    tenant: &Tenant,
    items: &[PublishItem],
    placed: impl Iterator<Item = (u64, serde_json::Value)>,
) -> Vec<serde_json::Value> {
    let transform = tenant.plugin().is_some_and(|p| p.info.hooks.transform);
    items
        .iter()
        .zip(placed)
        .map(|(i, (number, mut at))| {
            at["ch"] = serde_json::json!(i.ch);
            at["seq"] = serde_json::json!((!transform).then(|| number * MESSAGES_PER_RECORD));
            at
        })
        .collect()
}

fn answer(mut results: Vec<serde_json::Value>, batch: bool) -> Response {
    let body = if batch || results.len() != 1 {
        serde_json::json!({ "results": results })
    } else {
        results.pop().unwrap_or_default()
    };
    (StatusCode::OK, Json(body)).into_response()
}
