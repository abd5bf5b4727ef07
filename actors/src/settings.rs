//! Runtime settings: the worker's keys and the per-connector runtime keys, declared once.
//! A connector key falls back to the worker's key of the same name, then to the default.

use std::time::Duration;

use spillway_core::config::{
    resolve_group_protocol, ConfigDef, ConfigKey, ConfigType, Importance, Validator,
};
use spillway_core::{ConfigError, ConfigMap};
use tracing::warn;

pub const BOOTSTRAP_SERVERS: &str = "bootstrap.servers";
/// Most batches of one task between the consumer's poll and its commit (memory bound: this many
/// times `max.poll.records`).
pub const INFLIGHT_BATCHES: &str = "task.inflight.batches";
/// `task.inflight.batches` when unset, in share mode: KIP-1302's loop (poll, put, acknowledge,
/// commit, then poll again). The share consumer already holds the next fetch of every
/// partition leader, so the next batch is there when a commit returns; more batches in flight
/// only hold more records under acquisition locks and interleave polls with commits.
pub const SHARE_INFLIGHT_BATCHES_DEFAULT: usize = 1;
/// `task.inflight.batches` when unset, in classic mode: polls overlap the puts and commits.
pub const CLASSIC_INFLIGHT_BATCHES_DEFAULT: usize = 4;
pub const RESTART_MAX_ATTEMPTS: &str = "task.restart.max.attempts";
pub const RESTART_BACKOFF_MS: &str = "task.restart.backoff.ms";
/// Kafka Connect's name: how long a graceful stop may take before tasks are cut off.
pub const SHUTDOWN_GRACEFUL_TIMEOUT_MS: &str = "task.shutdown.graceful.timeout.ms";
pub const POLL_TIMEOUT_MS: &str = "task.poll.timeout.ms";
pub const COMMIT_TIMEOUT_MS: &str = "task.commit.timeout.ms";
/// Kafka's `group.share.delivery.count.limit` (a broker setting, default 5): the broker
/// archives a record instead of delivering it again once it has been delivered this often.
/// The task never lets that happen to a record it has not delivered, dead-lettered or named in
/// a FAILED status: on the last allowed delivery a record still failing goes to the dead
/// letter queue or fails the task (docs/runtime.md, "Retries, locks and the delivery limit").
/// The consumer cannot read the broker setting; this key says it (or the admin client sets
/// [`TaskSettings::delivery_attempt_limit`] from DescribeConfigs where the cluster allows).
pub const DELIVERY_COUNT_LIMIT: &str = "group.share.delivery.count.limit";
/// The old name of [`DELIVERY_COUNT_LIMIT`]: still read, with a WARN.
pub const DEPRECATED_DELIVERY_ATTEMPT_LIMIT: &str = "share.delivery.attempt.limit";
/// Share mode: how long before the earliest acquisition lock of a batch its in-task retries
/// stop, so that the RELEASE (or the dead letter) is committed while the lock still holds.
pub const RETRY_LOCK_MARGIN_MS: &str = "share.retry.lock.margin.ms";

/// The runtime keys, valid in the worker config and in a connector config.
pub fn runtime_config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(INFLIGHT_BATCHES, ConfigType::Int, Importance::Medium, "Batches of one task in flight between poll and acknowledgement; bounds the task's memory to this many times max.poll.records. Default: 1 in share mode (KIP-1302's poll-put-commit loop; the share consumer prefetches), 4 in classic mode.")
                .null_default()
                .validator(Validator::AtLeast(1)),
        )
        .define(
            ConfigKey::new(RESTART_MAX_ATTEMPTS, ConfigType::Int, Importance::Medium, "Restarts of a failed task in a row before it stays FAILED.")
                .default("3")
                .validator(Validator::AtLeast(0)),
        )
        .define(
            ConfigKey::new(RESTART_BACKOFF_MS, ConfigType::Long, Importance::Low, "Wait before the first restart of a failed task; doubled on each further restart, up to 60 s.")
                .default("1000")
                .validator(Validator::AtLeast(0)),
        )
        .define(
            ConfigKey::new(SHUTDOWN_GRACEFUL_TIMEOUT_MS, ConfigType::Long, Importance::Low, "How long stopping a task may take (in-flight batches finish, acknowledgements are committed) before it is cut off.")
                .default("5000")
                .validator(Validator::AtLeast(0)),
        )
        .define(
            ConfigKey::new(POLL_TIMEOUT_MS, ConfigType::Long, Importance::Low, "Longest wait of one poll for records.")
                .default("200")
                .validator(Validator::AtLeast(1)),
        )
        .define(
            ConfigKey::new(COMMIT_TIMEOUT_MS, ConfigType::Long, Importance::Low, "Longest wait for acknowledgements or offsets to be committed.")
                .default("10000")
                .validator(Validator::AtLeast(1)),
        )
        .define(
            ConfigKey::new(DELIVERY_COUNT_LIMIT, ConfigType::Int, Importance::Medium, "Share mode: the brokers' group.share.delivery.count.limit (Kafka's default is 5). A record still failing on its last allowed delivery goes to the dead letter queue (errors.tolerance=all) or fails the task naming it (errors.tolerance=none) instead of being archived by the broker.")
                .default("5")
                .validator(Validator::Between(2, 10)),
        )
        .define(
            ConfigKey::new(DEPRECATED_DELIVERY_ATTEMPT_LIMIT, ConfigType::Int, Importance::Low, "Deprecated: the old name of group.share.delivery.count.limit, read when that key is not set.")
                .null_default()
                .validator(Validator::Between(2, 10)),
        )
        .define(
            ConfigKey::new(RETRY_LOCK_MARGIN_MS, ConfigType::Long, Importance::Low, "Share mode: a retriable put failure is retried in the task while the batch's acquisition locks have more than this left (plus the last put's time); then the records are released (or, on their last allowed delivery, dead-lettered). Twice the last commit's time is kept when that is more.")
                .default("1000")
                .validator(Validator::AtLeast(0)),
        )
}

