//! Kafka's admin requests, answered by the proxy as Apache Kafka 4.2 would, on top of the dev
//! broker's launcher controls (the mock has no admin APIs): DescribeConfigs and
//! IncrementalAlterConfigs for GROUP, BROKER and TOPIC resources, CreateTopics, and the
//! share-group offsets APIs (`share_offsets`). Opt in with `ProxyOptions::with_admin_emulation`.
//!
//! State the mock cannot hold (group configs, topic configs, share start offsets) lives here;
//! group configs that the mock has a setter for are pushed onto it, cluster-wide. The topics that
//! exist are read with Metadata over one connection to the first broker that the emulation opens
//! at its first need and keeps until the proxy stops (a closing connection would end the mock's
//! share sessions on that broker). Launcher commands block, so they run on tokio's blocking pool.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, MetadataRequest, MetadataResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Message, StrBytes};
use serde_json::{json, Map, Value};
use tokio::net::TcpStream;
use uuid::Uuid;

use super::admin_configs::{
    self as configs, apply_op, broker_configs, group_config, group_defaults,
    parse_share_auto_offset_reset, topic_config, validate_group, validate_topic, BrokerConfig,
    Kind, ShareReset, SOURCE_DEFAULT, SOURCE_GROUP, SOURCE_STATIC_BROKER, SOURCE_TOPIC,
    TOPIC_CONFIGS,
};
use super::frame::{
    decode_request, decode_response, encode_request, encode_response, read_frame, response_header,
    write_frame, RequestMeta,
};
use super::local::{LocalAnswer, LocalApi};
use super::partition_growth::PartitionGrowth;
use super::rewrite::METADATA;
use crate::dev_broker::DevBrokerControl;

pub(crate) const CREATE_TOPICS: i16 = 19;
pub(crate) const CREATE_PARTITIONS: i16 = 37;
pub(crate) const DESCRIBE_CONFIGS: i16 = 32;
pub(crate) const INCREMENTAL_ALTER_CONFIGS: i16 = 44;
pub(crate) const DESCRIBE_SHARE_GROUP_OFFSETS: i16 = 90;
pub(crate) const ALTER_SHARE_GROUP_OFFSETS: i16 = 91;
pub(crate) const DELETE_SHARE_GROUP_OFFSETS: i16 = 92;

/// `ConfigResource.Type` ids.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const BROKER_LOGGER: i8 = 8;
const CLIENT_METRICS: i8 = 16;
const GROUP: i8 = 32;

/// Kafka error codes.
pub(crate) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub(crate) const INVALID_GROUP_ID: i16 = 24;
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const GROUP_AUTHORIZATION_FAILED: i16 = 30;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
const TOPIC_ALREADY_EXISTS: i16 = 36;
const INVALID_PARTITIONS: i16 = 37;
const INVALID_REPLICATION_FACTOR: i16 = 38;
const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
pub(crate) const UNKNOWN_SERVER_ERROR: i16 = -1;

/// Admin operations whose authorization the emulation can refuse, as Kafka's ACL operations
/// name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AdminOperation {
    /// IncrementalAlterConfigs: GROUP_AUTHORIZATION_FAILED for groups,
    /// CLUSTER_AUTHORIZATION_FAILED for brokers, TOPIC_AUTHORIZATION_FAILED for topics.
    AlterConfigs,
    /// DescribeConfigs, with the same per-resource errors.
    DescribeConfigs,
    /// CreateTopics: TOPIC_AUTHORIZATION_FAILED per topic.
    Create,
    /// CreatePartitions (Kafka's ALTER on the topic): TOPIC_AUTHORIZATION_FAILED per topic.
    Alter,
}

/// The emulation's settings in `ProxyOptions`.
#[derive(Clone, Debug)]
pub struct AdminEmulationOptions {
    pub control: DevBrokerControl,
}

/// What a topic looks like on the dev broker.
#[derive(Clone, Debug)]
pub(crate) struct TopicInfo {
    pub id: Uuid,
    pub partitions: i32,
}

/// A share setting the emulation pushed onto the dev broker: the value before its first push
/// (what groups without their own value default to) and the value it last pushed.
#[derive(Clone, Debug)]
struct Pushed {
    base: Value,
    pushed: Value,
}

/// Shared state of the emulation and the runtime controls of `KafkaProxy::admin`.
pub struct AdminEmulation {
    pub(crate) control: DevBrokerControl,
    denied: Mutex<BTreeSet<AdminOperation>>,
    group_configs: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    topic_configs: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    pushed: Mutex<BTreeMap<String, Pushed>>,
    pub(crate) share_offsets: super::share_offsets::ShareOffsets,
    metadata: MetadataConnection,
    /// Visible partition counts, with `ProxyOptions::with_partition_growth`.
    growth: Option<Arc<PartitionGrowth>>,
}

impl std::fmt::Debug for AdminEmulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminEmulation")
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

