//! `herald tenant|source|publish|nodes|connections|disconnect|history` and
//! `herald plugin push|list|activate|rollback`: the admin REST API (and
//! HTTP publish) of a running server, from the command line.
//!
//! Owns: turning flags into requests and answers into text. Invariants:
//! every input (inline JSON, `@file`, a component, the URL, the token) is
//! read and checked before any request is sent; `--json` prints the
//! server's answer as it came; every failure is one line (`herald: …` on
//! stderr, printed by main.rs) and exit status 1.

use reqwest::{Method, Url};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

/// Why a command failed; its `Display` is the line main.rs prints after
/// `herald: `.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server refused, with its error body.
    #[error("{code}: {message} (HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The server refused without an error body (a proxy in between?).
    #[error("unexpected answer (HTTP {status}): {body}")]
    Http { status: u16, body: String },
    #[error(
        "cannot reach the server at {url}: {cause} (is it running? check --url or HERALD_URL)"
    )]
    Unreachable { url: String, cause: String },
    /// Bad input, refused before any request.
    #[error("{0}")]
    Input(String),
    /// An answer this client cannot use.
    #[error("{0}")]
    Protocol(String),
    /// A publish the server took, of which the tenant's transform made no
    /// message.
    #[error("nothing was published: the tenant's transform made no message of the record (it dropped it, or refused its output: see the dead letters, herald_plugin_dead_letters_total)")]
    NothingPublished,
    /// A background upload the server gave up on.
    #[error("{code}: {message} (the server's background compile failed)")]
    UploadFailed { code: String, message: String },
}

/// The commands of this module but `plugin …` (those are called from
/// cli.rs's `PluginCommand`, by main.rs).
pub fn run(cmd: &AdminCommand) -> Result<(), CliError> {
    match cmd {
        AdminCommand::Tenant(c) => tenant(c),
        AdminCommand::Source(c) => source(c),
        AdminCommand::Publish(a) => publish(a),
        AdminCommand::Nodes(r) => {
            let answer = admin_call(r, Method::GET, &["admin", "v1", "nodes"], Payload::Empty)?;
            show(r, &answer, nodes_table);
            Ok(())
        }
        AdminCommand::Connections(a) => {
            let segments = ["admin", "v1", "tenants", a.tenant.as_str(), "connections"];
            let answer = admin_call(&a.remote, Method::GET, &segments, Payload::Empty)?;
            show(&a.remote, &answer, connections_text);
            Ok(())
        }
        AdminCommand::Disconnect(a) => disconnect(a),
        AdminCommand::History(a) => history(a),
    }
}

// ---- plugins (variants of cli.rs's PluginCommand) ----

/// How long `plugin push` waits for a background compile.
const UPLOAD_WAIT: Duration = Duration::from_secs(300);
const POLL_EVERY: Duration = Duration::from_millis(500);

const PLUGIN_FIELDS: &[&str] = &[
    "version",
    "status",
    "name",
    "plugin_version",
    "contract",
    "sha256",
    "size_bytes",
    "hooks",
    "transform_encoding",
    "created_at_ms",
];
const ACTIVATION_FIELDS: &[&str] = &["active", "previous", "name", "contract", "hooks"];

