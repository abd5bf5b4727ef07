//! Config definitions the admin emulation knows, checked as Apache Kafka 4.2's `ConfigDef`
//! checks them (same messages), and the emulated broker's own configs.
//!
//! Group configs are Kafka 4.2's `GroupConfig` (all eleven keys, with `validateValues`'
//! cross-checks); topic configs are a subset of `LogConfig` (the keys listed in
//! [`TOPIC_CONFIGS`]); broker configs are the share-group and group-coordinator keys of
//! `ShareGroupConfig` / `GroupCoordinatorConfig`, valued from what the dev broker has in force.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// `DescribeConfigsResponse.ConfigSource` ids.
pub(crate) const SOURCE_TOPIC: i8 = 1;
pub(crate) const SOURCE_STATIC_BROKER: i8 = 4;
pub(crate) const SOURCE_DEFAULT: i8 = 5;
pub(crate) const SOURCE_GROUP: i8 = 8;

/// A config's type, as `ConfigDef.Type` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Int,
    Long,
    Str,
    List,
}

impl Kind {
    /// `DescribeConfigsResponse.ConfigType` id.
    pub(crate) fn type_id(self) -> i8 {
        match self {
            Kind::Str => 2,
            Kind::Int => 3,
            Kind::Long => 5,
            Kind::List => 7,
        }
    }
}

/// A config's validator, as `ConfigDef` has them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Check {
    Any,
    AtLeast(i64),
    OneOf(&'static [&'static str]),
    ListOf(&'static [&'static str]),
    /// `ShareGroupAutoOffsetResetStrategy.Validator`.
    ShareAutoOffsetReset,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct ConfigKey {
    pub name: &'static str,
    pub kind: Kind,
    pub check: Check,
}

const fn key(name: &'static str, kind: Kind, check: Check) -> ConfigKey {
    ConfigKey { name, kind, check }
}

pub(crate) const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub(crate) const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub(crate) const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";
pub(crate) const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
pub(crate) const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";

/// Kafka 4.2's `GroupConfig`, in its definition order (which is the order `ConfigDef.parse`
/// checks values in).
pub(crate) const GROUP_CONFIGS: &[ConfigKey] = &[
    key("consumer.session.timeout.ms", Kind::Int, Check::AtLeast(1)),
    key(
        "consumer.heartbeat.interval.ms",
        Kind::Int,
        Check::AtLeast(1),
    ),
    key(SHARE_SESSION_TIMEOUT_MS, Kind::Int, Check::AtLeast(1)),
    key(SHARE_HEARTBEAT_INTERVAL_MS, Kind::Int, Check::AtLeast(1)),
    key(
        SHARE_RECORD_LOCK_DURATION_MS,
        Kind::Int,
        Check::AtLeast(1000),
    ),
    key(
        SHARE_AUTO_OFFSET_RESET,
        Kind::Str,
        Check::ShareAutoOffsetReset,
    ),
    key(
        SHARE_ISOLATION_LEVEL,
        Kind::Str,
        Check::OneOf(&["read_committed", "read_uncommitted"]),
    ),
    key("streams.session.timeout.ms", Kind::Int, Check::AtLeast(1)),
    key(
        "streams.heartbeat.interval.ms",
        Kind::Int,
        Check::AtLeast(1),
    ),
    key("streams.num.standby.replicas", Kind::Int, Check::AtLeast(0)),
    key(
        "streams.initial.rebalance.delay.ms",
        Kind::Int,
        Check::AtLeast(0),
    ),
];

/// The broker config each group config defaults to (`extractGroupConfigMap`).
fn group_default_source(name: &str) -> Option<&'static str> {
    Some(match name {
        "consumer.session.timeout.ms" => "group.consumer.session.timeout.ms",
        "consumer.heartbeat.interval.ms" => "group.consumer.heartbeat.interval.ms",
        SHARE_SESSION_TIMEOUT_MS => "group.share.session.timeout.ms",
        SHARE_HEARTBEAT_INTERVAL_MS => "group.share.heartbeat.interval.ms",
        SHARE_RECORD_LOCK_DURATION_MS => "group.share.record.lock.duration.ms",
        "streams.session.timeout.ms" => "group.streams.session.timeout.ms",
        "streams.heartbeat.interval.ms" => "group.streams.heartbeat.interval.ms",
        "streams.num.standby.replicas" => "group.streams.num.standby.replicas",
        "streams.initial.rebalance.delay.ms" => "group.streams.initial.rebalance.delay.ms",
        _ => return None,
    })
}

