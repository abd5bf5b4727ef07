//! [`ClassicSource`]: a consumer-group member on rdkafka, for connectors that do not run on a
//! share group (the `classic` and `consumer` group protocols).
//!
//! Offsets are committed up to the **contiguous processed watermark** of each partition: a
//! record counts once the runtime says it is done with it ([`ClassicSource::mark_done`]), and
//! the commit never passes a record still in flight, so a crash redelivers rather than loses.
//! A record the runtime gives back ([`ClassicSource::seek_back`]) is read again from its offset.
//!
//! Rebalances arrive as [`RebalanceEvent`]s with the records of a poll, in order, so the runtime
//! can call the task's `close` and `open` between batches. On a revocation the processed
//! watermark of the revoked partitions is committed inside the callback, before the partitions
//! move (what Connect's `onPartitionsRevoked` does).
//!
//! While the runtime cannot take records (every batch it may hold is in flight, e.g. behind a
//! put being retried), [`ClassicSource::keep_alive`] pauses the assignment and polls, as
//! Connect does: the member stays within `max.poll.interval.ms` and serves rebalances, and
//! the next [`ClassicSource::poll`] resumes where the last record handed out left off.
//!
//! The commit after each batch is asynchronous (as Kafka Connect's `WorkerSinkTask` and the C
//! reference commit): it is queued on the caller's thread and the next poll need not wait for
//! the broker's answer. A failed one is sent again by the next commit (its answer arrives
//! through `poll`); the commits of a revocation and of `close` are synchronous and cover every
//! tracked partition, so the group's position is on the broker before the partitions move or
//! the member leaves.
//!
//! Records are read from a queue of their own, a poll's worth in one call
//! ([`message_queue`]); the consumer queue keeps the group's events, which rust-rdkafka's
//! `BaseConsumer::poll` serves. A poll that finds records waiting and nothing else to do
//! (no event, seek or resume) takes them on the caller's thread without waiting; otherwise
//! it runs on tokio's blocking pool, since serving a revocation commits synchronously and
//! waiting for records blocks, as does a synchronous commit.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use spillway_core::record::TimestampType;
use spillway_core::Topic;
use tracing::{debug, warn};

use crate::copies::{Copies, COPY_CHUNK};
use crate::security::{rdkafka_config, SecurityContext};

mod message_queue;

use message_queue::{CommitAnswers, MessageQueue};

/// Errors of the classic consumer-group source.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClassicError {
    #[error("cannot create a consumer for group '{group}' on {bootstrap}: {reason}")]
    Create {
        group: String,
        bootstrap: String,
        reason: String,
    },
    #[error("cannot subscribe group '{group}' to {topics}: {reason}")]
    Subscribe {
        group: String,
        topics: String,
        reason: String,
    },
    #[error("consumer of group '{group}' failed fatally: {reason}")]
    Fatal { group: String, reason: String },
    #[error("committing offsets {offsets} for group '{group}' failed: {reason}")]
    Commit {
        group: String,
        offsets: String,
        reason: String,
    },
    #[error(
        "cannot seek {topic}-{partition} back to offset {offset} in group '{group}': {reason}"
    )]
    Seek {
        group: String,
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
    #[error("the consumer's blocking call was cancelled: {0}")]
    Cancelled(String),
}

/// Which consumer-group rebalance protocol to use (`group.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebalanceProtocol {
    /// The classic protocol (JoinGroup/SyncGroup), Connect's default.
    Classic,
    /// KIP-848's consumer protocol.
    Consumer,
}

/// The consumer group member's identity as librdkafka holds it; what
/// [`TransactionalProducer::send_offsets`](crate::producer::TransactionalProducer::send_offsets)
/// needs.
pub use rdkafka::consumer::ConsumerGroupMetadata as GroupMetadata;

/// How long librdkafka waits before it fetches again for a partition whose prefetch queue
/// was full (`fetch.queue.backoff.ms`, 1000 by default); a consumer override still wins.
///
/// Every partition's fetch queue is forwarded to one queue ([`message_queue`]), so the queue
/// counts as full once it holds `queued.min.messages` (100,000) records of all partitions.
/// A task that drains a backlog faster than that per second then waits out the rest of the
/// second with nothing to read: a classic connector into the file sink read 250,000 records a
/// second on the dev broker with the default and 1.4 million with this one (bench/README.md,
/// "The prefetch queue's backoff"). Kafka's Java consumer fetches again as soon as a
/// partition's buffered records are taken; a tenth of a second comes close to that, and a
/// task whose sink is slow and whose queue stays full costs its fetcher ten wake-ups a second
/// instead of one.
pub const FETCH_QUEUE_BACKOFF_MS: &str = "100";

/// Settings of a [`ClassicSource`].
#[derive(Debug, Clone)]
pub struct ClassicConfig {
    pub bootstrap_servers: String,
    pub group_id: String,
    pub protocol: RebalanceProtocol,
    /// Most records one poll returns (`max.poll.records`).
    pub max_poll_records: usize,
    /// Further consumer settings (`consumer.override.*` without the prefix), applied last;
    /// keys this source must control (offset commits) are ignored.
    pub overrides: BTreeMap<String, String>,
    /// Whether this source commits the processed offsets (the default). Off when the sink
    /// commits them inside its producer transactions (exactly-once): a commit of this source's
    /// own, on a rebalance or at close, could then move the group's position back past a later
    /// transaction's commit.
    pub commit_offsets: bool,
}

impl ClassicConfig {
    pub fn new(bootstrap_servers: &str, group_id: &str) -> ClassicConfig {
        ClassicConfig {
            bootstrap_servers: bootstrap_servers.to_owned(),
            group_id: group_id.to_owned(),
            protocol: RebalanceProtocol::Classic,
            max_poll_records: 500,
            commit_offsets: true,
            overrides: BTreeMap::new(),
        }
    }
}

/// Keys a classic source sets itself; an override of them would break the commit contract.
pub const OWNED_KEYS: &[&str] = &[
    "enable.auto.commit",
    "enable.auto.offset.store",
    "group.id",
    "group.protocol",
    "bootstrap.servers",
    "max.poll.records",
];

/// One record read from a consumer group: the runtime's raw record itself, so a poll's records
/// go on as they were read, not rebuilt one by one (a consumer group counts no deliveries and
/// holds no locks: `delivery_count` and `lock_deadline` are `None`).
pub type ClassicRecord = spillway_core::RawRecord;

/// A record read from a consumer group, built in its slot at the end of `out`
/// ([`push_in_place!`](spillway_core::push_in_place)): `timestamp` in milliseconds since the
/// epoch, with whether the log stamped it (true) or the producer.
#[inline(always)]
pub(crate) fn push_classic_record(
    out: &mut Vec<ClassicRecord>,
    topic: Topic,
    partition: i32,
    offset: i64,
    (key, value): (Option<Bytes>, Option<Bytes>),
    headers: Vec<(String, Option<Bytes>)>,
    timestamp: Option<(i64, bool)>,
) {
    let (timestamp, timestamp_type) = match timestamp {
        None => (None, TimestampType::NoTimestamp),
        Some((t, true)) => (Some(t), TimestampType::LogAppendTime),
        Some((t, false)) => (Some(t), TimestampType::CreateTime),
    };
    spillway_core::push_in_place!(
        out,
        ClassicRecord {
            topic,
            partition,
            offset,
            key,
            value,
            headers,
            timestamp,
            timestamp_type,
            delivery_count: None,
            lock_deadline: None,
        }
    );
}

/// A change of this member's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// What one poll brought: rebalances first (they happened before the records were read).
#[derive(Debug, Clone, Default)]
pub struct ClassicPoll {
    pub events: Vec<RebalanceEvent>,
    pub records: Vec<ClassicRecord>,
}

/// Consecutive offsets delivered, all in flight or all done.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Run {
    first: i64,
    /// One past the last offset.
    end: i64,
    done: bool,
}

impl Run {
    fn len(&self) -> usize {
        (self.end - self.first) as usize
    }
}