impl AdminEmulation {
    pub(crate) fn new(
        options: AdminEmulationOptions,
        denied: BTreeSet<AdminOperation>,
        first_broker: String,
        upstream_versions: &[ApiVersion],
        growth: Option<Arc<PartitionGrowth>>,
    ) -> AdminEmulation {
        let metadata_version = upstream_versions
            .iter()
            .find(|k| k.api_key == METADATA)
            .map(|k| k.max_version.min(12))
            .unwrap_or(4);
        AdminEmulation {
            control: options.control,
            denied: Mutex::new(denied),
            group_configs: Mutex::new(BTreeMap::new()),
            topic_configs: Mutex::new(BTreeMap::new()),
            pushed: Mutex::new(BTreeMap::new()),
            share_offsets: Default::default(),
            metadata: MetadataConnection {
                address: first_broker,
                version: metadata_version,
                stream: tokio::sync::Mutex::new(None),
                opened: std::sync::atomic::AtomicU64::new(0),
            },
            growth,
        }
    }

    /// From now on, refuse `operation` as an unauthorized principal would be refused.
    pub fn deny(&self, operation: AdminOperation) {
        lock(&self.denied).insert(operation);
    }

    pub fn allow(&self, operation: AdminOperation) {
        lock(&self.denied).remove(&operation);
    }

    /// Connections the emulation opened to the dev broker for its Metadata lookups (at most one
    /// per proxy unless the broker dropped it).
    pub fn metadata_connections_opened(&self) -> u64 {
        self.metadata
            .opened
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The start offsets stored for a share group: (topic, partition) -> offset.
    pub fn share_start_offsets(&self, group: &str) -> BTreeMap<(String, i32), i64> {
        self.share_offsets.of(group)
    }

    fn denied(&self, operation: AdminOperation) -> bool {
        lock(&self.denied).contains(&operation)
    }

    /// Runs a launcher command on the blocking pool.
    pub(crate) async fn launcher<T: Send + 'static>(
        &self,
        call: impl FnOnce(&DevBrokerControl) -> Result<T, crate::DevBrokerError> + Send + 'static,
    ) -> Result<T, String> {
        let control = self.control.clone();
        tokio::task::spawn_blocking(move || call(&control))
            .await
            .map_err(|e| format!("launcher call panicked: {e}"))?
            .map_err(|e| e.to_string())
    }

    /// The share settings groups without their own value get: the launcher's values in force,
    /// except where this emulation pushed a group's value (then the value from before).
    async fn base_settings(&self) -> Result<Map<String, Value>, String> {
        let mut live = self.launcher(|c| c.share_settings_in_force()).await?;
        let mut pushed = lock(&self.pushed);
        pushed.retain(|key, p| {
            if live.get(key) == Some(&p.pushed) {
                live.insert(key.clone(), p.base.clone());
                true
            } else {
                // Someone set it on the launcher since: that is the base now.
                false
            }
        });
        Ok(live)
    }

    /// Topic name -> id and partition count, for the named topics (all when `None`) that exist.
    pub(crate) async fn topics(
        &self,
        names: Option<&[String]>,
    ) -> Result<BTreeMap<String, TopicInfo>, String> {
        let mut topics = self.metadata.topics(names).await?;
        if let Some(growth) = &self.growth {
            for (name, info) in &mut topics {
                if let Some(grown) = growth.topic(name) {
                    info.partitions = grown.visible;
                }
            }
        }
        Ok(topics)
    }

    /// CreatePartitions, with the growth emulation: checked as Kafka 4.2's controller checks
    /// it, then the topic's visible partition count is raised (`partition_growth`).
    async fn create_partitions(&self, meta: RequestMeta, frame: Bytes) -> Result<Bytes, String> {
        let growth = self
            .growth
            .as_ref()
            .ok_or("CreatePartitions needs the partition growth emulation")?;
        let (_, request) = decode_request::<CreatePartitionsRequest>(&frame, meta.version)?;
        let names: Vec<String> = request
            .topics
            .iter()
            .map(|t| t.name.0.to_string())
            .collect();
        let mut counts = BTreeMap::new();
        for name in &names {
            *counts.entry(name.clone()).or_insert(0) += 1;
        }
        // What the dev broker has (not the visible counts).
        let existing = self.metadata.topics(Some(&names)).await?;
        let mut response = CreatePartitionsResponse::default();
        for topic in &request.topics {
            let name = topic.name.0.to_string();
            let outcome = if counts[&name] > 1 {
                Err((INVALID_REQUEST, "Duplicate topic name.".to_string()))
            } else if self.denied(AdminOperation::Alter) {
                Err((
                    TOPIC_AUTHORIZATION_FAILED,
                    "Authorization failed.".to_string(),
                ))
            } else {
                match existing.get(&name) {
                    None => Err((
                        UNKNOWN_TOPIC_OR_PARTITION,
                        default_message(UNKNOWN_TOPIC_OR_PARTITION)
                            .unwrap_or_default()
                            .to_string(),
                    )),
                    Some(info) => {
                        let visible = growth.topic(&name).map_or(info.partitions, |g| g.visible);
                        let additional = topic.count - visible;
                        match &topic.assignments {
                            Some(a) if additional > 0 && a.len() as i32 != additional => Err((
                                INVALID_REPLICA_ASSIGNMENT,
                                format!(
                                    "Attempted to add {additional} additional partition(s), but only {} assignment(s) were specified.",
                                    a.len()
                                ),
                            )),
                            _ => growth.grow(&name, info.partitions, topic.count, !request.validate_only),
                        }
                    }
                }
            };
            let mut result = CreatePartitionsTopicResult::default();
            result.name = topic.name.clone();
            if let Err((code, message)) = outcome {
                result.error_code = code;
                result.error_message = Some(StrBytes::from_string(message));
            }
            response.results.push(result);
        }
        encode_response(
            &response_header(meta.correlation_id),
            &response,
            meta.version,
        )
    }

