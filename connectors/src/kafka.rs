//! The `kafka` sink: MirrorMaker-style replication into a target cluster (the source cluster
//! unless `target.bootstrap.servers` says otherwise), into the topic `topic.rename.format`
//! names (`${topic}` is the record's topic after transforms).
//!
//! Key, value, headers and timestamp are written as read: the record is serialized back with
//! the connector's own converters (the `bytearray` default passes the original bytes through).
//! The partition is kept (`target.partition=keep`, the target topic needs at least as many
//! partitions) or chosen by hashing the key (`hash`). With `source.headers` (the default), every
//! written record also carries where it was read as headers ([`SOURCE_TOPIC_HEADER`] and
//! friends, the original coordinates, before transforms), replacing headers of those names it
//! had; without, it carries its own headers only, as MirrorMaker 2's copies do (mirror flows'
//! default: the three headers cost librdkafka an allocation each per record).
//!
//! `delivery.guarantee`:
//! - `at_least_once` (default): an idempotent producer; `put` returns only once the target
//!   confirmed every record, so an accepted source record is in the target (a crash between
//!   the write and the acknowledgement writes it again).
//! - `exactly_once`: transactions ([`spillway_eos::writer`]); in share mode with the ledger on
//!   `delivery.ledger.topic`, in classic mode with a checkpoint per source partition on that
//!   topic (where a reassigned partition resumes) and, when the target is the source cluster,
//!   the consumer's offsets in the transaction ([`target_is_source`]). docs/exactly-once.md
//!   has the details.
//!
//! A mirror flow (`offset.syncs.topic` set) also writes MirrorMaker 2's offset syncs
//! ([`crate::kafka_offset_syncs`]): on the target, or on the cluster
//! `offset.syncs.bootstrap.servers` names (MM2's default location, the source) with a producer of
//! their own, after the copies' transaction commits under exactly-once.
//!
//! When tracing is on, each record's `traceparent`/`tracestate` headers are replaced by the
//! context of the runtime's `put` span (see docs/observability.md), so the trace goes on.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Reach, Validator};
use spillway_core::connector::replicate_task_configs;
use spillway_core::convert::{strip_prefix, RecordConverter};
use spillway_core::egress::EgressPolicy;
use spillway_core::{
    Assignment, ConfigError, ConfigMap, ConsumerGroupMetadata, PutOutcome, RecordCoordinates,
    SinkConnector, SinkError, SinkRecord, SinkTask, Topic, TopicPartition,
};
use spillway_eos::writer::{ExactlyOnceWriter, GroupOffsets, LedgerSettings, WriterSettings};
use spillway_kafka::classic::GroupMetadata;
use spillway_kafka::cluster::Cluster;
use spillway_kafka::producer::{IdempotentProducer, OutRecord, Written};
use spillway_kafka::security::SecuritySettings;

use crate::kafka_mirror_metrics::{
    now_ms, MirrorMetrics, SOURCE_CLUSTER_ALIAS, TARGET_CLUSTER_ALIAS,
};
use crate::kafka_offset_syncs::{
    OffsetSyncs, OFFSET_LAG_MAX, OFFSET_SYNCS_BOOTSTRAP_SERVERS, OFFSET_SYNCS_PRODUCER_PREFIX,
    OFFSET_SYNCS_TOPIC,
};
use crate::runtime_keys::{SOURCE_BOOTSTRAP_SERVERS, TASK_ID, TENANT_PREFIX};
use crate::topic_table::TopicTable;

pub const TARGET_BOOTSTRAP_SERVERS: &str = "target.bootstrap.servers";
pub const TOPIC_RENAME_FORMAT: &str = "topic.rename.format";
pub const TARGET_PARTITION: &str = "target.partition";
pub const PRODUCER_OVERRIDE_PREFIX: &str = "producer.override.";
pub const DELIVERY_GUARANTEE: &str = "delivery.guarantee";
pub const LEDGER_TOPIC: &str = "delivery.ledger.topic";
pub const LEDGER_CACHE_DIR: &str = "delivery.ledger.cache.dir";
pub const LOCK_MARGIN_MS: &str = "delivery.lock.margin.ms";
pub const TRANSACTION_TIMEOUT_MS: &str = "delivery.transaction.step.timeout.ms";
pub const TRANSACTIONAL_ID_PREFIX: &str = "transactional.id.prefix";
/// Connect's KIP-618 names: `poll` (a transaction per batch) or `interval`.
pub const TRANSACTION_BOUNDARY: &str = "transaction.boundary";
pub const TRANSACTION_BOUNDARY_INTERVAL_MS: &str = "transaction.boundary.interval.ms";
pub const SOURCE_HEADERS: &str = "source.headers";

/// Headers a written record carries with `source.headers`: where its source record was read.
pub const SOURCE_TOPIC_HEADER: &str = "spillway.source.topic";
pub const SOURCE_PARTITION_HEADER: &str = "spillway.source.partition";
pub const SOURCE_OFFSET_HEADER: &str = "spillway.source.offset";

/// The ledger topic's name when `delivery.ledger.topic` is not set.
pub fn default_ledger_topic(connector: &str) -> String {
    format!("__spillway_eos_ledger.{connector}")
}

/// Names `connector.class` may use for this sink.
pub const NAMES: &[&str] = &["kafka", "KafkaSink", "KafkaSinkConnector"];