/// `herald plugin push`: uploads a component; a large one (answered 202)
/// is polled until stored or failed, at most five minutes; then, with
/// `--activate`, activates the stored version.
pub fn plugin_push(a: &PushArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&a.file)
        .map_err(|e| CliError::Input(format!("cannot read {}: {e}", a.file.display())))?;
    if !bytes.starts_with(b"\0asm") {
        return Err(CliError::Input(format!(
            "{} is not a wasm component (it does not start with \\0asm)",
            a.file.display()
        )));
    }
    let remote = &a.remote;
    let tenant = a.tenant.as_str();
    let (upload, activation) = block_on(async move {
        let api = Api::admin(remote)?;
        let segments = ["admin", "v1", "tenants", tenant, "plugins"];
        let first = api
            .call(
                Method::POST,
                &segments,
                Payload::Bytes(bytes, "application/wasm"),
            )
            .await?;
        let stored = if first.status == 202 {
            api.wait_for_upload(&first, remote.json).await?
        } else {
            first
        };
        if !a.activate {
            return Ok((stored, None));
        }
        let version = stored.value["version"].as_i64().ok_or_else(|| {
            CliError::Protocol(format!(
                "the upload's answer names no version: {}",
                snippet(&stored.text)
            ))
        })?;
        let version = version.to_string();
        let segments = [
            "admin",
            "v1",
            "tenants",
            tenant,
            "plugins",
            version.as_str(),
            "activate",
        ];
        let activated = api.call(Method::POST, &segments, Payload::Empty).await?;
        Ok((stored, Some(activated)))
    })?;
    if remote.json {
        match &activation {
            None => out(upload.text.trim()),
            // One document for scripts, both answers in it as they came.
            Some(act) => out(&format!(
                "{{\"upload\":{},\"activation\":{}}}",
                upload.text.trim(),
                act.text.trim()
            )),
        }
    } else {
        let mut text = key_values(&upload.value, PLUGIN_FIELDS);
        if let Some(act) = &activation {
            text.push('\n');
            text.push_str(&key_values(&act.value, ACTIVATION_FIELDS));
        }
        out(&text);
    }
    Ok(())
}

/// `herald plugin list`: a tenant's stored versions.
pub fn plugin_list(a: &TenantArgs) -> Result<(), CliError> {
    let segments = ["admin", "v1", "tenants", a.tenant.as_str(), "plugins"];
    let answer = admin_call(&a.remote, Method::GET, &segments, Payload::Empty)?;
    show(&a.remote, &answer, plugins_table);
    Ok(())
}

/// `herald plugin activate`: makes a stored version the active one.
pub fn plugin_activate(a: &ActivateArgs) -> Result<(), CliError> {
    let version = a.version.to_string();
    let segments = [
        "admin",
        "v1",
        "tenants",
        a.tenant.as_str(),
        "plugins",
        version.as_str(),
        "activate",
    ];
    let answer = admin_call(&a.remote, Method::POST, &segments, Payload::Empty)?;
    show(&a.remote, &answer, |v| key_values(v, ACTIVATION_FIELDS));
    Ok(())
}

/// `herald plugin rollback`: activates the version active before this one.
pub fn plugin_rollback(a: &TenantArgs) -> Result<(), CliError> {
    let segments = [
        "admin",
        "v1",
        "tenants",
        a.tenant.as_str(),
        "plugins",
        "rollback",
    ];
    let answer = admin_call(&a.remote, Method::POST, &segments, Payload::Empty)?;
    show(&a.remote, &answer, |v| key_values(v, ACTIVATION_FIELDS));
    Ok(())
}

// ---- tenants ----

const TENANT_FIELDS: &[&str] = &[
    "id",
    "access",
    "publish_key",
    "active_plugin",
    "allowed_origins",
    "connections",
    "channels",
    "config",
    "limits",
    "conflation",
    "created_at_ms",
    "updated_at_ms",
];

