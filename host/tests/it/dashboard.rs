//! The monitoring stack of compose.yaml: Prometheus scrapes Herald's
//! /metrics, Grafana shows the provisioned dashboard, and every metric the
//! dashboard queries is one Herald really exports. The files are read from
//! the repository; the metrics come from a live host after causing the
//! events that make each of them appear (a subscriber, publishes, a slow
//! consumer, a failing plugin, a stalled source, ...).

use crate::helpers::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const COMPOSE: &str = "compose.yaml";
const PROMETHEUS_YML: &str = "deploy/prometheus/prometheus.yml";
const DATASOURCE_YML: &str = "deploy/grafana/provisioning/datasources/prometheus.yml";
const PROVIDER_YML: &str = "deploy/grafana/provisioning/dashboards/herald.yml";
const DASHBOARD_JSON: &str = "deploy/grafana/dashboards/herald.json";

/// What an operator looks at first: the dashboard must keep a panel on each.
const COVERED: [&str; 12] = [
    "herald_connections",
    "herald_frames_sent_total",
    "herald_messages_published_total",
    "herald_slow_consumer_total",
    "herald_plugin_failures_total",
    "herald_plugin_dead_letters_total",
    "herald_source_up",
    "herald_source_lag",
    "herald_publish_rejected_total",
    "herald_connections_refused_total",
    "herald_history_not_kept_total",
    "herald_plugin_compiles_total",
];

// Tenants of this test's own: the metrics recorder is shared by every test
// of the binary.
const LIVE: &str = "dash-live";
const SLOW: &str = "dash-slow";
const PLUGIN: &str = "dash-plugin";
const QUIET: &str = "dash-quiet";

