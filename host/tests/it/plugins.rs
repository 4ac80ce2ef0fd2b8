//! Example plugins end to end over real clients: JWT authorization, audiences,
//! conflation windows (latest-wins and merge), hot swap and rollback.

use crate::helpers::*;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::Sha256;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const SECRET: &str = "jwt-test-secret-0123456789";

pub(crate) fn jwt(claims: Value, secret: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let h = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let p = b64.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{h}.{p}").as_bytes());
    format!("{h}.{p}.{}", b64.encode(mac.finalize().into_bytes()))
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn jwt_auth_decides_connect_and_subscribe() {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":"jwt","config":{"secret":SECRET,"default_channels":["public.*"]}}))
        .await;
    // Fail closed until a plugin is active.
    assert_eq!(h.ws_with("jwt", "token=x").await.err().unwrap().0, 403);
    h.install_plugin("jwt", "jwt_auth").await;

    // No token: answered as an unknown tenant would be (tests/it/probing.rs).
    let (s, v) = h.ws_with("jwt", "").await.err().unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let forged = jwt(json!({"sub":"mallory","exp":now_s()+60}), "wrong-secret");
    let (s, v) = h
        .ws_with("jwt", &format!("token={forged}"))
        .await
        .err()
        .unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("invalid_token"))
    );
    let expired = jwt(json!({"sub":"alice","exp":now_s()-10}), SECRET);
    let (s, v) = h
        .ws_with("jwt", &format!("token={expired}"))
        .await
        .err()
        .unwrap();
    assert_eq!((s, v["error"]["code"].as_str()), (403, Some("expired")));

    let good = jwt(
        json!({"sub":"alice","exp":now_s()+60,"channels":["user.{sub}.*","news"]}),
        SECRET,
    );
    let mut ws = h
        .ws_with("jwt", &format!("token={good}"))
        .await
        .ok()
        .unwrap();
    ws.sub("user.alice.inbox", 1).await;
    ws.sub("news", 2).await;
    ws.send(json!({"op":"sub","ch":"user.bob.inbox","id":3}))
        .await;
    let e = ws.next().await;
    assert_eq!(
        (e["code"].as_str(), e["id"].as_u64()),
        (Some("forbidden"), Some(3))
    );
    h.publish(
        "jwt",
        &key,
        json!({"ch":"user.alice.inbox","data":{"hi":1}}),
    )
    .await;
    assert_eq!(ws.next().await["data"], json!({"hi":1}));

    // A token without a channels claim gets the tenant's default patterns.
    let plain = jwt(json!({"sub":"bob"}), SECRET);
    let mut ws2 = h
        .ws_with("jwt", &format!("token={plain}"))
        .await
        .ok()
        .unwrap();
    ws2.sub("public.lobby", 1).await;
    ws2.send(json!({"op":"sub","ch":"news","id":2})).await;
    assert_eq!(ws2.next().await["code"], "forbidden");

    // The bearer header works too; SSE channels are authorized before streaming.
    let r = h
        .http
        .get(h.url("/v1/t/jwt/sse?ch=user.alice.x&ch=user.bob.x"))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        h.sse("jwt", &format!("ch=user.alice.x&token={good}"), None)
            .await
            .status,
        200
    );
    h.stop().await;
}

#[tokio::test]
async fn redact_delivers_one_variant_per_audience() {
    let h = spawn_host().await;
    let config = json!({"tokens":{"tp":"pro","tb":"basic"},"redact_fields":["bid","ask"]});
    let key = h.tenant(json!({"id":"r","config":config})).await;
    h.install_plugin("r", "redact").await;
    assert_eq!(h.ws_with("r", "token=nope").await.err().unwrap().0, 403);
    let mut pro = h.ws_with("r", "token=tp").await.ok().unwrap();
    let mut basic = h.ws_with("r", "token=tb").await.ok().unwrap();
    pro.sub("q", 1).await;
    basic.sub("q", 1).await;
    let mut sse = h.sse("r", "ch=q&token=tb", None).await;
    assert_eq!(sse.status, 200);
    for i in 1..=3 {
        let (s, _) = h
            .publish(
                "r",
                &key,
                json!({"ch":"q","data":{"px":i,"bid":0.9,"ask":1.1}}),
            )
            .await;
        assert_eq!(s, 200);
    }
    for i in 1..=3u64 {
        let p = pro.next().await;
        assert_eq!(
            (p["seq"].as_u64(), p["data"].clone()),
            (Some(i), json!({"px":i,"bid":0.9,"ask":1.1}))
        );
        let b = basic.next().await;
        assert_eq!(
            (b["seq"].as_u64(), b["prev"].as_u64(), b["data"].clone()),
            (Some(i), Some(i - 1), json!({"px":i}))
        );
        assert_eq!(sse.next().await.unwrap().data["data"], json!({"px":i}));
    }
    // Resume replays each audience's own variant.
    let mut late = h.ws_with("r", "token=tb").await.ok().unwrap();
    late.send(json!({"op":"sub","ch":"q","since":1,"id":9}))
        .await;
    assert_eq!(late.next().await["op"], "ack");
    assert_eq!(late.next().await["data"], json!({"px":2}));
    h.stop().await;
}