    fn group_props(&self, group: &str) -> BTreeMap<String, String> {
        lock(&self.group_configs)
            .get(group)
            .cloned()
            .unwrap_or_default()
    }

    fn topic_props(&self, topic: &str) -> BTreeMap<String, String> {
        lock(&self.topic_configs)
            .get(topic)
            .cloned()
            .unwrap_or_default()
    }

    async fn describe_configs(
        &self,
        meta: RequestMeta,
        frame: Bytes,
        node: i32,
    ) -> Result<Bytes, String> {
        let (_, request) = decode_request::<DescribeConfigsRequest>(&frame, meta.version)?;
        let in_force = self.base_settings().await?;
        let broker = broker_configs(&in_force);
        let mut response = DescribeConfigsResponse::default();
        for resource in &request.resources {
            let name = resource.resource_name.to_string();
            let wanted = |key: &str| match &resource.configuration_keys {
                Some(keys) if !keys.is_empty() => keys.iter().any(|k| k.as_str() == key),
                _ => true,
            };
            let mut result = DescribeConfigsResult::default();
            // kafka-protocol's default is ""; Kafka sends null on success.
            result.error_message = None;
            result.resource_type = resource.resource_type;
            result.resource_name = resource.resource_name.clone();
            if self.denied(AdminOperation::DescribeConfigs) {
                if let Some(code) = authorization_error(resource.resource_type) {
                    set_error(
                        &mut result.error_code,
                        &mut result.error_message,
                        code,
                        None,
                    );
                    response.results.push(result);
                    continue;
                }
            }
            let synonyms = request.include_synonyms;
            match resource.resource_type {
                GROUP if name.is_empty() => set_error(
                    &mut result.error_code,
                    &mut result.error_message,
                    INVALID_REQUEST,
                    Some("Group name must not be empty".into()),
                ),
                GROUP => {
                    let props = self.group_props(&name);
                    let defaults = group_defaults(&broker, &in_force);
                    for key in configs::GROUP_CONFIGS.iter().filter(|k| wanted(k.name)) {
                        let (value, source) = match props.get(key.name) {
                            Some(v) => (v.clone(), SOURCE_GROUP),
                            None => (defaults[key.name].clone(), SOURCE_DEFAULT),
                        };
                        let list = vec![synonym(key.name, &value, source)];
                        result.configs.push(entry(key.name, &value, source, false, key.kind, list, synonyms));
                    }
                }
                BROKER if name.is_empty() => {
                    // Kafka lists the cluster-wide dynamic defaults here; the emulated cluster
                    // has none.
                }
                BROKER => match broker_name(&name, node, true) {
                    Err(message) => set_error(
                        &mut result.error_code,
                        &mut result.error_message,
                        INVALID_REQUEST,
                        Some(message),
                    ),
                    Ok(()) => {
                        for (key, config) in broker.iter().filter(|(k, _)| wanted(k)) {
                            result.configs.push(broker_entry(key, config, synonyms));
                        }
                    }
                },
                TOPIC => match topic_name_problem(&name) {
                    Some(message) => set_error(
                        &mut result.error_code,
                        &mut result.error_message,
                        INVALID_TOPIC_EXCEPTION,
                        Some(message),
                    ),
                    None => {
                        let exists = self.topics(Some(std::slice::from_ref(&name))).await?;
                        if exists.contains_key(&name) {
                            let props = self.topic_props(&name);
                            for (key, default, broker_key) in
                                TOPIC_CONFIGS.iter().filter(|(k, _, _)| wanted(k.name))
                            {
                                result.configs.push(topic_entry(key.name, key.kind, default, broker_key, props.get(key.name), synonyms));
                            }
                        } else {
                            result.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                        }
                    }
                },
                BROKER_LOGGER | CLIENT_METRICS => set_error(
                    &mut result.error_code,
                    &mut result.error_message,
                    INVALID_REQUEST,
                    Some(format!(
                        "the dev broker's admin emulation does not describe resource type {} (only TOPIC, BROKER and GROUP)",
                        resource.resource_type
                    )),
                ),
                other => set_error(
                    &mut result.error_code,
                    &mut result.error_message,
                    INVALID_REQUEST,
                    Some(format!("Unsupported resource type: {other}")),
                ),
            }
            response.results.push(result);
        }
        encode_response(
            &response_header(meta.correlation_id),
            &response,
            meta.version,
        )
    }

    async fn incremental_alter_configs(
        &self,
        meta: RequestMeta,
        frame: Bytes,
        node: i32,
    ) -> Result<Bytes, String> {
        let (_, request) = decode_request::<IncrementalAlterConfigsRequest>(&frame, meta.version)?;
        let in_force = self.base_settings().await?;
        let broker = broker_configs(&in_force);
        let mut seen = BTreeMap::new();
        for r in &request.resources {
            *seen
                .entry((r.resource_type, r.resource_name.to_string()))
                .or_insert(0) += 1;
        }
        let mut response = IncrementalAlterConfigsResponse::default();
        let mut settings = Map::new();
        for resource in &request.resources {
            let name = resource.resource_name.to_string();
            let mut result = AlterConfigsResourceResponse::default();
            result.error_message = None;
            result.resource_type = resource.resource_type;
            result.resource_name = resource.resource_name.clone();
            let outcome = self
                .alter_resource(
                    resource,
                    &name,
                    node,
                    &seen,
                    request.validate_only,
                    &broker,
                    &in_force,
                    &mut settings,
                )
                .await?;
            if let Err((code, message)) = outcome {
                set_error(
                    &mut result.error_code,
                    &mut result.error_message,
                    code,
                    message,
                );
            }
            response.responses.push(result);
        }
        if !settings.is_empty() {
            self.push_share_settings(settings, &in_force).await?;
        }
        encode_response(
            &response_header(meta.correlation_id),
            &response,
            meta.version,
        )
    }

