//! `herald tenant|source|publish|nodes|connections|disconnect|history` and
//! `herald plugin push|list|activate|rollback`: the admin REST API (and
//! HTTP publish) of a running server, from the command line.
//!
//! Owns: turning flags into requests and answers into text. Invariants:
//! every input (inline JSON, `@file`, a component, the URL, the token) is
//! read and checked before any request is sent; `--json` prints the
//! server's answer as it came; every failure is one line (`herald: …` on
//! stderr, printed by main.rs) and exit status 1.

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use reqwest::{Method, Url};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

// Where the server is and how to speak to it: on every command. (A plain
// comment: a doc comment here would become the `about` of every command
// that flattens it.)
#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// The server's base URL: https:// (verified against the system's
    /// roots, or --ca-cert), or http:// on loopback.
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// A PEM file of the certificate (or its CA) to trust for https://, beside
    /// the system's roots.
    #[arg(long, env = "HERALD_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Send the admin token or publish key over plain http:// to a host that
    /// is not loopback (in clear, readable by anyone on the path).
    #[arg(long, env = "HERALD_ALLOW_HTTP")]
    pub allow_http: bool,
    /// The admin bearer token (`herald serve --admin-token`).
    #[arg(long, env = "HERALD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Print the server's JSON answer as it came, for scripts.
    #[arg(long)]
    pub json: bool,
}

// The commands that talk to a server, flattened into the top-level
// `herald` command (config.rs). (A plain comment: a Subcommand enum's doc
// comment becomes the `about` of the command it is added to.)
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once, at start
pub enum AdminCommand {
    /// Create, list, show, change and delete tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// A tenant's source: where its messages come from.
    #[command(subcommand)]
    Source(SourceCommand),
    /// Publish one message, or a batch, with a tenant's publish key.
    Publish(PublishArgs),
    /// Every node that reported to the registry.
    Nodes(Remote),
    /// A tenant's live connections on the node at --url.
    Connections(TenantArgs),
    /// Close the connections of a subject or a session on the node at --url.
    Disconnect(DisconnectArgs),
    /// What a channel's history holds on the node at --url.
    History(HistoryArgs),
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once, at start
pub enum TenantCommand {
    /// Create a tenant and print its publish key (shown only this once).
    Create(TenantCreateArgs),
    /// List every tenant.
    List(Remote),
    /// Show a tenant, with the limits in force and its live counts.
    Show(TenantArgs),
    /// Change a tenant: only what is given changes.
    Patch(TenantPatchArgs),
    /// Delete a tenant; its sessions are closed (4000).
    Delete(TenantArgs),
    /// Give a tenant a new publish key (printed once); the old one stops working.
    RotateKey(TenantArgs),
}

#[derive(Debug, Subcommand)]
pub enum SourceCommand {
    /// Set a tenant's source (the server checks it first: reachable, right shape).
    Set(SourceSetArgs),
    /// Show a tenant's source and its health on the node at --url.
    Show(TenantArgs),
}

// A command about one tenant.
#[derive(Debug, Clone, Args)]
pub struct TenantArgs {
    /// The tenant id.
    pub tenant: String,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessArg {
    /// Anyone may connect and subscribe.
    Public,
    /// The tenant's plugin decides who may.
    Plugin,
}

impl AccessArg {
    fn as_str(self) -> &'static str {
        match self {
            AccessArg::Public => "public",
            AccessArg::Plugin => "plugin",
        }
    }
}

// What create and patch may set.
#[derive(Debug, Clone, Default, Args)]
pub struct TenantSettings {
    /// Who may connect (the server's default: plugin).
    #[arg(long, value_enum)]
    pub access: Option<AccessArg>,
    /// The plugin's config: a JSON object, inline or @file (@- for stdin).
    #[arg(long, value_name = "JSON|@FILE")]
    pub config: Option<String>,
    /// Overrides of the server's limits: a JSON object, inline or @file. On
    /// patch a merge patch over the stored ones: `null` removes one.
    #[arg(long, value_name = "JSON|@FILE")]
    pub limits: Option<String>,
    /// The conflation window, {"window_ms": …, "channels": […]}, inline or
    /// @file; {} turns it off.
    #[arg(long, value_name = "JSON|@FILE")]
    pub conflation: Option<String>,
    /// A browser origin its clients may come from (repeatable); none given
    /// on create: any origin. On patch the list replaces the stored one.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct TenantCreateArgs {
    /// The new tenant's id: 1-64 characters of a-z 0-9 _ -.
    pub id: String,
    #[command(flatten)]
    pub settings: TenantSettings,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
pub struct TenantPatchArgs {
    /// The tenant id.
    pub tenant: String,
    #[command(flatten)]
    pub settings: TenantSettings,
    /// Allow any origin again.
    #[arg(long, conflicts_with = "allowed_origins")]
    pub clear_allowed_origins: bool,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("source_kind").required(true).args(["http", "spec"])))]
