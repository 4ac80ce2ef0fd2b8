//! The CLI's HTTP side: one client per command, requests to the admin API
//! with the admin token, answers checked (2xx parsed, anything else the
//! server's `code: message`), and the flag inputs (`@file`, stdin, JSON)
//! read before any request.

use super::*;

pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request carries.
pub(super) enum Payload {
    Empty,
    Json(Value),
    Bytes(Vec<u8>, &'static str),
}

/// A 2xx answer: its status, its text as it came, and that text parsed
/// (`Null` when empty).
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) text: String,
    pub(super) value: Value,
}

pub(super) struct Api {
    pub(super) base: Url,
    pub(super) auth: Option<String>,
    pub(super) http: reqwest::Client,
}

impl Api {
    pub(super) fn new(remote: &Remote, auth: Option<String>) -> Result<Api, CliError> {
        let base = base_url(&remote.url)?;
        if base.scheme() == "http" && auth.is_some() && !remote.allow_http && !loopback(&base) {
            return Err(CliError::Input(format!(
                "--url {:?}: the admin token or publish key would cross the network in clear; use https:// (or pass --allow-http)",
                remote.url
            )));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("herald-cli/", env!("CARGO_PKG_VERSION")))
            .https_only(base.scheme() == "https");
        if let Some(path) = &remote.ca_cert {
            let pem = std::fs::read(path)
                .map_err(|e| CliError::Input(format!("--ca-cert {}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                CliError::Input(format!(
                    "--ca-cert {}: not PEM certificates: {e}",
                    path.display()
                ))
            })?;
            if certs.is_empty() {
                return Err(CliError::Input(format!(
                    "--ca-cert {}: no certificate in it",
                    path.display()
                )));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder
            .build()
            .map_err(|e| CliError::Protocol(format!("cannot start the HTTP client: {e}")))?;
        Ok(Api { base, auth, http })
    }

    /// A client with the admin token, refused without one.
    pub(super) fn admin(remote: &Remote) -> Result<Api, CliError> {
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

    pub(super) async fn call(
        &self,
        method: Method,
        segments: &[&str],
        payload: Payload,
    ) -> Result<Answer, CliError> {
        let url = endpoint(&self.base, segments)?;
        self.call_url(method, url, payload).await
    }

    pub(super) async fn call_url(
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
    pub(super) async fn wait_for_upload(
        &self,
        accepted: &Answer,
        quiet: bool,
    ) -> Result<Answer, CliError> {
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
pub(super) fn admin_call(
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
pub(super) fn block_on<T>(work: impl Future<Output = Result<T, CliError>>) -> Result<T, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Protocol(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(work)
}

/// `--url`, checked: plain HTTP (this client has no TLS), with a host.
pub(super) fn base_url(raw: &str) -> Result<Url, CliError> {
    let url = Url::parse(raw.trim())
        .map_err(|e| CliError::Input(format!("--url {raw:?} is not a URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(CliError::Input(format!(
            "--url {raw:?}: only http:// and https:// URLs are supported"
        )));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Err(CliError::Input(format!("--url {raw:?} has no host")));
    }
    Ok(url)
}

/// Whether `url` names this machine (where plain HTTP crosses no network).
fn loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or("");
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `base` with `segments` appended, each percent-encoded (a `/` in a name
/// stays in its segment).
pub(super) fn endpoint(base: &Url, segments: &[&str]) -> Result<Url, CliError> {
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
pub(super) fn resolve(base: &Url, status_url: &str) -> Result<Url, CliError> {
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
pub(super) fn answer(status: u16, body: &[u8]) -> Result<Answer, CliError> {
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

pub(super) fn transport_error(url: &str, e: &reqwest::Error) -> CliError {
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
pub(super) fn snippet(text: &str) -> String {
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
pub(super) fn load_text(flag: &str, arg: &str) -> Result<String, CliError> {
    match arg.strip_prefix('@') {
        Some("-") => read_stdin(flag),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| CliError::Input(format!("{flag}: cannot read {path}: {e}"))),
        None => Ok(arg.to_string()),
    }
}

pub(super) fn read_stdin(what: &str) -> Result<String, CliError> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| CliError::Input(format!("{what}: cannot read standard input: {e}")))?;
    Ok(text)
}

/// A JSON|@file argument, parsed.
pub(super) fn json_arg(flag: &str, arg: &str) -> Result<Value, CliError> {
    let text = load_text(flag, arg)?;
    let origin = arg
        .strip_prefix('@')
        .map(|p| format!(" in {p}"))
        .unwrap_or_default();
    serde_json::from_str(&text)
        .map_err(|e| CliError::Input(format!("{flag}: not valid JSON{origin}: {e}")))
}

/// A JSON|@file argument that must be an object.
pub(super) fn json_object_arg(flag: &str, arg: &str) -> Result<Value, CliError> {
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
