//! MirrorMaker 2's dedicated-mode file (`mm2.properties`) read into clusters and flows.
//!
//! The keys and defaults are MM2's (Kafka 4.2 `MirrorMakerConfig`, `MirrorSourceConfig`,
//! `MirrorCheckpointConfig`, `MirrorHeartbeatConfig`): `clusters`, `<A>.bootstrap.servers` and the
//! cluster's client keys, `<A>-><B>.enabled`, and the flow keys, each set for all flows (`x`) or
//! for one (`<A>-><B>.x`, which wins). Top-level client keys (security) apply to every cluster and
//! `<A>.` ones override them, as MM2's `clusterProps` does.
//!
//! What MM2 would silently ignore or pass on to a Connect worker is warned here by name (the
//! caller logs [`MirrorConfig::warnings`]); a value that cannot be used is refused naming its key.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use regex::Regex;
use spillway_core::ConfigMap;
use spillway_kafka::security::{is_security_key, SecuritySettings};

use super::policy::ReplicationPolicy;

/// Why the file cannot be run. Every message names the key as written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MirrorConfigError {
    #[error("{key} is required: {reason}")]
    Missing { key: String, reason: String },
    #[error("invalid value '{value}' for {key}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> MirrorConfigError {
    MirrorConfigError::Invalid {
        key: key.to_owned(),
        value: if spillway_kafka::security::is_secret_key(key) {
            "[hidden]".to_owned()
        } else {
            value.to_owned()
        },
        reason: reason.into(),
    }
}

/// MM2's defaults (Kafka 4.2).
pub mod defaults {
    pub const TOPICS: &str = ".*";
    pub const TOPICS_EXCLUDE: &str = r"mm2.*\.internal, .*\.replica, __.*";
    pub const GROUPS: &str = ".*";
    pub const GROUPS_EXCLUDE: &str = "console-consumer-.*, connect-.*, __.*";
    pub const REPLICATION_FACTOR: i64 = 2;
    pub const INTERNAL_TOPIC_REPLICATION_FACTOR: i64 = 3;
    pub const REFRESH_TOPICS_INTERVAL_SECONDS: i64 = 600;
    pub const SYNC_TOPIC_CONFIGS_INTERVAL_SECONDS: i64 = 600;
    pub const EMIT_HEARTBEATS_INTERVAL_SECONDS: i64 = 1;
    pub const EMIT_CHECKPOINTS_INTERVAL_SECONDS: i64 = 60;
    pub const SYNC_GROUP_OFFSETS_INTERVAL_SECONDS: i64 = 60;
    pub const OFFSET_LAG_MAX: i64 = 100;
    pub const TASKS_MAX: i64 = 1;
}

/// What a flow key holds.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Bool,
    /// An integer at least this.
    Long(i64),
    /// A replication factor: -1 (the broker's default) or at least 1.
    ReplicationFactor,
    /// Comma-separated regular expressions.
    Regexes,
    Text,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

/// The flow keys: name, kind, MM2's default.
const FLOW_KEYS: &[(&str, Kind, &str)] = &[
    ("enabled", Kind::Bool, "false"),
    ("topics", Kind::Regexes, defaults::TOPICS),
    ("topics.exclude", Kind::Regexes, defaults::TOPICS_EXCLUDE),
    ("groups", Kind::Regexes, defaults::GROUPS),
    ("groups.exclude", Kind::Regexes, defaults::GROUPS_EXCLUDE),
    ("replication.factor", Kind::ReplicationFactor, "2"),
    (
        "heartbeats.topic.replication.factor",
        Kind::ReplicationFactor,
        "3",
    ),
    (
        "checkpoints.topic.replication.factor",
        Kind::ReplicationFactor,
        "3",
    ),
    (
        "offset-syncs.topic.replication.factor",
        Kind::ReplicationFactor,
        "3",
    ),
    (
        "replication.policy.class",
        Kind::Text,
        "org.apache.kafka.connect.mirror.DefaultReplicationPolicy",
    ),
    ("replication.policy.separator", Kind::Text, "."),
    (
        "replication.policy.internal.topic.separator.enabled",
        Kind::Bool,
        "true",
    ),
    ("sync.topic.configs.enabled", Kind::Bool, "true"),
    ("sync.topic.configs.interval.seconds", Kind::Long(1), "600"),
    ("refresh.topics.enabled", Kind::Bool, "true"),
    ("refresh.topics.interval.seconds", Kind::Long(1), "600"),
    ("emit.heartbeats.enabled", Kind::Bool, "true"),
    ("emit.heartbeats.interval.seconds", Kind::Long(1), "1"),
    ("heartbeats.replication.enabled", Kind::Bool, "true"),
    ("emit.checkpoints.enabled", Kind::Bool, "true"),
    ("emit.checkpoints.interval.seconds", Kind::Long(1), "60"),
    ("emit.offset-syncs.enabled", Kind::Bool, "true"),
    ("sync.group.offsets.enabled", Kind::Bool, "false"),
    ("sync.group.offsets.interval.seconds", Kind::Long(1), "60"),
    ("offset.lag.max", Kind::Long(0), "100"),
    (
        "offset-syncs.topic.location",
        Kind::OneOf(&["source", "target"]),
        "source",
    ),
    ("tasks.max", Kind::Long(1), "1"),
    // MM2 sets this on the Connect worker of the target cluster (KIP-618); it may be given at
    // the top, for a target cluster (`B.`) or, as a Spillway extension, for one flow.
    (
        "exactly.once.source.support",
        Kind::OneOf(&["enabled", "preparing", "disabled"]),
        "disabled",
    ),
    // KIP-618's connector keys, which MM2 passes to its MirrorSourceConnector: under exactly
    // once, a transaction per poll, or one holding several batches (the kafka sink's keys).
    (
        "transaction.boundary",
        Kind::OneOf(&["poll", "interval"]),
        "poll",
    ),
    ("transaction.boundary.interval.ms", Kind::Long(1), "1000"),
    // Spillway's own: copies carry `spillway.source.*` headers (the kafka sink's
    // `source.headers`). Off by default, as MM2's copies carry their own headers only.
    ("source.headers.enabled", Kind::Bool, "false"),
];

