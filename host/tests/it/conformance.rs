//! One conformance suite for every plugin language. The same
//! plugin (plugins/example/SPEC.md) written in Rust, Python, JavaScript and
//! C gets the same inputs and must give the same answers: the same
//! sessions and denials, the same messages byte for byte, the same records
//! refused, and the same named failures for the hostile cases (a loop, a
//! memory bomb, an exception, output that breaks the contract, a print).

use crate::helpers::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn config() -> Value {
    json!({
        "tokens": {
            "tok-alice": {"subject": "alice", "audience": "pro"},
            "tok-bob": {"subject": "bob"},
            "tok-odd": {"subject": 7},
        },
        "hostile": true,
    })
}

/// A tenant running `lang`'s example; returns its publish key.
async fn tenant(h: &Host, id: &str, lang: &str) -> String {
    // A deadline with room for a loaded machine (a component compiling on
    // both cores beside it): the example's calls take ~1 ms; only the
    // hostile LOOP record runs into it.
    let limits = json!({"plugin_deadline_ms": 1000, "plugin_memory_bytes": 128 << 20});
    let key = h
        .tenant(json!({"id":id,"access":"plugin","config":config(),"limits":limits}))
        .await;
    let (s, v) = h.upload_plugin(id, example_component(lang)).await;
    assert_eq!(s, 201, "{lang}: {v}");
    assert_eq!(v["name"], format!("herald-example-{lang}"), "{v}");
    assert_eq!(v["plugin_version"], "1.0.0", "{v}");
    assert_eq!(
        v["hooks"],
        json!({"authorize_connect":true,"authorize_subscribe":true,"transform":true,"merge":false}),
        "{lang}"
    );
    assert_eq!(v["contract"], "herald:plugin@0.2.0");
    let encoding = if lang == "rust" { "flat" } else { "typed" };
    assert_eq!(v["transform_encoding"], encoding, "{lang}");
    h.activate(id, v["version"].as_i64().unwrap()).await;
    key
}

async fn refused(h: &Host, t: &str, query: &str) -> (u16, String) {
    let (s, v) = h.ws_with(t, query).await.err().expect("refused");
    (
        s,
        v["error"]["code"].as_str().unwrap_or_default().to_string(),
    )
}

/// The answer to a subscribe: ("ack", "") or ("err", the plugin's denial
/// code, which the `err` frame's message starts with; its code is
/// "forbidden" for every denial).
async fn sub_answer(ws: &mut Ws, ch: &str, id: u64) -> (String, String) {
    ws.send(json!({"op":"sub","ch":ch,"id":id})).await;
    let m = ws.next().await;
    assert_eq!(m["id"], id, "{m}");
    let op = m["op"].as_str().unwrap_or_default().to_string();
    if op == "ack" {
        return (op, String::new());
    }
    assert_eq!(m["code"], "forbidden", "{m}");
    let message = m["msg"].as_str().unwrap_or_default();
    let code = message.split_once(':').map_or(message, |(c, _)| c);
    (op, code.to_string())
}