fn tenant(cmd: &TenantCommand) -> Result<(), CliError> {
    match cmd {
        TenantCommand::Create(a) => {
            let body = tenant_body(Some(a.id.as_str()), &a.settings, false)?;
            let answer = admin_call(
                &a.remote,
                Method::POST,
                &["admin", "v1", "tenants"],
                Payload::Json(body),
            )?;
            show(&a.remote, &answer, |v| key_values(v, TENANT_FIELDS));
        }
        TenantCommand::List(r) => {
            let answer = admin_call(r, Method::GET, &["admin", "v1", "tenants"], Payload::Empty)?;
            show(r, &answer, tenants_table);
        }
        TenantCommand::Show(a) => {
            let segments = ["admin", "v1", "tenants", a.tenant.as_str()];
            let answer = admin_call(&a.remote, Method::GET, &segments, Payload::Empty)?;
            show(&a.remote, &answer, |v| key_values(v, TENANT_FIELDS));
        }
        TenantCommand::Patch(a) => {
            let body = tenant_body(None, &a.settings, a.clear_allowed_origins)?;
            if body.as_object().is_some_and(Map::is_empty) {
                return Err(CliError::Input(
                    "nothing to change: give --access, --config, --limits, --conflation, --allowed-origin or --clear-allowed-origins".into(),
                ));
            }
            let segments = ["admin", "v1", "tenants", a.tenant.as_str()];
            let answer = admin_call(&a.remote, Method::PATCH, &segments, Payload::Json(body))?;
            show(&a.remote, &answer, |v| key_values(v, TENANT_FIELDS));
        }
        TenantCommand::Delete(a) => {
            let segments = ["admin", "v1", "tenants", a.tenant.as_str()];
            admin_call(&a.remote, Method::DELETE, &segments, Payload::Empty)?;
            // The server answers 204 without a body; scripts still get JSON.
            if a.remote.json {
                out(&json!({"id": a.tenant, "deleted": true}).to_string());
            } else {
                out(&format!("deleted tenant {}", a.tenant));
            }
        }
        TenantCommand::RotateKey(a) => {
            let segments = ["admin", "v1", "tenants", a.tenant.as_str(), "publish-key"];
            let answer = admin_call(&a.remote, Method::POST, &segments, Payload::Empty)?;
            show(&a.remote, &answer, |v| {
                key_values(v, &["id", "publish_key"])
            });
        }
    }
    Ok(())
}

/// The body of a create (`id` given) or a patch: only what was given.
fn tenant_body(
    id: Option<&str>,
    s: &TenantSettings,
    clear_origins: bool,
) -> Result<Value, CliError> {
    let mut body = Map::new();
    if let Some(id) = id {
        body.insert("id".into(), json!(id));
    }
    if let Some(access) = s.access {
        body.insert("access".into(), json!(access.as_str()));
    }
    if let Some(c) = &s.config {
        body.insert("config".into(), json_object_arg("--config", c)?);
    }
    if let Some(l) = &s.limits {
        body.insert("limits".into(), json_object_arg("--limits", l)?);
    }
    if let Some(c) = &s.conflation {
        body.insert("conflation".into(), json_object_arg("--conflation", c)?);
    }
    if clear_origins {
        body.insert("allowed_origins".into(), Value::Null);
    } else if !s.allowed_origins.is_empty() {
        body.insert("allowed_origins".into(), json!(s.allowed_origins));
    }
    Ok(Value::Object(body))
}

// ---- sources ----

fn source(cmd: &SourceCommand) -> Result<(), CliError> {
    let (remote, answer) = match cmd {
        SourceCommand::Set(a) => {
            let body = source_body(a)?;
            let segments = ["admin", "v1", "tenants", a.tenant.as_str(), "source"];
            let answer = admin_call(&a.remote, Method::PUT, &segments, Payload::Json(body))?;
            (&a.remote, answer)
        }
        SourceCommand::Show(a) => {
            let segments = ["admin", "v1", "tenants", a.tenant.as_str(), "source"];
            let answer = admin_call(&a.remote, Method::GET, &segments, Payload::Empty)?;
            (&a.remote, answer)
        }
    };
    show(remote, &answer, |v| key_values(v, &["source", "health"]));
    Ok(())
}

fn source_body(a: &SourceSetArgs) -> Result<Value, CliError> {
    if let Some(spec) = &a.spec {
        return json_object_arg("--spec", spec);
    }
    let mut body = json!({"kind": "http"});
    if let Some(ms) = a.stall_after_ms {
        body["stall_after_ms"] = json!(ms);
    }
    Ok(body)
}

// ---- publish ----

