//! Acknowledgements: which records this member holds, what the application decided for them,
//! and how those decisions go on the wire.
//!
//! The [`Ledger`] is the one place that knows, per partition, the offsets we hold (delivered
//! and not yet settled), the acknowledgements not yet sent, and the results not yet reported.
//! Every acknowledgement ends in exactly one result, reported by the next `commit_sync`:
//! applied, refused by the broker, or failed locally because its session or leader is gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{AckError, ShareError};

/// What the application decided for a record (brief §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcknowledgeType {
    /// Processed; never deliver again.
    Accept,
    /// Not processed; make it available again (counts as a delivery attempt).
    Release,
    /// Unprocessable; never deliver again.
    Reject,
}

/// Wire value of GAP: "no deliverable record at this offset". Client-internal.
pub(crate) const GAP: i8 = 0;

impl AcknowledgeType {
    pub(crate) fn wire(self) -> i8 {
        match self {
            AcknowledgeType::Accept => 1,
            AcknowledgeType::Release => 2,
            AcknowledgeType::Reject => 3,
        }
    }
}

/// One `AcknowledgementBatch`: inclusive offset range and either one type for all of it or
/// one type per offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AckBatch {
    pub first: i64,
    pub last: i64,
    pub types: Vec<i8>,
}

/// Encode sorted per-offset acks as batches: one batch per run of contiguous offsets, with a
/// single-element type array when the run is uniform. Offsets we do not ack are never covered.
pub(crate) fn encode_batches(acks: &BTreeMap<i64, i8>) -> Vec<AckBatch> {
    let mut batches = Vec::new();
    let mut iter = acks.iter().peekable();
    while let Some((&first, &kind)) = iter.next() {
        let mut last = first;
        let mut types = vec![kind];
        while let Some((&next, &next_kind)) = iter.peek() {
            if next != last + 1 {
                break;
            }
            types.push(next_kind);
            last = next;
            iter.next();
        }
        if types.iter().all(|t| *t == types[0]) {
            types.truncate(1);
        }
        batches.push(AckBatch { first, last, types });
    }
    batches
}

/// Which share session a partition's held records were acquired through. A new session (or a
/// new leader) invalidates everything acquired through the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub broker: i32,
    pub generation: u64,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    delivery_count: i16,
    /// Acknowledged by the application (or as GAP); the ack is pending or in flight.
    acked: bool,
}

#[derive(Debug, Default)]
struct PartState {
    owner: Option<Owner>,
    held: HashMap<i64, Held>,
    pending: BTreeMap<i64, i8>,
    /// Delivered records whose session or leader was lost before the application settled them.
    /// Acknowledging one is not a usage error: it is accepted and reported as this failure by
    /// the next `commit_sync`.
    lost: HashMap<i64, AckError>,
}

/// Most lost-record entries kept per partition; past this the oldest knowledge is dropped
/// (acknowledging such a record then reports "not held").
const MAX_LOST: usize = 100_000;

impl PartState {
    /// Forget what we held; records the application has not settled yet become `lost`.
    fn lose_held(&mut self, error: &AckError) {
        if self.lost.len() > MAX_LOST {
            self.lost.clear();
        }
        for (offset, held) in self.held.drain() {
            if !held.acked {
                self.lost.insert(offset, error.clone());
            }
        }
    }
}

/// Acks taken out of the ledger for one request: per partition, offset → wire type.
pub(crate) type SentAcks = Vec<(Arc<str>, i32, BTreeMap<i64, i8>)>;

/// What to do with an acquired offset found in a fetch response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// New to us: deliver it.
    Deliver,
    /// We hold it already with this delivery count: the dev broker re-sends held records
    /// (brief §8.6 #14); delivering it twice would be a duplicate.
    Duplicate,
}

/// Held records, pending acks and unreported results of one consumer.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    parts: HashMap<Arc<str>, HashMap<i32, PartState>>,
    results: HashMap<(String, i32), Result<(), AckError>>,
}