/// MM2 keys that Spillway reads but that change nothing here, with why.
const WITHOUT_EFFECT: &[(&str, &str)] = &[
    (
        "sync.topic.acls.enabled",
        "Spillway mirror does not copy ACLs; grant them on the target yourself",
    ),
    (
        "sync.topic.acls.interval.seconds",
        "Spillway mirror does not copy ACLs",
    ),
    (
        "refresh.groups.interval.seconds",
        "groups are read at each checkpoint interval",
    ),
    (
        "config.properties.exclude",
        "topic configs are filtered by Spillway's fixed list (docs/mirror.md)",
    ),
    (
        "dedicated.mode.enable.internal.rest",
        "one process runs every flow; there is no internal REST",
    ),
];

/// Connect worker keys MM2 passes to its per-cluster workers; Spillway keeps no Connect
/// internal topics, so they do nothing.
const WORKER_PREFIXES: &[&str] = &[
    "config.storage.",
    "offset.storage.",
    "status.storage.",
    "key.converter",
    "value.converter",
    "header.converter",
    "group.id",
    "config.providers",
];

/// One cluster: where it is and how its clients log in.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    pub alias: String,
    pub bootstrap_servers: String,
    /// Security keys (top level, then `<alias>.`), Java or librdkafka spelling.
    pub security: ConfigMap,
    /// Each security key as written in the file (`sasl.username` or `A.sasl.username`).
    pub security_written: ConfigMap,
    /// `<alias>.consumer.*`, `<alias>.producer.*`, `<alias>.admin.*` without the prefix.
    pub consumer: ConfigMap,
    pub producer: ConfigMap,
    pub admin: ConfigMap,
    /// `exactly.once.source.support` given for this cluster (as a target).
    pub exactly_once_support: Option<String>,
}

impl ClusterSettings {
    /// The translated security setting (refused naming the key when unusable).
    pub fn security_settings(&self) -> Result<SecuritySettings, MirrorConfigError> {
        let keys: Vec<(String, String, String)> = self
            .security
            .iter()
            .map(|(k, v)| {
                let written = self.security_written.get(k).cloned();
                (k.clone(), v.clone(), written.unwrap_or_else(|| k.clone()))
            })
            .collect();
        SecuritySettings::from_keys(
            keys.iter()
                .map(|(k, v, written)| (k.as_str(), v.as_str(), written.as_str())),
        )
        .map_err(|e| MirrorConfigError::Invalid {
            key: format!("{}.security.protocol", self.alias),
            value: self
                .security
                .get("security.protocol")
                .cloned()
                .unwrap_or_else(|| "PLAINTEXT".into()),
            reason: format!(
                "the security settings of cluster {} are unusable: {e}",
                self.alias
            ),
        })
    }
}

/// A regex list as MM2 reads one: comma-separated, each matching whole names; an empty list
/// matches nothing.
#[derive(Debug, Clone)]
pub struct NameFilter {
    text: String,
    whole: Option<Regex>,
}

