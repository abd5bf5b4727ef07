//! The consumer settings of a connector's tasks: the worker's `consumer.*` keys, then the
//! connector's `consumer.override.*` keys. Each value remembers the key it came from, so that
//! an error names what the user wrote.
//!
//! Classic mode hands them to librdkafka, which checks them. Share mode runs Spillway's own
//! share consumer, which knows fewer settings: the ones it has are applied and checked here,
//! the ones a share group cannot honour are refused when the connector sets them (and only
//! warned about when they come from the worker, whose `consumer.*` keys also serve its
//! classic connectors). Security settings (`security.protocol`, `ssl.*`, `sasl.*`, in the Java
//! or the librdkafka spelling) go through the one translation of
//! [`spillway_kafka::security::SecuritySettings`] in both modes, from either level.

use std::collections::BTreeMap;
use std::time::Duration;

use spillway_core::{ConfigError, ConfigMap};
use spillway_kafka::security::{is_security_key, SecuritySettings};
use spillway_kafka::share::ShareConsumerConfig;

const WORKER_PREFIX: &str = "consumer.";
const CONNECTOR_PREFIX: &str = "consumer.override.";
const MAX_POLL_RECORDS: &str = "max.poll.records";
/// The runtime's `max.poll.records` when neither level sets it (Kafka's default).
pub const DEFAULT_MAX_POLL_RECORDS: usize = 500;

/// Keys the runtime sets itself, whatever the configs say.
const SET_BY_THE_RUNTIME: [&str; 3] = ["group.protocol", "group.id", "bootstrap.servers"];

/// Consumer keys that become the share group's own configs in share mode: the runtime sets
/// them on the group with IncrementalAlterConfigs when the connector starts
/// ([`crate::share_group`]). Each is `(consumer key, group config)`: the consumer key of
/// classic mode (`auto.offset.reset`, `isolation.level`) or the group config's own name.
pub const GROUP_CONFIG_KEYS: [(&str, &str); 5] = [
    ("auto.offset.reset", SHARE_AUTO_OFFSET_RESET),
    (SHARE_AUTO_OFFSET_RESET, SHARE_AUTO_OFFSET_RESET),
    ("isolation.level", SHARE_ISOLATION_LEVEL),
    (SHARE_ISOLATION_LEVEL, SHARE_ISOLATION_LEVEL),
    (SHARE_RECORD_LOCK_DURATION_MS, SHARE_RECORD_LOCK_DURATION_MS),
];
pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";
pub const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";

/// A share-group config a connector's consumer settings ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfigWish {
    /// The group config, e.g. `share.auto.offset.reset`.
    pub config: &'static str,
    pub value: String,
    /// The key as written, e.g. `consumer.override.auto.offset.reset`.
    pub key: String,
    /// Set by the connector (not the worker's `consumer.*`).
    pub from_connector: bool,
}

/// Consumer keys that a share group does not take from its consumers (as Kafka's
/// `KafkaShareConsumer`, which refuses them), with where the setting lives instead.
const NOT_FOR_SHARE_GROUPS: [(&str, &str); 7] = [
    (
        "enable.auto.commit",
        "a share-mode task acknowledges every record itself after put",
    ),
    (
        "auto.commit.interval.ms",
        "a share-mode task acknowledges every record itself after put",
    ),
    (
        "group.instance.id",
        "share groups have no static membership",
    ),
    (
        "partition.assignment.strategy",
        "the brokers assign partitions to share group members",
    ),
    (
        "group.remote.assignor",
        "the brokers assign partitions to share group members",
    ),
    (
        "session.timeout.ms",
        "it is the brokers' group.share.session.timeout.ms",
    ),
    (
        "heartbeat.interval.ms",
        "it is the brokers' group.share.heartbeat.interval.ms",
    ),
];

/// One consumer setting and the key it was given as.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    key: String,
    value: String,
    from_connector: bool,
}

/// A connector's consumer settings, worker's first, the connector's overrides on top.
#[derive(Debug, Clone, Default)]
pub struct ConsumerSettings {
    settings: BTreeMap<String, Setting>,
}

