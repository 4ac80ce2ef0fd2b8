//! How a Kafka source is set: where a new node starts, and which part of a
//! record names its channel.

use serde::{Deserialize, Serialize};

/// Where a new node starts reading (a node with stored positions resumes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(untagged)]
pub enum KafkaStart {
    #[default]
    #[serde(with = "latest_tag")]
    Latest,
    #[serde(with = "earliest_tag")]
    Earliest,
    /// Milliseconds since the Unix epoch.
    Timestamp(u64),
}

macro_rules! tag {
    ($m:ident, $s:literal) => {
        mod $m {
            pub fn serialize<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($s)
            }
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
                let v = <String as serde::Deserialize>::deserialize(d)?;
                if v == $s {
                    Ok(())
                } else {
                    Err(serde::de::Error::custom(concat!("expected \"", $s, "\"")))
                }
            }
        }
    };
}
tag!(latest_tag, "latest");
tag!(earliest_tag, "earliest");

/// Which part of a record names its channel (tenants without a transform).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelFrom {
    Header(String),
    Key,
    Topic,
}

impl ChannelFrom {
    /// `"header:<name>"` (default `header:channel`), `"key"` or `"topic"`.
    pub fn parse(s: Option<&str>) -> Result<ChannelFrom, String> {
        match s.unwrap_or("header:channel") {
            "key" => Ok(ChannelFrom::Key),
            "topic" => Ok(ChannelFrom::Topic),
            h => match h.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Ok(ChannelFrom::Header(name.to_string())),
                _ => Err(format!(
                    "channel_from {h:?} must be \"key\", \"topic\" or \"header:<name>\""
                )),
            },
        }
    }
}