/// The repository's root (the crate is host/).
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(crate) fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A YAML file as JSON values (every key of these files is a string).
pub(crate) fn yaml(rel: &str) -> Value {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A compose service's bind mounts of repository paths (`./src:/dst[:mode]`
/// or the long syntax), as (path in the repository, path in the container).
fn bind_mounts(service: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in service["volumes"].as_array().into_iter().flatten() {
        let (src, dst) = match v {
            Value::String(s) => {
                let mut parts = s.split(':');
                let src = parts.next().unwrap_or_default().to_string();
                (src, parts.next().unwrap_or_default().to_string())
            }
            Value::Object(m) => (
                m.get("source")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                m.get("target")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            ),
            _ => continue,
        };
        if let Some(rel) = src.strip_prefix("./") {
            out.push((
                rel.trim_end_matches('/').to_string(),
                dst.trim_end_matches('/').to_string(),
            ));
        }
    }
    out
}

/// Where the repository file `rel` is in the container, through `mounts`
/// (the file itself or a folder holding it).
fn container_path(mounts: &[(String, String)], rel: &str) -> Option<String> {
    mounts.iter().find_map(|(src, dst)| {
        if rel == src {
            Some(dst.clone())
        } else {
            rel.strip_prefix(&format!("{src}/"))
                .map(|rest| format!("{dst}/{rest}"))
        }
    })
}

/// A compose service's environment variable (map or `KEY=value` list).
pub(crate) fn env_var(service: &Value, key: &str) -> Option<String> {
    match &service["environment"] {
        Value::Object(m) => m.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }),
        Value::Array(list) => list.iter().filter_map(Value::as_str).find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then(|| v.to_string())
        }),
        _ => None,
    }
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Checks compose.yaml, prometheus.yml and Grafana's provisioning; returns
/// the uid of the provisioned Prometheus datasource.
fn check_stack_files() -> String {
    let compose = yaml(COMPOSE);
    let services = &compose["services"];
    for name in ["herald", "prometheus", "grafana"] {
        assert!(
            services[name].is_object(),
            "{COMPOSE} has no {name} service"
        );
    }
    let (herald, prom, graf) = (
        &services["herald"],
        &services["prometheus"],
        &services["grafana"],
    );
    assert!(
        prom["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("prom/prometheus")),
        "prometheus image: {}",
        prom["image"]
    );
    assert!(
        graf["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("grafana/grafana")),
        "grafana image: {}",
        graf["image"]
    );
    let prom_mounts = bind_mounts(prom);
    let graf_mounts = bind_mounts(graf);
    for (rel, _) in prom_mounts.iter().chain(&graf_mounts) {
        assert!(
            repo().join(rel).exists(),
            "{COMPOSE} mounts ./{rel}, which does not exist"
        );
    }

    // Prometheus reads the mounted config (its image's default path unless
    // `command` names another).
    let args: Vec<String> = match &prom["command"] {
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        Value::String(s) => s.split_whitespace().map(String::from).collect(),
        _ => Vec::new(),
    };
    let config_at = args
        .iter()
        .find_map(|a| a.strip_prefix("--config.file="))
        .unwrap_or("/etc/prometheus/prometheus.yml");
    assert_eq!(
        container_path(&prom_mounts, PROMETHEUS_YML).as_deref(),
        Some(config_at),
        "the prometheus service mounts {PROMETHEUS_YML} where Prometheus reads its config"
    );

    // It scrapes Herald's /metrics, on the port Herald listens on, every 5 s.
    let listen = env_var(herald, "HERALD_LISTEN").expect("herald sets HERALD_LISTEN");
    let target = format!("herald:{}", listen.rsplit(':').next().unwrap_or_default());
    let cfg = yaml(PROMETHEUS_YML);
    let job = cfg["scrape_configs"]
        .as_array()
        .expect("scrape_configs")
        .iter()
        .find(|j| {
            j["static_configs"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|sc| {
                    sc["targets"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|t| t.as_str() == Some(target.as_str()))
                })
        })
        .unwrap_or_else(|| panic!("{PROMETHEUS_YML}: no scrape job targets {target}"));
    assert_eq!(
        job["metrics_path"].as_str().unwrap_or("/metrics"),
        "/metrics"
    );
    assert_eq!(job["scheme"].as_str().unwrap_or("http"), "http");
    let interval = job["scrape_interval"]
        .as_str()
        .or(cfg["global"]["scrape_interval"].as_str())
        .unwrap_or("1m");
    assert_eq!(interval, "5s", "scrape interval");
    // /metrics wants a bearer token only when HERALD_METRICS_TOKEN is set.
    if env_var(herald, "HERALD_METRICS_TOKEN").is_some() {
        assert!(
            job["authorization"].is_object(),
            "herald sets HERALD_METRICS_TOKEN: the scrape job needs its bearer token"
        );
    }

    // Grafana: anonymous viewers, port 3000, the provisioning files where
    // Grafana reads them.
    assert_eq!(
        env_var(graf, "GF_AUTH_ANONYMOUS_ENABLED").as_deref(),
        Some("true")
    );
    assert_eq!(
        env_var(graf, "GF_AUTH_ANONYMOUS_ORG_ROLE").as_deref(),
        Some("Viewer")
    );
    assert!(
        graf["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|p| p.trim_matches('"').rsplit(':').next() == Some("3000")),
        "grafana publishes port 3000: {}",
        graf["ports"]
    );
    let provisioning = env_var(graf, "GF_PATHS_PROVISIONING")
        .unwrap_or_else(|| "/etc/grafana/provisioning".into());
    let ds_at = container_path(&graf_mounts, DATASOURCE_YML)
        .unwrap_or_else(|| panic!("the grafana service does not mount {DATASOURCE_YML}"));
    assert_eq!(parent(&ds_at), format!("{provisioning}/datasources"));
    let provider_at = container_path(&graf_mounts, PROVIDER_YML)
        .unwrap_or_else(|| panic!("the grafana service does not mount {PROVIDER_YML}"));
    assert_eq!(parent(&provider_at), format!("{provisioning}/dashboards"));
    let provider = yaml(PROVIDER_YML);
    let provider = &provider["providers"][0];
    assert_eq!(provider["type"].as_str().unwrap_or("file"), "file");
    let dashboards_dir = provider["options"]["path"]
        .as_str()
        .expect("the dashboard provider's options.path")
        .trim_end_matches('/');
    let dashboard_at = container_path(&graf_mounts, DASHBOARD_JSON)
        .unwrap_or_else(|| panic!("the grafana service does not mount {DASHBOARD_JSON}"));
    assert!(
        dashboard_at.starts_with(&format!("{dashboards_dir}/")),
        "{DASHBOARD_JSON} is at {dashboard_at} in the container, outside the provider's {dashboards_dir}"
    );
    if let Some(home) = env_var(graf, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
        assert_eq!(home, dashboard_at, "the home dashboard is the mounted one");
    }

    // The datasource is that Prometheus, by a service name compose resolves.
    let ds = yaml(DATASOURCE_YML);
    let ds = ds["datasources"]
        .as_array()
        .expect("datasources")
        .iter()
        .find(|d| d["type"] == "prometheus")
        .unwrap_or_else(|| panic!("{DATASOURCE_YML}: no prometheus datasource"));
    let url = ds["url"].as_str().expect("datasource url");
    let authority = url
        .strip_prefix("http://")
        .expect("an http:// datasource url")
        .split('/')
        .next()
        .unwrap_or_default();
    let (host, port) = authority.split_once(':').unwrap_or((authority, "80"));
    assert!(
        services[host].is_object(),
        "datasource url {url}: {host} is no compose service"
    );
    assert_eq!((host, port), ("prometheus", "9090"), "datasource url {url}");
    ds["uid"]
        .as_str()
        .expect("the datasource has a uid (the dashboard names it)")
        .to_string()
}

/// Every panel, those inside rows included.
fn all_panels<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
    for p in list.as_array().into_iter().flatten() {
        out.push(p);
        all_panels(&p["panels"], out);
    }
}

/// The metric names in a PromQL expression: identifiers starting with
/// `herald_`, outside string literals (label values, regexes) and numbers
/// or durations.
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i += 1;
            while i < b.len() && b[i] != c {
                if b[i] == b'\\' && c != b'`' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            if word.starts_with("herald_") {
                out.push(word.to_string());
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Checks the dashboard's shape and datasource; returns every metric name
/// its panels and variables query, with the panels that use it.
fn dashboard_metrics(ds_uid: &str) -> BTreeMap<String, BTreeSet<String>> {
    let d: Value = serde_json::from_str(&read(DASHBOARD_JSON))
        .unwrap_or_else(|e| panic!("{DASHBOARD_JSON}: {e}"));
    assert_eq!(d["uid"], "herald");
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    let datasource_is_ours = |ds: &Value, what: &str| {
        assert_eq!(
            (ds["type"].as_str(), ds["uid"].as_str()),
            (Some("prometheus"), Some(ds_uid)),
            "{what}: datasource {ds}"
        );
    };
    let mut panels = Vec::new();
    all_panels(&d["panels"], &mut panels);
    let mut ids = BTreeSet::new();
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut queries = 0;
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("panel {title:?} has no id"));
        assert!(ids.insert(id), "panel id {id} ({title:?}) is not unique");
        assert!(p["gridPos"].is_object(), "panel {title:?} has no gridPos");
        for t in p["targets"].as_array().into_iter().flatten() {
            let ds = if t["datasource"].is_object() {
                &t["datasource"]
            } else {
                &p["datasource"]
            };
            datasource_is_ours(ds, &format!("panel {title:?}"));
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "panel {title:?}: {expr:?} queries no herald_ metric"
            );
            for n in names {
                used.entry(n).or_default().insert(title.clone());
            }
            queries += 1;
        }
    }
    assert!(queries > 0, "the dashboard has no queries");
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let name = format!("variable ${}", v["name"].as_str().unwrap_or("?"));
        datasource_is_ours(&v["datasource"], &name);
        let q = v["query"]
            .as_str()
            .or(v["query"]["query"].as_str())
            .unwrap_or_default();
        for n in metric_names(q) {
            used.entry(n).or_default().insert(name.clone());
        }
    }
    used
}

