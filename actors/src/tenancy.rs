//! What the runtime does differently for a connector of a tenant: names in Kafka carry the
//! tenant's prefix, client overrides obey the tenant's policy, and the tenant's tasks share
//! one records/s and bytes/s budget and one budget of bytes in flight.
//!
//! The `default` tenant (the only one while REST authentication is off) runs exactly as Kafka
//! Connect: no prefix, the worker's `connector.client.config.override.policy`, no budget
//! unless one is set.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{Quota, RateLimiter};
use spillway_core::config::SinkConnectorConfig;
use spillway_core::{ConfigError, ConfigMap};

/// Kafka Connect's worker key choosing which client overrides connectors may set.
pub const OVERRIDE_POLICY: &str = "connector.client.config.override.policy";

/// The prefixes of per-connector client overrides.
pub const OVERRIDE_PREFIXES: [&str; 3] = [
    "consumer.override.",
    "producer.override.",
    "admin.override.",
];

/// Which `*.override.*` keys a connector may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverridePolicy {
    /// No client overrides at all (Connect's `None`).
    None,
    /// Only the client's identity: `sasl.jaas.config`, `sasl.mechanism`, `security.protocol`
    /// (Connect's `Principal`).
    Principal,
    /// Any tuning, but not where the client connects nor how it authenticates:
    /// `bootstrap.servers`, `security.*`, `sasl.*` and `ssl.*` are refused. The default of a
    /// tenant other than `default`.
    Restricted,
    /// Everything (Connect's `All`, its default), and names set by the user are taken as
    /// they are, without the tenant's prefix.
    #[default]
    All,
}

impl OverridePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OverridePolicy::None => "None",
            OverridePolicy::Principal => "Principal",
            OverridePolicy::Restricted => "Restricted",
            OverridePolicy::All => "All",
        }
    }

    /// Reads a policy name (case-insensitive; Connect's class names are accepted too).
    pub fn parse(key: &str, text: &str) -> Result<OverridePolicy, ConfigError> {
        let short = text
            .trim()
            .rsplit('.')
            .next()
            .unwrap_or_default()
            .trim_end_matches("ConnectorClientConfigOverridePolicy")
            .to_ascii_lowercase();
        match short.as_str() {
            "none" => Ok(OverridePolicy::None),
            "principal" => Ok(OverridePolicy::Principal),
            "restricted" => Ok(OverridePolicy::Restricted),
            "all" => Ok(OverridePolicy::All),
            _ => Err(ConfigError::InvalidValue {
                key: key.to_owned(),
                value: text.to_owned(),
                reason: "expected one of None, Principal, Restricted, All".into(),
            }),
        }
    }

    /// Whether a client key (without its `consumer.override.` prefix) may be overridden.
    pub fn allows(self, client_key: &str) -> bool {
        match self {
            OverridePolicy::All => true,
            OverridePolicy::None => false,
            OverridePolicy::Principal => matches!(
                client_key,
                "sasl.jaas.config" | "sasl.mechanism" | "security.protocol"
            ),
            OverridePolicy::Restricted => {
                client_key != "bootstrap.servers"
                    && !["security.", "sasl.", "ssl."]
                        .iter()
                        .any(|p| client_key.starts_with(p))
            }
        }
    }

    /// One error per override key of `config` this policy refuses, each naming the key.
    pub fn violations(self, config: &ConfigMap, owner: &str) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        for key in config.keys() {
            let Some(client_key) = OVERRIDE_PREFIXES
                .iter()
                .find_map(|prefix| key.strip_prefix(prefix))
            else {
                continue;
            };
            if !self.allows(client_key) {
                errors.push(ConfigError::InvalidValue {
                    key: key.clone(),
                    value: config[key].clone(),
                    reason: format!(
                        "the client config override policy '{}' of {owner} does not allow \
                         overriding {client_key}{}",
                        self.as_str(),
                        match self {
                            OverridePolicy::Restricted => "; a tenant cannot point a connector at another cluster or change its security settings unless the worker admin sets the tenant's client.config.override.policy to All",
                            OverridePolicy::Principal => "; only sasl.jaas.config, sasl.mechanism and security.protocol may be overridden",
                            _ => "; remove the key",
                        }
                    ),
                });
            }
        }
        errors
    }
}