fn config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                TARGET_BOOTSTRAP_SERVERS,
                ConfigType::String,
                Importance::High,
                "Bootstrap servers of the target cluster; the source cluster when not set.",
            )
            .null_default()
            .reaches(Reach::KafkaCluster)
            .display_name("Target bootstrap servers"),
        )
        .define(
            ConfigKey::new(
                TOPIC_RENAME_FORMAT,
                ConfigType::String,
                Importance::High,
                "Target topic name; ${topic} stands for the record's topic.",
            )
            .default("${topic}")
            .display_name("Topic rename format"),
        )
        .define(
            ConfigKey::new(
                TARGET_PARTITION,
                ConfigType::String,
                Importance::Medium,
                "keep: write to the source record's partition; hash: let the key's hash choose.",
            )
            .default("keep")
            .validator(Validator::OneOf(&["keep", "hash"]))
            .display_name("Target partition"),
        )
        .define(
            ConfigKey::new(
                SOURCE_HEADERS,
                ConfigType::Boolean,
                Importance::Low,
                "Write the source record's topic, partition and offset (before transforms) as \
                 headers spillway.source.topic, spillway.source.partition and \
                 spillway.source.offset on every copy, replacing headers of those names it \
                 had. false: a copy carries its own headers only (spillway mirror's default, \
                 as MirrorMaker 2's copies).",
            )
            .default("true")
            .display_name("Source coordinate headers"),
        )
        .define(
            ConfigKey::new(
                DELIVERY_GUARANTEE,
                ConfigType::String,
                Importance::High,
                "at_least_once: an idempotent producer (a crash may write a record twice); \
                 exactly_once: producer transactions, with a ledger topic in share mode; in \
                 classic mode with a checkpoint per source partition on it, and the consumer \
                 offsets in the transaction when the target is the source cluster (else committed \
                 to the source after it).",
            )
            .default("at_least_once")
            .validator(Validator::OneOf(&["at_least_once", "exactly_once"]))
            .display_name("Delivery guarantee"),
        )
        .define(
            ConfigKey::new(
                LEDGER_TOPIC,
                ConfigType::String,
                Importance::Medium,
                "exactly_once: the compacted topic on the target cluster that records which \
                 source records have committed output (share mode: per record; classic mode: \
                 a checkpoint per source partition); it must exist. Default \
                 __spillway_eos_ledger.<connector name>.",
            )
            .null_default()
            .display_name("Ledger topic"),
        )
        .define(
            ConfigKey::new(
                LEDGER_CACHE_DIR,
                ConfigType::String,
                Importance::Low,
                "Where a task caches the ledger (sled, rebuilt from the topic on start). \
                 Default: <temp dir>/spillway-eos/<transactional id>. A tenant's path is \
                 relative to its directory (docs/tenants.md).",
            )
            .null_default()
            .reaches(Reach::FilePath)
            .display_name("Ledger cache directory"),
        )
        .define(
            ConfigKey::new(
                LOCK_MARGIN_MS,
                ConfigType::Long,
                Importance::Low,
                "exactly_once in share mode: a transaction must commit at least this long \
                 before its records' acquisition locks expire, else it is aborted and they \
                 are released.",
            )
            .default("5000")
            .validator(Validator::AtLeast(0))
            .display_name("Lock safety margin (ms)"),
        )
        .define(
            ConfigKey::new(
                TRANSACTION_TIMEOUT_MS,
                ConfigType::Long,
                Importance::Low,
                "Longest one transaction step (init, offsets, commit, abort) may take.",
            )
            .default("30000")
            .validator(Validator::AtLeast(1))
            .display_name("Transaction step timeout (ms)"),
        )
        .define(
            ConfigKey::new(
                TRANSACTION_BOUNDARY,
                ConfigType::String,
                Importance::Medium,
                "exactly_once in classic mode: poll commits a transaction for every batch \
                 (max.poll.records); interval lets one transaction hold several batches, \
                 committed when transaction.boundary.interval.ms has passed since its first, \
                 when the task's in-flight batches (task.inflight.batches) all wait for it, \
                 before partitions are reassigned and on stop. Fewer commits cost less per \
                 record; the batches' offsets are committed, and the copies visible to \
                 read_committed readers, only then, and a failed transaction fails the task, \
                 whose restart reads its batches again from the last commit. Share mode takes \
                 poll only (the records' acquisition locks run while they wait). Ignored under \
                 at_least_once.",
            )
            .default("poll")
            .validator(Validator::OneOf(&["poll", "interval"]))
            .display_name("Transaction boundary"),
        )
        .define(
            ConfigKey::new(
                TRANSACTION_BOUNDARY_INTERVAL_MS,
                ConfigType::Long,
                Importance::Low,
                "transaction.boundary=interval: the longest a transaction stays open after its \
                 first batch. Kafka Connect falls back to offset.flush.interval.ms (60 s); \
                 Spillway's default is 1 s, so that copies are not held back from \
                 read_committed readers for long.",
            )
            .default("1000")
            .validator(Validator::AtLeast(1))
            .display_name("Transaction boundary interval (ms)"),
        )
        .define(
            ConfigKey::new(
                SOURCE_CLUSTER_ALIAS,
                ConfigType::String,
                Importance::Low,
                "MirrorMaker 2 flows (spillway mirror): the source cluster's alias; with \
                 target.cluster.alias, the sink records MM2's replication metrics.",
            )
            .null_default()
            .display_name("Source cluster alias"),
        )
        .define(
            ConfigKey::new(
                OFFSET_SYNCS_TOPIC,
                ConfigType::String,
                Importance::Low,
                "MirrorMaker 2 flows: the topic that receives offset syncs (source offset to \
                 target offset, docs/mirror.md), on the target cluster unless \
                 offset.syncs.bootstrap.servers names another.",
            )
            .null_default()
            .display_name("Offset syncs topic"),
        )
        .define(
            ConfigKey::new(
                OFFSET_SYNCS_BOOTSTRAP_SERVERS,
                ConfigType::String,
                Importance::Low,
                "MirrorMaker 2 flows: the cluster of the offset syncs topic when it is not the \
                 target (MM2's offset-syncs.topic.location=source: the source cluster), written \
                 by a producer of its own with the offset.syncs.producer.* keys; under \
                 exactly_once, after the copies' transaction commits.",
            )
            .null_default()
            .reaches(Reach::KafkaCluster)
            .display_name("Offset syncs bootstrap servers"),
        )
        .define(
            ConfigKey::new(
                OFFSET_LAG_MAX,
                ConfigType::Long,
                Importance::Low,
                "MirrorMaker 2 flows: at most this many source offsets between two offset syncs \
                 of a partition.",
            )
            .default("100")
            .validator(Validator::AtLeast(0))
            .display_name("Offset lag max"),
        )
        .define(
            ConfigKey::new(
                TARGET_CLUSTER_ALIAS,
                ConfigType::String,
                Importance::Low,
                "MirrorMaker 2 flows (spillway mirror): the target cluster's alias.",
            )
            .null_default()
            .display_name("Target cluster alias"),
        )
        .define(
            ConfigKey::new(
                TRANSACTIONAL_ID_PREFIX,
                ConfigType::String,
                Importance::Low,
                "Transactional ids are <prefix>-[<tenant>-]<connector>-<task>: stable, so a \
                 restarted task fences its predecessor.",
            )
            .default("spillway")
            .validator(Validator::NonEmptyString)
            .display_name("Transactional id prefix"),
        )
}

/// Whether `config` asks for exactly-once (after validation).
fn exactly_once(config: &ConfigMap) -> bool {
    config.get(DELIVERY_GUARANTEE).map(|v| v.trim()) == Some("exactly_once")
}

/// The tenant whose prefix the names this sink derives in Kafka carry (set by the runtime).
fn tenant_prefix(config: &ConfigMap) -> Option<&str> {
    config
        .get(TENANT_PREFIX)
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
}

/// `<tenant>.name` for a tenant's connector (unless the name has it already), as the runtime
/// names group ids: so two tenants' connectors of one name never share a transactional id,
/// a ledger topic or a ledger cache.
fn tenant_scoped(config: &ConfigMap, name: String) -> String {
    match tenant_prefix(config) {
        Some(tenant) if !name.starts_with(&format!("{tenant}.")) => format!("{tenant}.{name}"),
        _ => name,
    }
}

/// The ledger topic: `delivery.ledger.topic` or `__spillway_eos_ledger.<connector>`, with the
/// tenant's prefix for a tenant's connector.
pub fn ledger_topic(config: &ConfigMap) -> String {
    let name = config
        .get("name")
        .map(String::as_str)
        .unwrap_or("connector");
    let topic = config
        .get(LEDGER_TOPIC)
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map_or_else(|| default_ledger_topic(name), str::to_owned);
    tenant_scoped(config, topic)
}