/// 1000 ticks of five symbols in one batch through `plugin` on a 400 ms
/// window; `tenant` is the calling test's own (the metrics recorder is shared
/// by every test of the binary).
async fn ticks_window(tenant: &str, plugin: &str) -> Vec<Value> {
    let h = spawn_host().await;
    let key = h
        .tenant(json!({"id":tenant,"access":"public","conflation":{"window_ms":400}}))
        .await;
    h.install_plugin(tenant, plugin).await;
    let conflated = format!("herald_window_conflated_total{{tenant=\"{tenant}\"}}");
    let before = h.metric(&conflated).await;
    let mut ws = h.ws(tenant).await;
    ws.sub("ticks", 1).await;
    let syms = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"];
    let batch: Vec<Value> = (0..1000)
        .map(|i| json!({"ch":"ticks","data":{"sym":syms[i % 5],"px":100 + i}}))
        .collect();
    let (s, v) = h.publish(tenant, &key, Value::Array(batch)).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["held"] == true));
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(ws.next().await);
    }
    // Nothing more arrives after the window closed.
    let more = tokio::time::timeout(Duration::from_millis(800), ws.s.next_frame_text()).await;
    assert!(more.is_err(), "extra message: {more:?}");
    assert_eq!(
        h.metric(&conflated).await - before,
        995.0,
        "all but the latest of each symbol absorbed by the window"
    );
    h.stop().await;
    got
}

trait NextText {
    async fn next_frame_text(&mut self) -> Option<String>;
}

impl NextText
    for tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>
{
    async fn next_frame_text(&mut self) -> Option<String> {
        use futures_util::StreamExt;
        loop {
            match self.next().await? {
                Ok(tokio_tungstenite::tungstenite::Message::Text(t)) => return Some(t.to_string()),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}

#[tokio::test]
async fn conflation_window_turns_1000_ticks_into_5() {
    let got = ticks_window("window-latest", "ticker_conflate").await;
    let mut seqs: Vec<u64> = got.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    seqs.sort();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    // Latest wins: the last tick of each symbol (i = 995..=999).
    let mut px: Vec<u64> = got
        .iter()
        .map(|m| m["data"]["px"].as_u64().unwrap())
        .collect();
    px.sort();
    assert_eq!(px, vec![1095, 1096, 1097, 1098, 1099]);
}

#[tokio::test]
async fn merge_window_keeps_high_low_last() {
    let got = ticks_window("window-merge", "ticker_merge").await;
    for m in &got {
        let d = &m["data"];
        assert_eq!(d["n"], 200, "{d}");
        let last = d["last"].as_f64().unwrap();
        assert_eq!(
            d["high"].as_f64().unwrap(),
            last,
            "prices rise, so the last is the high"
        );
        assert!(d["low"].as_f64().unwrap() < 105.0, "{d}");
    }
}

#[tokio::test]
async fn uploads_are_validated_and_listed() {
    let mut opts = HostOptions::new();
    opts.config.limits.plugin_max_bytes = 1 << 20;
    let h = spawn_with(opts).await;
    h.public_tenant("u").await;
    let (s, v) = h.upload_plugin("u", Vec::new()).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = h.upload_plugin("u", b"\0asm garbage".to_vec()).await;
    assert_eq!(s, 422);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("compile"),
        "{v}"
    );
    let (s, v) = h.upload_plugin("u", vec![0; (1 << 20) + 1]).await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugin_max_bytes"),
        "{v}"
    );
    assert_eq!(h.upload_plugin("ghost", plugin_wasm("redact")).await.0, 404);
    let (s, v) = h.upload_plugin("u", plugin_wasm("ticker_conflate")).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        (v["version"].as_i64(), v["name"].as_str()),
        (Some(1), Some("ticker-conflate"))
    );
    assert_eq!(v["hooks"]["transform"], true);
    assert_eq!(v["sha256"].as_str().unwrap().len(), 64);
    let (_, v2) = h.upload_plugin("u", plugin_wasm("ticker_merge")).await;
    assert_eq!(v2["version"], 2);
    let (s, _) = h
        .admin(Method::POST, "/admin/v1/tenants/u/plugins/9/activate", None)
        .await;
    assert_eq!(s, 404);
    h.activate("u", 2).await;
    let (_, list) = h
        .admin(Method::GET, "/admin/v1/tenants/u/plugins", None)
        .await;
    assert_eq!(list["active"], 2);
    let versions = list["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(
        (
            versions[0]["active"].as_bool(),
            versions[1]["active"].as_bool()
        ),
        (Some(false), Some(true))
    );
    h.stop().await;
}

