//! Response rewriting: broker endpoints point at the proxy's listeners, SASL listeners
//! advertise the SASL APIs, per-partition faults, and the Kafka 4.2 coordinator's heartbeat
//! assignment rule. Responses nothing applies to pass through byte for byte.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiVersionsResponse, DescribeClusterResponse, FetchResponse, FindCoordinatorResponse,
    ListOffsetsResponse, MetadataResponse, ProduceResponse, ShareAcknowledgeResponse,
    ShareFetchResponse, ShareGroupHeartbeatResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use uuid::Uuid;

use super::faults::{self, ProxyFaults};
use super::frame::{decode_response, encode_response, RequestMeta};
use super::partition_growth::{HiddenProduce, PartitionGrowth};

/// API keys the proxy looks into.
pub(crate) const PRODUCE: i16 = 0;
pub(crate) const FETCH: i16 = 1;
pub(crate) const LIST_OFFSETS: i16 = 2;
pub(crate) const METADATA: i16 = 3;
pub(crate) const FIND_COORDINATOR: i16 = 10;
pub(crate) const SASL_HANDSHAKE: i16 = 17;
pub(crate) const API_VERSIONS: i16 = 18;
pub(crate) const SASL_AUTHENTICATE: i16 = 36;
pub(crate) const DESCRIBE_CLUSTER: i16 = 60;
pub(crate) const SHARE_GROUP_HEARTBEAT: i16 = 76;
pub(crate) const SHARE_FETCH: i16 = 78;
pub(crate) const SHARE_ACKNOWLEDGE: i16 = 79;

/// What a ShareGroupHeartbeat request said, for the Kafka 4.2 assignment rule.
#[derive(Clone, Debug)]
pub(crate) struct HeartbeatSeen {
    pub member_id: String,
    pub member_epoch: i32,
    /// Carried SubscribedTopicNames (a "full" request).
    pub full: bool,
}

/// A request whose response is awaited from the broker.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    pub meta: RequestMeta,
    pub heartbeat: Option<HeartbeatSeen>,
    /// A share request followed by `with_kafka_share_sessions`.
    pub share: Option<super::share_sessions::ShareSeen>,
    /// Partitions of a Produce request kept from the dev broker (`partition_growth`).
    pub hidden_produce: Option<HiddenProduce>,
}

type Assignment = BTreeSet<(Uuid, i32)>;

/// Everything response rewriting reads and remembers, shared by all connections.
pub(crate) struct Rewriter {
    /// Broker id -> the proxy listener clients must use for it.
    pub endpoints: HashMap<i32, (String, u16)>,
    pub sasl: bool,
    pub kafka42: bool,
    /// Name a real broker as the controller (the mock names node 0, which does not exist, so
    /// clients cannot send controller requests such as CreateTopics); set with the admin
    /// emulation, which answers them.
    pub name_controller: bool,
    pub faults: ProxyFaults,
    /// Visible partition counts (`with_partition_growth`): Metadata, Fetch and ListOffsets
    /// answers show only those partitions.
    pub growth: Option<Arc<PartitionGrowth>>,
    /// Topic ids seen in Metadata answers, to match faults given by topic name.
    topic_names: Mutex<HashMap<Uuid, String>>,
    /// Kafka 4.2 mode: the assignment last sent to each share member.
    sent_assignments: Mutex<HashMap<String, Assignment>>,
}

impl Rewriter {
    pub(crate) fn new(
        endpoints: HashMap<i32, (String, u16)>,
        sasl: bool,
        kafka42: bool,
        faults: ProxyFaults,
    ) -> Rewriter {
        Rewriter {
            endpoints,
            sasl,
            kafka42,
            name_controller: false,
            faults,
            growth: None,
            topic_names: Mutex::new(HashMap::new()),
            sent_assignments: Mutex::new(HashMap::new()),
        }
    }

    fn endpoint(&self, node: i32) -> Option<(StrBytes, i32)> {
        self.endpoints
            .get(&node)
            .map(|(host, port)| (StrBytes::from_string(host.clone()), i32::from(*port)))
    }

