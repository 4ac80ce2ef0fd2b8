//! The contract between the host and a component: the bindings of
//! `herald:plugin@0.2.0` (sdk/wit) and of the frozen `@0.1.0`, what a
//! component declares (hooks, encoding, info), the host functions it may
//! call, and the checks on what it answers (a grant's size, a denial's text).

use crate::{PluginError, StoreState};
use wasmtime::component::Component;

/// `herald:plugin@0.2.0` (sdk/wit): the contract plugins are built against
/// today. Its types are the host's own.
pub(crate) mod v2 {
    wasmtime::component::bindgen!({
        path: "../../sdk/wit",
        world: "plugin",
    });
}

/// `herald:plugin@0.1.0` (sdk/wit-0.1.0, frozen): components uploaded
/// before 0.2.0 keep running beside 0.2.0 ones.
pub(crate) mod v1 {
    wasmtime::component::bindgen!({
        path: "../../sdk/wit-0.1.0",
        world: "plugin",
    });
}

// The contract's names, except where they would say something else in the
// host: its `session` is what authorize-connect grants a client, its
// `outgoing` what a transform returns, its `source-record` the typed
// contract's record (the host's own record is `batch::SourceRecord`).
pub use self::v2::herald::plugin::types::{
    ConnectRequest, Denial, Info, Outgoing as TransformOutput, Session as Grant,
    SourceRecord as TypedRecord,
};
pub(crate) use self::v2::herald::plugin::types::{Hooks, Level};

/// The contract a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Contract {
    #[serde(rename = "herald:plugin@0.1.0")]
    V0_1,
    #[serde(rename = "herald:plugin@0.2.0")]
    V0_2,
}

/// A component linked against one of the contracts.
#[derive(Clone)]
pub enum Prepared {
    V0_1(v1::PluginPre<StoreState>),
    V0_2(v2::PluginPre<StoreState>),
}

/// One instance's exports.
pub enum Bound {
    V0_1(v1::Plugin),
    V0_2(v2::Plugin),
}

impl self::v2::herald::plugin::types::Host for StoreState {}

impl self::v2::herald::plugin::host::Host for StoreState {
    fn log(&mut self, level: Level, message: String) {
        StoreState::log(self, level, message)
    }

    fn now_ms(&mut self) -> u64 {
        herald_base::clock::now_ms() as u64
    }

    fn config(&mut self) -> String {
        self.config.to_string()
    }
}

impl self::v1::herald::plugin::types::Host for StoreState {}

impl self::v1::herald::plugin::host::Host for StoreState {
    fn log(&mut self, level: self::v1::herald::plugin::types::Level, message: String) {
        use self::v1::herald::plugin::types::Level as L;
        let level = match level {
            L::Trace => Level::Trace,
            L::Debug => Level::Debug,
            L::Info => Level::Info,
            L::Warn => Level::Warn,
            L::Error => Level::Error,
        };
        StoreState::log(self, level, message)
    }

    fn now_ms(&mut self) -> u64 {
        herald_base::clock::now_ms() as u64
    }

    fn config(&mut self) -> String {
        self.config.to_string()
    }
}

/// A component compiled once per sha256 (or why it did not compile).
pub(crate) type Compiled = std::sync::OnceLock<Result<Component, String>>;

/// Hooks a plugin declared, as host-side booleans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct DeclaredHooks {
    pub authorize_connect: bool,
    pub authorize_subscribe: bool,
    pub transform: bool,
    pub merge: bool,
}

/// How a version's `transform` takes its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `transform(list<source-record>) -> list<outgoing>` (0.2.0).
    Typed,
    /// One buffer plus lengths each way (0.1.0's `transform`, 0.2.0's
    /// `transform-flat`).
    Flat,
}

