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
    /// The server's base URL (plain HTTP).
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
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

// ---- HTTP ----

const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request carries.
enum Payload {
    Empty,
    Json(Value),
    Bytes(Vec<u8>, &'static str),
}

/// A 2xx answer: its status, its text as it came, and that text parsed
/// (`Null` when empty).
#[derive(Debug)]
struct Answer {
    status: u16,
    text: String,
    value: Value,
}

struct Api {
    base: Url,
    auth: Option<String>,
    http: reqwest::Client,
}

impl Api {
    fn new(remote: &Remote, auth: Option<String>) -> Result<Api, CliError> {
        let base = base_url(&remote.url)?;
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("herald-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CliError::Protocol(format!("cannot start the HTTP client: {e}")))?;
        Ok(Api { base, auth, http })
    }

    /// A client with the admin token, refused without one.
    fn admin(remote: &Remote) -> Result<Api, CliError> {
        let token = remote
            .admin_token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                CliError::Input(
                    "no admin token: pass --admin-token or set HERALD_ADMIN_TOKEN".into(),
                )
            })?;
        Api::new(remote, Some(token.to_string()))
    }

    async fn call(
        &self,
        method: Method,
        segments: &[&str],
        payload: Payload,
    ) -> Result<Answer, CliError> {
        let url = endpoint(&self.base, segments)?;
        self.call_url(method, url, payload).await
    }

    async fn call_url(
        &self,
        method: Method,
        url: Url,
        payload: Payload,
    ) -> Result<Answer, CliError> {
        let shown = url.to_string();
        let mut req = self.http.request(method, url);
        if let Some(t) = &self.auth {
            req = req.bearer_auth(t);
        }
        req = match payload {
            Payload::Empty => req,
            Payload::Json(v) => req.json(&v),
            Payload::Bytes(bytes, content_type) => req
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes),
        };
        let resp = req.send().await.map_err(|e| transport_error(&shown, &e))?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| transport_error(&shown, &e))?;
        answer(status, &body)
    }

    /// Polls a 202's `status_url` until the upload is stored (its answer)
    /// or failed (an error), at most [`UPLOAD_WAIT`].
    async fn wait_for_upload(&self, accepted: &Answer, quiet: bool) -> Result<Answer, CliError> {
        let status_url = accepted.value["status_url"].as_str().ok_or_else(|| {
            CliError::Protocol(format!(
                "a 202 without a status_url: {}",
                snippet(&accepted.text)
            ))
        })?;
        let url = resolve(&self.base, status_url)?;
        if !quiet {
            let _ = writeln!(
                std::io::stderr(),
                "herald: the server compiles this component in the background; waiting (at most {} minutes)…",
                UPLOAD_WAIT.as_secs() / 60
            );
        }
        let deadline = Instant::now() + UPLOAD_WAIT;
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            let a = self
                .call_url(Method::GET, url.clone(), Payload::Empty)
                .await?;
            match a.value["status"].as_str() {
                Some("stored") => return Ok(a),
                Some("failed") => {
                    let e = &a.value["error"];
                    return Err(CliError::UploadFailed {
                        code: e["code"].as_str().unwrap_or("failed").to_string(),
                        message: e["message"].as_str().unwrap_or_default().to_string(),
                    });
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(CliError::Protocol(format!(
                    "the upload is still compiling after {} minutes; its status: {url}",
                    UPLOAD_WAIT.as_secs() / 60
                )));
            }
        }
    }
}

/// One request with the admin token, on a runtime of its own.
fn admin_call(
    remote: &Remote,
    method: Method,
    segments: &[&str],
    payload: Payload,
) -> Result<Answer, CliError> {
    block_on(async move {
        let api = Api::admin(remote)?;
        api.call(method, segments, payload).await
    })
}

/// Runs `work` on a current-thread runtime built for it.
fn block_on<T>(work: impl Future<Output = Result<T, CliError>>) -> Result<T, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Protocol(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(work)
}

