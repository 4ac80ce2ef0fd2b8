//! Revocation: a session stays only as long as what admitted it holds. When a
//! tenant's plugin version, its config (which the plugin reads) or its
//! `allowed_origins` change, the sessions that change concerns are closed
//! with 4004 — reconnect, to be authorized again — and the rest stay.

use crate::helpers::*;
use crate::sandbox::component;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const APP: &str = "https://app.example";
const REAUTHORIZE: u16 = 4004;

async fn ws_from(h: &Host, tenant: &str, origin: Option<&str>) -> Ws {
    let mut req = h.ws_url(tenant).into_client_request().unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    let (s, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    Ws { s }
}

async fn patch(h: &Host, tenant: &str, body: serde_json::Value) {
    let (s, v) = h
        .admin(
            Method::PATCH,
            &format!("/admin/v1/tenants/{tenant}"),
            Some(body),
        )
        .await;
    assert_eq!(s, 200, "{v}");
}

/// Still open: a ping is answered.
async fn open(ws: &mut Ws) {
    ws.send(json!({"op":"ping","id":7})).await;
    assert_eq!(ws.next().await["op"], "pong");
}

#[tokio::test]
async fn a_plugin_or_config_change_sends_plugin_admitted_sessions_back() {
    let h = spawn_host().await;
    let plugin = "revoke-plugin";
    h.tenant(json!({"id":plugin,"access":"plugin","config":{"n":1}}))
        .await;
    let (s, v) = h.upload_plugin(plugin, component("", "")).await;
    assert_eq!(s, 201, "{v}");
    h.activate(plugin, v["version"].as_i64().unwrap()).await;
    // A public tenant's sessions are admitted by nobody's decision.
    let public = "revoke-public";
    h.tenant(json!({"id":public,"access":"public","config":{"n":1}}))
        .await;
    let (s, v) = h.upload_plugin(public, component("", "")).await;
    assert_eq!(s, 201, "{v}");
    h.activate(public, v["version"].as_i64().unwrap()).await;

    let mut a = h.ws(plugin).await;
    let mut p = h.ws(public).await;
    open(&mut a).await;
    patch(&h, plugin, json!({"config":{"n":2}})).await;
    patch(&h, public, json!({"config":{"n":2}})).await;
    assert_eq!(a.closed().await.0, REAUTHORIZE);
    open(&mut p).await;

    // A new version.
    let mut a = h.ws(plugin).await;
    open(&mut a).await;
    let (s, v) = h.upload_plugin(plugin, component("(memory 1)", "")).await;
    assert_eq!(s, 201, "{v}");
    h.activate(plugin, v["version"].as_i64().unwrap()).await;
    assert_eq!(a.closed().await.0, REAUTHORIZE);

    // Settings that decide nothing about admission leave sessions alone.
    let mut a = h.ws(plugin).await;
    patch(&h, plugin, json!({"limits":{"max_subscriptions":50}})).await;
    open(&mut a).await;
    open(&mut p).await;
    h.stop().await;
}

#[tokio::test]
async fn an_origin_no_longer_allowed_loses_its_sessions() {
    let h = spawn_host().await;
    let t = "revoke-origins";
    h.tenant(json!({"id":t,"access":"public","allowed_origins":[APP]}))
        .await;
    let mut page = ws_from(&h, t, Some(APP)).await;
    let mut server = ws_from(&h, t, None).await;
    open(&mut page).await;
    patch(
        &h,
        t,
        json!({"allowed_origins":[APP, "https://other.example"]}),
    )
    .await;
    open(&mut page).await;
    patch(&h, t, json!({"allowed_origins":["https://other.example"]})).await;
    assert_eq!(page.closed().await.0, REAUTHORIZE);
    // A client that is no browser page was never admitted by its origin.
    open(&mut server).await;
    h.stop().await;
}
