//! The admin CLI's commands and flags (clap): where the server is, what each
//! command takes, and the tenant settings flags shared by create and patch.

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use std::path::PathBuf;

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
    pub(super) fn as_str(self) -> &'static str {
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