pub struct SourceSetArgs {
    /// The tenant id.
    pub tenant: String,
    /// Messages come from HTTP publish only (`herald publish`).
    #[arg(long)]
    pub http: bool,
    /// With --http: the source is `stalled` when nothing was published for
    /// this long (100 to 86400000 ms).
    #[arg(long, requires = "http", conflicts_with = "spec", value_name = "MS")]
    pub stall_after_ms: Option<u64>,
    /// The source as JSON, inline or @file: {"kind": "http" |
    /// "postgres_outbox" | "kafka", …} (see the admin API's SourceConfig).
    #[arg(long, value_name = "JSON|@FILE")]
    pub spec: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("body").required(true).args(["data", "file"])))]
pub struct PublishArgs {
    /// The tenant id.
    pub tenant: String,
    /// The tenant's publish key.
    #[arg(long, env = "HERALD_PUBLISH_KEY", hide_env_values = true)]
    pub key: String,
    /// The channel (may be left out when the tenant's transform picks it).
    #[arg(long, requires = "data", conflicts_with = "file")]
    pub ch: Option<String>,
    /// The message: any JSON value, inline or @file, sent as written (a
    /// string with its quotes: '"text"').
    #[arg(long, value_name = "JSON|@FILE", allow_hyphen_values = true)]
    pub data: Option<String>,
    /// The message's conflation key.
    #[arg(
        long = "key-id",
        value_name = "KEY",
        requires = "data",
        conflicts_with = "file"
    )]
    pub key_id: Option<String>,
    /// A whole publish body from a file (- for stdin): one {"ch", "data",
    /// "key"} object or an array of them.
    #[arg(long, value_name = "FILE")]
    pub file: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("who").required(true).args(["subject", "session"])))]
pub struct DisconnectArgs {
    /// The tenant id.
    pub tenant: String,
    /// Every session of this subject.
    #[arg(long)]
    pub subject: Option<String>,
    /// One session (`s<n>`, from `herald connections`).
    #[arg(long)]
    pub session: Option<String>,
    /// The WebSocket close code: 1000, 1008, 1012 or 4000-4999 (the
    /// server's default: 4003, disconnected, may reconnect).
    #[arg(long)]
    pub code: Option<u16>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
pub struct HistoryArgs {
    /// The tenant id.
    pub tenant: String,
    /// The channel.
    pub channel: String,
    /// Positions after this one (the server's default: 0, all it holds).
    #[arg(long)]
    pub since: Option<u64>,
    /// At most this many positions (the server's default: 100, at most 1000).
    #[arg(long)]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
pub struct PushArgs {
    /// The tenant id.
    pub tenant: String,
    /// The component (.wasm) to upload.
    pub file: PathBuf,
    /// Activate the new version once it is stored.
    #[arg(long)]
    pub activate: bool,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, Args)]
pub struct ActivateArgs {
    /// The tenant id.
    pub tenant: String,
    /// A stored version (`herald plugin list`).
    pub version: u64,
    #[command(flatten)]
    pub remote: Remote,
}

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

mod http;
mod render;
#[cfg(test)]
mod tests;

use http::*;
use render::*;
