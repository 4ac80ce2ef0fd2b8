//! The OpenAPI document served at `/admin/v1/openapi.json`, generated from
//! the handlers' `#[utoipa::path]` annotations and the types they take and
//! answer.
//!
//! Invariant: every route of the router that is not a session (WebSocket,
//! SSE: the client protocol, README.md) is an operation here, and every
//! answer a handler gives matches its schema — `tests/it/openapi.rs` calls
//! every operation and validates each real answer against this document.
//! Answers a handler builds as JSON (rather than serializing one of these
//! types) are described by the `*View` types below; that test is what
//! keeps them true.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Herald",
        description = "Admin REST (bearer admin token), HTTP publish (bearer publish key), health, readiness and metrics. Sessions (WebSocket at /v1/t/{tenant}/ws, SSE at /v1/t/{tenant}/sse) speak the client protocol in the README, \"Client protocol (v1)\"."
    ),
    paths(
        super::admin::create,
        super::admin::list,
        super::admin::show,
        super::admin::update,
        super::admin::remove,
        super::admin::rotate_key,
        super::admin::show_source,
        super::admin::set_source,
        super::admin::nodes,
        super::plugins::list,
        super::plugins::upload,
        super::plugins::activate,
        super::plugins::deactivate,
        super::plugins::rollback,
        super::plugins::upload_status,
        super::ops::history,
        super::ops::connections,
        super::ops::disconnect,
        super::publish::publish,
        super::healthz,
        super::readyz,
        super::metrics,
        super::openapi,
    ),
    modifiers(&Security),
    tags(
        (name = "tenants", description = "Tenants, their keys and sources"),
        (name = "plugins", description = "A tenant's plugin versions"),
        (name = "operations", description = "History, live connections, disconnects (this node's)"),
        (name = "publish", description = "HTTP publish"),
        (name = "health", description = "Liveness, readiness, metrics"),
    )
)]
pub struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        let bearer =
            || SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        c.add_security_scheme("admin", bearer());
        c.add_security_scheme("publishKey", bearer());
        c.add_security_scheme("metrics", bearer());
    }
}

/// The document as JSON (built once).
pub fn json() -> &'static str {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOC.get_or_init(|| ApiDoc::openapi().to_pretty_json().unwrap_or_default())
}

/// Every error answer.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)] // a schema: the router's ApiError writes this shape
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// Stable, for programs (`not_found`, `rate_limited`, …).
    pub code: String,
    /// For people.
    pub message: String,
}

