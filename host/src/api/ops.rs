//! The operator's tools under `/admin/v1/tenants/{t}`: a channel's history,
//! this node's live connections, and disconnecting a subject or a session.
//!
//! Invariants: everything here is of this node (the answer names it): a
//! cluster's connections are each node's own, so an operator asks each node
//! (`herald nodes` lists their addresses). Reading history changes nothing
//! but the trim a subscribe would do anyway; a disconnect closes sessions
//! through their handles, like a tenant removal, with the code asked for.

use super::Api;
use super::{live_tenant, ApiError};
use crate::clock::now_ms;
use crate::fanout::queue::Wire;
use crate::fanout::session::QueueClose;
use crate::fanout::Serves;
use crate::proto::ws::close;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;

pub(super) fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/tenants/{tenant}/channels/{channel}/history", get(history))
        .route("/tenants/{tenant}/connections", get(connections))
        .route("/tenants/{tenant}/disconnect", post(disconnect))
}

/// Positions a history read returns when `limit` is not given, and at most.
pub const HISTORY_DEFAULT_LIMIT: usize = 100;
pub const HISTORY_MAX_LIMIT: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// Positions after this one (default 0: all the history holds).
    #[serde(default)]
    pub since: u64,
    /// At most this many positions (default 100, at most 1000).
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HistoryAnswer {
    pub node: String,
    pub channel: String,
    pub epoch: u64,
    /// The channel's last position.
    pub head: u64,
    /// The oldest position history holds; `null` when it holds none.
    pub oldest: Option<u64>,
    /// True when more positions after the last one returned are held.
    pub more: bool,
    pub messages: Vec<HistoryMessage>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HistoryMessage {
    pub seq: u64,
    pub prev: u64,
    pub at_ms: u64,
    pub key: Option<String>,
    /// The audiences this variant is for; `null`: everyone without one of
    /// their own.
    pub audiences: Option<Vec<String>>,
    /// The message as a client receives it (`{"op":"msg",…}`).
    #[schema(value_type = Object)]
    pub frame: Box<RawValue>,
}

#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/channels/{channel}/history", tag = "operations", security(("admin" = [])),
    params(("tenant" = String, Path, description = "tenant id"), ("channel" = String, Path, description = "channel name"),
        ("since" = Option<u64>, Query, description = "positions after this one (default 0)"),
        ("limit" = Option<usize>, Query, description = "at most this many positions (default 100, at most 1000)")),
    responses((status = 200, description = "what a resume after `since` would replay, on this node", body = HistoryAnswer), (status = 400, description = "bad input; nothing changed", body = super::doc::ErrorBody), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody),
        (status = 404, description = "no such tenant, or the channel has neither subscribers nor history here", body = super::doc::ErrorBody)))]
