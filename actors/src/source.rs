//! Where a task's records come from, behind one trait so the same task code runs on a share
//! group or a consumer group (and on an in-memory source in tests).
//!
//! - [`ShareGroupSource`]: KIP-932. Every record is acknowledged on its own (ACCEPT, RELEASE,
//!   REJECT) and `commit` is the share consumer's `commit_sync`. The task is "assigned" the whole
//!   topics once, at the start (KIP-1302: `open()` once, no rebalances).
//! - [`ConsumerGroupSource`]: a classic or KIP-848 consumer group. ACCEPT and REJECT mark the
//!   record processed; RELEASE reads it again from its offset; `commit` commits the contiguous
//!   processed watermark. Rebalances come with the records.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
// Every delivery is remembered and forgotten once: FxHash, not SipHash, for these maps.
use rustc_hash::FxHashMap;
use spillway_core::push_in_place;
use spillway_core::record::TimestampType;
use spillway_core::{
    Ack, Assignment, ConsumerGroupMetadata, Disposition, RawRecord, RecordCoordinates, Topic,
    TopicPartition,
};
use spillway_kafka::classic::{ClassicPoll, ClassicSource, RebalanceEvent};
use spillway_kafka::share::{
    AckError, AcknowledgeType, LockRenewal, ShareConsumer, ShareError, ShareRecord,
};
use tracing::{debug, warn};

use crate::error::RuntimeError;
use crate::group_ids::{JoinWatch, JoinWatching};
use crate::lock_retry::LockExtension;
use crate::tenancy::Throttle;

/// A change of what the task consumes, delivered before the records read after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignmentChange {
    Opened(Assignment),
    Closed(Assignment),
}

/// What one poll brought.
#[derive(Debug, Default)]
pub struct Polled {
    pub changes: Vec<AssignmentChange>,
    pub records: Vec<RawRecord>,
    /// Share mode: when each record's acquisition lock runs out (parallel to `records`);
    /// empty for consumer groups.
    pub lock_deadlines: Vec<Instant>,
    /// Classic mode, when the sink commits offsets itself: the member that read the records.
    pub group: Option<ConsumerGroupMetadata>,
}

/// What a commit came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Committed {
    /// Why some acknowledgements (or offsets) did not take effect.
    pub failures: Vec<String>,
    /// Records whose verdict did not take effect (a lost lock or session): the broker delivers
    /// them again, so they count as neither accepted nor released nor rejected.
    pub unapplied: Vec<RecordCoordinates>,
    /// Those of `unapplied` the broker refused because their acquisition lock had run out.
    pub expired: Vec<RecordCoordinates>,
    /// Share mode: the ACCEPTs this commit made durable (for `SinkTask::acknowledged`).
    pub accepted: Vec<RecordCoordinates>,
}

