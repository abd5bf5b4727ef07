//! Topics of one flow: which source topics it replicates (MM2's `shouldReplicateTopic`), and
//! their remote topics on the target — created with the source's partition count and (with
//! `sync.topic.configs.enabled`) its topic configs, grown when the source grows, configs kept
//! in sync.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use spillway_kafka::admin::{
    AdminClient, AdminError, AlterOp, ConfigResource, ConfigSource, NewTopic, ResourceConfigs,
    TopicCreation,
};
use tracing::{info, warn};

use super::config::{ClusterSettings, FlowSettings};

/// Topic configs MM2 never copies (Kafka 4.2 `DefaultConfigPropertyFilter`): they belong to the
/// target cluster's operation, or would change what the target does with the copied records.
pub const CONFIGS_NOT_COPIED: &[&str] = &[
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "message.timestamp.difference.max.ms",
    "message.timestamp.type",
    "unclean.leader.election.enable",
    "min.insync.replicas",
];

/// Whether `flow` replicates source topic `topic`: matched by `topics` and not by
/// `topics.exclude` (or a heartbeats topic, when heartbeats are replicated), never internal,
/// never already from the flow's target (a cycle).
pub fn should_replicate(flow: &FlowSettings, topic: &str) -> bool {
    let policy = &flow.policy;
    let selected = flow.topics.matches(topic) && !flow.topics_exclude.matches(topic);
    let heartbeats = flow.heartbeats_replication && policy.is_heartbeats_topic(topic);
    (selected || heartbeats)
        && !policy.is_internal_topic(topic)
        && !policy.is_cycle(topic, &flow.target)
}

/// Lists a cluster's topics and their partition counts (Metadata for all topics), through the
/// flow's admin client for that cluster: no client of its own, as MirrorMaker 2 lists topics
/// through its connectors' admin clients.
#[derive(Clone)]
pub struct TopicLister {
    admin: Arc<AdminClient>,
    alias: String,
}

impl TopicLister {
    pub fn new(admin: Arc<AdminClient>, cluster: &ClusterSettings) -> TopicLister {
        TopicLister {
            admin,
            alias: cluster.alias.clone(),
        }
    }

    /// Topic name → partition count.
    pub async fn list(&self) -> Result<BTreeMap<String, i32>> {
        self.admin
            .list_topics()
            .await
            .with_context(|| format!("cannot list the topics of cluster {}", self.alias))
    }
}

