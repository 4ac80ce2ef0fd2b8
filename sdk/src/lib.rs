//! Herald plugin SDK: write a tenant plugin as plain Rust functions.
//!
//! Implement [`Plugin`] inside [`plugin!`] (every hook has a default) and
//! build for `wasm32-wasip2`. The macro exports the component and tells the
//! host exactly the hooks the block implements: a hook cannot be written
//! and left undeclared (the host skips undeclared hooks, so a forgotten
//! `authorize_subscribe` would allow every subscription). The SDK hides the
//! WIT bindings and the flat batch encoding that keeps `transform` cheap per
//! message.
//!
//! ```ignore
//! struct Upper;
//! herald_sdk::plugin! {
//!     impl Plugin for Upper {
//!         const NAME: &'static str = "upper";
//!         fn transform(r: &herald_sdk::Record<'_>, out: &mut herald_sdk::Output) {
//!             out.push(r.channel.unwrap_or("default"), &r.value.to_ascii_uppercase());
//!         }
//!     }
//! }
//! ```

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "plugin",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_herald_plugin",
        default_bindings_module: "herald_sdk::bindings",
    });
}

use bindings::exports::herald::plugin::guest::Guest;
pub use bindings::herald::plugin::types::{ConnectRequest, Denial, Level, Session};
use bindings::herald::plugin::types::{
    Hooks, Info, Outgoing, OutgoingBatch, RecordBatch, SourceRecord,
};
use std::marker::PhantomData;

/// A hook a plugin implements; [`plugin!`] lists the ones its block writes,
/// so the host can skip the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    AuthorizeConnect,
    AuthorizeSubscribe,
    Transform,
    Merge,
}

/// One record from the tenant's source, borrowed from the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub timestamp_ms: u64,
    /// The source position (Kafka offset, outbox id; 0 for HTTP publish).
    pub position: u64,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// The channel the publisher named, when the source has one.
    pub channel: Option<&'a str>,
    pub headers: Vec<(&'a str, &'a [u8])>,
    /// Index of this record in the batch.
    pub index: u32,
}

/// Messages a `transform` call emits.
#[derive(Debug, Default)]
pub struct Output {
    data: Vec<u8>,
    meta: Vec<u32>,
    current: u32,
}

const NONE32: u32 = u32::MAX;
const NONE64: u64 = u64::MAX;

impl Output {
    /// Publishes `payload` to `channel` for every audience, no conflation key.
    pub fn push(&mut self, channel: &str, payload: &[u8]) {
        self.push_full(channel, payload, None, None);
    }

    /// Publishes with an optional conflation key and audience.
    pub fn push_full(
        &mut self,
        channel: &str,
        payload: &[u8],
        key: Option<&str>,
        audience: Option<&str>,
    ) {
        self.data.extend_from_slice(channel.as_bytes());
        self.data.extend_from_slice(payload);
        if let Some(k) = key {
            self.data.extend_from_slice(k.as_bytes());
        }
        if let Some(a) = audience {
            self.data.extend_from_slice(a.as_bytes());
        }
        self.meta.extend_from_slice(&[
            channel.len() as u32,
            payload.len() as u32,
            key.map_or(NONE32, |k| k.len() as u32),
            audience.map_or(NONE32, |a| a.len() as u32),
            self.current,
        ]);
    }

    pub fn len(&self) -> usize {
        self.meta.len() / 5
    }

    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }
}

/// Decodes a flat record batch. Malformed input (which the host never sends)
/// yields the records decoded so far.
pub fn decode_records<'a>(data: &'a [u8], meta: &[u64]) -> Vec<Record<'a>> {
    let mut out = Vec::with_capacity(meta.len() / 6);
    let mut pos = 0usize;
    let mut take = |n: u64| -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok()?;
        let s = data.get(pos..pos.checked_add(n)?)?;
        pos += n;
        Some(s)
    };
    for (i, m) in meta.chunks_exact(6).enumerate() {
        // Outer Option: the bytes were there; inner: the record has a key.
        let key = if m[2] == NONE64 {
            Some(None)
        } else {
            take(m[2]).map(Some)
        };
        let (Some(key), Some(value), Some(channel), Some(hdr)) =
            (key, take(m[3]), take(m[4]), take(m[5]))
        else {
            break;
        };
        let channel = if channel.is_empty() {
            None
        } else {
            std::str::from_utf8(channel).ok()
        };
        out.push(Record {
            timestamp_ms: m[0],
            position: m[1],
            key,
            value,
            channel,
            headers: decode_headers(hdr),
            index: i as u32,
        });
    }
    out
}

