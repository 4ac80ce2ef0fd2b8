//! librdkafka options a tenant gives its Kafka source (TLS, SASL, tuning).
//!
//! Owns: which options a tenant may set, which of them are secrets, and how
//! they are shown. Invariants: only options on the allowlist (`ALLOWED`:
//! security protocol, SASL, PEM bodies, verification, client id, timeouts)
//! reach librdkafka; nothing a tenant sets makes the server load code, run a
//! command or read a file (`ssl.providers`, `ssl.engine.location`,
//! `plugin.library.paths`, every `*.location`, Kerberos' `kinit`). Options
//! Herald itself relies on (the group it never joins, where positions are
//! kept, the brokers, the fetch-queue bound) are refused by name, never
//! silently overridden. The check runs when a source is set and again
//! whenever a stored one starts. A secret's value goes to the registry and
//! to librdkafka only — API answers, logs and `Debug` show `***`. Bad values
//! of allowed options are librdkafka's to refuse, in its words.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What Herald shows instead of a secret.
pub const REDACTED: &str = "***";

/// Options Herald sets itself, with why a tenant may not.
const OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "it is the source's `brokers`"),
    ("metadata.broker.list", "it is the source's `brokers`"),
    (
        "group.id",
        "Herald reads every partition by assignment and never joins a group",
    ),
    (
        "group.instance.id",
        "Herald reads every partition by assignment and never joins a group",
    ),
    (
        "enable.auto.commit",
        "Herald keeps this node's positions in its registry",
    ),
    (
        "auto.commit.enable",
        "Herald keeps this node's positions in its registry",
    ),
    (
        "enable.auto.offset.store",
        "Herald keeps this node's positions in its registry",
    ),
    (
        "allow.auto.create.topics",
        "a missing topic is refused, never created",
    ),
    (
        "enable.partition.eof",
        "the end of a partition is not an error to Herald",
    ),
    (
        "queued.max.messages.kbytes",
        "it bounds the memory a tenant's fetch queue may take",
    ),
];

/// What a tenant may set: how Herald's clients reach and trust its brokers,
/// and how patient they are. Values are given inline (PEM bodies, not files).
const ALLOWED: &[&str] = &[
    "security.protocol",
    "client.id",
    "client.rack",
    "client.dns.lookup",
    // SASL: PLAIN, SCRAM, OAUTHBEARER (OIDC). Not GSSAPI: Kerberos runs a
    // `kinit` command and reads a keytab file.
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.token.endpoint.url",
    // TLS, every key and certificate inline.
    "ssl.ca.pem",
    "ssl.certificate.pem",
    "ssl.key.pem",
    "ssl.key.password",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.sigalgs.list",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    // Timeouts, retries and fetch tuning.
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.keepalive.enable",
    "connections.max.idle.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "request.timeout.ms",
    "session.timeout.ms",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "fetch.wait.max.ms",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.error.backoff.ms",
    "api.version.request",
    "api.version.request.timeout.ms",
    "broker.version.fallback",
];

/// Whether the option's value is a credential or a key (never shown).
pub fn is_secret(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password")
        || n.contains("secret")
        || n.contains("passphrase")
        || n.ends_with(".pem")
        || n == "sasl.jaas.config"
        || n == "sasl.oauthbearer.config"
}

/// librdkafka configuration properties, by name (`"security.protocol"`).
#[derive(Clone, Default, PartialEq, Eq, Serialize)]
pub struct KafkaOptions(BTreeMap<String, String>);

impl KafkaOptions {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Refuses what a tenant may not set: an option Herald owns, one that is
    /// not on the allowlist, or a secret sent back as the `***` an answer
    /// showed in its place.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in self.iter() {
            if let Some((_, why)) = OWNED.iter().find(|(o, _)| *o == name) {
                return Err(format!("options: {name:?} is set by Herald ({why})"));
            }
            if !ALLOWED.contains(&name) {
                return Err(format!(
                    "options: {name:?} is not an option a tenant may set (accepted: {})",
                    ALLOWED.join(", ")
                ));
            }
            if is_secret(name) && value == REDACTED {
                return Err(format!(
                    "options: {name:?} is {REDACTED:?}, the placeholder Herald shows for a secret; send the secret itself"
                ));
            }
        }
        Ok(())
    }

    /// The options with every secret's value replaced by `***`.
    pub fn redacted(&self) -> serde_json::Value {
        self.iter()
            .map(|(k, v)| {
                let shown = if is_secret(k) { REDACTED } else { v };
                (k.to_string(), serde_json::Value::from(shown))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .map(|(k, v)| (k, if is_secret(k) { REDACTED } else { v })),
            )
            .finish()
    }
}

