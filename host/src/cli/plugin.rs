//! `herald plugin new` and `herald plugin test`: a plugin author's tools,
//! without a server.
//!
//! Owns: the scaffold of each language (the files of sdk/<lang>/template,
//! the SDK and the WIT, embedded in the binary) and running a component's
//! hooks locally under the same sandbox the server uses. Invariants: `new`
//! never writes into a folder that has files; `test` runs exactly the code
//! the server runs (`plugin::active::ActivePlugin`), so what it prints is
//! what a tenant would get.

use crate::fanout::position::SourcePos;
use crate::plugin::active::{Activation, ActivePlugin};
use crate::plugin::batch::SourceRecord;
use crate::plugin::{ConnectRequest, Grant, PluginError, SandboxLimits};
use anyhow::{bail, Context as _};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Write a working plugin with its build script into a new folder.
    New(NewArgs),
    /// Run a component's hooks locally and print what they answer.
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
    /// A channel to subscribe to, as the session `--connect` granted (or
    /// subject "test" without one); repeatable.
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

/// A file's text, or the argument itself when it is inline JSON.
fn file_or_inline(arg: &str) -> anyhow::Result<String> {
    if arg.trim_start().starts_with('{') {
        return Ok(arg.to_string());
    }
    std::fs::read_to_string(arg).with_context(|| format!("reading {arg}"))
}

fn pairs(v: &Value, field: &str) -> anyhow::Result<Vec<(String, String)>> {
    match &v[field] {
        Value::Null => Ok(Vec::new()),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => bail!("{field}.{k}: a string, not {other}"),
            })
            .collect(),
        other => bail!("{field}: an object of strings, not {other}"),
    }
}

fn connect_request(v: &Value) -> anyhow::Result<ConnectRequest> {
    let text = |f: &str, default: &str| -> anyhow::Result<String> {
        match &v[f] {
            Value::Null => Ok(default.to_string()),
            Value::String(s) => Ok(s.clone()),
            other => bail!("--connect {f}: a string, not {other}"),
        }
    };
    Ok(ConnectRequest {
        tenant: text("tenant", "local")?,
        transport: text("transport", "ws")?,
        headers: pairs(v, "headers")?,
        query: pairs(v, "query")?,
        credentials: match &v["credentials"] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => bail!("--connect credentials: a string, not {other}"),
        },
        remote_addr: text("remote_addr", "127.0.0.1:50000")?,
    })
}

/// One line of `--records`, owned.
struct OwnedRecord {
    timestamp_ms: u64,
    position: Option<u64>,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    channel: Option<String>,
    headers: Vec<(String, Vec<u8>)>,
}

fn read_records(path: &Path) -> anyhow::Result<Vec<OwnedRecord>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), n + 1);
        let v: Value = serde_json::from_str(line).with_context(at)?;
        // The value's JSON as written (key order, number forms), as an
        // HTTP publish passes `data` on.
        #[derive(serde::Deserialize)]
        struct Raw<'a> {
            #[serde(borrow)]
            value: Option<&'a serde_json::value::RawValue>,
        }
        let raw: Raw<'_> = serde_json::from_str(line).with_context(at)?;
        let value = match (raw.value, &v["text"]) {
            (None, Value::String(t)) => t.clone().into_bytes(),
            (None, _) => bail!("{}: a record needs \"value\" or \"text\"", at()),
            (Some(value), Value::Null) => value.get().as_bytes().to_vec(),
            _ => bail!("{}: \"value\" or \"text\", not both", at()),
        };
        let string = |f: &str| -> anyhow::Result<Option<String>> {
            match &v[f] {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s.clone())),
                other => bail!("{}: {f}: a string, not {other}", at()),
            }
        };
        out.push(OwnedRecord {
            timestamp_ms: v["timestamp_ms"].as_u64().unwrap_or(0),
            position: v["position"].as_u64(),
            key: string("key")?.map(String::into_bytes),
            value,
            channel: string("channel")?,
            headers: pairs(&v, "headers")
                .with_context(at)?
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect(),
        });
    }
    Ok(out)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Calls `f` `n` times (at least once): the last answer and the median
/// time in ms. Guest output is kept from the last call only.
fn repeated<R>(n: usize, mut f: impl FnMut() -> R) -> (R, f64) {
    let mut times = Vec::with_capacity(n.max(1));
    let mut last = None;
    for _ in 0..n.max(1) {
        let _ = crate::plugin::active::take_output();
        let t = Instant::now();
        last = Some(f());
        times.push(t.elapsed());
    }
    times.sort();
    (
        last.expect("called at least once"),
        ms(times[times.len() / 2]),
    )
}

