//! A minimal HTTP/1.1 client for the control calls: readiness, admin,
//! publish and metrics.
//!
//! Owns: one keep-alive connection, requests with a `Content-Length` body,
//! responses with a `Content-Length` body or read to close. Kept tiny so the
//! publisher's CPU (counted as load-generator CPU) stays small and visible.

use anyhow::{bail, Context as _};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest a control request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("response is not JSON: {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body)
            .chars()
            .take(500)
            .collect()
    }
}

/// One keep-alive connection; reconnects once when the server closed it.
pub struct HttpConn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl HttpConn {
    pub fn new(addr: SocketAddr) -> HttpConn {
        HttpConn {
            addr,
            stream: None,
            buf: Vec::with_capacity(4096),
        }
    }

    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        bearer: Option<&str>,
        body: &[u8],
    ) -> anyhow::Result<Response> {
        // `Accept` makes nchan answer a publish with JSON (Herald answers JSON anyway).
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n",
            self.addr
        );
        if let Some(t) = bearer {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut req = head.into_bytes();
        req.extend_from_slice(body);
        let reused = self.stream.is_some();
        match tokio::time::timeout(REQUEST_TIMEOUT, self.roundtrip(&req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) if reused => {
                // A keep-alive connection the server had closed: one fresh try.
                self.stream = None;
                tokio::time::timeout(REQUEST_TIMEOUT, self.roundtrip(&req))
                    .await
                    .map_err(|_| anyhow::anyhow!("{method} {path}: timed out"))?
            }
            Ok(Err(e)) => Err(e.context(format!("{method} {path}"))),
            Err(_) => {
                self.stream = None;
                bail!("{method} {path}: timed out after {REQUEST_TIMEOUT:?}")
            }
        }
    }

    async fn roundtrip(&mut self, req: &[u8]) -> anyhow::Result<Response> {
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr)
                .await
                .with_context(|| format!("connecting to {}", self.addr))?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
            self.buf.clear();
        }
        let stream = self.stream.as_mut().expect("set above");
        stream.write_all(req).await?;
        let r = read_response(stream, &mut self.buf).await;
        match &r {
            Ok((_, close)) if *close => self.stream = None,
            Err(_) => self.stream = None,
            _ => {}
        }
        r.map(|(resp, _)| resp)
    }
}

/// Reads one response; returns it and whether the connection must close.
async fn read_response(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> anyhow::Result<(Response, bool)> {
    loop {
        let parsed = parse_head(buf)?;
        if let Some(h) = parsed {
            let mut body_end = None;
            if let Some(len) = h.content_length {
                body_end = Some(h.head_len + len);
            } else if h.chunked {
                bail!("chunked responses are not supported by the bench client");
            }
            loop {
                match body_end {
                    Some(end) if buf.len() >= end => {
                        let body = buf[h.head_len..end].to_vec();
                        buf.drain(..end);
                        return Ok((
                            Response {
                                status: h.status,
                                body,
                            },
                            h.close,
                        ));
                    }
                    _ => {}
                }
                let n = stream.read_buf(buf).await?;
                if n == 0 {
                    if body_end.is_none() {
                        let body = buf[h.head_len..].to_vec();
                        buf.clear();
                        return Ok((
                            Response {
                                status: h.status,
                                body,
                            },
                            true,
                        ));
                    }
                    bail!("connection closed in the middle of a response body");
                }
            }
        }
        let n = stream.read_buf(buf).await?;
        if n == 0 {
            bail!("connection closed before a response arrived");
        }
    }
}

/// The parts of a response head the client needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub head_len: usize,
    pub content_length: Option<usize>,
    pub chunked: bool,
    pub close: bool,
}

/// Parses a response head at the start of `buf`; `None` when incomplete.
pub fn parse_head(buf: &[u8]) -> anyhow::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let head_len = match r.parse(buf).context("malformed HTTP response")? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let mut h = Head {
        status: r.code.unwrap_or(0),
        head_len,
        content_length: None,
        chunked: false,
        close: false,
    };
    for hd in r.headers.iter() {
        let v = std::str::from_utf8(hd.value).unwrap_or("").trim();
        if hd.name.eq_ignore_ascii_case("content-length") {
            h.content_length = v.parse().ok();
        } else if hd.name.eq_ignore_ascii_case("transfer-encoding") {
            h.chunked = v.to_ascii_lowercase().contains("chunked");
        } else if hd.name.eq_ignore_ascii_case("connection") {
            h.close = v.eq_ignore_ascii_case("close");
        }
    }
    Ok(Some(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_response_heads() {
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le").unwrap(), None);
        let h = parse_head(b"HTTP/1.1 201 Created\r\ncontent-length: 12\r\n\r\n{\"a\":1}")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.content_length, h.close),
            (201, Some(12), false)
        );
        assert_eq!(h.head_len, 44);
        let h = parse_head(
            b"HTTP/1.1 503 Busy\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(h.close && h.chunked);
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }
}
