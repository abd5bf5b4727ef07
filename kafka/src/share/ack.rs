//! Acknowledgements: which records this member holds, what the application decided for them,
//! and how those decisions go on the wire.
//!
//! The [`Ledger`] is the one place that knows, per partition, the offsets we hold (delivered
//! and not yet settled), the acknowledgements not yet sent, and the results not yet reported.
//! Every acknowledgement ends in exactly one result, reported by the next `commit_sync`:
//! applied, refused by the broker, or failed locally because its session or leader is gone.

use std::collections::HashMap;
use std::sync::Arc;

// Offsets and partition numbers are hashed for every record held: FxHash, not SipHash (no
// key here comes from an untrusted party choosing collisions).
use rustc_hash::FxHashMap;

use uuid::Uuid;

pub(crate) use super::held::AckList;
use super::held::{Held, HeldRecords, Settlement};
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
pub(crate) fn encode_batches(acks: &AckList) -> Vec<AckBatch> {
    let mut batches = Vec::new();
    let mut iter = acks.iter().peekable();
    while let Some((first, kind)) = iter.next() {
        let mut last = first;
        let mut types = vec![kind];
        while let Some(&(next, next_kind)) = iter.peek() {
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

/// How a producer transaction that carried acknowledgements ended (KIP-1289).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionOutcome {
    /// Committed: the broker settles the records (ACCEPT → acknowledged, REJECT → archived).
    Committed,
    /// Aborted. `staged_on_broker` says whether the broker accepted the acknowledgements into
    /// the transaction: then the abort marker makes the records available again by itself;
    /// if not, the broker still holds them for this member and the consumer releases them.
    Aborted { staged_on_broker: bool },
    /// The transaction produced nothing, so there is no output to make atomic with the
    /// acknowledgements: they are sent the normal way (ShareFetch/ShareAcknowledge).
    NoOutput,
}

/// The identity a transaction presents so the broker can fence a stale member (KIP-1289
/// draft: `ShareConsumer.shareGroupMetadata()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupMetadata {
    pub group_id: String,
    pub member_id: String,
    /// The epoch from the latest heartbeat; 0 before the member joined.
    pub member_epoch: i32,
}

/// One acknowledgement batch of a transaction: the inclusive offset range and either one wire
/// type for the whole range or one per offset (1 = ACCEPT, 3 = REJECT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcknowledgementBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub types: Vec<i8>,
}

/// The acknowledgements of one partition taken for a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAcknowledgements {
    pub topic: Arc<str>,
    /// The id the share protocol names the topic by.
    pub topic_id: Uuid,
    pub partition: i32,
    pub batches: Vec<AcknowledgementBatch>,
}

/// Acknowledgements taken out of a [`super::ShareConsumer`] to be applied by a producer
/// transaction instead of ShareFetch/ShareAcknowledge, per partition in topic/partition order
/// (KIP-1289 draft: `ShareConsumer.acknowledgementsForTransaction()`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransactionAcknowledgements {
    pub partitions: Vec<PartitionAcknowledgements>,
}

impl TransactionAcknowledgements {
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// How many records these acknowledgements settle.
    pub fn record_count(&self) -> u64 {
        self.partitions
            .iter()
            .flat_map(|p| &p.batches)
            .map(|b| (b.last_offset - b.first_offset + 1).max(0) as u64)
            .sum()
    }
}

/// Which share session a partition's held records were acquired through. A new generation (the
/// broker released what the old session held) or a new leader invalidates everything acquired
/// through the old one; a session merely reopened keeps its generation, and its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub broker: i32,
    pub generation: u64,
}