/// A failed call, as both outputs show it.
fn failure(e: &PluginError) -> Value {
    json!({"error": e.kind(), "message": e.to_string()})
}

/// The user's own cache of compiled components: `$XDG_CACHE_HOME/herald`
/// or `~/.cache/herald`; never a directory shared with other users (whoever
/// can write there chooses the native code `herald plugin test` runs).
fn user_cache() -> std::path::PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| {
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
            std::env::temp_dir().join(format!("herald-{uid}"))
        });
    base.join("herald").join("compiled")
}

/// `herald plugin test`: the report on stdout; an error when the
/// component cannot be run at all.
pub fn test(args: &TestArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.component)
        .with_context(|| format!("reading {}", args.component.display()))?;
    let config: Value =
        serde_json::from_str(&file_or_inline(&args.config)?).context("--config is not JSON")?;
    let cache = args.cache_dir.clone().unwrap_or_else(user_cache);
    let runtime = crate::plugin::Runtime::with_artifacts(Some(cache))?;
    let started = Instant::now();
    let component = runtime
        .compile(&bytes)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let compile_ms = ms(started.elapsed());
    let limits = SandboxLimits {
        memory_bytes: args.memory_mib << 20,
        deadline: Duration::from_millis(args.deadline_ms),
        threads: 1,
        queue: 0,
    };
    let activation = Activation {
        version: 1,
        sha256: crate::plugin::sha256_hex(&bytes),
        tenant: "local".into(),
        config: config.to_string().into(),
        limits,
    };
    let started = Instant::now();
    let p: Arc<ActivePlugin> = ActivePlugin::load(&runtime, &component, activation)
        .map_err(|e| anyhow::anyhow!("the component does not load: {e}"))?;
    crate::plugin::active::keep_output(true);
    let mut report = json!({
        "component": args.component.display().to_string(),
        "bytes": bytes.len(),
        "compile_ms": compile_ms,
        "describe": {"ms": ms(started.elapsed()), "name": p.info.name, "version": p.info.version,
                     "contract": p.info.contract, "hooks": p.info.hooks,
                     "transform_encoding": p.info.hooks.transform.then_some(p.info.encoding)},
    });
    let mut session = Grant {
        subject: "test".into(),
        audience: None,
        attributes: Vec::new(),
    };
    if let Some(c) = &args.connect {
        let req: Value =
            serde_json::from_str(&file_or_inline(c)?).context("--connect is not JSON")?;
        let req = connect_request(&req)?;
        let (r, took) = repeated(args.repeat, || p.authorize_connect(&req));
        let mut out = match r {
            Ok(Ok(s)) => {
                let v = json!({"allowed": true, "subject": s.subject, "audience": s.audience, "attributes": s.attributes});
                session = s;
                v
            }
            Ok(Err(d)) => json!({"allowed": false, "code": d.code, "message": d.message}),
            Err(e) => failure(&e),
        };
        out["ms"] = json!(took);
        out["output"] = json!(crate::plugin::active::take_output());
        report["connect"] = out;
    }
    let mut subs = Vec::new();
    for ch in &args.subscribe {
        let (r, took) = repeated(args.repeat, || p.authorize_subscribe(&session, ch));
        let mut out = match r {
            Ok(Ok(())) => json!({"channel": ch, "allowed": true}),
            Ok(Err(d)) => {
                json!({"channel": ch, "allowed": false, "code": d.code, "message": d.message})
            }
            Err(e) => json!({"channel": ch, "failed": failure(&e)}),
        };
        out["ms"] = json!(took);
        out["output"] = json!(crate::plugin::active::take_output());
        subs.push(out);
    }
    if !subs.is_empty() {
        report["subscribe"] = Value::Array(subs);
    }
    if let Some(path) = &args.records {
        let owned = read_records(path)?;
        let records: Vec<SourceRecord<'_>> = owned
            .iter()
            .map(|r| SourceRecord {
                timestamp_ms: r.timestamp_ms,
                position: r.position.map(|n| SourcePos {
                    stream: 0,
                    order: (0, n),
                    number: n,
                }),
                key: r.key.as_deref(),
                value: &r.value,
                channel: r.channel.as_deref(),
                headers: &r.headers,
            })
            .collect();
        if p.info.hooks.transform {
            let mut times = Vec::with_capacity(args.repeat.max(1));
            let mut r = Err(PluginError::Busy(0));
            for _ in 0..args.repeat.max(1) {
                let _ = crate::plugin::active::take_output();
                let t = Instant::now();
                r = p.transform(&records, 1 << 20);
                times.push(t.elapsed());
            }
            times.sort();
            let took = ms(times[times.len() / 2]);
            let fastest = ms(times[0]);
            let output = crate::plugin::active::take_output();
            report["transform"] = match r {
                Ok(t) => {
                    let messages: Vec<Value> = t
                        .outputs
                        .iter()
                        .map(|m| {
                            json!({"record": m.source, "channel": m.channel, "key": m.key,
                                   "audience": m.audience,
                                   "payload": String::from_utf8_lossy(m.payload)})
                        })
                        .collect();
                    let refused: Vec<Value> = t
                        .refused
                        .iter()
                        .map(|r| json!({"record": r.source, "kind": r.kind, "reason": r.reason}))
                        .collect();
                    json!({"records": records.len(), "ms": took, "ms_min": fastest,
                           "calls": times.len(), "messages": messages,
                           "refused": refused, "output": output})
                }
                Err(e) => {
                    json!({"records": records.len(), "ms": took, "failed": failure(&e), "output": output})
                }
            };
        } else {
            report["transform"] = json!({"skipped": "the plugin declares no transform: records are published as they are"});
        }
    }
    crate::plugin::active::keep_output(false);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

