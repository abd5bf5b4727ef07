//! Topics that gain partitions, as on Kafka (`ProxyOptions::with_partition_growth`). The dev
//! broker cannot add partitions to a topic, so a topic is made on it with more partitions than
//! it is said to have (its capacity) and the proxy shows clients only the first `visible` ones:
//! Metadata lists those, Produce to a hidden partition never reaches the dev broker, and Fetch
//! and ListOffsets answers for one become UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers for a
//! partition that does not exist. CreatePartitions (the admin emulation) raises `visible` up
//! to the capacity; a client then finds the new partitions empty, as on Kafka.
//!
//! Topics the proxy was not told about (made on the dev broker directly) show every partition
//! the dev broker has, and cannot grow.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    FetchResponse, ListOffsetsResponse, MetadataResponse, ProduceRequest, ProduceResponse,
};
use uuid::Uuid;

use super::admin::{lock, UNKNOWN_TOPIC_OR_PARTITION};
use super::frame::{decode_request, encode_request, RequestMeta};

/// Partitions a topic made through the growth emulation has on the dev broker, unless it asks
/// for more: how far it can grow.
pub const DEFAULT_PARTITION_CAPACITY: i32 = 8;

/// A topic's partitions: those clients see and those the dev broker has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrownTopic {
    pub visible: i32,
    pub capacity: i32,
}

/// Why CreatePartitions refuses a topic: Kafka's error code and message.
pub(crate) type Refusal = (i16, String);

const INVALID_PARTITIONS: i16 = 37;

/// The visible partition counts of one proxy's topics.
#[derive(Debug)]
pub struct PartitionGrowth {
    capacity: i32,
    topics: Mutex<BTreeMap<String, GrownTopic>>,
}

/// Partitions of a Produce request the proxy kept from the dev broker: topic (name or id) →
/// partition indexes, answered UNKNOWN_TOPIC_OR_PARTITION.
#[derive(Clone, Debug, Default)]
pub(crate) struct HiddenProduce {
    topics: Vec<(String, Uuid, Vec<i32>)>,
}

impl HiddenProduce {
    pub(crate) fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }
}

impl PartitionGrowth {
    pub(crate) fn new(capacity: i32) -> PartitionGrowth {
        PartitionGrowth {
            capacity,
            topics: Mutex::new(BTreeMap::new()),
        }
    }

    /// Partitions a topic of `partitions` gets on the dev broker.
    pub fn capacity_for(&self, partitions: i32) -> i32 {
        partitions.max(self.capacity)
    }

    /// Shows `visible` of the `capacity` partitions the dev broker has for `topic`.
    pub fn track(&self, topic: &str, visible: i32, capacity: i32) {
        lock(&self.topics).insert(topic.to_owned(), GrownTopic { visible, capacity });
    }

    /// What clients see of `topic`; `None` for a topic the proxy does not track.
    pub fn topic(&self, topic: &str) -> Option<GrownTopic> {
        lock(&self.topics).get(topic).copied()
    }

    fn visible(&self, topic: &str) -> Option<i32> {
        self.topic(topic).map(|t| t.visible)
    }

    /// CreatePartitions for one topic the dev broker has with `actual` partitions: raises its
    /// visible count to `count` (with `apply`), or says why not as Kafka 4.2's controller would.
    pub(crate) fn grow(
        &self,
        topic: &str,
        actual: i32,
        count: i32,
        apply: bool,
    ) -> Result<(), Refusal> {
        let mut topics = lock(&self.topics);
        let now = topics.get(topic).copied().unwrap_or(GrownTopic {
            visible: actual,
            capacity: actual,
        });
        if count == now.visible {
            return Err((
                INVALID_PARTITIONS,
                format!("Topic already has {} partition(s).", now.visible),
            ));
        }
        if count < now.visible {
            return Err((
                INVALID_PARTITIONS,
                format!(
                    "The topic {topic} currently has {} partition(s); {count} would not be an increase.",
                    now.visible
                ),
            ));
        }
        if count > now.capacity {
            return Err((
                INVALID_PARTITIONS,
                format!(
                    "the dev broker cannot add partitions: the proxy's growth emulation made topic \
                     '{topic}' with {} partition(s) and can show at most those, not {count} \
                     (create it through the proxy with fewer, or raise the capacity with \
                     ProxyOptions::with_partition_capacity)",
                    now.capacity
                ),
            ));
        }
        if apply {
            topics.insert(
                topic.to_owned(),
                GrownTopic {
                    visible: count,
                    capacity: now.capacity,
                },
            );
        }
        Ok(())
    }

    /// Drops the partitions clients may not see from a Metadata answer.
    pub(crate) fn metadata(&self, r: &mut MetadataResponse) -> bool {
        let mut changed = false;
        for topic in &mut r.topics {
            let Some(visible) = topic.name.as_ref().and_then(|n| self.visible(n.as_str())) else {
                continue;
            };
            let before = topic.partitions.len();
            topic.partitions.retain(|p| p.partition_index < visible);
            changed |= topic.partitions.len() != before;
        }
        changed
    }

    /// Whether `partition` of the topic (by name, or by id through `name_of`) is hidden.
    fn hidden(
        &self,
        name: &str,
        id: &Uuid,
        partition: i32,
        name_of: &dyn Fn(&Uuid) -> Option<String>,
    ) -> bool {
        let visible = if name.is_empty() {
            name_of(id).and_then(|n| self.visible(&n))
        } else {
            self.visible(name)
        };
        visible.is_some_and(|v| partition >= v)
    }