pub(super) async fn history(
    State(app): State<Arc<Api>>,
    Path((id, channel)): Path<(String, String)>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HistoryAnswer>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = q.limit.unwrap_or(HISTORY_DEFAULT_LIMIT);
    if limit == 0 || limit > HISTORY_MAX_LIMIT {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to {HISTORY_MAX_LIMIT}"
        )));
    }
    crate::proto::validate_channel(&channel).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let tenant = live_tenant(&app, &id)?;
    let limits = tenant.settings().limits.history();
    let view = tenant
        .hub
        .history(&channel, q.since, limit + 1, limits, now_ms() as u64)
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "channel {channel:?} has no subscribers and no history on this node"
            ))
        })?;
    let more = view.positions.len() > limit;
    let mut messages = Vec::new();
    for frames in view.positions.iter().take(limit) {
        for f in frames.iter() {
            let audiences = match &f.serves {
                Serves::Rest => None,
                Serves::Audience(a) => Some(vec![a.to_string()]),
                Serves::Listed(list) => Some(list.iter().map(|a| a.to_string()).collect()),
            };
            let text = std::str::from_utf8(f.json())
                .map_err(|e| ApiError::Internal(format!("history frame: {e}")))?;
            let frame = RawValue::from_string(text.to_string())
                .map_err(|e| ApiError::Internal(format!("history frame: {e}")))?;
            messages.push(HistoryMessage {
                seq: f.seq,
                prev: f.prev,
                at_ms: f.at_ms,
                key: f.key.as_deref().map(str::to_string),
                audiences,
                frame,
            });
        }
    }
    Ok(Json(HistoryAnswer {
        node: app.node_id.clone(),
        channel,
        epoch: view.epoch,
        head: view.head,
        oldest: view.oldest,
        more,
        messages,
    }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectionsAnswer {
    pub node: String,
    pub connections: Vec<Connection>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Connection {
    /// `s<n>`: what `POST …/disconnect {"session"}` takes.
    pub session: String,
    /// The subject the tenant's plugin gave it; `null` on public tenants.
    pub subject: Option<String>,
    /// `ws` or `sse`.
    #[schema(value_type = String)]
    pub transport: &'static str,
    pub channels: Vec<String>,
    /// Bytes waiting in its outbound queue.
    pub queue_bytes: usize,
    pub connected_at_ms: u64,
    pub remote_addr: Option<String>,
}

fn session_id(n: u64) -> String {
    format!("s{n}")
}

#[utoipa::path(get, path = "/admin/v1/tenants/{tenant}/connections", tag = "operations", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    responses((status = 200, description = "this node's live sessions of the tenant", body = ConnectionsAnswer), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn connections(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Json<ConnectionsAnswer>, ApiError> {
    let tenant = live_tenant(&app, &id)?;
    let mut connections: Vec<Connection> = tenant
        .sessions
        .handles()
        .into_iter()
        .filter(|h| h.close_reason().is_none())
        .map(|h| {
            let info = h.info();
            let mut channels: Vec<String> = h.channels().iter().map(|c| c.to_string()).collect();
            channels.sort();
            Connection {
                session: session_id(info.id),
                subject: info.subject.as_deref().map(str::to_string),
                transport: match h.wire() {
                    Wire::Ws => "ws",
                    Wire::Sse => "sse",
                },
                channels,
                queue_bytes: h.queued_bytes(),
                connected_at_ms: info.connected_at_ms,
                remote_addr: info.remote.map(|a| a.to_string()),
            }
        })
        .collect();
    connections.sort_by_key(|c| c.connected_at_ms);
    Ok(Json(ConnectionsAnswer {
        node: app.node_id.clone(),
        connections,
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DisconnectRequest {
    /// Every session of this subject.
    pub subject: Option<String>,
    /// This session (`s<n>` from the connection list).
    pub session: Option<String>,
    /// The WebSocket close code (default 4003: disconnected, may
    /// reconnect). 1000, 1008 (policy: do not come back), 1012 (restart:
    /// reconnect and resume) or 4000–4999.
    pub code: Option<u16>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DisconnectAnswer {
    pub node: String,
    pub disconnected: usize,
    pub code: u16,
}

fn valid_close_code(code: u16) -> bool {
    matches!(code, 1000 | 1008 | 1012 | 4000..=4999)
}

#[utoipa::path(post, path = "/admin/v1/tenants/{tenant}/disconnect", tag = "operations", security(("admin" = [])), params(("tenant" = String, Path, description = "tenant id")),
    request_body = DisconnectRequest,
    responses((status = 200, description = "sessions closed with the code (WebSocket) or ended (SSE), on this node", body = DisconnectAnswer), (status = 400, description = "bad input; nothing changed", body = super::doc::ErrorBody), (status = 401, description = "missing or wrong admin token", body = super::doc::ErrorBody), (status = 404, description = "no such tenant", body = super::doc::ErrorBody)))]
pub(super) async fn disconnect(
    State(app): State<Arc<Api>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<DisconnectAnswer>, ApiError> {
    let req: DisconnectRequest = super::parse_json(&body)?;
    let code = req.code.unwrap_or(close::DISCONNECTED);
    if !valid_close_code(code) {
        return Err(ApiError::BadRequest(format!(
            "code {code} is not one a server may send here: 1000, 1008, 1012 or 4000-4999"
        )));
    }
    let session = match &req.session {
        Some(s) => Some(
            s.strip_prefix('s')
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "session {s:?} is not a session id (s<n>, from GET …/connections)"
                    ))
                })?,
        ),
        None => None,
    };
    if session.is_none() && req.subject.is_none() {
        return Err(ApiError::BadRequest(
            "give the subject or the session to disconnect".into(),
        ));
    }
    let tenant = live_tenant(&app, &id)?;
    let mut disconnected = 0;
    for h in tenant.sessions.handles() {
        let info = h.info();
        let by_session = session.is_none_or(|n| n == info.id);
        let by_subject = req
            .subject
            .as_deref()
            .is_none_or(|s| info.subject.as_deref() == Some(s));
        if by_session && by_subject && h.close_reason().is_none() {
            h.close_with(QueueClose::Disconnected(code));
            disconnected += 1;
        }
    }
    tracing::info!(tenant = %id, subject = ?req.subject, session = ?req.session, code, disconnected, "sessions disconnected by the operator");
    Ok(Json(DisconnectAnswer {
        node: app.node_id.clone(),
        disconnected,
        code,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_a_server_may_send() {
        for ok in [1000, 1008, 1012, 4000, 4003, 4999] {
            assert!(valid_close_code(ok), "{ok}");
        }
        for bad in [0, 999, 1001, 1005, 1006, 1015, 2000, 3000, 5000] {
            assert!(!valid_close_code(bad), "{bad}");
        }
    }
}