impl Ledger {
    fn part_mut(&mut self, topic: &Arc<str>, partition: i32) -> &mut PartState {
        if !self.parts.contains_key(&**topic) {
            self.parts.insert(Arc::clone(topic), HashMap::new());
        }
        self.parts
            .get_mut(&**topic)
            .map(|m| m.entry(partition).or_default())
            .unwrap_or_else(|| unreachable!("inserted just above"))
    }

    /// The application's decision for a held record. Returns the broker that must receive it.
    pub fn acknowledge(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        kind: AcknowledgeType,
    ) -> Result<i32, ShareError> {
        let not_held = || ShareError::NotHeld {
            topic: topic.to_string(),
            partition,
            offset,
        };
        let part = self
            .parts
            .get_mut(topic)
            .and_then(|m| m.get_mut(&partition))
            .ok_or_else(not_held)?;
        if let Some(error) = part.lost.remove(&offset) {
            let broker = part.owner.map(|o| o.broker).unwrap_or(-1);
            self.record(topic, partition, Err(error));
            return Ok(broker);
        }
        let owner = part.owner.ok_or_else(not_held)?;
        let held = part.held.get_mut(&offset).ok_or_else(not_held)?;
        if held.acked {
            return Err(ShareError::AlreadyAcknowledged {
                topic: topic.to_string(),
                partition,
                offset,
            });
        }
        held.acked = true;
        part.pending.insert(offset, kind.wire());
        Ok(owner.broker)
    }

    /// Make `owner` the session a partition's records come from. Records held through any other
    /// session are dropped and their unsent acks failed with `reason`.
    fn claim(&mut self, topic: &Arc<str>, partition: i32, owner: Owner) -> &mut PartState {
        let (previous, failed) = {
            let part = self.part_mut(topic, partition);
            if part.owner == Some(owner) {
                (None, false)
            } else {
                let prev = part.owner.replace(owner);
                let error = prev.map(|prev| {
                    if prev.broker == owner.broker {
                        AckError::SessionLost {
                            broker: prev.broker,
                            topic: topic.to_string(),
                            partition,
                            reason: "a new session replaced it".to_string(),
                        }
                    } else {
                        AckError::LeaderMoved {
                            from: prev.broker,
                            topic: topic.to_string(),
                            partition,
                        }
                    }
                });
                match &error {
                    Some(e) => part.lose_held(e),
                    None => part.held.clear(),
                }
                let had_pending = !part.pending.is_empty();
                part.pending.clear();
                (error, had_pending)
            }
        };
        if let (Some(error), true) = (previous, failed) {
            self.record(topic, partition, Err(error));
        }
        self.part_mut(topic, partition)
    }

    /// Register an offset acquired through `owner` with `delivery_count`.
    pub fn acquire(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        owner: Owner,
        offset: i64,
        delivery_count: i16,
    ) -> Acquire {
        let part = self.claim(topic, partition, owner);
        part.lost.remove(&offset);
        match part.held.get_mut(&offset) {
            Some(held) if held.delivery_count >= delivery_count => Acquire::Duplicate,
            Some(held) => {
                // Re-acquired after its lock ran out: a genuine redelivery.
                held.delivery_count = delivery_count;
                held.acked = false;
                part.pending.remove(&offset);
                Acquire::Deliver
            }
            None => {
                part.held.insert(
                    offset,
                    Held {
                        delivery_count,
                        acked: false,
                    },
                );
                Acquire::Deliver
            }
        }
    }

    /// Hold `offset` and queue an automatic acknowledgement of `kind` (GAP for offsets without
    /// a deliverable record, REJECT for undecodable ones), unless it is already held.
    pub fn auto_ack(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        owner: Owner,
        offset: i64,
        delivery_count: i16,
        kind: i8,
    ) {
        let part = self.claim(topic, partition, owner);
        if part.held.contains_key(&offset) {
            return;
        }
        part.held.insert(
            offset,
            Held {
                delivery_count,
                acked: true,
            },
        );
        part.pending.insert(offset, kind);
    }