/// Per partition: which delivered offsets are still in flight.
#[derive(Debug, Clone, PartialEq)]
struct PartitionProgress {
    /// Delivered offsets from the first one not done, ascending, as runs of consecutive
    /// offsets: records come and are done mostly in offset order, so a poll's records of a
    /// partition extend the last run and their verdicts shrink the first (issue 18: no entry
    /// per offset). A run done behind one still in flight stays until that one is done, so the
    /// first run is never a done one. Offsets the log skips (transaction markers, compacted
    /// records) end a run: only delivered offsets are ever in one.
    runs: VecDeque<Run>,
    /// How many offsets of `runs` are not done.
    pending: usize,
    /// One past the highest offset delivered.
    next: i64,
    /// The last offset committed (the next record to read), -1 before any commit.
    committed: i64,
}

impl Default for PartitionProgress {
    fn default() -> Self {
        PartitionProgress {
            runs: VecDeque::new(),
            pending: 0,
            next: 0,
            committed: -1,
        }
    }
}

impl PartitionProgress {
    /// The offset to commit: the first record still in flight, or one past the last delivered.
    fn watermark(&self) -> i64 {
        self.runs.front().map_or(self.next, |r| r.first)
    }

    /// The run holding `offset`, or where a run of it would go.
    fn locate(&self, offset: i64) -> Result<usize, usize> {
        let i = self.runs.partition_point(|r| r.end <= offset);
        match self.runs.get(i) {
            Some(r) if r.first <= offset => Ok(i),
            _ => Err(i),
        }
    }

    /// Splits run `i` so that `offset`, inside it, is a run of its own; returns its index.
    fn isolate(&mut self, i: usize, offset: i64) -> usize {
        let run = self.runs[i];
        let mut at = i;
        if run.first < offset {
            self.runs[i].end = offset;
            at = i + 1;
            self.runs.insert(
                at,
                Run {
                    first: offset,
                    ..run
                },
            );
        }
        if offset + 1 < run.end {
            self.runs[at].end = offset + 1;
            self.runs.insert(
                at + 1,
                Run {
                    first: offset + 1,
                    ..run
                },
            );
        }
        at
    }

    /// `offset` was handed out.
    fn delivered(&mut self, offset: i64) {
        self.insert(offset);
        self.next = self.next.max(offset + 1);
    }

    /// `offset` is in flight (again).
    fn insert(&mut self, offset: i64) {
        match self.runs.back_mut() {
            // The next offset of the partition: the common case.
            Some(last) if !last.done && last.end == offset => last.end += 1,
            Some(last) if last.end > offset => match self.locate(offset) {
                Ok(i) if self.runs[i].done => {
                    let at = self.isolate(i, offset);
                    self.runs[at].done = false;
                }
                Ok(_) => return,
                Err(i) => self.runs.insert(
                    i,
                    Run {
                        first: offset,
                        end: offset + 1,
                        done: false,
                    },
                ),
            },
            _ => self.runs.push_back(Run {
                first: offset,
                end: offset + 1,
                done: false,
            }),
        }
        self.pending += 1;
    }

    /// `offset` is done; the runs done at the front are forgotten.
    fn remove(&mut self, offset: i64) {
        match self.runs.front_mut() {
            // The first record in flight: the common case.
            Some(first) if !first.done && first.first == offset => {
                first.first += 1;
                if first.first == first.end {
                    self.runs.pop_front();
                }
            }
            _ => {
                let Ok(i) = self.locate(offset) else { return };
                if self.runs[i].done {
                    return;
                }
                let at = self.isolate(i, offset);
                self.runs[at].done = true;
            }
        }
        self.pending -= 1;
        while self.runs.front().is_some_and(|r| r.done) {
            self.runs.pop_front();
        }
    }

    /// The offsets `first..end` were handed out: one step when they follow the last run.
    fn delivered_run(&mut self, first: i64, end: i64) {
        match self.runs.back_mut() {
            Some(last) if !last.done && last.end == first => {
                last.end = end;
                self.pending += (end - first) as usize;
            }
            Some(last) if last.end > first => (first..end).for_each(|o| self.insert(o)),
            _ => {
                self.runs.push_back(Run {
                    first,
                    end,
                    done: false,
                });
                self.pending += (end - first) as usize;
            }
        }
        self.next = self.next.max(end);
    }

    /// The offsets `first..end` are done: one step when they start the first run.
    fn done_run(&mut self, first: i64, end: i64) {
        match self.runs.front_mut() {
            Some(run) if !run.done && run.first == first && run.end >= end => {
                run.first = end;
                if run.first == run.end {
                    self.runs.pop_front();
                }
                self.pending -= (end - first) as usize;
                while self.runs.front().is_some_and(|r| r.done) {
                    self.runs.pop_front();
                }
            }
            _ => (first..end).for_each(|o| self.remove(o)),
        }
    }

    /// Forgets every offset at or after `offset`.
    fn truncate(&mut self, offset: i64) {
        let keep = self.runs.partition_point(|r| r.first < offset);
        let mut dropped: usize = self
            .runs
            .range(keep..)
            .filter(|r| !r.done)
            .map(Run::len)
            .sum();
        self.runs.truncate(keep);
        if let Some(last) = self.runs.back_mut().filter(|r| r.end > offset) {
            if !last.done {
                dropped += (last.end - offset) as usize;
            }
            last.end = offset;
        }
        self.pending -= dropped;
    }
}

/// Whether two topic names are the same; the names of one interned topic are one pointer, so
/// most comparisons end there.
fn same_topic(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// `records` as runs of consecutive offsets of one partition: `(topic, partition, first, end)`.
fn offset_runs<'a>(
    records: impl IntoIterator<Item = (&'a str, i32, i64)>,
) -> impl Iterator<Item = (&'a str, i32, i64, i64)> {
    let mut records = records.into_iter().peekable();
    std::iter::from_fn(move || {
        let (topic, partition, first) = records.next()?;
        let mut end = first + 1;
        while records
            .next_if(|&(t, part, o)| o == end && part == partition && same_topic(t, topic))
            .is_some()
        {
            end += 1;
        }
        Some((topic, partition, first, end))
    })
}

/// The processed watermark of every partition this member owns.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Topic → partition → progress: looked up by `&str` for every record delivered and done,
    /// with no topic name built per lookup.
    partitions: BTreeMap<String, BTreeMap<i32, PartitionProgress>>,
}

impl OffsetTracker {
    fn get(&self, topic: &str, partition: i32) -> Option<&PartitionProgress> {
        self.partitions.get(topic)?.get(&partition)
    }