/// The stable transactional id of one task: `[<tenant>.]<prefix>-<connector>-<task>`.
pub fn transactional_id(config: &ConfigMap) -> String {
    let prefix = config
        .get(TRANSACTIONAL_ID_PREFIX)
        .map(String::as_str)
        .unwrap_or("spillway");
    let name = config
        .get("name")
        .map(String::as_str)
        .unwrap_or("connector");
    let task = config.get(TASK_ID).map(String::as_str).unwrap_or("0");
    tenant_scoped(config, format!("{prefix}-{name}-{task}"))
}

/// The offset syncs due after the copies of `sources` were written with `results`.
fn offset_syncs_due<E>(
    syncs: &mut OffsetSyncs,
    sources: &[(RecordCoordinates, Option<Instant>)],
    results: &[Result<Written, E>],
) -> Vec<OutRecord> {
    sources
        .iter()
        .zip(results)
        .filter_map(|((source, _), r)| {
            let w = r.as_ref().ok()?;
            syncs.copied(&source.topic, source.partition, source.offset, w.offset)
        })
        .collect()
}

/// Per source topic, what every record of it shares: its target topic and the bytes of its
/// source topic and partition headers, made once instead of once per record.
#[derive(Default)]
struct PerTopic {
    topics: TopicTable<TopicNames>,
}

struct TopicNames {
    target: Topic,
    header: Bytes,
    /// The partition header's bytes, by partition.
    partitions: BTreeMap<i32, Bytes>,
}

impl PerTopic {
    fn names(&mut self, format: &str, topic: &Topic) -> &mut TopicNames {
        self.topics.get_or_insert_with(topic, || TopicNames {
            target: Topic::interned(&rename(format, topic)),
            header: topic.as_static().map_or_else(
                || Bytes::copy_from_slice(topic.as_bytes()),
                |name| Bytes::from_static(name.as_bytes()),
            ),
            partitions: BTreeMap::new(),
        })
    }
}

impl TopicNames {
    fn partition_header(&mut self, partition: i32) -> Bytes {
        self.partitions
            .entry(partition)
            .or_insert_with(|| {
                partition_text(partition).map_or_else(
                    || Bytes::from(partition.to_string()),
                    |text| Bytes::from_static(text.as_bytes()),
                )
            })
            .clone()
    }
}

/// Partitions whose header text comes from [`partition_text`].
const STATIC_PARTITIONS: usize = 10_000;

/// `partition` in decimal, from text made once for the process, so that a header value made
/// from it is cloned without a reference count (a copy's source headers were three counter
/// increments and decrements per record; issue 18). `None` past [`STATIC_PARTITIONS`].
fn partition_text(partition: i32) -> Option<&'static str> {
    static TEXT: LazyLock<String> =
        LazyLock::new(|| (0..STATIC_PARTITIONS).map(|n| n.to_string()).collect());
    let n = usize::try_from(partition)
        .ok()
        .filter(|n| *n < STATIC_PARTITIONS)?;
    // The numbers of one width follow those of the width before: 10 of one digit, 90 of two...
    let (start, width) = match n {
        0..=9 => (n, 1),
        10..=99 => (10 + (n - 10) * 2, 2),
        100..=999 => (190 + (n - 100) * 3, 3),
        _ => (2890 + (n - 1000) * 4, 4),
    };
    Some(&TEXT[start..start + width])
}

/// Appends `n` in decimal to `out`.
fn write_decimal(n: i64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// The source offsets of one `put`'s records in decimal, in one buffer: each record's offset
/// header is a slice of it (a reference count), not an allocation of its own.
struct Decimals {
    text: Bytes,
    /// Where each number ends in `text`; it starts where the one before ends.
    ends: Vec<usize>,
}

impl Decimals {
    fn of(offsets: impl ExactSizeIterator<Item = i64>) -> Decimals {
        let mut text = Vec::with_capacity(offsets.len() * 8);
        let mut ends = Vec::with_capacity(offsets.len());
        for n in offsets {
            write_decimal(n, &mut text);
            ends.push(text.len());
        }
        Decimals {
            text: Bytes::from(text),
            ends,
        }
    }

    /// The `i`th number's digits.
    fn get(&self, i: usize) -> Bytes {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.slice(start..self.ends[i])
    }
}

/// The headers a copy is written with. With `source.headers` (`offset` is the source offset in
/// decimal): the record's own with its source coordinates set, replacing older ones of those
/// names; `names` holds the source topic's shared bytes. Without (`offset` is `None`): the
/// record's own as they are, as MirrorMaker 2 copies them. The source headers' names are
/// borrowed constants, the record's own names moved.
fn copy_headers(
    headers: Vec<(String, Option<Bytes>)>,
    source: &RecordCoordinates,
    names: &mut TopicNames,
    offset: Option<Bytes>,
) -> Vec<(Cow<'static, str>, Option<Bytes>)> {
    let Some(offset) = offset else {
        return headers
            .into_iter()
            .map(|(k, v)| (Cow::Owned(k), v))
            .collect();
    };
    // Collected in place (a `Cow<str>` is the size of a `String`).
    let mut out: Vec<(Cow<'static, str>, Option<Bytes>)> = headers
        .into_iter()
        .filter(|(k, _)| {
            k != SOURCE_TOPIC_HEADER && k != SOURCE_PARTITION_HEADER && k != SOURCE_OFFSET_HEADER
        })
        .map(|(k, v)| (Cow::Owned(k), v))
        .collect();
    out.reserve_exact(3);
    out.push((
        Cow::Borrowed(SOURCE_TOPIC_HEADER),
        Some(names.header.clone()),
    ));
    out.push((
        Cow::Borrowed(SOURCE_PARTITION_HEADER),
        Some(names.partition_header(source.partition)),
    ));
    out.push((Cow::Borrowed(SOURCE_OFFSET_HEADER), Some(offset)));
    out
}

/// The connector: every task gets the same configuration.
#[derive(Default)]
pub struct KafkaSinkConnector {
    config: ConfigMap,
}

impl SinkConnector for KafkaSinkConnector {
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_def(&self) -> ConfigDef {
        config_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        config_def().parse(config)?;
        target_bootstrap(config)?;
        let format = config
            .get(TOPIC_RENAME_FORMAT)
            .map(String::as_str)
            .unwrap_or("${topic}");
        if format.trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                key: TOPIC_RENAME_FORMAT.into(),
                value: format.into(),
                reason: "must name a topic; use ${topic} for the source topic's name".into(),
            });
        }
        let boundary = config.get(TRANSACTION_BOUNDARY).map(|v| v.trim());
        let protocol = config
            .get("consumer.override.group.protocol")
            .map(|v| v.trim().to_ascii_lowercase());
        if exactly_once(config)
            && boundary == Some("interval")
            && protocol.as_deref() == Some("share")
        {
            return Err(ConfigError::InvalidValue {
                key: TRANSACTION_BOUNDARY.into(),
                value: "interval".into(),
                reason: "share mode (consumer.override.group.protocol=share) commits every \
                         batch's transaction while its records' acquisition locks run; use poll, \
                         or classic mode"
                    .into(),
            });
        }
        if exactly_once(config) && boundary == Some("interval") {
            check_boundary_interval(config)?;
        }
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(KafkaSinkTask::default())
    }

    fn task_commits_offsets(&self) -> bool {
        exactly_once(&self.config) && target_is_source(&self.config)
    }
}

