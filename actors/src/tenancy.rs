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

use std::path::PathBuf;

use governor::clock::{Clock, DefaultClock};
use governor::{Quota, RateLimiter};
use spillway_core::config::{ConfigDef, GroupProtocol, Reach, SinkConnectorConfig};
use spillway_core::{ConfigError, ConfigMap};

use crate::egress::EgressPolicy;

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
    /// Named tuning keys only ([`TUNING_KEYS`], librdkafka's and Java's names): every other
    /// key is refused, so no spelling of a cluster address, security setting, file path or
    /// code-loading key gets through. The default of a tenant other than `default`.
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
            OverridePolicy::Restricted => TUNING_KEYS.contains(&client_key),
        }
    }

    /// Whether a connector key naming a Kafka cluster (`Reach::KafkaCluster`, e.g. the kafka
    /// sink's `target.bootstrap.servers`) may be set: only under `All`, as
    /// `consumer.override.bootstrap.servers`.
    pub fn allows_clusters(self) -> bool {
        self == OverridePolicy::All
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
                            OverridePolicy::Restricted => format!(
                                "{}; Restricted allows only these tuning keys: {}. Ask the worker admin to set the tenant's client.config.override.policy to All for anything else",
                                what_it_is(client_key).map(|w| format!(" ({w})")).unwrap_or_default(),
                                TUNING_KEYS.join(", ")
                            ),
                            OverridePolicy::Principal => "; only sasl.jaas.config, sasl.mechanism and security.protocol may be overridden".to_owned(),
                            _ => "; remove the key".to_owned(),
                        }
                    ),
                });
            }
        }
        errors
    }
}

/// The client keys `Restricted` lets a tenant override: tuning of its own clients, in Java's
/// and librdkafka's names. Anything else — where a client connects, how it authenticates,
/// files it reads, code it loads, its identity, logging — is refused by being absent.
pub const TUNING_KEYS: &[&str] = &[
    // Consumer (group membership and fetching).
    "group.id",
    "group.protocol",
    "group.remote.assignor",
    "group.instance.id",
    "partition.assignment.strategy",
    "auto.offset.reset",
    "isolation.level",
    "max.poll.records",
    "max.poll.interval.ms",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.max.wait.ms",
    "fetch.wait.max.ms",
    "fetch.message.max.bytes",
    "fetch.error.backoff.ms",
    "fetch.queue.backoff.ms",
    "max.partition.fetch.bytes",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "check.crcs",
    "share.acknowledgement.mode",
    // Producer (the dead letter queue's, the kafka sink's).
    "acks",
    "linger.ms",
    "batch.size",
    "batch.num.messages",
    "compression.type",
    "compression.codec",
    "compression.level",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "delivery.timeout.ms",
    "message.timeout.ms",
    "retries",
    "message.send.max.retries",
    "buffer.memory",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "max.request.size",
    "message.max.bytes",
    "partitioner",
    "transaction.timeout.ms",
    "transactional.id",
    // Any client.
    "request.timeout.ms",
    "default.api.timeout.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms",
    "socket.keepalive.enable",
    "socket.nagle.disable",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "send.buffer.bytes",
    "receive.buffer.bytes",
    "connections.max.idle.ms",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "client.rack",
];

/// The client keys that name the cluster a client connects to, in Java's and librdkafka's
/// spellings.
pub const CLUSTER_ADDRESS_KEYS: &[&str] = &["bootstrap.servers", "metadata.broker.list"];

/// What a refused client key is, for the message: the dangerous kinds by name.
fn what_it_is(client_key: &str) -> Option<&'static str> {
    const CLUSTER: &[&str] = &[
        "bootstrap.servers",
        "metadata.broker.list",
        "client.dns.lookup",
        "broker.address.family",
        "resolve.canonical.bootstrap.servers.only",
    ];
    const CODE: &[&str] = &[
        "plugin.library.paths",
        "interceptor.classes",
        "metric.reporters",
        "partitioner.class",
        "key.deserializer",
        "value.deserializer",
        "key.serializer",
        "value.serializer",
        "config.providers",
    ];
    if CLUSTER.contains(&client_key) {
        Some("it names where the client connects: another cluster")
    } else if CODE.contains(&client_key) || client_key.ends_with(".class") {
        Some("it makes the worker load code")
    } else if client_key.starts_with("ssl")
        || client_key.starts_with("sasl.")
        || client_key.starts_with("security.")
        || client_key.starts_with("enable.ssl")
        || client_key.contains("oauthbearer")
    {
        Some("a security setting")
    } else if client_key.contains("location") || client_key.contains(".path") {
        Some("a file path on the worker's machine")
    } else {
        None
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
    /// The directory the tenant's paths are confined to (authentication on, a tenant other
    /// than `default`); `None`: paths are taken as written, as Connect does.
    pub files_dir: Option<PathBuf>,
    /// Where the tenant's sinks may connect (same condition); `None`: anywhere.
    pub egress: Option<Arc<EgressPolicy>>,
}