    fn get_mut(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionProgress> {
        self.partitions.get_mut(topic)?.get_mut(&partition)
    }

    fn entry(&mut self, topic: &str, partition: i32) -> &mut PartitionProgress {
        if !self.partitions.contains_key(topic) {
            self.partitions.insert(topic.to_owned(), BTreeMap::new());
        }
        self.partitions
            .get_mut(topic)
            .map(|m| m.entry(partition).or_default())
            .unwrap_or_else(|| unreachable!("inserted just above"))
    }

    fn iter(&self) -> impl Iterator<Item = ((&String, i32), &PartitionProgress)> {
        self.partitions
            .iter()
            .flat_map(|(t, m)| m.iter().map(move |(p, progress)| ((t, *p), progress)))
    }

    pub fn delivered(&mut self, topic: &str, partition: i32, offset: i64) {
        self.entry(topic, partition).delivered(offset);
    }

    /// [`delivered`](Self::delivered) for many records: a poll's records come in runs of one
    /// partition (librdkafka queues a fetched batch at a time), each looked up once and
    /// tracked a run of consecutive offsets at a time.
    pub fn delivered_all<'a>(&mut self, records: impl IntoIterator<Item = (&'a str, i32, i64)>) {
        let mut runs = offset_runs(records).peekable();
        while let Some((topic, partition, first, end)) = runs.next() {
            let p = self.entry(topic, partition);
            p.delivered_run(first, end);
            while let Some((_, _, first, end)) =
                runs.next_if(|&(t, part, _, _)| part == partition && same_topic(t, topic))
            {
                p.delivered_run(first, end);
            }
        }
    }

    /// The record is processed (accepted or rejected); a record of a partition no longer
    /// owned is ignored (its new owner reads it again).
    pub fn done(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(p) = self.get_mut(topic, partition) {
            p.remove(offset);
        }
    }

    /// [`done`](Self::done) for many records, as [`delivered_all`](Self::delivered_all) takes
    /// them.
    pub fn done_all<'a>(&mut self, records: impl IntoIterator<Item = (&'a str, i32, i64)>) {
        let mut runs = offset_runs(records).peekable();
        while let Some((topic, partition, first, end)) = runs.next() {
            let mut p = self.get_mut(topic, partition);
            if let Some(p) = p.as_mut() {
                p.done_run(first, end);
            }
            while let Some((_, _, first, end)) =
                runs.next_if(|&(t, part, _, _)| part == partition && same_topic(t, topic))
            {
                if let Some(p) = p.as_mut() {
                    p.done_run(first, end);
                }
            }
        }
    }

    /// Forget everything at or after `offset`: it will be read again.
    pub fn rewind(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(p) = self.get_mut(topic, partition) {
            p.truncate(offset);
            p.next = p.next.min(offset);
        }
    }

    /// One past the highest offset delivered of the partition (0 when none was).
    pub fn next(&self, topic: &str, partition: i32) -> i64 {
        self.get(topic, partition).map_or(0, |p| p.next)
    }

    /// Everything before `offset` needs no processing (the sink has it): the partition goes on
    /// from there.
    pub fn skipped_to(&mut self, topic: &str, partition: i32, offset: i64) {
        let p = self.entry(topic, partition);
        p.next = p.next.max(offset);
    }

    /// Offsets worth committing now: partitions whose watermark moved since the last commit.
    pub fn to_commit(&self) -> Vec<((String, i32), i64)> {
        self.iter()
            .filter(|(_, p)| p.watermark() > p.committed && p.next > 0)
            .map(|((t, partition), p)| ((t.clone(), partition), p.watermark()))
            .collect()
    }

    pub fn committed(&mut self, done: &[((String, i32), i64)]) {
        for ((topic, partition), offset) in done {
            if let Some(p) = self.get_mut(topic, *partition) {
                p.committed = p.committed.max(*offset);
            }
        }
    }

    /// An asynchronous commit of `offsets` failed: the next [`to_commit`](Self::to_commit)
    /// offers these partitions again (a later commit that went through is simply repeated).
    pub fn commit_failed(&mut self, offsets: &[((String, i32), i64)]) {
        for ((topic, partition), offset) in offsets {
            if let Some(p) = self.get_mut(topic, *partition) {
                p.committed = p.committed.min(*offset - 1);
            }
        }
    }

    /// Every partition's watermark, moved since the last commit or not: what a synchronous
    /// commit sends so that no asynchronous one still on its way is relied on.
    pub fn watermarks(&self) -> Vec<((String, i32), i64)> {
        self.iter()
            .filter(|(_, p)| p.next > 0)
            .map(|((t, partition), p)| ((t.clone(), partition), p.watermark()))
            .collect()
    }

    /// Stops tracking `partitions`, returning their watermarks to commit (synchronously: an
    /// asynchronous commit of the same offsets may still be on its way).
    fn forget(&mut self, partitions: &[(String, i32)]) -> Vec<((String, i32), i64)> {
        let commit = partitions
            .iter()
            .filter_map(|tp| {
                let p = self.get(&tp.0, tp.1)?;
                (p.next > 0).then(|| (tp.clone(), p.watermark()))
            })
            .collect();
        for (topic, partition) in partitions {
            if let Some(m) = self.partitions.get_mut(topic) {
                m.remove(partition);
                if m.is_empty() {
                    self.partitions.remove(topic);
                }
            }
        }
        commit
    }

    /// Records delivered and not yet done, over all partitions.
    pub fn in_flight(&self) -> usize {
        self.iter().map(|(_, p)| p.pending).sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section is a few map operations; a panic elsewhere cannot tear them.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tpl_of(offsets: &[((String, i32), i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in offsets {
        // Only fails for an invalid offset value; ours are non-negative log offsets.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    tpl
}

fn tpl_of_partitions<'a>(
    partitions: impl IntoIterator<Item = &'a (String, i32)>,
) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (topic, partition) in partitions {
        tpl.add_partition(topic, *partition);
    }
    tpl
}

fn describe(offsets: &[((String, i32), i64)]) -> String {
    offsets
        .iter()
        .map(|((t, p), o)| format!("{t}-{p}@{o}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// librdkafka's `max.poll.interval.ms` when the config does not set it.
const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 300_000;
/// Keep-alive polls come at most this often, however short `max.poll.interval.ms` is.
const MIN_KEEP_ALIVE_AFTER_MS: u64 = 100;

/// The rdkafka context: turns rebalance callbacks into events and commits on revocation.
struct GroupContext {
    group: String,
    commit_offsets: bool,
    tracker: Arc<Mutex<OffsetTracker>>,
    events: Mutex<Vec<RebalanceEvent>>,
    /// Where assigned partitions' messages go (set once the consumer exists, before it
    /// subscribes).
    messages: OnceLock<Arc<MessageQueue>>,
    /// OAUTHBEARER tokens and the security failures librdkafka logs.
    security: SecurityContext,
}

/// The answer to an asynchronous commit: the partitions of a failed one are committed again
/// by the next commit (the records are processed; only their offsets are not on the broker
/// yet).
fn commit_answered(
    group: &str,
    tracker: &Mutex<OffsetTracker>,
    request_error: Option<KafkaError>,
    failed: &[((String, i32), i64)],
) {
    if let Some(e) = &request_error {
        warn!(group = %group, offsets = %describe(failed), error = %e,
            "committing offsets failed; the next commit sends them again");
    } else if !failed.is_empty() {
        warn!(group = %group, offsets = %describe(failed),
            "committing some partitions' offsets failed; the next commit sends them again");
    }
    if !failed.is_empty() {
        lock(tracker).commit_failed(failed);
    }
}

impl ClientContext for GroupContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        self.security.log(level, fac, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.security.error(error, reason);
    }

    fn generate_oauth_token(
        &self,
        config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.security.generate_oauth_token(config)
    }
}

impl ConsumerContext for GroupContext {
    /// The answer to a commit that went through the consumer queue (the source's own
    /// asynchronous commits answer on its message queue: [`commit_answered`]).
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let failed: Vec<((String, i32), i64)> = offsets
            .elements()
            .iter()
            .filter(|e| result.is_err() || e.error().is_err())
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
                _ => None,
            })
            .collect();
        commit_answered(&self.group, &self.tracker, result.err(), &failed);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Before the assignment starts fetching: no message of these partitions may
            // reach the consumer queue, which a poll only serves for events.
            if let Some(messages) = self.messages.get() {
                let elements = tpl.elements();
                messages.route(
                    consumer.client().native_ptr(),
                    elements.iter().map(|e| (e.topic(), e.partition())),
                );
            }
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let revoked = partitions_of(tpl);
            let commit = lock(&self.tracker).forget(&revoked);
            if self.commit_offsets && !commit.is_empty() {
                if let Err(e) = consumer.commit(&tpl_of(&commit), CommitMode::Sync) {
                    // The new owner re-reads from the last commit: duplicates, not loss.
                    warn!(group = %self.group, offsets = %describe(&commit), error = %e,
                        "committing revoked partitions failed");
                }
            }
            self.events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(RebalanceEvent::Revoked(revoked));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // A newly assigned partition starts unpaused (as in Kafka's Java consumer), even
            // if `keep_alive` paused it before a revocation: librdkafka would keep that pause.
            if let Err(e) = consumer.resume(tpl) {
                warn!(group = %self.group, error = %e, "resuming newly assigned partitions failed");
            }
            let assigned = partitions_of(tpl);
            if !assigned.is_empty() {
                self.events
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(RebalanceEvent::Assigned(assigned));
            }
        }
    }
}

