//! The share session with one broker (brief §4.1, §4.2).
//!
//! A session is keyed by (group, member) on the broker; the client only tracks its epoch and
//! which partitions the broker believes are in it. Epoch 0 opens (or replaces) the session with
//! every wanted partition; each successful ShareFetch or ShareAcknowledge moves the epoch up by
//! one; any failure sends us back to 0. Fetches and acks to one broker share this sequence,
//! which is why one task per broker serialises them. Whether going back to 0 also lost the
//! records we hold depends on why ([`reset_for_error`]).

use std::collections::BTreeSet;

use super::Tp;

/// The epoch that closes a session.
pub(crate) const CLOSE_EPOCH: i32 = -1;

/// What one request changes in the session's partition set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub epoch: i32,
    /// Partitions to list in `Topics` because the session does not have them yet.
    pub adds: Vec<Tp>,
    /// Session partitions no longer wanted (`ForgottenTopicsData`). Never at epoch 0.
    pub forgets: Vec<Tp>,
}

#[derive(Debug, Default)]
pub(crate) struct ShareSession {
    epoch: i32,
    /// Bumped whenever the session is lost, so records acquired through an older session can be
    /// told apart.
    generation: u64,
    partitions: BTreeSet<Tp>,
}

impl ShareSession {
    pub fn new() -> ShareSession {
        ShareSession {
            epoch: 0,
            generation: 1,
            partitions: BTreeSet::new(),
        }
    }

    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the broker holds a session for us (acks can only ride on an open session).
    pub fn is_open(&self) -> bool {
        self.epoch > 0
    }

    pub fn partitions(&self) -> &BTreeSet<Tp> {
        &self.partitions
    }

    /// The next request's epoch and partition changes to reach `wanted`.
    pub fn plan(&self, wanted: &BTreeSet<Tp>) -> Plan {
        if self.epoch == 0 {
            return Plan {
                epoch: 0,
                adds: wanted.iter().cloned().collect(),
                forgets: Vec::new(),
            };
        }
        Plan {
            epoch: self.epoch,
            adds: wanted.difference(&self.partitions).cloned().collect(),
            forgets: self.partitions.difference(wanted).cloned().collect(),
        }
    }

    /// A request sent with `plan` succeeded (top-level error 0).
    pub fn succeeded(&mut self, plan: &Plan) {
        if plan.epoch == 0 {
            self.partitions.clear();
        }
        for tp in &plan.adds {
            self.partitions.insert(tp.clone());
        }
        for tp in &plan.forgets {
            self.partitions.remove(tp);
        }
        self.epoch = next_epoch(self.epoch);
    }

    /// A ShareAcknowledge (which never changes partitions) succeeded.
    pub fn acked(&mut self) {
        self.epoch = next_epoch(self.epoch);
    }

    /// The session is gone and the broker released what this member held through it (see
    /// [`Reset::Released`]). The next request opens a new one at epoch 0; records acquired
    /// through the old one belong to an older generation.
    pub fn reset(&mut self) {
        self.epoch = 0;
        self.partitions.clear();
        self.generation += 1;
    }

    /// The session must be opened again at epoch 0, but the broker still holds our records for
    /// this member (see [`Reset::Kept`]): they stay in this generation, so their
    /// acknowledgements go out once the new session is open.
    pub fn reopen(&mut self) {
        self.epoch = 0;
        self.partitions.clear();
    }

    /// Reopen or reset, as `cause` says.
    pub fn end(&mut self, cause: Reset) {
        match cause {
            Reset::Released => self.reset(),
            Reset::Kept => self.reopen(),
        }
    }
}

/// What the broker did with the records this member acquired through a session that a failed
/// request makes us reopen. Kafka 4.1/4.2 releases a member's acquired records only when its
/// share session is released: a ShareFetch/ShareAcknowledge at epoch -1, or the close of the
/// connection that created the session (`ShareSessionCache.ClientConnectionDisconnectListener`
/// → `SharePartitionManager.releaseSession` → `SharePartition.releaseAcquiredRecords`). An
/// epoch-0 reopen only removes the old session from the cache (`SharePartitionManager.newContext`),
/// and a request refused at the top level never reaches the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reset {
    /// Released: what we held is gone; unsent acknowledgements cannot be applied.
    Released,
    /// Still acquired by this member until their locks run out: acknowledgements stay valid and
    /// go out on the reopened session.
    Kept,
}

const SHARE_SESSION_NOT_FOUND: i16 = 122;