/// `group.share.delivery.count.limit`, or its deprecated name (with a WARN) when only that
/// is set.
fn delivery_count_limit(
    merged: &ConfigMap,
    parsed: &spillway_core::config::ParsedConfig,
) -> Result<u16, ConfigError> {
    let key = if !merged.contains_key(DELIVERY_COUNT_LIMIT)
        && merged.contains_key(DEPRECATED_DELIVERY_ATTEMPT_LIMIT)
    {
        warn!(
            deprecated = DEPRECATED_DELIVERY_ATTEMPT_LIMIT,
            use_instead = DELIVERY_COUNT_LIMIT,
            "{DEPRECATED_DELIVERY_ATTEMPT_LIMIT} is deprecated: set {DELIVERY_COUNT_LIMIT} (Kafka's name of the setting) instead"
        );
        DEPRECATED_DELIVERY_ATTEMPT_LIMIT
    } else {
        DELIVERY_COUNT_LIMIT
    };
    Ok(u16::try_from(parsed.int(key)?).unwrap_or(5))
}

/// Most batches one flush covers when the task asks for a flush interval (a transaction of
/// 64 batches of 500 records by default). Held batches keep no records, only their verdicts
/// and offsets, and give their credits back to the consumer (`task.inflight.batches` bounds
/// the batches being polled, converted and put); this bounds what waits for the commit, and
/// what a failed flush sends back to be read again.
pub const HELD_BATCHES_MAX: usize = 64;

/// How one connector's tasks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSettings {
    pub inflight_batches: usize,
    pub restart_max_attempts: u32,
    pub restart_backoff: Duration,
    pub shutdown_timeout: Duration,
    pub poll_timeout: Duration,
    pub commit_timeout: Duration,
    /// Kafka's `group.share.delivery.count.limit` as the task knows it.
    pub delivery_attempt_limit: u16,
    /// `share.retry.lock.margin.ms`.
    pub retry_lock_margin: Duration,
    /// [`HELD_BATCHES_MAX`]; not a configuration key.
    pub held_batches_max: usize,
}

impl Default for TaskSettings {
    /// Classic mode's defaults.
    fn default() -> Self {
        TaskSettings {
            inflight_batches: CLASSIC_INFLIGHT_BATCHES_DEFAULT,
            restart_max_attempts: 3,
            restart_backoff: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(5),
            poll_timeout: Duration::from_millis(200),
            commit_timeout: Duration::from_secs(10),
            delivery_attempt_limit: 5,
            retry_lock_margin: Duration::from_secs(1),
            held_batches_max: HELD_BATCHES_MAX,
        }
    }
}