impl DeclaredHooks {
    /// 0.2.0's flags, and how its transform takes records; declaring both
    /// transforms breaks the contract.
    pub(crate) fn from_v2(h: Hooks) -> Result<(DeclaredHooks, Encoding), PluginError> {
        let (typed, flat) = (
            h.contains(Hooks::TRANSFORM),
            h.contains(Hooks::TRANSFORM_FLAT),
        );
        if typed && flat {
            return Err(PluginError::BadOutput(
                "describe declares both transform and transform-flat; declare one".into(),
            ));
        }
        Ok((
            DeclaredHooks {
                authorize_connect: h.contains(Hooks::AUTHORIZE_CONNECT),
                authorize_subscribe: h.contains(Hooks::AUTHORIZE_SUBSCRIBE),
                transform: typed || flat,
                merge: h.contains(Hooks::MERGE),
            },
            if flat {
                Encoding::Flat
            } else {
                Encoding::Typed
            },
        ))
    }

    pub(crate) fn from_v1(h: self::v1::herald::plugin::types::Hooks) -> DeclaredHooks {
        use self::v1::herald::plugin::types::Hooks as H;
        DeclaredHooks {
            authorize_connect: h.contains(H::AUTHORIZE_CONNECT),
            authorize_subscribe: h.contains(H::AUTHORIZE_SUBSCRIBE),
            transform: h.contains(H::TRANSFORM),
            merge: h.contains(H::MERGE),
        }
    }
}

/// What `describe` answered, and what the component was built against.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub hooks: DeclaredHooks,
    pub contract: Contract,
    pub encoding: Encoding,
}

/// 0.1.0 has the same records for connect and subscribe; a 0.1.0 call
/// converts them on the way in and out (a few strings, per connect).
pub(crate) mod from_v1 {
    use super::v1::herald::plugin::types as old;
    use super::{ConnectRequest, Denial, Grant};

    pub fn request(r: &ConnectRequest) -> old::ConnectRequest {
        old::ConnectRequest {
            tenant: r.tenant.clone(),
            transport: r.transport.clone(),
            headers: r.headers.clone(),
            query: r.query.clone(),
            credentials: r.credentials.clone(),
            remote_addr: r.remote_addr.clone(),
        }
    }

    pub fn session_in(s: &Grant) -> old::Session {
        old::Session {
            subject: s.subject.clone(),
            audience: s.audience.clone(),
            attributes: s.attributes.clone(),
        }
    }

    pub fn session(s: old::Session) -> Grant {
        Grant {
            subject: s.subject,
            audience: s.audience,
            attributes: s.attributes,
        }
    }

    pub fn denial(d: old::Denial) -> Denial {
        Denial {
            code: d.code,
            message: d.message,
        }
    }
}

/// The WIT's rules for a session an authorize-connect grants.
pub(crate) fn check_session(s: &Grant) -> Result<(), PluginError> {
    let bad = |m: String| Err(PluginError::BadOutput(format!("authorize-connect: {m}")));
    if !(1..=256).contains(&s.subject.len()) {
        return bad(format!(
            "subject must be 1-256 bytes, not {}",
            s.subject.len()
        ));
    }
    if let Some(a) = &s.audience {
        if !(1..=64).contains(&a.len()) {
            return bad(format!("audience must be 1-64 bytes, not {}", a.len()));
        }
    }
    if s.attributes.len() > 32 {
        return bad(format!("at most 32 attributes, not {}", s.attributes.len()));
    }
    if let Some((n, _)) = s
        .attributes
        .iter()
        .find(|(n, v)| n.len() > 256 || v.len() > 256)
    {
        return bad(format!(
            "attribute {:?}: name and value at most 256 bytes each",
            n.chars().take(32).collect::<String>()
        ));
    }
    Ok(())
}

/// A denial as the client will see it (the WIT's rules): the code of
/// `[A-Za-z0-9_]` only, cut at 48 ("denied" if nothing is left), the
/// message cut at 256 bytes.
pub(crate) fn cut_denial(mut d: Denial) -> Denial {
    d.code = d
        .code
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(48)
        .collect();
    if d.code.is_empty() {
        d.code = "denied".into();
    }
    if d.message.len() > 256 {
        let mut cut = 256;
        while !d.message.is_char_boundary(cut) {
            cut -= 1;
        }
        d.message.truncate(cut);
    }
    d
}
