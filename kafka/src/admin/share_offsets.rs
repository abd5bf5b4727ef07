//! DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets (KIP-932, Kafka
//! 4.1+): a share group's start offset per share-partition. All three go to the group's
//! coordinator.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_share_group_offsets_request::{
    AlterShareGroupOffsetsRequestPartition, AlterShareGroupOffsetsRequestTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic;
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, DeleteShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::{AdminClient, AdminError};
use crate::cluster::Cluster;

const DESCRIBE: &str = "DescribeShareGroupOffsets";
const ALTER: &str = "AlterShareGroupOffsets";
const DELETE: &str = "DeleteShareGroupOffsets";
const VERSIONS: (i16, i16) = (0, 0);

/// One share-partition's start offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePartitionOffset {
    pub topic: String,
    pub partition: i32,
    /// `None` when the group has no state for the partition (it starts where
    /// `share.auto.offset.reset` says).
    pub start_offset: Option<i64>,
}

/// A share group's start offsets, sorted by topic and partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareOffsets {
    pub partitions: Vec<SharePartitionOffset>,
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

impl AdminClient {
    /// The start offsets of every share-partition of `group` (of the topics in `topics`, or
    /// of all when it is empty). Needs DESCRIBE on the group and on the topics.
    pub async fn describe_share_offsets(
        &self,
        group: &str,
        topics: &[String],
    ) -> Result<ShareOffsets, AdminError> {
        let operation = format!("reading the start offsets of share group '{group}'");
        let operation = operation.as_str();
        self.with_coordinator(group, operation, DESCRIBE, |conn| async move {
            let mut wanted = DescribeShareGroupOffsetsRequestGroup::default();
            wanted.group_id = Cluster::group_id(group);
            // All topics: the answer is filtered here, which needs no metadata lookups.
            wanted.topics = None;
            let mut request = DescribeShareGroupOffsetsRequest::default();
            request.groups = vec![wanted];
            let response = self
                .send(&conn, &request, VERSIONS, operation, DESCRIBE)
                .await?;
            let answer = response
                .groups
                .into_iter()
                .find(|g| g.group_id.0.as_str() == group)
                .ok_or_else(|| AdminError::Resource {
                    operation: operation.to_owned(),
                    resource: format!("group '{group}'"),
                    code: -1,
                    code_name: "UnknownServerError".to_owned(),
                    message: ": the answer has no result for the group".to_owned(),
                })?;
            group_result(
                operation,
                group,
                answer.error_code,
                answer.error_message.as_deref(),
                "DESCRIBE",
            )?;
            let mut partitions = BTreeMap::new();
            for t in answer.topics {
                let topic = t.topic_name.0.to_string();
                if !topics.is_empty() && !topics.contains(&topic) {
                    continue;
                }
                for p in t.partitions {
                    if p.error_code != 0 {
                        return Err(AdminError::from_code(
                            operation,
                            &format!("topic '{topic}'"),
                            p.error_code,
                            p.error_message.as_deref(),
                            "DESCRIBE",
                        ));
                    }
                    partitions.insert(
                        (topic.clone(), p.partition_index),
                        (p.start_offset >= 0).then_some(p.start_offset),
                    );
                }
            }
            Ok(ShareOffsets {
                partitions: partitions
                    .into_iter()
                    .map(|((topic, partition), start_offset)| SharePartitionOffset {
                        topic,
                        partition,
                        start_offset,
                    })
                    .collect(),
            })
        })
        .await
    }

    /// Set the start offsets of `group`'s share-partitions: `(topic, partition, offset)`.
    /// Kafka accepts this only while the group has no members. Needs READ on the group and on
    /// the topics.
    pub async fn alter_share_offsets(
        &self,
        group: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<(), AdminError> {
        let operation = format!("setting the start offsets of share group '{group}'");
        let operation = operation.as_str();
        let mut by_topic: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
        for (topic, partition, offset) in offsets {
            by_topic
                .entry(topic.as_str())
                .or_default()
                .push((*partition, *offset));
        }
        let topics: Vec<AlterShareGroupOffsetsRequestTopic> = by_topic
            .into_iter()
            .map(|(topic, partitions)| {
                let mut t = AlterShareGroupOffsetsRequestTopic::default();
                t.topic_name = topic_name(topic);
                t.partitions = partitions
                    .into_iter()
                    .map(|(partition, offset)| {
                        let mut p = AlterShareGroupOffsetsRequestPartition::default();
                        p.partition_index = partition;
                        p.start_offset = offset;
                        p
                    })
                    .collect();
                t
            })
            .collect();
        self.with_coordinator(group, operation, ALTER, |conn| {
            let topics = topics.clone();
            async move {
                let mut request = AlterShareGroupOffsetsRequest::default();
                request.group_id = Cluster::group_id(group);
                request.topics = topics;
                let response = self
                    .send(&conn, &request, VERSIONS, operation, ALTER)
                    .await?;
                group_result(
                    operation,
                    group,
                    response.error_code,
                    response.error_message.as_deref(),
                    "READ",
                )?;
                for t in &response.responses {
                    for p in &t.partitions {
                        if p.error_code != 0 {
                            return Err(AdminError::from_code(
                                operation,
                                &format!(
                                    "topic '{}' partition {}",
                                    t.topic_name.0.as_str(),
                                    p.partition_index
                                ),
                                p.error_code,
                                p.error_message.as_deref(),
                                "READ",
                            ));
                        }
                    }
                }
                Ok(())
            }
        })
        .await
    }

    /// Remove `group`'s state for every partition of `topics`: the next member starts where
    /// `share.auto.offset.reset` says. Kafka accepts this only while the group has no members.
    /// Needs DELETE on the group and READ on the topics.
    pub async fn delete_share_offsets(
        &self,
        group: &str,
        topics: &[String],
    ) -> Result<(), AdminError> {
        let operation = format!("deleting the start offsets of share group '{group}'");
        let operation = operation.as_str();
        self.with_coordinator(group, operation, DELETE, |conn| async move {
            let mut request = DeleteShareGroupOffsetsRequest::default();
            request.group_id = Cluster::group_id(group);
            request.topics = topics
                .iter()
                .map(|t| {
                    let mut topic = DeleteShareGroupOffsetsRequestTopic::default();
                    topic.topic_name = topic_name(t);
                    topic
                })
                .collect();
            let response = self
                .send(&conn, &request, VERSIONS, operation, DELETE)
                .await?;
            group_result(
                operation,
                group,
                response.error_code,
                response.error_message.as_deref(),
                "DELETE",
            )?;
            for t in &response.responses {
                if t.error_code != 0 {
                    return Err(AdminError::from_code(
                        operation,
                        &format!("topic '{}'", t.topic_name.0.as_str()),
                        t.error_code,
                        t.error_message.as_deref(),
                        "READ",
                    ));
                }
            }
            Ok(())
        })
        .await
    }
}

/// A group-level error code of a share-offsets answer as the admin error Kafka's code means
/// (`permission`: what the principal needs on the group).
fn group_result(
    operation: &str,
    group: &str,
    code: i16,
    message: Option<&str>,
    permission: &'static str,
) -> Result<(), AdminError> {
    if code == 0 {
        return Ok(());
    }
    Err(AdminError::from_code(
        operation,
        &format!("group '{group}'"),
        code,
        message,
        permission,
    ))
}
