//! The share-group offsets APIs (Kafka 4.1+): DescribeShareGroupOffsets,
//! AlterShareGroupOffsets and DeleteShareGroupOffsets, answered as Kafka 4.2's group
//! coordinator does (GroupCoordinatorService / GroupMetadataManager), with the share
//! coordinator's stored start offsets kept here: the mock cannot move a share-partition's start
//! offset, so deliveries on the dev broker do not follow an altered start offset.
//!
//! Whether a group has members (Alter and Delete need it empty) comes from the launcher's
//! `share_member_ids`, i.e. from the mock itself.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::admin::{
    default_message, lock, AdminEmulation, INVALID_GROUP_ID, UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
};
use super::frame::{decode_request, encode_response, response_header, RequestMeta};

const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;

/// `PartitionFactory.UNINITIALIZED_START_OFFSET` and `DEFAULT_LEADER_EPOCH`.
const UNINITIALIZED_START_OFFSET: i64 = -1;
const DEFAULT_LEADER_EPOCH: i32 = 0;

/// One group's start offsets: topic -> partition -> offset.
type GroupOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// Start offsets per share group.
#[derive(Default)]
pub(crate) struct ShareOffsets {
    groups: Mutex<BTreeMap<String, GroupOffsets>>,
}

impl ShareOffsets {
    pub(crate) fn of(&self, group: &str) -> BTreeMap<(String, i32), i64> {
        lock(&self.groups)
            .get(group)
            .into_iter()
            .flat_map(|topics| {
                topics.iter().flat_map(|(topic, partitions)| {
                    partitions
                        .iter()
                        .map(move |(p, o)| ((topic.clone(), *p), *o))
                })
            })
            .collect()
    }

    fn topic(&self, group: &str, topic: &str) -> Option<BTreeMap<i32, i64>> {
        lock(&self.groups).get(group)?.get(topic).cloned()
    }
}

/// How the mock sees a share group: unknown, or known with these members.
enum Membership {
    Unknown,
    Members(Vec<String>),
}

impl AdminEmulation {
    async fn membership(&self, group: &str) -> Result<Membership, String> {
        let name = group.to_string();
        Ok(
            match self.launcher(move |c| c.share_group_members(&name)).await? {
                None => Membership::Unknown,
                Some(members) => Membership::Members(members),
            },
        )
    }

    pub(crate) async fn describe_share_group_offsets(
        &self,
        meta: RequestMeta,
        frame: Bytes,
    ) -> Result<Bytes, String> {
        let (_, request) =
            decode_request::<DescribeShareGroupOffsetsRequest>(&frame, meta.version)?;
        let mut response = DescribeShareGroupOffsetsResponse::default();
        for group in &request.groups {
            let group_id = group.group_id.0.to_string();
            let mut answer = DescribeShareGroupOffsetsResponseGroup::default();
            answer.group_id = group.group_id.clone();
            let stored = lock(&self.share_offsets.groups)
                .get(&group_id)
                .cloned()
                .unwrap_or_default();
            // Topics named by the request, or (null) every topic the group has state for.
            let wanted: Vec<(String, Option<Vec<i32>>)> = match &group.topics {
                Some(topics) => topics
                    .iter()
                    .map(|t| (t.topic_name.0.to_string(), Some(t.partitions.clone())))
                    .collect(),
                None => stored.keys().map(|t| (t.clone(), None)).collect(),
            };
            let names: Vec<String> = wanted.iter().map(|(t, _)| t.clone()).collect();
            let existing = match self.topics(Some(&names)).await {
                Ok(existing) => existing,
                Err(e) => {
                    answer.error_code = UNKNOWN_SERVER_ERROR;
                    answer.error_message = Some(StrBytes::from_string(e));
                    response.groups.push(answer);
                    continue;
                }
            };
            for (topic, partitions) in wanted {
                let offsets = stored.get(&topic).cloned().unwrap_or_default();
                let mut t = DescribeShareGroupOffsetsResponseTopic::default();
                t.topic_name = StrBytes::from_string(topic.clone()).into();
                let partitions: Vec<i32> =
                    partitions.unwrap_or_else(|| offsets.keys().copied().collect());
                match existing.get(&topic) {
                    // An unknown topic: no offset information, not an error (as OffsetFetch).
                    None => t.topic_id = Uuid::nil(),
                    Some(info) => t.topic_id = info.id,
                }
                for p in partitions {
                    let mut part = DescribeShareGroupOffsetsResponsePartition::default();
                    part.partition_index = p;
                    part.leader_epoch = DEFAULT_LEADER_EPOCH;
                    part.start_offset = match existing.get(&topic) {
                        Some(_) => offsets
                            .get(&p)
                            .copied()
                            .unwrap_or(UNINITIALIZED_START_OFFSET),
                        None => UNINITIALIZED_START_OFFSET,
                    };
                    t.partitions.push(part);
                }
                answer.topics.push(t);
            }
            response.groups.push(answer);
        }
        encode_response(
            &response_header(meta.correlation_id),
            &response,
            meta.version,
        )
    }

