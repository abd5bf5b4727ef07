//! KIP-875's offsets API: reading a connector's offsets, and altering or resetting them while
//! it is STOPPED — through its consumer group (classic mode) or its share group (share mode).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use spillway_actors::consumer_settings::ConsumerSettings;
use spillway_core::config::{SinkConnectorConfig, TopicSelection};
use spillway_storage::{ConnectorRecord, TargetState};
use tracing::info;

use super::{Herder, HerderError};

/// How long reading committed offsets from Kafka may take.
const OFFSETS_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer of `GET /connectors/{name}/offsets`.
#[derive(Debug, Clone, Serialize)]
pub struct Offsets {
    pub offsets: Vec<PartitionOffset>,
    /// Present when offsets cannot be given (share mode): says why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A sink connector's offset of one partition, in Connect's shape.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionOffset {
    pub partition: serde_json::Value,
    pub offset: serde_json::Value,
}

/// One entry of `PATCH /connectors/{name}/offsets`: a partition and its new offset; `None`
/// resets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetChange {
    pub topic: String,
    pub partition: i32,
    pub offset: Option<i64>,
}

/// The topics of a share-mode connector (share mode takes topic names only).
fn share_topics(parsed: &SinkConnectorConfig) -> Vec<String> {
    match &parsed.topics {
        TopicSelection::Names(names) => names.clone(),
        TopicSelection::Pattern(_) => Vec::new(),
    }
}

/// Connect's answers to a successful offsets change.
pub const OFFSETS_ALTERED: &str = "The offsets for this connector have been altered successfully";
pub const OFFSETS_RESET: &str = "The offsets for this connector have been reset successfully";

impl Herder {
    /// Where a connector reads: group protocol, group id (with its tenant's prefix), cluster.
    fn group_of(
        &self,
        tenant: &str,
        name: &str,
        record: &ConnectorRecord,
    ) -> Result<(SinkConnectorConfig, bool, String, String), HerderError> {
        self.group_of_config(tenant, name, &record.config)
    }

    /// The connector's offsets (`GET /connectors/{name}/offsets`): the consumer group's
    /// committed offsets in classic mode. A share group has no offsets per partition — each
    /// record is acknowledged on its own — so share mode answers with an empty list and says so.
    pub async fn offsets(&self, tenant: &str, name: &str) -> Result<Offsets, HerderError> {
        let record = self.record(tenant, name).await?;
        refuse_mirror_offsets(name, &record.config)?;
        let (parsed, share, group, bootstrap) = self.group_of(tenant, name, &record)?;
        if share {
            let admin = self
                .share_admin(&parsed, &group, &bootstrap, "read")
                .await?;
            let topics = share_topics(&parsed);
            let offsets = match admin.describe_share_offsets(&group, &topics).await {
                Ok(offsets) => offsets,
                // A read on an older cluster answers what it can, saying why it is empty.
                Err(e) if e.is_unsupported() => {
                    return Ok(Offsets {
                        offsets: Vec::new(),
                        message: Some(format!(
                            "connector {name} reads through share group '{group}', whose start \
                             offsets cannot be shown: {e} (Kafka 4.1+ has it)"
                        )),
                    })
                }
                Err(e) => {
                    return Err(HerderError::Offsets {
                        action: "read",
                        group: group.clone(),
                        bootstrap: bootstrap.clone(),
                        reason: e.to_string(),
                    })
                }
            };
            return Ok(Offsets {
                offsets: offsets
                    .partitions
                    .into_iter()
                    .filter_map(|p| {
                        let offset = p.start_offset?;
                        Some(PartitionOffset {
                            partition: serde_json::json!({
                                "kafka_topic": p.topic,
                                "kafka_partition": p.partition,
                            }),
                            offset: serde_json::json!({ "kafka_offset": offset }),
                        })
                    })
                    .collect(),
                message: Some(format!(
                    "connector {name} reads through share group '{group}': each offset is the \
                     share-partition's start offset, the first record not yet acknowledged (records \
                     after it may be acknowledged already). A partition the group has no state for \
                     is not listed: it starts where share.auto.offset.reset says"
                )),
            });
        }
        let topics = parsed.topics.clone();
        let security = self.client_security(&parsed);
        let (g, b) = (group.clone(), bootstrap.clone());
        let read =
            tokio::task::spawn_blocking(move || committed_offsets(&b, &g, &security, &topics))
                .await;
        let offsets = match read {
            Ok(result) => result,
            Err(e) => Err(format!("the offset reader stopped: {e}")),
        }
        .map_err(|reason| HerderError::Offsets {
            action: "read",
            group,
            bootstrap,
            reason,
        })?;
        Ok(Offsets {
            offsets,
            message: None,
        })
    }