/// How one connector's tenant shapes how it runs.
#[derive(Clone, Default)]
pub struct TenantScope {
    /// `None` for the `default` tenant, whose names carry no prefix.
    pub prefix: Option<String>,
    pub policy: OverridePolicy,
    /// The budget all the tenant's tasks share, when it has one.
    pub throttle: Option<Arc<Throttle>>,
    /// The bytes all the tenant's tasks hold between poll and commit, and their limit.
    pub inflight: Option<Arc<InflightBytes>>,
}

impl std::fmt::Debug for TenantScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantScope")
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .field("throttled", &self.throttle.is_some())
            .field(
                "inflight_limit",
                &self.inflight.as_ref().and_then(|b| b.limit()),
            )
            .finish()
    }
}

impl TenantScope {
    /// The scope of the `default` tenant under the worker's policy.
    pub fn default_tenant(policy: OverridePolicy) -> TenantScope {
        TenantScope {
            prefix: None,
            policy,
            throttle: None,
            inflight: None,
        }
    }

    /// The tenant's name (`default` for the default tenant), e.g. for metric labels.
    pub fn tenant(&self) -> &str {
        self.prefix.as_deref().unwrap_or("default")
    }

    /// `<tenant>.` before `name`, unless the name has it already; `name` for `default`.
    pub fn prefixed(&self, name: &str) -> String {
        match &self.prefix {
            Some(tenant) if !name.starts_with(&format!("{tenant}.")) => {
                format!("{tenant}.{name}")
            }
            _ => name.to_owned(),
        }
    }

    /// A name the user chose (group id, DLQ topic, transactional id): prefixed unless the
    /// policy is `All`, which trusts the tenant with names of its own.
    fn user_named(&self, name: &str) -> String {
        if self.policy == OverridePolicy::All {
            name.to_owned()
        } else {
            self.prefixed(name)
        }
    }

    /// The consumer or share group id: `connect-<name>` (or the user's `group.id`), with the
    /// tenant's prefix.
    pub fn group_id(&self, config: &SinkConnectorConfig) -> String {
        match config.consumer_overrides.get("group.id") {
            Some(user) => self.user_named(user),
            None => self.prefixed(&config.group_id()),
        }
    }

    /// Puts the tenant's prefix on the names in `config` that Kafka sees: the dead letter
    /// queue topic and producer transactional ids.
    pub fn namespace(&self, config: &mut SinkConnectorConfig) {
        if self.prefix.is_none() {
            return;
        }
        if let Some(dlq) = config.errors.dead_letter_queue.as_mut() {
            dlq.topic = self.user_named(&dlq.topic);
        }
        const TRANSACTIONAL_ID: &str = "producer.override.transactional.id";
        if let Some(id) = config.originals.get(TRANSACTIONAL_ID).cloned() {
            let named = self.user_named(&id);
            config.originals.insert(TRANSACTIONAL_ID.to_owned(), named);
        }
    }
}

type Bucket = RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    DefaultClock,
    governor::middleware::NoOpMiddleware<<DefaultClock as Clock>::Instant>,
>;

/// A tenant's records/s and bytes/s budget, shared by its tasks. A task reports what each
/// poll returned and waits, before polling again, until the budget has paid for it — so a
/// tenant over its budget is slowed down, and no record is ever dropped.
pub struct Throttle {
    buckets: Mutex<Buckets>,
    clock: DefaultClock,
}

#[derive(Default)]
struct Buckets {
    records: Option<(Bucket, u32)>,
    bytes: Option<(Bucket, u32)>,
}

/// What a task still owes the budget, paid before its next poll.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Debt {
    pub records: u64,
    pub bytes: u64,
}

impl Debt {
    pub fn is_paid(&self) -> bool {
        self.records == 0 && self.bytes == 0
    }
}

impl Throttle {
    /// A budget of `records_per_second` and `bytes_per_second` (`None`: unlimited).
    pub fn new(records_per_second: Option<u32>, bytes_per_second: Option<u32>) -> Throttle {
        let throttle = Throttle {
            buckets: Mutex::new(Buckets::default()),
            clock: DefaultClock::default(),
        };
        throttle.set_rates(records_per_second, bytes_per_second);
        throttle
    }