/// A consumer as the task's ConsumerActor drives it: strictly one call at a time.
#[async_trait(?Send)]
pub trait RecordSource {
    /// Records (and assignment changes) available within `timeout`; empty when none.
    async fn poll(&mut self, timeout: Duration) -> Result<Polled, RuntimeError>;
    /// Applies verdicts locally; [`commit`](Self::commit) makes them durable.
    fn settle(&mut self, acks: &[Ack]) -> Result<(), RuntimeError>;
    /// Commits every verdict settled so far (commit-sync semantics).
    async fn commit(&mut self, timeout: Duration) -> Result<Committed, RuntimeError>;
    /// Commits what is settled and leaves the group.
    async fn close(self: Box<Self>) -> Result<(), RuntimeError>;
    /// Share mode: records fetched for the task that it will never get (the task is
    /// stopping), as `topic-partition@offset` with their delivery counts. Closing releases
    /// them; the task names those on their last allowed delivery, which the broker archives.
    fn take_unpolled(&mut self) -> Vec<(RecordCoordinates, u16)> {
        Vec::new()
    }
    /// The assignment to close when the task stops.
    fn assignment(&self) -> Assignment;
    /// Classic mode: the sink task has every record of these partitions before the offset
    /// (`SinkTask::start_offsets`); records below it are not delivered from now on.
    fn start_from(&mut self, starts: &BTreeMap<TopicPartition, i64>) -> Result<(), RuntimeError> {
        let _ = starts;
        Ok(())
    }
    /// How many partitions the task reads now, when the source knows.
    fn partition_count(&self) -> Option<usize> {
        None
    }
    /// Share mode: the acquisition lock duration the brokers reported
    /// (`AcquisitionLockTimeoutMs`), once known.
    fn lock_duration(&self) -> Option<Duration> {
        None
    }
    /// Share mode: fetch no new records before `until` (`None`: fetch as usual). The task's
    /// target is failing, and records taken now would wait out their locks and spend a
    /// delivery. Consumer groups need nothing here: the task simply does not poll.
    fn pause_fetching(&mut self, until: Option<Instant>) {
        let _ = until;
    }
    /// Whether the locks of held records can be extended (ShareAcknowledge RENEW, KIP-1222).
    fn lock_extension(&self) -> LockExtension {
        LockExtension::Unavailable("a consumer group holds no locks")
    }
    /// When the group drops a member that goes long without polling (librdkafka's
    /// `max.poll.interval.ms`): how long the task may go without a poll before it must call
    /// [`keep_alive`](Self::keep_alive). `None`: a share group only needs heartbeats, which
    /// the share consumer sends on its own.
    fn keep_alive_after(&self) -> Option<Duration> {
        None
    }
    /// Serves the group without taking records (pausing its partitions until the next
    /// [`poll`](Self::poll)); returns the assignment changes it saw (and, rarely, a record
    /// handed out anyway, which must be processed).
    async fn keep_alive(&mut self) -> Result<Polled, RuntimeError> {
        Ok(Polled::default())
    }
}

fn ack_type(d: &Disposition) -> AcknowledgeType {
    match d {
        Disposition::Accept => AcknowledgeType::Accept,
        Disposition::Release => AcknowledgeType::Release,
        Disposition::Reject { .. } => AcknowledgeType::Reject,
    }
}

/// A share consumer's error as the task's: an egress refusal is final.
pub(crate) fn share_failure(e: ShareError) -> RuntimeError {
    if e.is_egress_refusal() {
        RuntimeError::Egress(e.to_string())
    } else {
        RuntimeError::Source(e.to_string())
    }
}

/// A share-group member.
pub struct ShareGroupSource {
    consumer: ShareConsumer,
    topics: Vec<String>,
    opened: bool,
    /// Deliveries handed to the task and not committed yet. The dev broker re-sends records a
    /// member holds in every fetch response (share-protocol brief §8.6 item 14); a re-sent
    /// delivery keeps its delivery count, a real redelivery (after RELEASE or a lost lock) has
    /// a higher one. A record is forgotten once its verdict is committed, so this holds no more
    /// than the task has in flight.
    handed_out: HandedOut,
    /// Verdicts applied locally since the last commit, to tell which a failed partition undid.
    /// Each with whether it was an ACCEPT (one list, so a record is cloned once, not twice).
    settled: Vec<(RecordCoordinates, bool)>,
    /// Verdicts the consumer refused (the record was no longer held).
    refused: Vec<RecordCoordinates>,
    /// The last topic name read and its interned form: a batch's records share one name, so
    /// the interning table is consulted once per run of records, not per record.
    last_topic: Option<(Arc<str>, Topic)>,
}

/// Kafka's INVALID_RECORD_STATE: an acknowledgement for a record no longer acquired by this
/// member, which is what a lock that ran out before the acknowledgement arrived leads to.
const INVALID_RECORD_STATE: i16 = 121;

/// Deliveries remembered for de-duplication; far more than a member holds at once (a safety
/// net: past it the memory is dropped, and a re-sent record could reach the sink twice).
const HANDED_OUT_CAPACITY: usize = 1 << 18;

/// Deliveries handed to a task: topic → (partition, offset) → delivery count. A task reads
/// few topics: a list, searched by the shared name's pointer (the records of one topic share
/// it from the decoder to the commit), not a hash of the name per record.
#[derive(Debug, Default)]
struct HandedOut {
    topics: Vec<(Arc<str>, DeliveryCounts)>,
    count: usize,
}

/// (partition, offset) → delivery count, of one topic.
type DeliveryCounts = FxHashMap<(i32, i64), i16>;

