//! Share-group membership: ShareGroupHeartbeat v1 (brief §3).
//!
//! [`MemberState`] is the pure state machine (what to send, what a response means);
//! [`run`] drives it against the coordinator: one heartbeat in flight at a time, at the
//! interval the coordinator asks for (assigned or not, as Kafka's clients do), re-finding the
//! coordinator after coordinator errors or transport failures, and leaving with epoch -1 when
//! the subscription becomes empty or the consumer closes.
//!
//! Kafka's coordinator sends the assignment only on a join, a full request or a change
//! (brief, Heartbeat). So after any failed, timed-out or error response the next heartbeat is
//! full again (Java resets its sent fields, librdkafka sets "send full request"): a lost
//! response that carried a new assignment cannot leave the member on the old one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    GroupId, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rand::RngCore;
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::ShareError;
use crate::backoff::Backoff;
use crate::cluster::Cluster;
use crate::connection::ConnectionError;
use crate::error_name;

const HEARTBEAT_KEY: i16 = 76;
const HEARTBEAT_VERSION: i16 = 1;
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A new member id in Kafka's Uuid string form: 16 random bytes, URL-safe base64 without
/// padding (22 characters). Real brokers parse it as a Uuid (brief §3.2).
pub fn new_member_id() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The assignment as the coordinator sent it: topic id → partitions.
pub type Assignment = Vec<(Uuid, Vec<i32>)>;

/// What a heartbeat response asks of us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Joined or still a member; `Some` when the coordinator sent an assignment.
    Ok(Option<Assignment>),
    /// Fenced or unknown: rejoin at once with epoch 0 (same id); the assignment is void.
    Rejoin,
    /// The coordinator moved or is unreachable: find it again, keep the epoch.
    FindCoordinator,
    /// Try again after a backoff.
    Retry,
    /// Nothing we can do; the consumer stops with this error.
    Fatal(i16, String),
}

/// The member's protocol state.
#[derive(Debug, Clone)]
pub struct MemberState {
    pub member_id: String,
    pub epoch: i32,
    pub subscription: Vec<String>,
    /// Whether the coordinator has seen the current subscription. Cleared by a failed or error
    /// response, so the next request is full.
    subscription_sent: bool,
    pub interval: Duration,
}

impl MemberState {
    pub fn new(member_id: String) -> MemberState {
        MemberState {
            member_id,
            epoch: 0,
            subscription: Vec::new(),
            subscription_sent: false,
            interval: Duration::from_secs(5),
        }
    }

    pub fn subscribe(&mut self, topics: Vec<String>) {
        if topics != self.subscription {
            self.subscription = topics;
            self.subscription_sent = false;
        }
    }

    /// The next heartbeat. A join (epoch 0) always carries the full subscription; otherwise it
    /// is sent when it changed or the last heartbeat failed.
    pub fn request(&self, group: &GroupId) -> ShareGroupHeartbeatRequest {
        let mut r = ShareGroupHeartbeatRequest::default();
        r.group_id = group.clone();
        r.member_id = StrBytes::from_string(self.member_id.clone());
        r.member_epoch = self.epoch;
        if self.epoch == 0 || !self.subscription_sent {
            r.subscribed_topic_names = Some(
                self.subscription
                    .iter()
                    .map(|t| TopicName(StrBytes::from_string(t.clone())))
                    .collect(),
            );
        }
        r
    }

    /// The leave request (epoch -1).
    pub fn leave_request(&self, group: &GroupId) -> ShareGroupHeartbeatRequest {
        let mut r = ShareGroupHeartbeatRequest::default();
        r.group_id = group.clone();
        r.member_id = StrBytes::from_string(self.member_id.clone());
        r.member_epoch = -1;
        r
    }

    /// The heartbeat got no answer (transport error, timeout, coordinator lookup failed): the
    /// answer may have carried an assignment, so the next request is full.
    pub fn on_failure(&mut self) {
        self.subscription_sent = false;
    }

    /// We left the group (epoch -1): a later subscription joins afresh at epoch 0.
    pub fn on_left(&mut self) {
        self.epoch = 0;
        self.subscription_sent = false;
    }