    /// Changes the rates; tasks running under this budget follow from their next poll.
    pub fn set_rates(&self, records_per_second: Option<u32>, bytes_per_second: Option<u32>) {
        let bucket = |rate: Option<u32>| {
            let rate = NonZeroU32::new(rate?)?;
            // A burst of one second's worth: a task may run a second ahead of the budget.
            let bucket =
                RateLimiter::direct_with_clock(Quota::per_second(rate), self.clock.clone());
            Some((bucket, rate.get()))
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.records = bucket(records_per_second);
        buckets.bytes = bucket(bytes_per_second);
    }

    /// Pays as much of `debt` as the budget allows now; returns `None` when all is paid, or
    /// how long to wait before trying again.
    pub fn pay(&self, debt: &mut Debt) -> Option<Duration> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock.now();
        let mut wait: Option<Duration> = None;
        for (owed, bucket) in [
            (&mut debt.records, &buckets.records),
            (&mut debt.bytes, &buckets.bytes),
        ] {
            let Some((bucket, burst)) = bucket else {
                *owed = 0;
                continue;
            };
            while *owed > 0 {
                // Paid in pieces no larger than the burst, which is all a bucket can hold.
                let piece = (*owed).min(u64::from(*burst)) as u32;
                let Some(cells) = NonZeroU32::new(piece) else {
                    break;
                };
                match bucket.check_n(cells) {
                    Ok(Ok(())) => *owed -= u64::from(piece),
                    Ok(Err(not_until)) => {
                        let until = not_until.wait_time_from(now);
                        wait = Some(wait.map_or(until, |w| w.max(until)));
                        break;
                    }
                    // Cannot happen: pieces are at most the burst.
                    Err(_) => {
                        *owed = 0;
                    }
                }
            }
        }
        // Never spin: wait at least a millisecond when something is still owed.
        wait.map(|w| w.max(Duration::from_millis(1)))
    }

    /// Waits (on the calling thread) until `debt` is paid. For tests and blocking callers.
    pub fn pay_blocking(&self, mut debt: Debt) {
        while let Some(wait) = self.pay(&mut debt) {
            std::thread::sleep(wait);
        }
    }
}

/// The bytes (key + value + headers, as [`record_bytes`] weighs them) a tenant's tasks hold
/// between poll and commit, shared by all its tasks, and the tenant's `inflight.bytes` limit.
///
/// A task adds a batch's bytes once the poll returned it (a batch's size is known only then)
/// and polls again only while the total is below the limit, so the total exceeds the limit by
/// at most the batches of polls that started below it: one batch per poll, and one poll per
/// task at a time.
#[derive(Debug, Default)]
pub struct InflightBytes {
    used: AtomicU64,
    /// 0: no limit (the quota is at least 1 when set).
    limit: AtomicU64,
}

impl InflightBytes {
    /// A budget of `limit` bytes in flight (`None`: unlimited, only counted).
    pub fn new(limit: Option<u64>) -> InflightBytes {
        let budget = InflightBytes::default();
        budget.set_limit(limit);
        budget
    }