/// A tenant as the admin API shows it.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct TenantView {
    pub id: String,
    #[schema(value_type = String, example = "public")]
    pub access: String,
    /// The plugin's config (any JSON object).
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    /// The stored overrides of the defaults.
    pub limits: crate::tenant::LimitOverrides,
    /// The conflation window (`{}`: none).
    #[schema(value_type = Object)]
    pub conflation: serde_json::Value,
    /// Browser origins its clients may come from; `null`: any.
    pub allowed_origins: Option<Vec<String>>,
    pub active_plugin: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The limits in force (defaults and overrides), on this node.
    #[schema(required = false)]
    pub effective_limits: Option<crate::tenant::TenantLimits>,
    /// Connections on this node.
    #[schema(required = false)]
    pub connections: Option<u64>,
    /// Channels on this node.
    #[schema(required = false)]
    pub channels: Option<u64>,
    /// Only in the answer to create: shown once.
    #[schema(required = false)]
    pub publish_key: Option<String>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct TenantList {
    pub tenants: Vec<TenantView>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct RotatedKey {
    pub id: String,
    /// Shown once.
    pub publish_key: String,
}

/// A tenant's source and how it is doing on this node.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct SourceView {
    pub source: crate::source::SourceConfig,
    pub health: crate::source::Health,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct NodeList {
    /// This node's id.
    #[schema(rename = "self")]
    pub self_: String,
    pub nodes: Vec<NodeView>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct NodeView {
    pub id: String,
    pub version: String,
    pub address: Option<String>,
    pub started_at_ms: i64,
    pub last_heartbeat_ms: i64,
    /// Its heartbeat is recent.
    pub alive: bool,
    pub connections: i64,
    /// What it runs (tenant → plugin version).
    #[schema(value_type = Object)]
    pub plugins: serde_json::Value,
}

/// A stored plugin version.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct PluginVersionView {
    pub version: i64,
    pub sha256: String,
    pub size_bytes: i64,
    pub name: String,
    pub plugin_version: String,
    /// The hooks it declares.
    #[schema(value_type = Object)]
    pub hooks: serde_json::Value,
    /// The WIT package it was built against (upload answer only).
    #[schema(required = false, example = "herald:plugin@0.2.0")]
    pub contract: Option<String>,
    /// `typed` or `flat` (upload answer only; null without a transform).
    #[schema(required = false)]
    pub transform_encoding: Option<String>,
    /// List answer only.
    #[schema(required = false)]
    pub active: Option<bool>,
    /// Compiled in this node's memory (list answer only).
    #[schema(required = false)]
    pub compiled: Option<bool>,
    pub created_at_ms: i64,
    /// `stored` in the answer of an upload's status.
    #[schema(required = false)]
    pub status: Option<String>,
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct PluginList {
    pub active: Option<i64>,
    pub versions: Vec<PluginVersionView>,
}

/// A large upload compiling in the background (202), or its status.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct UploadStatusView {
    /// `compiling`, `stored` (then the version's fields are here too) or `failed`.
    pub status: String,
    pub sha256: String,
    #[schema(required = false)]
    pub since_ms: Option<i64>,
    /// Where to poll (also in Location).
    #[schema(required = false)]
    pub status_url: Option<String>,
    #[schema(required = false)]
    pub error: Option<ErrorDetail>,
}

/// The status of an upload: still compiling or failed, or stored (then
/// the stored version's fields, with `"status": "stored"`).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum UploadAnswer {
    Pending(UploadStatusView),
    Stored(PluginVersionView),
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Activation {
    pub active: Option<i64>,
    /// The version it replaced.
    #[schema(required = false)]
    pub previous: Option<i64>,
    #[schema(required = false)]
    pub name: Option<String>,
    #[schema(required = false, value_type = Option<Object>)]
    pub hooks: Option<serde_json::Value>,
    #[schema(required = false)]
    pub contract: Option<String>,
}

/// Where one published message went.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct PublishResult {
    /// Its channel (`null` when the tenant's transform picks it).
    #[schema(required = true)]
    pub ch: Option<String>,
    /// Its position; `null` while held in the conflation window or when a
    /// transform decides the channel.
    #[schema(required = true)]
    pub seq: Option<u64>,
    /// Sessions it was queued for (single node, HTTP source).
    #[schema(required = false)]
    pub delivered: Option<u64>,
    /// Held in the conflation window.
    #[schema(required = false)]
    pub held: Option<bool>,
    #[schema(required = false)]
    pub duplicate: Option<bool>,
    /// Kafka source: where it was produced.
    #[schema(required = false)]
    pub partition: Option<i32>,
    #[schema(required = false)]
    pub offset: Option<i64>,
    /// Cluster mode: its row in the shared log.
    #[schema(required = false)]
    pub position: Option<i64>,
    #[schema(required = false)]
    pub logged: Option<bool>,
}

/// The answer to a batch (an array body).
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct PublishBatch {
    pub results: Vec<PublishResult>,
}

/// A publish body: one message or a non-empty array of them.
#[derive(ToSchema, serde::Deserialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum PublishBody {
    One(crate::publish::PublishItem),
    Many(Vec<crate::publish::PublishItem>),
}

/// A publish answer: one result, or `{"results": […]}` for a batch.
#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum PublishAnswer {
    One(PublishResult),
    Batch(PublishBatch),
}

#[derive(ToSchema, serde::Serialize)]
#[allow(dead_code)]
pub struct Ready {
    pub ready: bool,
    pub node: String,
    /// `ok`, or in cluster mode `unreachable` while the registry is.
    pub registry: String,
    #[schema(required = false)]
    pub registry_down_since_ms: Option<i64>,
}