    /// Apply a response to the request built by [`MemberState::request`] (brief §3.4).
    pub fn on_response(
        &mut self,
        sent_subscription: bool,
        r: &ShareGroupHeartbeatResponse,
    ) -> Outcome {
        if r.error_code != 0 {
            // Whatever the error, the coordinator's view of us is uncertain: resend everything.
            self.subscription_sent = false;
        }
        if r.error_code == 0 {
            return self.on_success(sent_subscription, r);
        }
        use ResponseError::*;
        let Some(error) = ResponseError::try_from_code(r.error_code) else {
            return Outcome::Retry;
        };
        match error {
            FencedMemberEpoch | UnknownMemberId => {
                self.epoch = 0;
                Outcome::Rejoin
            }
            CoordinatorNotAvailable | NotCoordinator => Outcome::FindCoordinator,
            CoordinatorLoadInProgress => Outcome::Retry,
            // Java's share consumer raises a topic authorization failure to the application,
            // and Connect fails the task: retrying cannot grant the ACL.
            GroupIdNotFound
            | InvalidRequest
            | GroupMaxSizeReached
            | UnsupportedVersion
            | GroupAuthorizationFailed
            | TopicAuthorizationFailed => Outcome::Fatal(
                r.error_code,
                r.error_message
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            ),
            _ => Outcome::Retry,
        }
    }

    fn on_success(&mut self, sent_subscription: bool, r: &ShareGroupHeartbeatResponse) -> Outcome {
        self.epoch = r.member_epoch;
        if sent_subscription {
            self.subscription_sent = true;
        }
        if r.heartbeat_interval_ms > 0 {
            self.interval = Duration::from_millis(r.heartbeat_interval_ms as u64);
        }
        Outcome::Ok(r.assignment.as_ref().map(|a| {
            a.topic_partitions
                .iter()
                .map(|tp| (tp.topic_id, tp.partitions.clone()))
                .collect()
        }))
    }
}

/// What the heartbeat task shares with the consumer.
pub(crate) struct MembershipLink {
    pub group: String,
    pub cluster: Arc<Cluster>,
    pub subscription: watch::Receiver<Vec<String>>,
    pub assignment: watch::Sender<Option<Arc<Assignment>>>,
    pub epoch: Arc<Mutex<i32>>,
    pub fatal: Arc<Mutex<Option<ShareError>>>,
    pub leave: oneshot::Receiver<oneshot::Sender<()>>,
    pub request_timeout: Duration,
}

