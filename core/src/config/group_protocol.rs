//! Which group protocol a sink connector consumes with (KIP-1302's resolution order):
//! the connector's `consumer.override.group.protocol`, else the worker's
//! `consumer.group.protocol`, else a classic consumer group. Because the connector's setting is
//! read afresh each time, removing it rolls the connector back to the worker's choice.

use std::fmt;

use crate::config::ConfigMap;
use crate::error::ConfigError;

/// The connector-level key (KIP-458 override of the consumer's `group.protocol`).
pub const CONNECTOR_GROUP_PROTOCOL: &str = "consumer.override.group.protocol";
/// The worker-level key.
pub const WORKER_GROUP_PROTOCOL: &str = "consumer.group.protocol";

/// How a connector's tasks consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    /// KIP-932 share group: records acquired and acknowledged one by one.
    Share,
    /// Classic consumer group with the classic rebalance protocol.
    Classic,
    /// Consumer group with the KIP-848 rebalance protocol.
    Consumer,
}

impl GroupProtocol {
    pub const NAMES: &'static [&'static str] = &["share", "classic", "consumer"];

    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Share => "share",
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }

    /// Share groups acknowledge per record; the other two commit offsets per partition.
    pub fn is_share(self) -> bool {
        self == GroupProtocol::Share
    }

    /// Parses a value read from `key`; case and surrounding blanks are ignored, as Kafka does.
    pub fn parse(key: &str, text: &str) -> Result<GroupProtocol, ConfigError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "share" => Ok(GroupProtocol::Share),
            "classic" => Ok(GroupProtocol::Classic),
            "consumer" => Ok(GroupProtocol::Consumer),
            _ => Err(ConfigError::InvalidValue {
                key: key.to_owned(),
                value: text.to_owned(),
                reason: format!("expected one of {}", GroupProtocol::NAMES.join(", ")),
            }),
        }
    }
}

impl fmt::Display for GroupProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the resolved protocol came from, for logs and the status API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolSource {
    Connector,
    Worker,
    Default,
}

/// The protocol a connector runs with, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedProtocol {
    pub protocol: GroupProtocol,
    pub source: ProtocolSource,
}

impl fmt::Display for ResolvedProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            ProtocolSource::Connector => {
                write!(f, "{} (from {CONNECTOR_GROUP_PROTOCOL})", self.protocol)
            }
            ProtocolSource::Worker => {
                write!(f, "{} (from worker {WORKER_GROUP_PROTOCOL})", self.protocol)
            }
            ProtocolSource::Default => write!(f, "{} (default)", self.protocol),
        }
    }
}

/// Resolves the protocol for a connector; a bad value at either level is refused, naming its
/// key, even when the other level would decide (a typo should not hide behind a fallback).
pub fn resolve_group_protocol(
    connector: &ConfigMap,
    worker: &ConfigMap,
) -> Result<ResolvedProtocol, ConfigError> {
    let from_worker = worker
        .get(WORKER_GROUP_PROTOCOL)
        .map(|v| GroupProtocol::parse(WORKER_GROUP_PROTOCOL, v))
        .transpose()?;
    let from_connector = connector
        .get(CONNECTOR_GROUP_PROTOCOL)
        .map(|v| GroupProtocol::parse(CONNECTOR_GROUP_PROTOCOL, v))
        .transpose()?;
    Ok(match (from_connector, from_worker) {
        (Some(protocol), _) => ResolvedProtocol {
            protocol,
            source: ProtocolSource::Connector,
        },
        (None, Some(protocol)) => ResolvedProtocol {
            protocol,
            source: ProtocolSource::Worker,
        },
        (None, None) => ResolvedProtocol {
            protocol: GroupProtocol::Classic,
            source: ProtocolSource::Default,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::config_map as config;

    #[test]
    fn connector_override_wins_over_worker_setting() {
        let resolved = resolve_group_protocol(
            &config(&[(CONNECTOR_GROUP_PROTOCOL, "share")]),
            &config(&[(WORKER_GROUP_PROTOCOL, "consumer")]),
        )
        .expect("valid");
        assert_eq!(resolved.protocol, GroupProtocol::Share);
        assert_eq!(resolved.source, ProtocolSource::Connector);
    }

    #[test]
    fn worker_setting_applies_when_the_connector_has_none() {
        let resolved = resolve_group_protocol(
            &ConfigMap::new(),
            &config(&[(WORKER_GROUP_PROTOCOL, "share")]),
        )
        .expect("valid");
        assert_eq!(resolved.protocol, GroupProtocol::Share);
        assert_eq!(resolved.source, ProtocolSource::Worker);
    }

    #[test]
    fn without_any_setting_the_connector_uses_a_classic_group() {
        let resolved = resolve_group_protocol(&ConfigMap::new(), &ConfigMap::new()).expect("valid");
        assert_eq!(resolved.protocol, GroupProtocol::Classic);
        assert_eq!(resolved.to_string(), "classic (default)");
    }

    #[test]
    fn removing_the_connector_override_rolls_back_to_a_consumer_group() {
        let worker = ConfigMap::new();
        let mut connector = config(&[(CONNECTOR_GROUP_PROTOCOL, "share")]);
        let before = resolve_group_protocol(&connector, &worker).expect("valid");
        assert!(before.protocol.is_share());
        connector.remove(CONNECTOR_GROUP_PROTOCOL);
        let after = resolve_group_protocol(&connector, &worker).expect("valid");
        assert_eq!(after.protocol, GroupProtocol::Classic);
        assert_eq!(after.source, ProtocolSource::Default);
    }

    #[test]
    fn removing_the_override_rolls_back_to_the_workers_protocol() {
        let worker = config(&[(WORKER_GROUP_PROTOCOL, "consumer")]);
        let mut connector = config(&[(CONNECTOR_GROUP_PROTOCOL, "share")]);
        assert!(resolve_group_protocol(&connector, &worker)
            .expect("valid")
            .protocol
            .is_share());
        connector.remove(CONNECTOR_GROUP_PROTOCOL);
        let after = resolve_group_protocol(&connector, &worker).expect("valid");
        assert_eq!(after.protocol, GroupProtocol::Consumer);
        assert_eq!(
            after.to_string(),
            "consumer (from worker consumer.group.protocol)"
        );
    }

    #[test]
    fn values_are_read_ignoring_case_and_blanks() {
        let resolved = resolve_group_protocol(
            &config(&[(CONNECTOR_GROUP_PROTOCOL, " SHARE ")]),
            &ConfigMap::new(),
        )
        .expect("valid");
        assert_eq!(resolved.protocol, GroupProtocol::Share);
    }

    #[test]
    fn a_bad_connector_value_is_refused_naming_the_key() {
        let err = resolve_group_protocol(
            &config(&[(CONNECTOR_GROUP_PROTOCOL, "queue")]),
            &ConfigMap::new(),
        )
        .expect_err("not a protocol");
        assert_eq!(
            err.to_string(),
            "invalid value 'queue' for consumer.override.group.protocol: expected one of share, classic, consumer"
        );
    }

    #[test]
    fn a_bad_worker_value_is_refused_even_when_the_connector_decides() {
        let err = resolve_group_protocol(
            &config(&[(CONNECTOR_GROUP_PROTOCOL, "share")]),
            &config(&[(WORKER_GROUP_PROTOCOL, "shared")]),
        )
        .expect_err("worker typo");
        assert_eq!(err.key(), Some(WORKER_GROUP_PROTOCOL));
    }
}