fn decode_headers(mut b: &[u8]) -> Vec<(&str, &[u8])> {
    fn field<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        let v = b.get(4..4usize.checked_add(len)?)?;
        *b = &b[4 + len..];
        Some(v)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let (Some(name), Some(value)) = (field(&mut b), field(&mut b)) else {
            break;
        };
        if let Ok(name) = std::str::from_utf8(name) {
            out.push((name, value));
        }
    }
    out
}

/// A tenant plugin. Every hook has a default; implement it inside
/// [`plugin!`], which declares to the host the hooks the block writes.
pub trait Plugin {
    const NAME: &'static str;
    const VERSION: &'static str = "0.1.0";
    /// The hooks the implementation writes. Set by [`plugin!`] from the
    /// block itself; never written by hand.
    #[doc(hidden)]
    const __HOOKS: &'static [Hook];

    /// Default: everyone may connect, as subject "anonymous".
    fn authorize_connect(req: ConnectRequest) -> Result<Session, Denial> {
        let _ = req;
        Ok(Session {
            subject: "anonymous".into(),
            audience: None,
            attributes: Vec::new(),
        })
    }

    /// Default: every subscription is allowed.
    fn authorize_subscribe(session: Session, channel: String) -> Result<(), Denial> {
        let _ = (session, channel);
        Ok(())
    }

    /// Called for each record of a batch (the host calls the component once
    /// per batch). Default: the record goes to the channel it names,
    /// unchanged, with its key as the conflation key. Emitting nothing drops it.
    fn transform(record: &Record<'_>, out: &mut Output) {
        if let Some(ch) = record.channel {
            let key = record.key.and_then(|k| std::str::from_utf8(k).ok());
            out.push_full(ch, record.value, key, None);
        }
    }

    /// Default: the newer message wins.
    fn merge(key: &str, older: &[u8], newer: &[u8]) -> Vec<u8> {
        let _ = (key, older);
        newer.to_vec()
    }
}

/// Logs through the host (shows in Herald's logs with the tenant).
pub fn log(level: Level, message: &str) {
    bindings::herald::plugin::host::log(level, message);
}

/// Wall-clock milliseconds since the Unix epoch, from the host.
pub fn now_ms() -> u64 {
    bindings::herald::plugin::host::now_ms()
}

/// The tenant's JSON config as set through the admin API.
pub fn config() -> String {
    bindings::herald::plugin::host::config()
}

/// Bridges a [`Plugin`] to the generated bindings; used by [`plugin!`].
#[doc(hidden)]
pub struct Adapter<P>(PhantomData<P>);

impl<P: Plugin> Guest for Adapter<P> {
    fn authorize_connect(req: ConnectRequest) -> Result<Session, Denial> {
        P::authorize_connect(req)
    }

    fn authorize_subscribe(session: Session, channel: String) -> Result<(), Denial> {
        P::authorize_subscribe(session, channel)
    }

    /// The SDK declares `transform-flat`: the host never calls this.
    fn transform(_records: Vec<SourceRecord>) -> Vec<Outgoing> {
        unreachable!("herald-sdk plugins declare transform-flat")
    }

    fn transform_flat(batch: RecordBatch) -> OutgoingBatch {
        let records = decode_records(&batch.data, &batch.meta);
        let mut out = Output {
            data: Vec::with_capacity(batch.data.len() + 64),
            ..Output::default()
        };
        for r in &records {
            out.current = r.index;
            P::transform(r, &mut out);
        }
        OutgoingBatch {
            data: out.data,
            meta: out.meta,
        }
    }

    fn merge(key: String, older: Vec<u8>, newer: Vec<u8>) -> Vec<u8> {
        P::merge(&key, &older, &newer)
    }

    fn describe() -> Info {
        let mut hooks = Hooks::empty();
        for h in P::__HOOKS {
            hooks |= match h {
                Hook::AuthorizeConnect => Hooks::AUTHORIZE_CONNECT,
                Hook::AuthorizeSubscribe => Hooks::AUTHORIZE_SUBSCRIBE,
                // One buffer each way instead of a value per field.
                Hook::Transform => Hooks::TRANSFORM_FLAT,
                Hook::Merge => Hooks::MERGE,
            };
        }
        Info {
            name: P::NAME.into(),
            version: P::VERSION.into(),
            hooks,
        }
    }
}