/// Swap and roll back under a steady publish load: no connection dropped,
/// no position lost or duplicated, the new behaviour on the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swap_under_load_loses_nothing() {
    let h = spawn_host().await;
    let key = h.public_tenant("hs").await;
    let v1 = h.install_plugin("hs", "ticker_conflate").await;
    let (_, up) = h.upload_plugin("hs", plugin_wasm("ticker_merge")).await;
    let v2 = up["version"].as_i64().unwrap();
    let mut subs = Vec::new();
    for _ in 0..3 {
        let mut ws = h.ws("hs").await;
        ws.sub("ticks", 1).await;
        subs.push(ws);
    }
    let mut sse = h.sse("hs", "ch=ticks", None).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (http, url, key, stop) = (
            h.http.clone(),
            h.url("/v1/t/hs/publish"),
            key.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut last = 0;
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 5000 {
                let r = http
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&json!({"ch":"ticks","data":{"sym":"AAPL","px":i}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                last = r.json::<Value>().await.unwrap()["seq"].as_u64().unwrap();
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            last
        })
    };
    let probe = |h: &Host| {
        let (http, url, key) = (h.http.clone(), h.url("/v1/t/hs/publish"), key.clone());
        async move {
            let r = http
                .post(&url)
                .bearer_auth(&key)
                .json(&json!({"ch":"ticks","data":{"sym":"AAPL","px":1}}))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()["seq"].as_u64().unwrap()
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.activate("hs", v2).await;
    let swap_seq = probe(&h).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.activate("hs", v1).await;
    let back_seq = probe(&h).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last_published = publisher.await.unwrap().max(back_seq);
    let total = probe(&h).await;
    assert!(
        total > last_published && total > 100,
        "steady load: {total} messages"
    );

    // The probes ran after each activation returned, so they show the version
    // just activated, and so does every message after a probe but the one
    // publish that may have been in flight across the swap: it finishes on
    // the version it started on and may land right after the probe (the
    // publisher is sequential, so there is at most one). Messages that began
    // after an activation took effect but before it returned come before the
    // probe on the new version: between the two probes the behaviour switches
    // from merged to not merged once, and never back.
    assert!(
        back_seq > swap_seq + 2,
        "the load went on between the swap ({swap_seq}) and the rollback ({back_seq})"
    );
    let check = |seq: u64, data: &Value, rolled_back: &mut Option<u64>| {
        let merged = data.get("last").is_some();
        if seq == swap_seq {
            assert!(
                merged,
                "new behaviour on the next message after activation: {data}"
            );
        }
        if seq > swap_seq + 1 && seq < back_seq {
            match (merged, *rolled_back) {
                (false, None) => *rolled_back = Some(seq),
                (true, Some(first)) => panic!(
                    "seq {seq}, between the swap ({swap_seq}) and the rollback ({back_seq}), ran on the new version after seq {first} ran on the old: {data}"
                ),
                _ => {}
            }
        }
        if seq == back_seq || seq > back_seq + 1 {
            assert!(
                !merged,
                "seq {seq}, after the rollback ({back_seq}): {data}"
            );
        }
    };
    let settled = |rolled_back: Option<u64>| {
        assert!(
            rolled_back.is_none_or(|first| first > swap_seq + 2),
            "nothing between the swap ({swap_seq}) and the rollback ({back_seq}) ran on the new version"
        );
    };
    for ws in subs.iter_mut() {
        let (mut last, mut rolled_back) = (0, None);
        while last < total {
            let m = ws.next().await;
            let (seq, prev) = (m["seq"].as_u64().unwrap(), m["prev"].as_u64().unwrap());
            assert_eq!(prev, last, "no gap or duplicate");
            check(seq, &m["data"], &mut rolled_back);
            last = seq;
        }
        settled(rolled_back);
        ws.send(json!({"op":"ping","id":1})).await;
        assert_eq!(ws.next().await["op"], "pong", "still connected");
    }
    let (mut last, mut rolled_back) = (0, None);
    while last < total {
        let e = sse.next().await.expect("sse stream still open");
        let (seq, prev) = (
            e.data["seq"].as_u64().unwrap(),
            e.data["prev"].as_u64().unwrap(),
        );
        assert_eq!(prev, last);
        check(seq, &e.data["data"], &mut rolled_back);
        last = seq;
    }
    settled(rolled_back);
    h.stop().await;
}

#[tokio::test]
async fn active_plugin_survives_restart() {
    let h = spawn_host().await;
    let config = json!({"tokens":{"tp":"pro"},"redact_fields":["bid"]});
    let key = h.tenant(json!({"id":"r-restart","config":config})).await;
    h.install_plugin("r-restart", "redact").await;
    let h = h.restart().await;
    assert_eq!(
        h.ws_with("r-restart", "token=bad").await.err().unwrap().0,
        403
    );
    let mut ws = h.ws_with("r-restart", "token=tp").await.ok().unwrap();
    ws.sub("q", 1).await;
    h.publish("r-restart", &key, json!({"ch":"q","data":{"bid":1}}))
        .await;
    assert_eq!(ws.next().await["data"], json!({"bid":1}));
    h.stop().await;
}

/// A component built against `herald:plugin@0.1.0` (checked in, built from
/// the last 0.1.0 SDK).
fn plugin_0_1(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/plugin-0.1.0")
        .join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The host runs 0.1.0 and 0.2.0 components side by side — two
/// tenants, one on each build of jwt-auth, decide alike, a 0.1.0 transform
/// publishes beside a 0.2.0 one, and a tenant swaps from 0.1.0 to 0.2.0
/// without a restart.
#[tokio::test]
async fn components_of_both_contracts_run_side_by_side() {
    let h = spawn_host().await;
    let config = json!({"secret":SECRET,"default_channels":["public.*"]});
    for (tenant, bytes) in [
        ("old-jwt", plugin_0_1("jwt_auth")),
        ("new-jwt", plugin_wasm("jwt_auth")),
    ] {
        let key = h.tenant(json!({"id":tenant,"config":config.clone()})).await;
        let (s, v) = h.upload_plugin(tenant, bytes).await;
        assert_eq!(s, 201, "{v}");
        let contract = if tenant == "old-jwt" {
            "herald:plugin@0.1.0"
        } else {
            "herald:plugin@0.2.0"
        };
        assert_eq!(v["contract"], contract, "{v}");
        h.activate(tenant, v["version"].as_i64().unwrap()).await;
        let (s, v) = h.ws_with(tenant, "token=x").await.err().unwrap();
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("invalid_token"))
        );
        let good = jwt(
            json!({"sub":"alice","exp":now_s()+60,"channels":["user.{sub}.*"]}),
            SECRET,
        );
        let mut ws = h
            .ws_with(tenant, &format!("token={good}"))
            .await
            .ok()
            .unwrap();
        ws.sub("user.alice.inbox", 1).await;
        ws.send(json!({"op":"sub","ch":"user.bob.inbox","id":2}))
            .await;
        assert_eq!(ws.next().await["code"], "forbidden", "{tenant}");
        h.publish(
            tenant,
            &key,
            json!({"ch":"user.alice.inbox","data":{"hi":tenant}}),
        )
        .await;
        assert_eq!(ws.next().await["data"], json!({"hi":tenant}));
    }

    // A 0.1.0 transform, then a live swap to the 0.2.0 build of it.
    let key = h.public_tenant("swap-contract").await;
    let (s, v) = h
        .upload_plugin("swap-contract", plugin_0_1("ticker_conflate"))
        .await;
    assert_eq!(
        (s, v["contract"].as_str()),
        (201, Some("herald:plugin@0.1.0")),
        "{v}"
    );
    h.activate("swap-contract", v["version"].as_i64().unwrap())
        .await;
    let mut ws = h.ws("swap-contract").await;
    ws.sub("ticks.ABC", 1).await;
    let tick = |px: u64| json!({"ch":"ticks.ABC","data":{"sym":"ABC","px":px}});
    let (s, v) = h.publish("swap-contract", &key, tick(1)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ws.next().await["data"]["px"], 1);
    let v2 = h.install_plugin("swap-contract", "ticker_conflate").await;
    assert_eq!(v2, 2);
    let (s, v) = h.publish("swap-contract", &key, tick(2)).await;
    assert_eq!(s, 200, "{v}");
    let m = ws.next().await;
    assert_eq!(
        (m["data"]["px"].as_u64(), m["seq"].as_u64()),
        (Some(2), Some(2)),
        "{m}"
    );
    h.stop().await;
}
