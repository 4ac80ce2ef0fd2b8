//! Compiled plugin components kept on disk, so a restart loads them
//! instead of compiling again (an 18 MB Python component takes 11-14 s).
//!
//! Owns: the artifact files under the data dir, one per component sha256.
//! Invariants: an artifact is only ever loaded for the component bytes it
//! was compiled from (named by their sha256), only whole and only if this
//! cache wrote it: an HMAC-SHA256 of the component's sha256 and the body,
//! under a key kept outside the cache (`<dir>.key`, made 0600 on first use;
//! one another user owns or can read is refused), is checked before
//! wasmtime sees it; a file that fails either check, or
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
//! itself (their MAC is under a key only this user can read), in a
//! directory of this user's alone, checked whole.
#![allow(unsafe_code)]

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

/// The header of a compiled artifact on disk: magic, then the HMAC of the
/// component's sha256 and the rest (so a torn, altered or planted file is
/// compiled again, never loaded).
const MAGIC: &[u8; 8] = b"HERALDC2";

/// A directory of compiled artifacts and the key they are written under.
pub struct Cache {
    dir: PathBuf,
    key: [u8; 32],
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("dir", &self.dir).finish()
    }
}

fn path(dir: &Path, digest: &[u8; 32]) -> PathBuf {
    dir.join(format!("{}.cwasm", herald_base::secret::hex(digest)))
}

impl Cache {
    /// Opens (or makes) the cache at `dir`, private to this user, and its
    /// key beside it (`<dir>.key`).
    pub fn open(dir: PathBuf) -> anyhow::Result<Cache> {
        private_dir(&dir)?;
        let key = key(&dir.with_extension("key"))?;
        Ok(Cache { dir, key })
    }

    fn mac(&self, digest: &[u8; 32], body: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        m.update(digest);
        m.update(body);
        m
    }

    /// The compiled artifact of `digest`, if it is there, whole, written
    /// under this cache's key and from this engine. Anything else is removed.
    pub fn load(&self, engine: &Engine, digest: &[u8; 32]) -> Option<Component> {
        let path = path(&self.dir, digest);
        let bytes = std::fs::read(&path).ok()?;
        let body = bytes
            .strip_prefix(&MAGIC[..])
            .and_then(|b| b.split_at_checked(32))
            .filter(|(tag, body)| self.mac(digest, body).verify_slice(tag).is_ok())
            .map(|(_, body)| body);
        // SAFETY: see the module's head: bytes this cache wrote from
        // `Component::serialize` of the very component named `digest`, checked
        // whole under its key; wasmtime itself refuses another engine's artifacts.
        let loaded = body.map(|b| unsafe { Component::deserialize(engine, b) });
        match loaded {
            Some(Ok(c)) => Some(c),
            other => {
                let why = match other {
                    Some(Err(e)) => format!("{e:#}"),
                    _ => "torn, altered or not written under this cache's key".into(),
                };
                tracing::info!(path = %path.display(), why, "compiled plugin artifact not usable; compiling again");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Writes the artifact of `component` (compiled from `digest`'s bytes)
    /// for the next start. A failure is logged; the next start compiles again.
    pub fn store(&self, digest: &[u8; 32], component: &Component) {
        let path = path(&self.dir, digest);
        let body = match component.serialize() {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "compiled plugin not serializable; not kept on disk");
                return;
            }
        };
        let mut file = Vec::with_capacity(MAGIC.len() + 32 + body.len());
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&self.mac(digest, &body).finalize().into_bytes());
        file.extend_from_slice(&body);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        // A file left at the name (a crash, or a link someone planted) goes;
        // removing a link never follows it, and the new file is made new.
        let _ = std::fs::remove_file(&tmp);
        let written = create_new(&tmp, &file).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(path = %path.display(), error = %e, "compiled plugin not kept on disk; the next start compiles it again");
        }
    }
}

/// Writes `bytes` to a file that did not exist (never through a link),
/// readable by this user alone.
fn create_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
}

/// This process's user, as the kernel shows it (no unsafe call needed).
fn my_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).ok()
}