impl PartialEq for NameFilter {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl NameFilter {
    pub fn parse(key: &str, text: &str) -> Result<NameFilter, MirrorConfigError> {
        let parts: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        for part in &parts {
            Regex::new(part).map_err(|e| {
                invalid(
                    key,
                    text,
                    format!("'{part}' is not a regular expression: {e}"),
                )
            })?;
        }
        let whole = if parts.is_empty() {
            None
        } else {
            let joined = format!("^(?:{})$", parts.join("|"));
            Some(Regex::new(&joined).map_err(|e| invalid(key, text, e.to_string()))?)
        };
        Ok(NameFilter {
            text: text.to_owned(),
            whole,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        self.whole.as_ref().is_some_and(|r| r.is_match(name))
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

/// How the flow's consumer reads the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeMode {
    /// A consumer group: each record to the same partition number, order kept per partition.
    Classic,
    /// A share group: parallelism beyond partitions, no order.
    Share,
}

/// MM2's `offset-syncs.topic.location`: the cluster a flow's offset syncs topic is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSyncsLocation {
    /// MM2's default: `mm2-offset-syncs.<target>.internal` on the source cluster.
    Source,
    /// `mm2-offset-syncs.<source>.internal` on the target cluster.
    Target,
}

/// One replication flow `source->target`, every key resolved (`A->B.x` over `x` over MM2's
/// default).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowSettings {
    pub source: String,
    pub target: String,
    /// `A->B.enabled`: replicate records. A disabled flow may still emit heartbeats, as MM2's.
    pub enabled: bool,
    pub topics: NameFilter,
    pub topics_exclude: NameFilter,
    pub groups: NameFilter,
    pub groups_exclude: NameFilter,
    pub replication_factor: i16,
    pub heartbeats_topic_replication_factor: i16,
    pub checkpoints_topic_replication_factor: i16,
    pub offset_syncs_topic_replication_factor: i16,
    pub policy: ReplicationPolicy,
    pub sync_topic_configs: bool,
    pub sync_topic_configs_interval: Duration,
    pub refresh_topics: bool,
    pub refresh_topics_interval: Duration,
    pub emit_heartbeats: bool,
    pub emit_heartbeats_interval: Duration,
    pub heartbeats_replication: bool,
    pub emit_checkpoints: bool,
    pub emit_checkpoints_interval: Duration,
    pub emit_offset_syncs: bool,
    pub sync_group_offsets: bool,
    pub sync_group_offsets_interval: Duration,
    pub offset_lag_max: i64,
    pub offset_syncs_location: OffsetSyncsLocation,
    pub tasks_max: usize,
    pub exactly_once: bool,
    /// `transaction.boundary=interval` (exactly once): how long one transaction may hold
    /// batches; `None` for a transaction per batch.
    pub transaction_interval: Option<Duration>,
    /// `source.headers.enabled`: copies carry their source coordinates as headers.
    pub source_headers: bool,
    pub mode: ConsumeMode,
    /// Consumer keys for the source (`A.consumer.*`, `consumer.*`, `A->B.consumer.*`).
    pub consumer: ConfigMap,
    /// Producer keys for the target (`B.producer.*`, `producer.*`, `A->B.producer.*`).
    pub producer: ConfigMap,
}

impl FlowSettings {
    /// `A->B`, as MM2 names flows.
    pub fn name(&self) -> String {
        format!("{}->{}", self.source, self.target)
    }

    /// Whether this flow runs at all: it replicates, or it only emits heartbeats (MM2 runs a
    /// heartbeat connector for every pair unless heartbeats are off).
    pub fn runs(&self) -> bool {
        self.enabled || self.emit_heartbeats
    }

    /// The alias of the cluster the offset syncs topic is on.
    pub fn offset_syncs_cluster(&self) -> &str {
        match self.offset_syncs_location {
            OffsetSyncsLocation::Source => &self.source,
            OffsetSyncsLocation::Target => &self.target,
        }
    }

    /// The offset syncs topic, named as MM2 names it: after the cluster on the other side of
    /// the flow (`mm2-offset-syncs.B.internal` on A, or `mm2-offset-syncs.A.internal` on B).
    pub fn offset_syncs_topic(&self) -> String {
        self.policy
            .offset_syncs_topic(match self.offset_syncs_location {
                OffsetSyncsLocation::Source => &self.target,
                OffsetSyncsLocation::Target => &self.source,
            })
    }
}

/// The whole file.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    pub clusters: BTreeMap<String, ClusterSettings>,
    /// Every ordered pair of clusters; see [`FlowSettings::runs`].
    pub flows: Vec<FlowSettings>,
    /// Keys that do nothing here, each named with why.
    pub warnings: Vec<String>,
}

impl MirrorConfig {
    pub fn cluster(&self, alias: &str) -> &ClusterSettings {
        // Flows are built from `clusters` only.
        &self.clusters[alias]
    }

    /// The flow named `A->B`, if the file has those clusters.
    pub fn flow(&self, name: &str) -> Option<&FlowSettings> {
        self.flows.iter().find(|f| f.name() == name)
    }

    pub fn enabled_flows(&self) -> impl Iterator<Item = &FlowSettings> {
        self.flows.iter().filter(|f| f.enabled)
    }

