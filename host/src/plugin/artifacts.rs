//! Compiled plugin components kept on disk, so a restart loads them
//! instead of compiling again (an 18 MB Python component takes 11-14 s).
//!
//! Owns: the artifact files under the data dir, one per component sha256.
//! Invariants: an artifact is only ever loaded for the component bytes it
//! was compiled from (named by their sha256) and only whole (its own sha256
//! is checked before wasmtime sees it); a file that fails either check, or
//! that wasmtime refuses (another version or configuration), is removed and
//! the component compiled again; a file is written under a temporary name
//! and renamed, so a crash leaves no half-written artifact; the temporary
//! file is made new (never opened through a link left at its name) and
//! readable by its user alone; the directory is its user's alone (made
//! 0700; one owned by another user, or writable by others, is refused).
//!
//! Why `unsafe` is allowed here, and only here: `Component::deserialize`
//! runs the native code in the bytes it is given, so wasmtime makes the
//! caller promise they came from `Component::serialize`. This module makes
//! that promise true as far as a process can: it reads only files it wrote
//! itself, in a directory beside the registry's own data (whoever can write
//! there can already change what the registry says to run), checked whole.
#![allow(unsafe_code)]

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

/// The header of a compiled artifact on disk: magic, then the sha256 of
/// the rest (so a torn or altered file is compiled again, never loaded).
const MAGIC: &[u8; 8] = b"HERALDC1";

fn path(dir: &Path, digest: &[u8; 32]) -> PathBuf {
    dir.join(format!("{}.cwasm", crate::app::hex(digest)))
}

/// The compiled artifact of `digest` from `dir`, if it is there, whole,
/// and from this engine. Anything else is removed.
pub fn load(engine: &Engine, dir: Option<&Path>, digest: &[u8; 32]) -> Option<Component> {
    let path = path(dir?, digest);
    let bytes = std::fs::read(&path).ok()?;
    let body = bytes
        .strip_prefix(&MAGIC[..])
        .and_then(|b| b.split_at_checked(32))
        .filter(|(sum, body)| Sha256::digest(body).as_slice() == *sum)
        .map(|(_, body)| body);
    // SAFETY: see the module's head: bytes this module wrote from
    // `Component::serialize` of the very component named `digest`, checked
    // whole; wasmtime itself refuses another engine's artifacts.
    let loaded = body.map(|b| unsafe { Component::deserialize(engine, b) });
    match loaded {
        Some(Ok(c)) => Some(c),
        other => {
            let why = match other {
                Some(Err(e)) => format!("{e:#}"),
                _ => "torn or altered".into(),
            };
            tracing::info!(path = %path.display(), why, "compiled plugin artifact not usable; compiling again");
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// Makes `dir` (0700, with any missing parents) or checks the one there:
/// it must belong to this process's user and be writable by no one else,
/// for whoever can write there chooses the native code this process runs.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    let md = std::fs::metadata(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    // The process's user, as the kernel shows it (no unsafe call needed).
    if let Ok(me) = std::fs::metadata("/proc/self").map(|m| m.uid()) {
        if md.uid() != me {
            anyhow::bail!(
                "{}: owned by user {}, not this process's user {me}: compiled plugins are kept only in a directory of the user's own",
                dir.display(),
                md.uid()
            );
        }
    }
    if md.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{}: writable by group or others (mode {:o}): compiled plugins are kept only in a directory no one else can write",
            dir.display(),
            md.mode() & 0o777
        );
    }
    Ok(())
}

/// Writes the artifact of `component` (compiled from `digest`'s bytes) for
/// the next start. A failure is logged; the next start compiles again.
pub fn store(dir: Option<&Path>, digest: &[u8; 32], component: &Component) {
    let Some(dir) = dir else {
        return;
    };
    let path = path(dir, digest);
    let body = match component.serialize() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "compiled plugin not serializable; not kept on disk");
            return;
        }
    };
    let mut file = Vec::with_capacity(MAGIC.len() + 32 + body.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&Sha256::digest(&body));
    file.extend_from_slice(&body);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    // A file left at the name (a crash, or a link someone planted) goes;
    // removing a link never follows it, and the new file is made new.
    let _ = std::fs::remove_file(&tmp);
    let written = {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&file))
            .and_then(|()| std::fs::rename(&tmp, &path))
    };
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!(path = %path.display(), error = %e, "compiled plugin not kept on disk; the next start compiles it again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_or_foreign_artifact_is_compiled_again_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let digest = [7u8; 32];
        // Not there.
        assert!(load(&engine, Some(dir.path()), &digest).is_none());
        // Torn: the header's sum does not match the body.
        let p = path(dir.path(), &digest);
        let mut torn = MAGIC.to_vec();
        torn.extend_from_slice(&[0u8; 32]);
        torn.extend_from_slice(b"half an artifact");
        std::fs::write(&p, &torn).unwrap();
        assert!(load(&engine, Some(dir.path()), &digest).is_none());
        assert!(!p.exists(), "a bad artifact is removed");
        // Whole but not wasmtime's: refused by wasmtime, removed.
        let mut foreign = MAGIC.to_vec();
        foreign.extend_from_slice(&Sha256::digest(b"not an artifact"));
        foreign.extend_from_slice(b"not an artifact");
        std::fs::write(&p, &foreign).unwrap();
        assert!(load(&engine, Some(dir.path()), &digest).is_none());
        assert!(!p.exists());
    }

    /// Issue 19: a cache another local user can write to could be given
    /// native code to load: such a directory is refused, not used.
    #[test]
    fn a_cache_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = crate::plugin::Runtime::with_artifacts(Some(shared.clone()))
            .err()
            .expect("refused");
        assert!(format!("{e:#}").contains("writable by"), "{e:#}");
        // One it makes itself is its user's alone.
        let own = dir.path().join("a/b/compiled");
        crate::plugin::Runtime::with_artifacts(Some(own.clone())).unwrap();
        let mode = std::fs::metadata(&own).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    }

    /// The temporary file an artifact is written to is made new, never
    /// opened through a link someone left at its name.
    #[test]
    fn an_artifact_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let digest = [9u8; 32];
        let tmp = path(dir.path(), &digest).with_extension(format!("tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let engine = Engine::default();
        // The empty component, in binary: magic, version 0x0d, layer 1.
        let component = Component::new(&engine, b"\0asm\x0d\x00\x01\x00").unwrap();
        store(Some(dir.path()), &digest, &component);
        assert!(
            std::fs::read(&victim).unwrap() == b"precious",
            "written through the link"
        );
        assert!(
            load(&engine, Some(dir.path()), &digest).is_some(),
            "stored all the same"
        );
    }
}
