//! Group ids under Kafka's one namespace: classic, consumer (KIP-848), share and streams groups
//! all draw their ids from the same set, and a group of one type refuses members of another.
//! Kafka 4.2's coordinator (`GroupMetadataManager`):
//! - a ShareGroupHeartbeat for an id held by a classic or consumer group — even an empty one
//!   that only keeps committed offsets — gets GROUP_ID_NOT_FOUND, "Group <id> is not a share
//!   group.";
//! - a classic JoinGroup for an id held by a share group (empty or not) gets
//!   INCONSISTENT_GROUP_PROTOCOL; a ConsumerGroupHeartbeat gets GROUP_ID_NOT_FOUND, "Group <id>
//!   is not a consumer group.". A share group is kept until it is deleted.
//!
//! [`check_group_id`] asks the group's coordinator, before a connector takes an id, whether a
//! group of the other kind holds it: ListGroups v5 with a type filter, else ListGroups v0-4
//! (protocol type `share` or `consumer`), with DescribeGroups for a classic group's members.
//! A broker without ListGroups (the dev broker) gets a warning, and for a share group the
//! committed offsets of the id on the connector's topics are looked up instead (OffsetFetch),
//! which finds a consumer group that ever committed there.
//!
//! Free functions on a [`Cluster`]: its connections are long-lived, which the dev broker needs
//! (closing any connection to it ends every share session on that broker).

use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    DescribeGroupsRequest, ListGroupsRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use thiserror::Error;

use crate::cluster::{Cluster, ClusterError};
use crate::connection::ConnectionError;
use crate::error_name;

const LIST_GROUPS_KEY: i16 = 16;
/// ListGroups v5 (Kafka 3.9+, KIP-848) takes a type filter and names each group's type.
const LIST_GROUPS_TYPED: i16 = 5;
/// OffsetFetch v1-7 names one group at the top level (v8+ takes a list of groups).
const OFFSET_FETCH_VERSIONS: (i16, i16) = (1, 7);

/// Errors of the group checks: the cluster could not be asked at all.
#[derive(Debug, Error)]
pub enum GroupsError {
    #[error("cannot ask the coordinator of group '{group}': {source}")]
    Cluster {
        group: String,
        #[source]
        source: ClusterError,
    },
    #[error("{api} for group '{group}' failed with error {code} ({name})")]
    Refused {
        api: &'static str,
        group: String,
        code: i16,
        name: String,
    },
}

impl GroupsError {
    /// Whether the error is the client's security setting not matching the cluster's.
    pub fn is_security_error(&self) -> bool {
        match self {
            GroupsError::Cluster { source, .. } => source.is_security_error(),
            GroupsError::Refused { .. } => false,
        }
    }
}

/// The kind of group a connector's consumer joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// A share group (KIP-932), ShareGroupHeartbeat.
    Share,
    /// A consumer group: the classic protocol (JoinGroup) or KIP-848's consumer protocol.
    Consumer,
}

impl Membership {
    /// ListGroups v5 type names of the groups that refuse a member of this kind.
    fn refusing_types(self) -> &'static [&'static str] {
        match self {
            // Kafka converts no other group into a share group, empty or not.
            Membership::Share => &["classic", "consumer", "streams"],
            // An empty streams group is converted for a classic join; a share group never.
            Membership::Consumer => &["share", "streams"],
        }
    }
}

/// A group of the other kind found under the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherGroup {
    /// `classic`, `consumer`, `share` or `streams` (ListGroups' type name), or the protocol
    /// type where the broker lists no type.
    pub group_type: String,
    /// Its state as the broker names it (`Empty`, `Stable`, ...); empty when not known.
    pub state: String,
    /// Members, where DescribeGroups told.
    pub members: Option<usize>,
    /// How it was found, for messages.
    pub evidence: String,
}

impl OtherGroup {
    /// Whether the group has members now (as far as the broker said).
    pub fn has_members(&self) -> bool {
        match self.members {
            Some(n) => n > 0,
            None => !self.state.is_empty() && !self.state.eq_ignore_ascii_case("Empty"),
        }
    }
}

/// What [`check_group_id`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupIdCheck {
    /// A group of the other kind that holds the id; the connector's consumer would be refused.
    pub conflict: Option<OtherGroup>,
    /// What could not be checked, said plainly (a broker without ListGroups).
    pub warnings: Vec<String>,
}