    /// Changes a STOPPED classic-mode connector's committed offsets (KIP-875):
    /// `PATCH /connectors/{name}/offsets` with `changes`, or `DELETE` (`None`: reset every
    /// partition). A reset partition gets the offset its consumer's `auto.offset.reset` names
    /// (Connect's sink default, `earliest`: the log start; `latest`: the end), committed for the
    /// connector's group — where the connector would start without a committed offset.
    pub async fn alter_offsets(
        &self,
        tenant: &str,
        name: &str,
        changes: Option<Vec<OffsetChange>>,
    ) -> Result<&'static str, HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name).await?;
        refuse_mirror_offsets(name, &record.config)?;
        if record.target_state != TargetState::Stopped {
            return Err(HerderError::BadRequest(format!(
                "Connector {name} is {}: its offsets can be changed only while it is STOPPED \
                 (PUT /connectors/{name}/stop first), so that no task commits meanwhile",
                record.target_state
            )));
        }
        let (parsed, share, group, bootstrap) = self.group_of(tenant, name, &record)?;
        if let Some(changes) = &changes {
            for change in changes {
                if !parsed.topics.includes(&change.topic) {
                    return Err(HerderError::BadRequest(format!(
                        "topic '{}' in the offsets is not one connector {name} reads; it reads {}",
                        change.topic,
                        match &parsed.topics {
                            TopicSelection::Names(names) => names.join(", "),
                            TopicSelection::Pattern(regex) =>
                                format!("topics matching {}", regex.as_str()),
                        }
                    )));
                }
            }
        }
        if share {
            return self
                .alter_share_offsets(name, &parsed, &group, &bootstrap, changes)
                .await;
        }
        let reset_to = parsed
            .consumer_overrides
            .get("auto.offset.reset")
            .or_else(|| self.worker_config.get("consumer.auto.offset.reset"))
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_else(|| "earliest".to_owned());
        let start_at_end = match reset_to.as_str() {
            "earliest" | "smallest" | "beginning" => false,
            "latest" | "largest" | "end" => true,
            other => {
                return Err(HerderError::BadRequest(format!(
                    "connector {name} has auto.offset.reset={other}, so a reset partition has no \
                     offset to start from; give the offsets in a PATCH instead"
                )))
            }
        };
        let security = self.client_security(&parsed);
        let topics = parsed.topics.clone();
        let reset = changes.is_none();
        let (g, b) = (group.clone(), bootstrap.clone());
        let done = tokio::task::spawn_blocking(move || {
            commit_offsets(&b, &g, &security, &topics, changes, start_at_end)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the offset writer stopped: {e}")));
        done.map_err(|reason| HerderError::Offsets {
            action: if reset { "reset" } else { "alter" },
            group: group.clone(),
            bootstrap,
            reason,
        })?;
        info!(tenant, connector = %name, %group, reset, "offsets changed");
        Ok(if reset {
            OFFSETS_RESET
        } else {
            OFFSETS_ALTERED
        })
    }

    /// The worker's admin client for a share-mode connector's cluster, reached with its
    /// consumer's security settings.
    async fn share_admin(
        &self,
        parsed: &SinkConnectorConfig,
        group: &str,
        bootstrap: &str,
        action: &'static str,
    ) -> Result<Arc<spillway_kafka::admin::AdminClient>, HerderError> {
        let failed = |reason: String| HerderError::Offsets {
            action,
            group: group.to_owned(),
            bootstrap: bootstrap.to_owned(),
            reason,
        };
        let security = ConsumerSettings::collect(&self.worker_config, &parsed.consumer_overrides)
            .security()
            .map_err(|e| failed(e.to_string()))?;
        self.worker
            .admin_clients()
            .get(bootstrap, &security, OFFSETS_TIMEOUT)
            .await
            .map_err(|e| failed(e.to_string()))
    }

    /// KIP-875's PATCH and DELETE for a STOPPED share-mode connector: AlterShareGroupOffsets
    /// sets start offsets; DeleteShareGroupOffsets removes the group's state for the
    /// connector's topics, so it starts again where `share.auto.offset.reset` says.
    async fn alter_share_offsets(
        &self,
        name: &str,
        parsed: &SinkConnectorConfig,
        group: &str,
        bootstrap: &str,
        changes: Option<Vec<OffsetChange>>,
    ) -> Result<&'static str, HerderError> {
        let reset = changes.is_none();
        let action = if reset { "reset" } else { "alter" };
        let admin = self.share_admin(parsed, group, bootstrap, action).await?;
        let failed = |e: spillway_kafka::admin::AdminError| match e.code() {
            Some(spillway_kafka::admin::codes::GROUP_NOT_EMPTY) => HerderError::Conflict(format!(
                "share group '{group}' of connector {name} still has members (its tasks may take a \
                 moment to leave after the stop, or another client uses the group); try again \
                 when it is empty: {e}"
            )),
            _ => HerderError::Offsets {
                action,
                group: group.to_owned(),
                bootstrap: bootstrap.to_owned(),
                reason: e.to_string(),
            },
        };
        match changes {
            None => {
                admin
                    .delete_share_offsets(group, &share_topics(parsed))
                    .await
                    .map_err(failed)?;
            }
            Some(changes) => {
                let mut offsets = Vec::new();
                for change in changes {
                    let Some(offset) = change.offset else {
                        return Err(HerderError::BadRequest(format!(
                            "connector {name} reads through share group '{group}', whose state can be \
                             removed only for whole topics: give an offset for {}-{} (a share \
                             group's start offset), or reset all its offsets with DELETE \
                             /connectors/{name}/offsets",
                            change.topic, change.partition
                        )));
                    };
                    offsets.push((change.topic, change.partition, offset));
                }
                admin
                    .alter_share_offsets(group, &offsets)
                    .await
                    .map_err(failed)?;
            }
        }
        info!(connector = %name, %group, reset, "share group offsets changed");
        Ok(if reset {
            OFFSETS_RESET
        } else {
            OFFSETS_ALTERED
        })
    }