/// The configs a remote topic takes from its source topic: those set on the source topic
/// itself, readable, not in [`CONFIGS_NOT_COPIED`].
pub fn copied_configs(source: &ResourceConfigs) -> BTreeMap<String, String> {
    source
        .entries
        .values()
        .filter(|e| e.source == ConfigSource::Topic && !e.read_only)
        .filter(|e| !CONFIGS_NOT_COPIED.contains(&e.name.as_str()))
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// The changes that make the target topic's own configs those `wanted` (MM2 with
/// `use.defaults.from=target`: what the source leaves at its default is removed from the
/// target topic, so the target's default applies).
pub fn config_changes(
    wanted: &BTreeMap<String, String>,
    target: &ResourceConfigs,
) -> Vec<(String, AlterOp)> {
    let mut changes = Vec::new();
    for (name, value) in wanted {
        let current = target
            .get(name)
            .filter(|e| e.source == ConfigSource::Topic)
            .and_then(|e| e.value.as_deref());
        if current != Some(value.as_str()) {
            changes.push((name.clone(), AlterOp::Set(value.clone())));
        }
    }
    for entry in target.entries.values() {
        if entry.source == ConfigSource::Topic
            && !entry.read_only
            && !wanted.contains_key(&entry.name)
            && !CONFIGS_NOT_COPIED.contains(&entry.name.as_str())
        {
            changes.push((entry.name.clone(), AlterOp::Delete));
        }
    }
    changes
}

/// Creates and keeps the remote topics of one flow.
pub struct RemoteTopics {
    pub source_admin: Arc<AdminClient>,
    pub target_admin: Arc<AdminClient>,
    pub target: TopicLister,
    pub replication_factor: i16,
    pub sync_configs: bool,
}

impl RemoteTopics {
    async fn source_configs(&self, topic: &str) -> Result<BTreeMap<String, String>, AdminError> {
        let configs = self
            .source_admin
            .describe_configs(&ConfigResource::Topic(topic.to_owned()), &[])
            .await?;
        Ok(copied_configs(&configs))
    }

    /// Makes `remote` exist on the target with `partitions` partitions (creating it, or adding
    /// partitions). `target_partitions` is what the target has now (`None`: no such topic).
    pub async fn ensure(
        &self,
        source_topic: &str,
        remote: &str,
        partitions: i32,
        target_partitions: Option<i32>,
    ) -> Result<()> {
        match target_partitions {
            None => {
                let configs = if self.sync_configs {
                    self.source_configs(source_topic).await.with_context(|| {
                        format!(
                            "cannot read the configs of source topic '{source_topic}' to copy them"
                        )
                    })?
                } else {
                    BTreeMap::new()
                };
                let created = self
                    .target_admin
                    .create_topic(&NewTopic {
                        name: remote.to_owned(),
                        partitions,
                        replication_factor: self.replication_factor,
                        configs: configs.into_iter().collect(),
                    })
                    .await?;
                if created == TopicCreation::Created {
                    info!(topic = remote, partitions, "created remote topic");
                }
            }
            Some(have) if have < partitions => {
                self.target_admin
                    .create_partitions(remote, partitions)
                    .await
                    .with_context(|| {
                        format!(
                            "source topic '{source_topic}' grew to {partitions} partitions; \
                             remote topic '{remote}' has {have}"
                        )
                    })?;
                info!(
                    topic = remote,
                    from = have,
                    to = partitions,
                    "grew remote topic"
                );
            }
            Some(have) if have > partitions => {
                // Kafka cannot shrink topics; records still land on their own partition number.
                warn!(
                    topic = remote,
                    remote_partitions = have,
                    source_partitions = partitions,
                    "remote topic has more partitions than its source; the extra ones stay empty"
                );
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Makes the remote topic's own configs those of the source topic.
    pub async fn sync_configs(&self, source_topic: &str, remote: &str) -> Result<usize> {
        let wanted = self.source_configs(source_topic).await?;
        let current = self
            .target_admin
            .describe_configs(&ConfigResource::Topic(remote.to_owned()), &[])
            .await?;
        let changes = config_changes(&wanted, &current);
        if !changes.is_empty() {
            let borrowed: Vec<(&str, AlterOp)> = changes
                .iter()
                .map(|(k, op)| (k.as_str(), op.clone()))
                .collect();
            self.target_admin
                .incremental_alter_configs(&ConfigResource::Topic(remote.to_owned()), &borrowed)
                .await?;
        }
        Ok(changes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::config::MirrorConfig;
    use spillway_core::config::parse_properties;
    use spillway_kafka::admin::ConfigEntry;

    fn flows(extra: &str) -> MirrorConfig {
        let text = format!(
            "clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\n\
             A->B.enabled = true\nB->A.enabled = true\n{extra}"
        );
        MirrorConfig::parse(&parse_properties(&text).expect("props").to_map()).expect("valid")
    }

    fn flow<'a>(config: &'a MirrorConfig, name: &str) -> &'a FlowSettings {
        config.flow(name).expect("flow")
    }

    #[test]
    fn a_topic_from_the_target_is_never_sent_back() {
        let config = flows("");
        let ab = flow(&config, "A->B");
        let ba = flow(&config, "B->A");
        assert!(should_replicate(ab, "orders"));
        assert!(
            !should_replicate(ba, "A.orders"),
            "B->A must not return A's topic to A"
        );
        assert!(should_replicate(ba, "payments"));
        assert!(!should_replicate(ab, "B.payments"));
    }

    #[test]
    fn internal_topics_are_not_replicated_but_heartbeats_are() {
        let config = flows("topics = orders.*\n");
        let ab = flow(&config, "A->B");
        assert!(!should_replicate(ab, "__consumer_offsets"));
        assert!(!should_replicate(ab, "mm2-offset-syncs.B.internal"));
        assert!(!should_replicate(ab, "B.checkpoints.internal"));
        assert!(!should_replicate(ab, "payments"), "not matched by topics");
        assert!(
            should_replicate(ab, "heartbeats"),
            "heartbeats are replicated as in MM2"
        );
        assert!(should_replicate(ab, "C.heartbeats"));
        assert!(
            !should_replicate(ab, "B.heartbeats"),
            "a cycle even for heartbeats"
        );
        let off = flows("topics = orders.*\nheartbeats.replication.enabled = false\n");
        assert!(!should_replicate(flow(&off, "A->B"), "heartbeats"));
    }

    #[test]
    fn topics_exclude_wins_over_topics() {
        let config = flows("topics = orders.*\ntopics.exclude = orders-test\n");
        let ab = flow(&config, "A->B");
        assert!(should_replicate(ab, "orders-eu"));
        assert!(!should_replicate(ab, "orders-test"));
    }

    fn entry(name: &str, value: &str, source: ConfigSource) -> (String, ConfigEntry) {
        (
            name.to_owned(),
            ConfigEntry {
                name: name.to_owned(),
                value: Some(value.to_owned()),
                source,
                read_only: false,
            },
        )
    }

    #[test]
    fn only_the_source_topics_own_configs_are_copied_except_mm2s_exclusions() {
        let source = ResourceConfigs {
            entries: [
                entry("cleanup.policy", "compact", ConfigSource::Topic),
                entry("retention.ms", "1000", ConfigSource::Default),
                entry("min.insync.replicas", "2", ConfigSource::Topic),
                entry("segment.bytes", "1", ConfigSource::StaticBroker),
            ]
            .into_iter()
            .collect(),
        };
        let copied = copied_configs(&source);
        assert_eq!(
            copied.into_iter().collect::<Vec<_>>(),
            vec![("cleanup.policy".to_owned(), "compact".to_owned())]
        );
    }

    #[test]
    fn config_sync_sets_changed_values_and_removes_ones_the_source_dropped() {
        let wanted: BTreeMap<String, String> =
            [("cleanup.policy".to_owned(), "compact".to_owned())].into();
        let target = ResourceConfigs {
            entries: [
                entry("cleanup.policy", "delete", ConfigSource::Topic),
                entry("retention.ms", "5", ConfigSource::Topic),
                entry("min.insync.replicas", "2", ConfigSource::Topic),
                entry("segment.bytes", "1", ConfigSource::Default),
            ]
            .into_iter()
            .collect(),
        };
        let changes = config_changes(&wanted, &target);
        assert_eq!(
            changes,
            vec![
                ("cleanup.policy".to_owned(), AlterOp::Set("compact".into())),
                ("retention.ms".to_owned(), AlterOp::Delete),
            ]
        );
        let same = ResourceConfigs {
            entries: [entry("cleanup.policy", "compact", ConfigSource::Topic)]
                .into_iter()
                .collect(),
        };
        assert!(config_changes(&wanted, &same).is_empty());
    }
}
