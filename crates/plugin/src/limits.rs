//! The sandbox's bounds on one instance: linear memory and table bytes
//! under one cap, and counts of core instances, memories and tables per
//! store (wasmtime's `ResourceLimiter`), with the address space each memory
//! reserves.

use std::time::Duration;
use wasmtime::ResourceLimiter;

/// The sandbox of one tenant's plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// All linear memories of one instance together.
    pub memory_bytes: usize,
    pub deadline: Duration,
    /// Blocking threads the tenant's calls may use at once, beyond the
    /// inline fast path (see `active::ActivePlugin::run`).
    pub threads: usize,
    /// Calls that may wait for one of those threads; past it a call is
    /// refused with [`PluginError::Busy`].
    pub queue: usize,
}

/// Memory accounting for one instance, enforced by wasmtime: every linear
/// memory of the instance and every table element count against one cap (a
/// component is several core modules, each may have memories and tables of
/// its own), and the number of core instances, memories and tables is capped
/// per store, so no component can make thousands of either.
#[derive(Debug)]
pub(crate) struct Limiter {
    pub(crate) max: usize,
    /// Bytes of all linear memories and tables together (they never shrink).
    pub(crate) total: usize,
    /// A growth was refused during the current call (reset before each).
    pub(crate) hit: bool,
}

/// Core instances one plugin instance may make. The largest example
/// (a componentize-py component) makes fewer than half of these.
pub const MAX_CORE_INSTANCES: usize = 64;
/// Linear memories one plugin instance may define. Each reserves
/// [`MEMORY_RESERVATION`] of address space, see [`Runtime::with_artifacts`].
pub const MAX_MEMORIES: usize = 8;
/// Address space reserved per linear memory: a 32-bit index space, so
/// loads and stores need no explicit bounds check.
pub const MEMORY_RESERVATION: u64 = 4 << 30;
/// Unmapped bytes after (and before) each reservation.
pub const MEMORY_GUARD: u64 = 32 << 20;
/// Tables one plugin instance may define.
pub const MAX_TABLES: usize = 32;
/// Elements one table may have; each costs [`TABLE_ELEMENT_BYTES`] of the
/// memory budget too.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// What wasmtime spends per table element: a pointer.
const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

impl Limiter {
    pub(crate) fn new(max: usize) -> Limiter {
        Limiter {
            max,
            total: 0,
            hit: false,
        }
    }

    fn grow(&mut self, bytes: usize) -> bool {
        let grown = self.total.saturating_add(bytes);
        if grown > self.max {
            self.hit = true;
            return false;
        }
        self.total = grown;
        true
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.hit = true;
            return Ok(false);
        }
        Ok(self.grow(
            desired
                .saturating_sub(current)
                .saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}
