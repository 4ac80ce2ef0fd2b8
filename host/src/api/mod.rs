//! The HTTP router: admin REST, publish, health, readiness and metrics.
//!
//! Owns: request validation and the one mapping from [`ApiError`] to HTTP
//! status and JSON error body. Invariants: every error body is
//! `{"error":{"code":…,"message":…}}`; internal errors are logged once and
//! never leak details to clients; a request is validated whole before
//! anything is changed (a bad item in a publish batch publishes nothing).

pub mod admin;
pub mod doc;
pub mod ops;
pub mod plugins;
pub mod publish;

use crate::node::Node;
use crate::publish::PublishError;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::time::Duration;

/// What the API needs beyond the node: its own settings and secrets.
pub struct ApiSettings {
    pub admin_token_sha256: [u8; 32],
    /// `/metrics` requires this bearer token when set.
    pub metrics_token: Option<String>,
    pub metrics: PrometheusHandle,
    /// The admin API has a listener of its own (`--admin-listen`).
    pub admin_listen: bool,
    /// `--demo`: the demo page's routes.
    pub demo_tenant: bool,
}

/// The API's state: the node it serves and its own settings.
pub struct Api {
    pub node: Arc<Node>,
    pub settings: ApiSettings,
}

impl std::ops::Deref for Api {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

/// Largest request body the router reads (a publish batch).
pub(crate) const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong credentials")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unprocessable(String),
    /// A publish refused by the publish service (its messages are its own).
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The body did not arrive in time (after its key was accepted).
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    #[error("server is shutting down")]
    Unavailable,
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::Unprocessable(_) => "unprocessable",
            ApiError::BodyTimeout(_) => "request_timeout",
            ApiError::Unavailable => "unavailable",
            ApiError::Internal(_) => "internal",
            ApiError::Publish(e) => match e {
                PublishError::Bad(_) => "bad_request",
                PublishError::Conflict(_) => "conflict",
                PublishError::SourceNotHttp(..) => "source_not_http",
                PublishError::RateLimited(_) => "rate_limited",
                PublishError::PluginUnavailable(_) => "plugin_unavailable",
                PublishError::PluginLoading(_) => "plugin_loading",
                PublishError::PluginBusy => "plugin_busy",
                PublishError::SourceUnavailable("publish log", _) => "log_unavailable",
                PublishError::SourceUnavailable(..) => "source_unavailable",
                PublishError::TransformFailed(..) => "transform_failed",
            },
        }
    }
}

