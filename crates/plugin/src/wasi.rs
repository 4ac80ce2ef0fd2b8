//! The WASI a plugin sees: stdout and stderr captured, clocks frozen,
//! randomness fixed, streams that never block, and no sockets.
//!
//! Owns: the guest's output buffer of one call, the deterministic clocks
//! and random source, and the synchronous `wasi:io` implementation the
//! linker uses instead of wasmtime-wasi's. Invariants: nothing a guest
//! writes reaches the host's stdout or grows past [`OUTPUT_KEEP`] bytes; no
//! WASI call enters a tokio runtime (wasmtime-wasi's synchronous bindings
//! `block_on` one for every blocking stream call and every poll, which
//! panics on a runtime worker, where inline calls run); a hook sees the same
//! clock and random bytes in every instance, so its output cannot differ
//! between nodes or between a first read and a re-read.

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};
use wasmtime_wasi::p2::bindings::sockets::network::{self, ErrorCode, IpAddressFamily};
use wasmtime_wasi::p2::bindings::sockets::tcp_create_socket;
use wasmtime_wasi::p2::bindings::sync::io::{poll, streams};
use wasmtime_wasi::p2::bindings::sync::sockets::udp_create_socket;
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, DynPollable, SocketError, SocketResult, StreamError,
    StreamResult, TcpSocket, UdpSocket,
};

/// Bytes of a call's output kept: the last ones, where a traceback or a
/// panic message ends.
pub const OUTPUT_KEEP: usize = 4096;

/// What a guest wrote to stdout and stderr during the current call: the
/// last [`OUTPUT_KEEP`] bytes of both, interleaved as a terminal shows them.
#[derive(Debug, Default)]
struct Tail {
    buf: Vec<u8>,
    /// Bytes written in the call, kept or not.
    written: u64,
}

/// One call's guest output, shared by the instance's stdout and stderr.
#[derive(Debug, Clone, Default)]
pub struct Capture(Arc<Mutex<Tail>>);

impl Capture {
    fn push(&self, bytes: &[u8]) {
        let mut t = self.0.lock();
        t.written += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(OUTPUT_KEEP)..];
        let over = (t.buf.len() + bytes.len()).saturating_sub(OUTPUT_KEEP);
        if over > 0 {
            t.buf.drain(..over);
        }
        t.buf.extend_from_slice(bytes);
    }

    /// Forgets the previous call's output.
    pub fn clear(&self) {
        let mut t = self.0.lock();
        t.buf.clear();
        t.written = 0;
    }

    /// The output kept, as text (invalid UTF-8 replaced), without trailing
    /// blank lines; "" when the call wrote nothing. Output cut at the front
    /// says how much was left out.
    pub fn text(&self) -> String {
        let t = self.0.lock();
        let kept = String::from_utf8_lossy(&t.buf);
        let kept = kept.trim_end();
        let dropped = t.written - t.buf.len() as u64;
        if dropped == 0 {
            return kept.to_string();
        }
        // Start at a line boundary when one is near.
        let kept = match kept.find('\n') {
            Some(i) if i < 256 => &kept[i + 1..],
            _ => kept,
        };
        format!("[{dropped} earlier bytes not kept]\n{kept}")
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for Capture {
    async fn ready(&mut self) {}
}

#[async_trait::async_trait]
impl wasmtime_wasi::p2::OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// `wasi:clocks/wall-clock` and `monotonic-clock`, frozen at 0.
pub struct Frozen;

impl HostWallClock for Frozen {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for Frozen {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        0
    }
}

/// `wasi:random`: the same sequence in every instance (SplitMix64 from a
/// fixed seed). Not secret, not unpredictable: the WIT says plugins get no
/// randomness, and a guest runtime that seeds its hash tables from it
/// still starts.
pub struct Fixed(u64);

impl Default for Fixed {
    fn default() -> Fixed {
        Fixed(0x4845_5241_4c44_2e31)
    }
}

impl rand_core::TryRng for Fixed {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.try_next_u64()? as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

/// `wasi:io/streams` and `wasi:io/poll` over the store's resource table,
/// without a runtime. A plugin's only streams are its captured stdout and
/// stderr (always ready) and an empty stdin (closed), so a blocking call
/// is its non-blocking one, and every pollable is ready: a sleep returns
/// at once, like the frozen clock says it should.
pub struct SyncIo<'a>(pub &'a mut ResourceTable);

pub struct HasSyncIo;

impl HasData for HasSyncIo {
    type Data<'a> = SyncIo<'a>;
}

/// Replaces wasmtime-wasi's `wasi:io/streams` and `wasi:io/poll` in a
/// linker that already has them (`add_to_linker_sync`).
pub fn add_sync_io<T: 'static>(
    linker: &mut Linker<T>,
    getter: fn(&mut T) -> SyncIo<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    streams::add_to_linker::<T, HasSyncIo>(linker, getter)?;
    poll::add_to_linker::<T, HasSyncIo>(linker, getter)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// `wasi:sockets`' two constructors, denying at once. The sandbox allows no
/// socket (no TCP, no UDP, no name lookups), but wasmtime-wasi's
/// synchronous `create-udp-socket` `block_on`s its runtime first, which
/// panics on a runtime worker (a guest's `UdpSocket::bind` did), and
/// `create-tcp-socket` hands out a socket whose `start-bind` does the same.
/// Without a socket no other `wasi:sockets` call has anything to act on.
pub struct NoSockets<'a>(pub &'a mut ResourceTable);

