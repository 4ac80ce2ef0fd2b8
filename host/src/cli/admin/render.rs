//! The CLI's output: tables and key: value lines for people, the server's
//! JSON as it came for `--json`.

use super::*;

/// Writes `text` and a newline to stdout; a closed stdout is not an error.
pub(super) fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
}

/// The answer as it came (`--json`), or as `human` renders it.
pub(super) fn show(remote: &Remote, answer: &Answer, human: impl FnOnce(&Value) -> String) {
    if remote.json {
        out(answer.text.trim());
    } else {
        out(&human(&answer.value));
    }
}

/// Rows under headers, each column as wide as its widest cell, two spaces
/// apart; no trailing blanks.
pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
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
pub(super) fn key_values(v: &Value, first: &[&str]) -> String {
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
pub(super) fn header_lines(v: &Value, fields: &[&str]) -> String {
    let picked: Map<String, Value> = fields
        .iter()
        .filter_map(|k| v.get(*k).map(|x| ((*k).to_string(), x.clone())))
        .collect();
    key_values(&Value::Object(picked), fields)
}

pub(super) fn flatten(key: &str, v: &Value, out: &mut Vec<(String, String)>) {
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
pub(super) fn scalar(key: &str, v: &Value) -> String {
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
pub(super) fn is_timestamp(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last.ends_with("at_ms")
        || last == "since_ms"
        || last.ends_with("heartbeat_ms")
        || last.ends_with("record_ms")
}

/// A value in a table cell.
pub(super) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) if a.iter().all(Value::is_string) => join_strings(a, ","),
        other => other.to_string(),
    }
}

pub(super) fn join_strings(a: &[Value], sep: &str) -> String {
    a.iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(sep)
}

/// A timestamp cell.
pub(super) fn when(v: &Value) -> String {
    v.as_i64().map_or_else(|| "-".into(), utc)
}

pub(super) fn yes_no(v: &Value) -> String {
    let word = match v.as_bool() {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    };
    word.to_string()
}

pub(super) fn items<'a>(v: &'a Value, field: &str) -> &'a [Value] {
    match v.get(field) {
        Some(Value::Array(a)) => a.as_slice(),
        _ => &[],
    }
}

pub(super) fn truncate(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, to the second.
pub(super) fn utc(ms: i64) -> String {
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

pub(super) fn tenants_table(v: &Value) -> String {
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
pub(super) fn hook_names(v: &Value) -> String {
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

pub(super) fn plugins_table(v: &Value) -> String {
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

pub(super) fn nodes_table(v: &Value) -> String {
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

pub(super) fn connections_text(v: &Value) -> String {
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
pub(super) fn message_data(m: &Value) -> String {
    let data = m
        .get("data")
        .or_else(|| m.get("frame").and_then(|f| f.get("data")));
    match data {
        Some(d) => truncate(d.to_string(), 120),
        None => "-".into(),
    }
}

pub(super) fn history_text(v: &Value) -> String {
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

pub(super) fn publish_text(v: &Value) -> String {
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