/// Heartbeat until asked to leave. One heartbeat in flight at a time.
pub(crate) async fn run(mut state: MemberState, mut link: MembershipLink) {
    let group_id = Cluster::group_id(&link.group);
    let mut coordinator: Option<i32> = None;
    let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        {
            let subs = link.subscription.borrow_and_update().clone();
            state.subscribe(subs);
        }
        let mut wait = state.interval;
        if state.subscription.is_empty() {
            if state.epoch > 0 {
                // Unsubscribing leaves the group (epoch -1), as Kafka's clients do; staying a
                // member would keep partitions assigned to us that nobody fetches.
                leave(&state, coordinator, &link, &group_id).await;
                state.on_left();
                *link.epoch.lock().unwrap_or_else(|e| e.into_inner()) = state.epoch;
                let _ = link.assignment.send(Some(Arc::new(Vec::new())));
            }
        } else {
            match beat(&mut state, &mut coordinator, &link, &group_id).await {
                Ok(Outcome::Ok(assignment)) => {
                    retry.reset();
                    // The answer may have brought the coordinator's interval (the join's always
                    // does): the next heartbeat keeps it, not the one from before this beat.
                    wait = state.interval;
                    *link.epoch.lock().unwrap_or_else(|e| e.into_inner()) = state.epoch;
                    if let Some(a) = assignment {
                        let changed = link
                            .assignment
                            .borrow()
                            .as_deref()
                            .is_none_or(|old| *old != a);
                        if changed {
                            debug!(member = %state.member_id, epoch = state.epoch, ?a, "assignment");
                            let _ = link.assignment.send(Some(Arc::new(a)));
                        }
                    }
                }
                Ok(Outcome::Rejoin) => {
                    // The assignment is void, but the rejoin goes out at once and its answer
                    // carries the new one. Share partitions are not owned exclusively, so
                    // fetching the old set until then is harmless, and it spares the sessions
                    // (the dev broker fences spuriously on every membership change, §8.5).
                    info!(member = %state.member_id, "fenced or unknown member; rejoining");
                    wait = Duration::ZERO;
                }
                Ok(Outcome::FindCoordinator) => {
                    coordinator = None;
                    wait = retry.next_wait();
                }
                Ok(Outcome::Retry) => wait = retry.next_wait(),
                Ok(Outcome::Fatal(code, message)) => {
                    let mut message =
                        fatal_detail(code, &message, &link.group, &state.subscription);
                    if code == ResponseError::GroupIdNotFound.code() && state.epoch == 0 {
                        // Kafka 4.2 refuses a share member for an id another type of group
                        // holds ("Group <id> is not a share group.").
                        message.push_str(&format!(
                            ". Kafka has one namespace for group ids and another type of group \
                             (a consumer group, kept while it has committed offsets) holds it: \
                             use another group id (consumer.override.group.id, or remove it for \
                             the default connect-share-<name>), or delete that group once it has \
                             no members (kafka-consumer-groups.sh --delete --group {})",
                            link.group
                        ));
                    }
                    let err = ShareError::Fatal {
                        group: link.group.clone(),
                        code,
                        name: error_name(code),
                        message,
                    };
                    warn!(%err, "share group membership failed");
                    *link.fatal.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
                    // Stay alive only to answer the leave request.
                    if let Ok(reply) = link.leave.await {
                        let _ = reply.send(());
                    }
                    return;
                }
                Err(reason) => {
                    debug!(%reason, "heartbeat failed; finding the coordinator again");
                    state.on_failure();
                    coordinator = None;
                    wait = retry.next_wait();
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = link.subscription.changed() => {
                if changed.is_err() { return; }
            }
            reply = &mut link.leave => {
                leave(&state, coordinator, &link, &group_id).await;
                if let Ok(reply) = reply { let _ = reply.send(()); }
                return;
            }
        }
    }
}

/// One heartbeat round trip. `Err` is a transport or lookup failure.
async fn beat(
    state: &mut MemberState,
    coordinator: &mut Option<i32>,
    link: &MembershipLink,
    group_id: &GroupId,
) -> Result<Outcome, String> {
    let id = match *coordinator {
        Some(id) => id,
        None => {
            let id = link
                .cluster
                .find_coordinator(&link.group)
                .await
                .map_err(|e| e.to_string())?;
            *coordinator = Some(id);
            id
        }
    };
    let conn = link.cluster.broker(id).await.map_err(|e| e.to_string())?;
    let request = state.request(group_id);
    let sent_subscription = request.subscribed_topic_names.is_some();
    // v1 only: v0 (Kafka 4.0 early access) has another layout and the crate lacks it.
    let version = match conn.pick(HEARTBEAT_KEY, HEARTBEAT_VERSION, HEARTBEAT_VERSION) {
        Ok(version) => version,
        // A broker that does not offer ShareGroupHeartbeat v1 never will: no retry helps.
        Err(
            e @ (ConnectionError::UnsupportedApi { .. } | ConnectionError::NoCommonVersion { .. }),
        ) => {
            return Ok(Outcome::Fatal(UNSUPPORTED_VERSION, e.to_string()));
        }
        Err(e) => return Err(e.to_string()),
    };
    let response = conn
        .request(&request, version, link.request_timeout)
        .await
        .map_err(|e| e.to_string())?;
    Ok(state.on_response(sent_subscription, &response))
}

/// Kafka's UNSUPPORTED_VERSION, also used when the broker does not offer the heartbeat at all.
const UNSUPPORTED_VERSION: i16 = 35;

/// The text of a fatal heartbeat error: the broker's message, then what the operator must
/// change (the broker requirement, or the ACL to grant).
fn fatal_detail(code: i16, broker_message: &str, group: &str, topics: &[String]) -> String {
    let advice = match ResponseError::try_from_code(code) {
        Some(ResponseError::UnsupportedVersion) => Some(
            "the broker does not support share groups (ShareGroupHeartbeat v1): they need Apache Kafka 4.1 or later with share groups enabled (feature share.version=1: kafka-features.sh --bootstrap-server <broker> upgrade --feature share.version=1); on an older cluster run the connector in classic mode (remove consumer.override.group.protocol=share)".to_owned(),
        ),
        Some(ResponseError::GroupAuthorizationFailed) => Some(format!(
            "the principal may not use share group '{group}': grant it READ on GROUP '{group}' (kafka-acls.sh --add --allow-principal User:<name> --operation Read --group '{group}')"
        )),
        Some(ResponseError::TopicAuthorizationFailed) => Some(format!(
            "the principal may not read the subscribed topic(s) {}: grant it READ on each TOPIC (kafka-acls.sh --add --allow-principal User:<name> --operation Read --topic <topic>)",
            topics.join(", ")
        )),
        _ => None,
    };
    match (broker_message.is_empty(), advice) {
        (true, None) => String::new(),
        (true, Some(advice)) => format!(": {advice}"),
        (false, None) => format!(": {broker_message}"),
        (false, Some(advice)) => format!(": {broker_message}; {advice}"),
    }
}

/// Leave the group (epoch -1); best effort, the session timeout removes us otherwise.
async fn leave(
    state: &MemberState,
    coordinator: Option<i32>,
    link: &MembershipLink,
    group_id: &GroupId,
) {
    if state.epoch <= 0 {
        return;
    }
    let id = match coordinator {
        Some(id) => Ok(id),
        None => link.cluster.find_coordinator(&link.group).await,
    };
    let Ok(id) = id else { return };
    let Ok(conn) = link.cluster.broker(id).await else {
        return;
    };
    match conn
        .request(
            &state.leave_request(group_id),
            HEARTBEAT_VERSION,
            link.request_timeout,
        )
        .await
    {
        Ok(r) if r.error_code == 0 => debug!(member = %state.member_id, "left the share group"),
        Ok(r) => debug!(code = r.error_code, "leave heartbeat refused"),
        Err(e) => debug!(%e, "leave heartbeat failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::share_group_heartbeat_response::{
        Assignment as WireAssignment, TopicPartitions,
    };

    fn response(
        code: i16,
        epoch: i32,
        assignment: Option<Vec<(Uuid, Vec<i32>)>>,
    ) -> ShareGroupHeartbeatResponse {
        let mut r = ShareGroupHeartbeatResponse::default();
        r.error_code = code;
        r.member_epoch = epoch;
        r.heartbeat_interval_ms = 3000;
        r.assignment = assignment.map(|a| {
            let mut w = WireAssignment::default();
            w.topic_partitions = a
                .into_iter()
                .map(|(id, ps)| {
                    let mut tp = TopicPartitions::default();
                    tp.topic_id = id;
                    tp.partitions = ps;
                    tp
                })
                .collect();
            w
        });
        r
    }

    fn group() -> GroupId {
        Cluster::group_id("g")
    }

    #[test]
    fn member_ids_are_22_char_url_safe_base64_of_16_bytes() {
        let id = new_member_id();
        assert_eq!(id.len(), 22);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&id)
            .unwrap();
        assert_eq!(raw.len(), 16);
        assert_ne!(id, new_member_id());
    }

    #[test]
    fn a_join_carries_the_full_subscription_at_epoch_zero_and_later_beats_do_not() {
        let mut s = MemberState::new("m".into());
        s.subscribe(vec!["a".into(), "b".into()]);
        let join = s.request(&group());
        assert_eq!(join.member_epoch, 0);
        assert_eq!(
            join.subscribed_topic_names.as_ref().map(|v| v.len()),
            Some(2)
        );
        let out = s.on_response(
            true,
            &response(0, 2, Some(vec![(Uuid::from_u128(1), vec![0, 1])])),
        );
        assert_eq!(
            out,
            Outcome::Ok(Some(vec![(Uuid::from_u128(1), vec![0, 1])]))
        );
        assert_eq!(s.interval, Duration::from_millis(3000));
        let beat = s.request(&group());
        assert_eq!(beat.member_epoch, 2);
        assert!(beat.subscribed_topic_names.is_none());
    }

    #[test]
    fn a_null_assignment_means_unchanged() {
        let mut s = MemberState::new("m".into());
        s.subscribe(vec!["a".into()]);
        assert_eq!(
            s.on_response(true, &response(0, 3, None)),
            Outcome::Ok(None)
        );
    }

    #[test]
    fn fenced_and_unknown_members_rejoin_at_epoch_zero_with_the_same_id() {
        for code in [25, 110] {
            let mut s = MemberState::new("m".into());
            s.subscribe(vec!["a".into()]);
            s.on_response(true, &response(0, 5, None));
            assert_eq!(
                s.on_response(false, &response(code, 0, None)),
                Outcome::Rejoin
            );
            let r = s.request(&group());
            assert_eq!((r.member_epoch, r.member_id.as_str()), (0, "m"));
            assert!(r.subscribed_topic_names.is_some());
        }
    }

    #[test]
    fn coordinator_errors_keep_the_epoch_and_ask_for_a_new_coordinator() {
        let mut s = MemberState::new("m".into());
        s.subscribe(vec!["a".into()]);
        s.on_response(true, &response(0, 5, None));
        assert_eq!(
            s.on_response(false, &response(16, 0, None)),
            Outcome::FindCoordinator
        );
        assert_eq!(
            s.on_response(false, &response(15, 0, None)),
            Outcome::FindCoordinator
        );
        assert_eq!(s.on_response(false, &response(14, 0, None)), Outcome::Retry);
        assert_eq!(s.epoch, 5);
    }

    #[test]
    fn a_subscription_change_is_sent_once() {
        let mut s = MemberState::new("m".into());
        s.subscribe(vec!["a".into()]);
        s.on_response(true, &response(0, 2, None));
        s.subscribe(vec!["a".into(), "b".into()]);
        assert!(s.request(&group()).subscribed_topic_names.is_some());
        s.on_response(true, &response(0, 3, None));
        assert!(s.request(&group()).subscribed_topic_names.is_none());
    }

    #[test]
    fn after_a_lost_or_error_response_the_next_heartbeat_is_full() {
        let mut s = MemberState::new("m".into());
        s.subscribe(vec!["a".into()]);
        s.on_response(true, &response(0, 2, None));
        assert!(s.request(&group()).subscribed_topic_names.is_none());
        s.on_failure();
        let r = s.request(&group());
        assert_eq!(r.member_epoch, 2, "a retry keeps the epoch");
        assert!(r.subscribed_topic_names.is_some());
        s.on_response(true, &response(0, 2, None));
        assert!(s.request(&group()).subscribed_topic_names.is_none());
        for code in [14, 15, 16, 29, -1, 7] {
            s.on_response(false, &response(code, 0, None));
            assert!(
                s.request(&group()).subscribed_topic_names.is_some(),
                "after error {code}"
            );
            s.on_response(true, &response(0, 2, None));
        }
    }

    #[test]
    fn after_leaving_a_new_subscription_joins_at_epoch_zero() {
        let mut s = MemberState::new("m".into());
        s.subscribe(vec!["a".into()]);
        s.on_response(true, &response(0, 4, None));
        s.on_left();
        s.subscribe(vec!["b".into()]);
        let r = s.request(&group());
        assert_eq!(r.member_epoch, 0);
        assert!(r.subscribed_topic_names.is_some());
    }

    #[test]
    fn leaving_sends_epoch_minus_one() {
        let s = MemberState::new("m".into());
        assert_eq!(s.leave_request(&group()).member_epoch, -1);
    }

    #[test]
    fn group_authorization_failure_is_fatal() {
        let mut s = MemberState::new("m".into());
        assert!(matches!(
            s.on_response(false, &response(30, 0, None)),
            Outcome::Fatal(30, _)
        ));
    }

    #[test]
    fn authorization_and_version_errors_are_fatal_and_say_what_to_change() {
        let mut s = MemberState::new("m".into());
        for code in [29, 30, 35] {
            assert!(
                matches!(s.on_response(false, &response(code, 0, None)), Outcome::Fatal(c, _) if c == code),
                "{code}"
            );
        }
        let topics = vec!["orders".to_owned()];
        let detail = |code| fatal_detail(code, "", "connect-share-x", &topics);
        assert!(detail(29).contains("READ on each TOPIC") && detail(29).contains("orders"));
        assert!(detail(30).contains("READ on GROUP 'connect-share-x'"));
        assert!(detail(35).contains("Apache Kafka 4.1") && detail(35).contains("share.version"));
        assert_eq!(
            fatal_detail(24, "bad", "g", &topics),
            ": bad",
            "other errors keep the broker's message"
        );
    }
}
