//! [`ExactlyOnceWriter`]: the kafka sink's transactions under `delivery.guarantee=exactly_once`.
//!
//! One transaction per `put` batch, committed by `flush` (before the runtime acknowledges):
//!
//! - **share mode (ledger):** the batch's output records and, per source record, a ledger entry
//!   (key `topic/partition/offset`) on the ledger topic, partitioned by source partition. A
//!   record delivered again (delivery count > 1) is looked up in the ledger first and, when its
//!   entry is there, accepted without writing it again. Entries whose ACCEPT the broker made
//!   durable ([`acknowledged`](ExactlyOnceWriter::acknowledged)) are tombstoned in the next
//!   transaction. A transaction that cannot commit before the records' acquisition locks run
//!   out (less `lock_margin`) is aborted and its records released.
//! - **classic mode:** each transaction writes, per source partition, a checkpoint (key
//!   `checkpoint:<connector>/<topic>/<partition>`, value the next offset) to the ledger topic,
//!   with the output records; a task assigned the partition later starts after it. Where the
//!   consumer group's offsets go depends on where the group lives ([`GroupOffsets`]): in the
//!   transaction when it is on the target cluster, else to the source cluster by the runtime
//!   once the transaction has committed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use spillway_core::{RecordCoordinates, SinkError, Topic, TopicPartition};
use spillway_kafka::classic::GroupMetadata;
use spillway_kafka::producer::{OutRecord, TransactionalProducer, TxnError, Written};
use spillway_kafka::security::{ClientSecurity, SecuritySettings};

use crate::ledger::{
    checkpoint_key, checkpoint_value, ledger_key, ledger_partition, WRITER_HEADER,
};
use crate::ledger_reader::{LedgerError, LedgerReader};

/// Where the share mode's ledger lives.
#[derive(Debug, Clone)]
pub struct LedgerSettings {
    pub topic: String,
    pub cache_dir: PathBuf,
    /// Acquisition-lock safety margin: a transaction must commit this long before the
    /// earliest lock deadline of its records.
    pub lock_margin: Duration,
}

/// Classic mode: where the consumer group's offsets are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOffsets {
    /// The group lives on the target cluster: its offsets commit in the transaction
    /// (`send_offsets_to_transaction`, fenced by the group's generation), atomically with the
    /// output; the runtime commits none of its own.
    InTransaction,
    /// The group lives on another cluster (a mirror flow): a transaction on the target cannot
    /// hold them. Kafka would refuse or misfile them there (that coordinator knows neither the
    /// group's members nor, usually, the source topic), which fails or stalls every
    /// transaction. The runtime commits them to the source group after the transaction has
    /// committed; the ledger checkpoints, committed with the output, are the exact resume
    /// point, so records read again after a lost source commit are skipped, not written twice.
    /// MirrorMaker 2 (KIP-656) likewise keeps its exactly-once position on the target.
    AfterCommit,
}

/// What the writer needs to start.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub bootstrap: String,
    pub transactional_id: String,
    pub producer_overrides: Vec<(String, String)>,
    /// Longest a transaction step (init, offsets, commit, abort) may take.
    pub step_timeout: Duration,
    /// Classic mode: where the consumer group's offsets go.
    pub group_offsets: GroupOffsets,
}

/// Classic mode: a checkpoint per `(topic, partition, next offset)` on the ledger, with the
/// header naming the writer.
fn checkpoint_records<'a>(
    classic: &Classic,
    transactional_id: &str,
    next: impl Iterator<Item = (&'a str, i32, i64)>,
) -> Vec<OutRecord> {
    let writer = Bytes::from(transactional_id.to_owned());
    let ledger_topic = Topic::interned(classic.ledger.topic());
    next.map(|(topic, partition, offset)| OutRecord {
        topic: ledger_topic.clone(),
        partition: Some(ledger_partition(partition, classic.ledger.partitions())),
        key: Some(checkpoint_key(&classic.connector, topic, partition)),
        value: Some(checkpoint_value(offset)),
        headers: vec![(WRITER_HEADER.into(), Some(writer.clone()))],
        ..OutRecord::default()
    })
    .collect()
}