/// Implements [`Plugin`] for a type and exports it as the component: write
/// the `impl Plugin for T { ... }` block inside. The hooks the host calls
/// are the ones the block defines (`fn authorize_connect`, `fn
/// authorize_subscribe`, `fn transform`, `fn merge`), derived here.
#[macro_export]
macro_rules! plugin {
    (impl Plugin for $t:ty { $($body:tt)* }) => {
        impl $crate::Plugin for $t {
            const __HOOKS: &'static [$crate::Hook] = $crate::__hooks!([] $($body)*);
            $($body)*
        }
        $crate::__export_plugin!($t);
    };
}

/// The hooks an impl block defines, from its tokens (its items' bodies are
/// single brace groups, so this walks the items, not their code).
#[doc(hidden)]
#[macro_export]
macro_rules! __hooks {
    ([$($h:expr,)*]) => { &[$($h,)*] };
    ([$($h:expr,)*] fn authorize_connect $($rest:tt)*) => {
        $crate::__hooks!([$($h,)* $crate::Hook::AuthorizeConnect,] $($rest)*)
    };
    ([$($h:expr,)*] fn authorize_subscribe $($rest:tt)*) => {
        $crate::__hooks!([$($h,)* $crate::Hook::AuthorizeSubscribe,] $($rest)*)
    };
    ([$($h:expr,)*] fn transform $($rest:tt)*) => {
        $crate::__hooks!([$($h,)* $crate::Hook::Transform,] $($rest)*)
    };
    ([$($h:expr,)*] fn merge $($rest:tt)*) => {
        $crate::__hooks!([$($h,)* $crate::Hook::Merge,] $($rest)*)
    };
    ([$($h:expr,)*] $skip:tt $($rest:tt)*) => {
        $crate::__hooks!([$($h,)*] $($rest)*)
    };
}

/// Exports a [`Plugin`] as the component's `herald:plugin/guest` interface
/// (used by [`plugin!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __export_plugin {
    ($plugin:ty) => {
        type __HeraldPluginAdapter = $crate::Adapter<$plugin>;
        $crate::bindings::__export_herald_plugin!(__HeraldPluginAdapter with_types_in $crate::bindings);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_records_with_and_without_keys_and_headers() {
        // Record 0: key "k", value "{}", channel "c", header h=v. Record 1: value "x" only.
        let mut data = b"k{}c".to_vec();
        data.extend_from_slice(&1u32.to_le_bytes());
        data.extend_from_slice(b"h");
        data.extend_from_slice(&1u32.to_le_bytes());
        data.extend_from_slice(b"v");
        data.extend_from_slice(b"x");
        let meta = [5, 9, 1, 2, 1, 10, 6, 10, NONE64, 1, 0, 0];
        let r = decode_records(&data, &meta);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].key, r[0].value, r[0].channel),
            (Some(&b"k"[..]), &b"{}"[..], Some("c"))
        );
        assert_eq!(r[0].headers, vec![("h", &b"v"[..])]);
        assert_eq!(
            (r[1].key, r[1].value, r[1].channel, r[1].index),
            (None, &b"x"[..], None, 1)
        );
        // Lengths past the data stop decoding instead of panicking.
        assert_eq!(decode_records(b"ab", &[0, 0, NONE64, 5, 0, 0]).len(), 0);
    }

    struct Subscribes;
    crate::plugin! {
        impl Plugin for Subscribes {
            const NAME: &'static str = "subscribes";
            /// Documented hooks count too.
            #[allow(unused_variables)]
            fn authorize_subscribe(session: Session, channel: String) -> Result<(), Denial> {
                Err(Denial { code: "no".into(), message: String::new() })
            }
            fn merge(key: &str, older: &[u8], newer: &[u8]) -> Vec<u8> {
                let _ = (key, newer);
                older.to_vec()
            }
        }
    }

    #[test]
    fn hooks_are_the_ones_the_block_writes() {
        assert_eq!(
            <Subscribes as Plugin>::__HOOKS,
            &[Hook::AuthorizeSubscribe, Hook::Merge]
        );
    }

    #[test]
    fn output_encodes_flat() {
        let mut o = Output::default();
        o.current = 3;
        o.push_full("ch", b"{}", Some("k"), None);
        o.push("d", b"1");
        assert_eq!(o.data, b"ch{}kd1");
        assert_eq!(o.meta, vec![2, 2, 1, NONE32, 3, 1, 1, NONE32, NONE32, 3]);
        assert_eq!(o.len(), 2);
    }
}