impl HandedOut {
    fn position(&self, topic: &Arc<str>) -> Option<usize> {
        self.topics
            .iter()
            .position(|(t, _)| Arc::ptr_eq(t, topic))
            .or_else(|| self.topics.iter().position(|(t, _)| **t == **topic))
    }

    /// Remembers a delivery; returns the delivery count the record was handed out with
    /// before, if it was (and not forgotten since).
    fn remember(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        offset: i64,
        delivery_count: i16,
    ) -> Option<i16> {
        if self.count >= HANDED_OUT_CAPACITY {
            self.topics.clear();
            self.count = 0;
        }
        let i = match self.position(topic) {
            Some(i) => i,
            None => {
                self.topics.push((Arc::clone(topic), FxHashMap::default()));
                self.topics.len() - 1
            }
        };
        let known = self.topics[i].1.insert((partition, offset), delivery_count);
        self.count += usize::from(known.is_none());
        known
    }

    fn forget(&mut self, topic: &Arc<str>, partition: i32, offset: i64) {
        if let Some(i) = self.position(topic) {
            if self.topics[i].1.remove(&(partition, offset)).is_some() {
                self.count -= 1;
            }
        }
    }
}

impl ShareGroupSource {
    /// A record whose verdict is committed (or refused) is not held any more: the broker will
    /// not re-send it, and a redelivery comes with a higher delivery count.
    fn forget_delivery(&mut self, c: &RecordCoordinates) {
        self.handed_out
            .forget(c.topic.as_arc(), c.partition, c.offset);
    }

    /// Subscribes `consumer` to `topics`.
    pub fn new(mut consumer: ShareConsumer, topics: Vec<String>) -> Self {
        consumer.subscribe(&topics);
        ShareGroupSource {
            consumer,
            topics,
            opened: false,
            handed_out: HandedOut::default(),
            settled: Vec::new(),
            refused: Vec::new(),
            last_topic: None,
        }
    }

    pub fn member_id(&self) -> &str {
        self.consumer.member_id()
    }
}

/// The share consumer's answer as the runtime's seam.
fn lock_extension_of(consumer: &ShareConsumer) -> LockExtension {
    match consumer.lock_renewal() {
        LockRenewal::Available => LockExtension::Available,
        LockRenewal::Unavailable { reason } => LockExtension::Unavailable(reason),
    }
}

/// `name` as an interned [`Topic`], so that the record's many clones between source and sink
/// cost no atomic operation; `last` keeps the name seen before.
fn interned_topic(last: &mut Option<(Arc<str>, Topic)>, name: &Arc<str>) -> Topic {
    match last {
        Some((seen, topic)) if Arc::ptr_eq(seen, name) || **seen == **name => topic.clone(),
        _ => {
            let topic = Topic::interned(name);
            *last = Some((Arc::clone(name), topic.clone()));
            topic
        }
    }
}

/// The raw record of `r`, built in its slot at the end of `out` ([`push_in_place!`]). Built on
/// the stack and pushed, it cost a `memcpy` of the whole record per record (issue 18).
#[inline(always)]
fn push_raw_from_share(out: &mut Vec<RawRecord>, r: ShareRecord, topic: Topic) {
    push_in_place!(
        out,
        RawRecord {
            topic,
            partition: r.partition,
            offset: r.offset,
            key: r.key,
            value: r.value,
            headers: r.headers,
            timestamp: Some(r.timestamp),
            timestamp_type: TimestampType::CreateTime,
            delivery_count: u16::try_from(r.delivery_count).ok(),
            lock_deadline: Some(r.lock_deadline),
        }
    );
}

#[async_trait(?Send)]
impl RecordSource for ShareGroupSource {
    async fn poll(&mut self, timeout: Duration) -> Result<Polled, RuntimeError> {
        let mut polled = Polled::default();
        if !self.opened {
            // KIP-1302: open() once at start, for all topics.
            self.opened = true;
            polled
                .changes
                .push(AssignmentChange::Opened(self.assignment()));
        }
        let records = self.consumer.poll(timeout).await.map_err(share_failure)?;
        polled.records.reserve(records.len());
        polled.lock_deadlines.reserve(records.len());
        for r in records {
            let known = self
                .handed_out
                .remember(&r.topic, r.partition, r.offset, r.delivery_count);
            if known != Some(r.delivery_count) {
                polled.lock_deadlines.push(r.lock_deadline);
                let topic = interned_topic(&mut self.last_topic, &r.topic);
                push_raw_from_share(&mut polled.records, r, topic);
            }
        }
        Ok(polled)
    }