/// Worker key: the directory under which each confined tenant gets a directory of its own
/// (`<tenant.files.dir>/<tenant>`); default `<state.dir>/tenant-files`.
pub const TENANT_FILES_DIR: &str = "tenant.files.dir";

/// How a worker with authentication on confines its tenants (other than `default`, the
/// admin's): their paths, and where their sinks may connect.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// `tenant.files.dir`; `None` when tenants are not confined.
    pub files_dir: Option<PathBuf>,
    pub egress: Option<Arc<EgressPolicy>>,
}

impl Confinement {
    /// Tenants are confined when `auth` (REST authentication) is on; without it every caller
    /// is the admin and paths and addresses are taken as written.
    pub fn from_worker_config(worker: &ConfigMap, auth: bool) -> Result<Confinement, ConfigError> {
        if !auth {
            return Ok(Confinement::default());
        }
        let files_dir = match worker
            .get(TENANT_FILES_DIR)
            .filter(|d| !d.trim().is_empty())
        {
            Some(dir) => PathBuf::from(dir.trim()),
            None => PathBuf::from(
                worker
                    .get("state.dir")
                    .map(String::as_str)
                    .unwrap_or("spillway-state"),
            )
            .join("tenant-files"),
        };
        // Absolute, so that a connector's paths do not depend on the worker's working
        // directory when they are checked.
        let files_dir = std::path::absolute(&files_dir).map_err(|e| ConfigError::InvalidValue {
            key: TENANT_FILES_DIR.into(),
            value: files_dir.display().to_string(),
            reason: format!("cannot make the path absolute ({e})"),
        })?;
        let egress = EgressPolicy::parse(
            worker
                .get(crate::egress::TENANT_EGRESS_ALLOW)
                .map(String::as_str)
                .unwrap_or(""),
        )?;
        Ok(Confinement {
            files_dir: Some(files_dir),
            egress: Some(Arc::new(egress)),
        })
    }

