//! Credentials kept out of what a source shows (API answers, logs).

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`. The
/// userinfo ends at the authority's last `@` (an unencoded `@` in a
/// password stays hidden), and query parameters that carry secrets
/// (`password=`, `sslpassword=`, anything with "secret" or "token") are
/// hidden too.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((creds, host)) => match creds.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{creds}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if secret_param(k) => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
            format!("{path}?{}{fragment}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

fn secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password") || n.contains("secret") || n.contains("token")
}