/// A consumer-group member that tracks processed offsets.
pub struct ClassicSource {
    consumer: ClosedOffThread,
    tracker: Arc<Mutex<OffsetTracker>>,
    /// Hears the answers of the asynchronous commits (served by the polls).
    answers: Arc<CommitAnswers>,
    config: ClassicConfig,
    /// The partitions `keep_alive` paused; the next `poll` resumes them.
    paused: Arc<Mutex<BTreeSet<(String, i32)>>>,
    /// Seeks asked for and not made yet: the next `poll` or `keep_alive` makes them on a
    /// blocking thread before it reads, since librdkafka's seek waits (up to its timeout) for
    /// the fetcher, and the caller's thread runs other tasks.
    seeks: Arc<Mutex<BTreeMap<(String, i32), PendingSeek>>>,
}

/// A seek not made yet: to where, and whether failing it fails the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingSeek {
    offset: i64,
    /// A record given back must be read again (failing fails the poll); a skip forward only
    /// saves reading records the caller drops anyway (failing is logged).
    must: bool,
}

/// Most records a poll's list is sized for up front (`max.poll.records` may be far larger).
const MAX_PRESIZED_POLL: usize = 1024;

/// How long a seek may wait for librdkafka's fetcher (on a blocking thread).
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// The consumer and the queue its records are read from. The queue's handles are destroyed
/// first, before the consumer closes: librdkafka wants every queue handle gone before the
/// client is destroyed, and the close serves the revocation through the consumer queue alone.
struct Member {
    messages: Arc<MessageQueue>,
    consumer: BaseConsumer<GroupContext>,
    /// Whether records come with their headers ([`ClassicSource::read_headers`]).
    read_headers: AtomicBool,
}

impl Member {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        self.consumer.client().native_ptr()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.messages.shutdown();
    }
}

impl std::ops::Deref for Member {
    type Target = BaseConsumer<GroupContext>;

    fn deref(&self) -> &Self::Target {
        &self.consumer
    }
}

/// The consumer, whose last handle is dropped on a blocking thread: closing a librdkafka
/// consumer leaves the group and waits for the broker's answer, which must not hold up the
/// (shared) thread a task's source is dropped on when the task is killed.
struct ClosedOffThread(Option<Arc<Member>>);

impl ClosedOffThread {
    fn take(mut self) -> Arc<Member> {
        self.0.take().expect("the consumer is only taken once")
    }
}

impl std::ops::Deref for ClosedOffThread {
    type Target = Arc<Member>;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("the consumer is only taken on close")
    }
}

impl Drop for ClosedOffThread {
    fn drop(&mut self) {
        let Some(consumer) = self.0.take() else {
            return;
        };
        // A thread of its own, not the runtime's blocking pool: a runtime shutting down waits
        // for its blocking tasks, and a close may wait for the broker.
        let closing = std::thread::Builder::new()
            .name("spillway-close".into())
            .spawn(move || drop(consumer));
        if let Err(e) = closing {
            // The consumer went with the closure that could not run: closed here.
            warn!(error = %e, "no thread to close a consumer on; it was closed on the caller's");
        }
    }
}

impl ClassicSource {
    /// Creates the consumer; nothing is read before a subscribe.
    pub fn connect(config: ClassicConfig) -> Result<ClassicSource, ClassicError> {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("group.id", &config.group_id)
            // Connect's default for sink consumers: a new group starts at the beginning.
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
        // Security keys in either spelling are translated for librdkafka.
        let security = rdkafka_config(
            &mut client,
            config
                .overrides
                .iter()
                .filter(|(key, _)| !OWNED_KEYS.contains(&key.as_str()))
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .map_err(|e| ClassicError::Create {
            group: config.group_id.clone(),
            bootstrap: config.bootstrap_servers.clone(),
            reason: e.to_string(),
        })?;
        client
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "group.protocol",
                match config.protocol {
                    RebalanceProtocol::Classic => "classic",
                    RebalanceProtocol::Consumer => "consumer",
                },
            );
        if config.protocol == RebalanceProtocol::Consumer {
            // KIP-848 members get their session timeout from the broker.
            client.remove("session.timeout.ms");
        }
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let context = GroupContext {
            group: config.group_id.clone(),
            commit_offsets: config.commit_offsets,
            tracker: Arc::clone(&tracker),
            events: Mutex::new(Vec::new()),
            messages: OnceLock::new(),
            security,
        };
        let consumer: BaseConsumer<GroupContext> =
            client
                .create_with_context(context)
                .map_err(|e| ClassicError::Create {
                    group: config.group_id.clone(),
                    bootstrap: config.bootstrap_servers.clone(),
                    reason: e.to_string(),
                })?;
        let create_error = |reason: &str| ClassicError::Create {
            group: config.group_id.clone(),
            bootstrap: config.bootstrap_servers.clone(),
            reason: reason.to_owned(),
        };
        let messages = MessageQueue::new(consumer.client().native_ptr())
            .map(Arc::new)
            .ok_or_else(|| create_error("librdkafka made no consumer queue"))?;
        if consumer
            .context()
            .messages
            .set(Arc::clone(&messages))
            .is_err()
        {
            return Err(create_error("the consumer's message queue was set twice"));
        }
        let answers = Arc::new(CommitAnswers {
            group: config.group_id.clone(),
            tracker: Arc::clone(&tracker),
        });
        Ok(ClassicSource {
            consumer: ClosedOffThread(Some(Arc::new(Member {
                messages,
                consumer,
                read_headers: AtomicBool::new(true),
            }))),
            tracker,
            answers,
            config,
            paused: Arc::new(Mutex::new(BTreeSet::new())),
            seeks: Arc::default(),
        })
    }

    /// Whether the records of the next polls come with their headers (on unless turned off).
    /// Off, a record's headers are left unread and it has none: for a reader that looks at
    /// no header, since librdkafka allocates and frees a buffer per record to find even that
    /// a record has none.
    pub fn read_headers(&self, on: bool) {
        self.consumer.read_headers.store(on, Ordering::Relaxed);
    }

    pub fn group_id(&self) -> &str {
        &self.config.group_id
    }

    /// How long the member may go without polling before it must [`keep_alive`](Self::keep_alive):
    /// a quarter of librdkafka's `max.poll.interval.ms` (300 s by default), so that a stall
    /// shorter than that keeps what was fetched ahead.
    pub fn keep_alive_after(&self) -> Duration {
        let interval_ms = self
            .config
            .overrides
            .get("max.poll.interval.ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_MAX_POLL_INTERVAL_MS);
        Duration::from_millis((interval_ms / 4).max(MIN_KEEP_ALIVE_AFTER_MS))
    }

    /// Joins the group for `topics`; a name starting with `^` is a regular expression
    /// (librdkafka's rule), which is how `topics.regex` is passed.
    pub fn subscribe(&self, topics: &[String]) -> Result<(), ClassicError> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        self.consumer
            .subscribe(&names)
            .map_err(|e| ClassicError::Subscribe {
                group: self.config.group_id.clone(),
                topics: topics.join(","),
                reason: e.to_string(),
            })
    }

    /// Waits up to `timeout` for records, then takes what else is already buffered, up to
    /// `max_poll_records`. Rebalances that happened meanwhile come first in the answer.
    pub async fn poll(&self, timeout: Duration) -> Result<ClassicPoll, ClassicError> {
        let deadline = Instant::now().checked_add(timeout);
        let left = || deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
        loop {
            if let Some(ready) = self.poll_ready()? {
                return Ok(ready);
            }
            if self.needs_blocking_thread() {
                break;
            }
            // Nothing to do but wait: in this runtime, woken by librdkafka's callback.
            if !self.consumer.messages.arrival(left()).await {
                return Ok(handed_out(&self.consumer, &self.tracker, Vec::new()));
            }
        }
        self.poll_on_blocking_thread(left()).await
    }