    /// One resource of an IncrementalAlterConfigs request, checked in Kafka's order: the
    /// broker's preprocessing (duplicates, null values, broker configs), authorization, then
    /// the controller's validation of the resulting config.
    #[allow(clippy::too_many_arguments)]
    async fn alter_resource(
        &self,
        resource: &kafka_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
        name: &str,
        node: i32,
        seen: &BTreeMap<(i8, String), i32>,
        validate_only: bool,
        broker: &BTreeMap<&'static str, BrokerConfig>,
        in_force: &Map<String, Value>,
        settings: &mut Map<String, Value>,
    ) -> Result<Result<(), (i16, Option<String>)>, String> {
        let refuse = |code: i16, message: String| Ok(Err((code, Some(message))));
        if seen[&(resource.resource_type, name.to_string())] > 1 {
            return refuse(
                INVALID_REQUEST,
                "Each resource must appear at most once.".into(),
            );
        }
        let names: Vec<&str> = resource.configs.iter().map(|c| c.name.as_str()).collect();
        if names.iter().collect::<BTreeSet<_>>().len() != names.len() {
            return refuse(INVALID_REQUEST, "Error due to duplicate config keys".into());
        }
        let nulls: Vec<&str> = resource
            .configs
            .iter()
            .filter(|c| c.config_operation != 1 && c.value.is_none())
            .map(|c| c.name.as_str())
            .collect();
        if !nulls.is_empty() {
            return refuse(
                INVALID_REQUEST,
                format!("Null value not supported for : {}", nulls.join(", ")),
            );
        }
        if resource.resource_type == BROKER {
            if !name.is_empty() {
                if let Err(message) = broker_name(name, node, false) {
                    return refuse(INVALID_REQUEST, message);
                }
            }
            // Every broker config the emulation knows is read-only on Kafka 4.2 (not in
            // DynamicBrokerConfig.AllDynamicConfigs).
            let read_only: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| broker.contains_key(n))
                .collect();
            if !read_only.is_empty() {
                return refuse(
                    INVALID_REQUEST,
                    format!(
                        "Cannot update these configs dynamically: Set({})",
                        read_only.join(", ")
                    ),
                );
            }
        }
        if self.denied(AdminOperation::AlterConfigs) {
            if let Some(code) = authorization_error(resource.resource_type) {
                return Ok(Err((code, None)));
            }
        }
        let apply = |props: &mut BTreeMap<String, String>,
                     kind_of: &dyn Fn(&str) -> Option<Kind>| {
            for c in &resource.configs {
                let value = c.value.as_ref().map(|v| v.as_str());
                apply_op(
                    props,
                    c.name.as_str(),
                    c.config_operation,
                    value,
                    kind_of(c.name.as_str()),
                )
                .map_err(|(code, m)| (code, Some(m)))?;
            }
            Ok::<(), (i16, Option<String>)>(())
        };
        match resource.resource_type {
            GROUP => {
                if name.is_empty() {
                    return refuse(INVALID_REQUEST, "Default group resources are not allowed.".into());
                }
                let mut props = self.group_props(name);
                if let Err(e) = apply(&mut props, &|n| group_config(n).map(|k| k.kind)) {
                    return Ok(Err(e));
                }
                let defaults = group_defaults(broker, in_force);
                if let Err(message) = validate_group(&props, &defaults, broker) {
                    return refuse(INVALID_CONFIG, message);
                }
                if validate_only {
                    return Ok(Ok(()));
                }
                for c in &resource.configs {
                    let key = c.name.as_str();
                    let value = props
                        .get(key)
                        .cloned()
                        .unwrap_or_else(|| defaults.get(key).cloned().unwrap_or_default());
                    if let Some((setting, mapped)) = mock_setting(key, &value) {
                        settings.insert(setting.to_string(), mapped);
                    }
                }
                let mut all = lock(&self.group_configs);
                if props.is_empty() {
                    all.remove(name);
                } else {
                    all.insert(name.to_string(), props);
                }
                Ok(Ok(()))
            }
            TOPIC => {
                if let Some(message) = topic_name_problem(name) {
                    return refuse(INVALID_TOPIC_EXCEPTION, message);
                }
                let mut props = self.topic_props(name);
                if let Err(e) = apply(&mut props, &|n| topic_config(n).map(|(k, _, _)| k.kind)) {
                    return Ok(Err(e));
                }
                if let Err(message) = validate_topic(&props) {
                    return refuse(INVALID_CONFIG, message);
                }
                if !self.topics(Some(&[name.to_string()])).await?.contains_key(name) {
                    return Ok(Err((UNKNOWN_TOPIC_OR_PARTITION, None)));
                }
                if !validate_only {
                    lock(&self.topic_configs).insert(name.to_string(), props);
                }
                Ok(Ok(()))
            }
            // Dynamic broker configs Kafka would accept and the mock has no use for.
            BROKER => Ok(Ok(())),
            BROKER_LOGGER | CLIENT_METRICS => refuse(
                INVALID_REQUEST,
                format!(
                    "the dev broker's admin emulation does not alter resource type {} (only TOPIC, BROKER and GROUP)",
                    resource.resource_type
                ),
            ),
            other => refuse(INVALID_REQUEST, format!("Unknown resource type {other}")),
        }
    }

    /// Sets group values on the dev broker, whose share settings are cluster-wide: the last
    /// group altered decides for all.
    async fn push_share_settings(
        &self,
        settings: Map<String, Value>,
        in_force: &Map<String, Value>,
    ) -> Result<(), String> {
        {
            let mut pushed = lock(&self.pushed);
            for (key, value) in &settings {
                let base = in_force.get(key).cloned().unwrap_or(Value::Null);
                pushed
                    .entry(key.clone())
                    .and_modify(|p| p.pushed = value.clone())
                    .or_insert(Pushed {
                        base,
                        pushed: value.clone(),
                    });
            }
        }
        // Visible in test output: a group's value now applies to every share group.
        eprintln!(
            "kafka proxy admin emulation: dev broker share settings {} (cluster-wide: every share group gets them)",
            Value::Object(settings.clone())
        );
        let mut command = settings;
        command.insert("cmd".into(), json!("share_settings"));
        self.launcher(move |c| c.command(Value::Object(command)).map(|_| ()))
            .await
    }

    async fn create_topics(&self, meta: RequestMeta, frame: Bytes) -> Result<Bytes, String> {
        let (_, request) = decode_request::<CreateTopicsRequest>(&frame, meta.version)?;
        let brokers = self.control.broker_count() as i16;
        let mut counts = BTreeMap::new();
        for t in &request.topics {
            *counts.entry(t.name.0.to_string()).or_insert(0) += 1;
        }
        let names: Vec<String> = counts.keys().cloned().collect();
        let existing = self.topics(Some(&names)).await?;
        let mut response = CreateTopicsResponse::default();
        for topic in &request.topics {
            let name = topic.name.0.to_string();
            let mut result = CreatableTopicResult::default();
            result.error_message = None;
            result.name = topic.name.clone();
            let outcome = if counts[&name] > 1 {
                Err((INVALID_REQUEST, "Duplicate topic name.".to_string()))
            } else if self.denied(AdminOperation::Create) {
                Err((
                    TOPIC_AUTHORIZATION_FAILED,
                    "Authorization failed.".to_string(),
                ))
            } else {
                self.create_topic(
                    topic,
                    &name,
                    brokers,
                    existing.contains_key(&name),
                    request.validate_only,
                )
                .await?
            };
            match outcome {
                Ok((partitions, replication, props)) => {
                    result.num_partitions = partitions;
                    result.replication_factor = replication;
                    result.topic_id = match request.validate_only {
                        true => Uuid::new_v4(),
                        false => self
                            .topics(Some(std::slice::from_ref(&name)))
                            .await?
                            .get(&name)
                            .map(|t| t.id)
                            .unwrap_or_default(),
                    };
                    // Kafka leaves the configs out for a principal that may not describe them.
                    if self.denied(AdminOperation::DescribeConfigs) {
                        result.topic_config_error_code = TOPIC_AUTHORIZATION_FAILED;
                        result.configs = Some(Vec::new());
                    } else {
                        result.configs = Some(
                            TOPIC_CONFIGS
                                .iter()
                                .map(|(key, default, _)| {
                                    let mut c = CreatableTopicConfigs::default();
                                    c.name = StrBytes::from_static_str(key.name);
                                    let (value, source) = match props.get(key.name) {
                                        Some(v) => (v.clone(), SOURCE_TOPIC),
                                        None => (default.to_string(), SOURCE_DEFAULT),
                                    };
                                    c.value = Some(StrBytes::from_string(value));
                                    c.config_source = source;
                                    c
                                })
                                .collect(),
                        );
                    }
                }
                Err((code, message)) => {
                    result.error_code = code;
                    result.error_message = Some(StrBytes::from_string(message));
                    // Kafka leaves these at their "unknown" values on failure.
                    result.num_partitions = -1;
                    result.replication_factor = -1;
                }
            }
            response.topics.push(result);
        }
        encode_response(
            &response_header(meta.correlation_id),
            &response,
            meta.version,
        )
    }

    /// Checks and creates one topic as Kafka's controller does; (partitions, replication
    /// factor, configs) or the error.
    #[allow(clippy::type_complexity)]
    async fn create_topic(
        &self,
        topic: &kafka_protocol::messages::create_topics_request::CreatableTopic,
        name: &str,
        brokers: i16,
        exists: bool,
        validate_only: bool,
    ) -> Result<Result<(i32, i16, BTreeMap<String, String>), (i16, String)>, String> {
        if let Some(message) = topic_name_problem(name) {
            return Ok(Err((INVALID_TOPIC_EXCEPTION, message)));
        }
        if exists {
            return Ok(Err((
                TOPIC_ALREADY_EXISTS,
                format!("Topic '{name}' already exists."),
            )));
        }
        let nulls: Vec<&str> = topic
            .configs
            .iter()
            .filter(|c| c.value.is_none())
            .map(|c| c.name.as_str())
            .collect();
        if !nulls.is_empty() {
            return Ok(Err((
                INVALID_CONFIG,
                format!(
                    "Null value not supported for topic configs: {}",
                    nulls.join(",")
                ),
            )));
        }
        let props: BTreeMap<String, String> = topic
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                )
            })
            .collect();
        if let Err(message) = validate_topic(&props) {
            return Ok(Err((INVALID_CONFIG, message)));
        }
        let (partitions, replication) = if !topic.assignments.is_empty() {
            if topic.replication_factor != -1 {
                return Ok(Err((
                    INVALID_REQUEST,
                    "A manual partition assignment was specified, but replication factor was not set to -1.".into(),
                )));
            }
            if topic.num_partitions != -1 {
                return Ok(Err((
                    INVALID_REQUEST,
                    "A manual partition assignment was specified, but numPartitions was not set to -1.".into(),
                )));
            }
            let replication = topic.assignments[0].broker_ids.len() as i16;
            (topic.assignments.len() as i32, replication)
        } else if topic.replication_factor < -1 || topic.replication_factor == 0 {
            return Ok(Err((
                INVALID_REPLICATION_FACTOR,
                "Replication factor must be larger than 0, or -1 to use the default value.".into(),
            )));
        } else if topic.num_partitions < -1 || topic.num_partitions == 0 {
            return Ok(Err((
                INVALID_PARTITIONS,
                "Number of partitions was set to an invalid non-positive value.".into(),
            )));
        } else {
            let partitions = if topic.num_partitions == -1 {
                1
            } else {
                topic.num_partitions
            };
            let replication = if topic.replication_factor == -1 {
                1
            } else {
                topic.replication_factor
            };
            (partitions, replication)
        };
        if replication > brokers {
            return Ok(Err((
                INVALID_REPLICATION_FACTOR,
                format!(
                    "Unable to replicate the partition {replication} time(s): The target replication factor of {replication} cannot be reached because only {brokers} broker(s) are registered."
                ),
            )));
        }
        if validate_only {
            return Ok(Ok((partitions, replication, props)));
        }
        let topic_name = name.to_string();
        // With the growth emulation the dev broker gets room to grow; clients see `partitions`.
        let actual = self
            .growth
            .as_ref()
            .map_or(partitions, |g| g.capacity_for(partitions));
        let created = self
            .launcher(move |c| {
                c.command(json!({"cmd": "create_topic", "topic": topic_name,
                    "partitions": actual, "replication_factor": replication}))
            })
            .await;
        match created {
            Ok(_) => {}
            // The mock's TOPIC_ALREADY_EXISTS: made meanwhile by someone else.
            Err(message) if message.contains("(36)") => {
                return Ok(Err((
                    TOPIC_ALREADY_EXISTS,
                    format!("Topic '{name}' already exists."),
                )))
            }
            Err(message) => return Ok(Err((UNKNOWN_SERVER_ERROR, message))),
        }
        if let Some(growth) = &self.growth {
            growth.track(name, partitions, actual);
        }
        lock(&self.topic_configs).insert(name.to_string(), props.clone());
        Ok(Ok((partitions, replication, props)))
    }
}