    /// Reads a parsed file.
    pub fn parse(props: &ConfigMap) -> Result<MirrorConfig, MirrorConfigError> {
        let aliases = cluster_aliases(props)?;
        let mut warnings = Vec::new();
        check_keys(props, &aliases, &mut warnings);
        let mut clusters = BTreeMap::new();
        for alias in &aliases {
            clusters.insert(alias.clone(), cluster_settings(props, alias)?);
        }
        let mut flows = Vec::new();
        for source in &aliases {
            for target in &aliases {
                if source != target {
                    flows.push(flow_settings(props, &clusters, source, target)?);
                }
            }
        }
        if !flows.iter().any(|f| f.enabled) {
            warnings.push(format!(
                "no flow is enabled (set e.g. {}->{}.enabled=true); only heartbeats run",
                aliases[0],
                aliases.get(1).map_or("B", String::as_str)
            ));
        }
        Ok(MirrorConfig {
            clusters,
            flows,
            warnings,
        })
    }
}

/// `clusters`: aliases, at least two, no duplicates, no `->`, `.` or blanks inside.
fn cluster_aliases(props: &ConfigMap) -> Result<Vec<String>, MirrorConfigError> {
    let text = props
        .get("clusters")
        .ok_or_else(|| MirrorConfigError::Missing {
            key: "clusters".into(),
            reason: "list the cluster aliases, e.g. clusters = A, B".into(),
        })?;
    let aliases: Vec<String> = text
        .split(',')
        .map(|a| a.trim().to_owned())
        .filter(|a| !a.is_empty())
        .collect();
    let mut seen = BTreeSet::new();
    for alias in &aliases {
        if alias.contains("->") || alias.contains('.') || alias.chars().any(char::is_whitespace) {
            return Err(invalid(
                "clusters",
                text,
                format!("alias '{alias}' may not contain '.', '->' or blanks"),
            ));
        }
        if !seen.insert(alias.clone()) {
            return Err(invalid(
                "clusters",
                text,
                format!("alias '{alias}' is listed twice"),
            ));
        }
    }
    if aliases.len() < 2 {
        return Err(invalid(
            "clusters",
            text,
            "name at least two clusters (a source and a target)",
        ));
    }
    Ok(aliases)
}

fn flow_key(name: &str) -> Option<Kind> {
    FLOW_KEYS
        .iter()
        .find(|(k, _, _)| *k == name)
        .map(|(_, kind, _)| *kind)
}

fn is_client_prefixed(name: &str) -> bool {
    ["consumer.", "producer.", "admin."]
        .iter()
        .any(|p| name.starts_with(p))
}

fn without_effect(name: &str) -> Option<&'static str> {
    WITHOUT_EFFECT
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, why)| *why)
        .or_else(|| {
            WORKER_PREFIXES
                .iter()
                .any(|p| name.starts_with(p))
                .then_some("a Connect worker key; Spillway mirror keeps no Connect worker state")
        })
}

/// Warn every key that is neither used nor known to be without effect.
fn check_keys(props: &ConfigMap, aliases: &[String], warnings: &mut Vec<String>) {
    for key in props.keys() {
        if key == "clusters" {
            continue;
        }
        let flow_prefix = aliases.iter().flat_map(|s| {
            aliases
                .iter()
                .filter(move |t| *t != s)
                .map(move |t| format!("{s}->{t}."))
        });
        let mut known = false;
        let mut why = None;
        for prefix in flow_prefix {
            if let Some(rest) = key.strip_prefix(&prefix) {
                known = flow_key(rest).is_some() || is_client_prefixed(rest);
                why = without_effect(rest);
            }
        }
        if !known && why.is_none() && key.contains("->") {
            warnings.push(format!(
                "unknown key {key}: '->' flows must join two aliases of clusters ({})",
                aliases.join(", ")
            ));
            continue;
        }
        for alias in aliases {
            if let Some(rest) = key.strip_prefix(&format!("{alias}.")) {
                known = rest == "bootstrap.servers"
                    || is_security_key(rest)
                    || is_client_prefixed(rest)
                    || rest == "exactly.once.source.support";
                why = why.or_else(|| without_effect(rest));
            }
        }
        if !known {
            // `enabled` alone means nothing: only `A->B.enabled` turns a flow on.
            known = (flow_key(key).is_some() && key != "enabled")
                || is_security_key(key)
                || is_client_prefixed(key);
            why = why.or_else(|| without_effect(key));
        }
        if known {
            continue;
        }
        match why {
            Some(why) => warnings.push(format!("{key} has no effect: {why}")),
            None => warnings.push(format!(
                "unknown key {key} (ignored); see docs/mirror.md for the keys spillway mirror reads"
            )),
        }
    }
}

fn prefixed(props: &ConfigMap, prefix: &str) -> ConfigMap {
    props
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(prefix).map(|r| (r.to_owned(), v.clone())))
        .collect()
}

fn cluster_settings(props: &ConfigMap, alias: &str) -> Result<ClusterSettings, MirrorConfigError> {
    let key = format!("{alias}.bootstrap.servers");
    let bootstrap_servers = props
        .get(&key)
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| MirrorConfigError::Missing {
            key: key.clone(),
            reason: format!("say where cluster '{alias}' is, e.g. {key} = host:9092"),
        })?;
    let own = prefixed(props, &format!("{alias}."));
    let mut security = ConfigMap::new();
    let mut security_written = ConfigMap::new();
    for (k, v) in props.iter().filter(|(k, _)| is_security_key(k)) {
        security.insert(k.clone(), v.clone());
        security_written.insert(k.clone(), k.clone());
    }
    for (k, v) in own.iter().filter(|(k, _)| is_security_key(k)) {
        security.insert(k.clone(), v.clone());
        security_written.insert(k.clone(), format!("{alias}.{k}"));
    }
    let settings = ClusterSettings {
        alias: alias.to_owned(),
        bootstrap_servers,
        security,
        security_written,
        consumer: prefixed(&own, "consumer."),
        producer: prefixed(&own, "producer."),
        admin: prefixed(&own, "admin."),
        exactly_once_support: own.get("exactly.once.source.support").cloned(),
    };
    settings.security_settings()?;
    Ok(settings)
}

