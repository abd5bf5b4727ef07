//! Whether a connector's group id is free for its kind of group. Kafka keeps one namespace for
//! classic, consumer, share and streams groups, and its coordinator refuses a member whose
//! group type differs from the group that holds the id (docs/runtime.md, "Mode and groups").
//! The worker asks before it stores a configuration (REST create/update and `validate`) and
//! again before it starts the connector; a join the broker refuses anyway fails the task with
//! the reason.
//!
//! The checks run on a runtime of their own with one long-lived [`Cluster`] per cluster and
//! security setting: its connections outlive the REST request or test that asked, and are not
//! opened and closed per check (the dev broker ends every share session on a broker when any
//! connection to it closes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spillway_kafka::cluster::Cluster;
use spillway_kafka::groups::{check_group_id, Membership, OtherGroup};
use spillway_kafka::security::ClientSecurity;

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupIdVerdict {
    /// No group of another kind holds the id (as far as the cluster could tell: `warnings`).
    Free { warnings: Vec<String> },
    /// A group of another kind holds it; the connector's consumer would be refused.
    Taken {
        other: OtherGroup,
        warnings: Vec<String>,
    },
    /// The cluster could not be asked (unreachable, refused credentials, timeout).
    Unchecked { reason: String },
}

/// One question: may `group` become a group of kind `wanted`?
#[derive(Clone)]
pub struct GroupIdQuery {
    pub bootstrap: String,
    pub security: ClientSecurity,
    /// Tells clusters with other security settings apart (its values never leave the process).
    pub security_key: String,
    pub group: String,
    pub wanted: Membership,
    /// The connector's topics (a broker without ListGroups is asked for committed offsets).
    pub topics: Vec<String>,
}

/// Runs group id checks; one per worker.
pub struct GroupIdChecker {
    runtime: Option<tokio::runtime::Runtime>,
    clusters: Arc<Mutex<HashMap<String, Arc<Cluster>>>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each use is one map operation; a panic elsewhere cannot leave it half done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GroupIdChecker {
    pub fn new() -> std::io::Result<GroupIdChecker> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("spillway-group-ids")
            .enable_all()
            .build()?;
        Ok(GroupIdChecker {
            runtime: Some(runtime),
            clusters: Arc::default(),
        })
    }

    /// Asks the cluster, giving up after `timeout`.
    pub async fn check(&self, query: GroupIdQuery, timeout: Duration) -> GroupIdVerdict {
        match self.spawn_check(query, timeout) {
            Some(asked) => asked.await.unwrap_or_else(|e| GroupIdVerdict::Unchecked {
                reason: format!("the check stopped: {e}"),
            }),
            None => GroupIdVerdict::Unchecked {
                reason: "the worker is stopping".into(),
            },
        }
    }

    /// Starts asking the cluster on the checker's own runtime; the handle gives the verdict
    /// (`None` when the worker is stopping).
    fn spawn_check(
        &self,
        query: GroupIdQuery,
        timeout: Duration,
    ) -> Option<tokio::task::JoinHandle<GroupIdVerdict>> {
        let runtime = self.runtime.as_ref()?;
        let clusters = Arc::clone(&self.clusters);
        Some(runtime.spawn(async move {
            tokio::time::timeout(timeout, ask(&clusters, query))
                .await
                .unwrap_or_else(|_| GroupIdVerdict::Unchecked {
                    reason: format!("the cluster did not answer within {timeout:?}"),
                })
        }))
    }
}

/// How long a KIP-848 member may go without an assignment before the watch first asks who
/// holds its group id, and how often it asks again while it still has none.
pub const JOIN_CHECK_AFTER: Duration = Duration::from_secs(3);
pub const JOIN_CHECK_EVERY: Duration = Duration::from_secs(10);
const JOIN_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Watches the join of a member on KIP-848's `consumer` protocol. librdkafka (2.12) retries a
/// ConsumerGroupHeartbeat refused with GROUP_ID_NOT_FOUND — Kafka's answer when a share (or
/// other) group holds the id — without telling the application, so such a task would show
/// RUNNING and never read. While the member has no assignment, the watch asks the cluster
/// (the group id check of [`GroupIdChecker`]) whether another type of group holds the id; a
/// refusal that is found fails the task with the reason.
#[derive(Clone)]
pub struct JoinWatch {
    checker: Arc<GroupIdChecker>,
    query: GroupIdQuery,
    /// The user chose the id (`consumer.override.group.id`): the advice differs.
    chosen: bool,
}

impl JoinWatch {
    pub fn new(checker: Arc<GroupIdChecker>, query: GroupIdQuery, chosen: bool) -> JoinWatch {
        JoinWatch {
            checker,
            query,
            chosen,
        }
    }

    /// Starts watching a member that subscribed now.
    pub fn start(self) -> JoinWatching {
        JoinWatching {
            watch: self,
            subscribed: std::time::Instant::now(),
            next_check: std::time::Instant::now() + JOIN_CHECK_AFTER,
            asking: None,
        }
    }
}

/// A [`JoinWatch`] at work for one member.
pub struct JoinWatching {
    watch: JoinWatch,
    subscribed: std::time::Instant,
    next_check: std::time::Instant,
    asking: Option<tokio::task::JoinHandle<GroupIdVerdict>>,
}

