//! The OpenAPI document is generated from the code, and it cannot
//! drift: every operation it lists is called here, and every real answer
//! (status, content type, body) is validated against the document's schema
//! for that status. The validator is strict where the document is: an
//! object schema that lists properties admits no others, so a field a
//! handler adds without describing it fails here too.

use crate::helpers::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

/// Validates `v` against `schema` (the subset of JSON Schema 2020-12 that
/// utoipa writes); returns every violation with its JSON path.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/components/schemas/");
        let target = &doc["components"]["schemas"][name];
        assert!(target.is_object(), "dangling $ref {r}");
        return validate(doc, target, v, at, errs);
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            validate(doc, s, v, at, errs);
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = schema.get(key).and_then(Value::as_array) {
            let fits = alts
                .iter()
                .filter(|s| {
                    let mut e = Vec::new();
                    validate(doc, s, v, at, &mut e);
                    e.is_empty()
                })
                .count();
            let ok = if key == "oneOf" { fits == 1 } else { fits >= 1 };
            if !ok {
                errs.push(format!("{at}: {fits} of the {key} alternatives fit {v}"));
            }
        }
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let is = |ty: &str| match ty {
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            _ => false,
        };
        if !types.iter().any(|ty| is(ty)) {
            errs.push(format!("{at}: {v} is not {types:?}"));
            return;
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            errs.push(format!("{at}: {v} not in {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            errs.push(format!("{at}: {n} < minimum {min}"));
        }
    }
    if let Some(o) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            if !o.contains_key(r) {
                errs.push(format!("{at}: required {r:?} missing"));
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(doc, s, x, &format!("{at}.{k}"), errs),
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(true)) => {}
                    Some(s) if s.is_object() => validate(doc, s, x, &format!("{at}.{k}"), errs),
                    // Listed properties and nothing about others: strict.
                    _ if props.is_some() => errs.push(format!("{at}: {k:?} is not in the schema")),
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(a)) = (schema.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            validate(doc, items, x, &format!("{at}[{i}]"), errs);
        }
    }
}

struct Checker {
    doc: Value,
    called: BTreeSet<(String, String)>,
}

impl Checker {
    /// Checks one real answer of `method template` against the document.
    async fn check(
        &mut self,
        method: &str,
        template: &str,
        req: reqwest::RequestBuilder,
    ) -> (u16, Value) {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let kind = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let text = r.text().await.unwrap();
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{method} {template} is not in the document");
        self.called
            .insert((method.to_string(), template.to_string()));
        let answer = &op["responses"][status.to_string()];
        assert!(
            answer.is_object(),
            "{method} {template} answered {status}, which the document does not list: {text}"
        );
        let Some(content) = answer.get("content").and_then(Value::as_object) else {
            assert!(
                text.is_empty(),
                "{method} {template} {status}: no content documented, got {text}"
            );
            return (status, Value::Null);
        };
        let kind = kind.unwrap_or_default();
        let (documented, media) = content
            .iter()
            .find(|(k, _)| kind.starts_with(k.as_str()))
            .unwrap_or_else(|| {
                panic!(
                    "{method} {template} {status}: content type {kind:?} not documented ({:?})",
                    content.keys()
                )
            });
        if documented != "application/json" {
            return (status, Value::String(text));
        }
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {template} {status}: not JSON ({e}): {text}"));
        let mut errs = Vec::new();
        validate(&self.doc, &media["schema"], &v, "$", &mut errs);
        assert!(
            errs.is_empty(),
            "{method} {template} {status} does not match the document:\n  {}\nanswer: {v}",
            errs.join("\n  ")
        );
        (status, v)
    }
}

