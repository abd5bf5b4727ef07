//! A consumer group's committed offsets (OffsetFetch, to the group's coordinator): what a
//! connector moved from classic to share mode starts its share group from.

use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{OffsetFetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::{AdminClient, AdminError};
use crate::cluster::Cluster;

const OFFSET_FETCH: &str = "OffsetFetch";
/// v1-7 name one group at the top level (v8+ take a list); v2+ carry a group-level error.
const VERSIONS: (i16, i16) = (1, 7);

/// One partition's committed offset: the next record the group would read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl AdminClient {
    /// The offsets `group` has committed on the partitions of `topics` (partitions without a
    /// committed offset are left out), sorted by topic and partition. Needs DESCRIBE on the
    /// group and on the topics.
    pub async fn committed_offsets(
        &self,
        group: &str,
        topics: &[String],
    ) -> Result<Vec<CommittedOffset>, AdminError> {
        let operation = format!("reading the committed offsets of consumer group '{group}'");
        let operation = operation.as_str();
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        self.cluster
            .refresh_metadata(topics)
            .await
            .map_err(|e| AdminError::cluster(operation, OFFSET_FETCH, e))?;
        let wanted: Vec<OffsetFetchRequestTopic> = topics
            .iter()
            .filter_map(|t| {
                let meta = self.cluster.topic(t)?;
                let mut topic = OffsetFetchRequestTopic::default();
                topic.name = TopicName(StrBytes::from_string(t.clone()));
                topic.partition_indexes = meta.leaders.keys().copied().collect();
                Some(topic)
            })
            .collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        self.with_coordinator(group, operation, OFFSET_FETCH, |conn| {
            let wanted = wanted.clone();
            async move {
                let mut request = OffsetFetchRequest::default();
                request.group_id = Cluster::group_id(group);
                request.topics = Some(wanted);
                let response = self
                    .send(&conn, &request, VERSIONS, operation, OFFSET_FETCH)
                    .await?;
                if response.error_code != 0 {
                    return Err(AdminError::from_code(
                        operation,
                        &format!("group '{group}'"),
                        response.error_code,
                        None,
                        "DESCRIBE",
                    ));
                }
                let mut committed = Vec::new();
                for t in &response.topics {
                    for p in &t.partitions {
                        if p.error_code != 0 {
                            return Err(AdminError::from_code(
                                operation,
                                &format!("topic '{}'", t.name.0.as_str()),
                                p.error_code,
                                None,
                                "DESCRIBE",
                            ));
                        }
                        if p.committed_offset >= 0 {
                            committed.push(CommittedOffset {
                                topic: t.name.0.to_string(),
                                partition: p.partition_index,
                                offset: p.committed_offset,
                            });
                        }
                    }
                }
                committed.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                Ok(committed)
            }
        })
        .await
    }
}
