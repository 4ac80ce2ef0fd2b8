//! The receive window a TCP peer advertises, read from the kernel
//! (`getsockopt(TCP_INFO)`, `tcpi_snd_wnd`): how much more the peer's
//! receive buffer will take. A client that reads keeps it near its largest;
//! one that stopped reading lets it shrink towards zero as its buffer fills,
//! long before our own send buffer is full. The writer uses it to see a
//! reader falling behind early (`session/writer.rs`, lagging readers).
//!
//! Why `unsafe` is allowed here, and only here: neither std, tokio nor
//! socket2 reads TCP_INFO. The call writes at most `len` bytes into a
//! zeroed, plain-data `libc::tcp_info` owned by this function, `len` is its
//! size, and the field is read only when the kernel says it filled that far.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;

/// The peer's advertised receive window in bytes, or `None` when the kernel
/// does not say (not a TCP socket, a kernel older than 5.4).
pub fn peer_window(sock: &impl AsRawFd) -> Option<u32> {
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a live, writable `tcp_info` of `len` bytes; the
    // kernel writes at most `len` bytes and sets `len` to what it wrote.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_snd_wnd) + std::mem::size_of::<u32>();
    (r == 0 && len as usize >= end).then_some(info.tcpi_snd_wnd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    /// Writes 1 KiB at a time (up to 512 KiB, or until the socket is full)
    /// and returns the narrowest window seen against the first one.
    fn narrowest(server: &mut std::net::TcpStream) -> (u32, u32) {
        server.set_nonblocking(true).unwrap();
        let first = peer_window(server).expect("TCP_INFO on a TCP socket");
        let mut least = first;
        for _ in 0..512 {
            match server.write(&[0u8; 1024]) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
            least = least.min(peer_window(server).unwrap());
        }
        eprintln!("window: first {first} B, narrowest {least} B");
        (first, least)
    }

    /// A peer that stops reading shows it in its window before our send
    /// buffer is full; one that reads keeps its window open.
    #[test]
    fn a_peer_that_stops_reading_shrinks_its_window() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stalled = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let (first, least) = narrowest(&mut server);
        assert!(first >= 16 * 1024, "a fresh peer's window is {first} B");
        assert!(
            least < first / 4 * 3,
            "a stalled peer's window went from {first} B only down to {least} B"
        );
        drop(stalled);

        let mut reader = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while reader.read(&mut buf).is_ok_and(|n| n > 0) {}
        });
        let (first, least) = narrowest(&mut server);
        assert!(
            least >= first / 4 * 3,
            "a reading peer's window went from {first} B down to {least} B"
        );
        drop(server);
        t.join().unwrap();

        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(peer_window(&file), None);
    }
}