/// librdkafka's and Kafka's producer default for `transaction.timeout.ms`.
const DEFAULT_TRANSACTION_TIMEOUT_MS: i64 = 60_000;

/// `transaction.boundary=interval`: a transaction must be able to stay open for the interval
/// (plus its commit), or the broker aborts it first and every such transaction fails the task.
fn check_boundary_interval(config: &ConfigMap) -> Result<(), ConfigError> {
    let parsed = config_def().parse(config)?;
    let interval = parsed.long(TRANSACTION_BOUNDARY_INTERVAL_MS)?;
    let timeout_key = format!("{PRODUCER_OVERRIDE_PREFIX}transaction.timeout.ms");
    let timeout = match config.get(&timeout_key) {
        Some(v) => v
            .trim()
            .parse::<i64>()
            .map_err(|_| ConfigError::InvalidValue {
                key: timeout_key.clone(),
                value: v.clone(),
                reason: "expected a number of milliseconds".into(),
            })?,
        None => DEFAULT_TRANSACTION_TIMEOUT_MS,
    };
    if interval >= timeout {
        return Err(ConfigError::InvalidValue {
            key: TRANSACTION_BOUNDARY_INTERVAL_MS.into(),
            value: interval.to_string(),
            reason: format!(
                "must be shorter than the producer's transaction.timeout.ms ({timeout} ms, \
                 {timeout_key}), or the broker aborts each transaction before it is committed; \
                 lower it or raise {timeout_key}"
            ),
        });
    }
    Ok(())
}