impl ConsumerSettings {
    /// `overrides` are the connector's `consumer.override.*` keys without the prefix.
    pub fn collect(worker: &ConfigMap, overrides: &ConfigMap) -> ConsumerSettings {
        let worker_settings = worker.iter().filter_map(|(k, v)| {
            let name = k.strip_prefix(WORKER_PREFIX)?;
            // `consumer.override.*` in a worker config is not a worker setting.
            (!k.starts_with(CONNECTOR_PREFIX)).then(|| (name, k.clone(), v, false))
        });
        let connector_settings = overrides
            .iter()
            .map(|(k, v)| (k.as_str(), format!("{CONNECTOR_PREFIX}{k}"), v, true));
        let settings = worker_settings
            .chain(connector_settings)
            .filter(|(name, ..)| !SET_BY_THE_RUNTIME.contains(name))
            .map(|(name, key, value, from_connector)| {
                let setting = Setting {
                    key,
                    value: value.trim().to_owned(),
                    from_connector,
                };
                (name.to_owned(), setting)
            })
            .collect();
        ConsumerSettings { settings }
    }

    /// `max.poll.records`: the most records one batch holds.
    pub fn max_poll_records(&self) -> Result<usize, ConfigError> {
        match self.settings.get(MAX_POLL_RECORDS) {
            None => Ok(DEFAULT_MAX_POLL_RECORDS),
            Some(s) => s.number(1, i32::MAX as u64).map(|n| n as usize),
        }
    }

    /// The settings librdkafka gets in classic mode, without the ones the runtime applies
    /// itself (`max.poll.records`).
    pub fn classic_overrides(&self) -> BTreeMap<String, String> {
        self.settings
            .iter()
            .filter(|(name, _)| name.as_str() != MAX_POLL_RECORDS)
            .map(|(name, s)| (name.clone(), s.value.clone()))
            .collect()
    }

    /// The security keys (without prefix) and their values, for the other clients a
    /// connector's consumer settings serve (the share-group id check).
    pub fn security_overrides(&self) -> BTreeMap<String, String> {
        self.settings
            .iter()
            .filter(|(name, _)| is_security_key(name))
            .map(|(name, s)| (name.clone(), s.value.clone()))
            .collect()
    }

    /// The security settings translated, errors naming the keys as written.
    pub fn security(&self) -> Result<SecuritySettings, ConfigError> {
        SecuritySettings::from_keys(
            self.settings
                .iter()
                .map(|(name, s)| (name.as_str(), s.value.as_str(), s.key.as_str())),
        )
        .map_err(|e| e.into_config_error())
    }

    /// The share-group configs these settings ask for, checked; a connector's value wins over
    /// the worker's, and two keys of one group config must agree.
    pub fn group_configs(&self) -> Result<Vec<GroupConfigWish>, ConfigError> {
        let mut wishes: Vec<GroupConfigWish> = Vec::new();
        let mut errors = Vec::new();
        for (name, config) in GROUP_CONFIG_KEYS {
            let Some(s) = self.settings.get(name) else {
                continue;
            };
            let value = match check_group_config(config, &s.value) {
                Ok(value) => value,
                Err(reason) => {
                    errors.push(s.refused(&reason));
                    continue;
                }
            };
            let wish = GroupConfigWish {
                config,
                value,
                key: s.key.clone(),
                from_connector: s.from_connector,
            };
            match wishes.iter_mut().find(|w| w.config == config) {
                None => wishes.push(wish),
                Some(other) if other.from_connector == wish.from_connector => {
                    if other.value != wish.value {
                        errors.push(s.refused(&format!(
                            "{} says {}; both set the share group's {config}: keep one",
                            other.key, other.value
                        )));
                    }
                }
                Some(other) => {
                    if wish.from_connector {
                        *other = wish;
                    }
                }
            }
        }
        match ConfigError::from_list(errors) {
            Some(error) => Err(error),
            None => Ok(wishes),
        }
    }

