//! The plugin runtime: tenant behaviour as sandboxed WebAssembly components.
//!
//! Owns: the one `Engine` and `Linker` of the process, compiling components
//! (cached by sha256), validating them, and the sandbox every call runs in:
//! an epoch deadline set before each call, a memory cap per instance, and a
//! deny-by-default WASI context (no files, sockets or host environment).
//! Invariants: compilation never happens on the message path; a trap, a
//! timeout or a malformed result fails that one call with a named
//! [`PluginError`] and the instance is thrown away; nothing a plugin does can
//! panic the host.

pub mod active;
mod artifacts;
pub mod batch;
mod error;
mod limits;
mod logs;
pub mod wasi;
pub use error::{GuestOutput, PluginError};
pub use limits::{
    SandboxLimits, MAX_CORE_INSTANCES, MAX_MEMORIES, MAX_TABLES, MAX_TABLE_ELEMENTS, MEMORY_GUARD,
    MEMORY_RESERVATION,
};

mod contract;
mod sandbox;
pub use contract::*;
pub use sandbox::*;