/// `--url`, checked: plain HTTP (this client has no TLS), with a host.
fn base_url(raw: &str) -> Result<Url, CliError> {
    let url = Url::parse(raw.trim())
        .map_err(|e| CliError::Input(format!("--url {raw:?} is not a URL: {e}")))?;
    if url.scheme() != "http" {
        return Err(CliError::Input(format!(
            "--url {raw:?}: only http:// URLs are supported (this client has no TLS; reach an https endpoint through a local proxy)"
        )));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Err(CliError::Input(format!("--url {raw:?} has no host")));
    }
    Ok(url)
}

/// `base` with `segments` appended, each percent-encoded (a `/` in a name
/// stays in its segment).
fn endpoint(base: &Url, segments: &[&str]) -> Result<Url, CliError> {
    if let Some(bad) = segments
        .iter()
        .find(|s| s.is_empty() || **s == "." || **s == "..")
    {
        return Err(CliError::Input(format!(
            "{bad:?} cannot be a name here (empty, . and .. are not path segments)"
        )));
    }
    let mut url = base.clone();
    url.set_query(None);
    url.set_fragment(None);
    match url.path_segments_mut() {
        Ok(mut path) => {
            path.pop_if_empty().extend(segments);
        }
        Err(()) => return Err(CliError::Input(format!("--url {base} has no path"))),
    }
    Ok(url)
}

/// A `status_url` the server gave: a path under `base`, or an absolute URL
/// of the same origin (the admin token goes nowhere else).
fn resolve(base: &Url, status_url: &str) -> Result<Url, CliError> {
    if status_url.starts_with('/') {
        let mut url = base.clone();
        url.set_query(None);
        url.set_fragment(None);
        let path = format!("{}{status_url}", base.path().trim_end_matches('/'));
        url.set_path(&path);
        return Ok(url);
    }
    let url = Url::parse(status_url)
        .map_err(|e| CliError::Protocol(format!("the server's status_url {status_url:?}: {e}")))?;
    if url.origin() != base.origin() {
        return Err(CliError::Protocol(format!(
            "the server's status_url {status_url:?} is not on {base}; not following it"
        )));
    }
    Ok(url)
}

/// An HTTP answer as this client takes it: a 2xx is parsed, anything else
/// is the server's error.
fn answer(status: u16, body: &[u8]) -> Result<Answer, CliError> {
    let text = String::from_utf8_lossy(body).into_owned();
    let parsed: Option<Value> = serde_json::from_str(&text).ok();
    if !(200..300).contains(&status) {
        if let Some(e) = parsed.as_ref().and_then(|v| v.get("error")) {
            if let (Some(code), Some(message)) = (e["code"].as_str(), e["message"].as_str()) {
                return Err(CliError::Api {
                    status,
                    code: code.to_string(),
                    message: message.to_string(),
                });
            }
        }
        return Err(CliError::Http {
            status,
            body: snippet(&text),
        });
    }
    let value = match parsed {
        Some(v) => v,
        None if text.trim().is_empty() => Value::Null,
        None => {
            return Err(CliError::Protocol(format!(
                "the server's answer (HTTP {status}) is not JSON: {}",
                snippet(&text)
            )))
        }
    };
    Ok(Answer {
        status,
        text,
        value,
    })
}

fn transport_error(url: &str, e: &reqwest::Error) -> CliError {
    let cause = if e.is_timeout() {
        format!(
            "no answer in time ({} s to connect, {} s for the request)",
            CONNECT_TIMEOUT.as_secs(),
            REQUEST_TIMEOUT.as_secs()
        )
    } else {
        // The innermost cause says it best ("Connection refused (os error 111)").
        let mut cause = e.to_string();
        let mut next = std::error::Error::source(e);
        while let Some(s) = next {
            cause = s.to_string();
            next = s.source();
        }
        cause
    };
    if e.is_builder() {
        // Nothing was sent: the request itself is bad (a token that is not
        // a valid header value, say).
        return CliError::Input(format!("cannot send the request to {url}: {cause}"));
    }
    CliError::Unreachable {
        url: url.to_string(),
        cause,
    }
}

/// The start of a body, on one line, for an error message.
fn snippet(text: &str) -> String {
    let one_line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.is_empty() {
        return "(empty body)".into();
    }
    truncate(one_line, 200)
}

// ---- input ----