/// What the ledger knows of one partition.
#[derive(Debug, Default)]
pub(crate) struct PartState {
    owner: Option<Owner>,
    /// Per acquired range, not per offset (`super::held`).
    held: HeldRecords,
    pending: AckList,
    /// Acks made for a producer transaction and not taken yet: offset → wire type.
    staged: AckList,
    /// Delivered records whose session or leader was lost before the application settled them.
    /// Acknowledging one is not a usage error: it is accepted and reported as this failure by
    /// the next `commit_sync`.
    lost: FxHashMap<i64, AckError>,
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
        for (offset, held) in self.held.iter() {
            if !held.is_settled() {
                self.lost.insert(offset, error.clone());
            }
        }
        self.held.clear();
    }

    /// Register an offset acquired (through the partition's owner) with `delivery_count`.
    pub fn acquire(&mut self, offset: i64, delivery_count: i16) -> Acquire {
        if !self.lost.is_empty() {
            self.lost.remove(&offset);
        }
        match self.held.get(offset) {
            Some(held) if held.delivery_count >= delivery_count => Acquire::Duplicate,
            Some(_) => {
                // Re-acquired after its lock ran out: a genuine redelivery.
                self.held.insert(
                    offset,
                    Held {
                        delivery_count,
                        settlement: Settlement::Unsettled,
                    },
                );
                self.pending.remove(offset);
                self.staged.remove(offset);
                Acquire::Deliver
            }
            None => {
                self.held.insert(
                    offset,
                    Held {
                        delivery_count,
                        settlement: Settlement::Unsettled,
                    },
                );
                Acquire::Deliver
            }
        }
    }

    /// Hold `offset` and queue an automatic acknowledgement of `kind` (GAP for offsets without
    /// a deliverable record, REJECT for undecodable ones), unless it is already held.
    pub fn auto_ack(&mut self, offset: i64, delivery_count: i16, kind: i8) {
        if self.held.contains(offset) {
            return;
        }
        self.held.insert(
            offset,
            Held {
                delivery_count,
                settlement: Settlement::Acked,
            },
        );
        self.pending.insert(offset, kind);
    }
}

/// Acks taken out of the ledger for one request: per partition, offset → wire type.
pub(crate) type SentAcks = Vec<(Arc<str>, i32, AckList)>;

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
    parts: FxHashMap<Arc<str>, FxHashMap<i32, PartState>>,
    results: HashMap<(String, i32), Result<(), AckError>>,
}

