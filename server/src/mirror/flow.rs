//! One flow `A->B` at run time: a worker whose kafka-sink connector copies the flow's topics
//! (connectors plus policy, not a second engine), the discovery that keeps the connector's topic
//! list and the remote topics up to date, topic config sync, and heartbeats.
//!
//! Per refresh (`refresh.topics.interval.seconds`): list the source's topics, keep those
//! [`should_replicate`] accepts, make each remote topic exist with the source's partition count,
//! and when the set of ready topics changed, (re)configure the connector with it. A topic
//! whose remote topic cannot be made is not replicated yet (logged with the reason, tried again
//! at the next refresh): a record is never written to a topic that was not prepared for it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use opentelemetry::metrics::Histogram;
use opentelemetry::KeyValue;
use spillway_actors::Worker;
use spillway_connectors::kafka_mirror_metrics::now_ms;
use spillway_connectors::ConnectorRegistry;
use spillway_core::ConfigMap;
use spillway_kafka::admin::{AdminClient, NewTopic};
use spillway_kafka::producer::{IdempotentProducer, OutRecord};
use tokio::sync::watch;
use tracing::{info, warn};

use super::checkpoints::{Checkpointer, OffsetSyncStore};
use super::config::{ClusterSettings, ConsumeMode, FlowSettings, OffsetSyncsLocation};
use super::heartbeat::Heartbeat;
use super::topics::{should_replicate, RemoteTopics, TopicLister};

/// How long one metadata or admin request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// What a flow has done, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowProgress {
    /// Source topic → partitions its remote topic was made with (the topics being copied).
    pub replicated: BTreeMap<String, i32>,
    /// Heartbeats written to the target.
    pub heartbeats: u64,
    /// Topic config changes applied on the target.
    pub config_changes: u64,
    /// Checkpoints written to the target.
    pub checkpoints: u64,
    /// Translated group offsets committed on the target.
    pub group_offsets_committed: u64,
    /// The last problem, if the last attempt failed.
    pub last_error: Option<String>,
}

pub type SharedProgress = Arc<Mutex<FlowProgress>>;

/// The connector name of a flow's records (and, under the identity policy, a second one for
/// heartbeats, whose names change): `mirror-A-B`, `mirror-A-B-heartbeats`. Connector names
/// end up in group ids, transactional ids and topic names, where `->` may not appear.
fn connector_name(flow: &FlowSettings, heartbeats: bool) -> String {
    let base = format!("mirror-{}-{}", flow.source, flow.target);
    if heartbeats {
        format!("{base}-heartbeats")
    } else {
        base
    }
}

/// The `topic.rename.format` that turns `topic` into its remote name.
fn rename_format(flow: &FlowSettings, topic: &str) -> String {
    let remote = flow.policy.format_remote_topic(&flow.source, topic);
    match remote.strip_suffix(topic) {
        Some(prefix) => format!("{prefix}${{topic}}"),
        // Policies here only prefix; anything else is named in full.
        None => remote,
    }
}