/// Whether a group other than a `wanted` one holds `group`: asks the group's coordinator.
/// `topics` are the connector's topics, used only where the broker cannot list groups.
pub async fn check_group_id(
    cluster: &Cluster,
    group: &str,
    wanted: Membership,
    topics: &[String],
) -> Result<GroupIdCheck, GroupsError> {
    let unreachable = |source: ClusterError| GroupsError::Cluster {
        group: group.to_owned(),
        source,
    };
    let coordinator = cluster.find_coordinator(group).await.map_err(unreachable)?;
    let conn = cluster.broker(coordinator).await.map_err(unreachable)?;
    let connection = |e: ConnectionError| unreachable(ClusterError::Connection(e));
    let mut check = GroupIdCheck::default();
    let Ok(version) = conn.pick(LIST_GROUPS_KEY, 0, LIST_GROUPS_TYPED) else {
        check.warnings.push(format!(
            "the cluster cannot list groups (no ListGroups on broker {coordinator}), so whether \
             another kind of group already holds '{group}' was only partly checked"
        ));
        if wanted == Membership::Share {
            check.conflict = committed_offsets_evidence(cluster, group, topics, &mut check)
                .await
                .map_err(connection)?;
        }
        return Ok(check);
    };
    let mut request = ListGroupsRequest::default();
    if version >= LIST_GROUPS_TYPED {
        request.types_filter = wanted
            .refusing_types()
            .iter()
            .map(|t| StrBytes::from_static_str(t))
            .collect();
    }
    let response = conn
        .request(&request, version, cluster.request_timeout())
        .await
        .map_err(connection)?;
    if response.error_code != 0 {
        return Err(GroupsError::Refused {
            api: "ListGroups",
            group: group.to_owned(),
            code: response.error_code,
            name: error_name(response.error_code),
        });
    }
    let Some(listed) = response
        .groups
        .iter()
        .find(|g| g.group_id.0.as_str() == group)
    else {
        return Ok(check);
    };
    let state = listed.group_state.to_string();
    let typed = (version >= LIST_GROUPS_TYPED).then(|| listed.group_type.as_str());
    let Some(group_type) = refusing_group(typed, listed.protocol_type.as_str(), &state, wanted)
    else {
        return Ok(check);
    };
    let members = if group_type == "classic" {
        classic_members(&conn, group, cluster).await
    } else {
        None
    };
    check.conflict = Some(OtherGroup {
        evidence: format!(
            "ListGroups on its coordinator (broker {coordinator}) lists '{group}' as a {group_type} \
             group{}{}",
            if state.is_empty() {
                String::new()
            } else {
                format!(" in state {state}")
            },
            members
                .map(|n| format!(" with {n} member(s)"))
                .unwrap_or_default()
        ),
        group_type,
        state,
        members,
    });
    Ok(check)
}

/// The type of a listed group that refuses a member of kind `wanted`, or `None` when it takes
/// it. `typed` is ListGroups v5's group type; before v5 only the protocol type tells (`share`
/// for a share group, `consumer` for a classic or consumer group of consumer clients, another
/// name for a classic group of other clients such as Connect workers).
fn refusing_group(
    typed: Option<&str>,
    protocol_type: &str,
    state: &str,
    wanted: Membership,
) -> Option<String> {
    let group_type = match typed {
        Some(t) => t.to_ascii_lowercase(),
        None if protocol_type == "share" => "share".to_owned(),
        None if protocol_type == "consumer" => "consumer".to_owned(),
        None => "classic".to_owned(),
    };
    let refuses = match wanted {
        Membership::Share => group_type != "share",
        // A consumer join goes to a classic or consumer group, and converts an empty streams
        // group (Kafka 4.2 `classicGroupJoin`, `getOrMaybeCreateConsumerGroup`).
        Membership::Consumer => match group_type.as_str() {
            "classic" | "consumer" => false,
            "streams" => !state.eq_ignore_ascii_case("Empty"),
            _ => true,
        },
    };
    refuses.then_some(group_type)
}

/// A classic group's member count (DescribeGroups), where the broker answers it.
async fn classic_members(
    conn: &crate::connection::Connection,
    group: &str,
    cluster: &Cluster,
) -> Option<usize> {
    let mut request = DescribeGroupsRequest::default();
    request.groups = vec![Cluster::group_id(group)];
    let (response, _) = conn
        .request_in_range(&request, 0, 5, cluster.request_timeout())
        .await
        .ok()?;
    let described = response
        .groups
        .iter()
        .find(|g| g.group_id.0.as_str() == group)?;
    (described.error_code == 0).then_some(described.members.len())
}

