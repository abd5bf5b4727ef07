//! The worker keys of distributed mode, with Kafka Connect's names and defaults: `group.id`
//! turns it on; the config and status topics hold the cluster's state (see
//! `spillway_storage::kafka_store`); the group timeouts drive membership
//! (`spillway_kafka::worker_group`).
//!
//! `offset.storage.*` are accepted so that a Connect worker file works unchanged, and are not
//! used: sink connectors keep their positions in their consumer or share group, not in an
//! offsets topic.
//!
//! Without `group.id` the worker is the single worker on its sled store, as before.

use std::time::Duration;

use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use spillway_core::{ConfigError, ConfigMap};

pub const GROUP_ID: &str = "group.id";
pub const CONFIG_STORAGE_TOPIC: &str = "config.storage.topic";
pub const CONFIG_STORAGE_REPLICATION_FACTOR: &str = "config.storage.replication.factor";
pub const STATUS_STORAGE_TOPIC: &str = "status.storage.topic";
pub const STATUS_STORAGE_REPLICATION_FACTOR: &str = "status.storage.replication.factor";
pub const STATUS_STORAGE_PARTITIONS: &str = "status.storage.partitions";
pub const OFFSET_STORAGE_TOPIC: &str = "offset.storage.topic";
pub const OFFSET_STORAGE_REPLICATION_FACTOR: &str = "offset.storage.replication.factor";
pub const OFFSET_STORAGE_PARTITIONS: &str = "offset.storage.partitions";
pub const SESSION_TIMEOUT_MS: &str = "session.timeout.ms";
pub const HEARTBEAT_INTERVAL_MS: &str = "heartbeat.interval.ms";
pub const REBALANCE_TIMEOUT_MS: &str = "rebalance.timeout.ms";
pub const SCHEDULED_REBALANCE_MAX_DELAY_MS: &str = "scheduled.rebalance.max.delay.ms";

/// The keys of distributed mode.
pub fn distributed_config_def() -> ConfigDef {
    let key = |name, kind, importance, doc| ConfigKey::new(name, kind, importance, doc);
    ConfigDef::new()
        .define(
            key(GROUP_ID, ConfigType::String, Importance::High, "The group of the cluster's workers. Set, the worker runs in distributed mode: workers with the same group.id share connectors through Kafka. Not set, it is a single worker on its state.dir.")
                .null_default(),
        )
        .define(
            key(CONFIG_STORAGE_TOPIC, ConfigType::String, Importance::High, "Compacted topic (one partition) holding connector configs, target states, task configs, tenants, token digests, quotas and override policies. Required with group.id; created when missing.")
                .null_default(),
        )
        .define(
            key(CONFIG_STORAGE_REPLICATION_FACTOR, ConfigType::Int, Importance::Low, "Replication factor of the config topic when the worker creates it; -1 for the broker's default.")
                .default("3"),
        )
        .define(
            key(STATUS_STORAGE_TOPIC, ConfigType::String, Importance::High, "Compacted topic holding connector and task status. Required with group.id; created when missing.")
                .null_default(),
        )
        .define(
            key(STATUS_STORAGE_REPLICATION_FACTOR, ConfigType::Int, Importance::Low, "Replication factor of the status topic when the worker creates it; -1 for the broker's default.")
                .default("3"),
        )
        .define(
            key(STATUS_STORAGE_PARTITIONS, ConfigType::Int, Importance::Low, "Partitions of the status topic when the worker creates it; -1 for the broker's default.")
                .default("5"),
        )
        .define(
            key(OFFSET_STORAGE_TOPIC, ConfigType::String, Importance::Low, "Accepted for Kafka Connect worker files and not used: sink connectors keep their positions in their consumer or share group.")
                .null_default(),
        )
        .define(
            key(OFFSET_STORAGE_REPLICATION_FACTOR, ConfigType::Int, Importance::Low, "Accepted for Kafka Connect worker files and not used (see offset.storage.topic).")
                .default("3"),
        )
        .define(
            key(OFFSET_STORAGE_PARTITIONS, ConfigType::Int, Importance::Low, "Accepted for Kafka Connect worker files and not used (see offset.storage.topic).")
                .default("25"),
        )
        .define(
            key(SESSION_TIMEOUT_MS, ConfigType::Int, Importance::Low, "Without a heartbeat for this long, a worker is dropped from the group and its work is held for scheduled.rebalance.max.delay.ms.")
                .default("10000")
                .validator(Validator::AtLeast(1)),
        )
        .define(
            key(HEARTBEAT_INTERVAL_MS, ConfigType::Int, Importance::Low, "How often a worker tells the group coordinator it is alive; below session.timeout.ms (a third of it, usually).")
                .default("3000")
                .validator(Validator::AtLeast(1)),
        )
        .define(
            key(REBALANCE_TIMEOUT_MS, ConfigType::Int, Importance::Low, "How long the coordinator waits for every worker to join a rebalance (and for revoked tasks to stop).")
                .default("60000")
                .validator(Validator::AtLeast(1)),
        )
        .define(
            key(SCHEDULED_REBALANCE_MAX_DELAY_MS, ConfigType::Int, Importance::Low, "How long the work of a worker that left is held for it before it moves to the others; 0 moves it at once.")
                .default("300000")
                .validator(Validator::AtLeast(0)),
        )
}