    /// [`poll`](Self::poll) when it has work that may block first (seeks, resuming paused
    /// partitions, serving the group's events): all of it on a blocking thread, the wait for
    /// records that follows included.
    async fn poll_on_blocking_thread(
        &self,
        timeout: Duration,
    ) -> Result<ClassicPoll, ClassicError> {
        let consumer = Arc::clone(&self.consumer);
        let tracker = Arc::clone(&self.tracker);
        let max = self.config.max_poll_records;
        let group = self.config.group_id.clone();
        let bootstrap = self.config.bootstrap_servers.clone();
        let paused = Arc::clone(&self.paused);
        let seeks = Arc::clone(&self.seeks);
        tokio::task::spawn_blocking(move || {
            make_seeks(&consumer, &seeks, &group)?;
            let to_resume = std::mem::take(&mut *paused.lock().unwrap_or_else(|e| e.into_inner()));
            if !to_resume.is_empty() {
                // Every partition paused, assigned now or not: librdkafka keeps a pause across
                // a revocation, and would keep a partition paused when it is assigned again.
                // A resumed partition is fetched from the last record handed out.
                if let Err(e) = consumer.resume(&tpl_of_partitions(&to_resume)) {
                    warn!(group = %group, error = %e, "resuming the paused partitions failed");
                }
            }
            // Sized for a full poll (up to a bound): no regrowth, each a copy of the records.
            let mut records = Vec::with_capacity(max.min(MAX_PRESIZED_POLL));
            let mut copies = Copies::new(COPY_CHUNK);
            let deadline = Instant::now().checked_add(timeout);
            loop {
                serve_events(&consumer, &group, &bootstrap, &mut records, &mut copies)?;
                let rebalanced = !lock(&consumer.context().events).is_empty();
                if rebalanced || records.len() >= max {
                    break;
                }
                let wait =
                    deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
                // The first record waited for (an event on the consumer queue ends the wait
                // early), then what else is buffered: librdkafka's batch read would wait for
                // all of `max`.
                let first = consumer.messages.take(wait, 1);
                if first.len() > 0 {
                    read(
                        &consumer,
                        &first,
                        &mut records,
                        &mut copies,
                        &group,
                        &bootstrap,
                    )?;
                    read_buffered(
                        &consumer,
                        max,
                        &mut records,
                        &mut copies,
                        &group,
                        &bootstrap,
                    )?;
                    break;
                }
                if wait.is_zero() || !records.is_empty() {
                    break;
                }
            }
            Ok(handed_out(&consumer, &tracker, records))
        })
        .await
        .map_err(|e| ClassicError::Cancelled(e.to_string()))?
    }

    /// The records already waiting, taken on the caller's thread, when there is nothing else
    /// to do first (no event to serve, no seek to make, no partition to resume): none of it
    /// blocks, and the poll needs no hand-off to a blocking thread and back.
    fn poll_ready(&self) -> Result<Option<ClassicPoll>, ClassicError> {
        if self.needs_blocking_thread() {
            return Ok(None);
        }
        let member = &**self.consumer;
        let max = self.config.max_poll_records;
        let mut records = Vec::with_capacity(max.min(MAX_PRESIZED_POLL));
        let mut copies = Copies::new(COPY_CHUNK);
        let taken = read_buffered(
            member,
            max,
            &mut records,
            &mut copies,
            &self.config.group_id,
            &self.config.bootstrap_servers,
        )?;
        if taken == 0 {
            return Ok(None);
        }
        Ok(Some(handed_out(member, &self.tracker, records)))
    }

    /// Whether a poll has work that may block first: an event to serve (a rebalance's
    /// callbacks commit and wait), a seek to make, partitions to resume.
    fn needs_blocking_thread(&self) -> bool {
        self.consumer.messages.events_waiting()
            || !lock(&self.seeks).is_empty()
            || !lock(&self.paused).is_empty()
    }

    /// Serves the group without taking records: pauses every assigned partition (those
    /// assigned since the last call too) and polls without waiting, which counts as a poll
    /// for `max.poll.interval.ms` and runs the rebalance callbacks, whose events come back.
    /// librdkafka drops what it fetched ahead for a paused partition and, once the next
    /// [`poll`](Self::poll) resumes it, fetches from the last record handed out. A record of a
    /// partition assigned during this very call (not paused yet) comes back too: it was
    /// handed out, so it must be processed.
    pub async fn keep_alive(&self) -> Result<ClassicPoll, ClassicError> {
        let consumer = Arc::clone(&self.consumer);
        let tracker = Arc::clone(&self.tracker);
        let group = self.config.group_id.clone();
        let bootstrap = self.config.bootstrap_servers.clone();
        let paused = Arc::clone(&self.paused);
        let seeks = Arc::clone(&self.seeks);
        tokio::task::spawn_blocking(move || {
            make_seeks(&consumer, &seeks, &group)?;
            match consumer.assignment() {
                Ok(assignment) => {
                    // Noted before pausing: a partition whose pause half-failed is resumed too.
                    paused
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(partitions_of(&assignment));
                    if let Err(e) = consumer.pause(&assignment) {
                        warn!(group = %group, error = %e, "pausing the assignment failed");
                    }
                }
                Err(e) => {
                    warn!(group = %group, error = %e, "reading the assignment to pause it failed")
                }
            }
            // Only the consumer queue: the records wait in the message queue for `poll`.
            let mut records = Vec::new();
            serve_events(
                &consumer,
                &group,
                &bootstrap,
                &mut records,
                &mut Copies::new(0),
            )?;
            Ok(handed_out(&consumer, &tracker, records))
        })
        .await
        .map_err(|e| ClassicError::Cancelled(e.to_string()))?
    }

    /// The record is processed (accepted or rejected): it may be committed past.
    pub fn mark_done(&self, topic: &str, partition: i32, offset: i64) {
        lock(&self.tracker).done(topic, partition, offset);
    }

