//! librdkafka options a tenant gives its Kafka source (TLS, SASL, tuning).
//!
//! Owns: which options a tenant may set, which of them are secrets, and how
//! they are shown. Invariants: options Herald itself relies on (the group it
//! never joins, where positions are kept, the brokers, the fetch-queue bound)
//! are refused by name, never silently overridden; a secret's value goes to
//! the registry and to librdkafka only — API answers, logs and `Debug` show
//! `***`. Unknown options and bad values are librdkafka's to refuse (client
//! creation fails with its own message).

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
    (
        "plugin.library.paths",
        "it would load code into Herald's process",
    ),
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

    /// Refuses what a tenant may not set: an option Herald owns, or a secret
    /// sent back as the `***` an answer showed in its place.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in self.iter() {
            if let Some((_, why)) = OWNED.iter().find(|(o, _)| *o == name) {
                return Err(format!("options: {name:?} is set by Herald ({why})"));
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
