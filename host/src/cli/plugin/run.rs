//! `herald plugin test`: runs a component's hooks under the server's own
//! sandbox and reports what each answered, what it logged and printed, and
//! the time per call.
//!
//! Owns: reading `--connect`, `--records` and `--config`, the report (JSON
//! or text) and the exit status. Invariants: every call the report shows
//! ran through `ActivePlugin`, as on the server; a hook that failed (trap,
//! timeout, memory, bad output, a record refused) makes the command fail
//! after the report is printed, so a script cannot mistake it for a pass;
//! subscribes that did not run as a granted session say as whom they ran.

use super::TestArgs;
use crate::fanout::position::SourcePos;
use crate::plugin::active::{Activation, ActivePlugin};
use crate::plugin::batch::SourceRecord;
use crate::plugin::{CompiledFrom, ConnectRequest, Grant, PluginError, SandboxLimits};
use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        let _ = crate::plugin::active::take_log();
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
    let runtime = crate::plugin::Runtime::with_artifacts(Some(cache.clone()))?;
    let started = Instant::now();
    let (component, from) = runtime
        .compile_from(&bytes)
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
        // Compiled now, or its compiled form loaded from the cache.
        "compiled": match from {
            CompiledFrom::Compiled => "now",
            CompiledFrom::Disk | CompiledFrom::Memory => "cache",
        },
        "cache": cache.display().to_string(),
        "describe": {"ms": ms(started.elapsed()), "name": p.info.name, "version": p.info.version,
                     "contract": p.info.contract, "hooks": p.info.hooks,
                     "transform_encoding": p.info.hooks.transform.then_some(p.info.encoding)},
    });
    let mut session = Grant {
        subject: "test".into(),
        audience: None,
        attributes: Vec::new(),
    };
    // Why the subscribes (if any) run as subject "test" rather than as a
    // session the connect granted; `None` once one was granted.
    let mut stand_in = Some("there is no --connect");
    if args.connect.is_some() && !p.info.hooks.authorize_connect {
        stand_in = Some("the plugin declares no authorize-connect");
        report["connect"] = json!({"skipped": "the plugin declares no authorize-connect: a public tenant lets every client in, a plugin tenant refuses them (plugin_lacks_hook)"});
    } else if let Some(c) = &args.connect {
        let req: Value =
            serde_json::from_str(&file_or_inline(c)?).context("--connect is not JSON")?;
        let req = connect_request(&req)?;
        let (r, took) = repeated(args.repeat, || p.authorize_connect(&req));
        let mut out = match r {
            Ok(Ok(s)) => {
                let v = json!({"allowed": true, "subject": s.subject, "audience": s.audience, "attributes": s.attributes});
                session = s;
                stand_in = None;
                v
            }
            Ok(Err(d)) => {
                stand_in = Some("the connect was denied");
                json!({"allowed": false, "code": d.code, "message": d.message})
            }
            Err(e) => {
                stand_in = Some("the connect failed");
                failure(&e)
            }
        };
        out["ms"] = json!(took);
        kept(&mut out);
        report["connect"] = out;
    }
    let mut subs = Vec::new();
    for ch in &args.subscribe {
        let (r, took) = repeated(args.repeat, || p.authorize_subscribe(&session, ch));
        let mut out = match r {
            Ok(Ok(())) if !p.info.hooks.authorize_subscribe => {
                json!({"channel": ch, "allowed": true, "declared": false})
            }
            Ok(Ok(())) => json!({"channel": ch, "allowed": true}),
            Ok(Err(d)) => {
                json!({"channel": ch, "allowed": false, "code": d.code, "message": d.message})
            }
            Err(e) => json!({"channel": ch, "failed": failure(&e)}),
        };
        out["ms"] = json!(took);
        kept(&mut out);
        subs.push(out);
    }
    if !subs.is_empty() {
        report["subscribe"] = Value::Array(subs);
        if let Some(why) = stand_in {
            report["subscribe_as"] = json!({"subject": "test", "because": why});
        }
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
                let _ = crate::plugin::active::take_log();
                let t = Instant::now();
                r = p.transform(&records, 1 << 20);
                times.push(t.elapsed());
            }
            times.sort();
            let took = ms(times[times.len() / 2]);
            let fastest = ms(times[0]);
            let output = crate::plugin::active::take_output();
            let log = crate::plugin::active::take_log();
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
                           "refused": refused, "output": output, "log": log})
                }
                Err(e) => {
                    json!({"records": records.len(), "ms": took, "failed": failure(&e),
                           "output": output, "log": log})
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
    let failed = failures(&report);
    if !failed.is_empty() {
        bail!(
            "{} failed: {} (the report above says why)",
            if failed.len() == 1 { "a hook" } else { "hooks" },
            failed.join(", ")
        );
    }
    Ok(())
}

/// What the guest printed and logged during the calls just made, into `out`.
fn kept(out: &mut Value) {
    out["output"] = json!(crate::plugin::active::take_output());
    out["log"] = json!(crate::plugin::active::take_log());
}

/// Every call of the report that failed (a denial is an answer, not a
/// failure), named for the summary line.
fn failures(r: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let kind = |v: &Value| v["error"].as_str().unwrap_or("failed").to_string();
    if let Some(c) = r
        .get("connect")
        .filter(|c| c["allowed"].is_null() && c["skipped"].is_null())
    {
        out.push(format!("connect ({})", kind(c)));
    }
    for s in r["subscribe"].as_array().into_iter().flatten() {
        if !s["failed"].is_null() {
            let ch = s["channel"].as_str().unwrap_or_default();
            out.push(format!("subscribe {ch} ({})", kind(&s["failed"])));
        }
    }
    if let Some(t) = r.get("transform") {
        if !t["failed"].is_null() {
            out.push(format!("transform ({})", kind(&t["failed"])));
        }
        for x in t["refused"].as_array().into_iter().flatten() {
            let why = x["kind"].as_str().unwrap_or_default();
            out.push(format!("transform of record {} ({why})", x["record"]));
        }
    }
    out
}

fn print_text(r: &Value) {
    let d = &r["describe"];
    let how = if r["compiled"] == "now" {
        format!(
            "compiled in {} ms (kept in {})",
            r["compile_ms"],
            cache_dir(r)
        )
    } else {
        format!(
            "loaded compiled from the cache ({}) in {} ms",
            cache_dir(r),
            r["compile_ms"]
        )
    };
    println!(
        "{} ({} bytes): {how}",
        r["component"].as_str().unwrap_or_default(),
        r["bytes"],
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
        for line in v["log"].as_array().into_iter().flatten() {
            println!("    log {}", line.as_str().unwrap_or_default());
        }
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
    if let Some(why) = r["connect"]["skipped"].as_str() {
        println!("connect: skipped ({why})");
    } else if let Some(c) = r.get("connect") {
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
    if let Some(why) = r["subscribe_as"]["because"].as_str() {
        println!("subscribes run as subject \"test\": {why}");
    }
    for s in r["subscribe"].as_array().into_iter().flatten() {
        let what = match s["allowed"].as_bool() {
            Some(true) if s["declared"] == false => {
                "allowed (the plugin declares no authorize-subscribe: every subscription is)"
                    .to_string()
            }
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

fn cache_dir(r: &Value) -> &str {
    r["cache"].as_str().unwrap_or_default()
}
