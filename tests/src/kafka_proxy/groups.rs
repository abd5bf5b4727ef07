//! One namespace for group ids, as Kafka has (`with_one_group_namespace()`). The dev broker
//! keeps classic, consumer and share groups apart, so a share group and a consumer group of the
//! same id both work there, while on Kafka 4.2 the second one is refused. The proxy learns each
//! group's type from the requests it forwards and refuses a member of another type with
//! exactly Kafka 4.2's answer (`GroupMetadataManager`):
//! - JoinGroup for an id a share group holds: INCONSISTENT_GROUP_PROTOCOL, member id "";
//! - ConsumerGroupHeartbeat for an id a share group holds: GROUP_ID_NOT_FOUND, "Group <id> is
//!   not a consumer group.";
//! - ShareGroupHeartbeat for an id a classic or consumer group holds: GROUP_ID_NOT_FOUND,
//!   "Group <id> is not a share group.".
//!
//! It answers ListGroups (v0-5, state and type filters) and DescribeGroups (v0-6) from what it
//! learned, through the proxy's local dispatch (`local.rs`), which also lists them in
//! ApiVersions. Coarser than Kafka: every broker lists
//! every group (Kafka lists a group on its coordinator only); a classic or consumer group stays
//! while it has members or committed offsets (Kafka also drops it when its offsets expire); a
//! share group stays until [`GroupNamespace::delete_group`] (Kafka's DeleteGroups, which the
//! dev broker lacks); states are only Empty or Stable; members expire after their session
//! timeout without a heartbeat.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, GroupId, HeartbeatRequest, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;

use super::frame::{decode_request, encode_response, response_header, RequestMeta};
use super::local::{LocalAnswer, LocalApi};

const OFFSET_COMMIT: i16 = 8;
const JOIN_GROUP: i16 = 11;
const HEARTBEAT: i16 = 12;
const LEAVE_GROUP: i16 = 13;
const SYNC_GROUP: i16 = 14;
const DESCRIBE_GROUPS: i16 = 15;
const LIST_GROUPS: i16 = 16;
const CONSUMER_GROUP_HEARTBEAT: i16 = 68;
const SHARE_GROUP_HEARTBEAT: i16 = 76;

const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
const GROUP_ID_NOT_FOUND: i16 = 69;
const NON_EMPTY_GROUP: i16 = 68;

/// The APIs this emulation answers itself, with the versions it speaks (Kafka 4.2's ranges).
const ANSWERED: [(i16, i16, i16); 2] = [(LIST_GROUPS, 0, 5), (DESCRIBE_GROUPS, 0, 6)];

/// Session timeouts of members whose request does not carry one: Kafka's defaults
/// (`group.consumer.session.timeout.ms`, `group.share.session.timeout.ms`).
const MODERN_SESSION_TIMEOUT: Duration = Duration::from_secs(45);

/// A group's type, as ListGroups v5 names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupType {
    Classic,
    Consumer,
    Share,
}

impl GroupType {
    pub fn name(self) -> &'static str {
        match self {
            GroupType::Classic => "classic",
            GroupType::Consumer => "consumer",
            GroupType::Share => "share",
        }
    }
}

#[derive(Debug)]
struct Group {
    group_type: GroupType,
    /// JoinGroup's protocol type (`consumer` for consumer clients).
    protocol_type: String,
    /// Member id → when it expires without another request.
    members: HashMap<String, Instant>,
    /// Whether it committed offsets (a classic or consumer group then outlives its members).
    has_offsets: bool,
    /// How long a member stays without a request (JoinGroup's session timeout).
    session: Duration,
    /// The last request about the group: a group being joined (no member id known yet) is
    /// kept for a session after it.
    touched: Instant,
}

impl Group {
    fn new(group_type: GroupType, protocol_type: &str) -> Group {
        Group {
            group_type,
            protocol_type: protocol_type.to_owned(),
            members: HashMap::new(),
            has_offsets: false,
            session: MODERN_SESSION_TIMEOUT,
            touched: Instant::now(),
        }
    }

    fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else {
            "Stable"
        }
    }
}

/// The registry of group ids and their types; shared by every connection of one proxy.
#[derive(Debug, Default)]
pub struct GroupNamespace {
    groups: Mutex<BTreeMap<String, Group>>,
}

impl GroupNamespace {
    fn groups(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Group>> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        groups.retain(|_, g| {
            g.members.retain(|_, expires| *expires > now);
            // Kafka drops an empty classic or consumer group that keeps no offsets; a share
            // group stays until deleted.
            g.group_type == GroupType::Share
                || !g.members.is_empty()
                || g.has_offsets
                || g.touched + g.session > now
        });
        groups
    }

    /// The type of the group holding `id`, if one does.
    pub fn group_type(&self, id: &str) -> Option<GroupType> {
        self.groups().get(id).map(|g| g.group_type)
    }

    /// Members of the group holding `id` (0 when none does).
    pub fn members(&self, id: &str) -> usize {
        self.groups().get(id).map_or(0, |g| g.members.len())
    }

    /// Deletes a group, as Kafka's DeleteGroups does (`kafka-share-groups.sh --delete`): only an
    /// empty one. Committed offsets the dev broker holds for a classic group stay there.
    pub fn delete_group(&self, id: &str) -> Result<(), String> {
        let mut groups = self.groups();
        match groups.get(id) {
            None => Err(format!("GROUP_ID_NOT_FOUND: no group '{id}'")),
            Some(g) if !g.members.is_empty() => Err(format!(
                "NON_EMPTY_GROUP ({NON_EMPTY_GROUP}): group '{id}' has {} member(s)",
                g.members.len()
            )),
            Some(_) => {
                groups.remove(id);
                Ok(())
            }
        }
    }

