//! The `herald` command line: the clap root of every subcommand.
//!
//! Owns: which subcommands exist — `serve` (flags in `config.rs`), the plugin
//! author's tools (`plugin.rs`) and a running server's admin API (`admin/`).

pub mod admin;
pub mod plugin;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "herald", version, about = "Multi-tenant real-time push server")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once, at start
pub enum Command {
    /// Start the server.
    Serve(crate::config::ServeArgs),
    /// Write, build and try plugins; push them to a server and activate them.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    // tenant, source, publish, nodes, connections, disconnect, history: a
    // running server's admin API (cli/admin).
    #[command(flatten)]
    Admin(admin::AdminCommand),
}