pub struct HasNoSockets;

impl HasData for HasNoSockets {
    type Data<'a> = NoSockets<'a>;
}

/// Replaces wasmtime-wasi's socket constructors in a linker that already
/// has them (`add_to_linker_sync`).
pub fn deny_sockets<T: 'static>(
    linker: &mut Linker<T>,
    getter: fn(&mut T) -> NoSockets<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    tcp_create_socket::add_to_linker::<T, HasNoSockets>(linker, getter)?;
    udp_create_socket::add_to_linker::<T, HasNoSockets>(linker, getter)?;
    linker.allow_shadowing(false);
    Ok(())
}

impl network::Host for NoSockets<'_> {
    fn convert_error_code(&mut self, error: SocketError) -> wasmtime::Result<ErrorCode> {
        error.downcast()
    }

    fn network_error_code(
        &mut self,
        err: Resource<network::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        let err = self.0.get(&err)?;
        Ok(err.downcast_ref::<std::io::Error>().map(ErrorCode::from))
    }
}

impl network::HostNetwork for NoSockets<'_> {
    fn drop(&mut self, this: Resource<network::Network>) -> wasmtime::Result<()> {
        self.0.delete(this)?;
        Ok(())
    }
}

impl tcp_create_socket::Host for NoSockets<'_> {
    fn create_tcp_socket(&mut self, _: IpAddressFamily) -> SocketResult<Resource<TcpSocket>> {
        Err(ErrorCode::AccessDenied.into())
    }
}

impl udp_create_socket::Host for NoSockets<'_> {
    fn create_udp_socket(&mut self, _: IpAddressFamily) -> SocketResult<Resource<UdpSocket>> {
        Err(ErrorCode::AccessDenied.into())
    }
}

impl streams::Host for SyncIo<'_> {
    fn convert_stream_error(&mut self, err: StreamError) -> wasmtime::Result<streams::StreamError> {
        match err {
            StreamError::Closed => Ok(streams::StreamError::Closed),
            StreamError::LastOperationFailed(e) => {
                Ok(streams::StreamError::LastOperationFailed(self.0.push(e)?))
            }
            StreamError::Trap(e) => Err(e),
        }
    }
}

impl SyncIo<'_> {
    fn out(&mut self, s: &Resource<DynOutputStream>) -> StreamResult<&mut DynOutputStream> {
        Ok(self.0.get_mut(s)?)
    }

    fn input(&mut self, s: &Resource<DynInputStream>) -> StreamResult<&mut DynInputStream> {
        Ok(self.0.get_mut(s)?)
    }
}