/// A consumer group's committed offsets on `topics`, as evidence that it holds `group`:
/// what a broker without ListGroups still tells.
async fn committed_offsets_evidence(
    cluster: &Cluster,
    group: &str,
    topics: &[String],
    check: &mut GroupIdCheck,
) -> Result<Option<OtherGroup>, ConnectionError> {
    if topics.is_empty() {
        return Ok(None);
    }
    if let Err(e) = cluster.refresh_metadata(topics).await {
        check.warnings.push(format!(
            "cannot read the partitions of {}: {e}",
            topics.join(", ")
        ));
        return Ok(None);
    }
    let mut request = OffsetFetchRequest::default();
    request.group_id = Cluster::group_id(group);
    request.topics = Some(
        topics
            .iter()
            .filter_map(|t| {
                let meta = cluster.topic(t)?;
                let mut topic = OffsetFetchRequestTopic::default();
                topic.name = TopicName(StrBytes::from_string(t.clone()));
                topic.partition_indexes = meta.leaders.keys().copied().collect();
                Some(topic)
            })
            .collect(),
    );
    let coordinator = match cluster.find_coordinator(group).await {
        Ok(id) => id,
        Err(e) => {
            check.warnings.push(format!(
                "cannot read the committed offsets of group '{group}': {e}"
            ));
            return Ok(None);
        }
    };
    let conn = match cluster.broker(coordinator).await {
        Ok(conn) => conn,
        Err(e) => {
            check.warnings.push(format!(
                "cannot read the committed offsets of group '{group}': {e}"
            ));
            return Ok(None);
        }
    };
    let (response, _) = match conn
        .request_in_range(
            &request,
            OFFSET_FETCH_VERSIONS.0,
            OFFSET_FETCH_VERSIONS.1,
            cluster.request_timeout(),
        )
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            check.warnings.push(format!(
                "cannot read the committed offsets of group '{group}': {e}"
            ));
            return Ok(None);
        }
    };
    let committed: Vec<String> = response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| p.error_code == 0 && p.committed_offset >= 0)
                .map(move |p| {
                    format!(
                        "{}-{}@{}",
                        t.name.0.as_str(),
                        p.partition_index,
                        p.committed_offset
                    )
                })
        })
        .collect();
    if committed.is_empty() {
        return Ok(None);
    }
    Ok(Some(OtherGroup {
        group_type: "consumer".to_owned(),
        state: String::new(),
        members: None,
        evidence: format!(
            "consumer group '{group}' has committed offsets ({})",
            committed.join(",")
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_group_is_refused_by_every_other_type_and_a_consumer_only_by_share_and_streams() {
        assert_eq!(
            Membership::Share.refusing_types(),
            &["classic", "consumer", "streams"]
        );
        assert_eq!(Membership::Consumer.refusing_types(), &["share", "streams"]);
    }

    #[test]
    fn a_listed_group_refuses_only_members_of_another_type_in_every_listgroups_version() {
        use Membership::{Consumer, Share};
        assert_eq!(
            refusing_group(Some("classic"), "consumer", "Empty", Share).as_deref(),
            Some("classic")
        );
        assert_eq!(
            refusing_group(Some("share"), "share", "Stable", Share),
            None
        );
        assert_eq!(
            refusing_group(Some("share"), "share", "Empty", Consumer).as_deref(),
            Some("share")
        );
        assert_eq!(
            refusing_group(Some("consumer"), "consumer", "Stable", Consumer),
            None
        );
        assert_eq!(
            refusing_group(Some("streams"), "streams", "Empty", Consumer),
            None
        );
        assert_eq!(
            refusing_group(Some("streams"), "streams", "Stable", Consumer).as_deref(),
            Some("streams")
        );
        // ListGroups v0-4: the protocol type.
        assert_eq!(
            refusing_group(None, "share", "", Consumer).as_deref(),
            Some("share")
        );
        assert_eq!(refusing_group(None, "share", "", Share), None);
        assert_eq!(
            refusing_group(None, "consumer", "", Share).as_deref(),
            Some("consumer")
        );
        assert_eq!(
            refusing_group(None, "connect", "", Share).as_deref(),
            Some("classic")
        );
        assert_eq!(refusing_group(None, "consumer", "", Consumer), None);
    }

    #[test]
    fn a_group_has_members_unless_its_state_or_description_says_empty() {
        let group = |state: &str, members: Option<usize>| OtherGroup {
            group_type: "share".into(),
            state: state.into(),
            members,
            evidence: String::new(),
        };
        assert!(!group("Empty", None).has_members());
        assert!(group("Stable", None).has_members());
        assert!(!group("Stable", Some(0)).has_members());
        assert!(!group("", None).has_members());
    }
}