    pub(crate) fn topic_name(&self, id: &Uuid) -> Option<String> {
        self.topic_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Rewrites one response frame (without length prefix) as needed.
    pub(crate) fn response(&self, flight: &InFlight, frame: Bytes) -> Result<Bytes, String> {
        let version = flight.meta.version;
        match flight.meta.api_key {
            METADATA => edit::<MetadataResponse>(frame, version, |r| {
                let mut names = self.topic_names.lock().unwrap_or_else(|p| p.into_inner());
                for topic in &r.topics {
                    if let Some(name) = &topic.name {
                        if !topic.topic_id.is_nil() {
                            names.insert(topic.topic_id, name.to_string());
                        }
                    }
                }
                drop(names);
                let mut changed = self.growth.as_ref().is_some_and(|g| g.metadata(r));
                for broker in &mut r.brokers {
                    changed |= self.set(broker.node_id.0, &mut broker.host, &mut broker.port);
                }
                changed | self.controller(&mut r.controller_id.0)
            }),
            FIND_COORDINATOR => edit::<FindCoordinatorResponse>(frame, version, |r| {
                if version < 4 {
                    self.set(r.node_id.0, &mut r.host, &mut r.port)
                } else {
                    let mut changed = false;
                    for c in &mut r.coordinators {
                        changed |= self.set(c.node_id.0, &mut c.host, &mut c.port);
                    }
                    changed
                }
            }),
            DESCRIBE_CLUSTER => edit::<DescribeClusterResponse>(frame, version, |r| {
                let mut changed = false;
                for b in &mut r.brokers {
                    changed |= self.set(b.broker_id.0, &mut b.host, &mut b.port);
                }
                changed | self.controller(&mut r.controller_id.0)
            }),
            SHARE_FETCH => edit::<ShareFetchResponse>(frame, version, |r| {
                let mut changed = false;
                for e in &mut r.node_endpoints {
                    changed |= self.set(e.node_id.0, &mut e.host, &mut e.port);
                }
                if self.faults.has_partition_faults(SHARE_FETCH) {
                    changed |= faults::share_fetch_partition_faults(&self.faults, r, &|id| {
                        self.topic_name(id)
                    });
                }
                changed
            }),
            SHARE_ACKNOWLEDGE => edit::<ShareAcknowledgeResponse>(frame, version, |r| {
                let mut changed = false;
                for e in &mut r.node_endpoints {
                    changed |= self.set(e.node_id.0, &mut e.host, &mut e.port);
                }
                if self.faults.has_partition_faults(SHARE_ACKNOWLEDGE) {
                    changed |= faults::share_ack_partition_faults(&self.faults, r, &|id| {
                        self.topic_name(id)
                    });
                }
                changed
            }),
            // Produce v10+ and Fetch v16+ name new leaders' endpoints (KIP-951).
            PRODUCE
                if version >= 10
                    || self.faults.has_partition_faults(PRODUCE)
                    || flight.hidden_produce.is_some() =>
            {
                edit::<ProduceResponse>(frame, version, |r| {
                    let mut changed = flight
                        .hidden_produce
                        .as_ref()
                        .is_some_and(|h| PartitionGrowth::produce_response(h, r));
                    for e in &mut r.node_endpoints {
                        changed |= self.set(e.node_id.0, &mut e.host, &mut e.port);
                    }
                    changed | faults::produce_partition_faults(&self.faults, r)
                })
            }
            FETCH
                if version >= 16
                    || self.faults.has_partition_faults(FETCH)
                    || self.growth.is_some() =>
            {
                edit::<FetchResponse>(frame, version, |r| {
                    let mut changed = self
                        .growth
                        .as_ref()
                        .is_some_and(|g| g.fetch_response(r, &|id| self.topic_name(id)));
                    for e in &mut r.node_endpoints {
                        changed |= self.set(e.node_id.0, &mut e.host, &mut e.port);
                    }
                    changed
                        | faults::fetch_partition_faults(&self.faults, r, &|id| self.topic_name(id))
                })
            }
            LIST_OFFSETS if self.growth.is_some() => {
                edit::<ListOffsetsResponse>(frame, version, |r| {
                    self.growth
                        .as_ref()
                        .is_some_and(|g| g.list_offsets_response(r))
                })
            }
            API_VERSIONS if self.sasl => {
                // An error answer (e.g. UNSUPPORTED_VERSION) may be shaped for v0: pass it on.
                if frame.len() >= 6 && frame[4..6] != [0, 0] {
                    return Ok(frame);
                }
                edit::<ApiVersionsResponse>(frame, version, advertise_sasl)
            }
            SHARE_GROUP_HEARTBEAT if self.kafka42 => {
                edit::<ShareGroupHeartbeatResponse>(frame, version, |r| {
                    self.kafka42_assignment(flight.heartbeat.as_ref(), r)
                })
            }
            _ => Ok(frame),
        }
    }

    /// With `name_controller`, replaces a controller id that names no broker by the lowest
    /// broker id, as a Kafka cluster always names a live broker.
    fn controller(&self, id: &mut i32) -> bool {
        if !self.name_controller || self.endpoints.contains_key(id) {
            return false;
        }
        match self.endpoints.keys().min() {
            Some(lowest) => {
                *id = *lowest;
                true
            }
            None => false,
        }
    }

    /// Points a broker endpoint at the proxy; false when the broker is unknown to the proxy.
    fn set(&self, node: i32, host: &mut StrBytes, port: &mut i32) -> bool {
        match self.endpoint(node) {
            Some((h, p)) => {
                *host = h;
                *port = p;
                true
            }
            None => false,
        }
    }

    /// Kafka 4.2's coordinator sends the assignment only when the member epoch is 0, the request
    /// is full (carries SubscribedTopicNames) or the assignment differs from the one last sent
    /// (GroupMetadataManager, share heartbeat path); the dev broker sends it every time.
    fn kafka42_assignment(
        &self,
        seen: Option<&HeartbeatSeen>,
        r: &mut ShareGroupHeartbeatResponse,
    ) -> bool {
        let Some(seen) = seen else {
            return false;
        };
        let mut sent = self
            .sent_assignments
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let member = r
            .member_id
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_else(|| seen.member_id.clone());
        if r.error_code != 0 || seen.member_epoch == -1 {
            sent.remove(&member);
            return false;
        }
        let Some(assignment) = &r.assignment else {
            return false;
        };
        let now: Assignment = assignment
            .topic_partitions
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
            .collect();
        let send = seen.member_epoch == 0 || seen.full || sent.get(&member) != Some(&now);
        sent.insert(member, now);
        if send {
            false
        } else {
            r.assignment = None;
            true
        }
    }
}

/// Makes sure SaslHandshake v0-1 and SaslAuthenticate v0-2 are advertised.
pub(crate) fn advertise_sasl(r: &mut ApiVersionsResponse) -> bool {
    let wanted = BTreeMap::from([(SASL_HANDSHAKE, (0i16, 1i16)), (SASL_AUTHENTICATE, (0, 2))]);
    let mut changed = false;
    for (key, (min, max)) in wanted {
        match r.api_keys.iter_mut().find(|k| k.api_key == key) {
            Some(k) if (k.min_version, k.max_version) == (min, max) => {}
            Some(k) => {
                k.min_version = min;
                k.max_version = max;
                changed = true;
            }
            None => {
                let mut k = ApiVersion::default();
                k.api_key = key;
                k.min_version = min;
                k.max_version = max;
                r.api_keys.push(k);
                changed = true;
            }
        }
    }
    changed
}

/// Decodes a response as `T`, lets `change` edit it, and re-encodes only when it did.
fn edit<T: Decodable + Encodable + HeaderVersion>(
    frame: Bytes,
    version: i16,
    change: impl FnOnce(&mut T) -> bool,
) -> Result<Bytes, String> {
    let (header, mut body) = decode_response::<T>(&frame, version)?;
    if change(&mut body) {
        encode_response(&header, &body, version)
    } else {
        Ok(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
    use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
    use kafka_protocol::messages::BrokerId;

    use crate::kafka_proxy::frame::response_header;

    fn rewriter(kafka42: bool) -> Rewriter {
        Rewriter::new(
            HashMap::from([(1, ("127.0.0.1".to_string(), 40001))]),
            false,
            kafka42,
            ProxyFaults::default(),
        )
    }

    fn flight(api_key: i16, version: i16, heartbeat: Option<HeartbeatSeen>) -> InFlight {
        InFlight {
            meta: RequestMeta {
                api_key,
                version,
                correlation_id: 5,
            },
            heartbeat,
            share: None,
            hidden_produce: None,
        }
    }

    #[test]
    fn metadata_brokers_are_rewritten_in_flexible_and_older_versions() {
        for version in [4i16, 9, 12] {
            let mut r = MetadataResponse::default();
            for (node, port) in [(1, 9092), (2, 9093)] {
                let mut b = MetadataResponseBroker::default();
                b.node_id = BrokerId(node);
                b.host = StrBytes::from_static_str("10.0.0.9");
                b.port = port;
                r.brokers.push(b);
            }
            let frame = encode_response(&response_header(5), &r, version).unwrap();
            let out = rewriter(false)
                .response(&flight(METADATA, version, None), frame)
                .unwrap();
            let (header, r) = decode_response::<MetadataResponse>(&out, version).unwrap();
            assert_eq!(header.correlation_id, 5);
            assert_eq!(
                (r.brokers[0].host.as_str(), r.brokers[0].port),
                ("127.0.0.1", 40001)
            );
            // A broker the proxy has no listener for is left alone.
            assert_eq!(r.brokers[1].port, 9093);
        }
    }

    #[test]
    fn share_fetch_partition_faults_find_topics_by_the_ids_metadata_named() {
        use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
        use kafka_protocol::messages::share_fetch_response::{
            PartitionData, ShareFetchableTopicResponse,
        };
        use kafka_protocol::messages::TopicName;
        let rw = rewriter(false);
        let id = Uuid::from_u128(42);
        let mut metadata = MetadataResponse::default();
        let mut topic = MetadataResponseTopic::default();
        topic.name = Some(TopicName(StrBytes::from_static_str("orders")));
        topic.topic_id = id;
        metadata.topics.push(topic);
        let frame = encode_response(&response_header(1), &metadata, 12).unwrap();
        rw.response(&flight(METADATA, 12, None), frame).unwrap();

        rw.faults
            .inject_partition_error(SHARE_FETCH, "orders", 1, 15, 1)
            .unwrap();
        let mut fetch = ShareFetchResponse::default();
        let mut topic = ShareFetchableTopicResponse::default();
        topic.topic_id = id;
        for p in 0..2 {
            let mut part = PartitionData::default();
            part.partition_index = p;
            part.records = Some(Bytes::from_static(b"records"));
            topic.partitions.push(part);
        }
        fetch.responses.push(topic);
        let frame = encode_response(&response_header(2), &fetch, 1).unwrap();
        let answer = |frame| {
            let out = rw.response(&flight(SHARE_FETCH, 1, None), frame).unwrap();
            decode_response::<ShareFetchResponse>(&out, 1).unwrap().1
        };
        let first = answer(frame.clone());
        let parts = &first.responses[0].partitions;
        assert_eq!((parts[0].error_code, parts[1].error_code), (0, 15));
        assert!(parts[0].records.is_some() && parts[1].records.is_none());
        let second = answer(frame);
        assert_eq!(
            second.responses[0].partitions[1].error_code, 0,
            "one response only"
        );
    }

    fn heartbeat(partitions: &[i32]) -> Bytes {
        let mut r = ShareGroupHeartbeatResponse::default();
        r.member_id = Some(StrBytes::from_static_str("m1"));
        r.member_epoch = 3;
        let mut tp = TopicPartitions::default();
        tp.topic_id = Uuid::from_u128(7);
        tp.partitions = partitions.to_vec();
        let mut a = Assignment::default();
        a.topic_partitions.push(tp);
        r.assignment = Some(a);
        encode_response(&response_header(5), &r, 1).unwrap()
    }

    fn assignment_after(rw: &Rewriter, epoch: i32, full: bool, partitions: &[i32]) -> bool {
        let seen = HeartbeatSeen {
            member_id: "m1".into(),
            member_epoch: epoch,
            full,
        };
        let out = rw
            .response(
                &flight(SHARE_GROUP_HEARTBEAT, 1, Some(seen)),
                heartbeat(partitions),
            )
            .unwrap();
        decode_response::<ShareGroupHeartbeatResponse>(&out, 1)
            .unwrap()
            .1
            .assignment
            .is_some()
    }

    #[test]
    fn kafka42_mode_sends_the_assignment_only_when_kafka_would() {
        let rw = rewriter(true);
        assert!(assignment_after(&rw, 0, true, &[0, 1]), "epoch 0");
        assert!(
            !assignment_after(&rw, 3, false, &[0, 1]),
            "unchanged, not full"
        );
        assert!(assignment_after(&rw, 3, true, &[0, 1]), "a full request");
        assert!(assignment_after(&rw, 3, false, &[1]), "changed");
        assert!(!assignment_after(&rw, 4, false, &[1]), "unchanged again");
        // Without the mode the dev broker's every-time repeat passes through.
        let plain = rewriter(false);
        assert!(assignment_after(&plain, 3, false, &[0, 1]));
        assert!(assignment_after(&plain, 3, false, &[0, 1]));
    }
}
