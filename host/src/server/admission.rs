//! Admission: everything that can refuse a session before its handshake is
//! answered — readiness, memory, the tenant (unknown and refusing tenants
//! alike to a caller without credentials), capacity and shares, the
//! plugin's authorize-connect — and the credentials and connect request the
//! plugin is given.

use super::head::RequestHead;
use super::{busy, error_body, offered_protocols, truncate, Admitted, Refused, TOKEN_PROTOCOL};
use crate::metrics;
use crate::plugin;
use crate::server::Server;
use crate::tenant::{Access, Refusal};
use axum::http::StatusCode;
use std::net::SocketAddr;
use std::sync::Arc;

/// The token a client presented: bearer header, `herald.token.…`
/// WebSocket subprotocol, `herald_token` cookie (when `cookie_ok`), or
/// `token` query parameter. Herald passes it on and never interprets it.
fn credentials(head: &RequestHead, query: &[(String, String)], cookie_ok: bool) -> Option<String> {
    if let Some(v) = head.header("authorization") {
        if let Some((scheme, token)) = v.split_once(' ') {
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(token.trim().to_string());
            }
        }
    }
    if let Some(t) = offered_protocols(head).find_map(|p| p.strip_prefix(TOKEN_PROTOCOL)) {
        use base64::Engine as _;
        // One that does not decode is passed on as written: the plugin refuses it.
        return Some(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(t.trim_end_matches('='))
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_else(|| t.to_string()),
        );
    }
    let cookie = head
        .headers
        .iter()
        .filter(|(n, _)| cookie_ok && n == "cookie")
        .flat_map(|(_, v)| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == "herald_token").then(|| v.to_string())
        });
    cookie.or_else(|| {
        query
            .iter()
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.clone())
    })
}

/// Headers a plugin may see; cookies and authorization stay with the host.
const PLUGIN_HEADERS: &[&str] = &[
    "origin",
    "user-agent",
    "referer",
    "x-forwarded-for",
    "x-real-ip",
    "accept-language",
];

/// Whether a `herald_token` cookie may stand for the client: a browser
/// sends cookies along with any page's request, so without a list of
/// allowed origins (which the handshake checks) only a page of the server's
/// own origin — the `Origin` naming the host the request was sent to — or a
/// client that sends no `Origin` (not a browser) counts.
fn cookie_counts(settings: &crate::tenant::TenantSettings, head: &RequestHead) -> bool {
    let origin = head.header("origin");
    if settings.check_origin(origin) != crate::tenant::OriginCheck::Any {
        return true;
    }
    let Some(origin) = origin else {
        return true;
    };
    let authority = origin
        .trim()
        .split_once("://")
        .map_or("", |(_, rest)| rest.trim_end_matches('/'));
    // The host the browser addressed; behind a proxy, what it forwarded
    // (a page cannot set either on a WebSocket handshake or an EventSource).
    ["host", "x-forwarded-host"]
        .iter()
        .filter_map(|h| head.header(h))
        .any(|h| !authority.is_empty() && h.trim().eq_ignore_ascii_case(authority))
}

fn connect_request(
    tenant: &str,
    transport: &str,
    head: &RequestHead,
    peer: SocketAddr,
    cookie_ok: bool,
) -> plugin::ConnectRequest {
    let query = head.query_pairs();
    plugin::ConnectRequest {
        tenant: tenant.to_string(),
        transport: transport.to_string(),
        headers: head
            .headers
            .iter()
            .filter(|(n, _)| PLUGIN_HEADERS.contains(&n.as_str()))
            .cloned()
            .collect(),
        credentials: credentials(head, &query, cookie_ok),
        query: query.into_iter().filter(|(k, _)| k != "token").collect(),
        remote_addr: peer.to_string(),
    }
}

/// A caller that presents no credentials learns nothing about which tenants
/// exist: an unknown tenant and a tenant that refuses it (its plugin's
/// denial, no plugin, a plugin without authorize-connect) answer alike, 401
/// `unauthorized`. Refusals that ask to come back later (503) stay as they
/// are, and a caller with credentials gets the plugin's own answer.
fn conceal(r: Refused, head: &RequestHead) -> Refused {
    let anonymous = credentials(head, &head.query_pairs(), true).is_none();
    if !anonymous || !matches!(r.status, StatusCode::NOT_FOUND | StatusCode::FORBIDDEN) {
        return r;
    }
    Refused {
        status: StatusCode::UNAUTHORIZED,
        extra: r.extra,
        body: error_body(
            "unauthorized",
            "no such tenant, or it admits no client without credentials",
        ),
    }
}