/// Publishes a raw body; (status, answer).
async fn publish_raw(h: &Host, t: &str, key: &str, body: String) -> (u16, Value) {
    let r = h
        .http
        .post(h.url(&format!("/v1/t/{t}/publish")))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

async fn conformance(lang: &str) {
    let h = spawn_host().await;
    let t = format!("conf-{lang}");
    let key = tenant(&h, &t, lang).await;

    // authorize-connect
    let expect = [
        // No credentials: the plugin denies, the host answers as for an
        // unknown tenant (probing.rs).
        ("", (401, "unauthorized")),
        ("token=", (403, "invalid_token")),
        ("token=tok-zzz", (403, "invalid_token")),
        ("token=tok-odd", (403, "invalid_token")),
        ("token=hostile-print", (403, "invalid_token")),
        ("token=hostile-throw", (503, "plugin_trap")),
        ("token=hostile-loop", (503, "plugin_timeout")),
    ];
    for (query, (status, code)) in expect {
        assert_eq!(
            refused(&h, &t, query).await,
            (status, code.to_string()),
            "{lang}: connect with {query:?}"
        );
    }
    let mut alice = h.ws_with(&t, "token=tok-alice").await.expect("alice");
    let mut bob = h.ws_with(&t, "token=tok-bob").await.expect("bob");

    // authorize-subscribe
    let alice_subs = [
        ("public.x", ("ack", "")),
        ("ticks.ABC", ("ack", "")),
        ("user.alice", ("ack", "")),
        ("user.alice.inbox", ("ack", "")),
        ("ticks.DEF", ("ack", "")),
        ("ticks.PRINT", ("ack", "")),
        ("ticks.TIME", ("ack", "")),
        ("ticks.ESCA", ("ack", "")),
        ("user.bob", ("err", "forbidden")),
        ("user.alicex", ("err", "forbidden")),
        ("other.x", ("err", "unknown_channel")),
        ("public", ("err", "unknown_channel")),
    ];
    for (i, (ch, (op, code))) in alice_subs.iter().enumerate() {
        assert_eq!(
            sub_answer(&mut alice, ch, i as u64 + 1).await,
            (op.to_string(), code.to_string()),
            "{lang}: alice subscribes {ch}"
        );
    }
    assert_eq!(sub_answer(&mut bob, "ticks.DEF", 1).await.0, "ack");
    assert_eq!(sub_answer(&mut bob, "user.bob.x", 2).await.0, "ack");

    // transform: one batch, record by record
    let dead = format!("herald_plugin_dead_letters_total{{tenant=\"{t}\",kind=\"bad_output\"}}");
    let dead_before = h.metric(&dead).await;
    let items = [
        r#"{"data":{"sym":"abc","px":"1.5"}}"#,
        r#"{"ch":"public.x","data":{"sym":"x1","px":"-3.25","extra":[1,{"a":null}]}}"#,
        r#"{"data":{"sym":"def","px":"7","aud":"pro"}}"#,
        r#"{"data":{"px":"8","sym":"def","aud":null}}"#,
        r#"{"data":{"sym":"toolongsymbol","px":"1"}}"#,
        r#"{"data":{"sym":"ab","px":"1e3"}}"#,
        r#"{"data":"just a string"}"#,
        r#"{"data":{"sym":"ab","px":"1","aud":"PRO"}}"#,
        r#"{"data":{"sym":"BADKEY","px":"1"}}"#,
        r#"{"data":{"sym":"BADCHAN","px":"1"}}"#,
        r#"{"data":{"sym":"PRINT","px":"2"}}"#,
        r#"{"data":{"sym":"TIME","px":"x"}}"#,
        r#"{"data":{"sym":"a\u00e9","px":"1"}}"#,
        r#"{"data":{"sym":"esc\u0041","px":"0.00000001"}}"#,
        r#"{"data":{"sym":"ab","px":1}}"#,
        r#"{"data":{"sym":"ab","px":"1234567890123"}}"#,
        r#"{"data":[{"sym":"ab","px":"1"}]}"#,
    ];
    let (s, v) = publish_raw(&h, &t, &key, format!("[{}]", items.join(","))).await;
    assert_eq!(s, 200, "{lang}: {v}");
    let channels: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ch"].as_str().unwrap())
        .collect();
    assert_eq!(
        channels,
        [
            "ticks.ABC",
            "public.x",
            "ticks.DEF",
            "ticks.DEF",
            "ticks.PRINT",
            "ticks.TIME",
            "ticks.ESCA"
        ],
        "{lang}: {v}"
    );
    assert_eq!(
        h.metric(&dead).await - dead_before,
        2.0,
        "{lang}: BADKEY and BADCHAN refused alone"
    );
    let mut got: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for _ in 0..7 {
        let m = alice.next().await;
        assert_eq!(m["op"], "msg", "{m}");
        got.entry(m["ch"].as_str().unwrap().to_string())
            .or_default()
            .push(m["data"].clone());
    }
    let want: BTreeMap<String, Vec<Value>> = [
        ("ticks.ABC", vec![json!({"sym":"ABC","px":"1.5"})]),
        ("public.x", vec![json!({"sym":"X1","px":"-3.25"})]),
        (
            "ticks.DEF",
            vec![json!({"sym":"DEF","px":"7"}), json!({"sym":"DEF","px":"8"})],
        ),
        ("ticks.PRINT", vec![json!({"sym":"PRINT","px":"2"})]),
        ("ticks.TIME", vec![json!({"sym":"TIME","px":"0"})]),
        ("ticks.ESCA", vec![json!({"sym":"ESCA","px":"0.00000001"})]),
    ]
    .into_iter()
    .map(|(c, v)| (c.to_string(), v))
    .collect();
    assert_eq!(got, want, "{lang}");
    // Bob has no audience: the "pro" message never reaches him.
    assert_eq!(
        bob.next().await["data"],
        json!({"sym":"DEF","px":"8"}),
        "{lang}"
    );
    let (s, v) = publish_raw(&h, &t, &key, r#"{"data":{"sym":"def","px":"9"}}"#.into()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        bob.next().await["data"],
        json!({"sym":"DEF","px":"9"}),
        "{lang}"
    );
    assert_eq!(alice.next().await["data"], json!({"sym":"DEF","px":"9"}));

    // The hostile transforms fail with their kind; the guest's words ride along.
    for (sym, kind, text) in [
        ("LOOP", "timeout", None),
        ("BOMB", "memory", None),
        ("THROW", "trap", Some("herald-example: thrown on request")),
    ] {
        let body = format!(r#"{{"data":{{"sym":"{sym}","px":"1"}}}}"#);
        let (s, v) = publish_raw(&h, &t, &key, body).await;
        assert_eq!(s, 502, "{lang} {sym}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("({kind})")),
            "{lang} {sym}: {message}"
        );
        if let Some(text) = text {
            assert!(message.contains(text), "{lang} {sym}: {message}");
        }
    }
    // A record that alone runs past the deadline costs only itself: its
    // batch is split down to it and the others are published.
    let timeouts = format!("herald_plugin_dead_letters_total{{tenant=\"{t}\",kind=\"timeout\"}}");
    let timeouts_before = h.metric(&timeouts).await;
    let body = r#"[{"data":{"sym":"abc","px":"4"}},{"data":{"sym":"LOOP","px":"1"}},{"data":{"sym":"def","px":"5"}}]"#;
    let (s, v) = publish_raw(&h, &t, &key, body.into()).await;
    assert_eq!(s, 200, "{lang}: {v}");
    assert_eq!(
        v["results"].as_array().map(Vec::len),
        Some(2),
        "{lang}: {v}"
    );
    assert_eq!(h.metric(&timeouts).await - timeouts_before, 1.0);
    assert_eq!(alice.next().await["data"], json!({"sym":"ABC","px":"4"}));
    assert_eq!(alice.next().await["data"], json!({"sym":"DEF","px":"5"}));
    assert_eq!(bob.next().await["data"], json!({"sym":"DEF","px":"5"}));

    // ...and the tenant serves on, with fresh instances.
    let (s, v) = publish_raw(&h, &t, &key, r#"{"data":{"sym":"abc","px":"3"}}"#.into()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(alice.next().await["data"], json!({"sym":"ABC","px":"3"}));
    let mut carol = h
        .ws_with(&t, "token=tok-alice")
        .await
        .expect("after the failures");
    assert_eq!(sub_answer(&mut carol, "ticks.ABC", 1).await.0, "ack");

    // Randomness: two fresh instances (two tenants that did the same) draw
    // the same bytes.
    let mut rand = Vec::new();
    for suffix in ["r1", "r2"] {
        let id = format!("{t}-{suffix}");
        let key = tenant(&h, &id, lang).await;
        let (s, v) = publish_raw(&h, &id, &key, r#"{"data":{"sym":"RAND"}}"#.into()).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["ch"], "ticks.RAND", "{v}");
        let mut ws = h.ws_with(&id, "token=tok-bob").await.expect("bob");
        ws.send(json!({"op":"sub","ch":"ticks.RAND","id":1,"since":0}))
            .await;
        let m = next_op(&mut ws, "msg", WAIT).await;
        let px = m["data"]["px"].as_str().unwrap_or_default().to_string();
        assert!(
            px.len() == 16 && px.bytes().all(|b| b.is_ascii_hexdigit()),
            "{lang}: {m}"
        );
        rand.push(px);
    }
    assert_eq!(rand[0], rand[1], "{lang}: WASI randomness is fixed");
    h.stop().await;
}

#[tokio::test]
async fn rust_conforms() {
    conformance("rust").await;
}

#[tokio::test]
async fn python_conforms() {
    conformance("python").await;
}

#[tokio::test]
async fn js_conforms() {
    conformance("js").await;
}

#[tokio::test]
async fn c_conforms() {
    conformance("c").await;
}

/// Without a transform to pick it, a publish must name its channel.
#[tokio::test]
async fn a_channel_may_be_left_out_only_for_a_transform() {
    let h = spawn_host().await;
    let key = h.public_tenant("no-transform").await;
    let (s, v) = publish_raw(&h, "no-transform", &key, r#"{"data":1}"#.into()).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ch: required"),
        "{v}"
    );
    h.stop().await;
}

/// Starts a host on `data_dir` without waiting for readiness: it answers
/// /healthz as soon as it listens.
async fn start_listening(data_dir: std::path::PathBuf, dir: Option<tempfile::TempDir>) -> Host {
    let mut opts = HostOptions::new().own_compiled();
    opts.config.data_dir = data_dir;
    opts.dir = dir;
    let (host, _) = spawn_unready(opts).await;
    host
}

/// A restart does not compile again what it compiled before (the
/// artifacts on disk are loaded), listens before any plugin is loaded, and
/// a tenant whose plugin is still compiling answers 503 `plugin_loading`
/// with Retry-After while the others serve; once loaded it serves too.
#[tokio::test]
async fn a_restart_listens_at_once_and_reuses_compiled_plugins() {
    let h = spawn_with(HostOptions::new().own_compiled()).await;
    let key_small = h.public_tenant("small").await;
    h.install_plugin("small", "ticker_conflate").await;
    let key_plain = h.public_tenant("plain").await;
    let _ = tenant(&h, "big", "python").await;
    let compiled = h.data_dir.join("compiled");
    let artifact = |sha: &str| compiled.join(format!("{sha}.cwasm"));
    let (_, list) = h
        .admin(
            reqwest::Method::GET,
            "/admin/v1/tenants/small/plugins",
            None,
        )
        .await;
    let small_sha = list["versions"][0]["sha256"].as_str().unwrap().to_string();
    let (_, list) = h
        .admin(reqwest::Method::GET, "/admin/v1/tenants/big/plugins", None)
        .await;
    let big_sha = list["versions"][0]["sha256"].as_str().unwrap().to_string();
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(artifact(&small_sha))
        .expect("kept on disk")
        .ino();
    assert!(artifact(&big_sha).exists());

    // Restart with the big one's artifact gone: it must compile again.
    let data_dir = h.data_dir.clone();
    let dir = h.stop().await;
    std::fs::remove_file(artifact(&big_sha)).unwrap();
    let h = start_listening(data_dir, dir).await;
    let (s, v) = h
        .ws_with("big", "token=tok-alice")
        .await
        .err()
        .expect("still loading");
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("plugin_loading")),
        "{v}"
    );
    // Not ready (a load balancer keeps it out) while a plugin of the start
    // still loads, though it listens and serves the other tenants.
    let r = h.http.get(h.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503, "/readyz while the big plugin compiles");
    let (s, v) = publish_raw(&h, "big", "x", "{}".into()).await;
    assert_eq!(s, 401, "the key is checked first: {v}");
    // The tenant without a plugin serves while the other compiles.
    let mut ws = h.ws("plain").await;
    ws.sub("c", 1).await;
    let (s, _) = h
        .publish("plain", &key_plain, json!({"ch":"c","data":1}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(ws.next().await["data"], 1);
    // Ready once every plugin is loaded; then the big one serves.
    wait_ready(&h).await;
    h.ws_with("big", "token=tok-alice").await.expect("loaded");
    let (s, v) = h
        .publish(
            "small",
            &key_small,
            json!({"ch":"ticks.A","data":{"sym":"A","px":1}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        std::fs::metadata(artifact(&small_sha)).unwrap().ino(),
        inode,
        "the small one was loaded from disk, not compiled and written again"
    );
    assert!(artifact(&big_sha).exists(), "compiled again and kept");

    // A stop while a plugin compiles is not kept waiting for the compile.
    let data_dir = h.data_dir.clone();
    let dir = h.stop().await;
    std::fs::remove_file(artifact(&big_sha)).unwrap();
    let h = start_listening(data_dir, dir).await;
    let (s, _) = h
        .ws_with("big", "token=tok-alice")
        .await
        .err()
        .expect("still loading");
    assert_eq!(s, 503);
    let t = std::time::Instant::now();
    h.stop().await;
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "the stop waited {:?}",
        t.elapsed()
    );
}

/// A large upload is answered at once (202 and a status to
/// poll) and compiles in the background; the same bytes uploaded again
/// meanwhile get the same answer; the status ends "stored" with the
/// version, and compiled versions nobody runs or just uploaded are evicted
/// from memory.
#[tokio::test]
async fn a_large_upload_compiles_in_the_background() {
    let h = spawn_with(HostOptions::new().own_compiled()).await;
    h.tenant(json!({"id":"bg","access":"public"})).await;
    let url = h.url("/admin/v1/tenants/bg/plugins");
    let bytes = example_component("js");
    assert!(bytes.len() > 1 << 20);
    let t = std::time::Instant::now();
    let (s, first) = upload_once(&h.http, &url, bytes.clone()).await;
    assert_eq!(s, 202, "{first}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "answered before compiling"
    );
    assert_eq!(first["status"], "compiling");
    let (s, again) = upload_once(&h.http, &url, bytes).await;
    assert_eq!(
        (s, &again["status_url"]),
        (202, &first["status_url"]),
        "{again}"
    );
    let path = first["status_url"].as_str().unwrap();
    let stored = loop {
        let (s, v) = h.admin(reqwest::Method::GET, path, None).await;
        assert_eq!(s, 200, "{v}");
        if v["status"] != "compiling" {
            break v;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(180), "{v}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(stored["status"], "stored", "{stored}");
    assert_eq!(
        stored["version"], 1,
        "one version for both uploads: {stored}"
    );
    assert_eq!(stored["name"], "herald-example-js");
    let (s, _) = h
        .admin(
            reqwest::Method::GET,
            "/admin/v1/tenants/bg/uploads/00",
            None,
        )
        .await;
    assert_eq!(s, 404);
    // Stored, not active, the newest upload: kept compiled in memory for
    // the activation that usually follows. A newer upload takes its place:
    // then it is not kept (the disk has it) until it is activated.
    let compiled = |v: &Value, i: usize| v["versions"][i]["compiled"].as_bool();
    let list = || async {
        h.admin(reqwest::Method::GET, "/admin/v1/tenants/bg/plugins", None)
            .await
            .1
    };
    assert_eq!(compiled(&list().await, 0), Some(true));
    let (s, v) = h.upload_plugin("bg", example_component("rust")).await;
    assert_eq!(s, 201, "{v}");
    let now = list().await;
    assert_eq!(
        (compiled(&now, 0), compiled(&now, 1)),
        (Some(false), Some(true)),
        "{now}"
    );
    h.activate("bg", 1).await;
    assert_eq!(compiled(&list().await, 0), Some(true));
    h.stop().await;
}

/// The C bindings are generated once and checked in (building a C plugin
/// needs no Rust toolchain): they must be those of today's WIT.
#[test]
fn c_bindings_match_the_wit() {
    use sha2::Digest;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let wit = std::fs::read(root.join("sdk/wit/herald.wit")).unwrap();
    let recorded = std::fs::read_to_string(root.join("sdk/c/bindings/WIT.sha256")).unwrap();
    let hex: String = sha2::Sha256::digest(&wit)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        recorded.trim(),
        hex,
        "sdk/wit/herald.wit changed: regenerate sdk/c/bindings (see its README.md)"
    );
}