    /// Learns from a request the proxy is about to forward, or answers it: `Some(frame)` is the
    /// answer to send instead of forwarding.
    pub(crate) fn on_request(
        &self,
        meta: RequestMeta,
        frame: &Bytes,
    ) -> Result<Option<Bytes>, String> {
        let header = response_header(meta.correlation_id);
        let v = meta.version;
        match meta.api_key {
            JOIN_GROUP => {
                let (_, r) = decode_request::<JoinGroupRequest>(frame, v)?;
                let id = r.group_id.0.to_string();
                let mut groups = self.groups();
                let group = groups
                    .entry(id)
                    .or_insert_with(|| Group::new(GroupType::Classic, r.protocol_type.as_str()));
                match group.group_type {
                    GroupType::Share => {
                        let mut answer = JoinGroupResponse::default();
                        answer.error_code = INCONSISTENT_GROUP_PROTOCOL;
                        answer.generation_id = -1;
                        answer.member_id = StrBytes::default();
                        return encode_response(&header, &answer, v).map(Some);
                    }
                    // Kafka turns an empty consumer group into a classic one on a classic join.
                    GroupType::Consumer if group.members.is_empty() => {
                        group.group_type = GroupType::Classic;
                    }
                    _ => {}
                }
                group.protocol_type = r.protocol_type.to_string();
                group.touched = Instant::now();
                group.session = Duration::from_millis(r.session_timeout_ms.max(1_000) as u64);
                if !r.member_id.is_empty() {
                    let expires = Instant::now() + group.session;
                    group.members.insert(r.member_id.to_string(), expires);
                }
            }
            HEARTBEAT => {
                let (_, r) = decode_request::<HeartbeatRequest>(frame, v)?;
                self.refresh(&r.group_id, r.member_id.as_str());
            }
            SYNC_GROUP => {
                let (_, r) = decode_request::<SyncGroupRequest>(frame, v)?;
                self.refresh(&r.group_id, r.member_id.as_str());
            }
            LEAVE_GROUP => {
                let (_, r) = decode_request::<LeaveGroupRequest>(frame, v)?;
                let mut groups = self.groups();
                if let Some(group) = groups.get_mut(r.group_id.0.as_str()) {
                    group.members.remove(r.member_id.as_str());
                    for m in &r.members {
                        group.members.remove(m.member_id.as_str());
                    }
                }
            }
            OFFSET_COMMIT => {
                let (_, r) = decode_request::<OffsetCommitRequest>(frame, v)?;
                let mut groups = self.groups();
                let group = groups
                    .entry(r.group_id.0.to_string())
                    .or_insert_with(|| Group::new(GroupType::Classic, ""));
                if group.group_type != GroupType::Share {
                    group.has_offsets = true;
                }
            }
            CONSUMER_GROUP_HEARTBEAT => {
                let (_, r) = decode_request::<ConsumerGroupHeartbeatRequest>(frame, v)?;
                let id = r.group_id.0.to_string();
                let mut groups = self.groups();
                let group = groups
                    .entry(id.clone())
                    .or_insert_with(|| Group::new(GroupType::Consumer, "consumer"));
                match group.group_type {
                    GroupType::Share => {
                        let mut answer = ConsumerGroupHeartbeatResponse::default();
                        answer.error_code = GROUP_ID_NOT_FOUND;
                        answer.error_message = Some(StrBytes::from_string(format!(
                            "Group {id} is not a consumer group."
                        )));
                        return encode_response(&header, &answer, v).map(Some);
                    }
                    // An empty classic group becomes a consumer group (offsets kept); a busy
                    // one is upgraded member by member, still one consumer group.
                    GroupType::Classic => group.group_type = GroupType::Consumer,
                    GroupType::Consumer => {}
                }
                modern_member(group, r.member_id.as_str(), r.member_epoch);
            }
            SHARE_GROUP_HEARTBEAT => {
                let (_, r) = decode_request::<ShareGroupHeartbeatRequest>(frame, v)?;
                let id = r.group_id.0.to_string();
                let mut groups = self.groups();
                let group = groups
                    .entry(id.clone())
                    .or_insert_with(|| Group::new(GroupType::Share, "share"));
                if group.group_type != GroupType::Share {
                    let mut answer = ShareGroupHeartbeatResponse::default();
                    answer.error_code = GROUP_ID_NOT_FOUND;
                    answer.error_message = Some(StrBytes::from_string(format!(
                        "Group {id} is not a share group."
                    )));
                    return encode_response(&header, &answer, v).map(Some);
                }
                modern_member(group, r.member_id.as_str(), r.member_epoch);
            }
            _ => {}
        }
        Ok(None)
    }

