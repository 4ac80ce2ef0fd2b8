//! `herald plugin new` and `herald plugin test`: a plugin author's tools,
//! without a server.
//!
//! Owns: the scaffold of each language (the files of sdk/<lang>/template,
//! the SDK and the WIT, embedded in the binary) and the flags of `test`
//! (run.rs runs it). Invariants: `new` never writes into a folder that has
//! files; `test` runs exactly the code the server runs
//! (`plugin::active::ActivePlugin`), so what it prints is what a tenant
//! would get.

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

mod run;
pub use run::test;

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Write a working plugin with its build script into a new folder.
    New(NewArgs),
    /// Run a component's hooks locally and print what they answer (exit
    /// status 1 when a hook failed: trap, timeout, memory, bad output).
    Test(TestArgs),
    /// Upload a component to a tenant on a server (waits while a large one compiles).
    Push(crate::cli::admin::PushArgs),
    /// List a tenant's stored plugin versions.
    List(crate::cli::admin::TenantArgs),
    /// Make a stored version the tenant's active plugin.
    Activate(crate::cli::admin::ActivateArgs),
    /// Activate the version that was active before the current one.
    Rollback(crate::cli::admin::TenantArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
    C,
}

#[derive(Debug, Args)]
pub struct NewArgs {
    pub lang: Lang,
    /// The folder to create (it must not exist, or be empty).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// The component (.wasm) to run.
    pub component: PathBuf,
    /// Source records, one JSON object per line: {"value": <JSON> | "text":
    /// "…", "key": "…", "channel": "…", "headers": {"name": "value"},
    /// "timestamp_ms": n, "position": n}.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// A connect request: a file or inline JSON {"credentials": "…",
    /// "transport": "ws", "headers": {…}, "query": {…}, "remote_addr": "…"}.
    #[arg(long)]
    pub connect: Option<String>,
    /// A channel to subscribe to, as the session `--connect` granted (as
    /// subject "test", and said so, without one or when it was refused);
    /// repeatable.
    #[arg(long)]
    pub subscribe: Vec<String>,
    /// The tenant config the plugin reads: a file or inline JSON.
    #[arg(long, default_value = "{}")]
    pub config: String,
    /// limits.plugin_deadline_ms.
    #[arg(long, default_value_t = 100)]
    pub deadline_ms: u64,
    /// limits.plugin_memory_bytes, in MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: usize,
    /// Run each hook this many times and report the median call (the
    /// transform's fastest too); what is printed is the last call's.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Where compiled components are kept between runs (a large one takes
    /// seconds to compile); default: the user's own cache
    /// ($XDG_CACHE_HOME/herald/compiled or ~/.cache/herald/compiled).
    #[arg(long, env = "HERALD_PLUGIN_CACHE")]
    pub cache_dir: Option<PathBuf>,
}

/// One template file: where it goes, and its bytes.
type File = (&'static str, &'static str);

macro_rules! files {
    ($($dest:literal => $src:literal),* $(,)?) => {
        &[$(($dest, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../", $src)))),*]
    };
}

const WIT: &str = "sdk/wit/herald.wit";

fn template(lang: Lang) -> &'static [File] {
    match lang {
        Lang::Rust => files![
            "Cargo.toml" => "sdk/rust/template/Cargo.toml",
            "src/lib.rs" => "sdk/rust/template/src/lib.rs",
            "build.sh" => "sdk/rust/template/build.sh",
            ".gitignore" => "sdk/rust/template/.gitignore",
            "herald-sdk/Cargo.toml" => "sdk/Cargo.toml",
            "herald-sdk/src/lib.rs" => "sdk/src/lib.rs",
            "herald-sdk/wit/herald.wit" => "sdk/wit/herald.wit",
        ],
        Lang::Python => files![
            "app.py" => "sdk/python/template/app.py",
            "build.sh" => "sdk/python/template/build.sh",
            ".gitignore" => "sdk/python/template/.gitignore",
            "herald_plugin.py" => "sdk/python/herald_plugin.py",
            "wit/herald.wit" => "sdk/wit/herald.wit",
        ],
        Lang::Js => files![
            "plugin.js" => "sdk/js/template/plugin.js",
            "package.json" => "sdk/js/template/package.json",
            "package-lock.json" => "sdk/js/template/package-lock.json",
            "build.mjs" => "sdk/js/template/build.mjs",
            "build.sh" => "sdk/js/template/build.sh",
            ".gitignore" => "sdk/js/template/.gitignore",
            "README.md" => "sdk/js/template/README.md",
            "herald-plugin.js" => "sdk/js/herald-plugin.js",
            "herald-plugin.d.ts" => "sdk/js/herald-plugin.d.ts",
            "wit/herald.wit" => "sdk/wit/herald.wit",
        ],
        Lang::C => files![
            "hooks.c" => "sdk/c/template/hooks.c",
            "build.sh" => "sdk/c/template/build.sh",
            ".gitignore" => "sdk/c/template/.gitignore",
            "herald_plugin.h" => "sdk/c/herald_plugin.h",
            "herald_plugin.c" => "sdk/c/herald_plugin.c",
            "json.c" => "sdk/c/json.c",
            "plugin.h" => "sdk/c/bindings/plugin.h",
            "plugin.c" => "sdk/c/bindings/plugin.c",
            "wit/herald.wit" => "sdk/wit/herald.wit",
        ],
    }
}

/// Where each language's build writes the component, in the new folder.
fn output_of(lang: Lang) -> &'static str {
    match lang {
        Lang::Js => "dist/plugin.wasm",
        _ => "target/plugin.wasm",
    }
}

/// `herald plugin new`: writes the template; the next steps on stdout.
pub fn new(args: &NewArgs) -> anyhow::Result<()> {
    let dir = &args.dir;
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).with_context(|| dir.display().to_string())?;
        if entries.next().is_some() {
            bail!(
                "{} exists and is not empty; choose a new folder",
                dir.display()
            );
        }
    }
    for (dest, text) in template(args.lang) {
        let path = dir.join(dest);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
        }
        std::fs::write(&path, text).with_context(|| path.display().to_string())?;
        if dest.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    let lang = format!("{:?}", args.lang).to_lowercase();
    println!(
        "wrote a {lang} plugin to {d} (contract herald:plugin@0.2.0, {w})\n\
         next:\n  bash {d}/build.sh\n  herald plugin test {d}/{out} --records records.jsonl\n\
         guide: docs/plugins/{lang}.md",
        d = dir.display(),
        w = WIT,
        out = output_of(args.lang),
    );
    Ok(())
}

#[cfg(test)]
mod tests;
