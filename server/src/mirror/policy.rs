//! MM2's replication policies: how a flow names the remote topic of a source topic, how a topic
//! name tells where it came from, and from that which topics a flow must not replicate
//! (internal ones, and cycles: a topic that already came from the flow's target).
//!
//! The behaviour follows Kafka 4.2's `DefaultReplicationPolicy`, `IdentityReplicationPolicy`,
//! `ReplicationPolicy` defaults and `MirrorSourceConnector.shouldReplicateTopic`/`isCycle`.

/// `replication.policy.class`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationPolicy {
    /// `A.orders` on the target for `orders` of cluster `A` (with `replication.policy.separator`).
    Default {
        separator: String,
        /// `replication.policy.internal.topic.separator.enabled`: whether internal topic names
        /// use the separator too (else `.`).
        internal_separator: bool,
    },
    /// The same name on the target; only heartbeats are renamed. It cannot tell replicated
    /// topics from local ones, so it does not prevent cycles (as in MM2).
    Identity {
        separator: String,
        internal_separator: bool,
        /// The flow's source cluster: where every non-heartbeat topic is taken to come from.
        source_alias: String,
    },
}

const DEFAULT_CLASS: &str = "DefaultReplicationPolicy";
const IDENTITY_CLASS: &str = "IdentityReplicationPolicy";
const PACKAGE: &str = "org.apache.kafka.connect.mirror.";

impl ReplicationPolicy {
    /// The policy a class name stands for (short or fully qualified), `None` if unknown.
    pub fn from_class(
        class: &str,
        separator: &str,
        internal_separator: bool,
        source_alias: &str,
    ) -> Option<ReplicationPolicy> {
        let class = class.trim();
        let short = class.strip_prefix(PACKAGE).unwrap_or(class);
        match short {
            DEFAULT_CLASS => Some(ReplicationPolicy::Default {
                separator: separator.to_owned(),
                internal_separator,
            }),
            IDENTITY_CLASS => Some(ReplicationPolicy::Identity {
                separator: separator.to_owned(),
                internal_separator,
                source_alias: source_alias.to_owned(),
            }),
            _ => None,
        }
    }

    /// MM2's default: `DefaultReplicationPolicy` with `.`.
    pub fn default_policy() -> ReplicationPolicy {
        ReplicationPolicy::Default {
            separator: ".".into(),
            internal_separator: true,
        }
    }

    fn separator(&self) -> &str {
        match self {
            ReplicationPolicy::Default { separator, .. }
            | ReplicationPolicy::Identity { separator, .. } => separator,
        }
    }

    fn internal_separator(&self) -> &str {
        match self {
            ReplicationPolicy::Default {
                internal_separator: true,
                separator,
            }
            | ReplicationPolicy::Identity {
                internal_separator: true,
                separator,
                ..
            } => separator,
            _ => ".",
        }
    }

    /// The name `topic` of cluster `source_alias` gets on the target.
    pub fn format_remote_topic(&self, source_alias: &str, topic: &str) -> String {
        match self {
            ReplicationPolicy::Identity { .. } if !self.looks_like_heartbeats(topic) => {
                topic.to_owned()
            }
            _ => format!("{source_alias}{}{topic}", self.separator()),
        }
    }

    /// The cluster `topic` was replicated from, `None` for a topic that is not remote.
    pub fn topic_source(&self, topic: &str) -> Option<String> {
        match self {
            ReplicationPolicy::Identity { source_alias, .. }
                if !self.looks_like_heartbeats(topic) =>
            {
                Some(source_alias.clone())
            }
            _ => {
                // As Java's split: trailing empty parts do not count.
                let parts: Vec<&str> = topic.split(self.separator()).collect();
                let meaningful = parts
                    .iter()
                    .rposition(|p| !p.is_empty())
                    .map_or(0, |i| i + 1);
                (meaningful >= 2).then(|| parts[0].to_owned())
            }
        }
    }

    /// The name `topic` had on the cluster it came from, `None` for a topic that is not remote.
    pub fn upstream_topic(&self, topic: &str) -> Option<String> {
        match self {
            ReplicationPolicy::Identity { .. } if !self.looks_like_heartbeats(topic) => {
                Some(topic.to_owned())
            }
            _ => {
                let source = self.topic_source(topic)?;
                Some(topic[source.len() + self.separator().len()..].to_owned())
            }
        }
    }

    /// The name at the first cluster of a chain of replications.
    pub fn original_topic(&self, topic: &str) -> String {
        let mut topic = topic.to_owned();
        // Each step removes at least one separator, so this ends.
        while let Some(upstream) = self.upstream_topic(&topic) {
            if upstream == topic {
                break;
            }
            topic = upstream;
        }
        topic
    }

