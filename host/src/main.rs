//! The `herald` binary: parses flags, sets up logging and signals, calls `run`.

use anyhow::Context as _;
use clap::Parser;
use herald::cli::{Cli, Command};

/// jemalloc, not glibc's malloc: a connection's long-lived blocks (its task
/// and socket registration, 128-byte aligned; its handle) sit in size classes
/// with no header per block and no remainders split off aligned ones, so an
/// idle connection costs ~1.2 KiB of RSS instead of ~1.45 (BENCHMARKS.md,
/// "Idle connections below uWebSockets"); connects and fan-out measured no
/// slower in the same runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Admin(cmd) => {
            if let Err(e) = herald::cli::admin::run(&cmd) {
                eprintln!("herald: {e}");
                std::process::exit(1);
            }
            return Ok(());
        }
        Command::Plugin(cmd) => {
            let done = match &cmd {
                herald::cli::plugin::PluginCommand::New(a) => herald::cli::plugin::new(a),
                herald::cli::plugin::PluginCommand::Test(a) => herald::cli::plugin::test(a),
                herald::cli::plugin::PluginCommand::Push(a) => {
                    herald::cli::admin::plugin_push(a).map_err(anyhow::Error::from)
                }
                herald::cli::plugin::PluginCommand::List(a) => {
                    herald::cli::admin::plugin_list(a).map_err(anyhow::Error::from)
                }
                herald::cli::plugin::PluginCommand::Activate(a) => {
                    herald::cli::admin::plugin_activate(a).map_err(anyhow::Error::from)
                }
                herald::cli::plugin::PluginCommand::Rollback(a) => {
                    herald::cli::admin::plugin_rollback(a).map_err(anyhow::Error::from)
                }
            };
            if let Err(e) = done {
                eprintln!("herald: {e:#}");
                std::process::exit(1);
            }
            return Ok(());
        }
    };
    let config = match args.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("herald: {e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&args.log).context("--log")?)
        .init();
    match herald::raise_nofile_limit() {
        Ok(n) => tracing::info!(
            open_files = n,
            "raised the open-files limit to its hard limit"
        ),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.worker_threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.enable_all().build()?;
    rt.block_on(async move {
        let listener = herald::bind(args.listen, args.listen_backlog, args.reuse_port)
            .with_context(|| format!("binding {}", args.listen))?;
        herald::run(config, listener, shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