/// The topic configs the emulation knows (a subset of Kafka's `LogConfig`): name, type,
/// validator, default, and the broker config it defaults from.
pub(crate) const TOPIC_CONFIGS: &[(ConfigKey, &str, &str)] = &[
    (
        key(
            "cleanup.policy",
            Kind::List,
            Check::ListOf(&["compact", "delete"]),
        ),
        "delete",
        "log.cleanup.policy",
    ),
    (
        key(
            "compression.type",
            Kind::Str,
            Check::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
        ),
        "producer",
        "compression.type",
    ),
    (
        key("delete.retention.ms", Kind::Long, Check::AtLeast(0)),
        "86400000",
        "log.cleaner.delete.retention.ms",
    ),
    (
        key("max.message.bytes", Kind::Int, Check::AtLeast(0)),
        "1048588",
        "message.max.bytes",
    ),
    (
        key("min.compaction.lag.ms", Kind::Long, Check::AtLeast(0)),
        "0",
        "log.cleaner.min.compaction.lag.ms",
    ),
    (
        key("min.insync.replicas", Kind::Int, Check::AtLeast(1)),
        "1",
        "min.insync.replicas",
    ),
    (
        key("retention.bytes", Kind::Long, Check::Any),
        "-1",
        "log.retention.bytes",
    ),
    (
        key("retention.ms", Kind::Long, Check::AtLeast(-1)),
        "604800000",
        "log.retention.ms",
    ),
    (
        key("segment.bytes", Kind::Int, Check::AtLeast(1024 * 1024)),
        "1073741824",
        "log.segment.bytes",
    ),
    (
        key("segment.ms", Kind::Long, Check::AtLeast(1)),
        "604800000",
        "log.roll.ms",
    ),
];

pub(crate) fn topic_config(name: &str) -> Option<&'static (ConfigKey, &'static str, &'static str)> {
    TOPIC_CONFIGS.iter().find(|(k, _, _)| k.name == name)
}

pub(crate) fn group_config(name: &str) -> Option<&'static ConfigKey> {
    GROUP_CONFIGS.iter().find(|k| k.name == name)
}

/// `ConfigException(name, value, message)`'s text.
fn invalid(name: &str, value: &str, message: &str) -> String {
    format!("Invalid value {value} for configuration {name}: {message}")
}

/// Parses and validates `value` as `ConfigDef` does; the error is Kafka's message.
pub(crate) fn check_value(key: &ConfigKey, value: &str) -> Result<(), String> {
    let trimmed = value.trim();
    let number = match key.kind {
        Kind::Int => Some(
            trimmed
                .parse::<i32>()
                .map(i64::from)
                .map_err(|_| invalid(key.name, trimmed, "Not a number of type INT"))?,
        ),
        Kind::Long => Some(
            trimmed
                .parse::<i64>()
                .map_err(|_| invalid(key.name, trimmed, "Not a number of type LONG"))?,
        ),
        Kind::Str | Kind::List => None,
    };
    match (key.check, number) {
        (Check::AtLeast(min), Some(n)) if n < min => Err(invalid(
            key.name,
            trimmed,
            &format!("Value must be at least {min}"),
        )),
        (Check::OneOf(allowed), _) if !allowed.contains(&trimmed) => Err(invalid(
            key.name,
            trimmed,
            &format!("String must be one of: {}", allowed.join(", ")),
        )),
        (Check::ListOf(allowed), _) => {
            match trimmed
                .split(',')
                .map(str::trim)
                .find(|part| !allowed.contains(part))
            {
                Some(_) => Err(invalid(
                    key.name,
                    trimmed,
                    &format!("String must be one of: {}", allowed.join(", ")),
                )),
                None => Ok(()),
            }
        }
        (Check::ShareAutoOffsetReset, _) => match parse_share_auto_offset_reset(trimmed) {
            Some(_) => Ok(()),
            None => Err(invalid(
                key.name,
                trimmed,
                &format!(
                    "Invalid value `{trimmed}` for configuration {}. The value must be either \
                     'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.",
                    key.name
                ),
            )),
        },
        _ => Ok(()),
    }
}