    fn settle(&mut self, acks: &[Ack]) -> Result<(), RuntimeError> {
        self.settled.reserve(acks.len());
        // One ledger lock for the batch.
        let each = acks.iter().map(|ack| {
            let c = &ack.record;
            (
                c.topic.as_str(),
                c.partition,
                c.offset,
                ack_type(&ack.disposition),
            )
        });
        self.consumer.acknowledge_each(each, |i, result| {
            let ack = &acks[i];
            let c = &ack.record;
            match result {
                Ok(()) => self
                    .settled
                    .push((c.clone(), ack.disposition == Disposition::Accept)),
                Err(e) => {
                    // The lock was lost (expired, session reset): the broker redelivers the
                    // record, which is what any verdict but ACCEPT would have led to anyway.
                    warn!(record = %c, error = %e, "acknowledgement not applied");
                    self.refused.push(c.clone());
                }
            }
        });
        Ok(())
    }

    async fn commit(&mut self, timeout: Duration) -> Result<Committed, RuntimeError> {
        let results = self
            .consumer
            .commit_sync(timeout)
            .await
            .map_err(share_failure)?;
        let mut failures = Vec::new();
        let mut failed: HashSet<(String, i32)> = HashSet::new();
        let mut lock_lost: HashSet<(String, i32)> = HashSet::new();
        for (partition, result) in results {
            if let Err(e) = result {
                if matches!(
                    e,
                    AckError::Refused {
                        code: INVALID_RECORD_STATE,
                        ..
                    }
                ) {
                    lock_lost.insert(partition.clone());
                }
                failures.push(e.to_string());
                failed.insert(partition);
            }
        }
        let mut unapplied = std::mem::take(&mut self.refused);
        let settled = std::mem::take(&mut self.settled);
        for c in unapplied.iter().chain(settled.iter().map(|(c, _)| c)) {
            self.forget_delivery(c);
        }
        let mut accepted = Vec::with_capacity(settled.len());
        let mut expired = Vec::new();
        for (c, accept) in settled {
            // Most commits fail nowhere: then no partition key is built per record.
            if !failed.is_empty() {
                let partition = (c.topic.to_string(), c.partition);
                if failed.contains(&partition) {
                    if lock_lost.contains(&partition) {
                        expired.push(c.clone());
                    }
                    unapplied.push(c);
                    continue;
                }
            }
            if accept {
                accepted.push(c);
            }
        }
        Ok(Committed {
            failures,
            unapplied,
            expired,
            accepted,
        })
    }

    async fn close(self: Box<Self>) -> Result<(), RuntimeError> {
        self.consumer
            .close()
            .await
            .map(|_| ())
            .map_err(|e| RuntimeError::Source(e.to_string()))
    }

    fn take_unpolled(&mut self) -> Vec<(RecordCoordinates, u16)> {
        self.consumer
            .take_unpolled()
            .into_iter()
            .map(|r| {
                (
                    RecordCoordinates::new(r.topic.to_string(), r.partition, r.offset),
                    u16::try_from(r.delivery_count).unwrap_or(0),
                )
            })
            .collect()
    }

    fn assignment(&self) -> Assignment {
        Assignment::SharedTopics(self.topics.clone())
    }

    fn partition_count(&self) -> Option<usize> {
        Some(self.consumer.assigned_partitions())
    }

    fn lock_duration(&self) -> Option<Duration> {
        self.consumer.acquisition_lock_timeout()
    }

    fn pause_fetching(&mut self, until: Option<Instant>) {
        self.consumer.pause_fetching(until);
    }

    fn lock_extension(&self) -> LockExtension {
        lock_extension_of(&self.consumer)
    }
}