    /// The tenant's own directory and egress policy (none for `default`).
    pub fn for_tenant(&self, tenant: Option<&str>) -> (Option<PathBuf>, Option<Arc<EgressPolicy>>) {
        match tenant {
            None => (None, None),
            Some(tenant) => (
                self.files_dir.as_ref().map(|d| d.join(tenant)),
                self.egress.clone(),
            ),
        }
    }
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
            .field("files_dir", &self.files_dir)
            .field("egress", &self.egress)
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
            files_dir: None,
            egress: None,
        }
    }

    /// What `config` reaches outside the worker that this tenant may not: for each key `def`
    /// declares with a [`Reach`], a path out of the tenant's directory, a Kafka cluster named
    /// under a policy other than `All`, an address the egress policy refuses. Each error names
    /// the key.
    pub fn reach_violations(&self, def: &ConfigDef, config: &ConfigMap) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        for key in def.keys() {
            let (Some(reach), Some(value)) = (key.reach, config.get(&key.name)) else {
                continue;
            };
            if value.trim().is_empty() {
                continue;
            }
            let hosts = match reach {
                Reach::FilePath => {
                    if let Some(root) = &self.files_dir {
                        if let Err(e) = spillway_connectors::paths::confine(root, &key.name, value)
                        {
                            errors.push(e);
                        }
                    }
                    continue;
                }
                Reach::KafkaCluster => {
                    if !self.policy.allows_clusters() {
                        errors.push(ConfigError::InvalidValue {
                            key: key.name.clone(),
                            value: value.clone(),
                            reason: format!(
                                "it names a Kafka cluster, which the client config override policy '{}' does not allow (as it refuses bootstrap.servers overrides); remove it to use the worker's cluster, or ask the worker admin for the policy All",
                                self.policy.as_str()
                            ),
                        });
                        continue;
                    }
                    crate::egress::bootstrap_hosts(value)
                }
                Reach::Hosts(read) => read(value),
            };
            let Some(egress) = &self.egress else {
                continue;
            };
            match hosts {
                Ok(hosts) => {
                    if let Err(e) = egress.check(&key.name, value, &hosts) {
                        errors.push(e);
                    }
                }
                Err(reason) => errors.push(ConfigError::InvalidValue {
                    key: key.name.clone(),
                    value: value.clone(),
                    reason,
                }),
            }
        }
        errors.extend(self.override_cluster_violations(config));
        errors
    }

    /// The cluster addresses a policy that allows them (`All`) lets the tenant's client
    /// overrides name (`consumer.override.bootstrap.servers`, librdkafka's
    /// `metadata.broker.list`, for the consumer, the dead letter queue producer and admin
    /// clients) held to the egress policy like any other address a tenant's connector reaches.
    fn override_cluster_violations(&self, config: &ConfigMap) -> Vec<ConfigError> {
        let Some(egress) = &self.egress else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        for (key, value) in config {
            let Some(client_key) = OVERRIDE_PREFIXES
                .iter()
                .find_map(|prefix| key.strip_prefix(prefix))
            else {
                continue;
            };
            // A policy that refuses the key says so already (OverridePolicy::violations).
            if !CLUSTER_ADDRESS_KEYS.contains(&client_key)
                || !self.policy.allows(client_key)
                || value.trim().is_empty()
            {
                continue;
            }
            let checked = crate::egress::bootstrap_hosts(value)
                .map_err(|reason| ConfigError::InvalidValue {
                    key: key.clone(),
                    value: value.clone(),
                    reason,
                })
                .and_then(|hosts| egress.check(key, value, &hosts));
            if let Err(e) = checked {
                errors.push(e);
            }
        }
        errors
    }

    /// The egress policy a Kafka client of the connector dials under: the tenant's, when
    /// `config` names the cluster under `prefix` (e.g. `consumer.override.bootstrap.servers`),
    /// so the cluster and every broker it advertises are the tenant's choice; `None` for the
    /// worker's own cluster, which its admin chose.
    pub fn kafka_egress(&self, config: &ConfigMap, prefix: &str) -> Option<Arc<EgressPolicy>> {
        let names_cluster = CLUSTER_ADDRESS_KEYS.iter().any(|key| {
            config
                .get(&format!("{prefix}{key}"))
                .is_some_and(|v| !v.trim().is_empty())
        });
        self.egress.clone().filter(|_| names_cluster)
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

    /// The group id under `protocol`: the user's `group.id`, else `connect-<name>` for a
    /// consumer group and `connect-share-<name>` for a share group
    /// ([`SinkConnectorConfig::group_id`]), with the tenant's prefix.
    pub fn group_id(&self, config: &SinkConnectorConfig, protocol: GroupProtocol) -> String {
        match config.consumer_overrides.get("group.id") {
            Some(user) => self.user_named(user),
            None => self.prefixed(&config.group_id(protocol)),
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

    /// Whether the budget limits bytes per second (which count the records' header bytes).
    pub fn limits_bytes(&self) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.bytes.is_some()
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
            files_dir: None,
            egress: None,
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
    fn restricted_is_an_allow_list_every_alias_of_a_cluster_or_code_is_refused() {
        let refused = [
            "consumer.override.metadata.broker.list",
            "producer.override.metadata.broker.list",
            "admin.override.bootstrap.servers",
            "consumer.override.plugin.library.paths",
            "consumer.override.interceptor.classes",
            "producer.override.partitioner.class",
            "consumer.override.sasl.kerberos.kinit.cmd",
            "consumer.override.ssl.ca.location",
            "consumer.override.ssl_engine_id",
            "consumer.override.enable.ssl.certificate.verification",
            "consumer.override.sasl.oauthbearer.token.endpoint.url",
            "consumer.override.client.dns.lookup",
            "consumer.override.client.id",
            "consumer.override.debug",
            "consumer.override.oauthbearer_token_refresh_cb",
        ];
        for key in refused {
            let config = config(&[(key, "x")]);
            let errors = OverridePolicy::Restricted.violations(&config, "tenant acme");
            assert_eq!(errors.len(), 1, "{key} must be refused");
            assert_eq!(errors[0].key(), Some(key));
        }
        let message = OverridePolicy::Restricted.violations(
            &config(&[("consumer.override.metadata.broker.list", "x")]),
            "t",
        )[0]
        .to_string();
        assert!(message.contains("another cluster"), "{message}");
        let message = OverridePolicy::Restricted.violations(
            &config(&[("consumer.override.plugin.library.paths", "x")]),
            "t",
        )[0]
        .to_string();
        assert!(message.contains("load code"), "{message}");
        let tuning = config(&[
            ("consumer.override.max.poll.records", "10"),
            ("consumer.override.fetch.wait.max.ms", "100"),
            ("producer.override.linger.ms", "5"),
            ("producer.override.compression.type", "zstd"),
            ("admin.override.request.timeout.ms", "1000"),
        ]);
        assert!(OverridePolicy::Restricted
            .violations(&tuning, "t")
            .is_empty());
    }

    /// A sink whose keys reach outside the worker in each way.
    fn reaching_def() -> ConfigDef {
        use spillway_core::config::{ConfigKey, ConfigType, Importance};
        fn url(value: &str) -> Result<Vec<(String, u16)>, String> {
            Ok(vec![(value.to_owned(), 80)])
        }
        let key = |name: &str, reach| {
            ConfigKey::new(name, ConfigType::String, Importance::High, "")
                .null_default()
                .reaches(reach)
        };
        ConfigDef::new()
            .define(key("file", Reach::FilePath))
            .define(key("target", Reach::KafkaCluster))
            .define(key("url", Reach::Hosts(url)))
    }

    #[test]
    fn a_confined_tenant_is_held_to_its_directory_its_policy_and_the_egress_policy() {
        let def = reaching_def();
        let mut scope = tenant(OverridePolicy::Restricted);
        scope.files_dir = Some(PathBuf::from("/srv/tenants/acme"));
        scope.egress = Some(Arc::new(EgressPolicy::default()));
        let bad = config(&[
            ("file", "/etc/passwd"),
            ("target", "elsewhere:9092"),
            ("url", "127.0.0.1"),
        ]);
        let errors = scope.reach_violations(&def, &bad);
        let keys: Vec<_> = errors.iter().filter_map(|e| e.key()).collect();
        assert_eq!(keys, ["file", "target", "url"], "{errors:?}");
        // Under All a cluster may be named, but the egress policy still applies to it.
        scope.policy = OverridePolicy::All;
        let errors = scope.reach_violations(&def, &config(&[("target", "127.0.0.1:9092")]));
        assert!(errors[0].to_string().contains("loopback"), "{errors:?}");
        // Not confined (the default tenant, or authentication off): taken as written.
        let default = TenantScope::default_tenant(OverridePolicy::All);
        assert!(default.reach_violations(&def, &bad).is_empty());
        let fine = config(&[("file", "out.txt"), ("url", "8.8.8.8")]);
        scope.policy = OverridePolicy::Restricted;
        assert!(scope.reach_violations(&def, &fine).is_empty());
    }

    #[test]
    fn kafka_clients_dial_under_the_egress_policy_only_for_a_cluster_the_tenant_named() {
        let mut scope = TenantScope::default();
        let named = config(&[("consumer.override.bootstrap.servers", "k:9092")]);
        assert!(scope.kafka_egress(&named, "consumer.override.").is_none());
        scope.egress = Some(Arc::new(EgressPolicy::default()));
        assert!(scope.kafka_egress(&named, "consumer.override.").is_some());
        // The worker's own cluster (no override) and another client's override: no policy.
        assert!(scope
            .kafka_egress(&config(&[]), "consumer.override.")
            .is_none());
        assert!(scope.kafka_egress(&named, "producer.override.").is_none());
        let alias = config(&[("producer.override.metadata.broker.list", "k:9092")]);
        assert!(scope.kafka_egress(&alias, "producer.override.").is_some());
    }

    #[test]
    fn cluster_overrides_under_all_are_held_to_the_egress_policy() {
        let def = reaching_def();
        let mut scope = tenant(OverridePolicy::All);
        scope.egress = Some(Arc::new(EgressPolicy::default()));
        let internal = config(&[
            ("consumer.override.bootstrap.servers", "127.0.0.1:9092"),
            (
                "producer.override.metadata.broker.list",
                "PLAINTEXT://10.1.2.3:9092",
            ),
            (
                "admin.override.bootstrap.servers",
                "8.8.8.8:9092,[::1]:9093",
            ),
            ("consumer.override.metadata.broker.list", "nohost"),
        ]);
        let errors = scope.reach_violations(&def, &internal);
        let keys: Vec<_> = errors.iter().filter_map(|e| e.key()).collect();
        assert_eq!(
            keys,
            [
                "admin.override.bootstrap.servers",
                "consumer.override.bootstrap.servers",
                "consumer.override.metadata.broker.list",
                "producer.override.metadata.broker.list",
            ],
            "{errors:?}"
        );
        for error in errors
            .iter()
            .filter(|e| e.key() != Some("consumer.override.metadata.broker.list"))
        {
            assert!(
                error
                    .to_string()
                    .contains(crate::egress::TENANT_EGRESS_ALLOW),
                "{error}"
            );
        }
        let public = config(&[("consumer.override.bootstrap.servers", "8.8.8.8:9092")]);
        assert!(scope.reach_violations(&def, &public).is_empty());
        // Allowed by the worker's list.
        scope.egress = Some(Arc::new(EgressPolicy::parse("127.0.0.0/8").expect("valid")));
        let listed = config(&[("consumer.override.bootstrap.servers", "127.0.0.1:9092")]);
        assert!(scope.reach_violations(&def, &listed).is_empty());
        // Under Restricted the key itself is refused (by the policy, once).
        scope.policy = OverridePolicy::Restricted;
        scope.egress = Some(Arc::new(EgressPolicy::default()));
        assert!(scope.reach_violations(&def, &internal).is_empty());
        assert_eq!(scope.policy.violations(&internal, "tenant acme").len(), 4);
        // The admin's default tenant is not confined.
        let default = TenantScope::default_tenant(OverridePolicy::All);
        assert!(default.reach_violations(&def, &internal).is_empty());
    }

    #[test]
    fn confinement_comes_with_authentication_only() {
        let worker = config(&[("state.dir", "/var/spillway")]);
        let off = Confinement::from_worker_config(&worker, false).expect("valid");
        assert_eq!(off.for_tenant(Some("acme")).0, None);
        let on = Confinement::from_worker_config(&worker, true).expect("valid");
        assert_eq!(
            on.for_tenant(Some("acme")).0,
            Some(PathBuf::from("/var/spillway/tenant-files/acme"))
        );
        assert_eq!(on.for_tenant(None).0, None, "the admin's default tenant");
        let mut worker = worker;
        worker.insert(TENANT_FILES_DIR.into(), "/data/t".into());
        worker.insert("tenant.egress.allow".into(), "nonsense".into());
        assert!(Confinement::from_worker_config(&worker, true).is_err());
        worker.remove("tenant.egress.allow");
        assert_eq!(
            Confinement::from_worker_config(&worker, true)
                .expect("valid")
                .for_tenant(Some("b"))
                .0,
            Some(PathBuf::from("/data/t/b"))
        );
    }

    #[test]
    fn a_tenants_names_in_kafka_carry_its_prefix() {
        let scope = tenant(OverridePolicy::Restricted);
        assert_eq!(
            scope.group_id(&sink(&[]), GroupProtocol::Classic),
            "acme.connect-orders"
        );
        assert_eq!(
            scope.group_id(
                &sink(&[("consumer.override.group.id", "billing")]),
                GroupProtocol::Share
            ),
            "acme.billing"
        );
        assert_eq!(
            scope.group_id(
                &sink(&[("consumer.override.group.id", "acme.billing")]),
                GroupProtocol::Share
            ),
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
            trusted.group_id(
                &sink(&[("consumer.override.group.id", "billing")]),
                GroupProtocol::Share
            ),
            "billing"
        );
        assert_eq!(
            trusted.group_id(&sink(&[]), GroupProtocol::Classic),
            "acme.connect-orders"
        );

        let default = TenantScope::default_tenant(OverridePolicy::All);
        assert_eq!(
            default.group_id(&sink(&[]), GroupProtocol::Classic),
            "connect-orders"
        );
        assert_eq!(
            default.group_id(&sink(&[]), GroupProtocol::Share),
            "connect-share-orders"
        );
        assert_eq!(
            scope.group_id(&sink(&[]), GroupProtocol::Share),
            "acme.connect-share-orders"
        );
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
        assert!(throttle.limits_bytes());
        throttle.set_rates(None, None);
        assert!(!throttle.limits_bytes());
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