    pub(crate) async fn alter_share_group_offsets(
        &self,
        meta: RequestMeta,
        frame: Bytes,
    ) -> Result<Bytes, String> {
        let (_, request) = decode_request::<AlterShareGroupOffsetsRequest>(&frame, meta.version)?;
        let group = request.group_id.0.to_string();
        let mut response = AlterShareGroupOffsetsResponse::default();
        let top_level =
            |response: &mut AlterShareGroupOffsetsResponse, code: i16, message: String| {
                response.error_code = code;
                response.error_message = Some(StrBytes::from_string(message));
            };
        if group.is_empty() {
            top_level(
                &mut response,
                INVALID_GROUP_ID,
                "The group id is invalid.".into(),
            );
            return encode_response(
                &response_header(meta.correlation_id),
                &response,
                meta.version,
            );
        }
        match self.membership(&group).await? {
            Membership::Members(members) if !members.is_empty() => {
                top_level(
                    &mut response,
                    NON_EMPTY_GROUP,
                    "The group is not empty.".into(),
                );
                return encode_response(
                    &response_header(meta.correlation_id),
                    &response,
                    meta.version,
                );
            }
            // An unknown group is created by the alteration, empty.
            _ => {}
        }
        let names: Vec<String> = request
            .topics
            .iter()
            .map(|t| t.topic_name.0.to_string())
            .collect();
        let existing = self.topics(Some(&names)).await?;
        let mut accepted: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for topic in &request.topics {
            let name = topic.topic_name.0.to_string();
            let mut answer = AlterShareGroupOffsetsResponseTopic::default();
            answer.topic_name = topic.topic_name.clone();
            let info = existing.get(&name);
            if let Some(info) = info {
                answer.topic_id = info.id;
            }
            for p in &topic.partitions {
                let mut part = AlterShareGroupOffsetsResponsePartition::default();
                part.partition_index = p.partition_index;
                match info {
                    Some(info) if p.partition_index >= 0 && p.partition_index < info.partitions => {
                        accepted
                            .entry(name.clone())
                            .or_default()
                            .insert(p.partition_index, p.start_offset);
                    }
                    _ => {
                        part.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                        part.error_message = default_message(UNKNOWN_TOPIC_OR_PARTITION)
                            .map(StrBytes::from_static_str);
                    }
                }
                answer.partitions.push(part);
            }
            response.responses.push(answer);
        }
        let mut groups = lock(&self.share_offsets.groups);
        let stored = groups.entry(group).or_default();
        for (topic, offsets) in accepted {
            stored.entry(topic).or_default().extend(offsets);
        }
        drop(groups);
        encode_response(
            &response_header(meta.correlation_id),
            &response,
            meta.version,
        )
    }

    pub(crate) async fn delete_share_group_offsets(
        &self,
        meta: RequestMeta,
        frame: Bytes,
    ) -> Result<Bytes, String> {
        let (_, request) = decode_request::<DeleteShareGroupOffsetsRequest>(&frame, meta.version)?;
        let group = request.group_id.0.to_string();
        let mut response = DeleteShareGroupOffsetsResponse::default();
        let reply = |response: &DeleteShareGroupOffsetsResponse| {
            encode_response(
                &response_header(meta.correlation_id),
                response,
                meta.version,
            )
        };
        if group.is_empty() {
            response.error_code = INVALID_GROUP_ID;
            response.error_message = Some(StrBytes::from_static_str("The group id is invalid."));
            return reply(&response);
        }
        let has_state = lock(&self.share_offsets.groups).contains_key(&group);
        match self.membership(&group).await? {
            Membership::Unknown if !has_state => {
                response.error_code = GROUP_ID_NOT_FOUND;
                response.error_message =
                    Some(StrBytes::from_string(format!("Group {group} not found.")));
                return reply(&response);
            }
            Membership::Members(members) if !members.is_empty() => {
                response.error_code = NON_EMPTY_GROUP;
                response.error_message = Some(StrBytes::from_static_str("The group is not empty."));
                return reply(&response);
            }
            _ => {}
        }
        let names: Vec<String> = request
            .topics
            .iter()
            .map(|t| t.topic_name.0.to_string())
            .collect();
        let existing = self.topics(Some(&names)).await?;
        for topic in &request.topics {
            let name = topic.topic_name.0.to_string();
            let mut answer = DeleteShareGroupOffsetsResponseTopic::default();
            answer.topic_name = topic.topic_name.clone();
            match existing.get(&name) {
                None => {
                    answer.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                    answer.error_message =
                        default_message(UNKNOWN_TOPIC_OR_PARTITION).map(StrBytes::from_static_str);
                }
                Some(info) => {
                    if self.share_offsets.topic(&group, &name).is_some() {
                        if let Some(stored) = lock(&self.share_offsets.groups).get_mut(&group) {
                            stored.remove(&name);
                        }
                        answer.topic_id = info.id;
                    } else {
                        answer.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                        answer.error_message = Some(StrBytes::from_static_str(
                            "There is no offset information to delete.",
                        ));
                    }
                }
            }
            response.responses.push(answer);
        }
        reply(&response)
    }
}
