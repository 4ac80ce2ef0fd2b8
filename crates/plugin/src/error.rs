//! Why a plugin call or upload failed, by kind, and what the guest wrote
//! (kept for answers, left out of Herald's own log).

/// Why a plugin call or upload failed; callers branch on the variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    #[error("component does not compile: {0}")]
    Compile(String),
    #[error("component does not instantiate: {0}")]
    Instantiate(String),
    /// What trapped (an uncaught exception or panic ends in one), and what
    /// the guest wrote first (its traceback or panic message).
    #[error("plugin trapped: {0}{1}")]
    Trap(String, GuestOutput),
    #[error("plugin call exceeded its {0} ms deadline{1}")]
    Timeout(u64, GuestOutput),
    #[error(
        "plugin exceeded its memory cap of {0} bytes (linear memories and tables together){1}"
    )]
    MemoryExceeded(usize, GuestOutput),
    #[error("{0}")]
    BadOutput(String),
    /// The tenant's active version (per the registry) is not loaded on this
    /// node: nothing may run as if it had no plugin.
    #[error("plugin version {0} is active but not loaded on this node")]
    Unavailable(i64),
    /// The tenant's plugin threads are all busy and its queue is full (or
    /// it has as many live instances as it may): refused, not waited for.
    #[error("the tenant's plugin is busy (every plugin thread taken, {0} calls waiting)")]
    Busy(usize),
    /// Internal: a call on a runtime worker ran past the inline budget and
    /// was cut; [`active::ActivePlugin::run`] retries it on the tenant's
    /// plugin threads. Never reaches a client.
    #[error("plugin call ran past the inline budget")]
    OverBudget,
    /// Internal: an inline call found no pooled instance; making one runs
    /// the component's start code, so [`active::ActivePlugin::run`] moves the
    /// call to the tenant's plugin threads. Never reaches a client.
    #[error("no plugin instance was ready")]
    Cold,
}

impl PluginError {
    /// The error for Herald's own log: what the guest wrote (up to 4 KiB,
    /// in answers to the API and the client) is left out, and a trap's
    /// message is escaped; a failing plugin cannot fill or forge the log.
    pub fn for_log(&self) -> String {
        let quiet = match self {
            PluginError::Trap(m, o) if !o.0.is_empty() => {
                PluginError::Trap(m.clone(), GuestOutput::default())
            }
            PluginError::Timeout(ms, o) if !o.0.is_empty() => {
                PluginError::Timeout(*ms, GuestOutput::default())
            }
            PluginError::MemoryExceeded(b, o) if !o.0.is_empty() => {
                PluginError::MemoryExceeded(*b, GuestOutput::default())
            }
            other => other.clone(),
        };
        let wrote = match self {
            PluginError::Trap(_, o)
            | PluginError::Timeout(_, o)
            | PluginError::MemoryExceeded(_, o)
                if !o.0.is_empty() =>
            {
                format!(" (the plugin wrote {} bytes; see the answer)", o.0.len())
            }
            _ => String::new(),
        };
        format!("{}{wrote}", quiet.to_string().escape_debug())
    }

    /// A short label for metrics and reason codes.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginError::Compile(_) => "compile",
            PluginError::Instantiate(_) => "instantiate",
            PluginError::Trap(..) => "trap",
            PluginError::Timeout(..) => "timeout",
            PluginError::MemoryExceeded(..) => "memory",
            PluginError::BadOutput(_) => "bad_output",
            PluginError::Unavailable(_) => "unavailable",
            PluginError::Busy(_) => "busy",
            PluginError::OverBudget => "over_budget",
            PluginError::Cold => "cold",
        }
    }
}

/// The last lines a guest wrote to stdout and stderr during a failed call
/// (at most [`super::wasi::OUTPUT_KEEP`] bytes), shown after the error.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GuestOutput(pub String);

impl std::fmt::Display for GuestOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        write!(f, "; the plugin wrote:\n{}", self.0)
    }
}
