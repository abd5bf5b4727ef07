//! The share session with one broker (brief §4.1, §4.2).
//!
//! A session is keyed by (group, member) on the broker; the client only tracks its epoch and
//! which partitions the broker believes are in it. Epoch 0 opens (or replaces) the session with
//! every wanted partition; each successful ShareFetch or ShareAcknowledge moves the epoch up by
//! one; any failure sends us back to 0. Fetches and acks to one broker share this sequence,
//! which is why one task per broker serialises them.

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

    /// The session is gone: SHARE_SESSION_NOT_FOUND (122), INVALID_SHARE_SESSION_EPOCH (123),
    /// SHARE_SESSION_LIMIT_REACHED (133), any other top-level error (the broker may not have
    /// advanced its epoch), a transport failure, or our own close.
    /// The next request opens a new one at epoch 0.
    pub fn reset(&mut self) {
        self.epoch = 0;
        self.partitions.clear();
        self.generation += 1;
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
}
