//! The memory limit of the process's cgroup, where one is set: without
//! `--memory-budget-mib`, nine tenths of it is the memory budget, so a
//! container's limit is met by refusing new connections, not by the OOM killer.
//!
//! Owns: reading `/proc/self/cgroup` and the limit file of the memory
//! controller (v2 `memory.max`, v1 `memory.limit_in_bytes`). Invariant: "no
//! limit" (`max`, v1's page-rounded `i64::MAX`, an unreadable file) is `None`.

use std::path::{Path, PathBuf};

/// The memory limit of this process's cgroup, in bytes.
pub fn memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_limit_under(Path::new("/sys/fs/cgroup"), &own)
}

/// The default memory budget for a cgroup limit of `limit` bytes.
pub fn budget(limit: u64) -> u64 {
    limit / 10 * 9
}

/// [`memory_limit`] with the cgroup filesystem at `root` and `own` the
/// text of `/proc/self/cgroup`.
fn memory_limit_under(root: &Path, own: &str) -> Option<u64> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            // v2 (unified): the process's own group, then the namespace root.
            for base in [root.to_path_buf(), root.join("unified")] {
                candidates.push(base.join(path).join("memory.max"));
                candidates.push(base.join("memory.max"));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let base = root.join("memory");
            candidates.push(base.join(path).join("memory.limit_in_bytes"));
            candidates.push(base.join("memory.limit_in_bytes"));
        }
    }
    candidates
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|text| parse(&text))
}

fn parse(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    // v1 writes "no limit" as i64::MAX rounded down to a page.
    (n > 0 && n < 1 << 62).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_v2_limit_is_read_and_max_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let own = "0::/system.slice/herald.service\n";
        assert_eq!(memory_limit_under(dir.path(), own), None);
        write(
            dir.path(),
            "system.slice/herald.service/memory.max",
            "max\n",
        );
        assert_eq!(memory_limit_under(dir.path(), own), None);
        write(
            dir.path(),
            "system.slice/herald.service/memory.max",
            "1073741824\n",
        );
        assert_eq!(memory_limit_under(dir.path(), own), Some(1 << 30));
        assert_eq!(budget(1 << 30), (1 << 30) / 10 * 9);
    }

    #[test]
    fn a_v1_limit_is_read_and_unlimited_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let own = "9:pids:/\n4:memory:/docker/abc\n0::/\n";
        write(
            dir.path(),
            "memory/docker/abc/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        assert_eq!(memory_limit_under(dir.path(), own), None);
        write(
            dir.path(),
            "memory/docker/abc/memory.limit_in_bytes",
            "536870912\n",
        );
        assert_eq!(memory_limit_under(dir.path(), own), Some(512 << 20));
    }

    /// Inside a container's cgroup namespace the own path is `/`.
    #[test]
    fn a_namespaced_group_reads_the_root_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "memory.max", "268435456\n");
        assert_eq!(memory_limit_under(dir.path(), "0::/\n"), Some(256 << 20));
    }
}
