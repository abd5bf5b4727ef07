//! The test-kit proxy's admin emulation (`ProxyOptions::with_admin_emulation`), driven with raw
//! Kafka protocol requests over plain TCP, checked against what Apache Kafka 4.2 answers, and
//! end to end with the native share consumer.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::alter_share_group_offsets_request::{
    AlterShareGroupOffsetsRequestPartition, AlterShareGroupOffsetsRequestTopic,
};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::describe_share_group_offsets_request::{
    DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, ApiVersionsRequest,
    ApiVersionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, MetadataRequest,
    MetadataResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};
use spillway_tests::kafka_proxy::{AdminOperation, KafkaProxy, ProxyOptions, ProxySecurity};
use spillway_tests::{numbered_records, DevBroker, ProxiedDevBroker, TestProducer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const API_VERSIONS: i16 = 18;
const METADATA: i16 = 3;
const CREATE_TOPICS: i16 = 19;
const DESCRIBE_CONFIGS: i16 = 32;
const INCREMENTAL_ALTER_CONFIGS: i16 = 44;
const DESCRIBE_SHARE_GROUP_OFFSETS: i16 = 90;
const ALTER_SHARE_GROUP_OFFSETS: i16 = 91;
const DELETE_SHARE_GROUP_OFFSETS: i16 = 92;
const ADMIN_APIS: [i16; 6] = [
    CREATE_TOPICS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    DESCRIBE_SHARE_GROUP_OFFSETS,
    ALTER_SHARE_GROUP_OFFSETS,
    DELETE_SHARE_GROUP_OFFSETS,
];

/// `ConfigResource.Type` ids.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const GROUP: i8 = 32;

/// Config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
const SOURCE_GROUP: i8 = 8;

/// A bare Kafka protocol client on one connection.
struct Raw {
    socket: tokio::net::TcpStream,
    correlation: i32,
}

impl Raw {
    async fn connect(address: &str) -> Raw {
        Raw {
            socket: tokio::net::TcpStream::connect(address).await.unwrap(),
            correlation: 0,
        }
    }

    /// Sends one request and returns its response.
    async fn call<Req, Resp>(&mut self, api_key: i16, version: i16, body: &Req) -> Resp
    where
        Req: Encodable + HeaderVersion,
        Resp: Decodable + HeaderVersion,
    {
        self.call_as(api_key, version, version, body).await
    }

    /// Sends one request at `version` and decodes the response as `answer_version`.
    async fn call_as<Req, Resp>(
        &mut self,
        api_key: i16,
        version: i16,
        answer_version: i16,
        body: &Req,
    ) -> Resp
    where
        Req: Encodable + HeaderVersion,
        Resp: Decodable + HeaderVersion,
    {
        self.correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = api_key;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(StrBytes::from_static_str("raw-admin"));
        let mut buf = bytes::BytesMut::new();
        header
            .encode(&mut buf, Req::header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&buf);
        self.socket.write_all(&frame).await.unwrap();
        let read = async {
            let mut len = [0u8; 4];
            self.socket.read_exact(&mut len).await.unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            self.socket.read_exact(&mut body).await.unwrap();
            Bytes::from(body)
        };
        let mut frame = tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap_or_else(|_| panic!("no answer to api_key={api_key} within 30s"));
        let header =
            ResponseHeader::decode(&mut frame, Resp::header_version(answer_version)).unwrap();
        assert_eq!(
            header.correlation_id, self.correlation,
            "answers come in order"
        );
        Resp::decode(&mut frame, answer_version).unwrap()
    }

    async fn api_versions(&mut self) -> ApiVersionsResponse {
        // v2: the dev broker's highest, hence the emulation's too.
        self.call(API_VERSIONS, 2, &ApiVersionsRequest::default())
            .await
    }

    async fn describe(
        &mut self,
        resources: &[(i8, &str)],
        synonyms: bool,
    ) -> Vec<DescribeConfigsResult> {
        let mut request = DescribeConfigsRequest::default();
        request.include_synonyms = synonyms;
        request.resources = resources
            .iter()
            .map(|(kind, name)| {
                let mut r = DescribeConfigsResource::default();
                r.resource_type = *kind;
                r.resource_name = StrBytes::from_string(name.to_string());
                r.configuration_keys = None;
                r
            })
            .collect();
        let response: DescribeConfigsResponse = self.call(DESCRIBE_CONFIGS, 4, &request).await;
        response.results
    }

    /// IncrementalAlterConfigs of one resource: (name, op, value); (error code, message).
    async fn alter(
        &mut self,
        kind: i8,
        name: &str,
        configs: &[(&str, i8, Option<&str>)],
        validate_only: bool,
    ) -> (i16, Option<String>) {
        let mut resource = AlterConfigsResource::default();
        resource.resource_type = kind;
        resource.resource_name = StrBytes::from_string(name.to_string());
        resource.configs = configs
            .iter()
            .map(|(n, op, v)| {
                let mut c = AlterableConfig::default();
                c.name = StrBytes::from_string(n.to_string());
                c.config_operation = *op;
                c.value = v.map(|v| StrBytes::from_string(v.to_string()));
                c
            })
            .collect();
        let mut request = IncrementalAlterConfigsRequest::default();
        request.resources = vec![resource];
        request.validate_only = validate_only;
        let response: IncrementalAlterConfigsResponse =
            self.call(INCREMENTAL_ALTER_CONFIGS, 1, &request).await;
        let r = &response.responses[0];
        (
            r.error_code,
            r.error_message.as_ref().map(|m| m.to_string()),
        )
    }

    async fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        replication: i16,
        configs: &[(&str, &str)],
        validate_only: bool,
    ) -> kafka_protocol::messages::create_topics_response::CreatableTopicResult {
        let mut topic = CreatableTopic::default();
        topic.name = TopicName(StrBytes::from_string(name.to_string()));
        topic.num_partitions = partitions;
        topic.replication_factor = replication;
        topic.configs = configs
            .iter()
            .map(|(k, v)| {
                let mut c = CreatableTopicConfig::default();
                c.name = StrBytes::from_string(k.to_string());
                c.value = Some(StrBytes::from_string(v.to_string()));
                c
            })
            .collect();
        let mut request = CreateTopicsRequest::default();
        request.topics = vec![topic];
        request.timeout_ms = 30_000;
        request.validate_only = validate_only;
        let mut response: CreateTopicsResponse = self.call(CREATE_TOPICS, 7, &request).await;
        response.topics.remove(0)
    }

    /// Partition counts of `topics` as Metadata shows them (absent when unknown).
    async fn partitions(&mut self, topics: &[&str]) -> Vec<(String, usize)> {
        let mut request = MetadataRequest::default();
        request.allow_auto_topic_creation = false;
        request.topics = Some(
            topics
                .iter()
                .map(|t| {
                    let mut r =
                        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
                    r.name = Some(TopicName(StrBytes::from_string(t.to_string())));
                    r
                })
                .collect(),
        );
        let response: MetadataResponse = self.call(METADATA, 9, &request).await;
        response
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .map(|t| (t.name.as_ref().unwrap().0.to_string(), t.partitions.len()))
            .collect()
    }

    async fn alter_offsets(
        &mut self,
        group: &str,
        topic: &str,
        offsets: &[(i32, i64)],
    ) -> AlterShareGroupOffsetsResponse {
        let mut t = AlterShareGroupOffsetsRequestTopic::default();
        t.topic_name = TopicName(StrBytes::from_string(topic.to_string()));
        t.partitions = offsets
            .iter()
            .map(|(p, o)| {
                let mut part = AlterShareGroupOffsetsRequestPartition::default();
                part.partition_index = *p;
                part.start_offset = *o;
                part
            })
            .collect();
        let mut request = AlterShareGroupOffsetsRequest::default();
        request.group_id = StrBytes::from_string(group.to_string()).into();
        request.topics = vec![t];
        self.call(ALTER_SHARE_GROUP_OFFSETS, 0, &request).await
    }

    /// (topic, partition, start offset) for the named topics (all the group has when `None`).
    async fn describe_offsets(
        &mut self,
        group: &str,
        topics: Option<&[(&str, &[i32])]>,
    ) -> Vec<(String, i32, i64)> {
        let mut g = DescribeShareGroupOffsetsRequestGroup::default();
        g.group_id = StrBytes::from_string(group.to_string()).into();
        g.topics = topics.map(|topics| {
            topics
                .iter()
                .map(|(t, parts)| {
                    let mut r = DescribeShareGroupOffsetsRequestTopic::default();
                    r.topic_name = TopicName(StrBytes::from_string(t.to_string()));
                    r.partitions = parts.to_vec();
                    r
                })
                .collect()
        });
        let mut request = DescribeShareGroupOffsetsRequest::default();
        request.groups = vec![g];
        let response: DescribeShareGroupOffsetsResponse =
            self.call(DESCRIBE_SHARE_GROUP_OFFSETS, 0, &request).await;
        let group = &response.groups[0];
        assert_eq!(group.error_code, 0, "{:?}", group.error_message);
        group
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| {
                    (
                        t.topic_name.0.to_string(),
                        p.partition_index,
                        p.start_offset,
                    )
                })
            })
            .collect()
    }

    async fn delete_offsets(
        &mut self,
        group: &str,
        topic: &str,
    ) -> DeleteShareGroupOffsetsResponse {
        let mut t = DeleteShareGroupOffsetsRequestTopic::default();
        t.topic_name = TopicName(StrBytes::from_string(topic.to_string()));
        let mut request = DeleteShareGroupOffsetsRequest::default();
        request.group_id = StrBytes::from_string(group.to_string()).into();
        request.topics = vec![t];
        self.call(DELETE_SHARE_GROUP_OFFSETS, 0, &request).await
    }
}