/// A topic the worker keeps state in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageTopic {
    pub name: String,
    /// -1: the broker's default.
    pub replication_factor: i16,
    /// -1: the broker's default.
    pub partitions: i32,
}

/// Distributed mode's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedConfig {
    pub group_id: String,
    /// Always one partition.
    pub config_topic: StorageTopic,
    pub status_topic: StorageTopic,
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub rebalance_timeout: Duration,
    pub scheduled_rebalance_max_delay: Duration,
}

impl DistributedConfig {
    /// Distributed mode's settings when `group.id` is set; `None` for a single worker.
    pub fn from_worker_config(
        config: &ConfigMap,
    ) -> Result<Option<DistributedConfig>, ConfigError> {
        let parsed = distributed_config_def().parse(config)?;
        let Some(group_id) = parsed.string(GROUP_ID)? else {
            return Ok(None);
        };
        let group_id = group_id.trim();
        if group_id.is_empty() {
            return Err(invalid(GROUP_ID, "", "an empty group id names no group; set a name shared by the cluster's workers, or remove group.id to run a single worker"));
        }
        let mut errors = Vec::new();
        let mut topic = |key: &str| match parsed.string(key) {
            Ok(Some(name)) if !name.trim().is_empty() => Some(name.trim().to_owned()),
            Ok(_) => {
                errors.push(ConfigError::Conflict(format!(
                    "{GROUP_ID} is set (distributed mode), so {key} is required: name the compacted topic the workers keep their state in"
                )));
                None
            }
            Err(e) => {
                errors.push(e);
                None
            }
        };
        let config_name = topic(CONFIG_STORAGE_TOPIC);
        let status_name = topic(STATUS_STORAGE_TOPIC);
        let offset_name = parsed.string(OFFSET_STORAGE_TOPIC)?.map(str::trim);
        if let (Some(c), Some(s)) = (&config_name, &status_name) {
            let mut names = vec![
                (CONFIG_STORAGE_TOPIC, c.as_str()),
                (STATUS_STORAGE_TOPIC, s.as_str()),
            ];
            if let Some(o) = offset_name {
                names.push((OFFSET_STORAGE_TOPIC, o));
            }
            for (i, (a, x)) in names.iter().enumerate() {
                for (b, y) in &names[i + 1..] {
                    if x == y {
                        errors.push(ConfigError::Conflict(format!(
                            "{a} and {b} both name topic '{x}'; each needs a topic of its own"
                        )));
                    }
                }
            }
        }
        let config_rf = replication_factor(
            &parsed_int(&parsed, CONFIG_STORAGE_REPLICATION_FACTOR)?,
            CONFIG_STORAGE_REPLICATION_FACTOR,
            &mut errors,
        );
        let status_rf = replication_factor(
            &parsed_int(&parsed, STATUS_STORAGE_REPLICATION_FACTOR)?,
            STATUS_STORAGE_REPLICATION_FACTOR,
            &mut errors,
        );
        let status_partitions = parsed_int(&parsed, STATUS_STORAGE_PARTITIONS)?;
        if status_partitions == 0 || status_partitions < -1 {
            errors.push(invalid(
                STATUS_STORAGE_PARTITIONS,
                &status_partitions.to_string(),
                "must be -1 (the broker's default) or at least 1",
            ));
        }
        let millis = |key| parsed_int(&parsed, key).map(|v| Duration::from_millis(v.max(0) as u64));
        let session_timeout = millis(SESSION_TIMEOUT_MS)?;
        let heartbeat_interval = millis(HEARTBEAT_INTERVAL_MS)?;
        if heartbeat_interval >= session_timeout {
            errors.push(ConfigError::Conflict(format!(
                "{HEARTBEAT_INTERVAL_MS} ({}) must be below {SESSION_TIMEOUT_MS} ({}), or the coordinator drops workers between heartbeats; a third of it is usual",
                heartbeat_interval.as_millis(),
                session_timeout.as_millis()
            )));
        }
        let rebalance_timeout = millis(REBALANCE_TIMEOUT_MS)?;
        let scheduled_rebalance_max_delay = millis(SCHEDULED_REBALANCE_MAX_DELAY_MS)?;
        match errors.len() {
            0 => {}
            1 => return Err(errors.remove(0)),
            _ => return Err(ConfigError::Many(errors)),
        }
        Ok(Some(DistributedConfig {
            group_id: group_id.to_owned(),
            config_topic: StorageTopic {
                name: config_name.expect("checked above"),
                replication_factor: config_rf,
                partitions: 1,
            },
            status_topic: StorageTopic {
                name: status_name.expect("checked above"),
                replication_factor: status_rf,
                partitions: status_partitions,
            },
            session_timeout,
            heartbeat_interval,
            rebalance_timeout,
            scheduled_rebalance_max_delay,
        }))
    }
}