/// A consumer-group member.
pub struct ConsumerGroupSource {
    source: ClassicSource,
    owned: Vec<TopicPartition>,
    /// Hand the group metadata to the sink with every batch (it commits the offsets).
    share_group_metadata: bool,
    /// Per owned partition, the offset the sink task needs records from (`start_from`), moved
    /// on past every record delivered.
    starts: BTreeMap<TopicPartition, i64>,
    /// A KIP-848 member's join, watched until its first assignment.
    join_watch: Option<JoinWatching>,
    /// Nothing downstream reads the records' headers: they are read only when
    /// [`headers_wanted`] says so (see [`without_headers`](Self::without_headers)).
    headers_unread: Option<HeadersUnread>,
}

/// What still needs the headers of a task whose pipeline reads none.
struct HeadersUnread {
    /// The tenant's budget, whose bytes per second count header bytes.
    throttle: Option<Arc<Throttle>>,
}

impl ConsumerGroupSource {
    /// Subscribes `source` to `topics` (a `^`-prefixed entry is a pattern).
    pub fn new(source: ClassicSource, topics: &[String]) -> Result<Self, RuntimeError> {
        source
            .subscribe(topics)
            .map_err(|e| RuntimeError::Source(e.to_string()))?;
        Ok(ConsumerGroupSource {
            source,
            owned: Vec::new(),
            share_group_metadata: false,
            starts: BTreeMap::new(),
            join_watch: None,
            headers_unread: None,
        })
    }

    /// For a task whose sink, transforms, dead letter queue and error logs read no header:
    /// the records' headers are left unread while [`headers_wanted`] says nothing else needs
    /// them (`throttle`: the tenant's budget).
    pub fn without_headers(mut self, throttle: Option<Arc<Throttle>>) -> Self {
        self.headers_unread = Some(HeadersUnread { throttle });
        self
    }

    /// Tells the consumer whether the next poll's records need their headers.
    fn choose_headers(&self) {
        if let Some(unread) = &self.headers_unread {
            self.source.read_headers(headers_wanted(
                crate::telemetry::stage_spans_wanted(),
                unread.throttle.as_deref(),
            ));
        }
    }

    /// Fails the source's polls, naming the reason, once `watch` finds the member's join
    /// refused; stops watching at the first assignment.
    pub fn with_join_watch(mut self, watch: JoinWatch) -> Self {
        self.join_watch = Some(watch.start());
        self
    }

    /// The refusal of the member's join, once the watch found it.
    fn join_refused(&mut self) -> Result<(), RuntimeError> {
        match self.join_watch.as_mut().and_then(JoinWatching::refused) {
            Some(reason) => Err(RuntimeError::Source(reason)),
            None => Ok(()),
        }
    }

    /// Every poll also returns the member's group metadata, for a sink that commits the
    /// offsets in its own transactions (the source itself must then not commit: see
    /// `ClassicConfig::commit_offsets`).
    pub fn with_group_metadata(mut self) -> Self {
        self.share_group_metadata = true;
        self
    }

    /// Turns what the consumer handed out into a batch: rebalances become assignment changes,
    /// and records the sink task already has (below its start offsets) are dropped.
    fn take(&mut self, polled: ClassicPoll) -> Polled {
        let mut changes = Vec::new();
        for event in polled.events {
            match event {
                RebalanceEvent::Assigned(list) => {
                    // The coordinator let the member in.
                    self.join_watch = None;
                    let list = partitions(list);
                    for tp in &list {
                        if !self.owned.contains(tp) {
                            self.owned.push(tp.clone());
                        }
                    }
                    changes.push(AssignmentChange::Opened(Assignment::Partitions(list)));
                }
                RebalanceEvent::Revoked(list) => {
                    let list = partitions(list);
                    self.owned.retain(|tp| !list.contains(tp));
                    self.starts.retain(|tp, _| !list.contains(tp));
                    changes.push(AssignmentChange::Closed(Assignment::Partitions(list)));
                }
            }
        }
        let group = if self.share_group_metadata {
            self.source.group_metadata().map(ConsumerGroupMetadata::new)
        } else {
            None
        };
        let mut records = polled.records;
        if !self.starts.is_empty() {
            // Read before the consumer moved to the task's start: the sink has them.
            let mut behind: BTreeMap<TopicPartition, i64> = BTreeMap::new();
            records.retain(|r| {
                let tp = TopicPartition::new(r.topic.clone(), r.partition);
                match self.starts.get(&tp) {
                    Some(start) if r.offset < *start => {
                        self.source.mark_done(&r.topic, r.partition, r.offset);
                        behind.insert(tp, *start);
                        false
                    }
                    _ => true,
                }
            });
            for (tp, start) in behind {
                self.skip_to(&tp, start);
            }
            // A seek can race with records fetched before it, which would then come twice:
            // past a start, a partition is never delivered below what it delivered already
            // (until a RELEASE rewinds it, in `settle`).
            for r in &records {
                let tp = TopicPartition::new(r.topic.clone(), r.partition);
                if let Some(start) = self.starts.get_mut(&tp) {
                    *start = (*start).max(r.offset + 1);
                }
            }
        }
        Polled {
            changes,
            records,
            lock_deadlines: Vec::new(),
            group,
        }
    }