/// The kafka-sink connector config copying `topics` of `flow` with `format`.
pub fn connector_config(
    flow: &FlowSettings,
    source: &ClusterSettings,
    target: &ClusterSettings,
    name: &str,
    format: &str,
    topics: &[String],
) -> ConfigMap {
    let mut config = ConfigMap::new();
    config.insert("name".into(), name.to_owned());
    config.insert("connector.class".into(), "kafka".into());
    config.insert("tasks.max".into(), flow.tasks_max.to_string());
    config.insert("topics".into(), topics.join(","));
    config.insert(
        "target.bootstrap.servers".into(),
        target.bootstrap_servers.clone(),
    );
    config.insert("topic.rename.format".into(), format.to_owned());
    if checkpoints_apply(flow) {
        config.insert("offset.syncs.topic".into(), flow.offset_syncs_topic());
        config.insert("offset.lag.max".into(), flow.offset_lag_max.to_string());
        if flow.offset_syncs_location == OffsetSyncsLocation::Source {
            // MM2's default: the syncs topic on the source, written with the source cluster's
            // producer settings.
            config.insert(
                "offset.syncs.bootstrap.servers".into(),
                source.bootstrap_servers.clone(),
            );
            for (k, v) in source.security.iter().chain(&source.producer) {
                config.insert(format!("offset.syncs.producer.{k}"), v.clone());
            }
        }
    }
    // Off unless asked for: MM2's copies carry no provenance headers, and they cost librdkafka
    // an allocation each per record.
    config.insert("source.headers".into(), flow.source_headers.to_string());
    // MM2's connector keys naming the flow: the sink records MM2's metrics under them.
    config.insert("source.cluster.alias".into(), flow.source.clone());
    config.insert("target.cluster.alias".into(), flow.target.clone());
    // Classic: same partition number, so order per partition is kept. Share mode keeps the
    // partition too, but records of one partition reach it in no particular order.
    config.insert("target.partition".into(), "keep".into());
    for part in ["key", "value"] {
        config.insert(
            format!("{part}.converter"),
            "org.apache.kafka.connect.converters.ByteArrayConverter".into(),
        );
    }
    config.insert(
        "delivery.guarantee".into(),
        if flow.exactly_once {
            "exactly_once"
        } else {
            "at_least_once"
        }
        .into(),
    );
    if let Some(interval) = flow.transaction_interval.filter(|_| flow.exactly_once) {
        config.insert("transaction.boundary".into(), "interval".into());
        config.insert(
            "transaction.boundary.interval.ms".into(),
            interval.as_millis().to_string(),
        );
    }
    // MM2 copies a new partition from its beginning.
    config.insert(
        "consumer.override.auto.offset.reset".into(),
        "earliest".into(),
    );
    for (k, v) in &flow.consumer {
        config.insert(format!("consumer.override.{k}"), v.clone());
    }
    for (k, v) in target.security.iter().chain(&flow.producer) {
        config.insert(format!("producer.override.{k}"), v.clone());
    }
    config
}

/// Whether `flow` writes offset syncs and checkpoints: a classic copy (share mode keeps no order
/// and no offsets). Exactly-once flows write their syncs in the copies' transactions (syncs on
/// the target) or after them (on the source).
pub fn checkpoints_apply(flow: &FlowSettings) -> bool {
    flow.enabled
        && flow.mode == ConsumeMode::Classic
        && flow.emit_offset_syncs
        && (flow.emit_checkpoints || flow.sync_group_offsets)
}

/// Which of MM2's three connectors a runner plays for its flow: all of them in dedicated mode
/// (`spillway mirror`, [`FlowParts::dedicated`]); one when created on a REST worker as
/// MirrorSourceConnector, MirrorCheckpointConnector or MirrorHeartbeatConnector
/// ([`super::connectors`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowParts {
    /// Copy the topics (MirrorSourceConnector), with topic creation and config sync.
    pub copy: bool,
    /// The copy writes offset syncs.
    pub offset_syncs: bool,
    /// Checkpoints and group offset sync (MirrorCheckpointConnector).
    pub checkpoints: bool,
    /// Heartbeats (MirrorHeartbeatConnector).
    pub heartbeats: bool,
}

impl FlowParts {
    /// Everything the flow's keys turn on, as MM2's dedicated mode runs it.
    pub fn dedicated(flow: &FlowSettings) -> FlowParts {
        FlowParts {
            copy: flow.enabled,
            offset_syncs: checkpoints_apply(flow),
            checkpoints: checkpoints_apply(flow),
            heartbeats: flow.emit_heartbeats,
        }
    }
}

/// The worker config of a flow: the source cluster and its security.
fn worker_config(source: &ClusterSettings) -> ConfigMap {
    let mut config = source.security.clone();
    config.insert("bootstrap.servers".into(), source.bootstrap_servers.clone());
    config
}