/// What `share.auto.offset.reset` asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ShareReset {
    Earliest,
    Latest,
    /// `by_duration:<ISO-8601 duration>`, in seconds.
    ByDuration(f64),
}

/// `ShareGroupAutoOffsetResetStrategy.fromString`: `earliest`, `latest` (lower case) or
/// `by_duration:` and a non-negative ISO-8601 duration (`PnDTnHnMn.nS`).
pub(crate) fn parse_share_auto_offset_reset(text: &str) -> Option<ShareReset> {
    match text {
        "earliest" => Some(ShareReset::Earliest),
        "latest" => Some(ShareReset::Latest),
        _ => text
            .strip_prefix("by_duration:")
            .and_then(parse_iso_duration)
            .filter(|seconds| *seconds >= 0.0)
            .map(ShareReset::ByDuration),
    }
}

/// `java.time.Duration.parse`: `[-]PnDTnHnMn.nS` (days, hours, minutes, seconds; each part
/// optionally signed; case-insensitive), in seconds.
fn parse_iso_duration(text: &str) -> Option<f64> {
    let upper = text.to_ascii_uppercase();
    let (negative, rest) = match upper.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, upper.strip_prefix('+').unwrap_or(&upper)),
    };
    let rest = rest.strip_prefix('P')?;
    let (days, time) = match rest.split_once('T') {
        Some((days, time)) => {
            if time.is_empty() {
                return None;
            }
            (days, Some(time))
        }
        None => (rest, None),
    };
    let mut seconds = 0.0;
    let mut any = false;
    if !days.is_empty() {
        let n = days.strip_suffix('D')?;
        seconds += signed_number(n)? * 86_400.0;
        any = true;
    }
    if let Some(mut time) = time {
        for (unit, scale) in [('H', 3_600.0), ('M', 60.0), ('S', 1.0)] {
            if let Some(at) = time.find(unit) {
                let n = &time[..at];
                if unit != 'S' && n.contains('.') {
                    return None;
                }
                seconds += signed_number(n)? * scale;
                time = &time[at + 1..];
                any = true;
            }
        }
        if !time.is_empty() {
            return None;
        }
    }
    any.then_some(if negative { -seconds } else { seconds })
}

fn signed_number(text: &str) -> Option<f64> {
    let digits = text.trim_start_matches(['+', '-']);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    text.parse::<f64>().ok()
}

/// One broker config of the emulated broker: its value and Kafka's default.
#[derive(Clone, Debug)]
pub(crate) struct BrokerConfig {
    pub value: String,
    pub kafka_default: String,
    pub kind: Kind,
}

/// The lowest share lock duration the emulated broker admits (Kafka's default is 15000; 1000 is
/// the lowest `group.share.min.record.lock.duration.ms` Kafka accepts). Tests run with locks of a
/// few seconds, as a test cluster configured for them would.
pub(crate) const EMULATED_MIN_RECORD_LOCK_MS: i64 = 1000;