    /// ListGroups and DescribeGroups, answered from the registry.
    fn listing(&self, meta: RequestMeta, frame: &Bytes) -> Result<Bytes, String> {
        let header = response_header(meta.correlation_id);
        let v = meta.version;
        match meta.api_key {
            LIST_GROUPS => {
                let (_, r) = decode_request::<ListGroupsRequest>(frame, v)?;
                let states: Vec<String> = r
                    .states_filter
                    .iter()
                    .map(|s| s.to_ascii_lowercase())
                    .collect();
                let types: Vec<String> = r
                    .types_filter
                    .iter()
                    .map(|s| s.to_ascii_lowercase())
                    .collect();
                let mut answer = ListGroupsResponse::default();
                for (id, g) in self.groups().iter() {
                    let state_ok =
                        states.is_empty() || states.contains(&g.state().to_ascii_lowercase());
                    let type_ok =
                        types.is_empty() || types.iter().any(|t| t == g.group_type.name());
                    if !(state_ok && type_ok) {
                        continue;
                    }
                    let mut listed = ListedGroup::default();
                    listed.group_id = GroupId(StrBytes::from_string(id.clone()));
                    listed.protocol_type = StrBytes::from_string(g.protocol_type.clone());
                    listed.group_state = StrBytes::from_static_str(g.state());
                    listed.group_type = StrBytes::from_static_str(g.group_type.name());
                    answer.groups.push(listed);
                }
                encode_response(&header, &answer, v)
            }
            DESCRIBE_GROUPS => {
                let (_, r) = decode_request::<DescribeGroupsRequest>(frame, v)?;
                let groups = self.groups();
                let mut answer = DescribeGroupsResponse::default();
                for id in &r.groups {
                    let mut described = DescribedGroup::default();
                    described.group_id = id.clone();
                    match groups.get(id.0.as_str()) {
                        Some(g) if g.group_type == GroupType::Classic => {
                            described.group_state = StrBytes::from_static_str(g.state());
                            described.protocol_type =
                                StrBytes::from_string(g.protocol_type.clone());
                            described.members = g
                                .members
                                .keys()
                                .map(|m| {
                                    let mut member = DescribedGroupMember::default();
                                    member.member_id = StrBytes::from_string(m.clone());
                                    member
                                })
                                .collect();
                        }
                        // Kafka: GROUP_ID_NOT_FOUND with its message from v6, state Dead.
                        other => {
                            described.group_state = StrBytes::from_static_str("Dead");
                            if v >= 6 {
                                described.error_code = GROUP_ID_NOT_FOUND;
                                described.error_message =
                                    Some(StrBytes::from_string(match other {
                                        Some(_) => format!(
                                            "Group {} is not a classic group.",
                                            id.0.as_str()
                                        ),
                                        None => format!("Group {} not found.", id.0.as_str()),
                                    }));
                            }
                        }
                    }
                    answer.groups.push(described);
                }
                encode_response(&header, &answer, v)
            }
            other => Err(format!(
                "api_key={other} is not answered by the group namespace"
            )),
        }
    }

    /// A classic member's SyncGroup or Heartbeat: it is alive for another session. (A broker
    /// may hand out the member id in its JoinGroup answer, so this may be the first time the
    /// proxy sees it.)
    fn refresh(&self, group: &GroupId, member: &str) {
        if member.is_empty() {
            return;
        }
        let mut groups = self.groups();
        if let Some(g) = groups.get_mut(group.0.as_str()) {
            if g.group_type == GroupType::Classic {
                let expires = Instant::now() + g.session;
                g.members.insert(member.to_owned(), expires);
            }
        }
    }
}

impl LocalApi for GroupNamespace {
    fn versions(&self) -> Vec<(i16, i16, i16)> {
        ANSWERED.to_vec()
    }

    fn answer(&self, meta: RequestMeta, frame: Bytes, _node: i32) -> LocalAnswer {
        let answer = self.listing(meta, &frame);
        Box::pin(async move { answer })
    }
}