/// The cache's key: read from `path` (a regular file of this user's that
/// no one else can read or write, not a link), or made there.
fn key(path: &Path) -> anyhow::Result<[u8; 32]> {
    use std::os::unix::fs::MetadataExt;
    let md = match std::fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key: [u8; 32] = rand::random();
            match create_new(path, herald_base::secret::hex(&key).as_bytes()) {
                Ok(()) => return Ok(key),
                // Another process made it first: read theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::symlink_metadata(path)?
                }
                Err(e) => anyhow::bail!("creating the artifact key {}: {e}", path.display()),
            }
        }
        Err(e) => anyhow::bail!("{}: {e}", path.display()),
    };
    if !md.file_type().is_file() {
        anyhow::bail!(
            "{}: not a regular file: the key of compiled plugins is kept only in a file of the user's own",
            path.display()
        );
    }
    if my_uid().is_some_and(|me| md.uid() != me) || md.mode() & 0o077 != 0 {
        anyhow::bail!(
            "{}: owned by user {} with mode {:o}: the key of compiled plugins must be this user's and readable by no one else (0600)",
            path.display(),
            md.uid(),
            md.mode() & 0o777
        );
    }
    let text = std::fs::read_to_string(path)?;
    herald_base::secret::digest_from_hex(text.trim())
        .ok_or_else(|| anyhow::anyhow!("{}: not an artifact key (64 hex digits)", path.display()))
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
    if let Some(me) = my_uid() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    #[test]
    fn a_torn_or_foreign_artifact_is_compiled_again_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path().join("compiled")).unwrap();
        let engine = Engine::default();
        let digest = [7u8; 32];
        // Not there.
        assert!(cache.load(&engine, &digest).is_none());
        // Torn: the header's sum does not match the body.
        let p = path(&cache.dir, &digest);
        let mut torn = MAGIC.to_vec();
        torn.extend_from_slice(&[0u8; 32]);
        torn.extend_from_slice(b"half an artifact");
        std::fs::write(&p, &torn).unwrap();
        assert!(cache.load(&engine, &digest).is_none());
        assert!(!p.exists(), "a bad artifact is removed");
        // Whole but not wasmtime's: refused by wasmtime, removed.
        let mut foreign = MAGIC.to_vec();
        foreign.extend_from_slice(
            &cache
                .mac(&digest, b"not an artifact")
                .finalize()
                .into_bytes(),
        );
        foreign.extend_from_slice(b"not an artifact");
        std::fs::write(&p, &foreign).unwrap();
        assert!(cache.load(&engine, &digest).is_none());
        assert!(!p.exists());
    }

    /// A cache another local user can write to could be given
    /// native code to load: such a directory is refused, not used.
    #[test]
    fn a_cache_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = crate::Runtime::with_artifacts(Some(shared.clone()))
            .err()
            .expect("refused");
        assert!(format!("{e:#}").contains("writable by"), "{e:#}");
        // One it makes itself is its user's alone.
        let own = dir.path().join("a/b/compiled");
        crate::Runtime::with_artifacts(Some(own.clone())).unwrap();
        let mode = std::fs::metadata(&own).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    }

    /// Whoever can put a file in the cache must not choose the
    /// native code Herald runs. An artifact whole by its own checksum but
    /// not written under this cache's key (here: copied from another cache,
    /// as an attacker would plant one made elsewhere) is compiled over,
    /// never loaded.
    #[test]
    fn an_artifact_not_written_under_this_caches_key_is_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a/compiled"), dir.path().join("b/compiled"));
        let bytes = b"\0asm\x0d\x00\x01\x00";
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let ra = crate::Runtime::with_artifacts(Some(a.clone())).unwrap();
        ra.compile(bytes).unwrap();
        let planted = std::fs::read(path(&a, &digest)).unwrap();
        let rb = crate::Runtime::with_artifacts(Some(b.clone())).unwrap();
        std::fs::write(path(&b, &digest), &planted).unwrap();
        rb.compile(bytes).unwrap();
        assert_ne!(
            std::fs::read(path(&b, &digest)).unwrap(),
            planted,
            "an artifact made elsewhere was loaded"
        );
    }

    /// The key is this user's alone: one others can read is refused, and a
    /// second cache at the same place reads the key the first one made.
    #[test]
    fn the_key_is_private_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("compiled");
        let a = Cache::open(at.clone()).unwrap();
        assert_eq!(Cache::open(at.clone()).unwrap().key, a.key);
        let key = at.with_extension("key");
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Cache::open(at).expect_err("refused");
        assert!(
            format!("{e:#}").contains("readable by no one else"),
            "{e:#}"
        );
    }

    /// The temporary file an artifact is written to is made new, never
    /// opened through a link someone left at its name.
    #[test]
    fn an_artifact_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path().join("compiled")).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let digest = [9u8; 32];
        let tmp = path(&cache.dir, &digest).with_extension(format!("tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let engine = Engine::default();
        // The empty component, in binary: magic, version 0x0d, layer 1.
        let component = Component::new(&engine, b"\0asm\x0d\x00\x01\x00").unwrap();
        cache.store(&digest, &component);
        assert!(
            std::fs::read(&victim).unwrap() == b"precious",
            "written through the link"
        );
        assert!(
            cache.load(&engine, &digest).is_some(),
            "stored all the same"
        );
    }
}