impl TaskSettings {
    /// The connector's runtime keys, each falling back to the worker's, then to the default of
    /// the connector's group protocol (a bad protocol value is refused where the protocol is
    /// resolved; here it counts as classic).
    pub fn resolve(connector: &ConfigMap, worker: &ConfigMap) -> Result<TaskSettings, ConfigError> {
        let def = runtime_config_def();
        let mut merged = ConfigMap::new();
        for key in def.keys() {
            if let Some(v) = connector.get(&key.name).or_else(|| worker.get(&key.name)) {
                merged.insert(key.name.clone(), v.clone());
            }
        }
        let parsed = def.parse(&merged)?;
        let ms = |key: &str| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(parsed.long(key)?.unsigned_abs()))
        };
        let share = resolve_group_protocol(connector, worker)
            .map(|resolved| resolved.protocol.is_share())
            .unwrap_or(false);
        let inflight_batches = match parsed.get(INFLIGHT_BATCHES).and_then(|v| v.as_i64()) {
            Some(set) => usize::try_from(set).unwrap_or(1),
            None if share => SHARE_INFLIGHT_BATCHES_DEFAULT,
            None => CLASSIC_INFLIGHT_BATCHES_DEFAULT,
        };
        Ok(TaskSettings {
            inflight_batches,
            restart_max_attempts: u32::try_from(parsed.int(RESTART_MAX_ATTEMPTS)?).unwrap_or(0),
            restart_backoff: ms(RESTART_BACKOFF_MS)?,
            shutdown_timeout: ms(SHUTDOWN_GRACEFUL_TIMEOUT_MS)?,
            poll_timeout: ms(POLL_TIMEOUT_MS)?,
            commit_timeout: ms(COMMIT_TIMEOUT_MS)?,
            delivery_attempt_limit: delivery_count_limit(&merged, &parsed)?,
            retry_lock_margin: ms(RETRY_LOCK_MARGIN_MS)?,
            held_batches_max: HELD_BATCHES_MAX,
        })
    }

    /// The wait before restart number `attempt` (1-based): doubling, at most 60 s.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        (self.restart_backoff * factor).min(Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use spillway_core::config::config_map as config;

    #[test]
    fn connector_keys_win_over_worker_keys_and_defaults_fill_the_rest() {
        let s = TaskSettings::resolve(
            &config(&[(INFLIGHT_BATCHES, "2")]),
            &config(&[(INFLIGHT_BATCHES, "8"), (RESTART_MAX_ATTEMPTS, "5")]),
        )
        .expect("valid");
        assert_eq!(s.inflight_batches, 2);
        assert_eq!(s.restart_max_attempts, 5);
        assert_eq!(s.shutdown_timeout, Duration::from_secs(5));
    }

    #[test]
    fn unset_inflight_batches_follow_the_group_protocol_and_a_set_value_wins() {
        let share_connector = config(&[("consumer.override.group.protocol", "share")]);
        let share_worker = config(&[("consumer.group.protocol", "share")]);
        let inflight = |connector: &ConfigMap, worker: &ConfigMap| {
            TaskSettings::resolve(connector, worker)
                .expect("valid")
                .inflight_batches
        };
        assert_eq!(inflight(&ConfigMap::new(), &ConfigMap::new()), 4);
        assert_eq!(inflight(&share_connector, &ConfigMap::new()), 1);
        assert_eq!(inflight(&ConfigMap::new(), &share_worker), 1);
        // Rolled back to classic by the connector: classic's default again.
        let classic_connector = config(&[("consumer.override.group.protocol", "classic")]);
        assert_eq!(inflight(&classic_connector, &share_worker), 4);
        let mut explicit = share_connector.clone();
        explicit.insert(INFLIGHT_BATCHES.to_owned(), "3".to_owned());
        assert_eq!(inflight(&explicit, &ConfigMap::new()), 3);
        assert_eq!(
            inflight(&share_connector, &config(&[(INFLIGHT_BATCHES, "2")])),
            2
        );
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_key() {
        let err = TaskSettings::resolve(&config(&[(INFLIGHT_BATCHES, "0")]), &ConfigMap::new())
            .expect_err("zero batches");
        assert_eq!(
            err.to_string(),
            "invalid value '0' for task.inflight.batches: must be at least 1"
        );
    }

    #[test]
    fn the_delivery_limit_has_kafkas_name_and_the_old_name_still_works() {
        let limit = |connector: &[(&str, &str)], worker: &[(&str, &str)]| {
            TaskSettings::resolve(&config(connector), &config(worker))
                .expect("valid")
                .delivery_attempt_limit
        };
        assert_eq!(limit(&[], &[]), 5);
        assert_eq!(limit(&[(DELIVERY_COUNT_LIMIT, "3")], &[]), 3);
        assert_eq!(limit(&[], &[(DELIVERY_COUNT_LIMIT, "7")]), 7);
        assert_eq!(limit(&[(DEPRECATED_DELIVERY_ATTEMPT_LIMIT, "4")], &[]), 4);
        // Kafka's name wins over the deprecated one wherever it is set.
        assert_eq!(
            limit(
                &[(DEPRECATED_DELIVERY_ATTEMPT_LIMIT, "4")],
                &[(DELIVERY_COUNT_LIMIT, "6")]
            ),
            6
        );
        let err = TaskSettings::resolve(
            &config(&[(DEPRECATED_DELIVERY_ATTEMPT_LIMIT, "1")]),
            &ConfigMap::new(),
        )
        .expect_err("below Kafka's range");
        assert!(
            err.to_string().contains(DEPRECATED_DELIVERY_ATTEMPT_LIMIT),
            "{err}"
        );
    }

    #[test]
    fn restart_backoff_doubles_up_to_a_minute() {
        let s = TaskSettings::default();
        assert_eq!(s.backoff(1), Duration::from_secs(1));
        assert_eq!(s.backoff(3), Duration::from_secs(4));
        assert_eq!(s.backoff(30), Duration::from_secs(60));
    }
}