/// Checks everything that can refuse a session before its handshake is
/// answered (readiness, memory, tenant, capacity, the plugin's
/// authorize-connect).
pub(super) async fn admit(
    app: &Arc<Server>,
    tenant_id: &str,
    transport: &str,
    head: &RequestHead,
    peer: SocketAddr,
) -> Result<Admitted, Refused> {
    let admitted = match check_admission(app, tenant_id, peer) {
        Ok(Admission::Done(a)) => Ok(a),
        Ok(Admission::Authorize(slot, plugin)) => {
            let cookie_ok = app
                .tenants
                .get(tenant_id)
                .is_none_or(|t| cookie_counts(&t.settings(), head));
            let req = connect_request(tenant_id, transport, head, peer, cookie_ok);
            authorize_connect(slot, plugin, req).await
        }
        Err(r) => Err(r),
    };
    let mut admitted = admitted.map_err(|r| conceal(r, head))?;
    admitted.remote = Some(peer);
    admitted.origin = head.header("origin").map(|o| Box::from(o.trim()));
    Ok(admitted)
}

enum Admission {
    Done(Admitted),
    /// The slot is held; the plugin's authorize-connect decides.
    Authorize(
        crate::tenant::ConnectionSlot,
        Arc<plugin::active::ActivePlugin>,
    ),
}

fn check_admission(
    app: &Arc<Server>,
    tenant_id: &str,
    peer: SocketAddr,
) -> Result<Admission, Refused> {
    if !app.admits_sessions() {
        metrics::refused_global(Refusal::ShuttingDown.as_str());
        return Err(busy(
            Refusal::ShuttingDown.as_str(),
            "server is shutting down; retry later",
        ));
    }

    let Some(t) = app.tenants.get(tenant_id) else {
        return Err(Refused::new(
            StatusCode::NOT_FOUND,
            "unknown_tenant",
            &format!("no tenant {:?}", truncate(tenant_id)),
        ));
    };
    if app.refuses_for_memory(&t) {
        t.metrics.refused(Refusal::MemoryBudget.as_str());
        return Err(busy(
            Refusal::MemoryBudget.as_str(),
            "server is over capacity; retry later",
        ));
    }
    if let Some(version) = t.plugin_unavailable() {
        if t.plugin_loading() {
            t.metrics.refused("plugin_loading");
            return Err(busy(
                "plugin_loading",
                &format!("the tenant's plugin (version {version}) is still loading on this node; retry shortly"),
            ));
        }
        t.metrics.refused("plugin_unavailable");
        return Err(Refused::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "plugin_unavailable",
            &format!(
                "the tenant's plugin (version {version}) is not loaded on this node; retry later"
            ),
        ));
    }
    let slot = app
        .capacity
        .acquire_from(&t, Some(peer.ip()))
        .map_err(|r| {
            t.metrics.refused(r.as_str());
            busy(r.as_str(), "server is over capacity; retry later")
        })?;
    app.memory.admitted();
    if t.settings().access == Access::Public {
        return Ok(Admission::Done(Admitted {
            slot,
            session: None,
            remote: None,
            origin: None,
            deflate: None,
        }));
    }
    let Some(p) = t.plugin() else {
        t.metrics.refused("no_active_plugin");
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "no_active_plugin",
            "tenant access is \"plugin\" and no plugin is active; connections are refused",
        ));
    };
    if !p.info.hooks.authorize_connect {
        // Access "plugin" means the plugin decides who connects: one that
        // cannot is no reason to let everyone in.
        t.metrics.refused("plugin_lacks_hook");
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "plugin_lacks_hook",
            "tenant access is \"plugin\" and its plugin has no authorize-connect hook; connections are refused (activate a plugin that authorizes connections, or set access to public)",
        ));
    }
    Ok(Admission::Authorize(slot, p))
}

async fn authorize_connect(
    slot: crate::tenant::ConnectionSlot,
    p: Arc<plugin::active::ActivePlugin>,
    req: plugin::ConnectRequest,
) -> Result<Admitted, Refused> {
    let t = slot.tenant.clone();
    match p.authorize_connect_async(req).await {
        Ok(Ok(session)) => Ok(Admitted {
            slot,
            session: Some(Arc::new(session)),
            remote: None,
            origin: None,
            deflate: None,
        }),
        Ok(Err(denial)) => {
            t.metrics.refused("denied");
            Err(Refused::new(
                StatusCode::FORBIDDEN,
                &denial.code,
                &denial.message,
            ))
        }
        Err(e) => {
            // The plugin failed: fail closed, and say it is the server's fault.
            t.metrics.refused("plugin_failed");
            t.metrics.plugin_failure("authorize_connect", e.kind());
            // A busy plugin is load, not a fault: the lane logs it (once a
            // second at most), the metric counts each.
            if !matches!(e, plugin::PluginError::Busy(_)) {
                tracing::warn!(tenant = %t.id, kind = e.kind(), error = %e.for_log(), "authorize-connect failed; connection refused");
            }
            Err(busy(
                &format!("plugin_{}", e.kind()),
                "the tenant's plugin failed to authorize this connection",
            ))
        }
    }
}