/// What a top-level ShareFetch/ShareAcknowledge error means for the records we hold.
///
/// - SHARE_SESSION_NOT_FOUND (122): the broker has no session for us, and on Kafka a session
///   leaves the cache only by being released (epoch -1, the creating connection closed: both
///   release the member's records) or with its share-partitions dropped (share groups switched
///   off, leadership gone: in-memory acquisitions are lost). Released.
/// - INVALID_SHARE_SESSION_EPOCH (123): thrown before the session or any record is touched;
///   the session stays as it was. Kept.
/// - SHARE_SESSION_LIMIT_REACHED (133): answers an epoch-0 open, after the old session was
///   removed without releasing anything. Kept.
/// - Anything else (authorization, UNKNOWN_TOPIC_ID, a broker-side failure): the connection
///   stays open and no release path runs. Kept.
///
/// A transport failure is not a code: our connection closed (or timed out and we closed it),
/// which on Kafka releases everything the session held, so callers use [`Reset::Released`].
pub(crate) fn reset_for_error(code: i16) -> Reset {
    if code == SHARE_SESSION_NOT_FOUND {
        Reset::Released
    } else {
        Reset::Kept
    }
}

/// +1, wrapping to 1 at `i32::MAX` (0 and -1 have their own meaning).
pub(crate) fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use uuid::Uuid;

    fn tp(p: i32) -> Tp {
        Tp {
            topic: Arc::from("t"),
            id: Uuid::from_u128(7),
            partition: p,
        }
    }

    fn set(ps: &[i32]) -> BTreeSet<Tp> {
        ps.iter().map(|p| tp(*p)).collect()
    }

    #[test]
    fn a_new_session_opens_at_epoch_zero_with_every_wanted_partition() {
        let s = ShareSession::new();
        let plan = s.plan(&set(&[0, 1]));
        assert_eq!(plan.epoch, 0);
        assert_eq!(plan.adds, vec![tp(0), tp(1)]);
        assert!(plan.forgets.is_empty());
    }

    #[test]
    fn each_success_advances_the_epoch_and_only_new_partitions_are_listed() {
        let mut s = ShareSession::new();
        let plan = s.plan(&set(&[0, 1]));
        s.succeeded(&plan);
        assert_eq!(s.epoch(), 1);
        let plan = s.plan(&set(&[0, 1, 2]));
        assert_eq!((plan.epoch, plan.adds.clone()), (1, vec![tp(2)]));
        s.succeeded(&plan);
        s.acked();
        assert_eq!(s.epoch(), 3);
        assert_eq!(s.partitions(), &set(&[0, 1, 2]));
    }

    #[test]
    fn partitions_no_longer_wanted_are_forgotten() {
        let mut s = ShareSession::new();
        s.succeeded(&s.plan(&set(&[0, 1])));
        let plan = s.plan(&set(&[1]));
        assert_eq!(plan.forgets, vec![tp(0)]);
        s.succeeded(&plan);
        assert_eq!(s.partitions(), &set(&[1]));
    }

    #[test]
    fn the_epoch_wraps_to_one_after_i32_max() {
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(5), 6);
    }

    #[test]
    fn a_reset_reopens_at_epoch_zero_in_a_new_generation() {
        let mut s = ShareSession::new();
        s.succeeded(&s.plan(&set(&[0])));
        let g = s.generation();
        s.reset();
        assert_eq!(s.epoch(), 0);
        assert!(!s.is_open());
        assert_eq!(s.generation(), g + 1);
        assert_eq!(s.plan(&set(&[0])).adds, vec![tp(0)]);
    }

    #[test]
    fn a_reopen_keeps_the_generation_so_held_records_stay_ours() {
        let mut s = ShareSession::new();
        s.succeeded(&s.plan(&set(&[0])));
        let g = s.generation();
        s.end(Reset::Kept);
        assert_eq!(s.epoch(), 0);
        assert!(!s.is_open());
        assert_eq!(
            s.generation(),
            g,
            "records acquired before the reopen are still ours"
        );
        assert_eq!(s.plan(&set(&[0])).adds, vec![tp(0)]);
        s.end(Reset::Released);
        assert_eq!(s.generation(), g + 1);
    }

    #[test]
    fn only_a_missing_session_means_the_broker_released_our_records() {
        // SHARE_SESSION_NOT_FOUND: released by an epoch -1 close or a closed connection.
        assert_eq!(reset_for_error(122), Reset::Released);
        // INVALID_SHARE_SESSION_EPOCH, SHARE_SESSION_LIMIT_REACHED, and errors that leave the
        // connection and the session alone: the broker still holds the records for us.
        for code in [123, 133, 15, 29, 30, 100, -1, 87] {
            assert_eq!(reset_for_error(code), Reset::Kept, "error {code}");
        }
    }
}
