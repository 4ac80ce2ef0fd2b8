//! Anonymous clients of one public tenant cannot take the whole
//! process. A public tenant holds at most `connection_share_percent` (50 by
//! default) of the process's session capacity unless its `max_connections`
//! says otherwise, and at most `max_connections_per_address` (1000 by
//! default) sessions from one client address; other tenants get in.

use crate::helpers::*;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A WebSocket session from `ip`, or the refusal's status and code.
async fn ws_from(h: &Host, tenant: &str, ip: &str) -> Result<Ws, (u16, String)> {
    let stream = connect_from(ip, h.addr).await.unwrap();
    let req = h.ws_url(tenant).into_client_request().unwrap();
    match tokio_tungstenite::client_async(req, tokio_tungstenite::MaybeTlsStream::Plain(stream))
        .await
    {
        Ok((s, _)) => Ok(Ws { s }),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = r.body().clone().unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            Err((
                r.status().as_u16(),
                v["error"]["code"].as_str().unwrap_or_default().to_string(),
            ))
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_public_tenant_holds_its_share_of_the_process() {
    let mut opts = HostOptions::new();
    opts.config.max_connections = Some(10);
    let h = spawn_with(opts).await;
    h.public_tenant("flood").await;
    h.public_tenant("calm").await;
    let mut held = Vec::new();
    for i in 0..5 {
        let ip = format!("127.0.1.{}", i + 1);
        held.push(ws_from(&h, "flood", &ip).await.expect("within its share"));
    }
    let refused = ws_from(&h, "flood", "127.0.1.9").await.err();
    assert_eq!(
        refused,
        Some((503, "tenant_share".to_string())),
        "past half the process"
    );
    // Another tenant still gets in.
    let mut calm = ws_from(&h, "calm", "127.0.1.9")
        .await
        .expect("calm admitted");
    calm.sub("c", 1).await;
    // An explicit max_connections is the tenant's own bound.
    let (s, v) = h
        .admin(
            reqwest::Method::PATCH,
            "/admin/v1/tenants/flood",
            Some(json!({"limits":{"max_connections":8}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    held.push(
        ws_from(&h, "flood", "127.0.1.9")
            .await
            .expect("its own bound"),
    );
    h.stop().await;
}

#[tokio::test]
async fn one_address_holds_a_bounded_number_of_public_sessions() {
    let h = spawn_host().await;
    let (s, v) = h
        .admin(
            reqwest::Method::POST,
            "/admin/v1/tenants",
            Some(json!({"id":"nat","access":"public","limits":{"max_connections_per_address":2}})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let a = ws_from(&h, "nat", "127.0.2.1").await.expect("first");
    let _b = ws_from(&h, "nat", "127.0.2.1").await.expect("second");
    assert_eq!(
        ws_from(&h, "nat", "127.0.2.1").await.err(),
        Some((503, "address_connections".to_string()))
    );
    // Another address is its own count; a session that ends frees its place.
    let _c = ws_from(&h, "nat", "127.0.2.2")
        .await
        .expect("another address");
    drop(a);
    let mut again = None;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if let Ok(w) = ws_from(&h, "nat", "127.0.2.1").await {
            again = Some(w);
            break;
        }
    }
    assert!(again.is_some(), "the address got its place back");
    // The default for a public tenant shows in its effective limits.
    let (_, v) = h
        .admin(reqwest::Method::GET, "/admin/v1/tenants/nat", None)
        .await;
    assert_eq!(
        v["effective_limits"]["max_connections_per_address"], 2,
        "{v}"
    );
    h.stop().await;
}