/// A KIP-848 or share member's heartbeat: epoch -1 leaves, anything else keeps it for a session.
fn modern_member(group: &mut Group, member: &str, epoch: i32) {
    if member.is_empty() {
        return;
    }
    if epoch == -1 {
        group.members.remove(member);
    } else {
        group
            .members
            .insert(member.to_owned(), Instant::now() + MODERN_SESSION_TIMEOUT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};

    use super::super::frame::{decode_response, encode_request};

    fn frame<T: Encodable + HeaderVersion>(
        key: i16,
        version: i16,
        body: &T,
    ) -> (RequestMeta, Bytes) {
        let mut header = RequestHeader::default();
        header.request_api_key = key;
        header.request_api_version = version;
        header.correlation_id = 9;
        let bytes = encode_request(&header, body, version).expect("encodes");
        (
            RequestMeta {
                api_key: key,
                version,
                correlation_id: 9,
            },
            bytes,
        )
    }

    fn share_heartbeat(group: &str, member: &str, epoch: i32) -> (RequestMeta, Bytes) {
        let mut r = ShareGroupHeartbeatRequest::default();
        r.group_id = GroupId(StrBytes::from_string(group.into()));
        r.member_id = StrBytes::from_string(member.into());
        r.member_epoch = epoch;
        frame(SHARE_GROUP_HEARTBEAT, 1, &r)
    }

    fn join(group: &str, member: &str) -> (RequestMeta, Bytes) {
        let mut r = JoinGroupRequest::default();
        r.group_id = GroupId(StrBytes::from_string(group.into()));
        r.member_id = StrBytes::from_string(member.into());
        r.session_timeout_ms = 10_000;
        r.protocol_type = StrBytes::from_static_str("consumer");
        frame(JOIN_GROUP, 6, &r)
    }

    fn body<T: Decodable + HeaderVersion>(answer: Bytes, version: i16) -> T {
        decode_response::<T>(&answer, version).expect("decodes").1
    }

    #[test]
    fn a_classic_join_for_a_share_groups_id_gets_inconsistent_group_protocol_even_when_empty() {
        let ns = GroupNamespace::default();
        let (meta, f) = share_heartbeat("g", "m1", 0);
        assert!(ns.on_request(meta, &f).unwrap().is_none(), "forwarded");
        let (meta, f) = share_heartbeat("g", "m1", -1);
        assert!(ns.on_request(meta, &f).unwrap().is_none());
        assert_eq!(ns.members("g"), 0);
        let (meta, f) = join("g", "");
        let answer = ns
            .on_request(meta, &f)
            .unwrap()
            .expect("answered by the proxy");
        let r: JoinGroupResponse = body(answer, 6);
        assert_eq!(r.error_code, INCONSISTENT_GROUP_PROTOCOL);
        assert_eq!(r.member_id.as_str(), "");
        ns.delete_group("g").expect("empty share group deleted");
        let (meta, f) = join("g", "");
        assert!(ns.on_request(meta, &f).unwrap().is_none(), "free again");
    }

    #[test]
    fn a_share_heartbeat_for_a_consumer_groups_id_gets_kafkas_message() {
        let ns = GroupNamespace::default();
        let (meta, f) = join("c", "member-1");
        assert!(ns.on_request(meta, &f).unwrap().is_none());
        let (meta, f) = share_heartbeat("c", "m", 0);
        let r: ShareGroupHeartbeatResponse =
            body(ns.on_request(meta, &f).unwrap().expect("answered"), 1);
        assert_eq!(r.error_code, GROUP_ID_NOT_FOUND);
        assert_eq!(
            r.error_message.as_deref(),
            Some("Group c is not a share group.")
        );
        assert!(
            ns.delete_group("c").is_err(),
            "a group with members is not deleted"
        );
    }

    #[test]
    fn list_groups_filters_by_type_and_describe_groups_answers_dead_for_other_types() {
        let ns = GroupNamespace::default();
        let (meta, f) = share_heartbeat("s", "m", 0);
        ns.on_request(meta, &f).unwrap();
        let (meta, f) = join("c", "member-1");
        ns.on_request(meta, &f).unwrap();
        let mut list = ListGroupsRequest::default();
        list.types_filter = vec![StrBytes::from_static_str("share")];
        let (meta, f) = frame(LIST_GROUPS, 5, &list);
        let r: ListGroupsResponse = body(ns.listing(meta, &f).expect("answered"), 5);
        let listed: Vec<_> = r
            .groups
            .iter()
            .map(|g| {
                (
                    g.group_id.0.to_string(),
                    g.group_type.to_string(),
                    g.group_state.to_string(),
                )
            })
            .collect();
        assert_eq!(listed, vec![("s".into(), "share".into(), "Stable".into())]);
        let mut describe = DescribeGroupsRequest::default();
        describe.groups = vec![
            GroupId(StrBytes::from_static_str("c")),
            GroupId(StrBytes::from_static_str("s")),
        ];
        let (meta, f) = frame(DESCRIBE_GROUPS, 6, &describe);
        let r: DescribeGroupsResponse = body(ns.listing(meta, &f).expect("answered"), 6);
        assert_eq!(r.groups[0].members.len(), 1);
        assert_eq!(r.groups[1].group_state.as_str(), "Dead");
        assert_eq!(r.groups[1].error_code, GROUP_ID_NOT_FOUND);
        assert_eq!(
            r.groups[1].error_message.as_deref(),
            Some("Group s is not a classic group.")
        );
    }
}
