//! The TCP stream hyper serves: it first yields bytes the front door already
//! read, and can be told to discard what hyper writes.
//!
//! Owns: handing a connection to the HTTP router after its head was peeked,
//! and giving the socket back intact when a later request becomes a session.
//! Invariants: the prefix is returned exactly once, before any socket byte;
//! once `discard` is set nothing hyper writes reaches the socket (the session
//! that takes the socket over writes its own response head).

use bytes::{Buf, Bytes};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub struct Prefixed {
    prefix: Bytes,
    inner: TcpStream,
    discard: Arc<AtomicBool>,
}

impl Prefixed {
    pub fn new(prefix: Bytes, inner: TcpStream, discard: Arc<AtomicBool>) -> Prefixed {
        Prefixed {
            prefix,
            inner,
            discard,
        }
    }

    /// The socket and the part of the prefix not yet read.
    pub fn into_parts(self) -> (Bytes, TcpStream) {
        (self.prefix, self.inner)
    }

    fn discarding(&self) -> bool {
        self.discard.load(Ordering::Acquire)
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.discarding() {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.discarding() {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        // `sendmsg`, not the `writev` tokio would make: a response's head
        // and body (two slices) skip the file layer, as frames do
        // (session/writer.rs).
        let sock = socket2::SockRef::from(&self.inner);
        loop {
            std::task::ready!(self.inner.poll_write_ready(cx))?;
            match self
                .inner
                .try_io(tokio::io::Interest::WRITABLE, || sock.send_vectored(bufs))
            {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.discarding() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.discarding() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
