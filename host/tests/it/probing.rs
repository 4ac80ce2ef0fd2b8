//! A caller without credentials cannot tell which tenants exist from the
//! session endpoints: an unknown tenant and a tenant that refuses it answer
//! alike (401 `unauthorized`), over WebSocket and SSE. A caller that
//! presents credentials gets the plugin's own answer; a public tenant is
//! public by choice.

use crate::helpers::*;
use serde_json::{json, Value};

/// Status and body of an SSE request without credentials.
async fn sse(h: &Host, tenant: &str) -> (u16, Value) {
    let r = h
        .http
        .get(h.url(&format!("/v1/t/{tenant}/sse?ch=c")))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn unknown_and_refusing_tenants_answer_anonymous_callers_alike() {
    let h = spawn_host().await;
    // No plugin yet, then a plugin without authorize-connect, then one
    // that denies a caller without a token.
    h.tenant(json!({"id":"probe-plugin","access":"plugin","config":{"secret":"s"}}))
        .await;
    let unknown_ws = h.ws_with("probe-nobody", "").await.err().unwrap();
    let unknown_sse = sse(&h, "probe-nobody").await;
    assert_eq!(unknown_ws.0, 401, "{}", unknown_ws.1);
    assert_eq!(unknown_ws.1["error"]["code"], "unauthorized");
    assert_eq!(unknown_sse, unknown_ws);
    let alike = |what: &str, got: (u16, Value)| {
        assert_eq!(got, unknown_ws, "{what}: answered unlike an unknown tenant");
    };
    alike(
        "no plugin",
        h.ws_with("probe-plugin", "").await.err().unwrap(),
    );
    alike("no plugin, sse", sse(&h, "probe-plugin").await);
    h.install_plugin("probe-plugin", "ticker_conflate").await;
    alike(
        "no hook",
        h.ws_with("probe-plugin", "").await.err().unwrap(),
    );
    h.install_plugin("probe-plugin", "jwt_auth").await;
    alike("denied", h.ws_with("probe-plugin", "").await.err().unwrap());
    alike("denied, sse", sse(&h, "probe-plugin").await);

    // With credentials: the plugin's own answer.
    let (s, v) = h.ws_with("probe-plugin", "token=x").await.err().unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("invalid_token"))
    );
    h.stop().await;
}