impl Ledger {
    fn part_mut(&mut self, topic: &Arc<str>, partition: i32) -> &mut PartState {
        if !self.parts.contains_key(&**topic) {
            self.parts.insert(Arc::clone(topic), FxHashMap::default());
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
        let held = part.held.get(offset).ok_or_else(not_held)?;
        if held.is_settled() {
            return Err(ShareError::AlreadyAcknowledged {
                topic: topic.to_string(),
                partition,
                offset,
            });
        }
        part.held.settle(offset, Settlement::Acked);
        part.pending.insert(offset, kind.wire());
        Ok(owner.broker)
    }

    /// The application's decision for a held record, to be applied by a producer transaction
    /// (KIP-1289) instead of ShareFetch/ShareAcknowledge. Only ACCEPT and REJECT are allowed:
    /// a RELEASE means "not processed", which a transaction has nothing to make atomic with.
    pub fn acknowledge_for_transaction(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        kind: AcknowledgeType,
    ) -> Result<(), ShareError> {
        let refuse = |reason: String| ShareError::TransactionAck {
            topic: topic.to_string(),
            partition,
            offset,
            reason,
        };
        if kind == AcknowledgeType::Release {
            return Err(refuse(
                "RELEASE cannot be part of a transaction (only ACCEPT and REJECT can); \
                 acknowledge the record with acknowledge(record, Release), which sends it the \
                 normal way"
                    .to_string(),
            ));
        }
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
        if let Some(error) = part.lost.get(&offset) {
            return Err(refuse(format!("{error}; leave it out of the transaction")));
        }
        if part.owner.is_none() {
            return Err(not_held());
        }
        let held = part.held.get(offset).ok_or_else(not_held)?;
        if held.is_settled() {
            return Err(ShareError::AlreadyAcknowledged {
                topic: topic.to_string(),
                partition,
                offset,
            });
        }
        part.held.settle(offset, Settlement::Staged);
        part.staged.insert(offset, kind.wire());
        Ok(())
    }

    /// Withdraw every ack staged for a transaction and not taken yet: the transaction they
    /// were meant for is aborted, so the records are RELEASEd the normal way and come back.
    pub fn release_staged(&mut self) {
        for part in self.parts.values_mut().flat_map(|m| m.values_mut()) {
            for (offset, _) in std::mem::take(&mut part.staged) {
                part.held.settle(offset, Settlement::Acked);
                part.pending.insert(offset, AcknowledgeType::Release.wire());
            }
        }
    }

    /// Topics with acks staged for a transaction (so their ids can be resolved before
    /// [`Ledger::take_for_transaction`] takes anything).
    pub fn staged_topics(&self) -> Vec<Arc<str>> {
        self.parts
            .iter()
            .filter(|(_, m)| m.values().any(|p| !p.staged.is_empty()))
            .map(|(t, _)| Arc::clone(t))
            .collect()
    }

    /// Take every ack staged for a transaction, sorted by topic and partition. From here on
    /// those records are settled by the transaction: nothing about them goes out through
    /// ShareFetch/ShareAcknowledge until [`Ledger::finish_transaction`] says otherwise.
    pub fn take_for_transaction(&mut self) -> Vec<(Arc<str>, i32, Vec<AckBatch>)> {
        let mut out = Vec::new();
        for (topic, parts) in self.parts.iter_mut() {
            for (&partition, part) in parts.iter_mut() {
                if part.staged.is_empty() {
                    continue;
                }
                let staged = std::mem::take(&mut part.staged);
                for offset in staged.offsets() {
                    part.held.settle(offset, Settlement::InTransaction);
                }
                out.push((Arc::clone(topic), partition, encode_batches(&staged)));
            }
        }
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        out
    }

    /// Settle records taken into a transaction by its outcome. Only records still in that
    /// transaction are touched: one whose lock expired and that was delivered again since is
    /// a new delivery and stays as it is.
    pub fn finish_transaction(
        &mut self,
        topic: &str,
        partition: i32,
        batches: &[AckBatch],
        outcome: TransactionOutcome,
    ) {
        let Some(part) = self
            .parts
            .get_mut(topic)
            .and_then(|m| m.get_mut(&partition))
        else {
            return;
        };
        for batch in batches {
            for offset in batch.first..=batch.last {
                let in_transaction = part
                    .held
                    .get(offset)
                    .is_some_and(|h| h.settlement == Settlement::InTransaction);
                if !in_transaction {
                    continue;
                }
                match outcome {
                    TransactionOutcome::NoOutput => {
                        let at = (offset - batch.first) as usize;
                        let kind = batch.types.get(at).or(batch.types.first());
                        if let Some(&kind) = kind {
                            if part.held.settle(offset, Settlement::Acked) {
                                part.pending.insert(offset, kind);
                            }
                        }
                    }
                    TransactionOutcome::Committed
                    | TransactionOutcome::Aborted {
                        staged_on_broker: true,
                    } => {
                        part.held.remove(offset);
                    }
                    TransactionOutcome::Aborted {
                        staged_on_broker: false,
                    } => {
                        // The broker never saw these acks, so it still holds the records
                        // for us: release them now rather than waiting out their locks.
                        part.held.settle(offset, Settlement::Acked);
                        part.pending.insert(offset, AcknowledgeType::Release.wire());
                    }
                }
            }
        }
    }

    /// Make `owner` the session a partition's records come from. Records held through any other
    /// session are dropped and their unsent acks failed with `reason`.
    pub(crate) fn claim(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        owner: Owner,
    ) -> &mut PartState {
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
                let had_pending = !part.pending.is_empty() || !part.staged.is_empty();
                part.pending.clear();
                part.staged.clear();
                (error, had_pending)
            }
        };
        if let (Some(error), true) = (previous, failed) {
            self.record(topic, partition, Err(error));
        }
        self.part_mut(topic, partition)
    }

    /// Register an offset acquired through `owner` with `delivery_count`.
    #[cfg(test)]
    pub fn acquire(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        owner: Owner,
        offset: i64,
        delivery_count: i16,
    ) -> Acquire {
        self.claim(topic, partition, owner)
            .acquire(offset, delivery_count)
    }

    /// Hold `offset` and queue an automatic acknowledgement of `kind` (GAP for offsets without
    /// a deliverable record, REJECT for undecodable ones), unless it is already held.
    #[cfg(test)]
    pub fn auto_ack(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        owner: Owner,
        offset: i64,
        delivery_count: i16,
        kind: i8,
    ) {
        self.claim(topic, partition, owner)
            .auto_ack(offset, delivery_count, kind)
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
                && (!p.pending.is_empty() || p.held.any_acked())
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
    /// How many records acquired through `broker` the application has not acknowledged yet
    /// (delivered, or still waiting to be polled).
    pub fn unsettled_held(&self, broker: i32) -> usize {
        self.parts
            .values()
            .flat_map(|m| m.values())
            .filter(|p| p.owner.is_some_and(|o| o.broker == broker))
            .map(|p| p.held.unsettled())
            .sum()
    }

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
            .is_some_and(|p| p.owner == owner && p.held.unsettled() > 0)
    }

    /// The outcome of acks that were sent: the records are settled either way (an ack the
    /// broker refused means the record is no longer ours).
    pub fn complete(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        acks: &AckList,
        result: Result<(), AckError>,
    ) {
        if let Some(part) = self
            .parts
            .get_mut(&**topic)
            .and_then(|m| m.get_mut(&partition))
        {
            for offset in acks.offsets() {
                if part
                    .held
                    .get(offset)
                    .is_some_and(|h| h.settlement == Settlement::Acked)
                {
                    part.held.remove(offset);
                }
            }
        }
        self.record(topic, partition, result);
    }

    /// Acks the broker answered with a retriable error (it applied none of them: Kafka's
    /// acknowledgement is all-or-nothing per partition): send them again. Nothing is settled or
    /// reported yet. Acks of a partition that changed hands meanwhile are dropped; the
    /// invalidation that took it reported them.
    pub fn requeue(&mut self, topic: &Arc<str>, partition: i32, acks: &AckList) {
        if let Some(part) = self
            .parts
            .get_mut(&**topic)
            .and_then(|m| m.get_mut(&partition))
        {
            if part.owner.is_none() {
                return;
            }
            for (offset, kind) in acks.iter() {
                part.pending.insert_if_absent(offset, kind);
            }
        }
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
                let had_staged = !std::mem::take(&mut part.staged).is_empty();
                if !std::mem::take(&mut part.pending).is_empty() || had_staged {
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

    fn acks(pairs: &[(i64, i8)]) -> AckList {
        pairs.iter().copied().collect()
    }

    const OWNER: Owner = Owner {
        broker: 1,
        generation: 1,
    };

    #[test]
    fn unsettled_records_are_counted_per_broker_until_acknowledged() {
        let mut ledger = Ledger::default();
        let topic: Arc<str> = Arc::from("t");
        let other = Owner {
            broker: 2,
            generation: 1,
        };
        for offset in 0..3 {
            ledger.acquire(&topic, 0, OWNER, offset, 1);
        }
        ledger.acquire(&topic, 1, other, 7, 1);
        assert_eq!(ledger.unsettled_held(1), 3);
        assert_eq!(ledger.unsettled_held(2), 1);
        ledger
            .acknowledge("t", 0, 0, AcknowledgeType::Accept)
            .expect("held");
        ledger
            .acknowledge("t", 0, 1, AcknowledgeType::Release)
            .expect("held");
        assert_eq!(ledger.unsettled_held(1), 1, "acked records no longer count");
        ledger
            .acknowledge_for_transaction("t", 0, 2, AcknowledgeType::Accept)
            .expect("held");
        assert_eq!(
            ledger.unsettled_held(1),
            0,
            "staged for a transaction is settled"
        );
        assert_eq!(ledger.unsettled_held(2), 1);
        assert_eq!(ledger.unsettled_held(3), 0);
    }

    #[test]
    fn decisions_inside_an_acquired_range_are_kept_per_offset() {
        let (mut ledger, t) = held_ledger(100..=109);
        ledger
            .acknowledge("t", 0, 103, AcknowledgeType::Release)
            .unwrap();
        ledger
            .acknowledge("t", 0, 104, AcknowledgeType::Reject)
            .unwrap();
        for offset in [100, 101, 102, 105] {
            ledger
                .acknowledge("t", 0, offset, AcknowledgeType::Accept)
                .unwrap();
        }
        assert_eq!(ledger.unsettled_held(1), 4);
        assert!(ledger.holds_unsettled(1, 1, "t", 0));
        let sent = ledger.take_pending(1, 1);
        assert_eq!(
            encode_batches(&sent[0].2),
            vec![AckBatch {
                first: 100,
                last: 105,
                types: vec![1, 1, 1, 2, 3, 1]
            }]
        );
        ledger.complete(&t, 0, &sent[0].2, Ok(()));
        assert!(!ledger.awaits_confirmation(1));
        // The rest of the range is still held, and only once.
        for offset in 106..=109 {
            assert_eq!(ledger.acquire(&t, 0, OWNER, offset, 1), Acquire::Duplicate);
        }
        assert!(matches!(
            ledger.acknowledge("t", 0, 103, AcknowledgeType::Accept),
            Err(ShareError::NotHeld { offset: 103, .. })
        ));
        assert_eq!(ledger.unsettled_held(1), 4);
    }

    #[test]
    fn gaps_inside_a_range_are_acknowledged_as_gap_around_the_records() {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        for offset in 0..10 {
            if (3..=5).contains(&offset) {
                ledger.auto_ack(&t, 0, OWNER, offset, 1, GAP);
            } else {
                ledger.acquire(&t, 0, OWNER, offset, 1);
            }
        }
        assert_eq!(ledger.unsettled_held(1), 7);
        for offset in [0, 1, 2, 6, 7] {
            ledger
                .acknowledge("t", 0, offset, AcknowledgeType::Accept)
                .unwrap();
        }
        assert!(matches!(
            ledger.acknowledge("t", 0, 4, AcknowledgeType::Accept),
            Err(ShareError::AlreadyAcknowledged { offset: 4, .. })
        ));
        let sent = ledger.take_pending(1, 1);
        assert_eq!(
            encode_batches(&sent[0].2),
            vec![AckBatch {
                first: 0,
                last: 7,
                types: vec![1, 1, 1, GAP, GAP, GAP, 1, 1]
            }]
        );
        ledger.complete(&t, 0, &sent[0].2, Ok(()));
        assert_eq!(ledger.unsettled_held(1), 2, "8 and 9");
        assert!(ledger.holds_unsettled(1, 1, "t", 0));
    }

    #[test]
    fn a_record_inside_a_range_delivered_again_after_its_lock_ran_out_is_held_anew() {
        let (mut ledger, t) = held_ledger(0..=4);
        ledger
            .acknowledge("t", 0, 2, AcknowledgeType::Accept)
            .unwrap();
        // Its lock ran out before the ack went: the broker delivers it again.
        assert_eq!(ledger.acquire(&t, 0, OWNER, 2, 2), Acquire::Deliver);
        assert!(
            ledger.take_pending(1, 1).is_empty(),
            "the stale ack is withdrawn"
        );
        assert!(!ledger.awaits_confirmation(1));
        assert_eq!(ledger.unsettled_held(1), 5);
        assert_eq!(ledger.acquire(&t, 0, OWNER, 2, 2), Acquire::Duplicate);
        ledger
            .acknowledge("t", 0, 2, AcknowledgeType::Accept)
            .unwrap();
        assert_eq!(ledger.take_pending(1, 1)[0].2, acks(&[(2, 1)]));
    }

    #[test]
    fn out_of_order_settlements_are_sent_in_offset_order_and_settle_the_range() {
        let (mut ledger, t) = held_ledger(0..=9);
        for offset in [9, 2, 5, 0, 7] {
            ledger
                .acknowledge("t", 0, offset, AcknowledgeType::Accept)
                .unwrap();
        }
        let first = ledger.take_pending(1, 1);
        assert_eq!(first[0].2, acks(&[(0, 1), (2, 1), (5, 1), (7, 1), (9, 1)]));
        for offset in [8, 1, 6, 3, 4] {
            ledger
                .acknowledge("t", 0, offset, AcknowledgeType::Reject)
                .unwrap();
        }
        let second = ledger.take_pending(1, 1);
        assert_eq!(
            encode_batches(&second[0].2),
            vec![
                AckBatch {
                    first: 1,
                    last: 1,
                    types: vec![3]
                },
                AckBatch {
                    first: 3,
                    last: 4,
                    types: vec![3]
                },
                AckBatch {
                    first: 6,
                    last: 6,
                    types: vec![3]
                },
                AckBatch {
                    first: 8,
                    last: 8,
                    types: vec![3]
                },
            ]
        );
        // Confirmed out of order too.
        ledger.complete(&t, 0, &second[0].2, Ok(()));
        assert!(
            ledger.awaits_confirmation(1),
            "the first acks are in flight"
        );
        ledger.complete(&t, 0, &first[0].2, Ok(()));
        assert!(!ledger.awaits_confirmation(1));
        assert_eq!(ledger.unsettled_held(1), 0);
        assert_eq!(ledger.acquire(&t, 0, OWNER, 4, 2), Acquire::Deliver);
    }

    #[test]
    fn a_uniform_contiguous_run_is_one_batch_with_one_type() {
        let map: AckList = (100..200).map(|o| (o, 1)).collect();
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
    fn held_ledger(offsets: std::ops::RangeInclusive<i64>) -> (Ledger, Arc<str>) {
        let mut ledger = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        for offset in offsets {
            assert_eq!(ledger.acquire(&t, 0, OWNER, offset, 1), Acquire::Deliver);
        }
        (ledger, t)
    }

    fn stage(ledger: &mut Ledger, offsets: &[i64], kind: AcknowledgeType) {
        for &offset in offsets {
            ledger
                .acknowledge_for_transaction("t", 0, offset, kind)
                .unwrap_or_else(|e| panic!("staging {offset}: {e}"));
        }
    }

    #[test]
    fn acks_for_a_transaction_are_batched_per_partition_and_never_sent_the_normal_way() {
        let (mut ledger, t) = held_ledger(10..=20);
        ledger.acquire(&t, 1, OWNER, 5, 1);
        stage(&mut ledger, &[10, 11, 12], AcknowledgeType::Accept);
        stage(&mut ledger, &[13], AcknowledgeType::Reject);
        stage(&mut ledger, &[15, 16], AcknowledgeType::Accept);
        ledger
            .acknowledge_for_transaction("t", 1, 5, AcknowledgeType::Reject)
            .unwrap();
        assert!(!ledger.has_pending(1, 1), "staged acks are not pending");
        assert!(ledger.take_pending(1, 1).is_empty());
        assert!(
            !ledger.awaits_confirmation(1),
            "commit_sync has nothing to flush for staged acks"
        );
        let taken = ledger.take_for_transaction();
        assert_eq!(
            taken,
            vec![
                (
                    Arc::clone(&t),
                    0,
                    vec![
                        AckBatch {
                            first: 10,
                            last: 13,
                            types: vec![1, 1, 1, 3]
                        },
                        AckBatch {
                            first: 15,
                            last: 16,
                            types: vec![1]
                        },
                    ]
                ),
                (
                    Arc::clone(&t),
                    1,
                    vec![AckBatch {
                        first: 5,
                        last: 5,
                        types: vec![3]
                    }]
                ),
            ]
        );
        assert!(ledger.take_for_transaction().is_empty(), "taken only once");
        assert!(ledger.take_pending(1, 1).is_empty(), "and never sent");
    }

    #[test]
    fn release_cannot_go_into_a_transaction_and_still_goes_the_normal_way() {
        let (mut ledger, _) = held_ledger(1..=1);
        let err = ledger
            .acknowledge_for_transaction("t", 0, 1, AcknowledgeType::Release)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "record t-0@1 cannot be acknowledged in a transaction: RELEASE cannot be part of a \
             transaction (only ACCEPT and REJECT can); acknowledge the record with \
             acknowledge(record, Release), which sends it the normal way"
        );
        ledger
            .acknowledge("t", 0, 1, AcknowledgeType::Release)
            .unwrap();
        assert!(ledger.take_for_transaction().is_empty());
        assert_eq!(ledger.take_pending(1, 1)[0].2, acks(&[(1, 2)]));
    }

    #[test]
    fn a_record_is_settled_once_whichever_way_it_goes() {
        let (mut ledger, _) = held_ledger(1..=2);
        stage(&mut ledger, &[1], AcknowledgeType::Accept);
        assert!(matches!(
            ledger.acknowledge("t", 0, 1, AcknowledgeType::Accept),
            Err(ShareError::AlreadyAcknowledged { offset: 1, .. })
        ));
        assert!(matches!(
            ledger.acknowledge_for_transaction("t", 0, 1, AcknowledgeType::Reject),
            Err(ShareError::AlreadyAcknowledged { offset: 1, .. })
        ));
        ledger
            .acknowledge("t", 0, 2, AcknowledgeType::Accept)
            .unwrap();
        assert!(matches!(
            ledger.acknowledge_for_transaction("t", 0, 2, AcknowledgeType::Accept),
            Err(ShareError::AlreadyAcknowledged { offset: 2, .. })
        ));
        assert!(matches!(
            ledger.acknowledge_for_transaction("t", 0, 3, AcknowledgeType::Accept),
            Err(ShareError::NotHeld { offset: 3, .. })
        ));
    }

    #[test]
    fn a_record_whose_session_was_lost_cannot_join_a_transaction() {
        let (mut ledger, _) = held_ledger(1..=1);
        ledger.invalidate(1, None, |topic, partition| AckError::SessionLost {
            broker: 1,
            topic: topic.to_string(),
            partition,
            reason: "test".into(),
        });
        let err = ledger
            .acknowledge_for_transaction("t", 0, 1, AcknowledgeType::Accept)
            .unwrap_err();
        assert!(
            err.to_string().contains("leave it out of the transaction"),
            "{err}"
        );
        assert!(ledger.take_for_transaction().is_empty());
    }

    #[test]
    fn staged_acks_of_a_lost_session_are_dropped_and_reported() {
        let (mut ledger, _) = held_ledger(1..=1);
        stage(&mut ledger, &[1], AcknowledgeType::Accept);
        ledger.invalidate(1, None, |topic, partition| AckError::SessionLost {
            broker: 1,
            topic: topic.to_string(),
            partition,
            reason: "test".into(),
        });
        assert!(ledger.take_for_transaction().is_empty());
        assert!(matches!(
            ledger.take_results()[&("t".to_string(), 0)],
            Err(AckError::SessionLost { .. })
        ));
    }

    #[test]
    fn records_in_a_transaction_are_not_delivered_twice_when_the_broker_sends_them_again() {
        let (mut ledger, t) = held_ledger(1..=1);
        stage(&mut ledger, &[1], AcknowledgeType::Accept);
        ledger.take_for_transaction();
        // The dev broker re-sends held records (brief §8.6 #14).
        assert_eq!(ledger.acquire(&t, 0, OWNER, 1, 1), Acquire::Duplicate);
        // After the lock expired the broker delivers it again: a new delivery.
        assert_eq!(ledger.acquire(&t, 0, OWNER, 1, 2), Acquire::Deliver);
    }

    #[test]
    fn a_committed_transaction_settles_its_records() {
        let (mut ledger, t) = held_ledger(1..=3);
        stage(&mut ledger, &[1, 2, 3], AcknowledgeType::Accept);
        let taken = ledger.take_for_transaction();
        ledger.finish_transaction("t", 0, &taken[0].2, TransactionOutcome::Committed);
        assert!(ledger.take_pending(1, 1).is_empty());
        assert!(!ledger.awaits_confirmation(1));
        // Forgotten: a new acquisition of the same offset is a new delivery.
        assert_eq!(ledger.acquire(&t, 0, OWNER, 2, 1), Acquire::Deliver);
    }

    #[test]
    fn an_abort_before_the_broker_staged_the_acks_releases_the_records() {
        let (mut ledger, t) = held_ledger(1..=3);
        stage(&mut ledger, &[1, 2], AcknowledgeType::Accept);
        let taken = ledger.take_for_transaction();
        ledger.finish_transaction(
            "t",
            0,
            &taken[0].2,
            TransactionOutcome::Aborted {
                staged_on_broker: false,
            },
        );
        assert!(ledger.awaits_confirmation(1));
        let sent = ledger.take_pending(1, 1);
        assert_eq!(sent[0].2, acks(&[(1, 2), (2, 2)]), "RELEASE, not ACCEPT");
        ledger.complete(&t, 0, &sent[0].2, Ok(()));
        assert!(!ledger.awaits_confirmation(1));
        assert_eq!(ledger.acquire(&t, 0, OWNER, 1, 2), Acquire::Deliver);
    }

    #[test]
    fn an_abort_after_the_broker_staged_the_acks_leaves_the_records_to_the_broker() {
        let (mut ledger, _) = held_ledger(1..=3);
        stage(&mut ledger, &[1, 2], AcknowledgeType::Accept);
        let taken = ledger.take_for_transaction();
        ledger.finish_transaction(
            "t",
            0,
            &taken[0].2,
            TransactionOutcome::Aborted {
                staged_on_broker: true,
            },
        );
        assert!(ledger.take_pending(1, 1).is_empty());
    }

    #[test]
    fn finishing_a_transaction_leaves_records_delivered_again_since_alone() {
        let (mut ledger, t) = held_ledger(1..=1);
        stage(&mut ledger, &[1], AcknowledgeType::Accept);
        let taken = ledger.take_for_transaction();
        assert_eq!(ledger.acquire(&t, 0, OWNER, 1, 2), Acquire::Deliver);
        ledger.finish_transaction(
            "t",
            0,
            &taken[0].2,
            TransactionOutcome::Aborted {
                staged_on_broker: false,
            },
        );
        assert!(
            ledger.take_pending(1, 1).is_empty(),
            "the new delivery is not released behind the application's back"
        );
        assert!(ledger.holds_unsettled(1, 1, "t", 0));
    }

    #[test]
    fn acks_of_a_transaction_without_output_go_the_normal_way_with_their_types() {
        let (mut ledger, _) = held_ledger(1..=3);
        stage(&mut ledger, &[1, 3], AcknowledgeType::Accept);
        stage(&mut ledger, &[2], AcknowledgeType::Reject);
        let taken = ledger.take_for_transaction();
        ledger.finish_transaction("t", 0, &taken[0].2, TransactionOutcome::NoOutput);
        assert_eq!(
            ledger.take_pending(1, 1)[0].2,
            acks(&[(1, 1), (2, 3), (3, 1)])
        );
    }

    #[test]
    fn staged_acks_of_an_aborted_transaction_are_released() {
        let (mut ledger, _) = held_ledger(1..=2);
        stage(&mut ledger, &[1, 2], AcknowledgeType::Accept);
        ledger.release_staged();
        assert!(ledger.take_for_transaction().is_empty());
        assert_eq!(ledger.take_pending(1, 1)[0].2, acks(&[(1, 2), (2, 2)]));
    }
}