#[tokio::test]
async fn every_operation_answers_as_the_generated_document_says() {
    let h = spawn_host().await;
    let doc: Value = h
        .http
        .get(h.url("/admin/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut c = Checker {
        doc,
        called: BTreeSet::new(),
    };
    let admin = |m: Method, path: &str| h.http.request(m, h.url(path)).bearer_auth(ADMIN);

    // Health.
    for p in ["/healthz", "/readyz", "/metrics", "/admin/v1/openapi.json"] {
        let (s, _) = c.check("get", p, h.http.get(h.url(p))).await;
        assert_eq!(s, 200, "{p}");
    }

    // Tenants.
    let t = "/admin/v1/tenants";
    let body = json!({"id": "doc", "access": "public", "config": {"a": 1}, "limits": {"history_size": 50},
        "conflation": {"window_ms": 0}, "allowed_origins": ["http://localhost:1"]});
    let (s, created) = c.check("post", t, admin(Method::POST, t).json(&body)).await;
    assert_eq!(s, 201);
    let key = created["publish_key"].as_str().unwrap().to_string();
    assert_eq!(
        c.check("post", t, admin(Method::POST, t).json(&body))
            .await
            .0,
        409
    );
    assert_eq!(
        c.check(
            "post",
            t,
            admin(Method::POST, t).json(&json!({"id": "Bad!"}))
        )
        .await
        .0,
        400
    );
    assert_eq!(
        c.check("post", t, h.http.post(h.url(t)).json(&body))
            .await
            .0,
        401
    );
    h.public_tenant("plain").await;
    assert_eq!(c.check("get", t, admin(Method::GET, t)).await.0, 200);
    let one = "/admin/v1/tenants/{tenant}";
    assert_eq!(
        c.check("get", one, admin(Method::GET, "/admin/v1/tenants/doc"))
            .await
            .0,
        200
    );
    assert_eq!(
        c.check("get", one, admin(Method::GET, "/admin/v1/tenants/none"))
            .await
            .0,
        404
    );
    let patch = json!({"limits": {"history_size": null}, "allowed_origins": null});
    assert_eq!(
        c.check(
            "patch",
            one,
            admin(Method::PATCH, "/admin/v1/tenants/doc").json(&patch)
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.check(
            "patch",
            one,
            admin(Method::PATCH, "/admin/v1/tenants/doc").json(&json!({"limits": 3}))
        )
        .await
        .0,
        400
    );
    let rot = "/admin/v1/tenants/{tenant}/publish-key";
    let (s, rotated) = c
        .check(
            "post",
            rot,
            admin(Method::POST, "/admin/v1/tenants/doc/publish-key"),
        )
        .await;
    assert_eq!(s, 200);
    let key = rotated["publish_key"].as_str().map_or(key, str::to_string);
    let src = "/admin/v1/tenants/{tenant}/source";
    assert_eq!(
        c.check(
            "get",
            src,
            admin(Method::GET, "/admin/v1/tenants/doc/source")
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.check(
            "put",
            src,
            admin(Method::PUT, "/admin/v1/tenants/doc/source")
                .json(&json!({"kind": "http", "stall_after_ms": 60000}))
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.check(
            "put",
            src,
            admin(Method::PUT, "/admin/v1/tenants/doc/source").json(&json!({"kind": "pigeon"}))
        )
        .await
        .0,
        400
    );
    assert_eq!(
        c.check(
            "get",
            "/admin/v1/nodes",
            admin(Method::GET, "/admin/v1/nodes")
        )
        .await
        .0,
        200
    );

    // Publish, one and a batch, and refusals.
    let p = "/v1/t/{tenant}/publish";
    let publish = |b: Value| {
        h.http
            .post(h.url("/v1/t/doc/publish"))
            .bearer_auth(&key)
            .json(&b)
    };
    let mut ws = h.ws("doc").await;
    assert_eq!(ws.sub("prices", 1).await["op"], "ack");
    assert_eq!(
        c.check(
            "post",
            p,
            publish(json!({"ch": "prices", "data": {"px": 1}, "key": "k"}))
        )
        .await
        .0,
        200
    );
    let (s, batch) = c
        .check(
            "post",
            p,
            publish(json!([{"ch": "prices", "data": 2}, {"ch": "other", "data": "x"}])),
        )
        .await;
    assert_eq!(
        (s, batch["results"].as_array().map(Vec::len)),
        (200, Some(2))
    );
    assert_eq!(c.check("post", p, publish(json!({"data": 1}))).await.0, 400);
    assert_eq!(
        c.check(
            "post",
            p,
            h.http
                .post(h.url("/v1/t/doc/publish"))
                .bearer_auth("wrong")
                .json(&json!({"ch": "a", "data": 1}))
        )
        .await
        .0,
        401
    );

    // Operations.
    let hist = "/admin/v1/tenants/{tenant}/channels/{channel}/history";
    let (s, v) = c
        .check(
            "get",
            hist,
            admin(
                Method::GET,
                "/admin/v1/tenants/doc/channels/prices/history?since=0&limit=10",
            ),
        )
        .await;
    assert_eq!((s, v["messages"].as_array().map(Vec::len)), (200, Some(2)));
    assert_eq!(
        c.check(
            "get",
            hist,
            admin(
                Method::GET,
                "/admin/v1/tenants/doc/channels/prices/history?limit=0"
            )
        )
        .await
        .0,
        400
    );
    assert_eq!(
        c.check(
            "get",
            hist,
            admin(
                Method::GET,
                "/admin/v1/tenants/doc/channels/nothing/history"
            )
        )
        .await
        .0,
        404
    );
    let conns = "/admin/v1/tenants/{tenant}/connections";
    let (s, v) = c
        .check(
            "get",
            conns,
            admin(Method::GET, "/admin/v1/tenants/doc/connections"),
        )
        .await;
    assert_eq!(
        (s, v["connections"].as_array().map(Vec::len)),
        (200, Some(1))
    );
    let disc = "/admin/v1/tenants/{tenant}/disconnect";
    let session = v["connections"][0]["session"].as_str().unwrap();
    assert_eq!(
        c.check(
            "post",
            disc,
            admin(Method::POST, "/admin/v1/tenants/doc/disconnect")
                .json(&json!({"session": session}))
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.check(
            "post",
            disc,
            admin(Method::POST, "/admin/v1/tenants/doc/disconnect").json(&json!({}))
        )
        .await
        .0,
        400
    );
    assert_eq!(ws.closed().await.0, 4003);

    // Plugins: a small upload (201), a large one (202, then its status), list, activate, rollback, deactivate.
    let plugins = "/admin/v1/tenants/{tenant}/plugins";
    let upload = |bytes: Vec<u8>| {
        admin(Method::POST, "/admin/v1/tenants/doc/plugins")
            .header("content-type", "application/wasm")
            .body(bytes)
    };
    let (s, small) = c
        .check("post", plugins, upload(plugin_wasm("ticker_conflate")))
        .await;
    assert_eq!(s, 201, "{small}");
    let (s, other) = c
        .check("post", plugins, upload(plugin_wasm("redact")))
        .await;
    assert_eq!(s, 201, "{other}");
    assert_eq!(
        c.check("post", plugins, upload(b"not wasm".to_vec()))
            .await
            .0
            / 100,
        4
    );
    let big = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../plugins/target/example/python.wasm"),
    )
    .expect("plugins/example/build.sh built the Python component");
    assert!(big.len() > 1 << 20);
    let (s, accepted) = c.check("post", plugins, upload(big)).await;
    assert_eq!(s, 202, "{accepted}");
    let status = "/admin/v1/tenants/{tenant}/uploads/{sha256}";
    let url = accepted["status_url"].as_str().unwrap().to_string();
    let stored = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let (s, v) = c.check("get", status, admin(Method::GET, &url)).await;
            assert_eq!(s, 200);
            if v["status"] != "compiling" {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the large upload compiles");
    assert_eq!(stored["status"], "stored", "{stored}");
    assert_eq!(
        c.check(
            "get",
            status,
            admin(Method::GET, "/admin/v1/tenants/doc/uploads/00")
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.check(
            "get",
            plugins,
            admin(Method::GET, "/admin/v1/tenants/doc/plugins")
        )
        .await
        .0,
        200
    );
    let act = "/admin/v1/tenants/{tenant}/plugins/{version}/activate";
    let rb = "/admin/v1/tenants/{tenant}/plugins/rollback";
    assert_eq!(
        c.check(
            "post",
            rb,
            admin(Method::POST, "/admin/v1/tenants/doc/plugins/rollback")
        )
        .await
        .0,
        409
    );
    for v in [&small, &other] {
        let path = format!("/admin/v1/tenants/doc/plugins/{}/activate", v["version"]);
        assert_eq!(
            c.check("post", act, admin(Method::POST, &path)).await.0,
            200
        );
    }
    assert_eq!(
        c.check(
            "post",
            act,
            admin(Method::POST, "/admin/v1/tenants/doc/plugins/999/activate")
        )
        .await
        .0,
        404
    );
    let (s, v) = c
        .check(
            "post",
            rb,
            admin(Method::POST, "/admin/v1/tenants/doc/plugins/rollback"),
        )
        .await;
    assert_eq!((s, &v["active"]), (200, &small["version"]));
    let de = "/admin/v1/tenants/{tenant}/plugins/deactivate";
    assert_eq!(
        c.check(
            "post",
            de,
            admin(Method::POST, "/admin/v1/tenants/doc/plugins/deactivate")
        )
        .await
        .0,
        200
    );

    // A publish with a transform that picks no channel: still the documented answer.
    assert_eq!(
        c.check(
            "delete",
            one,
            admin(Method::DELETE, "/admin/v1/tenants/plain")
        )
        .await
        .0,
        204
    );
    assert_eq!(
        c.check(
            "delete",
            one,
            admin(Method::DELETE, "/admin/v1/tenants/plain")
        )
        .await
        .0,
        404
    );

    // Every operation the document lists was called.
    let listed: BTreeSet<(String, String)> = c.doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), p.clone()))
        })
        .collect();
    let missing: Vec<_> = listed.difference(&c.called).collect();
    assert!(missing.is_empty(), "operations never called: {missing:?}");
    h.stop().await;
}

/// The validator itself refuses what it must (a test that cannot fail is
/// no test).
#[test]
fn the_validator_finds_drift() {
    let doc = json!({"components": {"schemas": {"A": {"type": "object", "required": ["x"],
        "properties": {"x": {"type": "integer", "minimum": 0}, "y": {"type": ["string", "null"]}}}}}});
    let a = json!({"$ref": "#/components/schemas/A"});
    let errs = |v: Value| {
        let mut e = Vec::new();
        validate(&doc, &a, &v, "$", &mut e);
        e
    };
    assert!(errs(json!({"x": 1, "y": null})).is_empty());
    assert_eq!(errs(json!({"y": "s"})).len(), 1, "required");
    assert_eq!(errs(json!({"x": -1})).len(), 1, "minimum");
    assert_eq!(errs(json!({"x": 1, "z": 0})).len(), 1, "undocumented field");
    assert_eq!(errs(json!({"x": "1"})).len(), 1, "type");
    let one_of = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
    let mut e = Vec::new();
    validate(&doc, &one_of, &json!(1), "$", &mut e);
    assert_eq!(e.len(), 1, "an integer fits both: oneOf is exactly one");
}
