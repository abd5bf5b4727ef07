//! The admin client against a small fake broker that answers the admin APIs as Kafka 4.2
//! does (shapes, error codes, config sources), keeping its state in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::security::SecuritySettings;

const T: Duration = Duration::from_secs(5);

/// A created topic: name, partitions, replication factor, configs.
type Created = (String, i32, i16, Vec<(String, String)>);

#[derive(Default)]
struct Fake {
    /// Admin APIs the broker offers (ApiVersions, Metadata and FindCoordinator always).
    admin_apis: BTreeSet<i16>,
    /// Api keys answered with an authorization failure.
    denied: BTreeSet<i16>,
    group_configs: BTreeMap<String, BTreeMap<String, String>>,
    topics: BTreeSet<String>,
    /// Topics Metadata lists with an error (being created).
    unavailable_topics: BTreeSet<String>,
    created: Vec<Created>,
    /// Partition counts of the topics created or grown.
    partitions: BTreeMap<String, i32>,
    share_offsets: BTreeMap<(String, String, i32), i64>,
    /// Groups with members (offsets cannot change).
    active_groups: BTreeSet<String>,
    /// Api keys of the requests seen.
    seen: Vec<i16>,
    /// Api keys of the requests seen, with the listener that got each.
    seen_at: Vec<(i16, SocketAddr)>,
    /// The brokers Metadata lists (empty: the listener alone, as broker 1).
    cluster: Vec<(i32, SocketAddr)>,
    /// The group coordinator FindCoordinator names (default: the listener, as broker 1).
    coordinator: Option<(i32, SocketAddr)>,
    connections: usize,
}

type Shared = Arc<Mutex<Fake>>;

const ALL_ADMIN: [i16; 7] = [32, 44, 19, 37, 90, 91, 92];