/// The dev broker setting a group config maps onto, with the value to set; `None` for group
/// configs the mock has no setter for.
fn mock_setting(key: &str, value: &str) -> Option<(&'static str, Value)> {
    let int = || value.trim().parse::<i64>().ok().map(Value::from);
    Some(match key {
        configs::SHARE_AUTO_OFFSET_RESET => {
            let mapped = match parse_share_auto_offset_reset(value.trim())? {
                ShareReset::Earliest => "earliest",
                ShareReset::Latest => "latest",
                // The mock knows earliest and latest only. A zero duration starts at the end;
                // any other starts earlier than the end, and earliest is the start that loses
                // nothing (it delivers records older than the duration too).
                ShareReset::ByDuration(0.0) => "latest",
                ShareReset::ByDuration(_) => "earliest",
            };
            ("auto_offset_reset", json!(mapped))
        }
        configs::SHARE_RECORD_LOCK_DURATION_MS => ("record_lock_duration_ms", int()?),
        configs::SHARE_ISOLATION_LEVEL => ("isolation_level", json!(value.trim())),
        configs::SHARE_SESSION_TIMEOUT_MS => ("session_timeout_ms", int()?),
        configs::SHARE_HEARTBEAT_INTERVAL_MS => ("heartbeat_interval_ms", int()?),
        _ => return None,
    })
}