    /// [`mark_done`](Self::mark_done) for many records under one lock.
    pub fn mark_done_all<'a>(&self, records: impl IntoIterator<Item = (&'a str, i32, i64)>) {
        lock(&self.tracker).done_all(records);
    }

    /// Reads `topic-partition` again from `offset` (a record given back unprocessed). Later
    /// records of the partition already in flight are read again too: duplicates, not loss.
    /// The seek is made by the next [`poll`](Self::poll) or [`keep_alive`](Self::keep_alive),
    /// before it reads; if it fails, that call fails.
    pub fn seek_back(&self, topic: &str, partition: i32, offset: i64) {
        lock(&self.tracker).rewind(topic, partition, offset);
        lock(&self.seeks).insert(
            (topic.to_owned(), partition),
            PendingSeek { offset, must: true },
        );
    }

    /// Moves `topic-partition` forward to `offset` (the sink has every record before it), unless
    /// a record at or after it was delivered already; never moves back. Returns whether it
    /// asked for a seek (made by the next poll, a failure only logged). librdkafka may still
    /// hand out records fetched before the seek, and a seek before the partition's first fetch
    /// can be overtaken by its committed offset, so callers still drop records below `offset`
    /// and seek again when they see one.
    pub fn skip_to(&self, topic: &str, partition: i32, offset: i64) -> bool {
        let mut tracker = lock(&self.tracker);
        if tracker.next(topic, partition) >= offset {
            return false;
        }
        let mut seeks = lock(&self.seeks);
        let seek = seeks
            .entry((topic.to_owned(), partition))
            .or_insert(PendingSeek {
                offset,
                must: false,
            });
        // A rewind asked for before stays one; the later position wins.
        seek.offset = offset;
        tracker.skipped_to(topic, partition, offset);
        true
    }

    /// Seeks asked for and not made yet, by partition: (offset, whether it must succeed).
    pub fn pending_seeks(&self) -> Vec<((String, i32), i64)> {
        lock(&self.seeks)
            .iter()
            .map(|(tp, seek)| (tp.clone(), seek.offset))
            .collect()
    }

    /// One past the highest offset of `topic-partition` delivered (0 when none was).
    pub fn delivered_up_to(&self, topic: &str, partition: i32) -> i64 {
        lock(&self.tracker).next(topic, partition)
    }

    /// Commits every partition's processed watermark that moved; returns what was committed.
    /// Asynchronous: librdkafka queues the commit and this returns (a failure it reports later
    /// through `poll` makes the next commit send those partitions again). Nothing when
    /// `commit_offsets` is off: the sink commits them in its transactions.
    pub async fn commit(&self) -> Result<Vec<((String, i32), i64)>, ClassicError> {
        let offsets = lock(&self.tracker).to_commit();
        if offsets.is_empty() || !self.config.commit_offsets {
            return Ok(offsets);
        }
        // Queueing does not wait for the broker: no blocking thread needed. The answer comes
        // to the message queue, served by a poll.
        let consumer = &**self.consumer;
        match consumer
            .messages
            .commit(consumer.native(), &tpl_of(&offsets), &self.answers)
        {
            Ok(()) => {
                lock(&self.tracker).committed(&offsets);
                Ok(offsets)
            }
            // Nothing to commit for partitions that moved away meanwhile.
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(Vec::new()),
            Err(e) => Err(self.commit_error(&offsets, e)),
        }
    }

    /// Commits every tracked partition's watermark and waits for the broker's answer: the
    /// asynchronous commits before it may still be on their way.
    async fn commit_sync(&self) -> Result<Vec<((String, i32), i64)>, ClassicError> {
        let offsets = lock(&self.tracker).watermarks();
        if offsets.is_empty() || !self.config.commit_offsets {
            return Ok(offsets);
        }
        let consumer = Arc::clone(&self.consumer);
        let tracker = Arc::clone(&self.tracker);
        let result = tokio::task::spawn_blocking(move || {
            let result = consumer.commit(&tpl_of(&offsets), CommitMode::Sync);
            if result.is_ok() {
                lock(&tracker).committed(&offsets);
            }
            (offsets, result)
        })
        .await
        .map_err(|e| ClassicError::Cancelled(e.to_string()))?;
        match result {
            (offsets, Ok(())) => Ok(offsets),
            (_, Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))) => Ok(Vec::new()),
            (offsets, Err(e)) => Err(self.commit_error(&offsets, e)),
        }
    }

    fn commit_error(&self, offsets: &[((String, i32), i64)], e: KafkaError) -> ClassicError {
        ClassicError::Commit {
            group: self.config.group_id.clone(),
            offsets: describe(offsets),
            reason: e.to_string(),
        }
    }

    /// The member's current group metadata (group, generation, member id), for a producer
    /// that commits this group's offsets in a transaction; `None` before the first join.
    pub fn group_metadata(&self) -> Option<GroupMetadata> {
        self.consumer.group_metadata()
    }

    /// Records delivered and not yet marked done.
    pub fn in_flight(&self) -> usize {
        lock(&self.tracker).in_flight()
    }

    /// Commits what is processed (synchronously) and leaves the group.
    pub async fn close(self) -> Result<(), ClassicError> {
        let committed = self.commit_sync().await;
        let consumer = self.consumer.take();
        tokio::task::spawn_blocking(move || {
            consumer.unsubscribe();
            // Dropping the last handle closes the consumer, which leaves the group.
            drop(consumer);
        })
        .await
        .map_err(|e| ClassicError::Cancelled(e.to_string()))?;
        committed.map(|_| ())
    }
}

/// Makes the seeks asked for since the last poll (on a blocking thread). A partition that is
/// not assigned any more is left alone: its new owner reads from the last commit.
fn make_seeks(
    consumer: &BaseConsumer<GroupContext>,
    seeks: &Mutex<BTreeMap<(String, i32), PendingSeek>>,
    group: &str,
) -> Result<(), ClassicError> {
    let pending = std::mem::take(&mut *lock(seeks));
    if pending.is_empty() {
        return Ok(());
    }
    let assigned = consumer
        .assignment()
        .map(|a| partitions_of(&a))
        .unwrap_or_default();
    for ((topic, partition), seek) in pending {
        if !assigned.contains(&(topic.clone(), partition)) {
            debug!(group = %group, %topic, partition, offset = seek.offset, "not seeking a partition no longer assigned");
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        // Only fails for an invalid offset value; a log offset is valid.
        let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(seek.offset));
        if let Err(e) = consumer.seek_partitions(tpl, SEEK_TIMEOUT) {
            let error = ClassicError::Seek {
                group: group.to_owned(),
                topic: topic.clone(),
                partition,
                offset: seek.offset,
                reason: e.to_string(),
            };
            if seek.must {
                return Err(error);
            }
            warn!(error = %error, "could not move to the sink task's start offset; records before it are read and dropped");
        }
    }
    Ok(())
}

/// What a poll hands out: the rebalances since the last one, then `records`, which count as
/// delivered from now on.
fn handed_out(
    consumer: &BaseConsumer<GroupContext>,
    tracker: &Mutex<OffsetTracker>,
    records: Vec<ClassicRecord>,
) -> ClassicPoll {
    let events = std::mem::take(
        &mut *consumer
            .context()
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    lock(tracker).delivered_all(
        records
            .iter()
            .map(|r| (r.topic.as_str(), r.partition, r.offset)),
    );
    ClassicPoll { events, records }
}

/// Serves what waits on the consumer queue (rebalances, errors, commit answers): at least one
/// poll without waiting, which also counts as a poll for `max.poll.interval.ms`. A message
/// found there (none should be: assigned partitions are routed to the message queue) is
/// handed out with the rest.
fn serve_events(
    consumer: &Member,
    group: &str,
    bootstrap: &str,
    records: &mut Vec<ClassicRecord>,
    copies: &mut Copies,
) -> Result<(), ClassicError> {
    // Each poll takes one event; the bound only guards against a queue that never empties.
    for _ in 0..MAX_EVENTS_PER_POLL {
        match consumer.poll(Duration::ZERO) {
            None => {}
            Some(Ok(message)) => push_owned(records, &message, &mut None, copies),
            Some(Err(e)) => consumer_error(consumer, group, bootstrap, e)?,
        }
        if !consumer.messages.events_waiting() {
            break;
        }
    }
    Ok(())
}

/// Most events one poll serves before it reads records.
const MAX_EVENTS_PER_POLL: usize = 1024;

/// Takes what is buffered until `records` holds `max`, without waiting, in calls of at most
/// [`MAX_PRESIZED_POLL`] messages (however large `max.poll.records` is); returns how many
/// messages it took, errors included.
fn read_buffered(
    consumer: &Member,
    max: usize,
    records: &mut Vec<ClassicRecord>,
    copies: &mut Copies,
    group: &str,
    bootstrap: &str,
) -> Result<usize, ClassicError> {
    let mut taken = 0;
    while records.len() < max {
        let want = (max - records.len()).min(MAX_PRESIZED_POLL);
        let batch = consumer.messages.take(Duration::ZERO, want);
        taken += batch.len();
        read(consumer, &batch, records, copies, group, bootstrap)?;
        if batch.len() < want {
            break;
        }
    }
    Ok(taken)
}

/// Appends `batch`'s records; an error in place of a record fails the poll when it is fatal
/// and is only news otherwise (the records after it are kept: librdkafka handed them out).
fn read(
    consumer: &Member,
    batch: &message_queue::Batch,
    records: &mut Vec<ClassicRecord>,
    copies: &mut Copies,
    group: &str,
    bootstrap: &str,
) -> Result<(), ClassicError> {
    let read_headers = consumer.read_headers.load(Ordering::Relaxed);
    batch.read_into(copies, read_headers, records, |e| {
        consumer_error(consumer, group, bootstrap, e)
    })
}

/// An error the consumer reported: fatal ones fail the poll, the rest librdkafka retries
/// itself.
fn consumer_error(
    consumer: &Member,
    group: &str,
    bootstrap: &str,
    e: KafkaError,
) -> Result<(), ClassicError> {
    let fatal = |reason: String| ClassicError::Fatal {
        group: group.to_owned(),
        reason,
    };
    if let Some(reason) = refused_join(group, &e) {
        return Err(fatal(reason));
    }
    if let KafkaError::MessageConsumptionFatal(code) = e {
        return Err(fatal(code.to_string()));
    }
    if is_fatal(&e) {
        return Err(fatal(e.to_string()));
    }
    // Refused credentials or certificates: librdkafka would retry forever.
    let security = &consumer.context().security;
    if let Some(reason) = security
        .security_failure(&e)
        .or_else(|| security.diagnose(bootstrap, &e))
    {
        return Err(fatal(reason));
    }
    debug!(group = %group, error = %e, "consumer reported an error");
    Ok(())
}

/// The coordinator's refusal of this member because a group of another type holds the id
/// (Kafka has one namespace for group ids): a classic JoinGroup gets INCONSISTENT_GROUP_PROTOCOL
/// when a share group holds it, a ConsumerGroupHeartbeat GROUP_ID_NOT_FOUND. librdkafka
/// reports it as a consumer error and joins again forever, so the member would look alive
/// while it never reads.
fn refused_join(group: &str, e: &KafkaError) -> Option<String> {
    let code = match e {
        KafkaError::MessageConsumption(code) | KafkaError::MessageConsumptionFatal(code) => *code,
        _ => return None,
    };
    let other = match code {
        RDKafkaErrorCode::InconsistentGroupProtocol => {
            "the group coordinator refused to let this consumer join (INCONSISTENT_GROUP_PROTOCOL): \
             another type of group — on Kafka 4.x a share group, which is kept until deleted — \
             holds the id"
        }
        RDKafkaErrorCode::GroupIdNotFound => {
            "the group coordinator answered GROUP_ID_NOT_FOUND: another type of group (a share \
             group) holds the id"
        }
        _ => return None,
    };
    Some(format!(
        "{other}. Kafka has one namespace for group ids. Use another group id \
         (consumer.override.group.id, or remove it for the default connect-<name>), or delete \
         the other group once it has no members (kafka-share-groups.sh --delete --group {group})"
    ))
}

fn is_fatal(e: &KafkaError) -> bool {
    matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal))
}