/// An argument that is inline JSON text or `@path` (`@-`: standard input).
fn load_text(flag: &str, arg: &str) -> Result<String, CliError> {
    match arg.strip_prefix('@') {
        Some("-") => read_stdin(flag),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| CliError::Input(format!("{flag}: cannot read {path}: {e}"))),
        None => Ok(arg.to_string()),
    }
}

fn read_stdin(what: &str) -> Result<String, CliError> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| CliError::Input(format!("{what}: cannot read standard input: {e}")))?;
    Ok(text)
}

/// A JSON|@file argument, parsed.
fn json_arg(flag: &str, arg: &str) -> Result<Value, CliError> {
    let text = load_text(flag, arg)?;
    let origin = arg
        .strip_prefix('@')
        .map(|p| format!(" in {p}"))
        .unwrap_or_default();
    serde_json::from_str(&text)
        .map_err(|e| CliError::Input(format!("{flag}: not valid JSON{origin}: {e}")))
}

/// A JSON|@file argument that must be an object.
fn json_object_arg(flag: &str, arg: &str) -> Result<Value, CliError> {
    let v = json_arg(flag, arg)?;
    if !v.is_object() {
        let kind = match &v {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        return Err(CliError::Input(format!(
            "{flag}: must be a JSON object, not {kind}"
        )));
    }
    Ok(v)
}

// ---- output ----

/// Writes `text` and a newline to stdout; a closed stdout is not an error.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
}

/// The answer as it came (`--json`), or as `human` renders it.
fn show(remote: &Remote, answer: &Answer, human: impl FnOnce(&Value) -> String) {
    if remote.json {
        out(answer.text.trim());
    } else {
        out(&human(&answer.value));
    }
}

/// Rows under headers, each column as wide as its widest cell, two spaces
/// apart; no trailing blanks.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut text = String::new();
    let mut push_row = |cells: &[&str]| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    };
    push_row(headers);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        push_row(&cells);
    }
    text
}

/// `key: value` lines, aligned: the fields of `first` in that order, then
/// the others; nested objects flattened with dotted keys.
fn key_values(v: &Value, first: &[&str]) -> String {
    let mut pairs: Vec<(String, String)> = Vec::new();
    match v {
        Value::Object(m) => {
            for k in first {
                if let Some(x) = m.get(*k) {
                    flatten(k, x, &mut pairs);
                }
            }
            for (k, x) in m {
                if !first.contains(&k.as_str()) {
                    flatten(k, x, &mut pairs);
                }
            }
        }
        other => pairs.push(("value".into(), scalar("value", other))),
    }
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (k, val) in &pairs {
        let key = format!("{k}:");
        let line = format!("{key:<width$} {val}");
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// Only `fields` of `v`, as `key: value` lines.
fn header_lines(v: &Value, fields: &[&str]) -> String {
    let picked: Map<String, Value> = fields
        .iter()
        .filter_map(|k| v.get(*k).map(|x| ((*k).to_string(), x.clone())))
        .collect();
    key_values(&Value::Object(picked), fields)
}

fn flatten(key: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                flatten(&format!("{key}.{k}"), x, out);
            }
        }
        _ => out.push((key.to_string(), scalar(key, v))),
    }
}

/// A value on a `key: value` line; timestamps also in UTC.
fn scalar(key: &str, v: &Value) -> String {
    match v {
        Value::Number(n) if is_timestamp(key) => match n.as_i64() {
            Some(ms) => format!("{ms} ({})", utc(ms)),
            None => n.to_string(),
        },
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Array(a) if a.iter().all(Value::is_string) => join_strings(a, ", "),
        other => cell(other),
    }
}

/// Milliseconds since the epoch, by the server's naming.
fn is_timestamp(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last.ends_with("at_ms")
        || last == "since_ms"
        || last.ends_with("heartbeat_ms")
        || last.ends_with("record_ms")
}

/// A value in a table cell.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) if a.iter().all(Value::is_string) => join_strings(a, ","),
        other => other.to_string(),
    }
}

fn join_strings(a: &[Value], sep: &str) -> String {
    a.iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(sep)
}

/// A timestamp cell.
fn when(v: &Value) -> String {
    v.as_i64().map_or_else(|| "-".into(), utc)
}