/// (value, source, synonym sources) of config `name` in a DescribeConfigs result.
fn config(result: &DescribeConfigsResult, name: &str) -> (String, i8, Vec<i8>) {
    assert_eq!(result.error_code, 0, "{:?}", result.error_message);
    let entry = result
        .configs
        .iter()
        .find(|c| c.name.as_str() == name)
        .unwrap_or_else(|| panic!("{name} is not described"));
    (
        entry
            .value
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_default(),
        entry.config_source,
        entry.synonyms.iter().map(|s| s.source).collect(),
    )
}

fn first_listener(proxy: &KafkaProxy) -> String {
    proxy
        .listener(1)
        .expect("a listener for broker 1")
        .to_string()
}

fn in_force(broker: &DevBroker, setting: &str) -> serde_json::Value {
    broker.control().share_settings_in_force().unwrap()[setting].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_list_the_admin_apis_only_with_the_emulation() {
    let broker = DevBroker::try_start(1, &[]).expect("dev broker");
    let plain = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    let emulating = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_admin_emulation(broker.control()),
    )
    .expect("proxy starts");

    let without = Raw::connect(&first_listener(&plain))
        .await
        .api_versions()
        .await;
    let with = Raw::connect(&first_listener(&emulating))
        .await
        .api_versions()
        .await;
    assert_eq!(without.error_code, 0);
    assert_eq!(with.error_code, 0);
    let keys = |r: &ApiVersionsResponse| -> BTreeSet<i16> {
        r.api_keys.iter().map(|k| k.api_key).collect()
    };
    for key in ADMIN_APIS {
        assert!(
            !keys(&without).contains(&key),
            "api_key={key} is advertised without the emulation"
        );
        assert!(
            keys(&with).contains(&key),
            "api_key={key} is not advertised with the emulation"
        );
    }
    let range = |key: i16| {
        let k = with.api_keys.iter().find(|k| k.api_key == key).unwrap();
        (k.min_version, k.max_version)
    };
    assert_eq!(range(CREATE_TOPICS), (2, 7));
    assert_eq!(range(DESCRIBE_CONFIGS), (1, 4));
    assert_eq!(range(INCREMENTAL_ALTER_CONFIGS), (0, 1));
    assert_eq!(range(ALTER_SHARE_GROUP_OFFSETS), (0, 0));
    // A version above the dev broker's gets UNSUPPORTED_VERSION in v0, naming the range, as
    // Kafka answers, so clients step down.
    let mut raw = Raw::connect(&first_listener(&emulating)).await;
    let mut request = ApiVersionsRequest::default();
    request.client_software_name = StrBytes::from_static_str("raw-admin");
    request.client_software_version = StrBytes::from_static_str("1");
    let refused: ApiVersionsResponse = raw.call_as(API_VERSIONS, 3, 0, &request).await;
    let versions = without
        .api_keys
        .iter()
        .find(|k| k.api_key == API_VERSIONS)
        .unwrap();
    assert_eq!(refused.error_code, 35);
    assert_eq!(
        refused
            .api_keys
            .iter()
            .map(|k| (k.api_key, k.min_version, k.max_version))
            .collect::<Vec<_>>(),
        vec![(API_VERSIONS, versions.min_version, versions.max_version)]
    );
    // Everything the dev broker has is still there, with its own ranges.
    for k in &without.api_keys {
        let ours = with
            .api_keys
            .iter()
            .find(|o| o.api_key == k.api_key)
            .expect("kept");
        assert_eq!(
            (ours.min_version, ours.max_version),
            (k.min_version, k.max_version)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_configs_are_described_altered_pushed_and_refused_as_kafka_does() {
    let cluster = ProxiedDevBroker::start(1, &[]).expect("dev broker behind the proxy");
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;

    // A group nobody configured: Kafka's defaults.
    let before = raw.describe(&[(GROUP, "orders-sink")], true).await;
    assert_eq!(
        config(&before[0], "share.auto.offset.reset"),
        ("latest".into(), SOURCE_DEFAULT, vec![SOURCE_DEFAULT])
    );
    assert_eq!(
        config(&before[0], "share.record.lock.duration.ms").0,
        "30000"
    );
    assert_eq!(
        config(&before[0], "share.isolation.level").0,
        "read_uncommitted"
    );
    assert_eq!(before[0].configs.len(), 11, "all of GroupConfig's keys");

    // Set, then described back as a group config, and in force on the dev broker.
    let set = raw
        .alter(
            GROUP,
            "orders-sink",
            &[
                ("share.auto.offset.reset", 0, Some("earliest")),
                ("share.record.lock.duration.ms", 0, Some("4000")),
            ],
            false,
        )
        .await;
    assert_eq!(set, (0, None));
    let after = raw
        .describe(&[(GROUP, "orders-sink"), (GROUP, "other-group")], true)
        .await;
    assert_eq!(
        config(&after[0], "share.auto.offset.reset"),
        ("earliest".into(), SOURCE_GROUP, vec![SOURCE_GROUP])
    );
    assert_eq!(
        config(&after[0], "share.record.lock.duration.ms"),
        ("4000".into(), SOURCE_GROUP, vec![SOURCE_GROUP])
    );
    assert_eq!(
        config(&after[1], "share.auto.offset.reset"),
        ("latest".into(), SOURCE_DEFAULT, vec![SOURCE_DEFAULT])
    );
    assert_eq!(in_force(cluster.broker(), "auto_offset_reset"), "earliest");
    assert_eq!(in_force(cluster.broker(), "record_lock_duration_ms"), 4000);

    // Refusals, in Kafka's words; nothing changes.
    assert_eq!(
        raw.alter(
            GROUP,
            "orders-sink",
            &[("share.auto.offset.rest", 0, Some("latest"))],
            false
        )
        .await,
        (
            40,
            Some("Unknown group config name: share.auto.offset.rest".into())
        )
    );
    let (code, message) = raw
        .alter(
            GROUP,
            "orders-sink",
            &[("share.auto.offset.reset", 0, Some("sideways"))],
            false,
        )
        .await;
    assert_eq!(code, 40);
    assert!(message
        .unwrap()
        .starts_with("Invalid value sideways for configuration share.auto.offset.reset:"));
    assert_eq!(
        raw.alter(GROUP, "orders-sink", &[("share.record.lock.duration.ms", 0, Some("soon"))], false).await,
        (40, Some("Invalid value soon for configuration share.record.lock.duration.ms: Not a number of type INT".into()))
    );
    assert_eq!(
        raw.alter(GROUP, "orders-sink", &[("share.session.timeout.ms", 0, Some("4000"))], false).await,
        (40, Some("share.session.timeout.ms must be greater than or equal to group.share.min.session.timeout.ms".into()))
    );
    // validateOnly checks and changes nothing.
    assert_eq!(
        raw.alter(
            GROUP,
            "orders-sink",
            &[("share.auto.offset.reset", 0, Some("latest"))],
            true
        )
        .await,
        (0, None)
    );
    let still = raw.describe(&[(GROUP, "orders-sink")], false).await;
    assert_eq!(config(&still[0], "share.auto.offset.reset").0, "earliest");
    assert_eq!(in_force(cluster.broker(), "auto_offset_reset"), "earliest");

    // by_duration is stored as given; the mock, which only knows earliest/latest, gets earliest.
    assert_eq!(
        raw.alter(
            GROUP,
            "orders-sink",
            &[("share.auto.offset.reset", 0, Some("by_duration:PT1H"))],
            false
        )
        .await,
        (0, None)
    );
    let described = raw.describe(&[(GROUP, "orders-sink")], false).await;
    assert_eq!(
        config(&described[0], "share.auto.offset.reset").0,
        "by_duration:PT1H"
    );
    assert_eq!(in_force(cluster.broker(), "auto_offset_reset"), "earliest");

    // DELETE returns to the default, on the group and on the mock.
    assert_eq!(
        raw.alter(
            GROUP,
            "orders-sink",
            &[
                ("share.auto.offset.reset", 1, None),
                ("share.record.lock.duration.ms", 1, None)
            ],
            false
        )
        .await,
        (0, None)
    );
    let reset = raw.describe(&[(GROUP, "orders-sink")], false).await;
    assert_eq!(
        config(&reset[0], "share.auto.offset.reset"),
        ("latest".into(), SOURCE_DEFAULT, vec![])
    );
    assert_eq!(in_force(cluster.broker(), "auto_offset_reset"), "latest");
    assert_eq!(in_force(cluster.broker(), "record_lock_duration_ms"), 30000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_configs_show_what_the_dev_broker_has_in_force_and_are_read_only() {
    let cluster = ProxiedDevBroker::start(2, &[]).expect("dev broker behind the proxy");
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;
    let described = raw.describe(&[(BROKER, "1")], true).await;
    assert_eq!(
        config(&described[0], "group.share.delivery.count.limit"),
        ("5".into(), SOURCE_DEFAULT, vec![SOURCE_DEFAULT])
    );
    assert_eq!(
        config(&described[0], "group.share.record.lock.duration.ms").0,
        "30000"
    );

    cluster.broker().set_share_max_delivery_attempts(3);
    let described = raw
        .describe(&[(BROKER, "1"), (BROKER, "2"), (BROKER, "")], true)
        .await;
    assert_eq!(
        config(&described[0], "group.share.delivery.count.limit"),
        (
            "3".into(),
            SOURCE_STATIC_BROKER,
            vec![SOURCE_STATIC_BROKER, SOURCE_DEFAULT]
        )
    );
    // Broker 2 is described by broker 2 only, as on Kafka; the cluster default lists the
    // dynamic defaults, of which there are none.
    assert_eq!(described[1].error_code, 42);
    assert_eq!(
        described[1].error_message.as_deref(),
        Some("Unexpected broker id, expected 1 or empty string, but received 2")
    );
    assert_eq!(
        (described[2].error_code, described[2].configs.len()),
        (0, 0)
    );

    // Kafka 4.2 cannot change these at run time.
    assert_eq!(
        raw.alter(
            BROKER,
            "1",
            &[("group.share.delivery.count.limit", 0, Some("7"))],
            false
        )
        .await,
        (
            42,
            Some(
                "Cannot update these configs dynamically: Set(group.share.delivery.count.limit)"
                    .into()
            )
        )
    );
    assert_eq!(in_force(cluster.broker(), "max_delivery_attempts"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_creates_refuses_existing_and_impossible_topics_and_remembers_configs() {
    let cluster =
        ProxiedDevBroker::start(1, &[("existing", 2)]).expect("dev broker behind the proxy");
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;

    let created = raw
        .create_topic("ledger", 3, 1, &[("cleanup.policy", "compact")], false)
        .await;
    assert_eq!(
        (
            created.error_code,
            created.num_partitions,
            created.replication_factor
        ),
        (0, 3, 1)
    );
    assert!(!created.topic_id.is_nil(), "the topic id the broker gave");
    let configs = created.configs.expect("v5+ answers carry the configs");
    let policy = configs
        .iter()
        .find(|c| c.name.as_str() == "cleanup.policy")
        .unwrap();
    assert_eq!(
        (policy.value.as_deref(), policy.config_source),
        (Some("compact"), SOURCE_TOPIC)
    );
    assert_eq!(
        raw.partitions(&["ledger"]).await,
        vec![("ledger".to_string(), 3)]
    );

    let again = raw.create_topic("ledger", 3, 1, &[], false).await;
    assert_eq!(again.error_code, 36);
    assert_eq!(
        again.error_message.as_deref(),
        Some("Topic 'ledger' already exists.")
    );
    let existing = raw.create_topic("existing", 2, -1, &[], false).await;
    assert_eq!(
        existing.error_code, 36,
        "a topic made by the launcher, learned from Metadata"
    );

    let too_many = raw.create_topic("replicated", 1, 3, &[], false).await;
    assert_eq!(too_many.error_code, 38);
    assert_eq!(
        too_many.error_message.as_deref(),
        Some("Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached because only 1 broker(s) are registered.")
    );
    let bad_config = raw
        .create_topic("bad-config", 1, 1, &[("cleanup.policy", "shred")], false)
        .await;
    assert_eq!(bad_config.error_code, 40);
    let dry = raw.create_topic("dry-run", 4, -1, &[], true).await;
    assert_eq!(
        (dry.error_code, dry.num_partitions, dry.replication_factor),
        (0, 4, 1)
    );
    assert!(
        raw.partitions(&["replicated", "bad-config", "dry-run"])
            .await
            .is_empty(),
        "nothing else was created"
    );

    let described = raw
        .describe(
            &[(TOPIC, "ledger"), (TOPIC, "existing"), (TOPIC, "missing")],
            true,
        )
        .await;
    assert_eq!(
        config(&described[0], "cleanup.policy"),
        (
            "compact".into(),
            SOURCE_TOPIC,
            vec![SOURCE_TOPIC, SOURCE_DEFAULT]
        )
    );
    assert_eq!(
        config(&described[1], "cleanup.policy"),
        ("delete".into(), SOURCE_DEFAULT, vec![SOURCE_DEFAULT])
    );
    assert_eq!(described[2].error_code, 3);
}

/// Polls `consumer` (acknowledging) until `want` records arrived or 60 s passed.
async fn drain(consumer: &mut ShareConsumer, want: usize) -> BTreeSet<(i32, i64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    while seen.len() < want && Instant::now() < deadline {
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .expect("poll");
        consumer
            .acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("acknowledge");
        seen.extend(records.iter().map(|r| (r.partition, r.offset)));
    }
    seen
}

async fn share_consumer(bootstrap: &str, group: &str, topic: &str) -> ShareConsumer {
    let mut config = ShareConsumerConfig::new(bootstrap, group);
    config.request_timeout = Duration::from_secs(5);
    let mut consumer = ShareConsumer::connect(config)
        .await
        .expect("share consumer");
    consumer.subscribe(&[topic]);
    consumer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_auto_offset_reset_set_through_the_proxy_decides_what_a_new_group_sees() {
    let cluster =
        ProxiedDevBroker::start(1, &[("backlog", 1)]).expect("dev broker behind the proxy");
    cluster.broker().set_share_heartbeat_interval(300);
    let producer = TestProducer::new(&cluster.broker().bootstrap(), "none");
    producer.send("backlog", numbered_records(50, 10, 1)).await;

    // Left at Kafka's default (latest): the group sees only what arrives after it started.
    let mut latest = share_consumer(&cluster.bootstrap(), "left-at-latest", "backlog").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while latest.assigned_partitions() == 0 && Instant::now() < deadline {
        latest.poll(Duration::from_millis(200)).await.expect("poll");
    }
    assert_eq!(
        latest.assigned_partitions(),
        1,
        "the member got the partition"
    );
    // A few fetches so the share-partition starts (at the end) before more records come.
    for _ in 0..5 {
        assert!(latest
            .poll(Duration::from_millis(200))
            .await
            .expect("poll")
            .is_empty());
    }
    producer.send("backlog", numbered_records(10, 10, 1)).await;
    let seen = drain(&mut latest, 10).await;
    assert_eq!(seen.len(), 10, "the 10 new records: {seen:?}");
    assert!(
        seen.iter().all(|(_, offset)| *offset >= 50),
        "none of the backlog: {seen:?}"
    );
    latest.close().await.expect("close");

    // Set to earliest through the admin API: the new group gets the backlog too.
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;
    assert_eq!(
        raw.alter(
            GROUP,
            "set-to-earliest",
            &[("share.auto.offset.reset", 0, Some("earliest"))],
            false
        )
        .await,
        (0, None)
    );
    let mut earliest = share_consumer(&cluster.bootstrap(), "set-to-earliest", "backlog").await;
    let seen = drain(&mut earliest, 60).await;
    assert_eq!(seen.len(), 60, "every record, the backlog included");
    earliest.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_group_offsets_round_trip_and_need_an_empty_group() {
    let cluster =
        ProxiedDevBroker::start(1, &[("positions", 2)]).expect("dev broker behind the proxy");
    cluster.broker().set_share_heartbeat_interval(300);
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;

    // Nothing stored yet: -1, as Kafka answers for uninitialised share-partitions.
    assert_eq!(
        raw.describe_offsets("offsets-group", Some(&[("positions", &[0, 1])]))
            .await,
        vec![("positions".into(), 0, -1), ("positions".into(), 1, -1)]
    );
    let altered = raw
        .alter_offsets("offsets-group", "positions", &[(0, 17), (1, 4), (5, 1)])
        .await;
    assert_eq!(altered.error_code, 0);
    let codes: Vec<(i32, i16)> = altered.responses[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.error_code))
        .collect();
    assert_eq!(
        codes,
        vec![(0, 0), (1, 0), (5, 3)],
        "partition 5 does not exist"
    );
    assert!(!altered.responses[0].topic_id.is_nil());
    let unknown = raw
        .alter_offsets("offsets-group", "no-such-topic", &[(0, 1)])
        .await;
    assert_eq!(unknown.responses[0].partitions[0].error_code, 3);

    assert_eq!(
        raw.describe_offsets(
            "offsets-group",
            Some(&[("positions", &[0, 1]), ("no-such-topic", &[0])])
        )
        .await,
        vec![
            ("positions".into(), 0, 17),
            ("positions".into(), 1, 4),
            ("no-such-topic".into(), 0, -1)
        ]
    );
    assert_eq!(
        raw.describe_offsets("offsets-group", None).await,
        vec![("positions".into(), 0, 17), ("positions".into(), 1, 4)],
        "null topics: everything the group has"
    );

    let deleted = raw.delete_offsets("offsets-group", "positions").await;
    assert_eq!(
        (deleted.error_code, deleted.responses[0].error_code),
        (0, 0)
    );
    assert_eq!(
        raw.describe_offsets("offsets-group", Some(&[("positions", &[0])]))
            .await,
        vec![("positions".into(), 0, -1)]
    );
    let twice = raw.delete_offsets("offsets-group", "positions").await;
    assert_eq!(twice.responses[0].error_code, 3);
    assert_eq!(
        twice.responses[0].error_message.as_deref(),
        Some("There is no offset information to delete.")
    );
    let nobody = raw.delete_offsets("never-seen", "positions").await;
    assert_eq!(
        (nobody.error_code, nobody.error_message.as_deref()),
        (69, Some("Group never-seen not found."))
    );

    // A group with a member: Alter and Delete are refused, as Kafka refuses them.
    let mut member = share_consumer(&cluster.bootstrap(), "busy-group", "positions").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.broker().share_member_ids("busy-group").is_empty() && Instant::now() < deadline {
        member.poll(Duration::from_millis(200)).await.expect("poll");
    }
    assert!(
        !cluster.broker().share_member_ids("busy-group").is_empty(),
        "the member joined"
    );
    let refused = raw
        .alter_offsets("busy-group", "positions", &[(0, 3)])
        .await;
    assert_eq!(
        (refused.error_code, refused.error_message.as_deref()),
        (68, Some("The group is not empty."))
    );
    assert!(
        cluster.admin().share_start_offsets("busy-group").is_empty(),
        "nothing stored"
    );
    let refused = raw.delete_offsets("busy-group", "positions").await;
    assert_eq!(refused.error_code, 68);
    member.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_operations_are_refused_per_resource_as_kafka_does() {
    let cluster = ProxiedDevBroker::start_with(
        1,
        &[("guarded", 1)],
        ProxyOptions::new(ProxySecurity::Plaintext)
            .with_denied_operation(AdminOperation::AlterConfigs)
            .with_denied_operation(AdminOperation::Create),
    )
    .expect("dev broker behind the proxy");
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;
    assert_eq!(
        raw.alter(
            GROUP,
            "g",
            &[("share.auto.offset.reset", 0, Some("earliest"))],
            false
        )
        .await,
        (30, Some("Group authorization failed.".into()))
    );
    assert_eq!(
        raw.alter(
            TOPIC,
            "guarded",
            &[("cleanup.policy", 0, Some("compact"))],
            false
        )
        .await,
        (29, Some("Topic authorization failed.".into()))
    );
    assert_eq!(
        raw.alter(BROKER, "1", &[("log.cleaner.threads", 0, Some("2"))], false)
            .await,
        (31, Some("Cluster authorization failed.".into()))
    );
    let refused = raw.create_topic("not-allowed", 1, 1, &[], false).await;
    assert_eq!(
        (refused.error_code, refused.error_message.as_deref()),
        (29, Some("Authorization failed."))
    );
    assert!(raw.partitions(&["not-allowed"]).await.is_empty());
    assert_eq!(
        in_force(cluster.broker(), "auto_offset_reset"),
        "latest",
        "the refused change did not reach the mock"
    );
    // Describing is still allowed; granting at run time lets the change through.
    assert_eq!(
        config(
            &raw.describe(&[(GROUP, "g")], false).await[0],
            "share.auto.offset.reset"
        )
        .0,
        "latest"
    );
    cluster.admin().allow(AdminOperation::AlterConfigs);
    assert_eq!(
        raw.alter(
            GROUP,
            "g",
            &[("share.auto.offset.reset", 0, Some("earliest"))],
            false
        )
        .await,
        (0, None)
    );
    cluster.admin().deny(AdminOperation::DescribeConfigs);
    let denied = raw.describe(&[(GROUP, "g"), (BROKER, "1")], false).await;
    assert_eq!((denied[0].error_code, denied[1].error_code), (30, 31));
    // Allowed to create but not to describe: created, without its configs in the answer.
    cluster.admin().allow(AdminOperation::Create);
    let created = raw.create_topic("made-unseen", 1, 1, &[], false).await;
    assert_eq!(
        (created.error_code, created.topic_config_error_code),
        (0, 29)
    );
    assert_eq!(created.configs.map(|c| c.len()), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_only_connection_never_touches_the_dev_broker() {
    let cluster = ProxiedDevBroker::start(1, &[]).expect("dev broker behind the proxy");
    cluster.broker().start_request_tracking();
    {
        let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;
        assert_eq!(raw.api_versions().await.error_code, 0);
        raw.describe(&[(GROUP, "quiet"), (BROKER, "1")], true).await;
        assert_eq!(
            raw.alter(
                GROUP,
                "quiet",
                &[("share.isolation.level", 0, Some("read_committed"))],
                false
            )
            .await,
            (0, None)
        );
        raw.alter_offsets("quiet", "absent", &[(0, 1)]).await;
    }
    // The Metadata lookup (for the share offsets' topic) used the emulation's one long-lived
    // connection; no client connection reached the broker.
    assert_eq!(cluster.proxy().upstream_connections_opened(), 0);
    assert_eq!(cluster.admin().metadata_connections_opened(), 1);
    let counts = cluster.broker().request_counts();
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        vec![METADATA],
        "{counts:?}"
    );
    assert_eq!(
        in_force(cluster.broker(), "isolation_level"),
        "read_committed"
    );

    // A forwarded request opens the client's connection then, and only then.
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;
    raw.api_versions().await;
    assert_eq!(cluster.proxy().upstream_connections_opened(), 0);
    raw.partitions(&["anything"]).await;
    assert_eq!(cluster.proxy().upstream_connections_opened(), 1);
}

/// librdkafka's admin client negotiates versions with the proxy's ApiVersions (it starts at a
/// version the dev broker lacks and steps down) and uses the emulated APIs; through a proxy
/// without the emulation it finds CreateTopics unsupported, as on the bare dev broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdkafka_admin_client_creates_and_describes_through_the_emulation_only() {
    use rdkafka::admin::{
        AdminClient, AdminOptions, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication,
    };
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::types::RDKafkaErrorCode;

    let cluster = ProxiedDevBroker::start(1, &[]).expect("dev broker behind the proxy");
    let admin = |bootstrap: String| -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("socket.timeout.ms", "10000")
            .create()
            .expect("admin client")
    };
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(20)));
    let client = admin(cluster.bootstrap());
    let topic = NewTopic::new("via-rdkafka", 2, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact");
    let created = client
        .create_topics([&topic], &options)
        .await
        .expect("CreateTopics answered");
    assert_eq!(created, vec![Ok("via-rdkafka".to_string())]);
    let again = client
        .create_topics([&topic], &options)
        .await
        .expect("CreateTopics answered");
    assert_eq!(
        again,
        vec![Err((
            "via-rdkafka".to_string(),
            RDKafkaErrorCode::TopicAlreadyExists
        ))]
    );

    let described = client
        .describe_configs(
            [
                &ResourceSpecifier::Topic("via-rdkafka"),
                &ResourceSpecifier::Broker(1),
            ],
            &options,
        )
        .await
        .expect("DescribeConfigs answered");
    let topic_configs = described[0].as_ref().expect("topic described");
    let policy = topic_configs.get("cleanup.policy").expect("cleanup.policy");
    assert_eq!(
        (policy.value.as_deref(), &policy.source),
        (Some("compact"), &ConfigSource::DynamicTopic)
    );
    let broker_configs = described[1].as_ref().expect("broker described");
    let limit = broker_configs
        .get("group.share.delivery.count.limit")
        .expect("delivery limit");
    assert_eq!(
        (limit.value.as_deref(), limit.is_read_only),
        (Some("5"), true)
    );

    let plain = KafkaProxy::start(
        &cluster.broker().bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy starts");
    // The dev broker names no real controller, so librdkafka never finds one to ask.
    let short = AdminOptions::new().request_timeout(Some(Duration::from_secs(3)));
    let unsupported = admin(plain.bootstrap())
        .create_topics(
            [&NewTopic::new("never", 1, TopicReplication::Fixed(1))],
            &short,
        )
        .await;
    assert!(
        !matches!(unsupported.as_deref(), Ok([Ok(_)])),
        "CreateTopics must not succeed without the emulation: {unsupported:?}"
    );
}

/// On a SASL listener the proxy's ApiVersions answer lists the SASL APIs with the emulated ones,
/// and an emulated request before authentication closes the connection, as Kafka does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_listener_advertises_sasl_and_admin_apis_and_admin_waits_for_authentication() {
    let cluster = ProxiedDevBroker::start_with(
        1,
        &[],
        ProxyOptions::new(ProxySecurity::SaslPlaintext).with_user("alice", "alice-secret"),
    )
    .expect("dev broker behind the proxy");
    let mut raw = Raw::connect(&first_listener(cluster.proxy())).await;
    let versions = raw.api_versions().await;
    let keys: BTreeSet<i16> = versions.api_keys.iter().map(|k| k.api_key).collect();
    for key in [17, 36, CREATE_TOPICS, DESCRIBE_CONFIGS] {
        assert!(keys.contains(&key), "api_key={key} advertised: {keys:?}");
    }
    // DescribeConfigs before SaslHandshake: the connection closes without an answer.
    let mut request = DescribeConfigsRequest::default();
    let mut resource = DescribeConfigsResource::default();
    resource.resource_type = GROUP;
    resource.resource_name = StrBytes::from_static_str("g");
    request.resources = vec![resource];
    let mut header = RequestHeader::default();
    header.request_api_key = DESCRIBE_CONFIGS;
    header.request_api_version = 4;
    header.correlation_id = 99;
    let mut buf = bytes::BytesMut::new();
    header
        .encode(&mut buf, DescribeConfigsRequest::header_version(4))
        .unwrap();
    request.encode(&mut buf, 4).unwrap();
    let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    raw.socket.write_all(&frame).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), raw.socket.read(&mut byte))
        .await
        .expect("the proxy closes the connection");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, not answered: {read:?}"
    );
}