    pub fn heartbeats_topic(&self) -> &'static str {
        "heartbeats"
    }

    fn looks_like_heartbeats(&self, topic: &str) -> bool {
        topic.ends_with(self.heartbeats_topic())
    }

    pub fn is_heartbeats_topic(&self, topic: &str) -> bool {
        self.original_topic(topic) == self.heartbeats_topic()
    }

    /// The offset syncs topic named after `other_alias`, the flow's cluster it is not on (the
    /// target for MM2's default location, the source cluster; see
    /// `FlowSettings::offset_syncs_topic`).
    pub fn offset_syncs_topic(&self, other_alias: &str) -> String {
        let sep = self.internal_separator();
        format!("mm2-offset-syncs{sep}{other_alias}{sep}internal")
    }

    /// Where checkpoints of groups of cluster `source_alias` go on the target.
    pub fn checkpoints_topic(&self, source_alias: &str) -> String {
        format!("{source_alias}{}", self.checkpoints_suffix())
    }

    fn checkpoints_suffix(&self) -> String {
        let sep = self.internal_separator();
        format!("{sep}checkpoints{sep}internal")
    }

    pub fn is_checkpoints_topic(&self, topic: &str) -> bool {
        topic.ends_with(&self.checkpoints_suffix())
    }

    pub fn is_mm2_internal_topic(&self, topic: &str) -> bool {
        let suffix = format!("{}internal", self.internal_separator());
        (topic.starts_with("mm2") && topic.ends_with(&suffix)) || self.is_checkpoints_topic(topic)
    }

    /// MM2's internal topics and Kafka's (`__consumer_offsets`, `.`-prefixed ones).
    pub fn is_internal_topic(&self, topic: &str) -> bool {
        self.is_mm2_internal_topic(topic) || topic.starts_with("__") || topic.starts_with('.')
    }

    /// Whether `topic` already came from `target` somewhere up its chain: replicating it there
    /// would close a cycle.
    pub fn is_cycle(&self, topic: &str, target: &str) -> bool {
        let mut topic = topic.to_owned();
        loop {
            match self.topic_source(&topic) {
                None => return false,
                Some(source) if source == target => return true,
                Some(_) => match self.upstream_topic(&topic) {
                    // Identity-like policies cannot tell; they do not prevent cycles.
                    Some(upstream) if upstream != topic => topic = upstream,
                    _ => return false,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_with(separator: &str) -> ReplicationPolicy {
        ReplicationPolicy::from_class(
            "org.apache.kafka.connect.mirror.DefaultReplicationPolicy",
            separator,
            true,
            "A",
        )
        .expect("known")
    }

    fn identity() -> ReplicationPolicy {
        ReplicationPolicy::from_class("IdentityReplicationPolicy", ".", true, "A").expect("known")
    }

    #[test]
    fn the_default_policy_prefixes_the_source_alias() {
        let p = ReplicationPolicy::default_policy();
        assert_eq!(p.format_remote_topic("A", "orders"), "A.orders");
        assert_eq!(p.topic_source("A.orders").as_deref(), Some("A"));
        assert_eq!(p.upstream_topic("B.A.orders").as_deref(), Some("A.orders"));
        assert_eq!(p.original_topic("B.A.orders"), "orders");
        assert_eq!(p.topic_source("orders"), None);
        assert_eq!(
            p.topic_source("orders."),
            None,
            "a trailing separator is not a source"
        );
        assert_eq!(
            default_with("_").format_remote_topic("A", "orders"),
            "A_orders"
        );
        assert_eq!(default_with("_").topic_source("A.orders"), None);
    }

    #[test]
    fn topics_already_from_the_target_are_cycles() {
        let p = ReplicationPolicy::default_policy();
        assert!(p.is_cycle("B.orders", "B"));
        assert!(p.is_cycle("C.B.orders", "B"), "found up the chain");
        assert!(!p.is_cycle("C.orders", "B"));
        assert!(!p.is_cycle("orders", "B"));
    }

    #[test]
    fn internal_topics_are_recognised_as_mm2_names_them() {
        let p = ReplicationPolicy::default_policy();
        assert_eq!(p.offset_syncs_topic("B"), "mm2-offset-syncs.B.internal");
        assert_eq!(p.checkpoints_topic("A"), "A.checkpoints.internal");
        assert!(p.is_internal_topic("mm2-offset-syncs.B.internal"));
        assert!(p.is_internal_topic("A.checkpoints.internal"));
        assert!(p.is_internal_topic("__consumer_offsets"));
        assert!(p.is_internal_topic(".hidden"));
        assert!(!p.is_internal_topic("orders"));
        assert!(!p.is_internal_topic("heartbeats"));
        let underscore = default_with("_");
        assert_eq!(underscore.checkpoints_topic("A"), "A_checkpoints_internal");
        let dotted = ReplicationPolicy::from_class(DEFAULT_CLASS, "_", false, "A").expect("known");
        assert_eq!(dotted.checkpoints_topic("A"), "A.checkpoints.internal");
        assert_eq!(dotted.format_remote_topic("A", "x"), "A_x");
    }

    #[test]
    fn heartbeats_are_recognised_through_any_chain() {
        let p = ReplicationPolicy::default_policy();
        assert!(p.is_heartbeats_topic("heartbeats"));
        assert!(p.is_heartbeats_topic("B.A.heartbeats"));
        assert!(!p.is_heartbeats_topic("A.myheartbeats"));
    }

    #[test]
    fn the_identity_policy_keeps_names_but_renames_heartbeats() {
        let p = identity();
        assert_eq!(p.format_remote_topic("A", "orders"), "orders");
        assert_eq!(p.format_remote_topic("A", "heartbeats"), "A.heartbeats");
        assert_eq!(p.topic_source("orders").as_deref(), Some("A"));
        assert_eq!(
            p.upstream_topic("A.heartbeats").as_deref(),
            Some("heartbeats")
        );
        assert!(!p.is_cycle("orders", "B"), "identity cannot see cycles");
        assert!(p.is_cycle("B.heartbeats", "B"));
    }

    #[test]
    fn unknown_policy_classes_are_not_guessed() {
        assert!(ReplicationPolicy::from_class("com.acme.Policy", ".", true, "A").is_none());
    }
}