    /// Take every unsent ack for partitions held through `broker`'s current session.
    pub fn take_pending(&mut self, broker: i32, generation: u64) -> SentAcks {
        let owner = Owner { broker, generation };
        let mut out = Vec::new();
        for (topic, parts) in self.parts.iter_mut() {
            for (&partition, part) in parts.iter_mut() {
                if part.owner == Some(owner) && !part.pending.is_empty() {
                    out.push((
                        Arc::clone(topic),
                        partition,
                        std::mem::take(&mut part.pending),
                    ));
                }
            }
        }
        out
    }

    /// Whether acks made for records acquired through `broker` (any session) are still waiting
    /// to be sent or confirmed: only such brokers need a flush for `commit_sync`.
    pub fn awaits_confirmation(&self, broker: i32) -> bool {
        self.parts.values().flat_map(|m| m.values()).any(|p| {
            p.owner.is_some_and(|o| o.broker == broker)
                && (!p.pending.is_empty() || p.held.values().any(|h| h.acked))
        })
    }

    /// Whether `broker`'s session has acks waiting to be sent.
    pub fn has_pending(&self, broker: i32, generation: u64) -> bool {
        let owner = Some(Owner { broker, generation });
        self.parts
            .values()
            .flat_map(|m| m.values())
            .any(|p| p.owner == owner && !p.pending.is_empty())
    }

    /// Whether `broker`'s current session holds records of this partition that the application
    /// has not settled yet (delivered, or waiting in the consumer's buffer, and not acknowledged).
    pub fn holds_unsettled(
        &self,
        broker: i32,
        generation: u64,
        topic: &str,
        partition: i32,
    ) -> bool {
        let owner = Some(Owner { broker, generation });
        self.parts
            .get(topic)
            .and_then(|m| m.get(&partition))
            .is_some_and(|p| p.owner == owner && p.held.values().any(|h| !h.acked))
    }

    /// The outcome of acks that were sent: the records are settled either way (an ack the
    /// broker refused means the record is no longer ours).
    pub fn complete(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        acks: &BTreeMap<i64, i8>,
        result: Result<(), AckError>,
    ) {
        if let Some(part) = self
            .parts
            .get_mut(&**topic)
            .and_then(|m| m.get_mut(&partition))
        {
            for offset in acks.keys() {
                if part.held.get(offset).is_some_and(|h| h.acked) {
                    part.held.remove(offset);
                }
            }
        }
        self.record(topic, partition, result);
    }

    /// Drop everything held through `broker` (optionally only for one partition): the session
    /// or the leadership is gone, so the broker has released (or will release) those records.
    /// Unsent acks fail with `error(topic, partition)`.
    pub fn invalidate(
        &mut self,
        broker: i32,
        only: Option<(&str, i32)>,
        error: impl Fn(&str, i32) -> AckError,
    ) {
        let mut failed = Vec::new();
        for (topic, parts) in self.parts.iter_mut() {
            for (&partition, part) in parts.iter_mut() {
                if part.owner.map(|o| o.broker) != Some(broker) {
                    continue;
                }
                if let Some((t, p)) = only {
                    if &**topic != t || partition != p {
                        continue;
                    }
                }
                let err = error(topic, partition);
                part.owner = None;
                part.lose_held(&err);
                if !std::mem::take(&mut part.pending).is_empty() {
                    failed.push((Arc::clone(topic), partition, err));
                }
            }
        }
        for (topic, partition, err) in failed {
            self.record(&topic, partition, Err(err));
        }
    }

    /// Remember one result for the next `commit_sync`. A failure is never overwritten by a
    /// later success of the same partition.
    pub fn record(&mut self, topic: &str, partition: i32, result: Result<(), AckError>) {
        let entry = self
            .results
            .entry((topic.to_string(), partition))
            .or_insert(Ok(()));
        if entry.is_ok() {
            *entry = result;
        }
    }