    /// Seeks `tp` forward to `start` (made by the next poll, off this thread); a failed seek
    /// only costs reading records `poll` drops.
    fn skip_to(&self, tp: &TopicPartition, start: i64) {
        if self.source.skip_to(&tp.topic, tp.partition, start) {
            debug!(partition = %tp, start, "moving to the sink task's start offset");
        }
    }
}

/// Whether a task whose pipeline reads no header must still read them: while stage spans are
/// recorded (`traced`: their parents are the producers' `traceparent` headers), and while
/// the tenant's budget limits bytes per second, which count header bytes (a tenant cannot
/// pass bytes uncounted in headers).
fn headers_wanted(traced: bool, throttle: Option<&Throttle>) -> bool {
    traced || throttle.is_some_and(Throttle::limits_bytes)
}

fn partitions(list: Vec<(String, i32)>) -> Vec<TopicPartition> {
    list.into_iter()
        .map(|(t, p)| TopicPartition::new(t, p))
        .collect()
}

#[async_trait(?Send)]
impl RecordSource for ConsumerGroupSource {
    async fn poll(&mut self, timeout: Duration) -> Result<Polled, RuntimeError> {
        self.join_refused()?;
        self.choose_headers();
        let polled = self
            .source
            .poll(timeout)
            .await
            .map_err(|e| RuntimeError::Source(e.to_string()))?;
        Ok(self.take(polled))
    }

    fn keep_alive_after(&self) -> Option<Duration> {
        Some(self.source.keep_alive_after())
    }

    async fn keep_alive(&mut self) -> Result<Polled, RuntimeError> {
        self.join_refused()?;
        self.choose_headers();
        let polled = self
            .source
            .keep_alive()
            .await
            .map_err(|e| RuntimeError::Source(e.to_string()))?;
        Ok(self.take(polled))
    }

    fn start_from(&mut self, starts: &BTreeMap<TopicPartition, i64>) -> Result<(), RuntimeError> {
        for (tp, start) in starts {
            // A partition revoked meanwhile starts wherever its new owner's task says.
            if !self.owned.contains(tp) {
                continue;
            }
            let delivered = self.source.delivered_up_to(&tp.topic, tp.partition);
            let known = self.starts.entry(tp.clone()).or_insert(delivered);
            *known = (*known).max(*start);
            let start = *known;
            self.skip_to(tp, start);
        }
        Ok(())
    }

    fn settle(&mut self, acks: &[Ack]) -> Result<(), RuntimeError> {
        // Per partition, the lowest released offset is read again (Connect's redelivery).
        let mut rewind: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for ack in acks {
            let c = &ack.record;
            if ack.disposition == Disposition::Release {
                let e = rewind
                    .entry((c.topic.to_string(), c.partition))
                    .or_insert(c.offset);
                *e = (*e).min(c.offset);
            }
        }
        // The rest are processed: one tracker lock for the batch.
        self.source.mark_done_all(
            acks.iter()
                .filter(|ack| ack.disposition != Disposition::Release)
                .map(|ack| {
                    (
                        ack.record.topic.as_str(),
                        ack.record.partition,
                        ack.record.offset,
                    )
                }),
        );
        for ((topic, partition), offset) in rewind {
            // A partition revoked meanwhile is read again by its new owner from the last commit.
            if !self
                .owned
                .contains(&TopicPartition::new(topic.clone(), partition))
            {
                continue;
            }
            let tp = TopicPartition::new(topic.clone(), partition);
            if let Some(start) = self.starts.get_mut(&tp) {
                *start = (*start).min(offset);
            }
            // Made by the next poll, off this (shared) thread; its failure fails that poll.
            self.source.seek_back(&topic, partition, offset);
        }
        Ok(())
    }

