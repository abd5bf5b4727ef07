//! The test-kit proxy's partition growth (`ProxyOptions::with_partition_growth`): topics gain
//! partitions through CreatePartitions as on Kafka 4.2, though the dev broker cannot add any.
//! Checked with Spillway's admin client, librdkafka clients and raw protocol requests for the
//! partitions clients may not see yet.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ListOffsetsRequest, ListOffsetsResponse, ProduceRequest, ProduceResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use spillway_kafka::admin::{AdminClient, AdminError, NewTopic};
use spillway_kafka::producer::{IdempotentProducer, OutRecord};
use spillway_kafka::security::ClientSecurity;
use spillway_tests::kafka_proxy::{ProxyOptions, ProxySecurity};
use spillway_tests::{ProxiedDevBroker, TestProducer, TestRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PRODUCE: i16 = 0;
const LIST_OFFSETS: i16 = 2;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_PARTITIONS: i16 = 37;

fn growth() -> ProxyOptions {
    ProxyOptions::new(ProxySecurity::Plaintext).with_partition_growth()
}

/// Topic → partitions, as a librdkafka client connected to `bootstrap` sees them.
fn partitions(bootstrap: &str, topic: &str) -> usize {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client");
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    metadata.topics()[0].partitions().len()
}

fn high_watermark(bootstrap: &str, topic: &str, partition: i32) -> i64 {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("watermark client");
    client
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .expect("watermarks")
        .1
}

async fn admin(bootstrap: &str) -> AdminClient {
    AdminClient::connect(
        bootstrap,
        "growth-test",
        Duration::from_secs(10),
        ClientSecurity::plaintext(),
    )
    .await
    .expect("admin client")
}

/// The refusal's code and message.
fn refusal(result: Result<(), AdminError>) -> (i16, String) {
    match result {
        Err(AdminError::Resource { code, message, .. }) => (code, message),
        other => panic!("expected a refusal for the topic, got {other:?}"),
    }
}

/// One request on a fresh connection, decoded as `Resp`.
async fn call<Req, Resp>(address: &str, api_key: i16, version: i16, body: &Req) -> Resp
where
    Req: Encodable + HeaderVersion,
    Resp: Decodable + HeaderVersion,
{
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut header = RequestHeader::default();
    header.request_api_key = api_key;
    header.request_api_version = version;
    header.correlation_id = 7;
    header.client_id = Some(StrBytes::from_static_str("raw-growth"));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, Req::header_version(version))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    socket
        .write_all(&(buf.len() as u32).to_be_bytes())
        .await
        .unwrap();
    socket.write_all(&buf).await.unwrap();
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(30), socket.read_exact(&mut len))
        .await
        .expect("an answer in time")
        .unwrap();
    let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
    socket.read_exact(&mut frame).await.unwrap();
    let mut frame = Bytes::from(frame);
    let header = ResponseHeader::decode(&mut frame, Resp::header_version(version)).unwrap();
    assert_eq!(header.correlation_id, 7);
    Resp::decode(&mut frame, version).unwrap()
}