fn yes_no(v: &Value) -> String {
    let word = match v.as_bool() {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    };
    word.to_string()
}

fn items<'a>(v: &'a Value, field: &str) -> &'a [Value] {
    match v.get(field) {
        Some(Value::Array(a)) => a.as_slice(),
        _ => &[],
    }
}

fn truncate(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, to the second.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (proleptic Gregorian; H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn tenants_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "tenants")
        .iter()
        .map(|t| {
            let origins = match &t["allowed_origins"] {
                Value::Null => "any".to_string(),
                Value::Array(a) if a.is_empty() => "none".to_string(),
                other => cell(other),
            };
            vec![
                cell(&t["id"]),
                cell(&t["access"]),
                cell(&t["active_plugin"]),
                cell(&t["connections"]),
                cell(&t["channels"]),
                origins,
                when(&t["created_at_ms"]),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "ACCESS",
            "PLUGIN",
            "CONNECTIONS",
            "CHANNELS",
            "ORIGINS",
            "CREATED",
        ],
        &rows,
    )
}

/// The hooks a component declares, by name.
fn hook_names(v: &Value) -> String {
    let on: Vec<&str> = v
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, x)| x.as_bool() == Some(true))
                .map(|(k, _)| k.as_str())
                .collect()
        })
        .unwrap_or_default();
    if on.is_empty() {
        "-".into()
    } else {
        on.join(",")
    }
}

fn plugins_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "versions")
        .iter()
        .map(|p| {
            vec![
                cell(&p["version"]),
                if p["active"].as_bool() == Some(true) {
                    "*".into()
                } else {
                    String::new()
                },
                cell(&p["name"]),
                cell(&p["plugin_version"]),
                hook_names(&p["hooks"]),
                cell(&p["size_bytes"]),
                p["sha256"].as_str().map_or_else(
                    || "-".to_string(),
                    |s| s.chars().take(12).collect::<String>(),
                ),
                yes_no(&p["compiled"]),
                when(&p["created_at_ms"]),
            ]
        })
        .collect();
    table(
        &[
            "VERSION", "ACTIVE", "NAME", "RELEASE", "HOOKS", "BYTES", "SHA256", "COMPILED",
            "CREATED",
        ],
        &rows,
    )
}

fn nodes_table(v: &Value) -> String {
    let me = v["self"].as_str();
    let rows: Vec<Vec<String>> = items(v, "nodes")
        .iter()
        .map(|n| {
            vec![
                cell(&n["id"]),
                if me.is_some() && n["id"].as_str() == me {
                    "*".into()
                } else {
                    String::new()
                },
                yes_no(&n["alive"]),
                cell(&n["address"]),
                cell(&n["version"]),
                cell(&n["connections"]),
                n["plugins"].as_object().map_or(0, Map::len).to_string(),
                when(&n["started_at_ms"]),
                when(&n["last_heartbeat_ms"]),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "SELF",
            "ALIVE",
            "ADDRESS",
            "VERSION",
            "CONNECTIONS",
            "PLUGINS",
            "STARTED",
            "HEARTBEAT",
        ],
        &rows,
    )
}

fn connections_text(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "connections")
        .iter()
        .map(|c| {
            vec![
                cell(&c["session"]),
                cell(&c["subject"]),
                cell(&c["transport"]),
                cell(&c["channels"]),
                cell(&c["queue_bytes"]),
                when(&c["connected_at_ms"]),
                cell(&c["remote_addr"]),
            ]
        })
        .collect();
    let list = table(
        &[
            "SESSION",
            "SUBJECT",
            "TRANSPORT",
            "CHANNELS",
            "QUEUE",
            "CONNECTED",
            "REMOTE",
        ],
        &rows,
    );
    format!("{}\n{list}", header_lines(v, &["node"]))
}

/// A history message's payload: `data`, or the delivered frame's `data`.
fn message_data(m: &Value) -> String {
    let data = m
        .get("data")
        .or_else(|| m.get("frame").and_then(|f| f.get("data")));
    match data {
        Some(d) => truncate(d.to_string(), 120),
        None => "-".into(),
    }
}