impl From<crate::registry::RegistryError> for ApiError {
    fn from(e: crate::registry::RegistryError) -> Self {
        use crate::registry::RegistryError as R;
        match e {
            R::Conflict(what) => ApiError::Conflict(format!("{what} already exists")),
            R::NotFound(what) => ApiError::NotFound(format!("{what} not found")),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Publish(e) => match e {
                PublishError::Bad(_) => StatusCode::BAD_REQUEST,
                PublishError::Conflict(_) | PublishError::SourceNotHttp(..) => StatusCode::CONFLICT,
                PublishError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
                PublishError::PluginUnavailable(_)
                | PublishError::PluginLoading(_)
                | PublishError::PluginBusy => StatusCode::SERVICE_UNAVAILABLE,
                PublishError::SourceUnavailable(what, cause) => {
                    tracing::warn!(what, %cause, "publish not confirmed");
                    StatusCode::SERVICE_UNAVAILABLE
                }
                PublishError::TransformFailed(..) => StatusCode::BAD_GATEWAY,
            },
            ApiError::Internal(cause) => {
                tracing::error!(%cause, "request failed with an internal error");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let body = serde_json::json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut resp = (status, Json(body)).into_response();
        match &self {
            ApiError::Publish(
                PublishError::SourceUnavailable(..)
                | PublishError::PluginUnavailable(_)
                | PublishError::PluginLoading(_)
                | PublishError::PluginBusy,
            ) => {
                resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
            }
            ApiError::Publish(PublishError::RateLimited(wait)) => {
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
            }
            ApiError::Unauthorized => {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
            }
            _ => {}
        }
        resp
    }
}

/// The bearer token of a request, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn require_admin(State(app): State<Arc<Api>>, req: Request, next: Next) -> Response {
    match bearer(req.headers()) {
        Some(t) if crate::secret::matches(&app.settings.admin_token_sha256, t) => {
            next.run(req).await
        }
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// The main listener's routes: clients, publish, health, and the admin API
/// unless it has a listener of its own (`--admin-listen`, [`admin_router`]).
pub fn router(app: Arc<Api>) -> Router {
    let demo = if app.settings.demo_tenant {
        crate::demo::routes()
    } else {
        Router::new()
    };
    let base = if !app.settings.admin_listen {
        admin_routes(&app)
    } else {
        Router::new()
    };
    with_health(base.merge(demo).merge(publish::routes()), app)
}

/// The admin listener's routes (`--admin-listen`): the admin API and health.
pub fn admin_router(app: Arc<Api>) -> Router {
    with_health(admin_routes(&app), app)
}

/// `routes` with health, readiness and metrics, a 404 for the rest, and
/// the body limit.
fn with_health(routes: Router<Arc<Api>>, app: Arc<Api>) -> Router {
    routes
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

fn admin_routes(app: &Arc<Api>) -> Router<Arc<Api>> {
    let admin = admin::routes()
        .merge(plugins::routes())
        .merge(ops::routes())
        .route_layer(middleware::from_fn_with_state(app.clone(), require_admin));
    Router::new()
        .nest("/admin/v1", admin)
        .route("/admin/v1/openapi.json", get(openapi))
}

#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "the process runs", content_type = "text/plain", body = String)))]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// 200 while the node takes clients, 503 once it drains. In cluster mode the
/// body also says whether the node hears the registry: while it does not,
/// it stays ready and serves what it last knew (taking every node out of a
/// load balancer for a registry outage would be an outage of its own).
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, description = "takes clients", body = doc::Ready),
        (status = 503, description = "draining or not started", body = doc::ErrorBody)))]
pub(super) async fn readyz(State(app): State<Arc<Api>>) -> Response {
    if !app.is_ready() {
        return ApiError::Unavailable.into_response();
    }
    let mut body = serde_json::json!({"ready": true, "node": app.node_id});
    match &app.cluster {
        Some(c) => {
            let (up, down_since) = c.registry();
            body["registry"] = if up { "ok" } else { "unreachable" }.into();
            if let Some(ms) = down_since {
                body["registry_down_since_ms"] = ms.into();
            }
        }
        None => body["registry"] = "ok".into(),
    }
    (StatusCode::OK, Json(body)).into_response()
}

#[utoipa::path(get, path = "/metrics", tag = "health", security((), ("metrics" = [])),
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String),
        (status = 401, description = "--metrics-token is set and was not given", body = doc::ErrorBody)))]
pub(super) async fn metrics(State(app): State<Arc<Api>>, headers: HeaderMap) -> Response {
    if let Some(want) = &app.settings.metrics_token {
        let want = crate::secret::key_digest(want);
        if !bearer(&headers).is_some_and(|g| crate::secret::matches(&want, g)) {
            return ApiError::Unauthorized.into_response();
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        herald_base::metrics::render(&app.settings.metrics),
    )
        .into_response()
}

#[utoipa::path(get, path = "/admin/v1/openapi.json", tag = "health",
    responses((status = 200, description = "this document", content_type = "application/json", body = Object)))]
pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], doc::json()).into_response()
}

/// The live tenant `id` on this node, or 404.
pub(crate) fn live_tenant(app: &Node, id: &str) -> Result<Arc<crate::tenant::Tenant>, ApiError> {
    app.tenants
        .get(id)
        .ok_or_else(|| ApiError::NotFound(format!("tenant {id:?} not found")))
}

/// Parses a JSON body, naming the field at fault in the error.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    crate::publish::parse_json(body).map_err(|e| ApiError::BadRequest(e.to_string()))
}