    async fn commit(&mut self, _timeout: Duration) -> Result<Committed, RuntimeError> {
        match self.source.commit().await {
            Ok(_) => Ok(Committed::default()),
            // A failed offset commit loses nothing: the next one covers the same records.
            Err(e) => Ok(Committed {
                failures: vec![e.to_string()],
                ..Committed::default()
            }),
        }
    }

    async fn close(self: Box<Self>) -> Result<(), RuntimeError> {
        self.source
            .close()
            .await
            .map_err(|e| RuntimeError::Source(e.to_string()))
    }

    fn assignment(&self) -> Assignment {
        Assignment::Partitions(self.owned.clone())
    }

    fn partition_count(&self) -> Option<usize> {
        Some(self.owned.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_headers_are_read_while_traced_or_while_the_tenant_budget_counts_bytes() {
        assert!(!headers_wanted(false, None), "nothing needs them");
        assert!(headers_wanted(true, None), "stage spans name the producers");
        let budget = Throttle::new(Some(1000), None);
        assert!(
            !headers_wanted(false, Some(&budget)),
            "records per second only"
        );
        budget.set_rates(Some(1000), Some(1_000_000));
        assert!(
            headers_wanted(false, Some(&budget)),
            "bytes per second count them"
        );
        budget.set_rates(None, None);
        assert!(!headers_wanted(false, Some(&budget)), "the limit lifted");
    }

    #[test]
    fn a_re_sent_delivery_is_known_until_its_verdict_is_committed() {
        let mut handed = HandedOut::default();
        let t: Arc<str> = Arc::from("t");
        assert_eq!(handed.remember(&t, 0, 5, 1), None);
        assert_eq!(handed.remember(&t, 1, 5, 1), None, "another partition");
        // The same name from another decode (another allocation) is the same topic.
        let again: Arc<str> = Arc::from("t");
        assert_eq!(handed.remember(&again, 0, 5, 1), Some(1), "re-sent");
        assert_eq!(handed.remember(&again, 0, 5, 2), Some(1), "redelivered");
        assert_eq!(handed.count, 2);
        handed.forget(&t, 0, 5);
        handed.forget(&t, 0, 5);
        assert_eq!(handed.count, 1, "forgotten once");
        assert_eq!(handed.remember(&t, 0, 5, 2), None);
        let other: Arc<str> = Arc::from("u");
        assert_eq!(handed.remember(&other, 0, 5, 1), None, "another topic");
        handed.forget(&other, 0, 6);
        assert_eq!(handed.count, 3);
    }

    #[test]
    fn past_its_capacity_the_memory_is_dropped() {
        let mut handed = HandedOut::default();
        let t: Arc<str> = Arc::from("t");
        for offset in 0..HANDED_OUT_CAPACITY as i64 {
            assert_eq!(handed.remember(&t, 0, offset, 1), None);
        }
        assert_eq!(
            handed.remember(&t, 0, 0, 1),
            None,
            "dropped, then remembered"
        );
        assert_eq!(handed.count, 1);
    }

    #[test]
    fn share_records_get_interned_topics_named_as_read() {
        let mut last = None;
        let orders: Arc<str> = Arc::from("share-orders");
        let first = interned_topic(&mut last, &orders);
        assert!(first.is_interned());
        assert_eq!(first.as_str(), "share-orders");
        // Another response names the topic with its own Arc: still the same interned name.
        let again = interned_topic(&mut last, &Arc::from("share-orders"));
        assert!(again.is_interned());
        assert!(Arc::ptr_eq(first.as_arc(), again.as_arc()));
        let refunds = interned_topic(&mut last, &Arc::from("share-refunds"));
        assert_eq!(
            refunds.as_str(),
            "share-refunds",
            "a new name is not the last one"
        );
        assert_eq!(interned_topic(&mut last, &orders), first);
    }
}