/// The emulated broker's configs, from the dev broker's share settings in force (launcher
/// names: `record_lock_duration_ms`, ...). Bounds are Kafka's defaults, widened where the dev
/// broker runs outside them, so what is in force is always admissible.
pub(crate) fn broker_configs(
    in_force: &Map<String, Value>,
) -> BTreeMap<&'static str, BrokerConfig> {
    let int = |name: &str, default: i64| {
        in_force
            .get(name)
            .and_then(Value::as_i64)
            .unwrap_or(default)
    };
    let lock = int("record_lock_duration_ms", 30_000);
    let session = int("session_timeout_ms", 45_000);
    let heartbeat = int("heartbeat_interval_ms", 5_000);
    let entries: Vec<(&'static str, i64, i64)> = vec![
        (
            "group.share.delivery.count.limit",
            int("max_delivery_attempts", 5),
            5,
        ),
        ("group.share.record.lock.duration.ms", lock, 30_000),
        (
            "group.share.min.record.lock.duration.ms",
            EMULATED_MIN_RECORD_LOCK_MS.min(lock),
            15_000,
        ),
        (
            "group.share.max.record.lock.duration.ms",
            lock.max(60_000),
            60_000,
        ),
        (
            "group.share.partition.max.record.locks",
            int("max_record_locks", 2_000),
            2_000,
        ),
        (
            "group.share.max.share.sessions",
            int("max_fetch_sessions", 2_000),
            2_000,
        ),
        ("group.share.max.size", int("max_size", 200), 200),
        ("group.share.session.timeout.ms", session, 45_000),
        (
            "group.share.min.session.timeout.ms",
            session.min(45_000),
            45_000,
        ),
        (
            "group.share.max.session.timeout.ms",
            session.max(60_000),
            60_000,
        ),
        ("group.share.heartbeat.interval.ms", heartbeat, 5_000),
        (
            "group.share.min.heartbeat.interval.ms",
            heartbeat.min(5_000),
            5_000,
        ),
        (
            "group.share.max.heartbeat.interval.ms",
            heartbeat.max(15_000),
            15_000,
        ),
        ("group.consumer.session.timeout.ms", 45_000, 45_000),
        ("group.consumer.min.session.timeout.ms", 45_000, 45_000),
        ("group.consumer.max.session.timeout.ms", 60_000, 60_000),
        ("group.consumer.heartbeat.interval.ms", 5_000, 5_000),
        ("group.consumer.min.heartbeat.interval.ms", 5_000, 5_000),
        ("group.consumer.max.heartbeat.interval.ms", 15_000, 15_000),
        ("group.streams.session.timeout.ms", 45_000, 45_000),
        ("group.streams.min.session.timeout.ms", 45_000, 45_000),
        ("group.streams.max.session.timeout.ms", 60_000, 60_000),
        ("group.streams.heartbeat.interval.ms", 5_000, 5_000),
        ("group.streams.min.heartbeat.interval.ms", 5_000, 5_000),
        ("group.streams.max.heartbeat.interval.ms", 15_000, 15_000),
        ("group.streams.num.standby.replicas", 0, 0),
        ("group.streams.max.standby.replicas", 2, 2),
        ("group.streams.initial.rebalance.delay.ms", 3_000, 3_000),
        ("num.partitions", 1, 1),
        ("default.replication.factor", 1, 1),
    ];
    let mut configs: BTreeMap<&'static str, BrokerConfig> = entries
        .into_iter()
        .map(|(name, value, default)| {
            (
                name,
                BrokerConfig {
                    value: value.to_string(),
                    kafka_default: default.to_string(),
                    kind: Kind::Int,
                },
            )
        })
        .collect();
    // Share groups are enabled by the `share.version` feature on Kafka 4.2 (`group.share.enable`
    // is internal and never described); the protocols list keeps its default.
    configs.insert(
        "group.coordinator.rebalance.protocols",
        BrokerConfig {
            value: "classic,consumer,streams".into(),
            kafka_default: "classic,consumer,streams".into(),
            kind: Kind::List,
        },
    );
    configs
}

/// A group's effective config: its own values over the defaults the broker gives.
pub(crate) fn group_defaults(
    broker: &BTreeMap<&'static str, BrokerConfig>,
    in_force: &Map<String, Value>,
) -> BTreeMap<&'static str, String> {
    GROUP_CONFIGS
        .iter()
        .map(|k| {
            let value = match k.name {
                // No broker config on Kafka (GroupConfig's own default); on the dev broker the
                // cluster-wide setting, which is what a group without its own value gets.
                SHARE_AUTO_OFFSET_RESET => in_force
                    .get("auto_offset_reset")
                    .and_then(Value::as_str)
                    .unwrap_or("latest")
                    .to_string(),
                SHARE_ISOLATION_LEVEL => in_force
                    .get("isolation_level")
                    .and_then(Value::as_str)
                    .unwrap_or("read_uncommitted")
                    .to_string(),
                name => group_default_source(name)
                    .and_then(|b| broker.get(b))
                    .map(|c| c.value.clone())
                    .unwrap_or_default(),
            };
            (k.name, value)
        })
        .collect()
}