/// A Produce request with one record for each of `partitions` of `topic`.
fn produce_request(topic: &str, partitions: &[i32]) -> ProduceRequest {
    let mut data = TopicProduceData::default();
    data.name = TopicName(StrBytes::from_string(topic.to_owned()));
    for &p in partitions {
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from(format!("k{p}"))),
            value: Some(Bytes::from(format!("v{p}"))),
            headers: Default::default(),
        };
        let mut records = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut records,
            [&record],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        let mut partition = PartitionProduceData::default();
        partition.index = p;
        partition.records = Some(records.freeze());
        data.partition_data.push(partition);
    }
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = 10_000;
    request.topic_data = vec![data];
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_partitions_raises_what_metadata_shows_and_is_refused_as_kafka_refuses_it() {
    let cluster =
        ProxiedDevBroker::start_with(1, &[("orders", 2)], growth()).expect("a proxied cluster");
    let proxy = cluster.bootstrap();
    assert_eq!(partitions(&proxy, "orders"), 2, "what clients see");
    assert_eq!(
        partitions(&cluster.broker().bootstrap(), "orders"),
        8,
        "the dev broker's room to grow"
    );

    let admin = admin(&proxy).await;
    let (code, message) = refusal(admin.create_partitions("orders", 2).await);
    assert_eq!(code, INVALID_PARTITIONS);
    assert!(message.contains("already has 2 partition(s)"), "{message}");
    let (code, message) = refusal(admin.create_partitions("orders", 1).await);
    assert_eq!(code, INVALID_PARTITIONS);
    assert!(message.contains("1 would not be an increase"), "{message}");
    let (code, message) = refusal(admin.create_partitions("orders", 9).await);
    assert_eq!(code, INVALID_PARTITIONS);
    assert!(
        message.contains("at most those, not 9") && message.contains("with_partition_capacity"),
        "past the capacity the refusal says why: {message}"
    );
    let (code, _) = refusal(admin.create_partitions("missing", 3).await);
    assert_eq!(code, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(partitions(&proxy, "orders"), 2, "refusals change nothing");

    admin
        .create_partitions("orders", 4)
        .await
        .expect("orders grows to 4");
    assert_eq!(partitions(&proxy, "orders"), 4);
    // The new partitions take records as any other.
    let produced = TestProducer::new(&proxy, "none")
        .send(
            "orders",
            vec![TestRecord {
                partition: Some(3),
                key: Some(b"k".to_vec()),
                value: Some(b"v".to_vec()),
                headers: Vec::new(),
                timestamp: None,
            }],
        )
        .await;
    assert_eq!((produced[0].partition, produced[0].offset), (3, 0));
    assert_eq!(high_watermark(&proxy, "orders", 3), 1);

    // A topic made through CreateTopics gets room to grow as well.
    admin
        .create_topic(&NewTopic {
            name: "events".into(),
            partitions: 3,
            replication_factor: 1,
            configs: Vec::new(),
        })
        .await
        .expect("events created");
    assert_eq!(partitions(&proxy, "events"), 3);
    assert_eq!(partitions(&cluster.broker().bootstrap(), "events"), 8);
    admin
        .create_partitions("events", 8)
        .await
        .expect("up to the capacity");
    assert_eq!(partitions(&proxy, "events"), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_not_shown_yet_answer_unknown_partition_and_take_no_records() {
    let cluster =
        ProxiedDevBroker::start_with(1, &[("orders", 2)], growth()).expect("a proxied cluster");
    let listener = cluster.proxy().listener(1).expect("listener").to_string();

    let answer: ProduceResponse =
        call(&listener, PRODUCE, 7, &produce_request("orders", &[1, 5])).await;
    let codes: Vec<(i32, i16)> = answer.responses[0]
        .partition_responses
        .iter()
        .map(|p| (p.index, p.error_code))
        .collect();
    assert!(codes.contains(&(1, 0)), "{codes:?}");
    assert!(
        codes.contains(&(5, UNKNOWN_TOPIC_OR_PARTITION)),
        "{codes:?}"
    );
    let mock = cluster.broker().bootstrap();
    assert_eq!(high_watermark(&mock, "orders", 1), 1);
    assert_eq!(
        high_watermark(&mock, "orders", 5),
        0,
        "the dev broker never saw the hidden partition's record"
    );

    let mut topic = ListOffsetsTopic::default();
    topic.name = TopicName(StrBytes::from_static_str("orders"));
    for p in [0, 5] {
        let mut partition = ListOffsetsPartition::default();
        partition.partition_index = p;
        partition.timestamp = -1;
        topic.partitions.push(partition);
    }
    let mut request = ListOffsetsRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.topics = vec![topic];
    let answer: ListOffsetsResponse = call(&listener, LIST_OFFSETS, 4, &request).await;
    let codes: Vec<(i32, i16)> = answer.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.error_code))
        .collect();
    assert_eq!(codes, vec![(0, 0), (5, UNKNOWN_TOPIC_OR_PARTITION)]);

    // Once grown, the partition is there, empty, as on Kafka.
    admin(&cluster.bootstrap())
        .await
        .create_partitions("orders", 6)
        .await
        .expect("grown");
    assert_eq!(high_watermark(&cluster.bootstrap(), "orders", 5), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_create_partitions_is_unsupported_as_on_the_dev_broker() {
    let cluster = ProxiedDevBroker::start(1, &[("orders", 2)]).expect("a proxied cluster");
    assert_eq!(partitions(&cluster.bootstrap(), "orders"), 2);
    match admin(&cluster.bootstrap())
        .await
        .create_partitions("orders", 4)
        .await
    {
        Err(AdminError::Unsupported { api, .. }) => assert_eq!(api, "CreatePartitions"),
        other => panic!("expected CreatePartitions to be unsupported, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_knew_fewer_partitions_writes_to_one_added_since() {
    let cluster =
        ProxiedDevBroker::start_with(1, &[("orders", 2)], growth()).expect("a proxied cluster");
    let producer = IdempotentProducer::new(&cluster.bootstrap(), []).expect("producer");
    let record = |partition: i32| OutRecord {
        topic: "orders".into(),
        partition: Some(partition),
        value: Some(Bytes::from(format!("v{partition}"))),
        ..OutRecord::default()
    };
    // The producer learns that orders has 2 partitions (and would not ask again for minutes).
    producer.send(&record(1)).await.expect("written");
    admin(&cluster.bootstrap())
        .await
        .create_partitions("orders", 4)
        .await
        .expect("grown");
    let written = producer
        .send(&record(3))
        .await
        .expect("written to the partition added since");
    assert_eq!((written.partition, written.offset), (3, 0));
    // A partition that does not come still fails, for good, after the wait.
    let refused = producer.send(&record(6)).await.expect_err("no partition 6");
    assert!(!refused.is_retriable(), "{refused}");
}