    /// The share consumer's config with every setting it knows applied; the warnings name the
    /// worker settings it leaves out.
    pub fn share_config(
        &self,
        bootstrap: &str,
        group: &str,
        client_id: &str,
    ) -> Result<(ShareConsumerConfig, Vec<String>), ConfigError> {
        let mut config = ShareConsumerConfig::new(bootstrap, group);
        config.client_id = client_id.to_owned();
        config.max_poll_records = self.max_poll_records()?;
        let mut warnings = Vec::new();
        let mut errors = Vec::new();
        match self.security().and_then(|security| {
            let client = security
                .client_security()
                .map_err(|e| e.into_config_error())?;
            Ok((security, client))
        }) {
            Ok((security, client)) => {
                config.security = client;
                warnings.extend(
                    security
                        .warnings
                        .into_iter()
                        .filter(|w| w.contains("share consumer")),
                );
            }
            Err(e) => errors.push(e),
        }
        let millis =
            |s: &Setting, min: u64| s.number(min, i32::MAX as u64).map(Duration::from_millis);
        let bytes = |s: &Setting| s.number(1, i32::MAX as u64).map(|n| n as i32);
        for (name, s) in &self.settings {
            let applied = match name.as_str() {
                MAX_POLL_RECORDS | "client.id" => Ok(()),
                "fetch.max.wait.ms" => millis(s, 0).map(|d| config.fetch_max_wait = d),
                "fetch.min.bytes" => bytes(s).map(|n| config.fetch_min_bytes = n),
                "fetch.max.bytes" => bytes(s).map(|n| config.fetch_max_bytes = n),
                "request.timeout.ms" => millis(s, 1).map(|d| config.request_timeout = d),
                "socket.connection.setup.timeout.ms" => {
                    millis(s, 1).map(|d| config.connect_timeout = d)
                }
                "metadata.max.age.ms" => millis(s, 0).map(|d| config.metadata_max_age = d),
                _ if GROUP_CONFIG_KEYS.iter().any(|(key, _)| key == name) => Ok(()),
                "share.acknowledgement.mode" => s.must_be(
                    "explicit",
                    "a share-mode task acknowledges every record itself, after put",
                ),
                _ if is_security_key(name) => Ok(()),
                _ => {
                    let not_for_share = NOT_FOR_SHARE_GROUPS
                        .iter()
                        .find(|(key, _)| key == name)
                        .map(|(_, instead)| *instead);
                    match (not_for_share, s.from_connector) {
                        (Some(instead), true) => {
                            Err(s.refused(&format!("share groups do not take it from a consumer: {instead}; remove it, or run the connector in classic mode (consumer.override.group.protocol=classic)")))
                        }
                        (Some(instead), false) => {
                            warnings.push(format!("{} is not used by share-mode connectors: {instead}", s.key));
                            Ok(())
                        }
                        (None, _) => {
                            warnings.push(format!("{} is not applied in share mode: Spillway's share consumer has no such setting", s.key));
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = applied {
                errors.push(e);
            }
        }
        if let Err(e) = self.group_configs() {
            errors.extend(e.flatten().into_iter().cloned());
        }
        match ConfigError::from_list(errors) {
            Some(error) => Err(error),
            None => Ok((config, warnings)),
        }
    }
}

/// The value of share-group config `config` in Kafka's spelling, or why it is refused.
fn check_group_config(config: &str, value: &str) -> Result<String, String> {
    let lower = value.trim().to_ascii_lowercase();
    match config {
        SHARE_AUTO_OFFSET_RESET => match lower.as_str() {
            "earliest" | "latest" => Ok(lower),
            _ => match lower.strip_prefix("by_duration:") {
                // Kafka reads the rest with java.time.Duration.parse: ISO-8601, not negative.
                Some(duration) if is_iso_duration(duration) => {
                    Ok(format!("by_duration:{}", value.trim()["by_duration:".len()..].trim()))
                }
                _ => Err("expected earliest, latest or by_duration:<ISO-8601 duration> (e.g. by_duration:PT1H), which the share group's share.auto.offset.reset takes".to_owned()),
            },
        },
        SHARE_ISOLATION_LEVEL => match lower.as_str() {
            "read_committed" | "read_uncommitted" => Ok(lower),
            _ => Err("expected read_committed or read_uncommitted, which the share group's share.isolation.level takes".to_owned()),
        },
        _ => match lower.parse::<u64>() {
            // Kafka's bounds for share.record.lock.duration.ms (the brokers may narrow them).
            Ok(ms) if (1000..=3_600_000).contains(&ms) => Ok(ms.to_string()),
            _ => Err("expected milliseconds from 1000 to 3600000 for the share group's share.record.lock.duration.ms".to_owned()),
        },
    }
}

/// `PT1H`, `P1DT2H30M`, `PT0.5S`: the shape of an ISO-8601 duration (lower case accepted).
fn is_iso_duration(text: &str) -> bool {
    let text = text.trim().to_ascii_uppercase();
    let Some(rest) = text.strip_prefix('P') else {
        return false;
    };
    let (days, time) = match rest.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (rest, None),
    };
    let units = |part: &str, allowed: &[char]| -> bool {
        let mut number = String::new();
        let mut any = false;
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                number.push(c);
            } else if allowed.contains(&c) && !number.is_empty() && number.parse::<f64>().is_ok() {
                number.clear();
                any = true;
            } else {
                return false;
            }
        }
        number.is_empty() && (any || part.is_empty())
    };
    let days_ok = units(days, &['D']);
    let time_ok = time.is_none_or(|t| !t.is_empty() && units(t, &['H', 'M', 'S']));
    days_ok && time_ok && rest != "T" && !rest.is_empty()
}

impl Setting {
    fn refused(&self, reason: &str) -> ConfigError {
        let secret = self.key.contains("password") || self.key.ends_with("jaas.config");
        ConfigError::InvalidValue {
            key: self.key.clone(),
            value: if secret {
                "[hidden]".to_owned()
            } else {
                self.value.clone()
            },
            reason: reason.to_owned(),
        }
    }