/// `GroupConfig.validate`: names, then each value in definition order, then the cross-checks
/// against the broker's bounds. `props` is the group's whole resulting config.
pub(crate) fn validate_group(
    props: &BTreeMap<String, String>,
    defaults: &BTreeMap<&'static str, String>,
    broker: &BTreeMap<&'static str, BrokerConfig>,
) -> Result<(), String> {
    if let Some(name) = props.keys().find(|n| group_config(n).is_none()) {
        return Err(format!("Unknown group config name: {name}"));
    }
    for key in GROUP_CONFIGS {
        if let Some(value) = props.get(key.name) {
            check_value(key, value)?;
        }
    }
    let int = |name: &str| -> i64 {
        props
            .get(name)
            .or_else(|| defaults.get(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let bound = |name: &str| -> i64 {
        broker
            .get(name)
            .and_then(|c| c.value.parse().ok())
            .unwrap_or(0)
    };
    let ranges: [(&str, &str, &str); 7] = [
        (
            "consumer.heartbeat.interval.ms",
            "group.consumer.min.heartbeat.interval.ms",
            "group.consumer.max.heartbeat.interval.ms",
        ),
        (
            "consumer.session.timeout.ms",
            "group.consumer.min.session.timeout.ms",
            "group.consumer.max.session.timeout.ms",
        ),
        (
            SHARE_HEARTBEAT_INTERVAL_MS,
            "group.share.min.heartbeat.interval.ms",
            "group.share.max.heartbeat.interval.ms",
        ),
        (
            SHARE_SESSION_TIMEOUT_MS,
            "group.share.min.session.timeout.ms",
            "group.share.max.session.timeout.ms",
        ),
        (
            SHARE_RECORD_LOCK_DURATION_MS,
            "group.share.min.record.lock.duration.ms",
            "group.share.max.record.lock.duration.ms",
        ),
        (
            "streams.heartbeat.interval.ms",
            "group.streams.min.heartbeat.interval.ms",
            "group.streams.max.heartbeat.interval.ms",
        ),
        (
            "streams.session.timeout.ms",
            "group.streams.min.session.timeout.ms",
            "group.streams.max.session.timeout.ms",
        ),
    ];
    for (name, min, max) in ranges {
        if int(name) < bound(min) {
            return Err(format!("{name} must be greater than or equal to {min}"));
        }
        if int(name) > bound(max) {
            return Err(format!("{name} must be less than or equal to {max}"));
        }
    }
    if int("streams.num.standby.replicas") > bound("group.streams.max.standby.replicas") {
        return Err(
            "streams.num.standby.replicas must be less than or equal to group.streams.max.standby.replicas"
                .into(),
        );
    }
    for (session, heartbeat) in [
        (
            "consumer.session.timeout.ms",
            "consumer.heartbeat.interval.ms",
        ),
        (SHARE_SESSION_TIMEOUT_MS, SHARE_HEARTBEAT_INTERVAL_MS),
        (
            "streams.session.timeout.ms",
            "streams.heartbeat.interval.ms",
        ),
    ] {
        if int(session) <= int(heartbeat) {
            return Err(format!("{session} must be greater than {heartbeat}"));
        }
    }
    Ok(())
}

/// `LogConfig.validate` for the known subset: names, then values.
pub(crate) fn validate_topic(props: &BTreeMap<String, String>) -> Result<(), String> {
    if let Some(name) = props.keys().find(|n| topic_config(n).is_none()) {
        return Err(format!("Unknown topic config name: {name}"));
    }
    for (key, _, _) in TOPIC_CONFIGS {
        if let Some(value) = props.get(key.name) {
            check_value(key, value)?;
        }
    }
    Ok(())
}

/// An incremental alteration: `AlterConfigOp.OpType` ids 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT.
pub(crate) fn apply_op(
    props: &mut BTreeMap<String, String>,
    name: &str,
    op: i8,
    value: Option<&str>,
    kind: Option<Kind>,
) -> Result<(), (i16, String)> {
    const INVALID_CONFIG: i16 = 40;
    const INVALID_REQUEST: i16 = 42;
    match op {
        0 => {
            props.insert(name.to_string(), value.unwrap_or_default().to_string());
        }
        1 => {
            props.remove(name);
        }
        2 | 3 => {
            let verb = if op == 2 { "APPEND" } else { "SUBTRACT" };
            if kind != Some(Kind::List) {
                return Err((
                    INVALID_CONFIG,
                    format!("Can't {verb} to key {name} because its type is not LIST."),
                ));
            }
            let mut parts: Vec<String> = props
                .get(name)
                .map(|v| {
                    v.split(',')
                        .filter(|p| !p.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            for part in value.unwrap_or_default().split(',') {
                if op == 2 {
                    if !parts.iter().any(|p| p == part) {
                        parts.push(part.to_string());
                    }
                } else {
                    parts.retain(|p| p != part);
                }
            }
            props.insert(name.to_string(), parts.join(","));
        }
        other => return Err((INVALID_REQUEST, format!("Unknown operations type {other}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_auto_offset_reset_accepts_what_kafka_accepts() {
        assert_eq!(
            parse_share_auto_offset_reset("earliest"),
            Some(ShareReset::Earliest)
        );
        assert_eq!(
            parse_share_auto_offset_reset("latest"),
            Some(ShareReset::Latest)
        );
        assert_eq!(
            parse_share_auto_offset_reset("by_duration:PT1H30M"),
            Some(ShareReset::ByDuration(5400.0))
        );
        assert_eq!(
            parse_share_auto_offset_reset("by_duration:P1DT0.5S"),
            Some(ShareReset::ByDuration(86_400.5))
        );
        for bad in [
            "none",
            "EARLIEST",
            "by_duration",
            "by_duration:",
            "by_duration:-PT1H",
            "by_duration:PT",
            "by_duration:1h",
            "sideways",
        ] {
            assert_eq!(parse_share_auto_offset_reset(bad), None, "{bad}");
        }
    }

    #[test]
    fn values_are_refused_with_kafkas_messages() {
        let lock = group_config(SHARE_RECORD_LOCK_DURATION_MS).unwrap();
        assert_eq!(
            check_value(lock, "abc").unwrap_err(),
            "Invalid value abc for configuration share.record.lock.duration.ms: Not a number of type INT"
        );
        assert_eq!(
            check_value(lock, "999").unwrap_err(),
            "Invalid value 999 for configuration share.record.lock.duration.ms: Value must be at least 1000"
        );
        let level = group_config(SHARE_ISOLATION_LEVEL).unwrap();
        assert!(check_value(level, "read_committed").is_ok());
        assert!(check_value(level, "serializable")
            .unwrap_err()
            .ends_with("String must be one of: read_committed, read_uncommitted"));
    }

    #[test]
    fn group_validation_checks_names_values_and_the_broker_bounds() {
        let in_force = Map::new();
        let broker = broker_configs(&in_force);
        let defaults = group_defaults(&broker, &in_force);
        let props = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(validate_group(
            &props(&[(SHARE_AUTO_OFFSET_RESET, "earliest")]),
            &defaults,
            &broker
        )
        .is_ok());
        assert_eq!(
            validate_group(
                &props(&[("share.auto.offset.rest", "earliest")]),
                &defaults,
                &broker
            )
            .unwrap_err(),
            "Unknown group config name: share.auto.offset.rest"
        );
        assert_eq!(
            validate_group(&props(&[(SHARE_RECORD_LOCK_DURATION_MS, "70000")]), &defaults, &broker).unwrap_err(),
            "share.record.lock.duration.ms must be less than or equal to group.share.max.record.lock.duration.ms"
        );
        assert_eq!(
            validate_group(
                &props(&[
                    (SHARE_HEARTBEAT_INTERVAL_MS, "15000"),
                    (SHARE_SESSION_TIMEOUT_MS, "45000")
                ]),
                &defaults,
                &broker
            ),
            Ok(())
        );
        assert_eq!(
            validate_group(&props(&[(SHARE_SESSION_TIMEOUT_MS, "70000")]), &defaults, &broker).unwrap_err(),
            "share.session.timeout.ms must be less than or equal to group.share.max.session.timeout.ms"
        );
    }

    #[test]
    fn list_configs_append_and_subtract_and_others_refuse() {
        let mut props = BTreeMap::new();
        apply_op(
            &mut props,
            "cleanup.policy",
            2,
            Some("compact"),
            Some(Kind::List),
        )
        .unwrap();
        apply_op(
            &mut props,
            "cleanup.policy",
            2,
            Some("delete"),
            Some(Kind::List),
        )
        .unwrap();
        assert_eq!(props["cleanup.policy"], "compact,delete");
        apply_op(
            &mut props,
            "cleanup.policy",
            3,
            Some("compact"),
            Some(Kind::List),
        )
        .unwrap();
        assert_eq!(props["cleanup.policy"], "delete");
        let err = apply_op(
            &mut props,
            SHARE_AUTO_OFFSET_RESET,
            2,
            Some("x"),
            Some(Kind::Str),
        )
        .unwrap_err();
        assert_eq!(
            err,
            (
                40,
                "Can't APPEND to key share.auto.offset.reset because its type is not LIST."
                    .to_string()
            )
        );
    }
}
