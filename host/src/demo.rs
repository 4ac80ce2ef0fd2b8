//! `herald serve --demo`: the live ticker page at `/`, the browser client it
//! is built on at `/herald.js` (with its types at `/herald.d.ts`), and a
//! built-in publisher of ticks into the `demo` tenant.
//!
//! Invariant: the publisher goes through the one HTTP publish path
//! (`publish::publish`): what the page shows is what any
//! publisher's messages would do.

use crate::clock::now_ms;
use crate::node::Node;
use crate::registry::{RegistryError, TenantRecord};
use crate::secret::{hex, key_digest, new_secret};
use crate::tenant::Access;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::Arc;
use std::time::Duration;

/// The demo's symbols; channel `ticks.<SYM>`, conflation key `<SYM>`.
pub const SYMBOLS: &[&str] = &["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"];

const PAGE: &str = include_str!("../../clients/js/demo/index.html");
const CLIENT: &str = include_str!("../../clients/js/herald.js");
const TYPES: &str = include_str!("../../clients/js/herald.d.ts");

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { page("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/herald.js",
            get(|| async { page("text/javascript; charset=utf-8", CLIENT) }),
        )
        .route(
            "/herald.d.ts",
            get(|| async { page("text/plain; charset=utf-8", TYPES) }),
        )
}

fn page(kind: &'static str, body: &'static str) -> axum::response::Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
            // The page may be loaded from another origin's page as a module.
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
        ],
        body,
    )
        .into_response()
}

/// Creates the public `demo` tenant's row if absent; returns its new
/// publish key (the caller applies the row: `reconcile::tenant`).
pub async fn ensure_tenant(node: &Node) -> Result<Option<String>, RegistryError> {
    if node.tenants.get("demo").is_some() {
        return Ok(None);
    }
    let key = new_secret("pk_");
    let rec = TenantRecord {
        id: "demo".into(),
        access: Access::Public.as_str().into(),
        config: serde_json::json!({}),
        limits: serde_json::json!({}),
        publish_key_sha256: hex(&key_digest(&key)),
        created_at_ms: now_ms(),
        updated_at_ms: now_ms(),
        active_plugin: None,
        conflation: serde_json::json!({}),
        // The demo page's badge turns "stalled" when its publisher stops.
        source: match node.cluster {
            None => serde_json::json!({"kind": "http", "stall_after_ms": 3000}),
            Some(_) => serde_json::json!({"kind": "http"}),
        },
        allowed_origins: serde_json::Value::Null,
    };
    node.registry.create_tenant(&rec).await?;
    Ok(Some(key))
}

/// One tick per symbol every `every`, a random walk from 100, until the
/// server stops.
pub async fn publish(app: Arc<Node>, every: Duration) {
    let mut prices: Vec<f64> = SYMBOLS.iter().map(|_| 100.0).collect();
    let mut i: u64 = 0;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = app.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(tenant) = app.tenants.get("demo") else {
            continue;
        };
        i += 1;
        let items: Vec<serde_json::Value> = SYMBOLS
            .iter()
            .zip(prices.iter_mut())
            .map(|(sym, px)| {
                *px = (*px * (1.0 + (rand::random::<f64>() - 0.5) / 50.0)).max(1.0);
                serde_json::json!({
                    "ch": format!("ticks.{sym}"),
                    "key": sym,
                    "data": {"sym": sym, "px": (*px * 100.0).round() / 100.0, "i": i},
                })
            })
            .collect();
        let body = serde_json::Value::Array(items).to_string();
        if let Err(e) =
            crate::publish::publish(&app.sources, &app.registry, &tenant, body.as_bytes(), None)
                .await
        {
            tracing::debug!(error = %e, "demo publisher: tick not published");
        }
    }
}