impl streams::HostOutputStream for SyncIo<'_> {
    fn drop(&mut self, stream: Resource<DynOutputStream>) -> wasmtime::Result<()> {
        self.0.delete(stream)?;
        Ok(())
    }

    fn check_write(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<u64> {
        Ok(self.out(&stream)?.check_write()? as u64)
    }

    fn write(&mut self, stream: Resource<DynOutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
        self.out(&stream)?.write(bytes.into())
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        if bytes.len() > 4096 {
            return Err(StreamError::trap(
                "Buffer too large for blocking-write-and-flush (expected at most 4096)",
            ));
        }
        let s = self.out(&stream)?;
        s.write(bytes.into())?;
        s.flush()
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        if len > 4096 {
            return Err(StreamError::trap(
                "Buffer too large for blocking-write-zeroes-and-flush (expected at most 4096)",
            ));
        }
        let s = self.out(&stream)?;
        s.write_zeroes(len as usize)?;
        s.flush()
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(self.0, stream)
    }

    fn write_zeroes(&mut self, stream: Resource<DynOutputStream>, len: u64) -> StreamResult<()> {
        self.out(&stream)?.write_zeroes(len as usize)
    }

    fn flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        self.out(&stream)?.flush()
    }

    fn blocking_flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        self.out(&stream)?.flush()
    }

    fn splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        let permit = self.out(&dst)?.check_write()?;
        let len = len.min(permit as u64) as usize;
        let bytes = self.input(&src)?.read(len)?;
        let n = bytes.len() as u64;
        self.out(&dst)?.write(bytes)?;
        Ok(n)
    }

    fn blocking_splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        self.splice(dst, src, len)
    }
}

impl streams::HostInputStream for SyncIo<'_> {
    fn drop(&mut self, stream: Resource<DynInputStream>) -> wasmtime::Result<()> {
        self.0.delete(stream)?;
        Ok(())
    }

    fn read(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<Vec<u8>> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        Ok(self.input(&stream)?.read(len)?.into())
    }

    fn blocking_read(
        &mut self,
        stream: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<Vec<u8>> {
        self.read(stream, len)
    }

    fn skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        Ok(self.read(stream, len)?.len() as u64)
    }

    fn blocking_skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        self.skip(stream, len)
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynInputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(self.0, stream)
    }
}

impl poll::Host for SyncIo<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        if pollables.is_empty() {
            return Err(wasmtime::format_err!("empty poll list"));
        }
        for p in &pollables {
            self.0.get(p)?;
        }
        Ok((0..pollables.len() as u32).collect())
    }
}

impl poll::HostPollable for SyncIo<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        self.0.get(&pollable)?;
        Ok(true)
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        self.0.get(&pollable)?;
        Ok(())
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        <ResourceTable as poll::HostPollable>::drop(self.0, pollable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capture_keeps_the_last_bytes() {
        let c = Capture::default();
        c.push(b"first line\n");
        assert_eq!(c.text(), "first line");
        c.push(&vec![b'x'; OUTPUT_KEEP]);
        c.push(b"\nthe end\n");
        let t = c.text();
        assert!(t.starts_with("[20 earlier bytes not kept]\n"), "{t}");
        assert!(t.ends_with("the end"), "{t}");
        c.clear();
        assert_eq!(c.text(), "");
    }

    #[test]
    fn the_random_source_is_the_same_everywhere() {
        use rand_core::TryRng;
        let (mut a, mut b) = (Fixed::default(), Fixed::default());
        let (mut x, mut y) = ([0u8; 13], [0u8; 13]);
        a.try_fill_bytes(&mut x).unwrap();
        b.try_fill_bytes(&mut y).unwrap();
        assert_eq!(x, y);
        assert_ne!(x, [0u8; 13]);
    }
}