/// Metric families in a Prometheus text exposition: name → type (`untyped`
/// for a sample without a `# TYPE` line).
fn exported(text: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                m.insert(n.to_string(), t.to_string());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            m.entry(name.to_string())
                .or_insert_with(|| "untyped".to_string());
        }
    }
    m
}

/// The exported family a dashboard name refers to: the histogram or summary
/// a `_bucket`/`_sum`/`_count` series belongs to, or the name itself.
fn family<'a>(name: &'a str, exported: &BTreeMap<String, String>) -> Option<&'a str> {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if matches!(
                exported.get(base).map(String::as_str),
                Some("histogram" | "summary")
            ) {
                return Some(base);
            }
        }
    }
    exported.contains_key(name).then_some(name)
}

async fn metrics_text(h: &Host) -> String {
    let r = h.http.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(
        r.status(),
        200,
        "/metrics answers without a token, as in compose.yaml"
    );
    r.text().await.unwrap()
}

/// The sum of the samples whose line starts with `prefix`; None if no line does.
async fn sample(h: &Host, prefix: &str) -> Option<f64> {
    let text = metrics_text(h).await;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Waits until the samples starting with `prefix` exist and satisfy `ok`.
async fn eventually(h: &Host, prefix: &str, ok: impl Fn(f64) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = sample(h, prefix).await;
        if v.is_some_and(&ok) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{prefix}: {v:?} did not get as expected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn metric_names_skip_labels_strings_and_durations() {
    assert_eq!(
        metric_names(
            r#"sum by (tenant) (rate(herald_frames_sent_total{tenant=~"herald_x|$tenant"}[5m])) / on() max(herald_connection_capacity) or vector(0)"#
        ),
        ["herald_frames_sent_total", "herald_connection_capacity"]
    );
    assert_eq!(
        metric_names("rate(herald_x_bucket[$__rate_interval]) > 1e3"),
        ["herald_x_bucket"]
    );
    let mut e = BTreeMap::new();
    e.insert("herald_h".to_string(), "histogram".to_string());
    e.insert("herald_h_bucket".to_string(), "untyped".to_string());
    e.insert("herald_c_total".to_string(), "counter".to_string());
    assert_eq!(family("herald_h_bucket", &e), Some("herald_h"));
    assert_eq!(family("herald_h_count", &e), Some("herald_h"));
    assert_eq!(family("herald_c_total", &e), Some("herald_c_total"));
    assert_eq!(family("herald_c_total_count", &e), None);
    assert_eq!(family("herald_c", &e), None);
}

/// compose.yaml runs Prometheus and Grafana on the deploy/ files, and every
/// metric the provisioned dashboard queries is exported by Herald once the
/// events it shows have happened.
#[tokio::test]
async fn the_compose_dashboard_queries_only_metrics_herald_exports() {
    let ds_uid = check_stack_files();
    let used = dashboard_metrics(&ds_uid);
    for m in COVERED {
        assert!(used.contains_key(m), "the dashboard has no panel on {m}");
    }

    let h = spawn_host().await;

    // Sessions, subscriptions, publishes and frames; a history too small to
    // keep them all; a wrong publish key; a bad client operation.
    let key = h
        .tenant(json!({"id": LIVE, "access": "public", "limits":
            {"max_message_bytes": 1024, "history_bytes": 1024, "history_total_bytes": 1024}}))
        .await;
    let mut ws = h.ws(LIVE).await;
    ws.sub("c", 1).await;
    let sse = h.sse(LIVE, "ch=c", None).await;
    assert_eq!(sse.status, 200);
    let pad = "x".repeat(400);
    for n in 1..=4u64 {
        let (s, v) = h
            .publish(LIVE, &key, json!({"ch": "c", "data": {"n": n, "pad": pad}}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    for n in 1..=4u64 {
        assert_eq!(ws.next().await["data"]["n"], n);
    }
    let (s, v) = h
        .publish(LIVE, "not-the-publish-key", json!({"ch": "c", "data": 0}))
        .await;
    assert_eq!(s, 401, "{v}");
    let mut bad = h.ws(LIVE).await;
    bad.send(json!({"op": "dance", "id": 4})).await;
    assert_eq!(bad.next().await["code"], "unknown_op");

    // A source that stalls: an HTTP publisher silent past stall_after_ms.
    h.public_tenant(QUIET).await;
    let (s, v) = h
        .admin(
            Method::PUT,
            &format!("/admin/v1/tenants/{QUIET}/source"),
            Some(json!({"kind": "http", "stall_after_ms": 300})),
        )
        .await;
    assert_eq!(s, 200, "{v}");

    // A slow consumer under drop-oldest: a reader that stopped reading.
    let slow_key = h
        .tenant(json!({"id": SLOW, "access": "public", "limits":
            {"queue_bytes": 131072, "max_message_bytes": 8192, "slow_consumer": "drop-oldest"}}))
        .await;
    let stalled = stalled_subscriber(&h, SLOW).await;
    let big = "p".repeat(2000);
    for batch in 0..40u64 {
        let items: Vec<Value> = (0..40u64)
            .map(|i| json!({"ch": "c", "data": {"n": batch * 40 + i, "pad": big}}))
            .collect();
        let (s, v) = h.publish(SLOW, &slow_key, Value::Array(items)).await;
        assert_eq!(s, 200, "{v}");
    }

    // A plugin that fails: its transform dead-letters the publish, its
    // authorize-connect refuses the connection (a compile on the way).
    let plugin_key = h.public_tenant(PLUGIN).await;
    h.install_plugin(PLUGIN, "fixture_panic").await;
    let (s, v) = h
        .publish(PLUGIN, &plugin_key, json!({"ch": "c", "data": 1}))
        .await;
    assert_eq!(s, 502, "{v}");
    let (s, v) = h
        .admin(
            Method::PATCH,
            &format!("/admin/v1/tenants/{PLUGIN}"),
            Some(json!({"access": "plugin"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = h
        .ws_with(PLUGIN, "")
        .await
        .err()
        .expect("the failing plugin refuses the connection");
    assert_eq!(s, 503, "{v}");

    // Each event is counted, under this test's tenants.
    let t = |name: &str, tenant: &str| format!("{name}{{tenant=\"{tenant}\"");
    let at_least = |n: f64| move |v: f64| v >= n;
    eventually(&h, &t("herald_connections", LIVE), at_least(2.0)).await;
    eventually(&h, &t("herald_subscriptions", LIVE), at_least(1.0)).await;
    eventually(
        &h,
        &format!(
            "{},transport=\"ws\"",
            t("herald_connections_opened_total", LIVE)
        ),
        at_least(2.0),
    )
    .await;
    eventually(
        &h,
        &format!(
            "{},transport=\"sse\"",
            t("herald_connections_opened_total", LIVE)
        ),
        at_least(1.0),
    )
    .await;
    eventually(
        &h,
        &t("herald_messages_published_total", LIVE),
        at_least(4.0),
    )
    .await;
    eventually(&h, &t("herald_frames_sent_total", LIVE), at_least(4.0)).await;
    eventually(&h, &t("herald_socket_writes_total", LIVE), at_least(1.0)).await;
    eventually(&h, &t("herald_history_not_kept_total", LIVE), at_least(1.0)).await;
    eventually(
        &h,
        &format!(
            "{},reason=\"unauthorized\"",
            t("herald_publish_rejected_total", LIVE)
        ),
        at_least(1.0),
    )
    .await;
    eventually(
        &h,
        &format!(
            "{},code=\"unknown_op\"",
            t("herald_client_errors_total", LIVE)
        ),
        at_least(1.0),
    )
    .await;
    eventually(&h, &t("herald_source_up", LIVE), |v| v == 1.0).await;
    eventually(&h, &t("herald_source_lag", LIVE), |v| v == 0.0).await;
    eventually(&h, &t("herald_source_up", QUIET), |v| v == 0.0).await;
    eventually(
        &h,
        &format!(
            "{},action=\"dropped\"",
            t("herald_slow_consumer_total", SLOW)
        ),
        at_least(1.0),
    )
    .await;
    drop(stalled);
    eventually(
        &h,
        &t("herald_plugin_dead_letters_total", PLUGIN),
        at_least(1.0),
    )
    .await;
    eventually(
        &h,
        &t("herald_plugin_failures_total", PLUGIN),
        at_least(1.0),
    )
    .await;
    eventually(
        &h,
        &format!(
            "{},reason=\"plugin_failed\"",
            t("herald_connections_refused_total", PLUGIN)
        ),
        at_least(1.0),
    )
    .await;
    eventually(&h, "herald_plugin_compiles_total{", at_least(1.0)).await;
    eventually(&h, "herald_plugin_compiled_versions", at_least(0.0)).await;
    eventually(&h, "herald_connection_capacity", at_least(1.0)).await;
    eventually(&h, "herald_process_rss_bytes", at_least(1.0)).await;

    // Every metric the dashboard names is one Herald exports.
    let exported = exported(&metrics_text(&h).await);
    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| family(name, &exported).is_none())
        .map(|(name, panels)| format!("{name} (in {panels:?})"))
        .collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD_JSON} queries metrics Herald does not export:\n  {}\nexported: {:?}",
        missing.join("\n  "),
        exported.keys().collect::<Vec<_>>()
    );

    drop((ws, sse, bad));
    h.stop().await;
}