impl LocalApi for Arc<AdminEmulation> {
    fn versions(&self) -> Vec<(i16, i16, i16)> {
        use kafka_protocol::messages::{
            AlterShareGroupOffsetsRequest, DeleteShareGroupOffsetsRequest,
            DescribeShareGroupOffsetsRequest,
        };
        let mut versions = vec![
            (
                CREATE_TOPICS,
                CreateTopicsRequest::VERSIONS.min,
                CreateTopicsRequest::VERSIONS.max,
            ),
            (
                DESCRIBE_CONFIGS,
                DescribeConfigsRequest::VERSIONS.min,
                DescribeConfigsRequest::VERSIONS.max,
            ),
            (
                INCREMENTAL_ALTER_CONFIGS,
                IncrementalAlterConfigsRequest::VERSIONS.min,
                IncrementalAlterConfigsRequest::VERSIONS.max,
            ),
            (
                DESCRIBE_SHARE_GROUP_OFFSETS,
                DescribeShareGroupOffsetsRequest::VERSIONS.min,
                DescribeShareGroupOffsetsRequest::VERSIONS.max,
            ),
            (
                ALTER_SHARE_GROUP_OFFSETS,
                AlterShareGroupOffsetsRequest::VERSIONS.min,
                AlterShareGroupOffsetsRequest::VERSIONS.max,
            ),
            (
                DELETE_SHARE_GROUP_OFFSETS,
                DeleteShareGroupOffsetsRequest::VERSIONS.min,
                DeleteShareGroupOffsetsRequest::VERSIONS.max,
            ),
        ];
        if self.growth.is_some() {
            // Kafka 4.0 removed v0 and v1 (KIP-896).
            versions.push((CREATE_PARTITIONS, 2, CreatePartitionsRequest::VERSIONS.max));
        }
        versions
    }