    /// Takes the hidden partitions out of a Produce request: the request to forward, and what
    /// was taken (answered by [`Self::produce_response`]). Unchanged when nothing is hidden.
    pub(crate) fn produce_request(
        &self,
        meta: RequestMeta,
        frame: Bytes,
        name_of: &dyn Fn(&Uuid) -> Option<String>,
    ) -> Result<(Bytes, HiddenProduce), String> {
        let (header, mut request) = decode_request::<ProduceRequest>(&frame, meta.version)?;
        let mut hidden = HiddenProduce::default();
        for topic in &mut request.topic_data {
            let name = topic.name.0.to_string();
            let mut taken = Vec::new();
            topic.partition_data.retain(|p| {
                let hide = self.hidden(&name, &topic.topic_id, p.index, name_of);
                if hide {
                    taken.push(p.index);
                }
                !hide
            });
            if !taken.is_empty() {
                hidden.topics.push((name, topic.topic_id, taken));
            }
        }
        if hidden.topics.is_empty() {
            return Ok((frame, hidden));
        }
        request.topic_data.retain(|t| !t.partition_data.is_empty());
        Ok((encode_request(&header, &request, meta.version)?, hidden))
    }

    /// Adds UNKNOWN_TOPIC_OR_PARTITION answers for the partitions [`Self::produce_request`]
    /// kept from the dev broker.
    pub(crate) fn produce_response(hidden: &HiddenProduce, r: &mut ProduceResponse) -> bool {
        for (name, id, partitions) in &hidden.topics {
            let position = r.responses.iter().position(|t| {
                (!name.is_empty() && t.name.0.as_str() == name)
                    || (name.is_empty() && t.topic_id == *id)
            });
            let topic = match position {
                Some(i) => &mut r.responses[i],
                None => {
                    let mut t = TopicProduceResponse::default();
                    t.name = kafka_protocol::messages::TopicName(
                        kafka_protocol::protocol::StrBytes::from_string(name.clone()),
                    );
                    t.topic_id = *id;
                    r.responses.push(t);
                    r.responses.last_mut().expect("pushed above")
                }
            };
            for &index in partitions {
                let mut p = PartitionProduceResponse::default();
                p.index = index;
                p.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                p.base_offset = -1;
                p.log_append_time_ms = -1;
                p.log_start_offset = -1;
                topic.partition_responses.push(p);
            }
        }
        !hidden.topics.is_empty()
    }

    /// Fetch answers for hidden partitions become UNKNOWN_TOPIC_OR_PARTITION, without records.
    pub(crate) fn fetch_response(
        &self,
        r: &mut FetchResponse,
        name_of: &dyn Fn(&Uuid) -> Option<String>,
    ) -> bool {
        let mut changed = false;
        for topic in &mut r.responses {
            let name = topic.topic.0.to_string();
            for p in &mut topic.partitions {
                if self.hidden(&name, &topic.topic_id, p.partition_index, name_of) {
                    p.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                    p.high_watermark = -1;
                    p.last_stable_offset = -1;
                    p.log_start_offset = -1;
                    p.aborted_transactions = None;
                    p.records = None;
                    changed = true;
                }
            }
        }
        changed
    }

    /// ListOffsets answers for hidden partitions become UNKNOWN_TOPIC_OR_PARTITION.
    pub(crate) fn list_offsets_response(&self, r: &mut ListOffsetsResponse) -> bool {
        let mut changed = false;
        for topic in &mut r.topics {
            let Some(visible) = self.visible(topic.name.as_str()) else {
                continue;
            };
            for p in topic
                .partitions
                .iter_mut()
                .filter(|p| p.partition_index >= visible)
            {
                p.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                p.timestamp = -1;
                p.offset = -1;
                p.leader_epoch = -1;
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;

    #[test]
    fn growth_is_checked_as_kafka_checks_it_and_bounded_by_the_capacity() {
        let growth = PartitionGrowth::new(8);
        growth.track("orders", 2, 8);
        let refused = growth.grow("orders", 8, 2, true).unwrap_err();
        assert_eq!(refused.0, INVALID_PARTITIONS);
        assert!(refused.1.contains("already has 2"), "{}", refused.1);
        let refused = growth.grow("orders", 8, 1, true).unwrap_err();
        assert!(
            refused.1.contains("would not be an increase"),
            "{}",
            refused.1
        );
        let refused = growth.grow("orders", 8, 9, true).unwrap_err();
        assert!(refused.1.contains("at most those, not 9"), "{}", refused.1);
        growth.grow("orders", 8, 4, false).unwrap();
        assert_eq!(growth.topic("orders").unwrap().visible, 2, "validate only");
        growth.grow("orders", 8, 4, true).unwrap();
        assert_eq!(growth.topic("orders").unwrap().visible, 4);
        // A topic made on the dev broker directly cannot grow past what it has.
        assert!(growth.grow("direct", 3, 4, true).is_err());
    }

    #[test]
    fn metadata_shows_only_the_visible_partitions() {
        let growth = PartitionGrowth::new(8);
        growth.track("orders", 2, 8);
        let mut r = MetadataResponse::default();
        for name in ["orders", "other"] {
            let mut t = MetadataResponseTopic::default();
            t.name = Some(TopicName(StrBytes::from_static_str(name)));
            for i in 0..8 {
                let mut p = MetadataResponsePartition::default();
                p.partition_index = i;
                t.partitions.push(p);
            }
            r.topics.push(t);
        }
        assert!(growth.metadata(&mut r));
        assert_eq!(r.topics[0].partitions.len(), 2);
        assert_eq!(r.topics[1].partitions.len(), 8, "untracked topics pass");
    }
}