    /// The security settings of the connector's consumer (worker `consumer.*`, then its
    /// overrides): what a client of its group needs to reach the cluster.
    fn client_security(&self, parsed: &SinkConnectorConfig) -> Vec<(String, String)> {
        let security =
            |k: &str| k == "security.protocol" || k.starts_with("sasl.") || k.starts_with("ssl.");
        let mut settings: BTreeMap<String, String> = self
            .worker_config
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("consumer.")
                    .map(|k| (k.to_owned(), v.clone()))
            })
            .filter(|(k, _)| security(k))
            .collect();
        settings.extend(
            parsed
                .consumer_overrides
                .iter()
                .filter(|(k, _)| security(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        settings.into_iter().collect()
    }
}

/// A consumer outside `group` (it never joins: no member id) to read or commit the group's
/// offsets, and the cluster's metadata.
fn group_client(
    bootstrap: &str,
    group: &str,
    security: &[(String, String)],
) -> Result<
    (
        rdkafka::consumer::BaseConsumer<spillway_kafka::security::SecurityContext>,
        rdkafka::metadata::Metadata,
    ),
    String,
> {
    use rdkafka::consumer::Consumer;

    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    // Security keys in either spelling, translated for librdkafka (issue 13).
    let context = spillway_kafka::security::rdkafka_config(
        &mut config,
        security.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map_err(|e| e.to_string())?;
    let consumer: rdkafka::consumer::BaseConsumer<spillway_kafka::security::SecurityContext> =
        config
            .create_with_context(context)
            .map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(None, OFFSETS_TIMEOUT)
        .map_err(|e| e.to_string())?;
    Ok((consumer, metadata))
}

/// Commits offsets for `group`: the `changes` given (a `None` offset resets the partition),
/// or a reset of every partition of `topics` when `changes` is `None`. A reset partition gets
/// its log start offset, or its end offset when `start_at_end`.
///
/// Like Connect's `Admin.alterConsumerGroupOffsets`, the commit comes from outside the group
/// (no member id, generation -1), which Kafka accepts while the group is empty — as it is
/// while the connector is STOPPED. (The development broker refuses such commits once the
/// group has had members: see docs/dev-broker.md.)
fn commit_offsets(
    bootstrap: &str,
    group: &str,
    security: &[(String, String)],
    topics: &TopicSelection,
    changes: Option<Vec<OffsetChange>>,
    start_at_end: bool,
) -> Result<(), String> {
    use rdkafka::consumer::{CommitMode, Consumer};
    use rdkafka::{Offset, TopicPartitionList};

    let (consumer, metadata) = group_client(bootstrap, group, security)?;
    let exists = |topic: &str, partition: i32| {
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.partitions().iter().any(|p| p.id() == partition))
    };
    let changes = match changes {
        Some(changes) => changes,
        None => metadata
            .topics()
            .iter()
            .filter(|t| topics.includes(t.name()))
            .flat_map(|t| {
                t.partitions().iter().map(|p| OffsetChange {
                    topic: t.name().to_owned(),
                    partition: p.id(),
                    offset: None,
                })
            })
            .collect(),
    };
    if changes.is_empty() {
        return Ok(());
    }
    let mut partitions = TopicPartitionList::new();
    for change in &changes {
        if !exists(&change.topic, change.partition) {
            return Err(format!(
                "partition {} of topic '{}' does not exist",
                change.partition, change.topic
            ));
        }
        let offset = match change.offset {
            Some(offset) => offset,
            None => {
                let (low, high) = consumer
                    .fetch_watermarks(&change.topic, change.partition, OFFSETS_TIMEOUT)
                    .map_err(|e| e.to_string())?;
                if start_at_end {
                    high
                } else {
                    low
                }
            }
        };
        partitions
            .add_partition_offset(&change.topic, change.partition, Offset::Offset(offset))
            .map_err(|e| e.to_string())?;
    }
    consumer
        .commit(&partitions, CommitMode::Sync)
        .map_err(|e| match e.rdkafka_error_code() {
            Some(rdkafka::types::RDKafkaErrorCode::UnknownMemberId) => format!(
                "{e}: the group is not empty (a member of it is still alive), or the broker refuses commits from outside a group it knows"
            ),
            _ => e.to_string(),
        })
}

/// Reads a consumer group's committed offsets for the partitions of `topics`.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    security: &[(String, String)],
    topics: &TopicSelection,
) -> Result<Vec<PartitionOffset>, String> {
    use rdkafka::consumer::Consumer;
    use rdkafka::{Offset, TopicPartitionList};

    let (consumer, metadata) = group_client(bootstrap, group, security)?;
    let mut partitions = TopicPartitionList::new();
    for topic in metadata
        .topics()
        .iter()
        .filter(|t| topics.includes(t.name()))
    {
        for p in topic.partitions() {
            partitions.add_partition(topic.name(), p.id());
        }
    }
    if partitions.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer
        .committed_offsets(partitions, OFFSETS_TIMEOUT)
        .map_err(|e| e.to_string())?;
    Ok(committed
        .elements()
        .into_iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some(PartitionOffset {
                partition: serde_json::json!({"kafka_topic": e.topic(), "kafka_partition": e.partition()}),
                offset: serde_json::json!({"kafka_offset": offset}),
            }),
            _ => None,
        })
        .collect())
}

/// MirrorMaker 2's connectors keep their positions in their flow's own consumer group on the
/// source cluster (`mirror-<source>-<target>`), not in a group of the connector's: this API
/// has nothing of theirs to show or change.
fn refuse_mirror_offsets(name: &str, config: &spillway_core::ConfigMap) -> Result<(), HerderError> {
    match crate::mirror::connectors::MirrorConnector::of_config(config) {
        Some(connector) => Err(HerderError::BadRequest(format!(
            "connector {name} is a {}: its positions are the consumer group of its flow on the \
             source cluster, read and changed with Kafka's tools (kafka-consumer-groups.sh), not \
             through the offsets API",
            connector.class()
        ))),
        None => Ok(()),
    }
}