    fn answer(&self, meta: RequestMeta, frame: Bytes, node: i32) -> LocalAnswer {
        let admin = Arc::clone(self);
        Box::pin(async move {
            match meta.api_key {
                CREATE_TOPICS => admin.create_topics(meta, frame).await,
                CREATE_PARTITIONS => admin.create_partitions(meta, frame).await,
                DESCRIBE_CONFIGS => admin.describe_configs(meta, frame, node).await,
                INCREMENTAL_ALTER_CONFIGS => {
                    admin.incremental_alter_configs(meta, frame, node).await
                }
                DESCRIBE_SHARE_GROUP_OFFSETS => {
                    admin.describe_share_group_offsets(meta, frame).await
                }
                ALTER_SHARE_GROUP_OFFSETS => admin.alter_share_group_offsets(meta, frame).await,
                DELETE_SHARE_GROUP_OFFSETS => admin.delete_share_group_offsets(meta, frame).await,
                other => Err(format!("api_key={other} is not an admin API")),
            }
        })
    }
}

/// The error an unauthorized principal gets for a config resource of this type.
fn authorization_error(resource_type: i8) -> Option<i16> {
    match resource_type {
        BROKER | BROKER_LOGGER | CLIENT_METRICS => Some(CLUSTER_AUTHORIZATION_FAILED),
        TOPIC => Some(TOPIC_AUTHORIZATION_FAILED),
        GROUP => Some(GROUP_AUTHORIZATION_FAILED),
        _ => None,
    }
}

/// Kafka's default message for the codes the emulation answers with.
pub(crate) fn default_message(code: i16) -> Option<&'static str> {
    Some(match code {
        UNKNOWN_TOPIC_OR_PARTITION => "This server does not host this topic-partition.",
        TOPIC_AUTHORIZATION_FAILED => "Topic authorization failed.",
        GROUP_AUTHORIZATION_FAILED => "Group authorization failed.",
        CLUSTER_AUTHORIZATION_FAILED => "Cluster authorization failed.",
        _ => return None,
    })
}

fn set_error(
    code_out: &mut i16,
    message_out: &mut Option<StrBytes>,
    code: i16,
    message: Option<String>,
) {
    *code_out = code;
    *message_out = message
        .or_else(|| default_message(code).map(String::from))
        .map(StrBytes::from_string);
}

/// A BROKER resource name must be this listener's node id (DescribeConfigs' and
/// IncrementalAlterConfigs' messages differ on Kafka).
fn broker_name(name: &str, node: i32, describe: bool) -> Result<(), String> {
    match name.parse::<i32>() {
        Err(_) if describe => Err(format!("Broker id must be an integer, but it is: {name}")),
        Err(_) => Err(format!("Node id must be an integer, but it is: {name}")),
        Ok(id) if id != node && describe => Err(format!(
            "Unexpected broker id, expected {node} or empty string, but received {name}"
        )),
        Ok(id) if id != node => Err(format!(
            "Unexpected broker id, expected {node}, but received {name}"
        )),
        Ok(_) => Ok(()),
    }
}

/// `Topic.validate`'s complaint about a topic name, if any.
pub(crate) fn topic_name_problem(name: &str) -> Option<String> {
    let reason = if name.is_empty() {
        "the empty string is not allowed".to_string()
    } else if name == "." {
        "'.' is not allowed".to_string()
    } else if name == ".." {
        "'..' is not allowed".to_string()
    } else if name.len() > 249 {
        format!("the length of '{name}' is longer than the max allowed length 249")
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        format!("'{name}' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'")
    } else {
        return None;
    };
    Some(format!("Topic name is invalid: {reason}"))
}

fn synonym(name: &str, value: &str, source: i8) -> DescribeConfigsSynonym {
    let mut s = DescribeConfigsSynonym::default();
    s.name = StrBytes::from_string(name.to_string());
    s.value = Some(StrBytes::from_string(value.to_string()));
    s.source = source;
    s
}

fn entry(
    name: &str,
    value: &str,
    source: i8,
    read_only: bool,
    kind: Kind,
    synonyms: Vec<DescribeConfigsSynonym>,
    include_synonyms: bool,
) -> DescribeConfigsResourceResult {
    let mut e = DescribeConfigsResourceResult::default();
    e.name = StrBytes::from_string(name.to_string());
    e.value = Some(StrBytes::from_string(value.to_string()));
    e.config_source = source;
    e.read_only = read_only;
    e.is_sensitive = false;
    e.config_type = kind.type_id();
    e.documentation = None;
    if include_synonyms {
        e.synonyms = synonyms;
    }
    e
}