impl<'de> Deserialize<'de> for KafkaOptions {
    /// A JSON object of strings, numbers or booleans (librdkafka takes every
    /// value as a string: `6000` and `"6000"` are the same).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
        raw.into_iter()
            .map(|(name, v)| {
                let value = match v {
                    serde_json::Value::String(s) => s,
                    serde_json::Value::Number(n) => n.to_string(),
                    serde_json::Value::Bool(b) => b.to_string(),
                    _ => {
                        return Err(serde::de::Error::custom(format!(
                            "options: {name:?} must be a string, number or boolean"
                        )))
                    }
                };
                Ok((name, value))
            })
            .collect::<Result<_, _>>()
            .map(KafkaOptions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> KafkaOptions {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn values_are_strings_to_librdkafka() {
        let o = options(
            r#"{"session.timeout.ms":6000,"enable.ssl.certificate.verification":false,"client.id":"h"}"#,
        );
        assert_eq!(
            o.iter().collect::<Vec<_>>(),
            [
                ("client.id", "h"),
                ("enable.ssl.certificate.verification", "false"),
                ("session.timeout.ms", "6000"),
            ]
        );
        let e = serde_json::from_str::<KafkaOptions>(r#"{"sasl.password":["x"]}"#).unwrap_err();
        assert!(e.to_string().contains("\"sasl.password\" must be"), "{e}");
        // Stored as given, secrets included: the registry needs them.
        let stored = serde_json::to_value(options(r#"{"sasl.password":"p"}"#)).unwrap();
        assert_eq!(stored, serde_json::json!({"sasl.password":"p"}));
    }

    #[test]
    fn owned_options_are_refused_by_name() {
        for name in [
            "group.id",
            "bootstrap.servers",
            "enable.auto.commit",
            "enable.auto.offset.store",
        ] {
            let e = options(&format!(r#"{{"{name}":"x"}}"#))
                .check()
                .unwrap_err();
            assert!(e.contains(&format!("{name:?}")), "{e}");
        }
        assert_eq!(
            options(r#"{"security.protocol":"SASL_SSL","sasl.mechanism":"PLAIN","client.id":"c"}"#)
                .check(),
            Ok(())
        );
        let e = options(r#"{"sasl.password":"***"}"#).check().unwrap_err();
        assert!(e.contains("placeholder"), "{e}");
    }

    #[test]
    fn only_listed_options_pass_and_none_names_a_file_or_code() {
        for name in [
            "ssl.providers",
            "ssl.engine.location",
            "plugin.library.paths",
            "ssl.ca.location",
            "sasl.kerberos.kinit.cmd",
            "debug",
        ] {
            let e = options(&format!(r#"{{"{name}":"x"}}"#))
                .check()
                .unwrap_err();
            assert!(e.contains(&format!("{name:?} is not an option")), "{e}");
        }
        for name in ALLOWED {
            assert!(
                !name.contains("location") && !name.contains("path") && !name.contains("cmd"),
                "{name}: a file, a path or a command"
            );
        }
    }

    #[test]
    fn secrets_never_show() {
        let o = options(
            r#"{"sasl.username":"u","sasl.password":"p1","ssl.key.password":"p2",
                "ssl.key.pem":"-----BEGIN","ssl.certificate.pem":"-----BEGIN",
                "sasl.oauthbearer.client.secret":"s","sasl.jaas.config":"j",
                "ssl.keystore.password":"p3","security.protocol":"SASL_SSL"}"#,
        );
        let shown = o.redacted();
        for secret in [
            "sasl.password",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.certificate.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.jaas.config",
            "ssl.keystore.password",
        ] {
            assert_eq!(shown[secret], REDACTED, "{secret}");
        }
        assert_eq!(shown["sasl.username"], "u");
        assert_eq!(shown["security.protocol"], "SASL_SSL");
        let debug = format!("{o:?}");
        for value in ["p1", "p2", "p3", "-----BEGIN", "\"s\"", "\"j\""] {
            assert!(!debug.contains(value), "{value} in {debug}");
        }
    }
}
