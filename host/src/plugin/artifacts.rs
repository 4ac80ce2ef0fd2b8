//! Compiled plugin components kept on disk, so a restart loads them
//! instead of compiling again (an 18 MB Python component takes 11-14 s).
//!
//! Owns: the artifact files under the data dir, one per component sha256.
//! Invariants: an artifact is only ever loaded for the component bytes it
//! was compiled from (named by their sha256) and only whole (its own sha256
//! is checked before wasmtime sees it); a file that fails either check, or
//! that wasmtime refuses (another version or configuration), is removed and
//! the component compiled again; a file is written under a temporary name
//! and renamed, so a crash leaves no half-written artifact.
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
    let written = std::fs::write(&tmp, &file).and_then(|()| std::fs::rename(&tmp, &path));
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
}