async fn fake_broker(fake: Shared) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            fake.lock().unwrap().connections += 1;
            let fake = Arc::clone(&fake);
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 4];
                    if socket.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
                    if socket.read_exact(&mut frame).await.is_err() {
                        return;
                    }
                    let out = answer(&fake, addr, Bytes::from(frame));
                    if socket.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn answer(fake: &Shared, addr: SocketAddr, mut frame: Bytes) -> Bytes {
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let api = ApiKey::try_from(key).expect("known api key");
    let header = RequestHeader::decode(&mut frame, api.request_header_version(version)).unwrap();
    let mut state = fake.lock().unwrap();
    state.seen.push(key);
    state.seen_at.push((key, addr));
    let denied = state.denied.contains(&key);
    let mut body = BytesMut::new();
    match api {
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsResponse::default();
            let mut keys = vec![(18, 0, 3), (3, 10, 12), (10, 0, 4)];
            keys.extend(state.admin_apis.iter().map(|k| match k {
                32 => (32, 1, 4),
                44 => (44, 0, 1),
                19 => (19, 2, 7),
                37 => (37, 2, 3),
                k => (*k, 0, 0),
            }));
            r.api_keys = keys
                .into_iter()
                .map(|(k, min, max)| {
                    let mut v = ApiVersion::default();
                    v.api_key = k;
                    v.min_version = min;
                    v.max_version = max;
                    v
                })
                .collect();
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::Metadata => {
            let request = MetadataRequest::decode(&mut frame, version).unwrap();
            let mut r = MetadataResponse::default();
            // All topics (`None`): the topics made, each with its partitions, and those not
            // ready, with LEADER_NOT_AVAILABLE as Kafka answers for a topic being created.
            if request.topics.is_none() {
                for name in &state.topics {
                    let mut t = metadata_response::MetadataResponseTopic::default();
                    t.name = Some(TopicName(str(name)));
                    let count = state.partitions.get(name).copied().unwrap_or(1);
                    t.partitions = (0..count)
                        .map(|i| {
                            let mut p = metadata_response::MetadataResponsePartition::default();
                            p.partition_index = i;
                            p
                        })
                        .collect();
                    r.topics.push(t);
                }
                for name in &state.unavailable_topics {
                    let mut t = metadata_response::MetadataResponseTopic::default();
                    t.name = Some(TopicName(str(name)));
                    t.error_code = 5;
                    r.topics.push(t);
                }
            }
            let cluster = match state.cluster.is_empty() {
                true => vec![(1, addr)],
                false => state.cluster.clone(),
            };
            r.brokers = cluster
                .into_iter()
                .map(|(id, at)| {
                    let mut b = MetadataResponseBroker::default();
                    b.node_id = BrokerId(id);
                    b.host = str(&at.ip().to_string());
                    b.port = i32::from(at.port());
                    b
                })
                .collect();
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorResponse::default();
            let mut c = Coordinator::default();
            let (id, at) = state.coordinator.unwrap_or((1, addr));
            c.key = str("g");
            c.node_id = BrokerId(id);
            c.host = str(&at.ip().to_string());
            c.port = i32::from(at.port());
            r.coordinators = vec![c];
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::DescribeConfigs => {
            let request = DescribeConfigsRequest::decode(&mut frame, version).unwrap();
            let mut r = DescribeConfigsResponse::default();
            for res in request.resources {
                let mut result = DescribeConfigsResult::default();
                result.resource_type = res.resource_type;
                result.resource_name = res.resource_name.clone();
                let entry = |name: &str, value: &str, source: i8| {
                    let mut c = DescribeConfigsResourceResult::default();
                    c.name = str(name);
                    c.value = Some(str(value));
                    c.config_source = source;
                    c
                };
                if denied {
                    result.error_code = if res.resource_type == 32 { 30 } else { 31 };
                } else if res.resource_type == 32 {
                    let set = state
                        .group_configs
                        .get(res.resource_name.as_str())
                        .cloned()
                        .unwrap_or_default();
                    for (name, default) in [
                        ("share.auto.offset.reset", "latest"),
                        ("share.record.lock.duration.ms", "30000"),
                        ("share.isolation.level", "read_uncommitted"),
                    ] {
                        result.configs.push(match set.get(name) {
                            Some(v) => entry(name, v, GROUP_CONFIG_SOURCE),
                            None => entry(name, default, 5),
                        });
                    }
                } else if res.resource_type == 4 {
                    result
                        .configs
                        .push(entry("group.share.delivery.count.limit", "7", 4));
                }
                r.results.push(result);
            }
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::IncrementalAlterConfigs => {
            let request = IncrementalAlterConfigsRequest::decode(&mut frame, version).unwrap();
            let mut r = IncrementalAlterConfigsResponse::default();
            for res in request.resources {
                let mut out = AlterConfigsResourceResponse::default();
                out.resource_type = res.resource_type;
                out.resource_name = res.resource_name.clone();
                if denied {
                    out.error_code = 30;
                    out.error_message = Some(str("Group authorization failed."));
                } else {
                    let group = state
                        .group_configs
                        .entry(res.resource_name.to_string())
                        .or_default();
                    for c in res.configs {
                        match c.config_operation {
                            0 => {
                                group.insert(c.name.to_string(), c.value.unwrap().to_string());
                            }
                            _ => {
                                group.remove(c.name.as_str());
                            }
                        }
                    }
                }
                r.responses.push(out);
            }
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::CreatePartitions => {
            let request = CreatePartitionsRequest::decode(&mut frame, version).unwrap();
            let mut r = CreatePartitionsResponse::default();
            for t in request.topics {
                let mut out = create_partitions_response::CreatePartitionsTopicResult::default();
                out.name = t.name.clone();
                let name = t.name.0.to_string();
                match state.partitions.get(&name).copied() {
                    None => out.error_code = 3,
                    Some(have) if t.count <= have => {
                        out.error_code = 37;
                        out.error_message = Some(str(&format!(
                            "Topic currently has {have} partitions, which is higher than the requested {}.",
                            t.count
                        )));
                    }
                    Some(_) => {
                        state.partitions.insert(name, t.count);
                    }
                }
                r.results.push(out);
            }
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::CreateTopics => {
            let request = CreateTopicsRequest::decode(&mut frame, version).unwrap();
            let mut r = CreateTopicsResponse::default();
            for t in request.topics {
                let mut out = create_topics_response::CreatableTopicResult::default();
                out.name = t.name.clone();
                let name = t.name.0.to_string();
                if denied {
                    out.error_code = 29;
                    out.error_message = Some(str("Authorization failed."));
                } else if state.topics.contains(&name) {
                    out.error_code = 36;
                } else if t.replication_factor > 1 {
                    out.error_code = 38;
                    out.error_message = Some(str(&format!(
                        "Unable to replicate the partition {} time(s): The target replication factor of {} cannot be reached because only 1 broker(s) are registered.",
                        t.replication_factor, t.replication_factor
                    )));
                } else {
                    state.topics.insert(name.clone());
                    state.partitions.insert(name.clone(), t.num_partitions);
                    let configs = t
                        .configs
                        .iter()
                        .map(|c| (c.name.to_string(), c.value.clone().unwrap().to_string()))
                        .collect();
                    state
                        .created
                        .push((name, t.num_partitions, t.replication_factor, configs));
                }
                r.topics.push(out);
            }
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::DescribeShareGroupOffsets => {
            let request = DescribeShareGroupOffsetsRequest::decode(&mut frame, version).unwrap();
            let mut r = DescribeShareGroupOffsetsResponse::default();
            for g in request.groups {
                let mut out =
                    describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup::default();
                out.group_id = g.group_id.clone();
                if denied {
                    out.error_code = 30;
                } else {
                    let mut topics: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
                    for ((group, topic, p), o) in &state.share_offsets {
                        if group == g.group_id.as_str() {
                            topics.entry(topic.clone()).or_default().push((*p, *o));
                        }
                    }
                    for (topic, parts) in topics {
                        let mut t = describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseTopic::default();
                        t.topic_name = TopicName(str(&topic));
                        for (p, o) in parts {
                            let mut part = describe_share_group_offsets_response::DescribeShareGroupOffsetsResponsePartition::default();
                            part.partition_index = p;
                            part.start_offset = o;
                            t.partitions.push(part);
                        }
                        out.topics.push(t);
                    }
                }
                r.groups.push(out);
            }
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::AlterShareGroupOffsets => {
            let request = AlterShareGroupOffsetsRequest::decode(&mut frame, version).unwrap();
            let mut r = AlterShareGroupOffsetsResponse::default();
            let group = request.group_id.to_string();
            if denied {
                r.error_code = 30;
            } else if state.active_groups.contains(&group) {
                r.error_code = 68;
                r.error_message = Some(str("The group is not empty."));
            } else {
                for t in request.topics {
                    for p in t.partitions {
                        state.share_offsets.insert(
                            (group.clone(), t.topic_name.to_string(), p.partition_index),
                            p.start_offset,
                        );
                    }
                }
            }
            r.encode(&mut body, version).unwrap();
        }
        ApiKey::DeleteShareGroupOffsets => {
            let request = DeleteShareGroupOffsetsRequest::decode(&mut frame, version).unwrap();
            let mut r = DeleteShareGroupOffsetsResponse::default();
            let group = request.group_id.to_string();
            if denied {
                r.error_code = 30;
            } else {
                for t in request.topics {
                    let topic = t.topic_name.to_string();
                    state
                        .share_offsets
                        .retain(|(g, tp, _), _| !(g == &group && tp == &topic));
                }
            }
            r.encode(&mut body, version).unwrap();
        }
        other => panic!("the fake broker does not answer {other:?}"),
    }
    let mut out = BytesMut::new();
    let mut response_header = ResponseHeader::default();
    response_header.correlation_id = header.correlation_id;
    let header_version = api.response_header_version(version);
    let size = response_header.compute_size(header_version).unwrap() + body.len();
    out.put_i32(size as i32);
    response_header.encode(&mut out, header_version).unwrap();
    out.put(body);
    out.freeze()
}

async fn client(fake: &Shared) -> AdminClient {
    let addr = fake_broker(Arc::clone(fake)).await;
    AdminClient::connect(
        &addr.to_string(),
        "test",
        T,
        crate::security::ClientSecurity::plaintext(),
    )
    .await
    .expect("connects")
}

fn full_fake() -> Shared {
    let fake = Fake {
        admin_apis: ALL_ADMIN.into_iter().collect(),
        ..Fake::default()
    };
    Arc::new(Mutex::new(fake))
}

#[tokio::test]
async fn group_configs_are_read_with_their_source_and_changed_one_by_one() {
    let fake = full_fake();
    let admin = client(&fake).await;
    let group = ConfigResource::Group("connect-a".into());
    let before = admin
        .describe_configs(&group, &["share.auto.offset.reset"])
        .await
        .expect("describe");
    let reset = before.get("share.auto.offset.reset").expect("listed");
    assert_eq!(reset.value.as_deref(), Some("latest"));
    assert_eq!(reset.source, ConfigSource::Default);
    admin
        .incremental_alter_configs(
            &group,
            &[
                ("share.auto.offset.reset", AlterOp::Set("earliest".into())),
                ("share.isolation.level", AlterOp::Delete),
            ],
        )
        .await
        .expect("alter");
    let after = admin.describe_configs(&group, &[]).await.expect("describe");
    let reset = after.get("share.auto.offset.reset").expect("listed");
    assert_eq!(reset.value.as_deref(), Some("earliest"));
    assert_eq!(reset.source, ConfigSource::Group);
    assert_eq!(
        after.get("share.record.lock.duration.ms").unwrap().source,
        ConfigSource::Default,
        "what was not named keeps its value"
    );
    let broker = admin
        .describe_configs(&ConfigResource::Broker(Some(1)), &[])
        .await
        .expect("broker configs");
    assert_eq!(
        broker
            .get("group.share.delivery.count.limit")
            .and_then(|e| e.value.as_deref()),
        Some("7")
    );
}

#[tokio::test]
async fn a_broker_without_the_apis_is_told_apart_from_a_refusal() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let admin = client(&fake).await;
    let err = admin
        .describe_configs(&ConfigResource::Group("g".into()), &[])
        .await
        .expect_err("no DescribeConfigs");
    assert!(err.is_unsupported(), "{err}");
    assert!(!err.is_authorization());
    let text = err.to_string();
    assert!(text.contains("does not support DescribeConfigs"), "{text}");
    // Nothing was sent that the broker does not know (a real broker would close the
    // connection).
    assert!(!fake.lock().unwrap().seen.contains(&32));

    let fake = full_fake();
    fake.lock().unwrap().denied.insert(44);
    let admin = client(&fake).await;
    let err = admin
        .incremental_alter_configs(
            &ConfigResource::Group("connect-a".into()),
            &[("share.auto.offset.reset", AlterOp::Set("earliest".into()))],
        )
        .await
        .expect_err("denied");
    assert!(err.is_authorization(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("ALTER_CONFIGS") && text.contains("group 'connect-a'"),
        "{text}"
    );
}

#[tokio::test]
async fn topics_are_created_once_and_a_refusal_names_the_topic_and_permission() {
    let fake = full_fake();
    let admin = client(&fake).await;
    let topic = NewTopic {
        name: "ledger".into(),
        partitions: 1,
        replication_factor: 1,
        configs: vec![("cleanup.policy".into(), "compact".into())],
    };
    assert_eq!(
        admin.create_topic(&topic).await.expect("created"),
        TopicCreation::Created
    );
    assert_eq!(
        admin.create_topic(&topic).await.expect("exists"),
        TopicCreation::AlreadyExists
    );
    assert_eq!(
        fake.lock().unwrap().created,
        vec![(
            "ledger".to_owned(),
            1,
            1,
            vec![("cleanup.policy".to_owned(), "compact".to_owned())]
        )]
    );
    let err = admin
        .create_topic(&NewTopic {
            name: "dlq".into(),
            partitions: 1,
            replication_factor: 3,
            configs: Vec::new(),
        })
        .await
        .expect_err("one broker");
    assert_eq!(err.code(), Some(codes::INVALID_REPLICATION_FACTOR), "{err}");
    assert!(err.to_string().contains("only 1 broker"), "{err}");

    fake.lock().unwrap().denied.insert(19);
    let err = admin
        .create_topic(&NewTopic {
            name: "dlq".into(),
            partitions: 1,
            replication_factor: 1,
            configs: Vec::new(),
        })
        .await
        .expect_err("denied");
    let text = err.to_string();
    assert!(
        err.is_authorization() && text.contains("CREATE") && text.contains("topic 'dlq'"),
        "{text}"
    );
}

#[tokio::test]
async fn topics_are_listed_with_their_partitions_and_those_in_error_left_out() {
    let fake = full_fake();
    let admin = client(&fake).await;
    assert_eq!(admin.list_topics().await.expect("listed"), BTreeMap::new());
    for (name, partitions) in [("orders", 8), ("__consumer_offsets", 50)] {
        let topic = NewTopic {
            name: name.into(),
            partitions,
            replication_factor: 1,
            configs: Vec::new(),
        };
        admin.create_topic(&topic).await.expect("created");
    }
    fake.lock()
        .unwrap()
        .unavailable_topics
        .insert("being-made".into());
    let listed = admin.list_topics().await.expect("listed");
    assert_eq!(
        listed,
        BTreeMap::from([
            ("__consumer_offsets".to_owned(), 50),
            ("orders".to_owned(), 8)
        ])
    );
}

#[tokio::test]
async fn share_offsets_are_read_set_and_deleted_at_the_coordinator() {
    let fake = full_fake();
    let admin = client(&fake).await;
    let group = "connect-s";
    let none = admin
        .describe_share_offsets(group, &["t".into()])
        .await
        .expect("describe");
    assert!(none.partitions.is_empty());
    admin
        .alter_share_offsets(group, &[("t".into(), 0, 42), ("t".into(), 1, 7)])
        .await
        .expect("alter");
    fake.lock()
        .unwrap()
        .share_offsets
        .insert((group.to_owned(), "other".to_owned(), 0), 1);
    let offsets = admin
        .describe_share_offsets(group, &["t".into()])
        .await
        .expect("describe");
    assert_eq!(
        offsets.partitions,
        vec![
            SharePartitionOffset {
                topic: "t".into(),
                partition: 0,
                start_offset: Some(42)
            },
            SharePartitionOffset {
                topic: "t".into(),
                partition: 1,
                start_offset: Some(7)
            },
        ]
    );
    admin
        .delete_share_offsets(group, &["t".into()])
        .await
        .expect("delete");
    let offsets = admin
        .describe_share_offsets(group, &[])
        .await
        .expect("describe");
    assert_eq!(offsets.partitions.len(), 1, "{offsets:?}");
    fake.lock().unwrap().active_groups.insert(group.to_owned());
    let err = admin
        .alter_share_offsets(group, &[("t".into(), 0, 1)])
        .await
        .expect_err("group has members");
    assert_eq!(err.code(), Some(codes::GROUP_NOT_EMPTY), "{err}");
    assert!(
        fake.lock().unwrap().seen.contains(&10),
        "FindCoordinator was used"
    );
}

#[tokio::test]
async fn one_client_per_cluster_and_security_setting_with_one_connection() {
    let fake = full_fake();
    let addr = fake_broker(Arc::clone(&fake)).await.to_string();
    let clients = AdminClients::default();
    let plain = SecuritySettings::plaintext();
    let a = clients.get(&addr, &plain, T).await.expect("client");
    let b = clients.get(&addr, &plain, T).await.expect("client");
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(clients.made(), 1);
    for _ in 0..3 {
        a.describe_configs(&ConfigResource::Group("g".into()), &[])
            .await
            .expect("describe");
        b.create_topic(&NewTopic {
            name: "x".into(),
            partitions: 1,
            replication_factor: 1,
            configs: Vec::new(),
        })
        .await
        .expect("create");
    }
    assert_eq!(
        fake.lock().unwrap().connections,
        1,
        "every request reuses the one connection"
    );
}

#[tokio::test]
async fn requests_go_where_kafkas_admin_client_sends_them() {
    let fake = full_fake();
    let first = fake_broker(Arc::clone(&fake)).await;
    let second = fake_broker(Arc::clone(&fake)).await;
    {
        let mut state = fake.lock().unwrap();
        state.cluster = vec![(1, first), (2, second)];
        state.coordinator = Some((2, second));
    }
    let admin = AdminClient::connect(
        &first.to_string(),
        "test",
        T,
        crate::security::ClientSecurity::plaintext(),
    )
    .await
    .expect("connects");
    assert_eq!(admin.broker_ids(), [1, 2]);
    let at = |fake: &Shared, key: i16| -> Vec<SocketAddr> {
        fake.lock()
            .unwrap()
            .seen_at
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, a)| *a)
            .collect()
    };
    // Group configs: any broker (the first known). One broker's configs: that broker.
    admin
        .describe_configs(&ConfigResource::Group("g".into()), &[])
        .await
        .expect("group configs");
    admin
        .incremental_alter_configs(
            &ConfigResource::Group("g".into()),
            &[(
                "share.isolation.level",
                AlterOp::Set("read_committed".into()),
            )],
        )
        .await
        .expect("alter");
    assert_eq!(at(&fake, 44), [first]);
    admin
        .describe_configs(&ConfigResource::Broker(Some(2)), &[])
        .await
        .expect("broker configs");
    assert_eq!(at(&fake, 32), [first, second]);
    // Share-group offsets: the group's coordinator, found with FindCoordinator.
    admin
        .alter_share_offsets("g", &[("t".into(), 0, 3)])
        .await
        .expect("alter offsets");
    admin
        .describe_share_offsets("g", &[])
        .await
        .expect("describe offsets");
    admin
        .delete_share_offsets("g", &["t".into()])
        .await
        .expect("delete offsets");
    for key in [90, 91, 92] {
        assert_eq!(at(&fake, key), [second], "api key {key}");
    }
    assert_eq!(at(&fake, 10).len(), 3, "one FindCoordinator per call");
}

#[tokio::test]
async fn a_topic_grows_to_more_partitions_and_a_shrink_is_refused_naming_the_topic() {
    let fake = full_fake();
    let admin = client(&fake).await;
    let topic = NewTopic {
        name: "A.orders".into(),
        partitions: 2,
        replication_factor: 1,
        configs: Vec::new(),
    };
    admin.create_topic(&topic).await.expect("created");
    admin.create_partitions("A.orders", 5).await.expect("grown");
    assert_eq!(fake.lock().unwrap().partitions["A.orders"], 5);
    let err = admin
        .create_partitions("A.orders", 3)
        .await
        .expect_err("cannot shrink");
    let text = err.to_string();
    assert!(
        text.contains("topic 'A.orders'") && text.contains("higher"),
        "{text}"
    );
    assert_eq!(fake.lock().unwrap().partitions["A.orders"], 5);
}
