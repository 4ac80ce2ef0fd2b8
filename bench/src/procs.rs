//! Processes the bench starts, and what it reads about them from /proc.
//!
//! Owns: [`ChildGuard`], which kills and reaps one child by its own handle on
//! every exit path (including errors, panics unwinding and the overall
//! deadline dropping the scenario future); [`TempDir`]; resident memory and
//! CPU time of a process. The bench never signals a process it did not start.

use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Clock ticks per second of `/proc/PID/stat` times (USER_HZ; 100 on Linux).
pub const TICKS_PER_SEC: f64 = 100.0;

/// Owns a child process; dropping it kills (SIGKILL) and reaps the child.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    /// SIGTERM and a short grace before SIGKILL (for process trees like nginx).
    terminate_first: bool,
}

impl ChildGuard {
    pub fn new(name: impl Into<String>, child: Child) -> ChildGuard {
        ChildGuard {
            name: name.into(),
            child: Some(child),
            terminate_first: false,
        }
    }

    /// A guard that asks the child to exit (SIGTERM) before killing it.
    pub fn terminating(name: impl Into<String>, child: Child) -> ChildGuard {
        ChildGuard {
            name: name.into(),
            child: Some(child),
            terminate_first: true,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// `Some(status)` when the child has already exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `grace` for the child to exit by itself, then kills it.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.terminate_first {
            terminate(child.id());
        }
        let until = Instant::now() + grace;
        while Instant::now() < until {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        kill_and_reap(&self.name, &mut child);
    }
}

fn kill_and_reap(name: &str, child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        if let Err(e) = child.kill() {
            eprintln!("bench: could not kill {name} (pid {}): {e}", child.id());
        }
    }
    let _ = child.wait();
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.terminate_first {
            self.stop(Duration::from_secs(3));
        } else if let Some(mut child) = self.child.take() {
            kill_and_reap(&self.name, &mut child);
        }
    }
}

/// A directory removed with everything in it when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> anyhow::Result<TempDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Finds `key:` in a /proc status text and returns its value in KiB.
pub fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// VmRSS and VmHWM (peak) of a process, in KiB.
pub fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let s = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    match (parse_status_kib(&s, "VmRSS"), parse_status_kib(&s, "VmHWM")) {
        (Some(rss), Some(hwm)) => Ok((rss, hwm)),
        _ => bail!("{path} has no VmRSS/VmHWM"),
    }
}

/// utime + stime from a `/proc/PID/stat` line, in clock ticks.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces; fields after it start at
    // `state` (field 3), so utime (14) and stime (15) are at 11 and 12.
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU time (user + system, all threads) of a process, in seconds.
pub fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let s = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = parse_stat_ticks(&s).with_context(|| format!("parsing {path}"))?;
    Ok(ticks as f64 / TICKS_PER_SEC)
}

/// Busy CPU time of the whole machine (user + nice + system + irq + softirq
/// of the `cpu` line) from a `/proc/stat` text, in ticks.
pub fn parse_machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    Some(f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)?)
}

/// Busy CPU seconds of the whole machine since boot; the difference over a
/// window, minus the bench's own processes, is what others used meanwhile.
pub fn machine_busy_secs() -> anyhow::Result<f64> {
    let s = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let ticks = parse_machine_busy_ticks(&s).context("parsing /proc/stat")?;
    Ok(ticks as f64 / TICKS_PER_SEC)
}

/// Last `n` lines of a text file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The kernel's slab memory (`Slab:` in /proc/meminfo), in KiB: socket
/// buffers' bookkeeping, TCP state and file structures live there.
pub fn slab_kib() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    parse_status_kib(&text, "Slab").context("no Slab line in /proc/meminfo")
}

/// Memory the kernel's TCP sockets hold (`TCP: … mem N` in
/// /proc/net/sockstat, in pages), in KiB.
pub fn tcp_mem_kib() -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string("/proc/net/sockstat").context("reading /proc/net/sockstat")?;
    parse_sockstat_tcp_pages(&text)
        .map(|pages| pages * 4)
        .context("no TCP mem in /proc/net/sockstat")
}

pub fn parse_sockstat_tcp_pages(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == "mem" {
            return it.next()?.parse().ok();
        }
    }
    None
}

/// Direct children of `pid`, from /proc (e.g. nginx's worker processes).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| parse_stat_ppid(&s))
                == Some(pid)
        })
        .collect()
}

/// The parent pid in a `/proc/PID/stat` line (field 4, after the command).
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Sends SIGTERM to a process this bench started (nginx shuts its workers
/// down on it; SIGKILL would orphan them).
pub fn terminate(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// A free TCP port on 127.0.0.1 (bound and released; the race is harmless here).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\therald\nVmHWM:\t  20480 kB\nVmRSS:\t   12345 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(12345));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(20480));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
        let stat = "4242 (tokio (rt) x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0";
        assert_eq!(parse_stat_ticks(stat), Some(300));
        assert_eq!(parse_stat_ppid(stat), Some(1));
        let sockstat = "sockets: used 9\nTCP: inuse 4004 orphan 0 tw 9 alloc 4004 mem 91964\nUDP: inuse 0 mem 0\n";
        assert_eq!(parse_sockstat_tcp_pages(sockstat), Some(91_964));
        // user nice system idle iowait irq softirq steal …
        let proc_stat = "cpu  100 2 30 999 7 4 5 6 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(
            parse_machine_busy_ticks(proc_stat),
            Some(100 + 2 + 30 + 4 + 5)
        );
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        let (rss, hwm) = memory_kib(pid).unwrap();
        assert!(rss > 0 && hwm >= rss);
        assert!(cpu_secs(pid).unwrap() >= 0.0);
    }

    #[test]
    fn guard_kills_its_child() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        drop(ChildGuard::new("sleep", child));
        // Reaped: the pid no longer has a /proc entry (or belongs to someone else).
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!stat.contains("(sleep)"), "{stat}");
    }
}