    /// Changes the limit; running tasks follow from their next poll.
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(0), Ordering::Relaxed);
    }

    pub fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|l| *l > 0)
    }

    /// The bytes held in flight now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether a task may start a poll: the bytes in flight are below the limit.
    pub fn has_room(&self) -> bool {
        self.limit().is_none_or(|limit| self.used() < limit)
    }

    /// Counts `bytes` as in flight until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>, bytes: u64) -> InflightHold {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        InflightHold {
            budget: Arc::clone(self),
            bytes,
        }
    }

    fn release(&self, bytes: u64) {
        // Never below zero, even if a release were counted twice.
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

/// One batch's bytes in an [`InflightBytes`] budget: released when dropped, so a batch
/// committed, dropped, or lost with its task (stop, kill, failure) always gives them back.
#[derive(Debug)]
pub struct InflightHold {
    budget: Arc<InflightBytes>,
    bytes: u64,
}

impl InflightHold {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for InflightHold {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// What a record weighs against the bytes/s and in-flight bytes budgets: key, value and
/// headers.
pub fn record_bytes(record: &spillway_core::RawRecord) -> u64 {
    let len = |b: &Option<bytes::Bytes>| b.as_ref().map_or(0, |b| b.len());
    let headers: usize = record.headers.iter().map(|(k, v)| k.len() + len(v)).sum();
    (len(&record.key) + len(&record.value) + headers) as u64
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    use spillway_core::config::config_map as config;

    fn sink(pairs: &[(&str, &str)]) -> SinkConnectorConfig {
        let mut all = config(&[
            ("name", "orders"),
            ("connector.class", "file"),
            ("topics", "t"),
        ]);
        all.extend(config(pairs));
        SinkConnectorConfig::parse(&all).expect("valid")
    }

    fn tenant(policy: OverridePolicy) -> TenantScope {
        TenantScope {
            prefix: Some("acme".into()),
            policy,
            throttle: None,
            inflight: None,
        }
    }

    #[test]
    fn policies_parse_connects_names_and_class_names() {
        for (text, policy) in [
            ("None", OverridePolicy::None),
            ("principal", OverridePolicy::Principal),
            (
                "org.apache.kafka.connect.connector.policy.AllConnectorClientConfigOverridePolicy",
                OverridePolicy::All,
            ),
            ("Restricted", OverridePolicy::Restricted),
        ] {
            assert_eq!(
                OverridePolicy::parse(OVERRIDE_POLICY, text).expect(text),
                policy
            );
        }
        let err = OverridePolicy::parse(OVERRIDE_POLICY, "some").expect_err("unknown");
        assert!(err.to_string().contains(OVERRIDE_POLICY), "{err}");
    }

    #[test]
    fn restricted_refuses_cluster_and_security_keys_naming_each() {
        let overrides = config(&[
            ("consumer.override.bootstrap.servers", "evil:9092"),
            ("producer.override.sasl.jaas.config", "x"),
            ("admin.override.ssl.truststore.location", "/x"),
            ("consumer.override.security.protocol", "PLAINTEXT"),
            ("consumer.override.max.poll.records", "10"),
            ("consumer.override.group.protocol", "share"),
        ]);
        let refused: Vec<String> = OverridePolicy::Restricted
            .violations(&overrides, "tenant acme")
            .iter()
            .map(|e| e.key().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            refused,
            [
                "admin.override.ssl.truststore.location",
                "consumer.override.bootstrap.servers",
                "consumer.override.security.protocol",
                "producer.override.sasl.jaas.config"
            ]
        );
        let principal = OverridePolicy::Principal.violations(&overrides, "the worker");
        assert_eq!(principal.len(), 4, "{principal:?}");
        assert!(principal[0].to_string().contains("'Principal'"));
        assert_eq!(OverridePolicy::None.violations(&overrides, "x").len(), 6);
        assert!(OverridePolicy::All.violations(&overrides, "x").is_empty());
    }

    #[test]
    fn a_tenants_names_in_kafka_carry_its_prefix() {
        let scope = tenant(OverridePolicy::Restricted);
        assert_eq!(scope.group_id(&sink(&[])), "acme.connect-orders");
        assert_eq!(
            scope.group_id(&sink(&[("consumer.override.group.id", "billing")])),
            "acme.billing"
        );
        assert_eq!(
            scope.group_id(&sink(&[("consumer.override.group.id", "acme.billing")])),
            "acme.billing"
        );
        let mut config = sink(&[
            ("errors.tolerance", "all"),
            ("errors.deadletterqueue.topic.name", "dlq"),
            ("producer.override.transactional.id", "tx"),
        ]);
        scope.namespace(&mut config);
        assert_eq!(
            config.errors.dead_letter_queue.expect("dlq").topic,
            "acme.dlq"
        );
        assert_eq!(
            config.originals["producer.override.transactional.id"],
            "acme.tx"
        );

        let trusted = tenant(OverridePolicy::All);
        assert_eq!(
            trusted.group_id(&sink(&[("consumer.override.group.id", "billing")])),
            "billing"
        );
        assert_eq!(trusted.group_id(&sink(&[])), "acme.connect-orders");

        let default = TenantScope::default_tenant(OverridePolicy::All);
        assert_eq!(default.group_id(&sink(&[])), "connect-orders");
        assert_eq!((scope.tenant(), default.tenant()), ("acme", "default"));
    }

    #[test]
    fn the_budget_holds_a_steady_rate_over_many_small_debts() {
        let throttle = Throttle::new(Some(2000), None);
        let start = Instant::now();
        // 5000 records in polls of 250: one second of burst, then 2000/s.
        for _ in 0..20 {
            throttle.pay_blocking(Debt {
                records: 250,
                bytes: 1_000_000,
            });
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            elapsed >= 1.2,
            "5000 records at 2000/s took only {elapsed:.2}s"
        );
        assert!(elapsed < 5.0, "took {elapsed:.2}s");
    }

    #[test]
    fn a_bytes_budget_slows_down_as_much_as_the_bytes_demand() {
        let throttle = Throttle::new(None, Some(10_000));
        let start = Instant::now();
        // 25 000 bytes at 10 000/s with a 10 000 burst: at least 1.5 s.
        for _ in 0..25 {
            throttle.pay_blocking(Debt {
                records: 1,
                bytes: 1000,
            });
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            elapsed >= 1.4,
            "25 000 bytes at 10 000/s took only {elapsed:.2}s"
        );
        assert!(elapsed < 6.0, "took {elapsed:.2}s");
    }

    #[test]
    fn a_debt_larger_than_the_burst_is_paid_in_pieces() {
        let throttle = Throttle::new(Some(100), Some(1_000_000));
        let mut debt = Debt {
            records: 250,
            bytes: 10,
        };
        let wait = throttle.pay(&mut debt).expect("must wait");
        assert_eq!(debt.records, 150, "one burst paid");
        assert_eq!(debt.bytes, 0);
        assert!(wait <= Duration::from_millis(1100), "{wait:?}");
        // New rates apply to the next payment: lifting the limit ends the wait.
        throttle.set_rates(None, None);
        assert_eq!(throttle.pay(&mut debt), None);
        assert!(debt.is_paid());
        let unlimited = Throttle::new(None, None);
        let mut debt = Debt {
            records: 1 << 40,
            bytes: 1 << 40,
        };
        assert_eq!(unlimited.pay(&mut debt), None);
        assert!(debt.is_paid());
    }

    #[test]
    fn inflight_bytes_are_held_until_dropped_and_never_go_negative() {
        let budget = Arc::new(InflightBytes::new(Some(100)));
        assert!(budget.has_room());
        let first = budget.hold(60);
        assert_eq!(budget.used(), 60);
        assert!(budget.has_room(), "60 of 100");
        let second = budget.hold(70);
        assert_eq!(second.bytes(), 70);
        assert_eq!(budget.used(), 130, "one batch may take it over the limit");
        assert!(!budget.has_room(), "at or above the limit no poll starts");
        drop(first);
        assert_eq!(budget.used(), 70);
        assert!(budget.has_room());
        let exact = budget.hold(30);
        assert!(!budget.has_room(), "exactly at the limit is full");
        drop(exact);
        drop(second);
        assert_eq!(budget.used(), 0);
        // A release larger than what is held stops at zero.
        budget.release(5);
        assert_eq!(budget.used(), 0);
        let held = budget.hold(10);
        budget.release(25);
        assert_eq!(budget.used(), 0);
        drop(held);
        assert_eq!(budget.used(), 0, "never wraps below zero");
    }

    #[test]
    fn inflight_bytes_limit_changes_apply_at_once_and_unlimited_only_counts() {
        let budget = Arc::new(InflightBytes::new(None));
        assert_eq!(budget.limit(), None);
        let held: Vec<InflightHold> = (0..4).map(|_| budget.hold(1 << 20)).collect();
        assert!(budget.has_room(), "no limit: always room");
        assert_eq!(budget.used(), 4 << 20);
        budget.set_limit(Some(1 << 20));
        assert_eq!(budget.limit(), Some(1 << 20));
        assert!(!budget.has_room());
        drop(held);
        assert!(budget.has_room());
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn inflight_bytes_from_many_threads_balance_out() {
        let budget = Arc::new(InflightBytes::new(Some(1)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let budget = Arc::clone(&budget);
                std::thread::spawn(move || {
                    for n in 0..1000 {
                        let _hold = budget.hold(n);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_records_weight_is_its_key_value_and_headers() {
        let mut record = spillway_core::RawRecord::new("t", 0, 0);
        assert_eq!(record_bytes(&record), 0);
        record.key = Some(bytes::Bytes::from_static(b"k1"));
        record.value = Some(bytes::Bytes::from_static(b"value"));
        record
            .headers
            .push(("h".into(), Some(bytes::Bytes::from_static(b"abc"))));
        record.headers.push(("none".into(), None));
        assert_eq!(record_bytes(&record), 2 + 5 + 1 + 3 + 4);
    }
}