/// The value of a flow key: `A->B.name`, else `name`, else `fallback` (the cluster's), else
/// MM2's default; with the key it was read under, for errors.
fn lookup<'a>(
    props: &'a ConfigMap,
    flow: &str,
    name: &str,
    fallback: Option<(&'a str, String)>,
) -> (&'a str, String) {
    let flow_key = format!("{flow}.{name}");
    if let Some(v) = props.get(&flow_key) {
        return (v.as_str(), flow_key);
    }
    if let Some(v) = props.get(name) {
        return (v.as_str(), name.to_owned());
    }
    if let Some((v, key)) = fallback {
        return (v, key);
    }
    let default = FLOW_KEYS
        .iter()
        .find(|(k, _, _)| *k == name)
        .map_or("", |(_, _, d)| *d);
    (default, name.to_owned())
}

fn parse_bool(key: &str, value: &str) -> Result<bool, MirrorConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "expected true or false")),
    }
}

fn parse_long(key: &str, value: &str, min: i64) -> Result<i64, MirrorConfigError> {
    let n: i64 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, "expected a whole number"))?;
    if n < min {
        return Err(invalid(key, value, format!("must be at least {min}")));
    }
    Ok(n)
}

fn check_kind(key: &str, value: &str, kind: Kind) -> Result<(), MirrorConfigError> {
    match kind {
        Kind::Bool => parse_bool(key, value).map(drop),
        Kind::Long(min) => parse_long(key, value, min).map(drop),
        Kind::ReplicationFactor => parse_replication_factor(key, value).map(drop),
        Kind::Regexes => NameFilter::parse(key, value).map(drop),
        Kind::Text => Ok(()),
        Kind::OneOf(words) => {
            if words.contains(&value.trim()) {
                Ok(())
            } else {
                Err(invalid(
                    key,
                    value,
                    format!("expected one of {}", words.join(", ")),
                ))
            }
        }
    }
}

fn parse_replication_factor(key: &str, value: &str) -> Result<i16, MirrorConfigError> {
    let n: i16 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, "expected a whole number"))?;
    if n == 0 || n < -1 {
        return Err(invalid(
            key,
            value,
            "must be -1 (the broker's default.replication.factor) or at least 1",
        ));
    }
    Ok(n)
}

/// Reads every flow key of `source->target`, checking each value under the key it came from.
struct FlowReader<'a> {
    props: &'a ConfigMap,
    flow: String,
}

impl FlowReader<'_> {
    fn raw(&self, name: &str) -> Result<(String, String), MirrorConfigError> {
        let (value, key) = lookup(self.props, &self.flow, name, None);
        if let Some(kind) = flow_key(name) {
            check_kind(&key, value, kind)?;
        }
        Ok((value.trim().to_owned(), key))
    }

    fn bool(&self, name: &str) -> Result<bool, MirrorConfigError> {
        let (v, k) = self.raw(name)?;
        parse_bool(&k, &v)
    }

    fn long(&self, name: &str) -> Result<i64, MirrorConfigError> {
        let (v, k) = self.raw(name)?;
        parse_long(&k, &v, i64::MIN)
    }

    fn seconds(&self, name: &str) -> Result<Duration, MirrorConfigError> {
        Ok(Duration::from_secs(self.long(name)?.max(0) as u64))
    }

    fn factor(&self, name: &str) -> Result<i16, MirrorConfigError> {
        let (v, k) = self.raw(name)?;
        parse_replication_factor(&k, &v)
    }

    fn filter(&self, name: &str) -> Result<NameFilter, MirrorConfigError> {
        let (v, k) = self.raw(name)?;
        NameFilter::parse(&k, &v)
    }
}