    /// Hand over all results recorded so far.
    pub fn take_results(&mut self) -> HashMap<(String, i32), Result<(), AckError>> {
        std::mem::take(&mut self.results)
    }

    /// Partitions with acks not yet sent.
    pub fn pending_partitions(&self) -> Vec<(String, i32)> {
        self.parts
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .filter(|(_, p)| !p.pending.is_empty())
                    .map(move |(p, _)| (t.to_string(), *p))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acks(pairs: &[(i64, i8)]) -> BTreeMap<i64, i8> {
        pairs.iter().copied().collect()
    }

    const OWNER: Owner = Owner {
        broker: 1,
        generation: 1,
    };

    #[test]
    fn a_uniform_contiguous_run_is_one_batch_with_one_type() {
        let map: BTreeMap<i64, i8> = (100..200).map(|o| (o, 1)).collect();
        assert_eq!(
            encode_batches(&map),
            vec![AckBatch {
                first: 100,
                last: 199,
                types: vec![1]
            }]
        );
    }

    #[test]
    fn a_mixed_contiguous_run_carries_one_type_per_offset() {
        assert_eq!(
            encode_batches(&acks(&[(100, 1), (101, 0), (102, 2)])),
            vec![AckBatch {
                first: 100,
                last: 102,
                types: vec![1, 0, 2]
            }]
        );
    }

    #[test]
    fn offsets_not_acknowledged_are_never_covered_by_a_batch() {
        assert_eq!(
            encode_batches(&acks(&[(100, 1), (105, 1), (106, 3)])),
            vec![
                AckBatch {
                    first: 100,
                    last: 100,
                    types: vec![1]
                },
                AckBatch {
                    first: 105,
                    last: 106,
                    types: vec![1, 3]
                },
            ]
        );
    }

    #[test]
    fn acknowledging_a_record_that_was_never_delivered_names_it() {
        let mut ledger = Ledger::default();
        let err = ledger
            .acknowledge("t", 3, 42, AcknowledgeType::Accept)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "record t-3@42 is not held by this consumer (never delivered, already acknowledged, or its session or leader was lost)"
        );
    }