fn print_text(r: &Value) {
    let d = &r["describe"];
    println!(
        "{} ({} bytes): compiled in {} ms",
        r["component"].as_str().unwrap_or_default(),
        r["bytes"],
        r["compile_ms"]
    );
    let hooks: Vec<&str> = [
        "authorize_connect",
        "authorize_subscribe",
        "transform",
        "merge",
    ]
    .into_iter()
    .filter(|h| d["hooks"][h] == true)
    .collect();
    println!(
        "describe: {} {}, {}, hooks: {}{} [{} ms]",
        d["name"].as_str().unwrap_or_default(),
        d["version"].as_str().unwrap_or_default(),
        d["contract"].as_str().unwrap_or_default(),
        hooks.join(", "),
        d["transform_encoding"]
            .as_str()
            .map(|e| format!(" (transform {e})"))
            .unwrap_or_default(),
        d["ms"]
    );
    let output = |v: &Value| {
        if let Some(o) = v["output"].as_str().filter(|o| !o.is_empty()) {
            for line in o.lines() {
                println!("    | {line}");
            }
        }
    };
    let failed = |v: &Value| {
        format!(
            "FAILED ({}): {}",
            v["error"].as_str().unwrap_or_default(),
            v["message"].as_str().unwrap_or_default()
        )
    };
    if let Some(c) = r.get("connect") {
        let what = match c["allowed"].as_bool() {
            Some(true) => format!(
                "allowed: subject {}, audience {}, attributes {}",
                c["subject"], c["audience"], c["attributes"]
            ),
            Some(false) => format!(
                "denied {}: {}",
                c["code"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            ),
            None => failed(c),
        };
        println!("connect: {what} [{} ms]", c["ms"]);
        output(c);
    }
    for s in r["subscribe"].as_array().into_iter().flatten() {
        let what = match s["allowed"].as_bool() {
            Some(true) => "allowed".to_string(),
            Some(false) => format!(
                "denied {}: {}",
                s["code"].as_str().unwrap_or_default(),
                s["message"].as_str().unwrap_or_default()
            ),
            None => failed(&s["failed"]),
        };
        println!(
            "subscribe {}: {what} [{} ms]",
            s["channel"].as_str().unwrap_or_default(),
            s["ms"]
        );
        output(s);
    }
    if let Some(t) = r.get("transform") {
        if let Some(why) = t["skipped"].as_str() {
            println!("transform: skipped ({why})");
        } else if !t["failed"].is_null() {
            println!(
                "transform of {} records: {} [{} ms]",
                t["records"],
                failed(&t["failed"]),
                t["ms"]
            );
        } else {
            println!(
                "transform of {} records: {} messages, {} records refused [{} ms]",
                t["records"],
                t["messages"].as_array().map_or(0, Vec::len),
                t["refused"].as_array().map_or(0, Vec::len),
                t["ms"]
            );
            for m in t["messages"].as_array().into_iter().flatten() {
                println!(
                    "  record {} -> {} key={} audience={} {}",
                    m["record"],
                    m["channel"].as_str().unwrap_or_default(),
                    m["key"].as_str().unwrap_or("-"),
                    m["audience"].as_str().unwrap_or("-"),
                    m["payload"].as_str().unwrap_or_default()
                );
            }
            for x in t["refused"].as_array().into_iter().flatten() {
                println!(
                    "  record {} refused ({}): {}",
                    x["record"],
                    x["kind"].as_str().unwrap_or_default(),
                    x["reason"].as_str().unwrap_or_default()
                );
            }
        }
        output(t);
    }
}

#[cfg(test)]
mod tests;