fn flow_settings(
    props: &ConfigMap,
    clusters: &BTreeMap<String, ClusterSettings>,
    source: &str,
    target: &str,
) -> Result<FlowSettings, MirrorConfigError> {
    let flow = format!("{source}->{target}");
    let read = FlowReader {
        props,
        flow: flow.clone(),
    };
    let (class, class_key) = read.raw("replication.policy.class")?;
    let (separator, separator_key) = read.raw("replication.policy.separator")?;
    if separator.is_empty() {
        return Err(invalid(
            &separator_key,
            &separator,
            "the separator may not be empty",
        ));
    }
    let internal_separator = read.bool("replication.policy.internal.topic.separator.enabled")?;
    let policy = ReplicationPolicy::from_class(&class, &separator, internal_separator, source)
        .ok_or_else(|| {
            invalid(
                &class_key,
                &class,
                "expected DefaultReplicationPolicy or IdentityReplicationPolicy \
                 (org.apache.kafka.connect.mirror.*); other policies are Java classes Spillway \
                 cannot load",
            )
        })?;
    // Exactly-once: the flow's own key, else the target cluster's, else the top-level one.
    let target_support = clusters[target].exactly_once_support.clone();
    let (eos, eos_key) = {
        let flow_key = format!("{flow}.exactly.once.source.support");
        match (props.get(&flow_key), target_support) {
            (Some(v), _) => (v.trim().to_owned(), flow_key),
            (None, Some(v)) => (
                v.trim().to_owned(),
                format!("{target}.exactly.once.source.support"),
            ),
            (None, None) => read.raw("exactly.once.source.support")?,
        }
    };
    check_kind(
        &eos_key,
        &eos,
        Kind::OneOf(&["enabled", "preparing", "disabled"]),
    )?;
    let mut consumer = clusters[source].consumer.clone();
    consumer.extend(prefixed(props, "consumer."));
    consumer.extend(prefixed(props, &format!("{flow}.consumer.")));
    let mut producer = clusters[target].producer.clone();
    producer.extend(prefixed(props, "producer."));
    producer.extend(prefixed(props, &format!("{flow}.producer.")));
    let mode = match consumer.get("group.protocol").map(|p| p.trim()) {
        Some("share") => ConsumeMode::Share,
        Some("classic" | "consumer") | None => ConsumeMode::Classic,
        Some(other) => {
            return Err(invalid(
                &format!("{flow}.consumer.group.protocol"),
                other,
                "expected classic, consumer or share",
            ))
        }
    };
    let settings = FlowSettings {
        source: source.to_owned(),
        target: target.to_owned(),
        enabled: parse_bool(
            &format!("{flow}.enabled"),
            props
                .get(&format!("{flow}.enabled"))
                .map_or("false", String::as_str),
        )?,
        topics: read.filter("topics")?,
        topics_exclude: read.filter("topics.exclude")?,
        groups: read.filter("groups")?,
        groups_exclude: read.filter("groups.exclude")?,
        replication_factor: read.factor("replication.factor")?,
        heartbeats_topic_replication_factor: read.factor("heartbeats.topic.replication.factor")?,
        checkpoints_topic_replication_factor: read
            .factor("checkpoints.topic.replication.factor")?,
        offset_syncs_topic_replication_factor: read
            .factor("offset-syncs.topic.replication.factor")?,
        policy,
        sync_topic_configs: read.bool("sync.topic.configs.enabled")?,
        sync_topic_configs_interval: read.seconds("sync.topic.configs.interval.seconds")?,
        refresh_topics: read.bool("refresh.topics.enabled")?,
        refresh_topics_interval: read.seconds("refresh.topics.interval.seconds")?,
        emit_heartbeats: read.bool("emit.heartbeats.enabled")?,
        emit_heartbeats_interval: read.seconds("emit.heartbeats.interval.seconds")?,
        heartbeats_replication: read.bool("heartbeats.replication.enabled")?,
        emit_checkpoints: read.bool("emit.checkpoints.enabled")?,
        emit_checkpoints_interval: read.seconds("emit.checkpoints.interval.seconds")?,
        emit_offset_syncs: read.bool("emit.offset-syncs.enabled")?,
        sync_group_offsets: read.bool("sync.group.offsets.enabled")?,
        sync_group_offsets_interval: read.seconds("sync.group.offsets.interval.seconds")?,
        offset_lag_max: read.long("offset.lag.max")?,
        offset_syncs_location: match read.raw("offset-syncs.topic.location")?.0.as_str() {
            "target" => OffsetSyncsLocation::Target,
            _ => OffsetSyncsLocation::Source,
        },
        tasks_max: read.long("tasks.max")? as usize,
        exactly_once: eos == "enabled",
        transaction_interval: match read.raw("transaction.boundary")?.0.as_str() {
            "interval" => Some(Duration::from_millis(
                read.long("transaction.boundary.interval.ms")? as u64,
            )),
            _ => None,
        },
        source_headers: read.bool("source.headers.enabled")?,
        mode,
        consumer,
        producer,
    };
    Ok(settings)
}