/// A per-broker config: set statically where the emulated broker differs from Kafka's default.
fn broker_entry(
    name: &str,
    config: &BrokerConfig,
    include_synonyms: bool,
) -> DescribeConfigsResourceResult {
    let mut list = Vec::new();
    if config.value != config.kafka_default {
        list.push(synonym(name, &config.value, SOURCE_STATIC_BROKER));
    }
    list.push(synonym(name, &config.kafka_default, SOURCE_DEFAULT));
    let source = list[0].source;
    entry(
        name,
        &config.value,
        source,
        true,
        config.kind,
        list,
        include_synonyms,
    )
}

fn topic_entry(
    name: &str,
    kind: Kind,
    default: &str,
    broker_key: &str,
    own: Option<&String>,
    include_synonyms: bool,
) -> DescribeConfigsResourceResult {
    let mut list = Vec::new();
    if let Some(value) = own {
        list.push(synonym(name, value, SOURCE_TOPIC));
    }
    list.push(synonym(broker_key, default, SOURCE_DEFAULT));
    let source = list[0].source;
    let value = own.map(String::as_str).unwrap_or(default);
    entry(name, value, source, false, kind, list, include_synonyms)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The emulation's one connection to the dev broker, for Metadata: opened at first use and
/// kept, because closing any connection ends the mock's share sessions on that broker.
struct MetadataConnection {
    address: String,
    version: i16,
    stream: tokio::sync::Mutex<Option<TcpStream>>,
    opened: std::sync::atomic::AtomicU64,
}

impl MetadataConnection {
    async fn topics(
        &self,
        names: Option<&[String]>,
    ) -> Result<BTreeMap<String, TopicInfo>, String> {
        let mut request = MetadataRequest::default();
        request.allow_auto_topic_creation = false;
        request.topics = names.map(|names| {
            names
                .iter()
                .map(|n| {
                    let mut t = MetadataRequestTopic::default();
                    t.name = Some(TopicName(StrBytes::from_string(n.clone())));
                    t
                })
                .collect()
        });
        let mut header = RequestHeader::default();
        header.request_api_key = METADATA;
        header.request_api_version = self.version;
        header.correlation_id = 1;
        header.client_id = Some(StrBytes::from_static_str("spillway-kafka-proxy-admin"));
        let frame = encode_request(&header, &request, self.version)?;
        let mut guard = self.stream.lock().await;
        if guard.is_none() {
            let stream =
                tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(&self.address))
                    .await
                    .map_err(|_| {
                        format!("connecting to the dev broker at {} timed out", self.address)
                    })?
                    .map_err(|e| {
                        format!("cannot connect to the dev broker at {}: {e}", self.address)
                    })?;
            let _ = stream.set_nodelay(true);
            self.opened
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *guard = Some(stream);
        }
        let stream = guard.as_mut().expect("connected above");
        let exchange = async {
            write_frame(stream, &frame)
                .await
                .map_err(|e| format!("sending Metadata: {e}"))?;
            read_frame(stream)
                .await
                .map_err(|e| format!("reading Metadata: {e}"))?
                .ok_or_else(|| "the dev broker closed the admin emulation's connection".to_string())
        };
        let reply = match tokio::time::timeout(Duration::from_secs(10), exchange).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                // Broken: the next lookup reconnects.
                *guard = None;
                return Err(e);
            }
            Err(_) => {
                *guard = None;
                return Err("the dev broker did not answer Metadata within 10s".into());
            }
        };
        let (_, response) = decode_response::<MetadataResponse>(&reply, self.version)?;
        Ok(response
            .topics
            .into_iter()
            .filter(|t| t.error_code == 0)
            .filter_map(|t| {
                Some((
                    t.name?.0.to_string(),
                    TopicInfo {
                        id: t.topic_id,
                        partitions: t.partitions.len() as i32,
                    },
                ))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_are_checked_as_kafka_checks_them() {
        assert_eq!(topic_name_problem("orders.v2_x-1"), None);
        assert_eq!(
            topic_name_problem("").unwrap(),
            "Topic name is invalid: the empty string is not allowed"
        );
        assert!(topic_name_problem("a b")
            .unwrap()
            .contains("ASCII alphanumerics"));
        assert!(topic_name_problem(&"x".repeat(250))
            .unwrap()
            .contains("249"));
    }

    #[test]
    fn group_values_map_onto_the_mocks_settings() {
        assert_eq!(
            mock_setting("share.auto.offset.reset", "earliest"),
            Some(("auto_offset_reset", json!("earliest")))
        );
        assert_eq!(
            mock_setting("share.auto.offset.reset", "by_duration:PT0S"),
            Some(("auto_offset_reset", json!("latest")))
        );
        assert_eq!(
            mock_setting("share.auto.offset.reset", "by_duration:PT5M"),
            Some(("auto_offset_reset", json!("earliest")))
        );
        assert_eq!(
            mock_setting("share.record.lock.duration.ms", "3000"),
            Some(("record_lock_duration_ms", json!(3000)))
        );
        assert_eq!(mock_setting("consumer.session.timeout.ms", "50000"), None);
    }
}