fn publish(a: &PublishArgs) -> Result<(), CliError> {
    let body = match (&a.data, &a.file) {
        (Some(data), _) => {
            let text = load_text("--data", data)?;
            publish_item(a.ch.as_deref(), &text, a.key_id.as_deref())?
        }
        (None, Some(file)) => publish_file(file)?,
        (None, None) => return Err(CliError::Input("give --data or --file".into())),
    };
    let key = a.key.trim();
    if key.is_empty() {
        return Err(CliError::Input(
            "the publish key is empty (--key or HERALD_PUBLISH_KEY)".into(),
        ));
    }
    let remote = &a.remote;
    let tenant = a.tenant.as_str();
    let answer = block_on(async move {
        let api = Api::new(remote, Some(key.to_string()))?;
        let segments = ["v1", "t", tenant, "publish"];
        api.call(
            Method::POST,
            &segments,
            Payload::Bytes(body.into_bytes(), "application/json"),
        )
        .await
    })?;
    let nothing = answer.value["results"]
        .as_array()
        .is_some_and(Vec::is_empty);
    if nothing {
        // The server took the body, and the tenant's transform made no
        // message of it: say so, and fail, rather than print an empty table.
        if remote.json {
            show(remote, &answer, publish_text);
        }
        return Err(CliError::NothingPublished);
    }
    show(remote, &answer, publish_text);
    Ok(())
}

/// One publish item; `data` is passed on as written (key order, number
/// forms), as the server delivers it.
fn publish_item(ch: Option<&str>, data: &str, key: Option<&str>) -> Result<String, CliError> {
    #[derive(serde::Serialize)]
    struct Item<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        ch: Option<&'a str>,
        data: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<&'a str>,
    }
    let data: Box<RawValue> = serde_json::from_str(data.trim()).map_err(|e| {
        CliError::Input(format!(
            "--data is not valid JSON ({e}); a string is written with its quotes: '\"text\"'"
        ))
    })?;
    serde_json::to_string(&Item {
        ch,
        data: &data,
        key,
    })
    .map_err(|e| CliError::Input(format!("--data: {e}")))
}

fn publish_file(path: &str) -> Result<String, CliError> {
    let (text, what) = if path == "-" {
        (read_stdin("--file -")?, "standard input".to_string())
    } else {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Input(format!("--file: cannot read {path}: {e}")))?;
        (text, path.to_string())
    };
    check_publish_body(&text, &what)?;
    Ok(text)
}

/// A publish body is one JSON object or an array (the server checks the rest).
fn check_publish_body(text: &str, what: &str) -> Result<(), CliError> {
    if !matches!(text.trim_start().chars().next(), Some('{' | '[')) {
        return Err(CliError::Input(format!(
            "{what}: a publish body is a JSON object or an array of them"
        )));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|e| CliError::Input(format!("{what} is not valid JSON: {e}")))?;
    Ok(())
}

// ---- operations ----

fn disconnect(a: &DisconnectArgs) -> Result<(), CliError> {
    let mut body = Map::new();
    if let Some(s) = &a.subject {
        body.insert("subject".into(), json!(s));
    }
    if let Some(s) = &a.session {
        body.insert("session".into(), json!(s));
    }
    if let Some(c) = a.code {
        body.insert("code".into(), json!(c));
    }
    let segments = ["admin", "v1", "tenants", a.tenant.as_str(), "disconnect"];
    let answer = admin_call(
        &a.remote,
        Method::POST,
        &segments,
        Payload::Json(Value::Object(body)),
    )?;
    show(&a.remote, &answer, |v| {
        key_values(v, &["disconnected", "code", "node"])
    });
    Ok(())
}

fn history(a: &HistoryArgs) -> Result<(), CliError> {
    let remote = &a.remote;
    let answer = block_on(async move {
        let api = Api::admin(remote)?;
        let url = history_url(&api.base, &a.tenant, &a.channel, a.since, a.limit)?;
        api.call_url(Method::GET, url, Payload::Empty).await
    })?;
    show(remote, &answer, history_text);
    Ok(())
}

fn history_url(
    base: &Url,
    tenant: &str,
    channel: &str,
    since: Option<u64>,
    limit: Option<usize>,
) -> Result<Url, CliError> {
    let segments = [
        "admin", "v1", "tenants", tenant, "channels", channel, "history",
    ];
    let mut url = endpoint(base, &segments)?;
    if since.is_some() || limit.is_some() {
        let mut query = url.query_pairs_mut();
        if let Some(s) = since {
            query.append_pair("since", &s.to_string());
        }
        if let Some(l) = limit {
            query.append_pair("limit", &l.to_string());
        }
    }
    Ok(url)
}

mod args;
mod http;
mod render;
#[cfg(test)]
mod tests;

pub use args::*;
use http::*;
use render::*;