impl fmt::Display for ConsumeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConsumeMode::Classic => "classic",
            ConsumeMode::Share => "share",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::config::parse_properties;

    fn parse(text: &str) -> Result<MirrorConfig, MirrorConfigError> {
        MirrorConfig::parse(&parse_properties(text).expect("properties").to_map())
    }

    const TWO: &str =
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n";

    fn flow<'a>(config: &'a MirrorConfig, name: &str) -> &'a FlowSettings {
        config.flow(name).expect("flow")
    }

    #[test]
    fn defaults_are_mirrormakers() {
        let config = parse(&format!("{TWO}A->B.enabled = true\n")).expect("valid");
        let ab = flow(&config, "A->B");
        assert!(ab.enabled);
        assert!(!flow(&config, "B->A").enabled);
        assert!(flow(&config, "B->A").runs(), "heartbeats run on every pair");
        assert_eq!(ab.replication_factor, 2);
        assert_eq!(ab.refresh_topics_interval, Duration::from_secs(600));
        assert_eq!(ab.emit_heartbeats_interval, Duration::from_secs(1));
        assert_eq!(ab.emit_checkpoints_interval, Duration::from_secs(60));
        assert_eq!(ab.offset_lag_max, 100);
        assert!(ab.sync_topic_configs);
        assert!(!ab.sync_group_offsets);
        assert!(!ab.exactly_once);
        assert!(
            !ab.source_headers,
            "MM2's copies carry no provenance headers"
        );
        assert_eq!(ab.mode, ConsumeMode::Classic);
        assert_eq!(ab.tasks_max, 1);
        assert!(ab.topics.matches("orders"));
        assert!(ab.topics_exclude.matches("__consumer_offsets"));
        assert!(ab.topics_exclude.matches("mm2-offset-syncs.B.internal"));
        assert!(ab.topics_exclude.matches("orders.replica"));
        assert!(!ab.topics_exclude.matches("orders"));
        assert!(ab.groups_exclude.matches("connect-sink"));
        assert_eq!(ab.policy.format_remote_topic("A", "orders"), "A.orders");
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn a_flow_key_overrides_the_top_level_key() {
        let config = parse(&format!(
            "{TWO}A->B.enabled = true\nB->A.enabled = true\nreplication.factor = 3\n\
             A->B.replication.factor = 1\ntopics = orders.*\nB->A.topics = payments, refunds\n"
        ))
        .expect("valid");
        let ab = flow(&config, "A->B");
        let ba = flow(&config, "B->A");
        assert_eq!(ab.replication_factor, 1);
        assert_eq!(ba.replication_factor, 3);
        assert!(ab.topics.matches("orders-eu") && !ab.topics.matches("payments"));
        assert!(ba.topics.matches("refunds") && !ba.topics.matches("orders"));
        assert!(
            !ba.topics.matches("refunds2"),
            "a pattern matches whole names"
        );
    }

    #[test]
    fn an_empty_topic_list_matches_nothing() {
        let config = parse(&format!("{TWO}A->B.enabled = true\nA->B.topics =\n")).expect("valid");
        assert!(!flow(&config, "A->B").topics.matches("orders"));
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let cases = [
            ("A->B.enabled = yes\n", "A->B.enabled"),
            ("A->B.replication.factor = 0\n", "A->B.replication.factor"),
            (
                "refresh.topics.interval.seconds = soon\n",
                "refresh.topics.interval.seconds",
            ),
            ("A->B.topics = orders, (\n", "A->B.topics"),
            (
                "replication.policy.class = com.acme.MyPolicy\n",
                "replication.policy.class",
            ),
            ("emit.heartbeats.enabled = 1\n", "emit.heartbeats.enabled"),
            (
                "B.exactly.once.source.support = on\n",
                "B.exactly.once.source.support",
            ),
            (
                "A->B.consumer.group.protocol = queue\n",
                "A->B.consumer.group.protocol",
            ),
            (
                "replication.policy.separator =\n",
                "replication.policy.separator",
            ),
        ];
        for (line, key) in cases {
            let err = parse(&format!("{TWO}{line}")).expect_err(line);
            assert!(err.to_string().contains(key), "{line}: {err}");
        }
    }

    #[test]
    fn clusters_and_their_addresses_are_required() {
        let err = parse("A.bootstrap.servers = a:9092\n").expect_err("no clusters");
        assert!(err.to_string().contains("clusters"), "{err}");
        let err = parse("clusters = A, B\nA.bootstrap.servers = a:9092\n").expect_err("no B");
        assert!(err.to_string().contains("B.bootstrap.servers"), "{err}");
        let err = parse("clusters = A\nA.bootstrap.servers = a:9092\n").expect_err("one");
        assert!(err.to_string().contains("at least two"), "{err}");
        let err = parse("clusters = A, A.x\n").expect_err("dot");
        assert!(err.to_string().contains("'A.x'"), "{err}");
    }

    #[test]
    fn unknown_keys_are_warned_by_name() {
        let config = parse(&format!(
            "{TWO}A->B.enabled = true\nA->B.topic = orders\nB.offset.storage.replication.factor = 1\n\
             sync.topic.acls.enabled = false\nA->C.enabled = true\n"
        ))
        .expect("valid");
        let all = config.warnings.join("\n");
        assert!(all.contains("unknown key A->B.topic"), "{all}");
        assert!(
            all.contains("B.offset.storage.replication.factor has no effect"),
            "{all}"
        );
        assert!(
            all.contains("sync.topic.acls.enabled has no effect"),
            "{all}"
        );
        assert!(all.contains("unknown key A->C.enabled"), "{all}");
        assert_eq!(config.warnings.len(), 4, "{all}");
    }

    #[test]
    fn offset_syncs_live_on_the_source_by_default_and_on_the_target_when_asked() {
        let config = parse(&format!(
            "{TWO}A->B.enabled = true\nB->A.enabled = true\n\
             B->A.offset-syncs.topic.location = target\n"
        ))
        .expect("valid");
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        let ab = config.flow("A->B").expect("A->B");
        assert_eq!(ab.offset_syncs_location, OffsetSyncsLocation::Source);
        assert_eq!(ab.offset_syncs_cluster(), "A");
        assert_eq!(ab.offset_syncs_topic(), "mm2-offset-syncs.B.internal");
        let ba = config.flow("B->A").expect("B->A");
        assert_eq!(ba.offset_syncs_location, OffsetSyncsLocation::Target);
        assert_eq!(ba.offset_syncs_cluster(), "A");
        assert_eq!(ba.offset_syncs_topic(), "mm2-offset-syncs.B.internal");
        let err = parse(&format!(
            "{TWO}A->B.enabled = true\noffset-syncs.topic.location = remote\n"
        ))
        .expect_err("not a location");
        assert!(
            err.to_string().contains("offset-syncs.topic.location"),
            "{err}"
        );
    }

    #[test]
    fn cluster_security_takes_top_level_keys_then_the_clusters_own() {
        let config = parse(&format!(
            "{TWO}A->B.enabled = true\nsecurity.protocol = SASL_SSL\nsasl.mechanism = PLAIN\n\
             sasl.username = all\nsasl.password = p\nB.security.protocol = SASL_PLAINTEXT\n\
             A.sasl.username = alice\n"
        ))
        .expect("valid");
        let a = config.cluster("A").security_settings().expect("a");
        assert_eq!(a.describe(), "SASL_SSL with SASL PLAIN as 'alice'");
        let b = config.cluster("B").security_settings().expect("b");
        assert_eq!(b.describe(), "SASL_PLAINTEXT with SASL PLAIN as 'all'");
    }

    #[test]
    fn inherited_security_that_does_not_fit_a_cluster_is_refused_naming_the_keys() {
        let err = parse(&format!(
            "{TWO}sasl.mechanism = PLAIN\nsasl.username = u\nsasl.password = p\n\
             A.security.protocol = SASL_SSL\n"
        ))
        .expect_err("B has SASL keys but PLAINTEXT");
        let text = err.to_string();
        assert!(
            text.contains("B.security.protocol") && text.contains("sasl.username"),
            "{text}"
        );
        assert!(
            !text.contains("B.sasl.username"),
            "top-level keys are named as written: {text}"
        );
    }

    #[test]
    fn unusable_cluster_security_is_refused_naming_the_cluster() {
        let err = parse(&format!("{TWO}A.security.protocol = TLS\n")).expect_err("bad");
        assert!(err.to_string().contains("A.security.protocol"), "{err}");
    }

    #[test]
    fn exactly_once_follows_the_target_clusters_support() {
        let config = parse(&format!(
            "{TWO}A->B.enabled = true\nB->A.enabled = true\nB.exactly.once.source.support = enabled\n"
        ))
        .expect("valid");
        assert!(flow(&config, "A->B").exactly_once);
        assert!(!flow(&config, "B->A").exactly_once);
        let config = parse(&format!(
            "{TWO}exactly.once.source.support = enabled\nB->A.exactly.once.source.support = disabled\n"
        ))
        .expect("valid");
        assert!(flow(&config, "A->B").exactly_once);
        assert!(!flow(&config, "B->A").exactly_once);
    }

    #[test]
    fn a_flow_may_hold_several_batches_per_transaction() {
        let config = parse(&format!(
            "{TWO}exactly.once.source.support = enabled
A->B.transaction.boundary = interval
\
             transaction.boundary.interval.ms = 250
"
        ))
        .expect("valid");
        assert_eq!(
            flow(&config, "A->B").transaction_interval,
            Some(Duration::from_millis(250))
        );
        assert_eq!(flow(&config, "B->A").transaction_interval, None);
        let err = parse(&format!(
            "{TWO}transaction.boundary = connector
"
        ))
        .expect_err("not a boundary");
        assert!(err.to_string().contains("transaction.boundary"), "{err}");
    }

    #[test]
    fn client_keys_reach_the_flow_with_the_flows_own_last() {
        let config = parse(&format!(
            "{TWO}A.consumer.fetch.min.bytes = 1\nconsumer.fetch.min.bytes = 2\n\
             A->B.consumer.group.protocol = share\nB.producer.linger.ms = 5\nA->B.producer.linger.ms = 7\n"
        ))
        .expect("valid");
        let ab = flow(&config, "A->B");
        assert_eq!(ab.consumer["fetch.min.bytes"], "2");
        assert_eq!(ab.mode, ConsumeMode::Share);
        assert_eq!(ab.producer["linger.ms"], "7");
        assert_eq!(flow(&config, "B->A").mode, ConsumeMode::Classic);
    }

    #[test]
    fn heartbeats_off_leaves_only_enabled_flows_running() {
        let config = parse(&format!(
            "{TWO}A->B.enabled = true\nemit.heartbeats.enabled = false\n"
        ))
        .expect("valid");
        assert!(flow(&config, "A->B").runs());
        assert!(!flow(&config, "B->A").runs());
    }
}
