//! A request head, parsed without I/O.
//!
//! Owns: deciding from a request whether it becomes a WebSocket session, an
//! SSE stream, or an ordinary HTTP request for the router — for the first
//! request of a connection (parsed here) and for later ones (parsed by hyper,
//! seen through [`RequestHead::from_http`]), by the one [`route`]. Invariant:
//! a head larger than [`MAX_HEAD_BYTES`] is refused, so a client cannot make
//! the server buffer without bound before routing.

/// Largest request head the front door reads.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Header names are lower-cased; values kept as sent (lossy UTF-8).
    pub headers: Vec<(String, String)>,
    /// Length of the head in the buffer; bytes after it belong to the body or
    /// to the next protocol (WebSocket frames sent early).
    pub len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed request head: {0}")]
    Malformed(String),
    #[error("request head larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
}

/// Parses a head from `buf`; `Ok(None)` means read more.
pub fn parse_head(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        // Exact: a whole head that arrived in one read is held to it too.
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => Err(HeadError::TooLarge),
        Ok(httparse::Status::Complete(len)) => {
            let target = req.path.unwrap_or("/");
            let (path, query) = match target.split_once('?') {
                Some((p, q)) => (p.to_string(), Some(q.to_string())),
                None => (target.to_string(), None),
            };
            Ok(Some(RequestHead {
                method: req.method.unwrap_or("").to_string(),
                path,
                query,
                headers: req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect(),
                len,
            }))
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooLarge),
        Err(e) => Err(HeadError::Malformed(e.to_string())),
    }
}

impl RequestHead {
    /// The head of a request hyper already parsed; `len` is 0 (its bytes
    /// are hyper's).
    pub fn from_http<B>(req: &http::Request<B>) -> RequestHead {
        RequestHead {
            method: req.method().as_str().to_string(),
            path: req.uri().path().to_string(),
            query: req.uri().query().map(str::to_string),
            headers: req
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            len: 0,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// True when a comma-separated header contains `token` (case-insensitive).
    pub fn header_has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// Query parameters, percent-decoded.
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        self.query
            .as_deref()
            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default()
    }

    /// True when the request carries a body the front door would have to read.
    pub fn has_body(&self) -> bool {
        self.header("content-length")
            .is_some_and(|v| v.trim() != "0")
            || self.header("transfer-encoding").is_some()
    }
}

/// Where the front door sends a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    WebSocket {
        tenant: String,
    },
    Sse {
        tenant: String,
    },
    /// Everything else goes to the HTTP router.
    Http,
}

pub fn route(head: &RequestHead) -> Route {
    if head.method != "GET" || head.has_body() {
        return Route::Http;
    }
    let Some(rest) = head.path.strip_prefix("/v1/t/") else {
        return Route::Http;
    };
    match rest.split_once('/') {
        Some((tenant, "ws")) if head.header_has_token("upgrade", "websocket") => Route::WebSocket {
            tenant: tenant.to_string(),
        },
        Some((tenant, "sse")) => Route::Sse {
            tenant: tenant.to_string(),
        },
        _ => Route::Http,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_routes() {
        let raw = b"GET /v1/t/acme/ws?token=x HTTP/1.1\r\nHost: a\r\nUpgrade: WebSocket\r\nConnection: keep-alive, Upgrade\r\n\r\n\x81";
        let h = parse_head(raw).unwrap().unwrap();
        assert_eq!(h.len, raw.len() - 1);
        assert_eq!(
            route(&h),
            Route::WebSocket {
                tenant: "acme".into()
            }
        );
        assert!(h.header_has_token("connection", "upgrade"));
        assert_eq!(
            h.query_pairs(),
            vec![("token".to_string(), "x".to_string())]
        );

        let sse = parse_head(b"GET /v1/t/acme/sse?ch=a&ch=b%2Ec HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            route(&sse),
            Route::Sse {
                tenant: "acme".into()
            }
        );
        assert_eq!(sse.query_pairs()[1].1, "b.c");

        let ws_no_upgrade = parse_head(b"GET /v1/t/acme/ws HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(route(&ws_no_upgrade), Route::Http);
        let via_hyper = http::Request::get("/v1/t/acme/sse?ch=a")
            .header("Last-Event-ID", "1:2")
            .body(())
            .unwrap();
        let h = RequestHead::from_http(&via_hyper);
        assert_eq!(
            route(&h),
            Route::Sse {
                tenant: "acme".into()
            }
        );
        assert_eq!(h.header("last-event-id"), Some("1:2"));
        assert_eq!(h.query.as_deref(), Some("ch=a"));
        let post = parse_head(b"POST /v1/t/acme/publish HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap()
            .unwrap();
        assert_eq!(route(&post), Route::Http);
    }

    #[test]
    fn partial_malformed_and_oversized() {
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nHost"), Ok(None));
        assert!(matches!(
            parse_head(b"\x00\x01 nonsense\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES));
        assert_eq!(parse_head(&big), Err(HeadError::TooLarge));
        // Whole, in one read: held to the cap too.
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(parse_head(&big), Err(HeadError::TooLarge));
    }
}