/// The value of a standing ledger entry: who wrote it (for people reading the topic).
fn entry_value(transactional_id: &str) -> Bytes {
    Bytes::from(transactional_id.to_owned())
}

enum Mode {
    /// Not opened yet.
    Unknown,
    Share(Box<LedgerReader>, LedgerSettings),
    Classic(Box<Classic>),
}

/// Classic mode's state: the member that read the batch, and the checkpoints.
struct Classic {
    group: Option<Arc<GroupMetadata>>,
    ledger: LedgerReader,
    /// Names the connector in checkpoint keys.
    connector: String,
    /// Per assigned source partition, the checkpoint read when it was opened: its records
    /// below it have committed output already.
    starts: HashMap<TopicPartition, i64>,
}

pub struct ExactlyOnceWriter {
    producer: TransactionalProducer,
    group_offsets: GroupOffsets,
    /// The producer's security, for the native connection that reads the ledger.
    security: ClientSecurity,
    mode: Mode,
    /// A transaction is open (begun by `write`, ended by `commit` or `abort`).
    open: bool,
    /// Classic mode: the open transaction's first checkpoints are confirmed in the ledger, so
    /// a successor finds it there (`LedgerReader::abort_predecessors`).
    checkpoints_shown: bool,
    /// Classic mode: checkpoints of the open transaction's later writes (a transaction of
    /// several batches), per source partition the offset after its last record: written by
    /// `commit`, before the transaction commits.
    checkpoints_due: Vec<(Topic, i32, i64)>,
    /// Ledger entries written in the open transaction.
    entries_in_txn: Vec<RecordCoordinates>,
    /// Share mode: the open transaction's entries with their ledger partition and offset, for
    /// the claim check before the commit ([`crate::claims`]).
    claims_in_txn: Vec<(RecordCoordinates, i32, i64)>,
    /// Share mode: every ledger offset the open transaction wrote (entries and tombstones).
    ledger_written_in_txn: Vec<(i32, i64)>,
    /// How long the claim check keeps other writers' entries: longer than any record held
    /// now can have been held (its lock, as seen on its deadlines).
    claim_retention: Duration,
    /// Tombstones written in the open transaction.
    tombstones_in_txn: Vec<RecordCoordinates>,
    /// The earliest acquisition-lock deadline of the records in the open transaction.
    deadline: Option<Instant>,
    /// Committed entries whose ACCEPT is not known to be durable yet.
    standing: HashSet<RecordCoordinates>,
    /// Entries whose ACCEPT is durable: tombstoned in the next transaction.
    to_tombstone: Vec<RecordCoordinates>,
    stats: WriterStats,
}

/// Counts for tests, metrics and the benchmark.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriterStats {
    pub committed_transactions: u64,
    pub aborted_transactions: u64,
    pub records_committed: u64,
    /// Redelivered records found in the ledger and accepted without writing them again.
    pub ledger_hits: u64,
    pub ledger_lookups: u64,
    /// Transactions aborted by the acquisition-lock guard.
    pub lock_guard_aborts: u64,
    pub tombstones_committed: u64,
    /// Classic mode: records read again below their partition's checkpoint, not written.
    pub checkpoint_skips: u64,
    /// Share mode: records of transactions aborted before their commit because another
    /// writer's ledger entry for them came first (their hold on them had ended unseen).
    pub claim_conflicts: u64,
}

/// How long opening waits for a predecessor's open transactions to show their abort markers.
const PREDECESSOR_WAIT: Duration = Duration::from_secs(10);

/// The claim check keeps other writers' entries at least this long, and this much longer than
/// the longest lock time left seen on a record.
const CLAIM_RETENTION: Duration = Duration::from_secs(60);

fn ledger_error(e: LedgerError) -> SinkError {
    match e {
        LedgerError::MissingTopic { .. } | LedgerError::CannotCreate { .. } => {
            SinkError::fatal(e.to_string())
        }
        e if e.is_retriable() => SinkError::retriable(e.to_string()),
        e => SinkError::fatal(e.to_string()),
    }
}

