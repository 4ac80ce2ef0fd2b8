//! Per-tenant allowed origins. A WebSocket upgrade from a page
//! of another origin is refused (cross-site WebSocket hijacking rides on
//! cookies); SSE answers CORS for allowed origins only, on refusals too.

use crate::helpers::*;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const APP: &str = "https://app.example";
const EVIL: &str = "https://evil.example";

/// The status of a WebSocket upgrade sent with `origin`.
async fn ws_status(h: &Host, tenant: &str, origin: Option<&str>) -> u16 {
    let mut req = h.ws_url(tenant).into_client_request().unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
        Err(e) => panic!("{e}"),
    }
}

/// Status and Access-Control-Allow-Origin of an SSE GET sent with `origin`.
async fn sse(h: &Host, tenant: &str, origin: Option<&str>) -> (u16, Option<String>, bool) {
    let mut req = h.http.get(h.url(&format!("/v1/t/{tenant}/sse?ch=c")));
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let r = req.send().await.unwrap();
    let acao = r
        .headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap().to_string());
    let credentials = r
        .headers()
        .get("access-control-allow-credentials")
        .is_some();
    (r.status().as_u16(), acao, credentials)
}

#[tokio::test]
async fn a_tenant_s_allowed_origins_are_enforced() {
    let h = spawn_host().await;
    h.tenant(json!({"id":"orig","access":"public","allowed_origins":[APP]}))
        .await;
    // WebSocket: another origin is refused before the upgrade; the allowed
    // one and a client that is no browser page (no Origin) get in.
    assert_eq!(ws_status(&h, "orig", Some(EVIL)).await, 403);
    assert_eq!(ws_status(&h, "orig", Some(APP)).await, 101);
    assert_eq!(
        ws_status(&h, "orig", Some("HTTPS://APP.EXAMPLE")).await,
        101
    );
    assert_eq!(ws_status(&h, "orig", None).await, 101);

    // SSE: the allowed origin, echoed with credentials; another refused
    // without the header (its page cannot read the answer).
    assert_eq!(
        sse(&h, "orig", Some(APP)).await,
        (200, Some(APP.into()), true)
    );
    assert_eq!(sse(&h, "orig", Some(EVIL)).await, (403, None, false));

    // A refusal for another reason is readable by the allowed page.
    h.tenant(json!({"id":"orig-closed","access":"plugin","allowed_origins":[APP]}))
        .await;
    assert_eq!(
        sse(&h, "orig-closed", Some(APP)).await,
        (401, Some(APP.into()), true)
    );

    // The preflight of a request with headers (Last-Event-ID).
    let pre = |origin: &'static str| {
        h.http
            .request(Method::OPTIONS, h.url("/v1/t/orig/sse"))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "last-event-id")
            .send()
    };
    let ok = pre(APP).await.unwrap();
    assert_eq!(ok.status(), 204);
    assert_eq!(ok.headers()["access-control-allow-origin"], APP);
    assert!(ok.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("last-event-id"));
    let no = pre(EVIL).await.unwrap();
    assert_eq!(no.status(), 403);
    assert!(no.headers().get("access-control-allow-origin").is_none());

    // null allows any origin again; SSE answers `*` as for every tenant
    // without a list.
    let (s, v) = h
        .admin(
            Method::PATCH,
            "/admin/v1/tenants/orig",
            Some(json!({"allowed_origins":null})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["allowed_origins"], serde_json::Value::Null);
    assert_eq!(ws_status(&h, "orig", Some(EVIL)).await, 101);
    assert_eq!(
        sse(&h, "orig", Some(EVIL)).await,
        (200, Some("*".into()), false)
    );
    h.stop().await;
}

#[tokio::test]
async fn bad_origins_are_refused_with_a_reason() {
    let h = spawn_host().await;
    for bad in [
        json!("https://app.example"),
        json!(["app.example"]),
        json!(["https://app.example/path"]),
        json!([7]),
    ] {
        let (s, v) = h
            .admin(
                Method::POST,
                "/admin/v1/tenants",
                Some(json!({"id":"bad-origin","allowed_origins":bad})),
            )
            .await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("allowed_origins"),
            "{v}"
        );
    }
    // Nothing was created.
    let (s, _) = h
        .admin(Method::GET, "/admin/v1/tenants/bad-origin", None)
        .await;
    assert_eq!(s, 404);
    h.stop().await;
}

/// A tenant without `allowed_origins` takes a `herald_token`
/// cookie only from a page of the server's own origin (or from a client
/// that sends no Origin, which no browser omits on a WebSocket): another
/// site's page must not ride on the cookie a browser sends along. Bearer,
/// subprotocol and query credentials are what a page chose to send, and
/// are unaffected.
#[tokio::test]
async fn a_cookie_credential_counts_only_from_the_servers_own_origin() {
    use crate::plugins::{jwt, now_s, SECRET};
    let h = spawn_host().await;
    h.tenant(json!({"id":"ck","config":{"secret":SECRET,"default_channels":["public.*"]}}))
        .await;
    h.install_plugin("ck", "jwt_auth").await;
    let token = jwt(json!({"sub":"alice","exp":now_s()+60}), SECRET);
    let own = format!("http://{}", h.addr);
    let upgrade = |origin: Option<&str>, cookie: bool, query: bool| {
        let url = if query {
            format!("{}?token={token}", h.ws_url("ck"))
        } else {
            h.ws_url("ck")
        };
        let mut req = url.into_client_request().unwrap();
        if let Some(o) = origin {
            req.headers_mut().insert("origin", o.parse().unwrap());
        }
        if cookie {
            let c = format!("theme=dark; herald_token={token}");
            req.headers_mut().insert("cookie", c.parse().unwrap());
        }
        async move {
            match tokio_tungstenite::connect_async(req).await {
                Ok(_) => (101, String::new()),
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                    let body = r.body().clone().unwrap_or_default();
                    (
                        r.status().as_u16(),
                        String::from_utf8_lossy(&body).into_owned(),
                    )
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    let (s, body) = upgrade(Some(EVIL), true, false).await;
    assert_eq!(s, 403, "another site's page rode on the cookie");
    assert!(body.contains("missing_token"), "{body}");
    assert_eq!(
        upgrade(Some(&own), true, false).await.0,
        101,
        "the server's own page"
    );
    assert_eq!(
        upgrade(None, true, false).await.0,
        101,
        "no Origin: not a browser"
    );
    assert_eq!(
        upgrade(Some(EVIL), false, true).await.0,
        101,
        "a token the page sent"
    );
    h.stop().await;
}