/// `m`'s topic as a shared name: `last`'s when it is the same topic as the message before.
fn shared_topic(name: &str, last: &mut Option<Topic>) -> Topic {
    match last {
        Some(topic) if topic.as_str() == name => topic.clone(),
        _ => last.insert(Topic::interned(name)).clone(),
    }
}

/// `m` as a record at the end of `out`, its key, value and headers copied.
pub(crate) fn push_owned<M: Message>(
    out: &mut Vec<ClassicRecord>,
    m: &M,
    last_topic: &mut Option<Topic>,
    copies: &mut Copies,
) {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_owned(), h.value.map(|v| copies.copy(v))))
                .collect()
        })
        .unwrap_or_default();
    let timestamp = match m.timestamp() {
        rdkafka::Timestamp::NotAvailable => None,
        rdkafka::Timestamp::CreateTime(t) => Some((t, false)),
        rdkafka::Timestamp::LogAppendTime(t) => Some((t, true)),
    };
    push_classic_record(
        out,
        shared_topic(m.topic(), last_topic),
        m.partition(),
        m.offset(),
        copies.copy_pair(m.key(), m.payload()),
        headers,
        timestamp,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_read_is_the_runtime_s_raw_record_with_its_timestamp_s_kind() {
        let mut out = Vec::new();
        let mut read = |timestamp| {
            push_classic_record(
                &mut out,
                Topic::from("t"),
                3,
                42,
                (None, Some(Bytes::from_static(b"v"))),
                Vec::new(),
                timestamp,
            );
            out.pop().expect("one record")
        };
        let producer = read(Some((1_700_000_000_000, false)));
        assert_eq!(
            (producer.timestamp, producer.timestamp_type),
            (Some(1_700_000_000_000), TimestampType::CreateTime)
        );
        let log = read(Some((5, true)));
        assert_eq!(
            (log.timestamp, log.timestamp_type),
            (Some(5), TimestampType::LogAppendTime)
        );
        let none = read(None);
        assert_eq!(
            (none.timestamp, none.timestamp_type),
            (None, TimestampType::NoTimestamp)
        );
        // A consumer group counts no deliveries and holds no locks.
        assert_eq!((none.delivery_count, none.lock_deadline), (None, None));
        assert_eq!((none.partition, none.offset), (3, 42));
    }

    #[test]
    fn the_watermark_stops_at_the_first_record_in_flight() {
        let mut t = OffsetTracker::default();
        for o in 0..5 {
            t.delivered("t", 0, o);
        }
        t.done("t", 0, 0);
        t.done("t", 0, 1);
        t.done("t", 0, 3);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 2)]);
        t.done("t", 0, 2);
        t.done("t", 0, 4);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 5)]);
        t.committed(&[(("t".to_owned(), 0), 5)]);
        assert!(t.to_commit().is_empty(), "nothing moved since the commit");
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_rewound_partition_is_not_committed_past_the_rewind() {
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            t.delivered("t", 1, o);
        }
        t.done("t", 1, 10);
        t.done("t", 1, 11);
        t.rewind("t", 1, 12);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 1), 12)]);
        // A late verdict for a rewound record does not move the watermark past 12.
        t.done("t", 1, 13);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 1), 12)]);
    }

    #[test]
    fn skipping_ahead_moves_the_delivered_mark_forward_only() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.next("a", 0), 0);
        t.skipped_to("a", 0, 100);
        assert_eq!(t.next("a", 0), 100);
        assert_eq!(t.to_commit(), vec![(("a".to_owned(), 0), 100)]);
        t.delivered("a", 1, 40);
        t.skipped_to("a", 1, 20);
        assert_eq!(t.next("a", 1), 41, "never back");
    }

    #[test]
    fn forgotten_partitions_return_what_was_left_to_commit() {
        let mut t = OffsetTracker::default();
        t.delivered("a", 0, 0);
        t.delivered("b", 0, 7);
        t.done("a", 0, 0);
        let left = t.forget(&[("a".to_owned(), 0)]);
        assert_eq!(left, vec![(("a".to_owned(), 0), 1)]);
        t.done("a", 0, 0);
        assert_eq!(t.in_flight(), 1);
    }

    #[test]
    fn a_failed_commit_is_offered_again_by_the_next_one() {
        let mut t = OffsetTracker::default();
        for o in 0..4 {
            t.delivered("t", 0, o);
            t.delivered("t", 1, o);
        }
        t.done_all([("t", 0, 0), ("t", 0, 1), ("t", 1, 0)]);
        let sent = t.to_commit();
        assert_eq!(
            sent,
            vec![(("t".to_owned(), 0), 2), (("t".to_owned(), 1), 1)]
        );
        t.committed(&sent);
        assert!(t.to_commit().is_empty(), "sent, not yet answered");
        // Partition 0's commit failed; partition 1's went through.
        t.commit_failed(&[(("t".to_owned(), 0), 2)]);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 2)]);
        // A later commit went through meanwhile: the failure of an older one repeats it.
        t.done("t", 1, 1);
        t.committed(&[(("t".to_owned(), 1), 2)]);
        t.commit_failed(&[(("t".to_owned(), 1), 1)]);
        assert_eq!(
            t.to_commit(),
            vec![(("t".to_owned(), 0), 2), (("t".to_owned(), 1), 2)]
        );
    }

    #[test]
    fn a_synchronous_commit_covers_every_partition_read_not_only_those_that_moved() {
        let mut t = OffsetTracker::default();
        t.delivered("a", 0, 5);
        t.done("a", 0, 5);
        t.committed(&[(("a".to_owned(), 0), 6)]);
        t.delivered("a", 1, 0);
        // Tracked, never read: nothing to commit.
        t.skipped_to("b", 0, 0);
        assert_eq!(t.to_commit(), vec![(("a".to_owned(), 1), 0)]);
        assert_eq!(
            t.watermarks(),
            vec![(("a".to_owned(), 0), 6), (("a".to_owned(), 1), 0)]
        );
        // A revocation commits its partitions' watermarks though an asynchronous commit of
        // the same offsets was sent.
        assert_eq!(
            t.forget(&[("a".to_owned(), 0)]),
            vec![(("a".to_owned(), 0), 6)]
        );
    }

    #[test]
    fn records_done_out_of_order_move_the_watermark_only_past_contiguous_ones() {
        let mut t = OffsetTracker::default();
        for o in 0..10 {
            t.delivered("t", 0, o);
        }
        t.done_all([("t", 0, 9), ("t", 0, 3), ("t", 0, 1), ("t", 0, 2)]);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 0)]);
        assert_eq!(t.in_flight(), 6);
        t.done("t", 0, 0);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 4)]);
        // Done twice, or never delivered: nothing changes.
        t.done("t", 0, 3);
        t.done("t", 0, 42);
        assert_eq!(t.in_flight(), 5);
        for o in [8, 4, 6, 5, 7] {
            t.done("t", 0, o);
        }
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 10)]);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn records_of_interleaved_partitions_are_tracked_each_in_its_own_partition() {
        let mut t = OffsetTracker::default();
        t.delivered_all([
            ("a", 0, 0),
            ("a", 0, 1),
            ("a", 1, 7),
            ("b", 1, 3),
            ("a", 0, 2),
            ("a", 1, 8),
        ]);
        assert_eq!((t.next("a", 0), t.next("a", 1), t.next("b", 1)), (3, 9, 4));
        assert_eq!(t.in_flight(), 6);
        t.done_all([
            ("a", 0, 0),
            ("a", 0, 1),
            ("b", 1, 3),
            ("a", 1, 8),
            ("z", 0, 1),
        ]);
        assert_eq!(
            t.to_commit(),
            vec![
                (("a".to_owned(), 0), 2),
                (("a".to_owned(), 1), 7),
                (("b".to_owned(), 1), 4)
            ]
        );
        assert_eq!(t.in_flight(), 2, "a-0@2 and a-1@7");
    }

    #[test]
    fn a_record_delivered_again_is_in_flight_again() {
        let mut t = OffsetTracker::default();
        for o in [5, 6, 7] {
            t.delivered("t", 0, o);
        }
        t.done("t", 0, 6);
        // Delivered again (a seek raced with a fetch), below and inside what is tracked.
        t.delivered("t", 0, 6);
        t.delivered("t", 0, 3);
        t.delivered("t", 0, 5);
        assert_eq!(t.in_flight(), 4);
        t.done_all([("t", 0, 5), ("t", 0, 6), ("t", 0, 7)]);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 3)]);
        t.done("t", 0, 3);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 8)]);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_rewind_forgets_done_and_pending_records_after_it() {
        let mut t = OffsetTracker::default();
        for o in 0..6 {
            t.delivered("t", 0, o);
        }
        t.done_all([("t", 0, 1), ("t", 0, 4)]);
        t.rewind("t", 0, 3);
        assert_eq!(t.in_flight(), 2, "0 and 2");
        assert_eq!(t.next("t", 0), 3);
        t.done_all([("t", 0, 0), ("t", 0, 2)]);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 3)]);
        t.delivered("t", 0, 3);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 3)]);
        t.done("t", 0, 3);
        assert_eq!(t.to_commit(), vec![(("t".to_owned(), 0), 4)]);
    }

    /// The runs against the plainest model of the same rules: an entry per offset.
    #[test]
    fn runs_of_offsets_track_what_an_entry_per_offset_would() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        #[derive(Default)]
        struct Model {
            offsets: BTreeMap<i64, bool>,
            next: i64,
        }
        impl Model {
            fn drop_done_front(&mut self) {
                while let Some(entry) = self.offsets.first_entry() {
                    if !*entry.get() {
                        break;
                    }
                    entry.remove();
                }
            }
        }
        for seed in 0..200u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut p = PartitionProgress::default();
            let mut m = Model::default();
            for step in 0..300 {
                let offset = rng.gen_range(0..60i64);
                match rng.gen_range(0..10) {
                    // Mostly the next offsets in order, one or a run, sometimes after a gap.
                    0..=3 => {
                        let first = m.next + rng.gen_range(0..2i64);
                        let end = first + rng.gen_range(1..4i64);
                        if end == first + 1 && rng.gen_bool(0.5) {
                            p.delivered(first);
                        } else {
                            p.delivered_run(first, end);
                        }
                        for o in first..end {
                            m.offsets.insert(o, false);
                        }
                        m.next = m.next.max(end);
                    }
                    4 => {
                        let end = offset + rng.gen_range(1..3i64);
                        p.delivered_run(offset, end);
                        for o in offset..end {
                            m.offsets.insert(o, false);
                        }
                        m.next = m.next.max(end);
                    }
                    // Done: from the first in flight, or anywhere; one or a run.
                    5..=8 => {
                        let first = if rng.gen_bool(0.5) {
                            m.offsets.keys().next().copied().unwrap_or(offset)
                        } else {
                            offset
                        };
                        let end = first + rng.gen_range(1..4i64);
                        if end == first + 1 && rng.gen_bool(0.5) {
                            p.remove(first);
                        } else {
                            p.done_run(first, end);
                        }
                        for o in first..end {
                            if let Some(done) = m.offsets.get_mut(&o) {
                                *done = true;
                            }
                        }
                        m.drop_done_front();
                    }
                    _ => {
                        p.truncate(offset);
                        m.offsets.retain(|o, _| *o < offset);
                        m.drop_done_front();
                        p.next = p.next.min(offset);
                        m.next = m.next.min(offset);
                    }
                }
                let pending = m.offsets.values().filter(|done| !**done).count();
                let watermark = m.offsets.keys().next().copied().unwrap_or(m.next);
                assert_eq!(
                    (p.pending, p.watermark(), p.next),
                    (pending, watermark, m.next),
                    "seed {seed}, step {step}: {:?}",
                    p.runs
                );
                assert!(p.runs.front().is_none_or(|r| !r.done), "{:?}", p.runs);
                assert!(
                    p.runs
                        .iter()
                        .zip(p.runs.iter().skip(1))
                        .all(|(a, b)| a.first < a.end && a.end <= b.first),
                    "runs ascend and do not overlap: {:?}",
                    p.runs
                );
            }
        }
    }

    #[test]
    fn overrides_of_owned_keys_are_ignored() {
        let mut config = ClassicConfig::new("127.0.0.1:1", "g");
        config
            .overrides
            .insert("enable.auto.commit".into(), "true".into());
        config
            .overrides
            .insert("fetch.min.bytes".into(), "1".into());
        assert!(ClassicSource::connect(config).is_ok());
    }

    /// `key` as the created consumer runs with it: librdkafka's own copy of its settings.
    fn setting_in_effect(source: &ClassicSource, key: &str) -> String {
        let member = source.consumer.0.as_ref().expect("a connected source");
        let key = std::ffi::CString::new(key).expect("a key without NUL");
        let mut value = [0 as std::ffi::c_char; 64];
        let mut size = value.len();
        // SAFETY: the consumer is live; librdkafka writes at most `size` bytes, NUL included.
        let result = unsafe {
            let conf = rdkafka::bindings::rd_kafka_conf(member.native());
            rdkafka::bindings::rd_kafka_conf_get(conf, key.as_ptr(), value.as_mut_ptr(), &mut size)
        };
        assert_eq!(
            result,
            rdkafka::bindings::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK,
            "{key:?} is a librdkafka setting"
        );
        // SAFETY: NUL-terminated by `rd_kafka_conf_get`.
        unsafe { std::ffi::CStr::from_ptr(value.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn the_prefetch_queue_is_refilled_a_tenth_of_a_second_after_it_was_full_unless_overridden() {
        let source =
            ClassicSource::connect(ClassicConfig::new("127.0.0.1:1", "g")).expect("created");
        assert_eq!(
            setting_in_effect(&source, "fetch.queue.backoff.ms"),
            FETCH_QUEUE_BACKOFF_MS
        );
        let mut config = ClassicConfig::new("127.0.0.1:1", "g");
        config
            .overrides
            .insert("fetch.queue.backoff.ms".into(), "5".into());
        let source = ClassicSource::connect(config).expect("created");
        assert_eq!(setting_in_effect(&source, "fetch.queue.backoff.ms"), "5");
    }
}