impl JoinWatching {
    /// Called on each poll while the member has no assignment: the reason the join is
    /// refused, once a check found another type of group holding the id. Never waits: a
    /// check runs on the checker's runtime and its verdict is read by a later call.
    pub fn refused(&mut self) -> Option<String> {
        use futures::FutureExt;
        if let Some(asking) = self.asking.as_mut() {
            let verdict = asking.now_or_never()?;
            self.asking = None;
            match verdict {
                Ok(GroupIdVerdict::Taken { other, .. }) => {
                    return Some(format!(
                        "the group coordinator has not let this consumer (KIP-848 consumer \
                         protocol) into group '{}' in {} s: {}",
                        self.watch.query.group,
                        self.subscribed.elapsed().as_secs(),
                        conflict_reason(
                            &self.watch.query.group,
                            self.watch.query.wanted,
                            &other,
                            self.watch.chosen
                        )
                    ));
                }
                Ok(GroupIdVerdict::Unchecked { reason }) => {
                    tracing::debug!(group = %self.watch.query.group, %reason, "cannot check who holds the group id of a member without an assignment");
                }
                Ok(GroupIdVerdict::Free { .. }) | Err(_) => {}
            }
            self.next_check = std::time::Instant::now() + JOIN_CHECK_EVERY;
            return None;
        }
        if std::time::Instant::now() >= self.next_check {
            self.asking = self
                .watch
                .checker
                .spawn_check(self.watch.query.clone(), JOIN_CHECK_TIMEOUT);
        }
        None
    }
}

async fn ask(
    clusters: &Mutex<HashMap<String, Arc<Cluster>>>,
    query: GroupIdQuery,
) -> GroupIdVerdict {
    let key = format!("{}\n{}", query.bootstrap, query.security_key);
    let known = locked(clusters).get(&key).cloned();
    let cluster = match known {
        Some(cluster) => cluster,
        None => match Cluster::connect_secured(
            &query.bootstrap,
            "spillway-group-id-check",
            Duration::from_secs(5),
            query.security.clone(),
        )
        .await
        {
            Ok(cluster) => {
                locked(clusters).insert(key, Arc::clone(&cluster));
                cluster
            }
            Err(e) => {
                return GroupIdVerdict::Unchecked {
                    reason: format!("cannot reach {}: {e}", query.bootstrap),
                }
            }
        },
    };
    match check_group_id(&cluster, &query.group, query.wanted, &query.topics).await {
        Ok(check) => match check.conflict {
            Some(other) => GroupIdVerdict::Taken {
                other,
                warnings: check.warnings,
            },
            None => GroupIdVerdict::Free {
                warnings: check.warnings,
            },
        },
        Err(e) => GroupIdVerdict::Unchecked {
            reason: e.to_string(),
        },
    }
}

impl Drop for GroupIdChecker {
    fn drop(&mut self) {
        // May be dropped inside an async context, where a blocking shutdown would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why `group` cannot be taken as a group of kind `wanted` while `other` holds it, and what to
/// do; `chosen` says whether the user set the id (`consumer.override.group.id`) or it is the
/// default.
pub fn conflict_reason(
    group: &str,
    wanted: Membership,
    other: &OtherGroup,
    chosen: bool,
) -> String {
    let (wanted_name, default) = match wanted {
        Membership::Share => ("a share group", "connect-share-<name>"),
        Membership::Consumer => ("a consumer group", "connect-<name>"),
    };
    let rename = if chosen {
        format!(
            "remove consumer.override.group.id to use the default {default}, or set it to an id no other group uses"
        )
    } else {
        "set consumer.override.group.id to an id no other group uses".to_owned()
    };
    let other_kind = match other.group_type.as_str() {
        "classic" => "a classic consumer group".to_owned(),
        "consumer" => "a consumer group".to_owned(),
        kind => format!("a {kind} group"),
    };
    let delete = match other.group_type.as_str() {
        "share" => format!("kafka-share-groups.sh --delete --group {group}"),
        "streams" => format!("kafka-streams-groups.sh --delete --group {group}"),
        _ => format!("kafka-consumer-groups.sh --delete --group {group}"),
    };
    let kept = match other.group_type.as_str() {
        "share" => "Kafka keeps a share group, members or not, until it is deleted",
        "streams" => "Kafka keeps a streams group until it is deleted",
        _ => {
            "Kafka keeps an empty consumer group while it has committed offsets \
             (offsets.retention.minutes)"
        }
    };
    let now = if other.has_members() {
        format!(
            "it has members now: stop what still reads with it (another connector or \
             application) and delete it ({delete}),"
        )
    } else {
        format!("it has no members: delete it ({delete}) if its position is no longer needed,")
    };
    format!(
        "group id '{group}' is held by {other_kind} ({}). Kafka has one namespace for group ids \
         and refuses {wanted_name} member for an id another type of group holds; {kept}. Either \
         {now} or {rename}",
        other.evidence
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(group_type: &str, state: &str) -> OtherGroup {
        OtherGroup {
            group_type: group_type.into(),
            state: state.into(),
            members: None,
            evidence: format!("listed as {group_type} in state {state}"),
        }
    }

    #[test]
    fn a_rollback_onto_a_share_group_says_how_to_free_or_avoid_the_id() {
        let text = conflict_reason(
            "orders",
            Membership::Consumer,
            &other("share", "Empty"),
            true,
        );
        assert!(text.contains("'orders' is held by a share group"), "{text}");
        assert!(
            text.contains("kafka-share-groups.sh --delete --group orders"),
            "{text}"
        );
        assert!(text.contains("remove consumer.override.group.id"), "{text}");
        assert!(text.contains("connect-<name>"), "{text}");
    }

    #[test]
    fn a_share_group_on_a_busy_consumer_group_id_says_to_stop_its_members_first() {
        let text = conflict_reason(
            "connect-share-x",
            Membership::Share,
            &other("classic", "Stable"),
            false,
        );
        assert!(text.contains("a classic consumer group"), "{text}");
        assert!(text.contains("it has members now"), "{text}");
        assert!(text.contains("kafka-consumer-groups.sh --delete"), "{text}");
        assert!(text.contains("set consumer.override.group.id"), "{text}");
    }
}