fn parsed_int(parsed: &spillway_core::config::ParsedConfig, key: &str) -> Result<i32, ConfigError> {
    parsed.int(key)
}

fn replication_factor(value: &i32, key: &str, errors: &mut Vec<ConfigError>) -> i16 {
    match i16::try_from(*value) {
        Ok(v) if v == -1 || v >= 1 => v,
        _ => {
            errors.push(invalid(
                key,
                &value.to_string(),
                "must be -1 (the broker's default) or at least 1",
            ));
            -1
        }
    }
}

fn invalid(key: &str, value: &str, reason: &str) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::config::config_map;

    fn distributed(extra: &[(&str, &str)]) -> ConfigMap {
        let mut pairs = vec![
            (GROUP_ID, "spillway-cluster"),
            (CONFIG_STORAGE_TOPIC, "spillway-configs"),
            (STATUS_STORAGE_TOPIC, "spillway-status"),
        ];
        pairs.extend_from_slice(extra);
        config_map(&pairs)
    }

    #[test]
    fn without_group_id_the_worker_stays_single() {
        let config = config_map(&[("bootstrap.servers", "b:9092"), (CONFIG_STORAGE_TOPIC, "x")]);
        assert_eq!(
            DistributedConfig::from_worker_config(&config).unwrap(),
            None
        );
    }

    #[test]
    fn connects_keys_and_defaults_are_read() {
        let d = DistributedConfig::from_worker_config(&distributed(&[
            (STATUS_STORAGE_PARTITIONS, "3"),
            (CONFIG_STORAGE_REPLICATION_FACTOR, "-1"),
            (OFFSET_STORAGE_TOPIC, "connect-offsets"),
            (SCHEDULED_REBALANCE_MAX_DELAY_MS, "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(d.group_id, "spillway-cluster");
        assert_eq!(
            d.config_topic,
            StorageTopic {
                name: "spillway-configs".into(),
                replication_factor: -1,
                partitions: 1
            }
        );
        assert_eq!(
            d.status_topic,
            StorageTopic {
                name: "spillway-status".into(),
                replication_factor: 3,
                partitions: 3
            }
        );
        assert_eq!(d.session_timeout, Duration::from_secs(10));
        assert_eq!(d.heartbeat_interval, Duration::from_secs(3));
        assert_eq!(d.rebalance_timeout, Duration::from_secs(60));
        assert_eq!(d.scheduled_rebalance_max_delay, Duration::ZERO);
    }

    #[test]
    fn group_id_without_topics_names_every_missing_key() {
        let err = DistributedConfig::from_worker_config(&config_map(&[(GROUP_ID, "g")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(CONFIG_STORAGE_TOPIC) && err.contains(STATUS_STORAGE_TOPIC),
            "{err}"
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(STATUS_STORAGE_TOPIC, "spillway-configs")],
                "both name topic 'spillway-configs'",
            ),
            (
                &[(OFFSET_STORAGE_TOPIC, "spillway-status")],
                "both name topic 'spillway-status'",
            ),
            (
                &[(STATUS_STORAGE_REPLICATION_FACTOR, "0")],
                STATUS_STORAGE_REPLICATION_FACTOR,
            ),
            (
                &[(STATUS_STORAGE_PARTITIONS, "0")],
                STATUS_STORAGE_PARTITIONS,
            ),
            (
                &[(HEARTBEAT_INTERVAL_MS, "10000")],
                "must be below session.timeout.ms",
            ),
            (&[(GROUP_ID, "  ")], "empty group id"),
        ];
        for (extra, expected) in cases {
            let err = DistributedConfig::from_worker_config(&distributed(extra))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{extra:?}: {err}");
        }
    }
}