    #[test]
    fn a_record_can_be_acknowledged_once() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        assert_eq!(ledger.acquire(&t, 0, OWNER, 7, 1), Acquire::Deliver);
        assert_eq!(
            ledger
                .acknowledge("t", 0, 7, AcknowledgeType::Release)
                .unwrap(),
            1
        );
        assert!(matches!(
            ledger.acknowledge("t", 0, 7, AcknowledgeType::Accept),
            Err(ShareError::AlreadyAcknowledged { offset: 7, .. })
        ));
    }

    #[test]
    fn a_held_record_sent_again_with_the_same_delivery_count_is_a_duplicate() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        assert_eq!(ledger.acquire(&t, 0, OWNER, 7, 1), Acquire::Deliver);
        assert_eq!(ledger.acquire(&t, 0, OWNER, 7, 1), Acquire::Duplicate);
        assert_eq!(ledger.acquire(&t, 0, OWNER, 7, 2), Acquire::Deliver);
    }

    #[test]
    fn a_settled_record_acquired_again_is_delivered_again() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.acquire(&t, 0, OWNER, 7, 1);
        ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Release)
            .unwrap();
        let sent = ledger.take_pending(1, 1);
        assert_eq!(sent.len(), 1);
        ledger.complete(&t, 0, &sent[0].2, Ok(()));
        assert_eq!(ledger.acquire(&t, 0, OWNER, 7, 2), Acquire::Deliver);
        assert_eq!(ledger.take_results()[&("t".to_string(), 0)], Ok(()));
    }

    #[test]
    fn acks_of_a_lost_session_are_reported_as_failed() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.acquire(&t, 0, OWNER, 7, 1);
        ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .unwrap();
        ledger.invalidate(1, None, |topic, partition| AckError::SessionLost {
            broker: 1,
            topic: topic.to_string(),
            partition,
            reason: "test".into(),
        });
        assert!(!ledger.has_pending(1, 1));
        assert!(matches!(
            ledger.take_results()[&("t".to_string(), 0)],
            Err(AckError::SessionLost { broker: 1, .. })
        ));
        assert!(ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .is_err());
    }

    #[test]
    fn acknowledging_a_record_whose_session_was_lost_is_reported_as_failed_at_commit() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.acquire(&t, 0, OWNER, 7, 1);
        ledger.invalidate(1, None, |topic, partition| AckError::LeaderMoved {
            from: 1,
            topic: topic.to_string(),
            partition,
        });
        assert!(ledger.take_results().is_empty());
        ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .unwrap();
        assert!(matches!(
            ledger.take_results()[&("t".to_string(), 0)],
            Err(AckError::LeaderMoved { from: 1, .. })
        ));
        // Only once: a second acknowledgement is a usage error again.
        assert!(ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .is_err());
    }

    #[test]
    fn records_acquired_through_a_new_leader_fail_the_old_leaders_unsent_acks() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.acquire(&t, 0, OWNER, 7, 1);
        ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .unwrap();
        let other = Owner {
            broker: 2,
            generation: 1,
        };
        assert_eq!(ledger.acquire(&t, 0, other, 7, 1), Acquire::Deliver);
        assert!(matches!(
            ledger.take_results()[&("t".to_string(), 0)],
            Err(AckError::LeaderMoved { from: 1, .. })
        ));
    }

    #[test]
    fn a_failure_is_not_hidden_by_a_later_success() {
        let mut ledger = Ledger::default();
        ledger.record(
            "t",
            0,
            Err(AckError::LeaderMoved {
                from: 1,
                topic: "t".into(),
                partition: 0,
            }),
        );
        ledger.record("t", 0, Ok(()));
        assert!(ledger.take_results()[&("t".to_string(), 0)].is_err());
    }

    #[test]
    fn only_delivered_records_not_yet_acknowledged_are_unsettled() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.auto_ack(&t, 0, OWNER, 6, 1, GAP);
        assert!(!ledger.holds_unsettled(1, 1, "t", 0));
        ledger.acquire(&t, 0, OWNER, 7, 1);
        assert!(ledger.holds_unsettled(1, 1, "t", 0));
        assert!(
            !ledger.holds_unsettled(1, 2, "t", 0),
            "another session's records"
        );
        assert!(!ledger.holds_unsettled(1, 1, "t", 1));
        ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .unwrap();
        assert!(!ledger.holds_unsettled(1, 1, "t", 0));
    }

    #[test]
    fn gap_acks_are_queued_for_the_owning_session() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.auto_ack(&t, 0, OWNER, 9, 1, GAP);
        assert!(ledger.has_pending(1, 1));
        let sent = ledger.take_pending(1, 1);
        assert_eq!(sent[0].2, acks(&[(9, GAP)]));
        assert!(ledger.take_pending(1, 1).is_empty());
    }

    #[test]
    fn a_broker_awaits_confirmation_from_the_ack_until_its_response() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        ledger.acquire(&t, 0, OWNER, 7, 1);
        assert!(
            !ledger.awaits_confirmation(1),
            "a held record without an ack has nothing to commit"
        );
        ledger
            .acknowledge("t", 0, 7, AcknowledgeType::Accept)
            .unwrap();
        assert!(ledger.awaits_confirmation(1), "pending ack");
        assert!(!ledger.awaits_confirmation(2), "another broker");
        let sent = ledger.take_pending(1, 1);
        assert!(ledger.awaits_confirmation(1), "ack in flight");
        ledger.complete(&t, 0, &sent[0].2, Ok(()));
        assert!(!ledger.awaits_confirmation(1), "ack confirmed");
    }
}