    fn number(&self, min: u64, max: u64) -> Result<u64, ConfigError> {
        match self.value.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.refused(&format!("expected a whole number from {min} to {max}"))),
        }
    }

    fn must_be(&self, only: &str, why: &str) -> Result<(), ConfigError> {
        if self.value.eq_ignore_ascii_case(only) {
            Ok(())
        } else {
            Err(self.refused(&format!("share mode takes only {only}: {why}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use spillway_core::config::config_map as config;
    use spillway_core::config::config_map;

    fn share(
        worker: &[(&str, &str)],
        overrides: &[(&str, &str)],
    ) -> Result<(ShareConsumerConfig, Vec<String>), ConfigError> {
        ConsumerSettings::collect(&config(worker), &config(overrides))
            .share_config("b:9092", "g", "c-0")
    }

    #[test]
    fn connector_overrides_win_and_every_known_share_setting_is_applied() {
        let (config, warnings) = share(
            &[
                ("consumer.max.poll.records", "100"),
                ("consumer.fetch.max.wait.ms", "50"),
            ],
            &[
                ("max.poll.records", "20"),
                ("fetch.min.bytes", "10"),
                ("fetch.max.bytes", "1048576"),
                ("request.timeout.ms", "7000"),
                ("metadata.max.age.ms", "1000"),
                ("share.acknowledgement.mode", "explicit"),
                ("security.protocol", "PLAINTEXT"),
                ("group.id", "set elsewhere"),
            ],
        )
        .expect("valid");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.max_poll_records, 20);
        assert_eq!(config.fetch_max_wait, Duration::from_millis(50));
        assert_eq!(config.fetch_min_bytes, 10);
        assert_eq!(config.fetch_max_bytes, 1_048_576);
        assert_eq!(config.request_timeout, Duration::from_secs(7));
        assert_eq!(config.metadata_max_age, Duration::from_secs(1));
        assert_eq!(config.client_id, "c-0");
        assert_eq!(config.group_id, "g");
    }

    #[test]
    fn a_bad_number_is_refused_naming_the_key_the_user_wrote() {
        let err = share(&[], &[("max.poll.records", "lots")]).expect_err("not a number");
        assert_eq!(
            err.to_string(),
            "invalid value 'lots' for consumer.override.max.poll.records: expected a whole number from 1 to 2147483647"
        );
        let err = share(&[("consumer.fetch.max.wait.ms", "-1")], &[]).expect_err("negative");
        assert!(
            err.to_string().contains("for consumer.fetch.max.wait.ms"),
            "{err}"
        );
        let classic =
            ConsumerSettings::collect(&ConfigMap::new(), &config(&[("max.poll.records", "0")]));
        assert!(classic.max_poll_records().is_err());
    }

    #[test]
    fn security_settings_reach_the_share_consumer_from_the_worker_and_the_connector() {
        let (config, warnings) = share(
            &[
                ("consumer.security.protocol", "SASL_PLAINTEXT"),
                ("consumer.sasl.mechanism", "SCRAM-SHA-256"),
                ("consumer.sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"worker\" password=\"w-secret\";"),
            ],
            &[
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"alice\" password=\"a-secret\";"),
            ],
        )
        .expect("secured share consumer");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            format!("{:?}", config.security),
            "SASL_PLAINTEXT with SASL SCRAM-SHA-512 as 'alice'"
        );
        let settings = ConsumerSettings::collect(
            &config_map(&[("consumer.security.protocol", "SSL")]),
            &config_map(&[("ssl.cipher.suites", "X")]),
        );
        assert_eq!(
            settings.security_overrides(),
            BTreeMap::from([
                ("security.protocol".to_owned(), "SSL".to_owned()),
                ("ssl.cipher.suites".to_owned(), "X".to_owned()),
            ])
        );
    }

    #[test]
    fn a_bad_security_setting_is_refused_naming_the_key_as_written_and_hiding_secrets() {
        let err = share(&[("consumer.security.protocol", "SASL")], &[]).expect_err("protocol");
        assert!(
            err.to_string().contains("for consumer.security.protocol"),
            "{err}"
        );
        let err = share(
            &[],
            &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "PLAIN"),
                (
                    "sasl.jaas.config",
                    "PlainLoginModule required password=\"s3cret\"",
                ),
            ],
        )
        .expect_err("jaas");
        let text = err.to_string();
        assert!(
            text.contains("consumer.override.sasl.jaas.config"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
        let err = share(
            &[],
            &[
                ("security.protocol", "SSL"),
                ("ssl.truststore.location", "/no/such/ca.pem"),
            ],
        )
        .expect_err("missing file");
        let text = err.to_string();
        assert!(
            text.contains("consumer.override.ssl.truststore.location")
                && text.contains("/no/such/ca.pem"),
            "{text}"
        );
    }

    #[test]
    fn consumer_group_settings_are_refused_on_the_connector_and_only_warned_about_from_the_worker()
    {
        let err = share(&[], &[("session.timeout.ms", "45000")]).expect_err("not for share groups");
        let text = err.to_string();
        assert!(
            text.contains("consumer.override.session.timeout.ms")
                && text.contains("group.share.session.timeout.ms"),
            "{text}"
        );
        let (_, warnings) = share(
            &[
                ("consumer.session.timeout.ms", "45000"),
                ("consumer.receive.buffer.bytes", "65536"),
            ],
            &[],
        )
        .expect("worker settings serve classic connectors too");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("consumer.receive.buffer.bytes"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("consumer.session.timeout.ms"),
            "{warnings:?}"
        );
    }

    #[test]
    fn group_config_keys_become_share_group_configs_checked_and_the_connector_wins() {
        let settings = |worker: &[(&str, &str)], connector: &[(&str, &str)]| {
            ConsumerSettings::collect(&config(worker), &config(connector))
        };
        let wishes = settings(
            &[
                ("consumer.auto.offset.reset", "latest"),
                ("consumer.isolation.level", "read_committed"),
            ],
            &[
                ("auto.offset.reset", "By_Duration:PT1H"),
                ("share.record.lock.duration.ms", "15000"),
            ],
        )
        .group_configs()
        .expect("valid");
        let find = |config: &str| {
            wishes
                .iter()
                .find(|w| w.config == config)
                .cloned()
                .expect(config)
        };
        let reset = find(SHARE_AUTO_OFFSET_RESET);
        assert_eq!(reset.value, "by_duration:PT1H");
        assert_eq!(reset.key, "consumer.override.auto.offset.reset");
        assert!(reset.from_connector);
        let isolation = find(SHARE_ISOLATION_LEVEL);
        assert_eq!(isolation.key, "consumer.isolation.level");
        assert!(!isolation.from_connector);
        assert_eq!(find(SHARE_RECORD_LOCK_DURATION_MS).value, "15000");
        // Accepted by the share consumer's checks too (not refused as consumer-only keys).
        share(
            &[],
            &[
                ("auto.offset.reset", "earliest"),
                ("isolation.level", "read_committed"),
            ],
        )
        .expect("mapped to group configs");
        for (key, value) in [
            ("auto.offset.reset", "none"),
            ("auto.offset.reset", "by_duration:1h"),
            ("isolation.level", "committed"),
            ("share.record.lock.duration.ms", "10"),
        ] {
            let err = share(&[], &[(key, value)]).expect_err(value);
            assert!(
                err.to_string()
                    .contains(&format!("consumer.override.{key}")),
                "{err}"
            );
        }
        let err = settings(
            &[],
            &[
                ("auto.offset.reset", "earliest"),
                ("share.auto.offset.reset", "latest"),
            ],
        )
        .group_configs()
        .expect_err("two values for one group config");
        assert!(err.to_string().contains("keep one"), "{err}");
        assert!(
            is_iso_duration("P1DT2H30M")
                && is_iso_duration("PT0.5S")
                && !is_iso_duration("P")
                && !is_iso_duration("PT")
        );
    }

    #[test]
    fn classic_mode_gets_everything_but_the_keys_the_runtime_sets() {
        let settings = ConsumerSettings::collect(
            &config(&[
                ("consumer.auto.offset.reset", "earliest"),
                ("consumer.override.x", "no"),
            ]),
            &config(&[
                ("max.poll.records", "10"),
                ("group.id", "g"),
                ("sasl.mechanism", "PLAIN"),
            ]),
        );
        assert_eq!(settings.max_poll_records().expect("valid"), 10);
        assert_eq!(
            settings.classic_overrides(),
            BTreeMap::from([
                ("auto.offset.reset".to_owned(), "earliest".to_owned()),
                ("sasl.mechanism".to_owned(), "PLAIN".to_owned()),
            ])
        );
    }
}