fn history_text(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "messages")
        .iter()
        .map(|m| {
            vec![
                cell(&m["seq"]),
                cell(&m["prev"]),
                when(&m["at_ms"]),
                cell(&m["key"]),
                cell(&m["audiences"]),
                message_data(m),
            ]
        })
        .collect();
    let list = table(&["SEQ", "PREV", "AT", "KEY", "AUDIENCES", "DATA"], &rows);
    let head = header_lines(v, &["channel", "node", "epoch", "head", "oldest", "more"]);
    format!("{head}\n{list}")
}

fn publish_text(v: &Value) -> String {
    let Some(results) = v.get("results").and_then(Value::as_array) else {
        return key_values(v, &["ch", "seq"]);
    };
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let rest: Vec<String> = r
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "ch" | "seq"))
                        .map(|(k, x)| format!("{k}={}", cell(x)))
                        .collect()
                })
                .unwrap_or_default();
            let outcome = if rest.is_empty() {
                "-".to_string()
            } else {
                rest.join(" ")
            };
            vec![cell(&r["ch"]), cell(&r["seq"]), outcome]
        })
        .collect();
    table(&["CH", "SEQ", "RESULT"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory as _, Parser};

    /// The tree as config.rs builds it: these commands flattened beside others.
    #[derive(Debug, Parser)]
    #[command(name = "herald")]
    struct TestCli {
        #[command(subcommand)]
        cmd: TestCommand,
    }

    #[derive(Debug, clap::Subcommand)]
    #[allow(clippy::large_enum_variant)]
    enum TestCommand {
        #[command(flatten)]
        Admin(AdminCommand),
        Push(PushArgs),
        Activate(ActivateArgs),
    }

    fn parse(args: &[&str]) -> Result<TestCommand, clap::Error> {
        TestCli::try_parse_from(std::iter::once("herald").chain(args.iter().copied()))
            .map(|c| c.cmd)
    }

    #[test]
    fn the_command_trees_are_valid() {
        TestCli::command().debug_assert();
        crate::config::Cli::command().debug_assert();
    }

    #[test]
    fn the_parser_takes_the_documented_forms() {
        match parse(&[
            "tenant",
            "create",
            "t",
            "--access",
            "public",
            "--allowed-origin",
            "https://a",
            "--allowed-origin",
            "https://b",
            "--json",
        ]) {
            Ok(TestCommand::Admin(AdminCommand::Tenant(TenantCommand::Create(a)))) => {
                assert_eq!(a.id, "t");
                assert_eq!(a.settings.access, Some(AccessArg::Public));
                assert_eq!(a.settings.allowed_origins, ["https://a", "https://b"]);
                assert!(a.remote.json);
            }
            other => panic!("{other:?}"),
        }
        match parse(&["tenant", "rotate-key", "t", "--admin-token", "x"]) {
            Ok(TestCommand::Admin(AdminCommand::Tenant(TenantCommand::RotateKey(a)))) => {
                assert_eq!(a.remote.admin_token.as_deref(), Some("x"));
            }
            other => panic!("{other:?}"),
        }
        match parse(&["history", "t", "prices", "--since", "3", "--limit", "2"]) {
            Ok(TestCommand::Admin(AdminCommand::History(a))) => {
                assert_eq!((a.since, a.limit), (Some(3), Some(2)));
                assert_eq!(a.channel, "prices");
            }
            other => panic!("{other:?}"),
        }
        match parse(&["publish", "t", "--key", "k", "--data", "-1", "--ch", "c"]) {
            Ok(TestCommand::Admin(AdminCommand::Publish(a))) => {
                assert_eq!(a.data.as_deref(), Some("-1"));
                assert_eq!(a.ch.as_deref(), Some("c"));
            }
            other => panic!("{other:?}"),
        }
        match parse(&["push", "t", "x.wasm", "--activate"]) {
            Ok(TestCommand::Push(a)) => assert!(a.activate),
            other => panic!("{other:?}"),
        }
        match parse(&["activate", "t", "3"]) {
            Ok(TestCommand::Activate(a)) => assert_eq!((a.tenant.as_str(), a.version), ("t", 3)),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["source", "set", "t", "--http", "--stall-after-ms", "500"]).is_ok());
        assert!(parse(&["disconnect", "t", "--subject", "a", "--code", "4001"]).is_ok());
        assert!(parse(&["publish", "t", "--key", "k", "--file", "-"]).is_ok());
    }

    #[test]
    fn the_parser_refuses_what_does_not_go_together() {
        for bad in [
            &[
                "tenant",
                "patch",
                "t",
                "--allowed-origin",
                "a",
                "--clear-allowed-origins",
            ][..],
            &["tenant", "create", "t", "--access", "secret"],
            &["publish", "t", "--key", "k"],
            &["publish", "t", "--key", "k", "--data", "1", "--file", "f"],
            &["publish", "t", "--key", "k", "--ch", "c", "--file", "f"],
            &["disconnect", "t"],
            &["disconnect", "t", "--subject", "a", "--session", "s1"],
            &["disconnect", "t", "--subject", "a", "--code", "70000"],
            &["source", "set", "t"],
            &["source", "set", "t", "--http", "--spec", "{}"],
            &[
                "source",
                "set",
                "t",
                "--spec",
                "{}",
                "--stall-after-ms",
                "5",
            ],
            &["activate", "t", "-1"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn json_arguments_are_inline_or_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("c.json");
        std::fs::write(&good, r#"{"k": [1, 2]}"#).unwrap();
        let at = format!("@{}", good.display());
        assert_eq!(json_arg("--config", &at).unwrap(), json!({"k": [1, 2]}));
        assert_eq!(json_arg("--config", r#"{"k":1}"#).unwrap(), json!({"k": 1}));

        let missing = format!("@{}", dir.path().join("missing.json").display());
        let e = json_arg("--config", &missing).unwrap_err().to_string();
        assert!(e.contains("--config") && e.contains("missing.json"), "{e}");

        let broken = dir.path().join("broken.json");
        std::fs::write(&broken, "{nope").unwrap();
        let e = json_arg("--limits", &format!("@{}", broken.display()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not valid JSON") && e.contains("broken.json"),
            "{e}"
        );
        assert!(json_arg("--config", "{\"a\":").is_err());

        let e = json_object_arg("--limits", "[1]").unwrap_err().to_string();
        assert!(e.contains("JSON object") && e.contains("an array"), "{e}");
    }

    #[test]
    fn tenant_bodies_carry_only_what_was_given() {
        let s = TenantSettings {
            access: Some(AccessArg::Plugin),
            config: Some(r#"{"a":1}"#.into()),
            limits: None,
            conflation: Some("{}".into()),
            allowed_origins: vec!["https://x".into()],
        };
        assert_eq!(
            tenant_body(Some("t"), &s, false).unwrap(),
            json!({"id": "t", "access": "plugin", "config": {"a": 1}, "conflation": {}, "allowed_origins": ["https://x"]})
        );
        assert_eq!(
            tenant_body(None, &TenantSettings::default(), true).unwrap(),
            json!({"allowed_origins": null})
        );
        assert_eq!(
            tenant_body(None, &TenantSettings::default(), false).unwrap(),
            json!({})
        );
        let bad = TenantSettings {
            limits: Some("[1]".into()),
            ..TenantSettings::default()
        };
        let e = tenant_body(None, &bad, false).unwrap_err().to_string();
        assert!(e.contains("--limits"), "{e}");
    }

    #[test]
    fn publish_items_keep_the_data_as_written() {
        assert_eq!(
            publish_item(Some("a"), " {\"b\": 1, \"a\": 2.50} ", None).unwrap(),
            r#"{"ch":"a","data":{"b": 1, "a": 2.50}}"#
        );
        assert_eq!(
            publish_item(None, "\"text\"", Some("k")).unwrap(),
            r#"{"data":"text","key":"k"}"#
        );
        let e = publish_item(Some("a"), "text", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("quotes"), "{e}");
        assert!(check_publish_body(r#"[{"ch":"a","data":1}]"#, "f").is_ok());
        assert!(check_publish_body(r#" {"ch":"a","data":1}"#, "f").is_ok());
        for bad in ["1", "{bad", "", "[1,"] {
            assert!(check_publish_body(bad, "f").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn urls_are_built_from_encoded_segments() {
        let base = base_url("http://h:1").unwrap();
        assert_eq!(
            endpoint(&base, &["admin", "v1", "tenants", "a/b c"])
                .unwrap()
                .as_str(),
            "http://h:1/admin/v1/tenants/a%2Fb%20c"
        );
        let prefixed = base_url("http://h:1/herald/?x=1").unwrap();
        assert_eq!(
            endpoint(&prefixed, &["admin", "v1", "nodes"])
                .unwrap()
                .as_str(),
            "http://h:1/herald/admin/v1/nodes"
        );
        assert!(endpoint(&base, &["admin", ".."]).is_err());
        assert!(endpoint(&base, &["tenants", ""]).is_err());
        assert_eq!(
            history_url(&base, "t", "prices", Some(2), Some(10))
                .unwrap()
                .as_str(),
            "http://h:1/admin/v1/tenants/t/channels/prices/history?since=2&limit=10"
        );
        assert_eq!(
            history_url(&base, "t", "prices", None, None)
                .unwrap()
                .as_str(),
            "http://h:1/admin/v1/tenants/t/channels/prices/history"
        );
        for bad in ["https://h:1", "localhost:8080", "not a url", ""] {
            assert!(base_url(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            resolve(&prefixed, "/admin/v1/tenants/t/uploads/ab")
                .unwrap()
                .as_str(),
            "http://h:1/herald/admin/v1/tenants/t/uploads/ab"
        );
        assert_eq!(
            resolve(&base, "http://h:1/admin/v1/x").unwrap().as_str(),
            "http://h:1/admin/v1/x"
        );
        assert!(resolve(&base, "http://elsewhere/admin/v1/x").is_err());
    }

    #[test]
    fn answers_are_parsed_and_errors_named() {
        let e = answer(
            404,
            br#"{"error":{"code":"not_found","message":"tenant \"x\" not found"}}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"not_found: tenant "x" not found (HTTP 404)"#
        );
        let e = answer(502, b"<html>\nbad gateway</html>")
            .unwrap_err()
            .to_string();
        assert!(e.contains("HTTP 502") && e.contains("bad gateway"), "{e}");
        assert_eq!(answer(204, b"").unwrap().value, Value::Null);
        let ok = answer(200, br#"{"a":1}"#).unwrap();
        assert_eq!((ok.status, ok.text.as_str()), (200, r#"{"a":1}"#));
        assert_eq!(ok.value, json!({"a": 1}));
        assert!(matches!(answer(200, b"nope"), Err(CliError::Protocol(_))));
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            vec!["a".to_string(), "public".to_string()],
            vec!["long-id".to_string(), "plugin".to_string()],
        ];
        assert_eq!(
            table(&["ID", "ACCESS"], &rows),
            format!(
                "ID{}ACCESS\na{}public\nlong-id  plugin\n",
                " ".repeat(7),
                " ".repeat(8)
            )
        );
        // An empty last cell leaves no trailing blanks; no rows: the header.
        assert_eq!(
            table(&["A", "B"], &[vec!["x".into(), String::new()]]),
            "A  B\nx\n"
        );
        assert_eq!(table(&["A", "B"], &[]), "A  B\n");
    }

    #[test]
    fn objects_become_aligned_key_value_lines() {
        let v = json!({
            "id": "t",
            "limits": {},
            "config": {"a": {"b": 1}},
            "created_at_ms": 0,
            "allowed_origins": null,
            "tags": ["x", "y"],
        });
        let text = key_values(
            &v,
            &["id", "allowed_origins", "config", "created_at_ms", "limits"],
        );
        // "allowed_origins:" is the widest key: 16 characters.
        let line = |k: &str, v: &str| {
            let key = format!("{k}:");
            format!("{key:<16} {v}\n")
        };
        let want = [
            line("id", "t"),
            line("allowed_origins", "-"),
            line("config.a.b", "1"),
            line("created_at_ms", "0 (1970-01-01T00:00:00Z)"),
            line("limits", "{}"),
            line("tags", "x, y"),
        ]
        .concat();
        assert_eq!(text, want);
    }

    #[test]
    fn timestamps_are_shown_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc(951_782_400_999), "2000-02-29T00:00:00Z");
        assert_eq!(utc(-1), "1969-12-31T23:59:59Z");
        assert!(is_timestamp("health.since_ms") && is_timestamp("created_at_ms"));
        assert!(!is_timestamp("stall_after_ms") && !is_timestamp("history_ttl_ms"));
    }

    #[test]
    fn lists_render_as_tables() {
        let v = json!({"node": "n1", "channel": "prices", "epoch": 7, "head": 2, "oldest": 1, "more": false,
        "messages": [
            {"seq": 1, "prev": 0, "at_ms": 0, "key": "AAPL", "audiences": null,
             "frame": {"op": "msg", "ch": "prices", "seq": 1, "data": {"px": 1.5}}},
            {"seq": 2, "prev": 1, "at_ms": 1000, "key": null, "audiences": ["gold"], "data": "plain"},
        ]});
        let text = history_text(&v);
        assert!(text.starts_with("channel: prices\n"), "{text}");
        assert!(!text.contains("messages"), "{text}");
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("SEQ"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 3, "{text}");
        assert_eq!(
            rows[1],
            [
                "1",
                "0",
                "1970-01-01T00:00:00Z",
                "AAPL",
                "-",
                r#"{"px":1.5}"#
            ]
        );
        assert_eq!(
            rows[2],
            ["2", "1", "1970-01-01T00:00:01Z", "-", "gold", r#""plain""#]
        );

        let v = json!({"node": "n1", "connections": [{"session": "s4", "subject": null, "transport": "sse",
            "channels": ["a", "b"], "queue_bytes": 0, "connected_at_ms": 0, "remote_addr": "127.0.0.1:5"}]});
        let text = connections_text(&v);
        assert!(text.starts_with("node: n1\n\nSESSION"), "{text}");
        let row: Vec<&str> = text
            .lines()
            .next_back()
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            [
                "s4",
                "-",
                "sse",
                "a,b",
                "0",
                "1970-01-01T00:00:00Z",
                "127.0.0.1:5"
            ]
        );

        let v = json!({"active": 2, "versions": [
            {"version": 1, "active": false, "name": "a", "plugin_version": "0.1.0", "hooks": {"connect": true, "transform": false},
             "size_bytes": 10, "sha256": "0123456789abcdef", "compiled": true, "created_at_ms": 0},
            {"version": 2, "active": true, "name": "b", "plugin_version": "0.2.0", "hooks": {"connect": true, "transform": true},
             "size_bytes": 20, "sha256": "fedcba9876543210", "compiled": false, "created_at_ms": 0}]});
        let text = plugins_table(&v);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[1],
            [
                "1",
                "a",
                "0.1.0",
                "connect",
                "10",
                "0123456789ab",
                "yes",
                "1970-01-01T00:00:00Z"
            ]
        );
        assert_eq!(rows[2][..3], ["2", "*", "b"]);
        assert_eq!(rows[2][4], "connect,transform");

        let v = json!({"self": "n1", "nodes": [{"id": "n1", "alive": true, "address": "a:1", "version": "0.1.0",
            "connections": 3, "plugins": {"t": 1}, "started_at_ms": 0, "last_heartbeat_ms": 0}]});
        let text = nodes_table(&v);
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[..7], ["n1", "*", "yes", "a:1", "0.1.0", "3", "1"]);

        let v = json!({"results": [{"ch": "a", "seq": 1, "delivered": 2}, {"ch": "a", "seq": null, "held": true}]});
        let text = publish_text(&v);
        assert_eq!(
            text,
            table(
                &["CH", "SEQ", "RESULT"],
                &[
                    vec!["a".into(), "1".into(), "delivered=2".into()],
                    vec!["a".into(), "-".into(), "held=true".into()],
                ]
            )
        );
        let tenants = json!({"tenants": [{"id": "t", "access": "public", "active_plugin": null, "allowed_origins": null, "created_at_ms": 0}]});
        let row: Vec<String> = tenants_table(&tenants)
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(
            row,
            ["t", "public", "-", "-", "-", "any", "1970-01-01T00:00:00Z"]
        );
    }
}