fn txn_error(e: TxnError) -> SinkError {
    if e.is_fatal() {
        SinkError::fatal(format!(
            "{e}; another task with this transactional id took over, or the producer failed for good: this task stops"
        ))
    } else {
        SinkError::retriable(e.to_string())
    }
}

impl ExactlyOnceWriter {
    /// Creates the transactional producer (fencing an earlier one with the same id).
    pub async fn start(settings: &WriterSettings) -> Result<ExactlyOnceWriter, SinkError> {
        let producer = TransactionalProducer::new(
            &settings.bootstrap,
            &settings.transactional_id,
            settings
                .producer_overrides
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
            settings.step_timeout,
        )
        .await
        .map_err(|e| SinkError::fatal(e.to_string()))?;
        let security = SecuritySettings::from_keys(
            settings
                .producer_overrides
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str(), k.as_str())),
        )
        .and_then(|s| s.client_security())
        .map_err(|e| SinkError::fatal(e.to_string()))?;
        Ok(ExactlyOnceWriter {
            producer,
            group_offsets: settings.group_offsets,
            security,
            mode: Mode::Unknown,
            open: false,
            checkpoints_shown: false,
            checkpoints_due: Vec::new(),
            entries_in_txn: Vec::new(),
            claims_in_txn: Vec::new(),
            ledger_written_in_txn: Vec::new(),
            claim_retention: CLAIM_RETENTION,
            tombstones_in_txn: Vec::new(),
            deadline: None,
            standing: HashSet::new(),
            to_tombstone: Vec::new(),
            stats: WriterStats::default(),
        })
    }

    pub fn transactional_id(&self) -> &str {
        self.producer.transactional_id()
    }

    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// Opens the ledger (rebuilding its cache from the topic) and aborts the transactions a
    /// predecessor with our transactional id left open.
    async fn open_ledger(&self, ledger: &LedgerSettings) -> Result<LedgerReader, SinkError> {
        let mut reader = LedgerReader::open(
            self.producer.bootstrap(),
            &ledger.topic,
            &ledger.cache_dir,
            &format!("{}-ledger", self.producer.transactional_id()),
            &self.security,
        )
        .await
        .map_err(ledger_error)?;
        reader
            .abort_predecessors(self.producer.transactional_id(), PREDECESSOR_WAIT)
            .await
            .map_err(ledger_error)?;
        Ok(reader)
    }

    /// Share mode: opens the ledger (rebuilding its cache from the topic).
    pub async fn open_share(&mut self, ledger: LedgerSettings) -> Result<(), SinkError> {
        if matches!(self.mode, Mode::Share(..)) {
            return Ok(());
        }
        let reader = self.open_ledger(&ledger).await?;
        self.mode = Mode::Share(Box::new(reader), ledger);
        Ok(())
    }

    /// Classic mode: `partitions` were assigned. Opens the ledger on the first call (aborting
    /// what a predecessor left open), then reads each partition's latest committed checkpoint,
    /// waiting up to the step timeout for a transaction still open on it. Returns the start
    /// offset of each partition that has a checkpoint: its records before it have committed
    /// output, and [`already_written`](Self::already_written) reports them so.
    pub async fn open_classic(
        &mut self,
        ledger: &LedgerSettings,
        connector: &str,
        partitions: &[TopicPartition],
        wait: Duration,
    ) -> Result<BTreeMap<TopicPartition, i64>, SinkError> {
        if !matches!(self.mode, Mode::Classic(_)) {
            let reader = self.open_ledger(ledger).await?;
            self.mode = Mode::Classic(Box::new(Classic {
                group: None,
                ledger: reader,
                connector: connector.to_owned(),
                starts: HashMap::new(),
            }));
        }
        let Mode::Classic(classic) = &mut self.mode else {
            return Ok(BTreeMap::new());
        };
        let list: Vec<(String, i32)> = partitions
            .iter()
            .map(|tp| (tp.topic.clone(), tp.partition))
            .collect();
        let found = classic
            .ledger
            .checkpoints(&classic.connector, &list, Instant::now() + wait)
            .await
            .map_err(ledger_error)?;
        let mut starts = BTreeMap::new();
        for (tp, checkpoint) in partitions.iter().zip(found) {
            match checkpoint {
                Some(next) => {
                    classic.starts.insert(tp.clone(), next);
                    starts.insert(tp.clone(), next);
                }
                None => {
                    classic.starts.remove(tp);
                }
            }
        }
        Ok(starts)
    }

    /// Classic mode: `partitions` were taken away; their checkpoints are read again if they
    /// come back.
    pub fn close_classic(&mut self, partitions: &[TopicPartition]) {
        if let Mode::Classic(classic) = &mut self.mode {
            for tp in partitions {
                classic.starts.remove(tp);
            }
        }
    }

    /// Classic mode: the member that read the next batch.
    pub fn set_group(&mut self, group: Arc<GroupMetadata>) {
        if let Mode::Classic(classic) = &mut self.mode {
            classic.group = Some(group);
        }
    }

    /// Share mode: which of `records` (coordinates, delivery count, lock deadline) already have
    /// committed output, per the ledger. Only redeliveries are looked up. A lookup that cannot
    /// finish before the record's lock margin fails retriably (the batch is released).
    pub async fn already_written(
        &mut self,
        records: &[(RecordCoordinates, Option<u16>, Option<Instant>)],
    ) -> Result<Vec<bool>, SinkError> {
        let mut found = vec![false; records.len()];
        let (reader, settings) = match &mut self.mode {
            Mode::Share(reader, settings) => (reader, settings),
            Mode::Classic(classic) => {
                // Below its partition's checkpoint a record has committed output (read again
                // after a restart or a rebalance, from offsets the broker did not keep).
                if classic.starts.is_empty() {
                    return Ok(found);
                }
                // A batch runs by partition: the checkpoint is looked up (with a key made for
                // it) when the partition changes, not for every record.
                let mut last: Option<(&str, i32, Option<i64>)> = None;
                for (i, (record, _, _)) in records.iter().enumerate() {
                    let start = match last {
                        Some((topic, partition, start))
                            if partition == record.partition && topic == record.topic.as_str() =>
                        {
                            start
                        }
                        _ => {
                            let tp = TopicPartition::new(record.topic.as_str(), record.partition);
                            let start = classic.starts.get(&tp).copied();
                            last = Some((record.topic.as_str(), record.partition, start));
                            start
                        }
                    };
                    if start.is_some_and(|s| record.offset < s) {
                        found[i] = true;
                        self.stats.checkpoint_skips += 1;
                    }
                }
                return Ok(found);
            }
            Mode::Unknown => return Ok(found),
        };
        let redelivered: Vec<usize> = (0..records.len())
            .filter(|i| records[*i].1.is_some_and(|count| count > 1))
            .collect();
        if redelivered.is_empty() {
            return Ok(found);
        }
        let coordinates: Vec<RecordCoordinates> =
            redelivered.iter().map(|i| records[*i].0.clone()).collect();
        let wait_until = redelivered
            .iter()
            .filter_map(|i| records[*i].2)
            .min()
            .map(|d| d.checked_sub(settings.lock_margin).unwrap_or(d))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(10));
        self.stats.ledger_lookups += coordinates.len() as u64;
        let present = reader
            .contains(&coordinates, wait_until)
            .await
            .map_err(|e| {
                if e.is_retriable() {
                    SinkError::retriable(e.to_string())
                } else {
                    SinkError::fatal(e.to_string())
                }
            })?;
        for (i, hit) in redelivered.into_iter().zip(present) {
            if hit {
                found[i] = true;
                self.stats.ledger_hits += 1;
                // Its ACCEPT still has to become durable before the entry can go.
                self.standing.insert(records[i].0.clone());
            }
        }
        Ok(found)
    }

    /// Writes `out` in the open transaction (beginning one if needed), with a ledger entry per
    /// `sources` record in share mode and the tombstones that are due. On any failure the
    /// transaction is aborted and every record of it reported as failed retriably.
    pub async fn write(
        &mut self,
        out: &[OutRecord],
        sources: &[(RecordCoordinates, Option<Instant>)],
    ) -> Vec<Result<Written, SinkError>> {
        if out.is_empty() {
            return Vec::new();
        }
        if !self.open {
            if let Err(e) = self.producer.begin().await {
                let error = txn_error(e);
                return out.iter().map(|_| Err(error.clone())).collect();
            }
            self.open = true;
        }
        // Ledger records go first and are confirmed before the output is sent: an open
        // transaction that wrote output then always shows in the ledger too, where a successor
        // finds it (see `LedgerReader::abort_predecessors`).
        let mut batch: Vec<OutRecord> = Vec::new();
        if let Mode::Classic(classic) = &self.mode {
            // Per source partition, the offset after the last record of this write: committed
            // with the output, it is where a later owner of the partition starts.
            // A short list (a write spans few partitions, and runs by partition): no map
            // lookup per record.
            let mut next: Vec<((&Topic, i32), i64)> = Vec::new();
            let mut last = 0;
            for (source, _) in sources {
                let key = (&source.topic, source.partition);
                if next.get(last).is_none_or(|(k, _)| *k != key) {
                    last = match next.iter().position(|(k, _)| *k == key) {
                        Some(at) => at,
                        None => {
                            next.push((key, 0));
                            next.len() - 1
                        }
                    };
                }
                let n = &mut next[last].1;
                *n = (*n).max(source.offset + 1);
            }
            if self.checkpoints_shown {
                // The transaction shows in the ledger already: this write's checkpoints go
                // with the commit, one per partition, not before each write's output.
                for ((topic, partition), offset) in next {
                    match self
                        .checkpoints_due
                        .iter_mut()
                        .find(|(t, p, _)| *p == partition && t == topic)
                    {
                        Some((_, _, due)) => *due = (*due).max(offset),
                        None => self
                            .checkpoints_due
                            .push((topic.clone(), partition, offset)),
                    }
                }
            } else {
                // In key order, as written before.
                next.sort_unstable_by(|a, b| {
                    (a.0 .0.as_str(), a.0 .1).cmp(&(b.0 .0.as_str(), b.0 .1))
                });
                batch = checkpoint_records(
                    classic,
                    self.producer.transactional_id(),
                    next.into_iter().map(|((t, p), o)| (t.as_str(), p, o)),
                );
            }
        }
        let now = Instant::now();
        if let Mode::Share(reader, _) = &self.mode {
            let value = entry_value(self.producer.transactional_id());
            let ledger_topic = Topic::interned(reader.topic());
            for (source, deadline) in sources {
                batch.push(OutRecord {
                    topic: ledger_topic.clone(),
                    partition: Some(reader.partition_of(source)),
                    key: Some(ledger_key(source)),
                    value: Some(value.clone()),
                    ..OutRecord::default()
                });
                self.entries_in_txn.push(source.clone());
                if let Some(d) = deadline {
                    self.deadline = Some(self.deadline.map_or(*d, |e| e.min(*d)));
                    self.claim_retention = self
                        .claim_retention
                        .max(d.saturating_duration_since(now) + CLAIM_RETENTION);
                }
            }
            for done in std::mem::take(&mut self.to_tombstone) {
                batch.push(OutRecord {
                    topic: ledger_topic.clone(),
                    partition: Some(reader.partition_of(&done)),
                    key: Some(ledger_key(&done)),
                    value: None,
                    ..OutRecord::default()
                });
                self.tombstones_in_txn.push(done);
            }
        }
        let ledger_results = self.producer.send_all(&batch).await;
        let results = match ledger_results.iter().find_map(|r| r.as_ref().err()) {
            Some(_) => ledger_results,
            None => {
                if matches!(self.mode, Mode::Classic(_)) && !batch.is_empty() {
                    self.checkpoints_shown = true;
                }
                if matches!(self.mode, Mode::Share(..)) {
                    // Where the entries landed: the claim check reads past them.
                    for (i, written) in ledger_results.iter().flatten().enumerate() {
                        self.ledger_written_in_txn
                            .push((written.partition, written.offset));
                        if let Some((source, _)) = sources.get(i) {
                            self.claims_in_txn.push((
                                source.clone(),
                                written.partition,
                                written.offset,
                            ));
                        }
                    }
                }
                self.producer.send_all(out).await
            }
        };
        if let Some(failed) = results.iter().find_map(|r| r.as_ref().err()) {
            let error = self.abort_after_failure(failed.to_string()).await;
            return out.iter().map(|_| Err(error.clone())).collect();
        }
        results
            .into_iter()
            .map(|r| r.map_err(|e| SinkError::retriable(e.to_string())))
            .collect()
    }

    /// Adds `records` to the open transaction without ledger entries: records that must
    /// commit or abort with the output written before them (a mirror flow's offset syncs).
    /// On failure the transaction is aborted, the output written in it included.
    pub async fn write_alongside(&mut self, records: &[OutRecord]) -> Result<(), SinkError> {
        if records.is_empty() {
            return Ok(());
        }
        if !self.open {
            return Err(SinkError::retriable(
                "no open transaction to add records to (it was aborted)",
            ));
        }
        let results = self.producer.send_all(records).await;
        match results.iter().find_map(|r| r.as_ref().err()) {
            Some(failed) => Err(self.abort_after_failure(failed.to_string()).await),
            None => Ok(()),
        }
    }

    /// Aborts the open transaction because a record in it failed with `reason`; the error to
    /// give the records written in it.
    async fn abort_after_failure(&mut self, reason: String) -> SinkError {
        match self.abort().await {
            Err(fatal) if !fatal.is_retriable() => fatal,
            _ => SinkError::retriable(format!(
                "the transaction was aborted because a record failed: {reason}"
            )),
        }
    }

    /// Commits the open transaction (nothing to do when none is open). Share mode first checks
    /// the lock guard; classic mode adds `offsets` (next offset per partition) for the group
    /// when they go in the transaction ([`GroupOffsets::InTransaction`]). On failure the
    /// transaction is aborted and the error says whether to retry.
    pub async fn commit(
        &mut self,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<(), SinkError> {
        if !self.open {
            return Ok(());
        }
        self.check_claims().await?;
        if let (Mode::Share(_, settings), Some(deadline)) = (&self.mode, self.deadline) {
            let margin = settings.lock_margin;
            if Instant::now() + margin >= deadline {
                self.stats.lock_guard_aborts += 1;
                self.abort().await?;
                return Err(SinkError::retriable(format!(
                    "the transaction could not commit {margin:?} before its records' acquisition locks expire; aborted, and the records are released"
                )));
            }
        }
        if let Mode::Classic(classic) = &self.mode {
            if !self.checkpoints_due.is_empty() {
                let mut due = std::mem::take(&mut self.checkpoints_due);
                due.sort_unstable_by(|a, b| (a.0.as_str(), a.1).cmp(&(b.0.as_str(), b.1)));
                let records = checkpoint_records(
                    classic,
                    self.producer.transactional_id(),
                    due.iter().map(|(t, p, o)| (t.as_str(), *p, *o)),
                );
                if let Some(e) = self
                    .producer
                    .send_all(&records)
                    .await
                    .into_iter()
                    .find_map(Result::err)
                {
                    self.abort().await?;
                    return Err(SinkError::retriable(format!(
                        "the transaction's checkpoints could not be written: {e}"
                    )));
                }
            }
        }
        if let (Mode::Classic(classic), GroupOffsets::InTransaction) =
            (&self.mode, self.group_offsets)
        {
            let group = &classic.group;
            let offsets: Vec<((String, i32), i64)> = offsets
                .iter()
                .map(|(tp, o)| ((tp.topic.clone(), tp.partition), *o))
                .collect();
            if !offsets.is_empty() {
                let Some(group) = group.clone() else {
                    self.abort().await?;
                    return Err(SinkError::fatal(
                        "exactly-once in classic mode needs the consumer group metadata, and the runtime did not hand it over",
                    ));
                };
                if let Err(e) = self.producer.send_offsets(&offsets, group).await {
                    let error = txn_error(e);
                    self.abort().await?;
                    return Err(error);
                }
            }
        }
        match self.producer.commit().await {
            Ok(()) => {
                self.open = false;
                self.checkpoints_shown = false;
                self.deadline = None;
                self.stats.committed_transactions += 1;
                self.stats.records_committed += self.entries_in_txn.len() as u64;
                self.stats.tombstones_committed += self.tombstones_in_txn.len() as u64;
                self.standing.extend(self.entries_in_txn.drain(..));
                self.claims_in_txn.clear();
                self.ledger_written_in_txn.clear();
                self.tombstones_in_txn.clear();
                Ok(())
            }
            Err(e) => {
                let error = txn_error(e);
                self.abort().await?;
                Err(error)
            }
        }
    }

    /// Share mode, before a commit: aborts the open transaction when another writer's ledger
    /// entry competes with one of its own ([`crate::claims`]): that writer held the records
    /// after this one's hold ended (a lost share session releases them before their lock
    /// deadline), and only the first entry in the log may commit.
    async fn check_claims(&mut self) -> Result<(), SinkError> {
        let Mode::Share(reader, _) = &mut self.mode else {
            return Ok(());
        };
        if self.claims_in_txn.is_empty() {
            return Ok(());
        }
        let competing = match reader
            .competing_claims(
                &self.claims_in_txn,
                &self.ledger_written_in_txn,
                self.claim_retention,
            )
            .await
        {
            Ok(competing) if competing.is_empty() => return Ok(()),
            Ok(competing) => competing,
            Err(e) => {
                let error = ledger_error(e);
                self.abort().await?;
                return Err(error);
            }
        };
        self.stats.claim_conflicts += competing.len() as u64;
        let total = self.claims_in_txn.len();
        let first = &competing[0];
        tracing::warn!(
            records = competing.len(),
            of = total,
            first = %first,
            "another task wrote ledger entries for records of this transaction first (this task's hold on them ended unseen, e.g. with its share session); aborting the transaction and releasing the records"
        );
        let message = format!(
            "{} of the transaction's {total} records (first {first}) were written by another task first: this task's hold on them had ended (a lost share session releases records before their lock deadline). The transaction is aborted and the records released; their next delivery finds the other task's output in the ledger",
            competing.len()
        );
        self.abort().await?;
        Err(SinkError::retriable(message))
    }

    /// Aborts the open transaction; its tombstones are due again.
    pub async fn abort(&mut self) -> Result<(), SinkError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        self.checkpoints_shown = false;
        self.checkpoints_due.clear();
        self.deadline = None;
        self.entries_in_txn.clear();
        self.claims_in_txn.clear();
        self.ledger_written_in_txn.clear();
        self.to_tombstone.append(&mut self.tombstones_in_txn);
        self.stats.aborted_transactions += 1;
        self.producer.abort().await.map_err(txn_error)
    }

    /// Records whose ACCEPT is durable: their ledger entries are tombstoned in the next
    /// transaction.
    pub fn acknowledged(&mut self, records: &[RecordCoordinates]) {
        for r in records {
            if self.standing.remove(r) {
                self.to_tombstone.push(r.clone());
            }
        }
    }

    /// Entries due for a tombstone.
    pub fn tombstones_due(&self) -> usize {
        self.to_tombstone.len()
    }

    /// Committed ledger entries whose ACCEPT is not known to be durable yet.
    pub fn standing_entries(&self) -> usize {
        self.standing.len()
    }

    /// Writes the due tombstones in a transaction of their own (on stop).
    pub async fn flush_tombstones(&mut self) -> Result<(), SinkError> {
        if self.to_tombstone.is_empty() || !matches!(self.mode, Mode::Share(..)) || self.open {
            return Ok(());
        }
        self.producer.begin().await.map_err(txn_error)?;
        self.open = true;
        let Mode::Share(reader, _) = &self.mode else {
            return Ok(());
        };
        let ledger_topic = Topic::interned(reader.topic());
        let batch: Vec<OutRecord> = self
            .to_tombstone
            .iter()
            .map(|done| OutRecord {
                topic: ledger_topic.clone(),
                partition: Some(reader.partition_of(done)),
                key: Some(ledger_key(done)),
                value: None,
                ..OutRecord::default()
            })
            .collect();
        self.tombstones_in_txn.append(&mut self.to_tombstone);
        if let Some(e) = self
            .producer
            .send_all(&batch)
            .await
            .into_iter()
            .find_map(Result::err)
        {
            self.abort().await?;
            return Err(SinkError::retriable(e.to_string()));
        }
        self.commit(&BTreeMap::new()).await
    }
}
