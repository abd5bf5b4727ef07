//! CreateTopics, CreatePartitions, and listing topics (Metadata).

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreateTopicsRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::{codes, AdminClient, AdminError};

const CREATE_TOPICS: &str = "CreateTopics";
/// v4 takes -1 for "the broker's default" partitions and replication factor.
const CREATE_TOPICS_VERSIONS: (i16, i16) = (4, 7);

const CREATE_PARTITIONS: &str = "CreatePartitions";
/// Kafka 4.0 removed v0 and v1 (KIP-896).
const CREATE_PARTITIONS_VERSIONS: (i16, i16) = (2, 3);

const METADATA: &str = "Metadata";
/// As the cluster view's own Metadata requests (`crate::cluster`).
const METADATA_VERSIONS: (i16, i16) = (10, 13);

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    /// -1: the broker's `num.partitions`.
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i16,
    /// Topic configs, e.g. `cleanup.policy=compact`.
    pub configs: Vec<(String, String)>,
}

/// What CreateTopics did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicCreation {
    Created,
    /// The topic was there already (nothing was changed).
    AlreadyExists,
}

impl AdminClient {
    /// Create `topic` unless it exists. Sent to any broker, which hands it to the controller
    /// (Kafka's admin client does the same under KRaft).
    pub async fn create_topic(&self, topic: &NewTopic) -> Result<TopicCreation, AdminError> {
        let operation = format!("creating topic '{}'", topic.name);
        let conn = self.any_broker(&operation, CREATE_TOPICS).await?;
        let mut creatable = CreatableTopic::default();
        creatable.name = TopicName(StrBytes::from_string(topic.name.clone()));
        creatable.num_partitions = topic.partitions;
        creatable.replication_factor = topic.replication_factor;
        creatable.configs = topic
            .configs
            .iter()
            .map(|(k, v)| {
                let mut config = CreatableTopicConfig::default();
                config.name = StrBytes::from_string(k.clone());
                config.value = Some(StrBytes::from_string(v.clone()));
                config
            })
            .collect();
        let mut request = CreateTopicsRequest::default();
        request.topics = vec![creatable];
        request.timeout_ms = i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX);
        let response = self
            .send(
                &conn,
                &request,
                CREATE_TOPICS_VERSIONS,
                &operation,
                CREATE_TOPICS,
            )
            .await?;
        let result = response
            .topics
            .iter()
            .find(|t| t.name.0.as_str() == topic.name)
            .ok_or_else(|| AdminError::Resource {
                operation: operation.clone(),
                resource: format!("topic '{}'", topic.name),
                code: -1,
                code_name: "UnknownServerError".to_owned(),
                message: ": the answer has no result for the topic".to_owned(),
            })?;
        match result.error_code {
            0 => Ok(TopicCreation::Created),
            codes::TOPIC_ALREADY_EXISTS => Ok(TopicCreation::AlreadyExists),
            // Kafka allows CREATE on the cluster or on the topic.
            code => Err(AdminError::from_code(
                &operation,
                &format!("topic '{}' (or on the cluster)", topic.name),
                code,
                result.error_message.as_deref(),
                "CREATE",
            )),
        }
    }
}

impl AdminClient {
    /// Grow `topic` to `total` partitions (the controller places the new ones). Kafka refuses
    /// a count that is not more than the topic has (INVALID_PARTITIONS).
    pub async fn create_partitions(&self, topic: &str, total: i32) -> Result<(), AdminError> {
        let operation = format!("growing topic '{topic}' to {total} partitions");
        let conn = self.any_broker(&operation, CREATE_PARTITIONS).await?;
        let mut grown = CreatePartitionsTopic::default();
        grown.name = TopicName(StrBytes::from_string(topic.to_owned()));
        grown.count = total;
        grown.assignments = None;
        let mut request = CreatePartitionsRequest::default();
        request.topics = vec![grown];
        request.timeout_ms = i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX);
        let response = self
            .send(
                &conn,
                &request,
                CREATE_PARTITIONS_VERSIONS,
                &operation,
                CREATE_PARTITIONS,
            )
            .await?;
        let result = response
            .results
            .iter()
            .find(|t| t.name.0.as_str() == topic)
            .ok_or_else(|| AdminError::Resource {
                operation: operation.clone(),
                resource: format!("topic '{topic}'"),
                code: -1,
                code_name: "UnknownServerError".to_owned(),
                message: ": the answer has no result for the topic".to_owned(),
            })?;
        match result.error_code {
            0 => Ok(()),
            code => Err(AdminError::from_code(
                &operation,
                &format!("topic '{topic}'"),
                code,
                result.error_message.as_deref(),
                "ALTER",
            )),
        }
    }
}

impl AdminClient {
    /// Every topic the cluster shows this client, internal ones included, with its partition
    /// count: a Metadata request for all topics, as Kafka's `listTopics` sends. A topic the
    /// answer marks with an error (one being created, say) is left out, as it has no partitions
    /// to count yet.
    pub async fn list_topics(&self) -> Result<BTreeMap<String, i32>, AdminError> {
        let operation = "listing the cluster's topics";
        let conn = self.any_broker(operation, METADATA).await?;
        let mut request = MetadataRequest::default();
        // None: every topic (an empty list would ask for none).
        request.topics = None;
        request.allow_auto_topic_creation = false;
        let response = self
            .send(&conn, &request, METADATA_VERSIONS, operation, METADATA)
            .await?;
        if response.error_code != 0 {
            return Err(AdminError::from_code(
                operation,
                "the cluster",
                response.error_code,
                None,
                "DESCRIBE",
            ));
        }
        Ok(response
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .filter_map(|t| Some((t.name.as_ref()?.0.to_string(), t.partitions.len() as i32)))
            .collect())
    }
}