/// Whether the target is the cluster the connector reads from: `target.bootstrap.servers` is
/// not set, or names a broker `source.bootstrap.servers` names too. Only then can the consumer
/// group's offsets go into the target's transactions; for another cluster (a mirror flow) the
/// runtime commits them to the source after each transaction ([`GroupOffsets::AfterCommit`]).
/// A target reached under other names than the source is taken for another cluster, which is
/// exactly-once as well (by the ledger's checkpoints).
pub fn target_is_source(config: &ConfigMap) -> bool {
    let brokers = |key: &str| -> Vec<String> {
        config
            .get(key)
            .map(|list| {
                list.split(',')
                    .map(|b| {
                        let b = b.trim();
                        // `PLAINTEXT://host:port` and `host:port` name the same broker.
                        b.split_once("://")
                            .map_or(b, |(_, a)| a)
                            .to_ascii_lowercase()
                    })
                    .filter(|b| !b.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    };
    let target = brokers(TARGET_BOOTSTRAP_SERVERS);
    target.is_empty()
        || brokers(SOURCE_BOOTSTRAP_SERVERS)
            .iter()
            .any(|b| target.contains(b))
}

/// A confined tenant's target cluster (`target.bootstrap.servers` naming another cluster than
/// the source) is held to the worker's egress policy before the producer exists: librdkafka
/// dials on its own, so the native client contacts the target under the policy and judges
/// every broker it advertises. After this check, librdkafka's own dials are not judged.
async fn vet_target(
    config: &ConfigMap,
    bootstrap: &str,
    producer_overrides: &ConfigMap,
) -> Result<(), SinkError> {
    vet_cluster(
        config,
        TARGET_BOOTSTRAP_SERVERS,
        bootstrap,
        producer_overrides,
    )
    .await
}

/// [`vet_target`] for the cluster `key` names (`bootstrap`), reached with `client_keys`.
async fn vet_cluster(
    config: &ConfigMap,
    key: &str,
    bootstrap: &str,
    client_keys: &ConfigMap,
) -> Result<(), SinkError> {
    let policy = EgressPolicy::from_plugin_config(config)
        .map_err(|e| SinkError::task_level(e.to_string()))?;
    let Some(policy) = policy.filter(|_| !target_is_source(config)) else {
        return Ok(());
    };
    let security = SecuritySettings::from_config(client_keys)
        .and_then(|s| s.client_security())
        .map_err(|e| SinkError::task_level(e.to_string()))?
        .with_egress(Some(Arc::new(policy)));
    Cluster::vet_egress(bootstrap, security).await.map_err(|e| {
        let message = format!("{key}={bootstrap}: {e}");
        if e.is_egress_refusal() {
            SinkError::task_level(message)
        } else {
            SinkError::retriable(message)
        }
    })
}

fn target_bootstrap(config: &ConfigMap) -> Result<String, ConfigError> {
    config
        .get(TARGET_BOOTSTRAP_SERVERS)
        .or_else(|| config.get(SOURCE_BOOTSTRAP_SERVERS))
        .filter(|s| !s.trim().is_empty())
        .cloned()
        .ok_or_else(|| ConfigError::Missing {
            key: TARGET_BOOTSTRAP_SERVERS.into(),
        })
}

/// The producer of the offset syncs when `offset.syncs.bootstrap.servers` names their cluster
/// (held to the egress policy as the target is), with the `offset.syncs.producer.*` keys.
async fn syncs_producer(config: &ConfigMap) -> Result<Option<IdempotentProducer>, SinkError> {
    let Some(bootstrap) = config
        .get(OFFSET_SYNCS_BOOTSTRAP_SERVERS)
        .map(|b| b.trim())
        .filter(|b| !b.is_empty())
    else {
        return Ok(None);
    };
    let mut keys = strip_prefix(config, OFFSET_SYNCS_PRODUCER_PREFIX);
    // The cluster is the policed key's, never one a client key names.
    keys.remove("bootstrap.servers");
    vet_cluster(config, OFFSET_SYNCS_BOOTSTRAP_SERVERS, bootstrap, &keys).await?;
    IdempotentProducer::new(
        bootstrap,
        keys.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map(Some)
    .map_err(|e| SinkError::fatal(format!("{OFFSET_SYNCS_BOOTSTRAP_SERVERS}={bootstrap}: {e}")))
}

/// The target topic for `topic` under `format`.
pub fn rename(format: &str, topic: &str) -> String {
    format.replace("${topic}", topic)
}

/// One replicating producer.
#[derive(Default)]
pub struct KafkaSinkTask {
    state: Option<Running>,
}

enum Producer {
    AtLeastOnce(IdempotentProducer),
    ExactlyOnce {
        writer: Box<ExactlyOnceWriter>,
        ledger: LedgerSettings,
        /// Names the connector in classic-mode checkpoint keys: `[<tenant>/]<name>`.
        connector: String,
        /// How long opening partitions waits for a checkpoint in an open transaction.
        step_timeout: Duration,
        /// Classic mode: start offsets read by the last `open`, for the runtime.
        start_offsets: BTreeMap<TopicPartition, i64>,
        /// `transaction.boundary=interval`: how long a transaction may hold batches.
        boundary_interval: Option<Duration>,
        /// Puts whose copies are in the open transaction (more than one under `interval`).
        puts_in_transaction: u32,
    },
}

struct Running {
    producer: Producer,
    converter: RecordConverter,
    format: String,
    /// Target topic names and source header bytes, per source topic.
    per_topic: PerTopic,
    /// `source.headers`: copies carry their source coordinates as headers.
    source_headers: bool,
    keep_partition: bool,
    /// A mirror flow's MM2 metrics (`source.cluster.alias` and `target.cluster.alias` set).
    mirror_metrics: Option<MirrorMetrics>,
    /// A mirror flow's offset syncs (`offset.syncs.topic` set).
    offset_syncs: Option<SyncWriter>,
}

/// A mirror flow's offset syncs: which are due, and where they go.
struct SyncWriter {
    due: OffsetSyncs,
    /// MM2's `offset-syncs.topic.location=source`: the syncs topic is on another cluster
    /// (`offset.syncs.bootstrap.servers`), written by this producer. `None`: on the target,
    /// by the sink's own producer (in the copies' transaction under exactly-once).
    elsewhere: Option<IdempotentProducer>,
    /// Exactly-once with the syncs elsewhere: syncs naming copies of the open transaction,
    /// sent once it commits (a transaction cannot span two clusters; MM2 does the same).
    pending: Vec<OutRecord>,
    /// The writer's aborted transactions when `pending` was last valid: an abort since then
    /// took the copies `pending` names with it.
    pending_aborts: u64,
}

impl SyncWriter {
    /// Drops the pending syncs if the transaction they belong to was aborted since.
    fn forget_aborted(&mut self, aborted_transactions: u64) {
        if aborted_transactions != self.pending_aborts {
            self.pending.clear();
            self.pending_aborts = aborted_transactions;
        }
    }
}

/// Sends offset syncs with `producer`; one that cannot be written is logged (translation then
/// uses the one before: coarser, never wrong).
async fn send_syncs(producer: &IdempotentProducer, syncs: &[OutRecord]) {
    for failed in producer
        .send_all(syncs)
        .await
        .into_iter()
        .filter_map(Result::err)
    {
        tracing::warn!(error = %failed, "offset sync not written; checkpoints use the previous one");
    }
}

impl KafkaSinkTask {
    /// The exactly-once writer's counters (`None` under at-least-once or before start).
    pub fn exactly_once_stats(&self) -> Option<spillway_eos::writer::WriterStats> {
        match &self.state.as_ref()?.producer {
            Producer::ExactlyOnce { writer, .. } => Some(writer.stats()),
            Producer::AtLeastOnce(_) => None,
        }
    }
}

#[async_trait]
impl SinkTask for KafkaSinkTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let fatal = |e: ConfigError| SinkError::fatal(e.to_string());
        let parsed = config_def().parse(config).map_err(fatal)?;
        let bootstrap = target_bootstrap(config).map_err(fatal)?;
        let overrides = strip_prefix(config, PRODUCER_OVERRIDE_PREFIX);
        vet_target(config, &bootstrap, &overrides).await?;
        let producer = if exactly_once(config) {
            let id = transactional_id(config);
            let step_timeout =
                Duration::from_millis(parsed.long(TRANSACTION_TIMEOUT_MS).map_err(fatal)? as u64);
            let settings = WriterSettings {
                bootstrap: bootstrap.clone(),
                transactional_id: id.clone(),
                producer_overrides: overrides.into_iter().collect(),
                step_timeout,
                group_offsets: if target_is_source(config) {
                    GroupOffsets::InTransaction
                } else {
                    GroupOffsets::AfterCommit
                },
            };
            let name = config
                .get("name")
                .map(String::as_str)
                .unwrap_or("connector");
            let cache_dir = match parsed.string(LEDGER_CACHE_DIR).map_err(fatal)? {
                // A confined tenant's directory resolves inside its own (crate::paths).
                Some(dir) => crate::paths::resolve(config, LEDGER_CACHE_DIR, dir).map_err(fatal)?,
                None => match crate::paths::confinement(config) {
                    Some(root) => root.join(".spillway-eos").join(&id),
                    None => std::env::temp_dir().join("spillway-eos").join(&id),
                },
            };
            crate::paths::prepare(config, &cache_dir.join("cache")).map_err(|e| {
                SinkError::fatal(format!(
                    "cannot create the ledger cache directory {}",
                    cache_dir.display()
                ))
                .caused_by(e)
            })?;
            let ledger = LedgerSettings {
                topic: ledger_topic(config),
                cache_dir,
                lock_margin: Duration::from_millis(
                    parsed.long(LOCK_MARGIN_MS).map_err(fatal)? as u64
                ),
            };
            Producer::ExactlyOnce {
                writer: Box::new(ExactlyOnceWriter::start(&settings).await?),
                ledger,
                connector: match tenant_prefix(config) {
                    Some(tenant) => format!("{tenant}/{name}"),
                    None => name.to_owned(),
                },
                step_timeout,
                start_offsets: BTreeMap::new(),
                boundary_interval: match parsed.string(TRANSACTION_BOUNDARY).map_err(fatal)? {
                    Some("interval") => Some(Duration::from_millis(
                        parsed
                            .long(TRANSACTION_BOUNDARY_INTERVAL_MS)
                            .map_err(fatal)? as u64,
                    )),
                    _ => None,
                },
                puts_in_transaction: 0,
            }
        } else {
            Producer::AtLeastOnce(
                IdempotentProducer::new(
                    &bootstrap,
                    overrides.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .map_err(|e| SinkError::fatal(e.to_string()))?,
            )
        };
        let converter = RecordConverter::from_config(config, &ConfigMap::new()).map_err(fatal)?;
        self.state = Some(Running {
            producer,
            converter,
            format: parsed
                .string(TOPIC_RENAME_FORMAT)
                .map_err(fatal)?
                .unwrap_or("${topic}")
                .to_owned(),
            per_topic: PerTopic::default(),
            source_headers: parsed.boolean(SOURCE_HEADERS).map_err(fatal)?,
            keep_partition: parsed.string(TARGET_PARTITION).map_err(fatal)? != Some("hash"),
            mirror_metrics: MirrorMetrics::from_config(config),
            offset_syncs: match parsed.string(OFFSET_SYNCS_TOPIC).map_err(fatal)? {
                Some(topic) if !topic.trim().is_empty() => Some(SyncWriter {
                    due: OffsetSyncs::new(
                        topic.trim().to_owned(),
                        parsed.long(OFFSET_LAG_MAX).map_err(fatal)?,
                    ),
                    elsewhere: syncs_producer(config).await?,
                    pending: Vec::new(),
                    pending_aborts: 0,
                }),
                _ => None,
            },
        });
        Ok(())
    }

    async fn open(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
        let Some(Running {
            producer:
                Producer::ExactlyOnce {
                    writer,
                    ledger,
                    connector,
                    step_timeout,
                    start_offsets,
                    boundary_interval,
                    ..
                },
            ..
        }) = &mut self.state
        else {
            return Ok(());
        };
        match assignment {
            Assignment::SharedTopics(_) if boundary_interval.is_some() => {
                Err(SinkError::fatal(format!(
                    "{TRANSACTION_BOUNDARY}=interval is for classic mode: in share mode every \
                     batch's transaction commits before its records are acknowledged, while \
                     their acquisition locks run. Remove {TRANSACTION_BOUNDARY} (or set it to \
                     poll), or run the connector in classic mode"
                )))
            }
            Assignment::SharedTopics(_) => writer.open_share(ledger.clone()).await,
            Assignment::Partitions(partitions) => {
                let starts = writer
                    .open_classic(ledger, connector, partitions, *step_timeout)
                    .await?;
                start_offsets.extend(starts);
                Ok(())
            }
        }
    }

    /// Classic mode, exactly-once: the checkpoints `open` found. Records before them have
    /// committed output; `put` skips those that still arrive.
    fn start_offsets(&mut self) -> BTreeMap<TopicPartition, i64> {
        match &mut self.state {
            Some(Running {
                producer: Producer::ExactlyOnce { start_offsets, .. },
                ..
            }) => std::mem::take(start_offsets),
            _ => BTreeMap::new(),
        }
    }

    async fn close(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
        if let (
            Some(Running {
                producer: Producer::ExactlyOnce { writer, .. },
                ..
            }),
            Assignment::Partitions(partitions),
        ) = (&mut self.state, assignment)
        {
            writer.close_classic(partitions);
        }
        Ok(())
    }

    /// Exactly-once: a transaction must commit `delivery.lock.margin.ms` before its records'
    /// locks run out.
    fn lock_margin(&self) -> Option<(Duration, &'static str)> {
        match &self.state.as_ref()?.producer {
            Producer::ExactlyOnce { ledger, .. } => Some((ledger.lock_margin, LOCK_MARGIN_MS)),
            Producer::AtLeastOnce(_) => None,
        }
    }

    /// `transaction.boundary=interval`: one transaction holds the batches of this long.
    fn flush_interval(&self) -> Option<Duration> {
        match &self.state.as_ref()?.producer {
            Producer::ExactlyOnce {
                boundary_interval, ..
            } => *boundary_interval,
            Producer::AtLeastOnce(_) => None,
        }
    }

    fn consumer_group(&mut self, group: &ConsumerGroupMetadata) {
        if let Some(Running {
            producer: Producer::ExactlyOnce { writer, .. },
            ..
        }) = &mut self.state
        {
            if let Some(metadata) = group.downcast::<GroupMetadata>() {
                writer.set_group(metadata);
            }
        }
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        let Some(state) = &mut self.state else {
            return Err(SinkError::fatal("put before start"));
        };
        let received_ms = now_ms();
        // A record that cannot be serialized fails alone; the rest are sent.
        let mut outcomes: Vec<Option<PutOutcome>> = vec![None; records.len()];
        if let Producer::ExactlyOnce { writer, .. } = &mut state.producer {
            let lookups: Vec<_> = records
                .iter()
                .map(|r| (r.original.clone(), r.delivery_count, r.lock_deadline))
                .collect();
            for (i, written) in writer
                .already_written(&lookups)
                .await?
                .into_iter()
                .enumerate()
            {
                if written {
                    // Its output is committed already: accept it without writing it again.
                    outcomes[i] = Some(PutOutcome::Ok);
                }
            }
        }
        let mut out = Vec::with_capacity(records.len());
        let mut sources = Vec::with_capacity(records.len());
        let mut positions = Vec::with_capacity(records.len());
        let offsets = state
            .source_headers
            .then(|| Decimals::of(records.iter().map(|r| r.original.offset)));
        // The runtime's `put` span is current here (it enters it around `put`).
        let trace_context = opentelemetry::Context::current();
        for (i, record) in records.iter().enumerate() {
            if outcomes[i].is_some() {
                continue;
            }
            match state.converter.serialize(record) {
                Ok(mut raw) => {
                    crate::trace_context::replace(&mut raw.headers, &trace_context);
                    // One lookup when transforms kept the topic (a mirror flow's case).
                    let renamed = (record.topic != record.original.topic).then(|| {
                        state
                            .per_topic
                            .names(&state.format, &record.topic)
                            .target
                            .clone()
                    });
                    let names = state.per_topic.names(&state.format, &record.original.topic);
                    let target = renamed.unwrap_or_else(|| names.target.clone());
                    out.push(OutRecord {
                        topic: target,
                        partition: state.keep_partition.then_some(record.partition),
                        key: raw.key,
                        value: raw.value,
                        headers: copy_headers(
                            raw.headers,
                            &record.original,
                            names,
                            offsets.as_ref().map(|o| o.get(i)),
                        ),
                        timestamp: record.timestamp,
                    });
                    sources.push((record.original.clone(), record.lock_deadline));
                    positions.push(i);
                }
                Err(e) => outcomes[i] = Some(PutOutcome::Fatal(SinkError::fatal(e.to_string()))),
            }
        }
        match &mut state.producer {
            Producer::AtLeastOnce(producer) => {
                let results = producer.send_all(&out).await;
                if let Some(metrics) = &mut state.mirror_metrics {
                    let written = out.iter().zip(&results).filter(|(_, r)| r.is_ok());
                    metrics.written(written.map(|(record, _)| record), received_ms);
                }
                if let Some(syncs) = &mut state.offset_syncs {
                    let due = offset_syncs_due(&mut syncs.due, &sources, &results);
                    send_syncs(syncs.elsewhere.as_ref().unwrap_or(&*producer), &due).await;
                }
                for (i, result) in positions.into_iter().zip(results) {
                    outcomes[i] = Some(match result {
                        Ok(_) => PutOutcome::Ok,
                        Err(e) if e.is_retriable() => {
                            PutOutcome::Retriable(SinkError::retriable(e.to_string()))
                        }
                        // Not authorized, a refused login: no record would get through.
                        Err(e) if e.is_task_level() => {
                            PutOutcome::TaskLevel(SinkError::task_level(e.to_string()))
                        }
                        Err(e) => PutOutcome::Fatal(SinkError::fatal(e.to_string())),
                    });
                }
            }
            Producer::ExactlyOnce {
                writer,
                puts_in_transaction,
                ..
            } => {
                let aborts_before = writer.stats().aborted_transactions;
                let mut results = writer.write(&out, &sources).await;
                // Written into the open transaction; it commits at the next flush.
                if let Some(syncs) = &mut state.offset_syncs {
                    let due = offset_syncs_due(&mut syncs.due, &sources, &results);
                    if syncs.elsewhere.is_some() {
                        // Another cluster: sent after the commit (`flush`), never naming a
                        // copy that was aborted.
                        syncs.forget_aborted(writer.stats().aborted_transactions);
                        syncs.pending.extend(due);
                    } else if let Err(e) = writer.write_alongside(&due).await {
                        // The syncs go in the same transaction: a sync never names a copy
                        // that was aborted. If they cannot be written the transaction is
                        // aborted, so the copies are retried with them.
                        results = results.iter().map(|_| Err(e.clone())).collect();
                    }
                }
                if writer.stats().aborted_transactions != aborts_before && *puts_in_transaction > 0
                {
                    // The abort took the copies of earlier puts with it, whose batches the
                    // runtime holds as written (transaction.boundary=interval): the task fails,
                    // and those batches are read again from the last commit.
                    let cause = results
                        .iter()
                        .find_map(|r| r.as_ref().err())
                        .map_or_else(|| "aborted".to_owned(), ToString::to_string);
                    let error = SinkError::task_level(format!(
                        "the transaction holding the copies of the last {} batch(es) \
                         ({TRANSACTION_BOUNDARY}=interval) was aborted, and those copies with \
                         it: {cause}. The task fails; its restart reads those batches again \
                         from the last committed transaction",
                        *puts_in_transaction
                    ));
                    *puts_in_transaction = 0;
                    return Ok(vec![PutOutcome::TaskLevel(error); records.len()]);
                }
                if results.iter().any(Result::is_ok) {
                    *puts_in_transaction += 1;
                }
                if let Some(metrics) = &mut state.mirror_metrics {
                    let written = out.iter().zip(&results).filter(|(_, r)| r.is_ok());
                    metrics.written(written.map(|(record, _)| record), received_ms);
                }
                for (i, result) in positions.into_iter().zip(results) {
                    outcomes[i] = Some(match result {
                        Ok(_) => PutOutcome::Ok,
                        Err(e) => PutOutcome::from_result(Err(e)),
                    });
                }
            }
        }
        // Every position was filled above: by the ledger, a conversion error or a send result.
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| PutOutcome::Fatal(SinkError::fatal("not sent"))))
            .collect())
    }

    /// Exactly-once: commits the batch's transaction (with `offsets` in classic mode).
    /// With the offset syncs on another cluster, then sends the syncs of the committed copies.
    async fn flush(&mut self, offsets: &BTreeMap<TopicPartition, i64>) -> Result<(), SinkError> {
        let Some(Running {
            producer:
                Producer::ExactlyOnce {
                    writer,
                    puts_in_transaction,
                    ..
                },
            offset_syncs,
            ..
        }) = &mut self.state
        else {
            return Ok(());
        };
        let committed = writer.commit(offsets).await;
        // Committed or aborted: nothing of those puts is open any more.
        *puts_in_transaction = 0;
        if let Some(syncs) = offset_syncs {
            syncs.forget_aborted(writer.stats().aborted_transactions);
            let pending = std::mem::take(&mut syncs.pending);
            if let (Ok(()), Some(producer)) = (&committed, &syncs.elsewhere) {
                send_syncs(producer, &pending).await;
            }
        }
        committed
    }

    async fn acknowledged(&mut self, committed: &[RecordCoordinates]) {
        if let Some(Running {
            producer: Producer::ExactlyOnce { writer, .. },
            ..
        }) = &mut self.state
        {
            writer.acknowledged(committed);
        }
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        if let Some(Running {
            producer: Producer::ExactlyOnce { writer, .. },
            ..
        }) = &mut self.state
        {
            // Whatever is open was not flushed, so not acknowledged: it goes.
            writer.abort().await?;
            writer.flush_tombstones().await?;
        }
        self.state = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rename_format_substitutes_the_topic() {
        assert_eq!(rename("${topic}", "orders"), "orders");
        assert_eq!(rename("backup.${topic}.v2", "orders"), "backup.orders.v2");
        assert_eq!(rename("all", "orders"), "all");
    }

    #[test]
    fn the_target_defaults_to_the_source_cluster() {
        let mut config: ConfigMap = [(SOURCE_BOOTSTRAP_SERVERS.to_owned(), "src:9092".to_owned())]
            .into_iter()
            .collect();
        assert_eq!(target_bootstrap(&config).expect("source"), "src:9092");
        config.insert(TARGET_BOOTSTRAP_SERVERS.into(), "dst:9092".into());
        assert_eq!(target_bootstrap(&config).expect("target"), "dst:9092");
        let err = target_bootstrap(&ConfigMap::new()).expect_err("neither");
        assert_eq!(err.key(), Some(TARGET_BOOTSTRAP_SERVERS));
    }

    #[test]
    fn a_bad_delivery_guarantee_is_refused_naming_the_key() {
        let mut connector = KafkaSinkConnector::default();
        let config: ConfigMap = [
            (SOURCE_BOOTSTRAP_SERVERS.to_owned(), "src:9092".to_owned()),
            (DELIVERY_GUARANTEE.to_owned(), "exactly-once".to_owned()),
        ]
        .into_iter()
        .collect();
        let err = connector.start(&config).expect_err("not a guarantee");
        let text = err.to_string();
        assert!(text.contains("delivery.guarantee"), "{text}");
        assert!(text.contains("exactly-once"), "{text}");
        assert!(!connector.task_commits_offsets());
    }

    #[test]
    fn an_interval_boundary_is_refused_in_share_mode_naming_the_key() {
        let mut connector = KafkaSinkConnector::default();
        let mut config: ConfigMap = [
            (SOURCE_BOOTSTRAP_SERVERS, "src:9092"),
            (DELIVERY_GUARANTEE, "exactly_once"),
            (TRANSACTION_BOUNDARY, "interval"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        connector.start(&config).expect("classic mode takes it");
        config.insert("consumer.override.group.protocol".into(), "share".into());
        let err = connector.start(&config).expect_err("share mode does not");
        assert_eq!(err.key(), Some(TRANSACTION_BOUNDARY));
        assert!(err.to_string().contains("share mode"), "{err}");
        config.insert(TRANSACTION_BOUNDARY.into(), "every_batch".into());
        let err = connector.start(&config).expect_err("not a boundary");
        assert_eq!(err.key(), Some(TRANSACTION_BOUNDARY));
        config.insert(TRANSACTION_BOUNDARY.into(), "interval".into());
        config.remove("consumer.override.group.protocol");
        config.insert(TRANSACTION_BOUNDARY_INTERVAL_MS.into(), "60000".into());
        let err = connector
            .start(&config)
            .expect_err("not shorter than the default transaction timeout");
        assert_eq!(err.key(), Some(TRANSACTION_BOUNDARY_INTERVAL_MS));
        assert!(err.to_string().contains("transaction.timeout.ms"), "{err}");
        config.insert(
            "producer.override.transaction.timeout.ms".into(),
            "120000".into(),
        );
        connector
            .start(&config)
            .expect("a longer transaction timeout");
        config.insert(DELIVERY_GUARANTEE.into(), "at_least_once".into());
        connector
            .start(&config)
            .expect("ignored under at_least_once");
    }

    #[test]
    fn exactly_once_makes_the_tasks_commit_offsets() {
        let mut connector = KafkaSinkConnector::default();
        let mut config: ConfigMap = [(SOURCE_BOOTSTRAP_SERVERS.to_owned(), "src:9092".to_owned())]
            .into_iter()
            .collect();
        connector.start(&config).expect("default");
        assert!(
            !connector.task_commits_offsets(),
            "at_least_once by default"
        );
        config.insert(DELIVERY_GUARANTEE.into(), "exactly_once".into());
        connector.start(&config).expect("exactly_once");
        assert!(connector.task_commits_offsets());
        // The same cluster under another of its brokers' names.
        config.insert(
            TARGET_BOOTSTRAP_SERVERS.into(),
            "other:9092, PLAINTEXT://SRC:9092".into(),
        );
        connector.start(&config).expect("same cluster");
        assert!(connector.task_commits_offsets());
    }

    #[test]
    fn exactly_once_to_another_cluster_leaves_the_source_offsets_to_the_runtime() {
        let mut connector = KafkaSinkConnector::default();
        let config: ConfigMap = [
            (SOURCE_BOOTSTRAP_SERVERS, "a1:9092,a2:9092"),
            (TARGET_BOOTSTRAP_SERVERS, "b1:9092,b2:9092"),
            (DELIVERY_GUARANTEE, "exactly_once"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        connector.start(&config).expect("valid");
        assert!(
            !connector.task_commits_offsets(),
            "the target's transactions cannot hold the source group's offsets"
        );
        assert!(!target_is_source(&config));
    }

    #[test]
    fn transactional_ids_are_stable_per_tenant_connector_and_task() {
        let mut config: ConfigMap = [("name", "mirror"), (TASK_ID, "3")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(transactional_id(&config), "spillway-mirror-3");
        assert_eq!(ledger_topic(&config), "__spillway_eos_ledger.mirror");
        // The runtime's tenant key scopes every derived name, and a user-chosen prefix or
        // ledger topic gets the tenant's prefix as a group id does.
        config.insert(TENANT_PREFIX.into(), "acme".into());
        assert_eq!(transactional_id(&config), "acme.spillway-mirror-3");
        assert_eq!(ledger_topic(&config), "acme.__spillway_eos_ledger.mirror");
        config.insert(TRANSACTIONAL_ID_PREFIX.into(), "dc1".into());
        config.insert(LEDGER_TOPIC.into(), "ledger".into());
        assert_eq!(transactional_id(&config), "acme.dc1-mirror-3");
        assert_eq!(ledger_topic(&config), "acme.ledger");
        config.insert(TRANSACTIONAL_ID_PREFIX.into(), "acme.dc1".into());
        assert_eq!(transactional_id(&config), "acme.dc1-mirror-3");
        // The old `tenant` key, which nothing set, no longer counts.
        config.remove(TENANT_PREFIX);
        config.insert("tenant".into(), "globex".into());
        config.insert(TRANSACTIONAL_ID_PREFIX.into(), "dc1".into());
        assert_eq!(transactional_id(&config), "dc1-mirror-3");
    }

    #[test]
    fn source_headers_replace_older_ones_and_keep_the_rest() {
        let headers = vec![
            ("trace".to_owned(), Some(Bytes::from_static(b"abc"))),
            (
                SOURCE_OFFSET_HEADER.to_owned(),
                Some(Bytes::from_static(b"1")),
            ),
        ];
        let mut names = PerTopic::default();
        let out = copy_headers(
            headers,
            &RecordCoordinates::new("orders", 4, 99),
            names.names("${topic}", &Topic::from("orders")),
            Some(Bytes::from_static(b"99")),
        );
        assert_eq!(
            out,
            vec![
                ("trace".into(), Some(Bytes::from_static(b"abc"))),
                (
                    SOURCE_TOPIC_HEADER.into(),
                    Some(Bytes::from_static(b"orders"))
                ),
                (
                    SOURCE_PARTITION_HEADER.into(),
                    Some(Bytes::from_static(b"4"))
                ),
                (SOURCE_OFFSET_HEADER.into(), Some(Bytes::from_static(b"99"))),
            ]
        );
    }

    #[test]
    fn without_source_headers_a_copy_carries_its_own_headers_only() {
        // A record's own header of a source header's name stays too: it is the record's.
        let headers = vec![
            ("trace".to_owned(), Some(Bytes::from_static(b"abc"))),
            ("empty".to_owned(), None),
            (
                SOURCE_OFFSET_HEADER.to_owned(),
                Some(Bytes::from_static(b"1")),
            ),
        ];
        let mut names = PerTopic::default();
        let out = copy_headers(
            headers.clone(),
            &RecordCoordinates::new("orders", 4, 99),
            names.names("${topic}", &Topic::from("orders")),
            None,
        );
        let expected: Vec<(Cow<'static, str>, Option<Bytes>)> = headers
            .into_iter()
            .map(|(k, v)| (Cow::Owned(k), v))
            .collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn source_headers_are_on_unless_turned_off() {
        let def = config_def();
        let mut config = ConfigMap::new();
        assert!(def
            .parse(&config)
            .expect("valid")
            .boolean(SOURCE_HEADERS)
            .expect("declared"));
        config.insert(SOURCE_HEADERS.into(), "false".into());
        assert!(!def
            .parse(&config)
            .expect("valid")
            .boolean(SOURCE_HEADERS)
            .expect("declared"));
        config.insert(SOURCE_HEADERS.into(), "no".into());
        let err = def.parse(&config).expect_err("not a boolean");
        assert!(err.to_string().contains(SOURCE_HEADERS), "{err}");
    }

    #[test]
    fn partition_headers_read_as_the_partition_in_decimal() {
        for p in [0, 9, 10, 99, 100, 999, 1000, 4321, 9999] {
            assert_eq!(partition_text(p), Some(p.to_string().as_str()), "{p}");
        }
        assert_eq!(partition_text(10_000), None);
        assert_eq!(partition_text(-1), None);
        let mut names = PerTopic::default();
        let topic = Topic::interned("partition-headers");
        let names = names.names("${topic}", &topic);
        assert_eq!(&names.partition_header(123)[..], b"123");
        assert_eq!(&names.partition_header(12_345)[..], b"12345");
        assert_eq!(&names.header[..], b"partition-headers");
    }

    #[test]
    fn offsets_are_written_in_decimal_each_as_its_own_header_value() {
        let offsets = [0, 7, 10, 99, 1234567890123, i64::MAX, -1, i64::MIN];
        let decimals = Decimals::of(offsets.iter().copied());
        for (i, n) in offsets.into_iter().enumerate() {
            assert_eq!(&decimals.get(i)[..], n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn the_offset_syncs_cluster_is_a_kafka_cluster_the_runtime_polices() {
        // Tenants may name another cluster only under the override policy All (actors'
        // tenancy reads the reach), as with target.bootstrap.servers.
        for key in [TARGET_BOOTSTRAP_SERVERS, OFFSET_SYNCS_BOOTSTRAP_SERVERS] {
            let declared = config_def().key(key).cloned().expect("declared");
            assert!(
                matches!(declared.reach, Some(Reach::KafkaCluster)),
                "{key}: {:?}",
                declared.reach
            );
        }
    }

    #[test]
    fn syncs_held_for_another_cluster_go_when_their_transaction_aborts() {
        let mut writer = SyncWriter {
            due: OffsetSyncs::new("mm2-offset-syncs.B.internal".into(), 10),
            elsewhere: None,
            pending: Vec::new(),
            pending_aborts: 0,
        };
        let sync = writer
            .due
            .copied(&Topic::from("orders"), 0, 5, 0)
            .expect("first copy");
        writer.forget_aborted(0);
        writer.pending.push(sync.clone());
        writer.forget_aborted(0);
        assert_eq!(
            writer.pending.len(),
            1,
            "no abort: still due after the commit"
        );
        writer.forget_aborted(1);
        assert!(writer.pending.is_empty(), "they named aborted copies");
        writer.pending.push(sync);
        writer.forget_aborted(1);
        assert_eq!(writer.pending.len(), 1, "a later transaction's syncs stay");
    }

    #[test]
    fn a_bad_partition_strategy_is_refused_naming_the_key() {
        let mut connector = KafkaSinkConnector::default();
        let config: ConfigMap = [
            (SOURCE_BOOTSTRAP_SERVERS.to_owned(), "src:9092".to_owned()),
            (TARGET_PARTITION.to_owned(), "random".to_owned()),
        ]
        .into_iter()
        .collect();
        let err = connector.start(&config).expect_err("not keep or hash");
        assert!(err.to_string().contains("target.partition"), "{err}");
    }
}