/// A running flow.
pub struct FlowRunner {
    pub flow: FlowSettings,
    parts: FlowParts,
    source: ClusterSettings,
    target: ClusterSettings,
    worker: Option<Worker>,
    source_topics: TopicLister,
    remote: RemoteTopics,
    /// Writes heartbeats and checkpoints to the target.
    heartbeat_producer: Option<IdempotentProducer>,
    checkpointer: Option<Arc<Mutex<Checkpointer>>>,
    /// Whether the offset syncs and checkpoints topics were made (else tried each round).
    checkpoint_topics_ready: bool,
    /// Connector name → (rename format, topics) it runs with.
    connectors: BTreeMap<String, (String, Vec<String>)>,
    progress: SharedProgress,
    /// MM2's `checkpoint-latency-ms`: from a checkpoint's making to the target's
    /// acknowledgement.
    checkpoint_latency: Histogram<f64>,
}

impl FlowRunner {
    /// The source topics replicated so far.
    fn replicated_topics(&self) -> Vec<String> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replicated
            .keys()
            .cloned()
            .collect()
    }

    /// Starts every part of `flow` its keys turn on ([`FlowParts::dedicated`]).
    pub async fn start(
        flow: FlowSettings,
        source: ClusterSettings,
        target: ClusterSettings,
        registry: ConnectorRegistry,
        meter: &opentelemetry::metrics::Meter,
    ) -> Result<FlowRunner> {
        let parts = FlowParts::dedicated(&flow);
        Self::start_parts(flow, parts, source, target, registry, meter).await
    }

    /// Starts the `parts` of `flow`.
    pub async fn start_parts(
        flow: FlowSettings,
        parts: FlowParts,
        source: ClusterSettings,
        target: ClusterSettings,
        registry: ConnectorRegistry,
        meter: &opentelemetry::metrics::Meter,
    ) -> Result<FlowRunner> {
        let name = flow.name();
        let admin = |cluster: &ClusterSettings| {
            let cluster = cluster.clone();
            async move {
                let security = cluster.security_settings()?;
                let client_security = security
                    .client_security()
                    .map_err(|e| anyhow!("cluster {}: {e}", cluster.alias))?;
                AdminClient::connect(
                    &cluster.bootstrap_servers,
                    "spillway-mirror",
                    REQUEST_TIMEOUT,
                    client_security,
                )
                .await
                .map(Arc::new)
                .with_context(|| format!("cannot reach cluster {}", cluster.alias))
            }
        };
        let (source_admin, target_admin) = (admin(&source).await?, admin(&target).await?);
        let remote = RemoteTopics {
            source_admin: Arc::clone(&source_admin),
            target: TopicLister::new(Arc::clone(&target_admin), &target),
            target_admin,
            replication_factor: flow.replication_factor,
            sync_configs: flow.sync_topic_configs,
        };
        let worker = if parts.copy {
            Some(
                Worker::start_with_meter(worker_config(&source), registry, meter)
                    .with_context(|| format!("cannot start the worker of flow {name}"))?,
            )
        } else {
            None
        };
        let heartbeat_producer = if parts.heartbeats || parts.checkpoints {
            let keys: Vec<(String, String)> = target
                .security
                .iter()
                .chain(&target.producer)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Some(
                IdempotentProducer::new(
                    &target.bootstrap_servers,
                    keys.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .with_context(|| format!("cannot make the heartbeat producer of flow {name}"))?,
            )
        } else {
            None
        };
        if flow.enabled && flow.mode == ConsumeMode::Share && flow.emit_checkpoints {
            info!(flow = %name, "share mode: no checkpoints (a share group has no offsets to translate; docs/mirror.md)");
        }
        let checkpointer = parts.checkpoints.then(|| {
            Arc::new(Mutex::new(Checkpointer {
                flow: flow.clone(),
                source: source.clone(),
                target: target.clone(),
                syncs_cluster: match flow.offset_syncs_location {
                    OffsetSyncsLocation::Source => source.clone(),
                    OffsetSyncsLocation::Target => target.clone(),
                },
                syncs_topic: flow.offset_syncs_topic(),
                store: OffsetSyncStore::default(),
            }))
        });
        Ok(FlowRunner {
            source_topics: TopicLister::new(source_admin, &source),
            flow,
            parts,
            source,
            target,
            worker,
            remote,
            heartbeat_producer,
            checkpointer,
            checkpoint_topics_ready: false,
            connectors: BTreeMap::new(),
            progress: SharedProgress::default(),
            // MM2 keeps it under MirrorCheckpointConnector, per group and target partition.
            checkpoint_latency: meter
                .f64_histogram("kafka.connect.mirror-checkpoint-connector.checkpoint-latency-ms")
                .with_description("From a checkpoint's making to the target's acknowledgement")
                .with_unit("ms")
                .build(),
        })
    }

    pub fn progress(&self) -> SharedProgress {
        Arc::clone(&self.progress)
    }

    pub fn worker(&self) -> Option<&Worker> {
        self.worker.as_ref()
    }

    fn note_error(&self, error: &anyhow::Error) {
        let text = format!("{error:#}");
        warn!(flow = %self.flow.name(), error = %text, "mirror step failed; tried again later");
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error = Some(text);
    }

    /// One discovery round: remote topics made, the connectors given the ready topics.
    pub async fn refresh(&mut self) -> Result<()> {
        if self.worker.is_none() {
            return Ok(());
        }
        let source = self.source_topics.list().await?;
        let target = self.remote.target.list().await?;
        let mut ready = BTreeMap::new();
        let mut failures = Vec::new();
        for (topic, &partitions) in source
            .iter()
            .filter(|(t, _)| should_replicate(&self.flow, t))
        {
            let remote = self
                .flow
                .policy
                .format_remote_topic(&self.flow.source, topic);
            match self
                .remote
                .ensure(topic, &remote, partitions, target.get(&remote).copied())
                .await
            {
                Ok(()) => {
                    ready.insert(topic.clone(), partitions);
                }
                Err(e) => {
                    // A topic copied before keeps being copied (its remote topic exists).
                    if let Some(&had) = self
                        .progress
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .replicated
                        .get(topic)
                    {
                        ready.insert(topic.clone(), had);
                    }
                    failures.push(format!("{topic}: {e:#}"));
                }
            }
        }
        // The syncs topic exists before the connector's first sync (a sync written to no topic
        // is lost: translation coarser until the next); the checkpoint round tries again.
        if (self.checkpointer.is_some() || self.parts.offset_syncs) && !self.checkpoint_topics_ready
        {
            match self.ensure_checkpoint_topics().await {
                Ok(()) => self.checkpoint_topics_ready = true,
                Err(e) => self.note_error(&e),
            }
        }
        self.apply(&ready).await?;
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.replicated = ready;
        progress.last_error = None;
        drop(progress);
        if !failures.is_empty() {
            return Err(anyhow!(
                "flow {}: not replicating yet: {}",
                self.flow.name(),
                failures.join("; ")
            ));
        }
        Ok(())
    }

    /// Starts, reconfigures or stops the flow's connectors for the `ready` topics.
    async fn apply(&mut self, ready: &BTreeMap<String, i32>) -> Result<()> {
        let Some(worker) = &self.worker else {
            return Ok(());
        };
        let mut wanted: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        let ordinary = rename_format(&self.flow, "x");
        for topic in ready.keys() {
            let format = rename_format(&self.flow, topic);
            let name = connector_name(&self.flow, format != ordinary);
            wanted
                .entry(name)
                .or_insert_with(|| (format, Vec::new()))
                .1
                .push(topic.clone());
        }
        for (name, (format, topics)) in &wanted {
            if self.connectors.get(name) == Some(&(format.clone(), topics.clone())) {
                continue;
            }
            let config =
                connector_config(&self.flow, &self.source, &self.target, name, format, topics);
            if self.connectors.contains_key(name) {
                worker
                    .reconfigure_connector(config)
                    .await
                    .with_context(|| format!("cannot reconfigure connector {name}"))?;
            } else {
                worker
                    .start_connector(config)
                    .await
                    .with_context(|| format!("cannot start connector {name}"))?;
            }
            info!(flow = %self.flow.name(), connector = %name, topics = %topics.join(","), "replicating");
            self.connectors
                .insert(name.clone(), (format.clone(), topics.clone()));
        }
        let gone: Vec<String> = self
            .connectors
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            worker
                .stop_connector(&name)
                .await
                .with_context(|| format!("cannot stop connector {name}"))?;
            self.connectors.remove(&name);
        }
        Ok(())
    }

    /// Copies topic configs of every replicated topic.
    pub async fn sync_configs(&mut self) -> Result<()> {
        if !self.flow.sync_topic_configs {
            return Ok(());
        }
        let topics = self.replicated_topics();
        let mut changed = 0;
        for topic in topics {
            let remote = self
                .flow
                .policy
                .format_remote_topic(&self.flow.source, &topic);
            changed += self
                .remote
                .sync_configs(&topic, &remote)
                .await
                .with_context(|| format!("cannot sync the configs of '{topic}' to '{remote}'"))?;
        }
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .config_changes += changed as u64;
        Ok(())
    }

    /// Creates the target's heartbeats topic (one partition, compacted, as MM2's).
    async fn ensure_heartbeats_topic(&self) -> Result<()> {
        self.remote
            .target_admin
            .create_topic(&NewTopic {
                name: self.flow.policy.heartbeats_topic().to_owned(),
                partitions: 1,
                replication_factor: self.flow.heartbeats_topic_replication_factor,
                configs: vec![("cleanup.policy".into(), "compact".into())],
            })
            .await
            .with_context(|| {
                format!(
                    "cannot create the '{}' topic on cluster {}",
                    self.flow.policy.heartbeats_topic(),
                    self.target.alias
                )
            })?;
        Ok(())
    }

    /// Creates the offset syncs topic (on the source or the target, `offset-syncs.topic.location`)
    /// and the checkpoints topic on the target (one partition each, compacted).
    async fn ensure_checkpoint_topics(&self) -> Result<()> {
        let syncs_admin = match self.flow.offset_syncs_location {
            OffsetSyncsLocation::Source => &self.remote.source_admin,
            OffsetSyncsLocation::Target => &self.remote.target_admin,
        };
        let topics = [
            (
                syncs_admin,
                self.flow.offset_syncs_cluster(),
                self.flow.offset_syncs_topic(),
                self.flow.offset_syncs_topic_replication_factor,
            ),
            (
                &self.remote.target_admin,
                self.target.alias.as_str(),
                self.flow.policy.checkpoints_topic(&self.flow.source),
                self.flow.checkpoints_topic_replication_factor,
            ),
        ];
        for (admin, cluster, name, replication_factor) in topics {
            admin
                .create_topic(&NewTopic {
                    name: name.clone(),
                    partitions: 1,
                    replication_factor,
                    configs: vec![("cleanup.policy".into(), "compact".into())],
                })
                .await
                .with_context(|| format!("cannot create '{name}' on cluster {cluster}"))?;
        }
        Ok(())
    }

    /// One checkpoint round: translate, write checkpoints, sync group offsets.
    pub async fn checkpoint(&mut self) -> Result<()> {
        if self.checkpointer.is_none() {
            return Ok(());
        }
        if !self.checkpoint_topics_ready {
            self.ensure_checkpoint_topics().await?;
            self.checkpoint_topics_ready = true;
        }
        let (Some(checkpointer), Some(producer)) = (&self.checkpointer, &self.heartbeat_producer)
        else {
            return Ok(());
        };
        let topics = if self.worker.is_some() {
            self.replicated_topics()
        } else {
            // A checkpoint connector alone (REST): the source topics its filter takes, as
            // MirrorCheckpointConnector finds them.
            self.source_topics
                .list()
                .await?
                .into_keys()
                .filter(|t| should_replicate(&self.flow, t))
                .collect()
        };
        if topics.is_empty() {
            return Ok(());
        }
        let checkpointer = Arc::clone(checkpointer);
        let sync = self.flow.sync_group_offsets;
        let round = tokio::task::spawn_blocking(move || {
            checkpointer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .round(&topics, sync)
        })
        .await??;
        let results = producer.send_all(&round.checkpoints).await;
        let acked_ms = now_ms();
        for (result, made) in results.into_iter().zip(&round.made) {
            result.with_context(|| {
                format!("cannot write a checkpoint of flow {}", self.flow.name())
            })?;
            self.checkpoint_latency.record(
                (acked_ms - made.at_ms).max(0) as f64,
                &[
                    KeyValue::new("source", self.flow.source.clone()),
                    KeyValue::new("target", self.flow.target.clone()),
                    KeyValue::new("group", made.group.clone()),
                    KeyValue::new("topic", made.remote_topic.clone()),
                    KeyValue::new("partition", i64::from(made.partition)),
                ],
            );
        }
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.checkpoints += round.checkpoints.len() as u64;
        progress.group_offsets_committed += round.committed.len() as u64;
        Ok(())
    }

    /// Writes one heartbeat to the target.
    pub async fn beat(&self) -> Result<()> {
        let Some(producer) = &self.heartbeat_producer else {
            return Ok(());
        };
        if !self.parts.heartbeats {
            return Ok(());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let heartbeat = Heartbeat {
            source_cluster_alias: self.flow.source.clone(),
            target_cluster_alias: self.flow.target.clone(),
            timestamp: now,
        };
        producer
            .send(&OutRecord {
                topic: self.flow.policy.heartbeats_topic().into(),
                partition: Some(0),
                key: Some(heartbeat.key()?),
                value: Some(Bytes::from(heartbeat.value().to_vec())),
                headers: Vec::new(),
                timestamp: Some(now),
            })
            .await
            .with_context(|| format!("cannot write a heartbeat of flow {}", self.flow.name()))?;
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .heartbeats += 1;
        Ok(())
    }

    /// Runs until `stop` turns true, then stops the worker gracefully.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let name = self.flow.name();
        if self.parts.heartbeats {
            if let Err(e) = self.ensure_heartbeats_topic().await {
                self.note_error(&e);
            }
        }
        let period = |d: Duration| tokio::time::interval(d.max(Duration::from_millis(100)));
        let mut refresh = period(self.flow.refresh_topics_interval);
        let mut heartbeat = period(self.flow.emit_heartbeats_interval);
        let mut configs = period(self.flow.sync_topic_configs_interval);
        // Group offsets are synced in the checkpoint round, so it runs at the shorter interval.
        let mut checkpoints = period(if self.flow.sync_group_offsets {
            self.flow
                .emit_checkpoints_interval
                .min(self.flow.sync_group_offsets_interval)
        } else {
            self.flow.emit_checkpoints_interval
        });
        // The first config sync is part of creation; skip the immediate tick.
        configs.tick().await;
        let mut refreshed_once = false;
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = refresh.tick(), if self.flow.refresh_topics || !refreshed_once => {
                    if let Err(e) = self.refresh().await {
                        self.note_error(&e);
                    }
                    refreshed_once = true;
                }
                _ = checkpoints.tick(), if self.checkpointer.is_some() => {
                    if let Err(e) = self.checkpoint().await {
                        self.note_error(&e);
                    }
                }
                _ = heartbeat.tick(), if self.parts.heartbeats => {
                    if let Err(e) = self.beat().await {
                        self.note_error(&e);
                    }
                }
                _ = configs.tick(), if self.flow.sync_topic_configs && self.worker.is_some() => {
                    if let Err(e) = self.sync_configs().await {
                        self.note_error(&e);
                    }
                }
            }
            if *stop.borrow() {
                break;
            }
        }
        if let Some(worker) = self.worker.take() {
            info!(flow = %name, "stopping: finishing in-flight batches and committing");
            worker.shutdown().await;
        }
        if let Some(producer) = &self.heartbeat_producer {
            let producer = producer.clone();
            let _ =
                tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::config::MirrorConfig;
    use spillway_core::config::parse_properties;

    fn config(extra: &str) -> MirrorConfig {
        let text = format!(
            "clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\n\
             A->B.enabled = true\nB.security.protocol = SASL_PLAINTEXT\nB.sasl.mechanism = PLAIN\n\
             B.sasl.username = u\nB.sasl.password = p\n{extra}"
        );
        MirrorConfig::parse(&parse_properties(&text).expect("props").to_map()).expect("valid")
    }

    /// The connector config of flow A->B copying `orders` under `extra` keys.
    fn orders_connector(extra: &str) -> ConfigMap {
        let c = config(extra);
        let flow = c.flow("A->B").expect("flow");
        connector_config(
            flow,
            c.cluster("A"),
            c.cluster("B"),
            "mirror-A-B",
            "A.${topic}",
            &["orders".into()],
        )
    }

    #[test]
    fn the_connector_copies_into_remote_names_on_the_same_partition_with_target_security() {
        let c = config(
            "A->B.consumer.group.protocol = share\nB.exactly.once.source.support = enabled\n",
        );
        let flow = c.flow("A->B").expect("flow");
        let format = rename_format(flow, "orders");
        assert_eq!(format, "A.${topic}");
        let cfg = connector_config(
            flow,
            c.cluster("A"),
            c.cluster("B"),
            &connector_name(flow, false),
            &format,
            &["orders".into(), "payments".into()],
        );
        assert_eq!(cfg["name"], "mirror-A-B");
        assert_eq!(cfg["topics"], "orders,payments");
        assert_eq!(cfg["target.bootstrap.servers"], "b:1");
        assert_eq!(cfg["target.partition"], "keep");
        assert_eq!(cfg["delivery.guarantee"], "exactly_once");
        assert_eq!(cfg["consumer.override.group.protocol"], "share");
        assert_eq!(cfg["producer.override.sasl.username"], "u");
        assert_eq!(cfg["consumer.override.auto.offset.reset"], "earliest");
        assert_eq!(
            (
                cfg["source.cluster.alias"].as_str(),
                cfg["target.cluster.alias"].as_str()
            ),
            ("A", "B")
        );
    }

    #[test]
    fn an_interval_boundary_reaches_the_sink_under_exactly_once_only() {
        let cfg = orders_connector(
            "B.exactly.once.source.support = enabled\ntransaction.boundary = interval\n\
             A->B.transaction.boundary.interval.ms = 300\n",
        );
        assert_eq!(cfg["transaction.boundary"], "interval");
        assert_eq!(cfg["transaction.boundary.interval.ms"], "300");
        let cfg = orders_connector("transaction.boundary = interval\n");
        assert!(!cfg.contains_key("transaction.boundary"), "{cfg:?}");
    }

    #[test]
    fn offset_syncs_go_to_the_source_with_its_security_unless_the_target_is_asked_for() {
        let cfg = orders_connector("A.security.protocol = SASL_PLAINTEXT\nA.sasl.mechanism = PLAIN\nA.sasl.username = a\nA.sasl.password = p\nA.producer.linger.ms = 7\n");
        assert_eq!(cfg["offset.syncs.topic"], "mm2-offset-syncs.B.internal");
        assert_eq!(cfg["offset.syncs.bootstrap.servers"], "a:1");
        assert_eq!(cfg["offset.syncs.producer.sasl.username"], "a");
        assert_eq!(cfg["offset.syncs.producer.linger.ms"], "7");
        assert_eq!(
            cfg["producer.override.sasl.username"], "u",
            "the copies go to B"
        );

        let cfg = orders_connector("offset-syncs.topic.location = target\n");
        assert_eq!(cfg["offset.syncs.topic"], "mm2-offset-syncs.A.internal");
        assert!(
            !cfg.keys().any(|k| k.starts_with("offset.syncs.bootstrap")
                || k.starts_with("offset.syncs.producer.")),
            "{cfg:?}"
        );
    }

    #[test]
    fn copies_carry_no_source_headers_unless_the_flow_asks_for_them() {
        let headers = |extra: &str| orders_connector(extra)["source.headers"].clone();
        assert_eq!(headers(""), "false", "MM2's copies have none");
        assert_eq!(headers("A->B.source.headers.enabled = true\n"), "true");
        assert_eq!(
            headers("source.headers.enabled = true\nA->B.source.headers.enabled = false\n"),
            "false",
            "the flow's key wins"
        );
        assert_eq!(headers("source.headers.enabled = true\n"), "true");
    }

    #[test]
    fn the_identity_policy_renames_only_heartbeats() {
        let c = config("replication.policy.class = IdentityReplicationPolicy\n");
        let flow = c.flow("A->B").expect("flow");
        assert_eq!(rename_format(flow, "orders"), "${topic}");
        assert_eq!(rename_format(flow, "heartbeats"), "A.${topic}");
        assert_ne!(connector_name(flow, true), connector_name(flow, false));
    }
}
