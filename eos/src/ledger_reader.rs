//! Reads the ledger topic with plain Fetch requests (read_uncommitted) and replays it through
//! [`PartitionReplay`], which resolves transactions from their markers, into the
//! [`LedgerCache`]. On start every ledger partition is replayed from its log start; a lookup
//! then reads its partition on to the end seen when the lookup began, and further while one of
//! the looked-up keys is in a transaction still open (another task's commit or abort in flight).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    EndTxnRequest, FetchRequest, ListOffsetsRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use spillway_core::RecordCoordinates;
use spillway_kafka::admin::{AdminClient, NewTopic, TopicCreation};
use spillway_kafka::cluster::Cluster;
use spillway_kafka::error_name;
use spillway_kafka::security::ClientSecurity;

use crate::claims::ClaimWindow;
use crate::ledger::{
    checkpoint_key, ledger_key, ledger_partition, parse_checkpoint_value, LogRecord, Marker,
    PartitionReplay, WRITER_HEADER,
};
use crate::ledger_cache::{CacheError, LedgerCache};
use tracing::{info, warn};

/// Fetch v4–v12 name topics (v13+ use topic ids).
const FETCH_VERSIONS: (i16, i16) = (4, 12);
const LIST_OFFSETS_VERSIONS: (i16, i16) = (1, 7);
const OFFSET_OUT_OF_RANGE: i16 = 1;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const PENDING_POLL: Duration = Duration::from_millis(20);
const PARTITION_MAX_BYTES: i32 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the exactly-once ledger topic '{topic}' does not exist on the target cluster {bootstrap}; create it before starting the connector (cleanup.policy=compact, no time retention, as many partitions as the largest source topic has, or fewer), or name another with delivery.ledger.topic")]
    MissingTopic { topic: String, bootstrap: String },
    #[error("the exactly-once ledger topic '{topic}' does not exist on the target cluster {bootstrap} and cannot be created: {reason}; create it yourself (cleanup.policy=compact, no time retention), or name another with delivery.ledger.topic")]
    CannotCreate {
        topic: String,
        bootstrap: String,
        reason: String,
    },
    #[error(
        "reading the exactly-once ledger topic '{topic}' partition {partition} failed: {reason}"
    )]
    Read {
        topic: String,
        partition: i32,
        reason: String,
    },
    #[error("the ledger entry of {record} is in a transaction still open after {waited:?}; the record is released and checked again on its next delivery")]
    Pending {
        record: RecordCoordinates,
        waited: Duration,
    },
    #[error(transparent)]
    Cache(#[from] CacheError),
}

impl LedgerError {
    /// Whether trying again later may succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, LedgerError::Read { .. } | LedgerError::Pending { .. })
    }
}

/// Create the missing ledger topic with CreateTopics on the reader's own connections:
/// compacted (one key per record or source partition; the latest value is all that counts), the
/// brokers' default partitions and replication factor. A broker without CreateTopics leaves the
/// topic missing, as before (auto-creation by a produce would not make it compacted).
async fn create_ledger_topic(
    cluster: &Arc<Cluster>,
    bootstrap: &str,
    topic: &str,
) -> Result<(), LedgerError> {
    let admin = AdminClient::from_cluster(Arc::clone(cluster));
    let new = NewTopic {
        name: topic.to_owned(),
        partitions: -1,
        replication_factor: -1,
        configs: vec![("cleanup.policy".to_owned(), "compact".to_owned())],
    };
    match admin.create_topic(&new).await {
        Ok(TopicCreation::Created) => {
            info!(
                topic,
                bootstrap, "created the exactly-once ledger topic (cleanup.policy=compact)"
            );
            Ok(())
        }
        Ok(TopicCreation::AlreadyExists) => Ok(()),
        Err(e) if e.is_unsupported() => {
            warn!(topic, bootstrap, error = %e, "the ledger topic cannot be created here: the broker has no CreateTopics");
            Err(LedgerError::MissingTopic {
                topic: topic.to_owned(),
                bootstrap: bootstrap.to_owned(),
            })
        }
        Err(e) => Err(LedgerError::CannotCreate {
            topic: topic.to_owned(),
            bootstrap: bootstrap.to_owned(),
            reason: e.to_string(),
        }),
    }
}

pub struct LedgerReader {
    cluster: Arc<Cluster>,
    topic: String,
    partitions: i32,
    replays: BTreeMap<i32, PartitionReplay>,
    cache: LedgerCache,
    /// Per ledger partition, what the claim check has read (it reads on its own, from where the
    /// replay was when the reader opened: the replay only moves on a lookup).
    scans: BTreeMap<i32, ClaimScan>,
}

/// The claim check's place in one ledger partition and the other writers' entries it has read.
#[derive(Debug)]
struct ClaimScan {
    next_offset: i64,
    window: ClaimWindow,
}

impl LedgerReader {
    /// Connects to the target cluster, checks that `topic` exists, and rebuilds the cache
    /// under `cache_dir` from every partition of it.
    pub async fn open(
        bootstrap: &str,
        topic: &str,
        cache_dir: &Path,
        client_id: &str,
        security: &ClientSecurity,
    ) -> Result<LedgerReader, LedgerError> {
        let read_error = |partition: i32, reason: String| LedgerError::Read {
            topic: topic.to_owned(),
            partition,
            reason,
        };
        let cluster = Cluster::connect_secured(
            bootstrap,
            client_id,
            Duration::from_secs(30),
            security.clone(),
        )
        .await
        .map_err(|e| read_error(-1, e.to_string()))?;
        cluster
            .refresh_metadata(&[topic.to_owned()])
            .await
            .map_err(|e| read_error(-1, e.to_string()))?;
        let known = |cluster: &Cluster| {
            cluster
                .topic(topic)
                .map(|t| t.leaders.len() as i32)
                .filter(|n| *n > 0)
        };
        let partitions = match known(&cluster) {
            Some(n) => n,
            None => {
                create_ledger_topic(&cluster, bootstrap, topic).await?;
                // A new topic's leaders show in metadata a moment after it is created.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    cluster
                        .refresh_metadata(&[topic.to_owned()])
                        .await
                        .map_err(|e| read_error(-1, e.to_string()))?;
                    if let Some(n) = known(&cluster) {
                        break n;
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Err(LedgerError::MissingTopic {
                            topic: topic.to_owned(),
                            bootstrap: bootstrap.to_owned(),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let cache = LedgerCache::open(cache_dir).await?;
        let mut reader = LedgerReader {
            cluster,
            topic: topic.to_owned(),
            partitions,
            replays: BTreeMap::new(),
            cache,
            scans: BTreeMap::new(),
        };
        for partition in 0..partitions {
            let start = reader.earliest(partition).await?;
            reader
                .replays
                .insert(partition, PartitionReplay::starting_at(start));
            reader.catch_up(partition, &[], None).await?;
            let next_offset = reader.replays[&partition].next_offset;
            reader.scans.insert(
                partition,
                ClaimScan {
                    next_offset,
                    window: ClaimWindow::default(),
                },
            );
        }
        Ok(reader)
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// The ledger partition for a source record.
    pub fn partition_of(&self, record: &RecordCoordinates) -> i32 {
        ledger_partition(record.partition, self.partitions)
    }

    /// Standing entries in the cache (committed, not yet tombstoned), as read so far.
    pub async fn standing(&self) -> Result<usize, LedgerError> {
        Ok(self.cache.len().await?)
    }

    /// Aborts the transactions a predecessor with `transactional_id` left open in the ledger
    /// (a task killed between its writes and its commit), then reads until their markers are
    /// in. Kafka has aborted them already when this task's producer registered the same
    /// transactional id (the old epoch's EndTxn is then refused, which is fine); the dev broker
    /// hands out a new producer id instead and leaves them open, which would stall
    /// read_committed readers of the output at the open transaction for good. Returns how many
    /// were found.
    pub async fn abort_predecessors(
        &mut self,
        transactional_id: &str,
        wait: Duration,
    ) -> Result<usize, LedgerError> {
        let mut owners: BTreeMap<i64, i16> = BTreeMap::new();
        for replay in self.replays.values() {
            for (pid, epoch, writer) in replay.open_transaction_owners() {
                if writer.as_deref() == Some(transactional_id.as_bytes()) {
                    owners.insert(pid, epoch);
                }
            }
        }
        if owners.is_empty() {
            return Ok(0);
        }
        let read_error = |reason: String| LedgerError::Read {
            topic: self.topic.clone(),
            partition: -1,
            reason,
        };
        let coordinator = self
            .cluster
            .find_coordinator_of(
                spillway_kafka::cluster::CoordinatorKind::Transaction,
                transactional_id,
            )
            .await
            .map_err(|e| read_error(e.to_string()))?;
        let conn = self
            .cluster
            .broker(coordinator)
            .await
            .map_err(|e| read_error(e.to_string()))?;
        for (pid, epoch) in &owners {
            let request = EndTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(
                    transactional_id.to_owned(),
                )))
                .with_producer_id(ProducerId(*pid))
                .with_producer_epoch(*epoch)
                .with_committed(false);
            match conn
                .request_in_range(&request, 0, 3, self.cluster.request_timeout())
                .await
            {
                Ok((response, _)) if response.error_code != 0 => {
                    tracing::debug!(pid, epoch, error = %error_name(response.error_code),
                        "the predecessor's transaction was already ended");
                }
                Ok(_) => tracing::info!(
                    pid,
                    epoch,
                    transactional_id,
                    "aborted a transaction a predecessor left open"
                ),
                Err(e) => return Err(read_error(e.to_string())),
            }
        }
        let until = Instant::now() + wait;
        for partition in 0..self.partitions {
            loop {
                self.catch_up(partition, &[], None).await?;
                let open = self.replays[&partition]
                    .open_transaction_owners()
                    .iter()
                    .any(|(pid, _, _)| owners.contains_key(pid));
                if !open || Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(PENDING_POLL).await;
            }
        }
        Ok(owners.len())
    }

    /// For each record, whether the ledger holds a committed entry for it. Each ledger
    /// partition involved is read to its end first; a record whose entry is in an open
    /// transaction is waited for until `wait_until`, then [`LedgerError::Pending`].
    pub async fn contains(
        &mut self,
        records: &[RecordCoordinates],
        wait_until: Instant,
    ) -> Result<Vec<bool>, LedgerError> {
        let mut by_partition: BTreeMap<i32, Vec<Bytes>> = BTreeMap::new();
        for r in records {
            by_partition
                .entry(self.partition_of(r))
                .or_default()
                .push(ledger_key(r));
        }
        for (partition, keys) in &by_partition {
            self.catch_up(*partition, keys, Some(wait_until)).await?;
        }
        Ok(self
            .cache
            .contains(records.iter().map(ledger_key).collect())
            .await?)
    }

    /// Classic mode: the latest committed checkpoint (next offset) of each of `partitions`
    /// (topic, partition) of `connector`, `None` where none was written. Like
    /// [`contains`](Self::contains), each ledger partition involved is read to its end, and a
    /// checkpoint in a transaction still open is waited for until `wait_until`.
    pub async fn checkpoints(
        &mut self,
        connector: &str,
        partitions: &[(String, i32)],
        wait_until: Instant,
    ) -> Result<Vec<Option<i64>>, LedgerError> {
        let mut by_partition: BTreeMap<i32, Vec<Bytes>> = BTreeMap::new();
        let keys: Vec<Bytes> = partitions
            .iter()
            .map(|(topic, partition)| {
                let key = checkpoint_key(connector, topic, *partition);
                by_partition
                    .entry(ledger_partition(*partition, self.partitions))
                    .or_default()
                    .push(key.clone());
                key
            })
            .collect();
        for (partition, keys) in &by_partition {
            self.catch_up(*partition, keys, Some(wait_until)).await?;
        }
        let values = self.cache.get(keys).await?;
        values
            .into_iter()
            .zip(partitions)
            .map(|(value, (topic, partition))| {
                let Some(value) = value else {
                    return Ok(None);
                };
                parse_checkpoint_value(&value).map(Some).ok_or_else(|| LedgerError::Read {
                    topic: self.topic.clone(),
                    partition: ledger_partition(*partition, self.partitions),
                    reason: format!(
                        "the checkpoint of {topic}-{partition} holds {:?}, not an offset; was the ledger topic written by something else?",
                        String::from_utf8_lossy(&value)
                    ),
                })
            })
            .collect()
    }

    /// Share mode, before a commit: of `claims` (this writer's entries in its open transaction:
    /// the record, its entry's ledger partition and offset), those another entry competes with
    /// (see [`crate::claims`]). `written` holds every ledger offset of the open transaction
    /// (entries and tombstones), which are not read as claims. Each ledger partition involved is
    /// read past the writer's entries; what was read is kept for `retention`.
    pub async fn competing_claims(
        &mut self,
        claims: &[(RecordCoordinates, i32, i64)],
        written: &[(i32, i64)],
        retention: Duration,
    ) -> Result<Vec<RecordCoordinates>, LedgerError> {
        let mut own: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        for (partition, offset) in written {
            own.entry(*partition).or_default().push(*offset);
        }
        let mut found = Vec::new();
        for (partition, offsets) in &mut own {
            offsets.sort_unstable();
            let Some(&last) = offsets.last() else {
                continue;
            };
            self.scan_claims(*partition, offsets, last + 1).await?;
            let mine: Vec<(RecordCoordinates, i64)> = claims
                .iter()
                .filter(|(_, p, _)| p == partition)
                .map(|(record, _, offset)| (record.clone(), *offset))
                .collect();
            let scan = self
                .scans
                .get_mut(partition)
                .expect("scanned partitions have a window");
            scan.window.prune(Instant::now(), retention);
            found.extend(scan.window.conflicts(&mine));
        }
        Ok(found)
    }

    /// Reads `partition` for the claim check up to `target`, passing over the offsets in `own`
    /// (sorted): a batch made only of them is not decoded.
    async fn scan_claims(
        &mut self,
        partition: i32,
        own: &[i64],
        target: i64,
    ) -> Result<(), LedgerError> {
        let read_error = |reason: String| LedgerError::Read {
            topic: self.topic.clone(),
            partition,
            reason,
        };
        let is_own = |offset: i64| own.binary_search(&offset).is_ok();
        let only_own = |first: i64, last: i64| {
            let from = own.partition_point(|o| *o < first);
            let to = own.partition_point(|o| *o <= last);
            (to - from) as i64 == last - first + 1
        };
        // Past the writer's entries, and on to the end the first Fetch saw: markers written
        // since (another writer's abort) settle what would otherwise count as open.
        let mut end = target;
        let mut first_fetch = true;
        loop {
            let Some(next_offset) = self.scans.get(&partition).map(|s| s.next_offset) else {
                return Err(read_error("no claim scan state".into()));
            };
            if next_offset >= end {
                return Ok(());
            }
            let (records, high_watermark) = match self.fetch_raw(partition, next_offset).await? {
                Fetched::OutOfRange { .. } => {
                    // Below the log start (retention took it): read on from there.
                    let start = self.earliest(partition).await?;
                    if start <= next_offset {
                        return Err(read_error(format!(
                            "offset {next_offset} is out of range, and the log starts at {start}"
                        )));
                    }
                    if let Some(scan) = self.scans.get_mut(&partition) {
                        scan.next_offset = start;
                    }
                    continue;
                }
                Fetched::Records {
                    records,
                    high_watermark,
                } => (records, high_watermark),
            };
            if first_fetch {
                end = end.max(high_watermark);
                first_fetch = false;
            }
            let (records, next) = decode_log(records, only_own).map_err(read_error)?;
            let now = Instant::now();
            let Some(scan) = self.scans.get_mut(&partition) else {
                return Err(read_error("no claim scan state".into()));
            };
            for record in records.iter().filter(|r| !is_own(r.offset)) {
                if record.offset >= scan.next_offset {
                    scan.window.observe(record, now);
                }
            }
            match next {
                Some(next) => scan.next_offset = scan.next_offset.max(next),
                None if high_watermark <= next_offset => {
                    if next_offset >= target {
                        return Ok(());
                    }
                    return Err(read_error(format!(
                        "the partition ends at offset {high_watermark}, before this writer's entries (up to offset {})",
                        target - 1
                    )));
                }
                None => {}
            }
        }
    }

    /// Reads `partition` up to the end it had when called, then on while one of `keys` is in
    /// an open transaction (until `wait_until`).
    async fn catch_up(
        &mut self,
        partition: i32,
        keys: &[Bytes],
        wait_until: Option<Instant>,
    ) -> Result<(), LedgerError> {
        let started = Instant::now();
        let mut target: Option<i64> = None;
        loop {
            let high_watermark = self.fetch_once(partition).await?;
            let target = *target.get_or_insert(high_watermark);
            let replay = &self.replays[&partition];
            if replay.next_offset < target.min(high_watermark) {
                continue;
            }
            let Some(waiting) = keys.iter().find(|k| replay.is_pending(k)) else {
                return Ok(());
            };
            let Some(until) = wait_until.filter(|u| Instant::now() < *u) else {
                let record = crate::ledger::parse_ledger_key(waiting)
                    .unwrap_or_else(|| RecordCoordinates::new(self.topic.clone(), partition, -1));
                return Err(LedgerError::Pending {
                    record,
                    waited: started.elapsed(),
                });
            };
            tokio::time::sleep(PENDING_POLL.min(until.saturating_duration_since(Instant::now())))
                .await;
        }
    }

    /// One Fetch from the partition's next offset; applies what came and returns the high
    /// watermark.
    async fn fetch_once(&mut self, partition: i32) -> Result<i64, LedgerError> {
        let read_error = |reason: String| LedgerError::Read {
            topic: self.topic.clone(),
            partition,
            reason,
        };
        let next_offset = self.replays[&partition].next_offset;
        let (records, high_watermark) = match self.fetch_raw(partition, next_offset).await? {
            Fetched::OutOfRange { high_watermark } => {
                // Older data is gone (retention): start over from the log start. Entries lost
                // that way are the duplicate window docs/exactly-once.md names.
                let start = self.earliest(partition).await?;
                tracing::warn!(topic = %self.topic, partition, from = next_offset, to = start,
                    "ledger data before the log start is gone; replaying from the log start");
                if let Some(replay) = self.replays.get_mut(&partition) {
                    replay.reset(start);
                }
                return Ok(high_watermark.max(start));
            }
            Fetched::Records {
                records,
                high_watermark,
            } => (records, high_watermark),
        };
        let (records, next) = decode_log(records, |_, _| false).map_err(read_error)?;
        let replay = self
            .replays
            .get_mut(&partition)
            .ok_or_else(|| read_error("no replay state".into()))?;
        let mut changes = Vec::new();
        for record in records {
            changes.extend(replay.apply(record));
        }
        if let Some(next) = next {
            // Past the whole batch, also when compaction removed its last records.
            replay.next_offset = replay.next_offset.max(next);
        }
        self.cache.apply(changes).await?;
        Ok(high_watermark)
    }

    /// One Fetch of `partition` from `offset` (read_uncommitted): its record bytes and high
    /// watermark.
    async fn fetch_raw(&self, partition: i32, offset: i64) -> Result<Fetched, LedgerError> {
        let read_error = |reason: String| LedgerError::Read {
            topic: self.topic.clone(),
            partition,
            reason,
        };
        let conn = self.leader(partition).await?;
        let request = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(PARTITION_MAX_BYTES)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(self.topic.clone())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(PARTITION_MAX_BYTES)])]);
        let (response, _) = conn
            .request_in_range(
                &request,
                FETCH_VERSIONS.0,
                FETCH_VERSIONS.1,
                self.cluster.request_timeout(),
            )
            .await
            .map_err(|e| read_error(e.to_string()))?;
        if response.error_code != 0 {
            return Err(read_error(format!(
                "Fetch failed with {}",
                error_name(response.error_code)
            )));
        }
        let Some(data) = response
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .find(|p| p.partition_index == partition)
        else {
            return Err(read_error(
                "the Fetch response left the partition out".into(),
            ));
        };
        match data.error_code {
            0 => Ok(Fetched::Records {
                records: data.records.unwrap_or_default(),
                high_watermark: data.high_watermark,
            }),
            OFFSET_OUT_OF_RANGE => Ok(Fetched::OutOfRange {
                high_watermark: data.high_watermark,
            }),
            NOT_LEADER_OR_FOLLOWER => {
                self.cluster
                    .refresh_metadata(std::slice::from_ref(&self.topic))
                    .await
                    .map_err(|e| read_error(e.to_string()))?;
                Err(read_error("the partition's leader moved; try again".into()))
            }
            code => Err(read_error(format!("Fetch answered {}", error_name(code)))),
        }
    }

    async fn leader(
        &self,
        partition: i32,
    ) -> Result<Arc<spillway_kafka::connection::Connection>, LedgerError> {
        let read_error = |reason: String| LedgerError::Read {
            topic: self.topic.clone(),
            partition,
            reason,
        };
        let leader = self
            .cluster
            .topic(&self.topic)
            .and_then(|t| t.leaders.get(&partition).copied())
            .filter(|l| *l >= 0)
            .ok_or_else(|| read_error("no leader known".into()))?;
        self.cluster
            .broker(leader)
            .await
            .map_err(|e| read_error(e.to_string()))
    }

    /// The partition's log start offset.
    async fn earliest(&self, partition: i32) -> Result<i64, LedgerError> {
        let read_error = |reason: String| LedgerError::Read {
            topic: self.topic.clone(),
            partition,
            reason,
        };
        let conn = self.leader(partition).await?;
        let request = ListOffsetsRequest::default()
            .with_replica_id((-1).into())
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(self.topic.clone())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_timestamp(-2)])]);
        let (response, _) = conn
            .request_in_range(
                &request,
                LIST_OFFSETS_VERSIONS.0,
                LIST_OFFSETS_VERSIONS.1,
                self.cluster.request_timeout(),
            )
            .await
            .map_err(|e| read_error(e.to_string()))?;
        let p = response
            .topics
            .into_iter()
            .flat_map(|t| t.partitions)
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| read_error("ListOffsets left the partition out".into()))?;
        if p.error_code != 0 {
            return Err(read_error(format!(
                "ListOffsets answered {}",
                error_name(p.error_code)
            )));
        }
        Ok(p.offset.max(0))
    }
}

/// What one Fetch of a ledger partition brought.
enum Fetched {
    Records {
        records: Bytes,
        high_watermark: i64,
    },
    /// The offset asked for is below the log start (or past the end).
    OutOfRange {
        high_watermark: i64,
    },
}

/// The records of the whole batches in `bytes` (a partial batch at the end, cut by the fetch
/// size, is left for the next fetch), and the offset after the last whole batch. A data batch
/// that does not decode is an error: skipping it could hide a ledger entry. Data batches whose
/// offsets (first, last) `pass_over` names are not decoded.
fn decode_log(
    mut bytes: Bytes,
    pass_over: impl Fn(i64, i64) -> bool,
) -> Result<(Vec<LogRecord>, Option<i64>), String> {
    let mut out = Vec::new();
    let mut next = None;
    // Batch header: baseOffset int64, batchLength int32, ..., lastOffsetDelta int32 at byte 23.
    while bytes.len() >= 12 {
        let base = (&bytes[0..8]).get_i64();
        let len = (&bytes[8..12]).get_i32();
        if len < 0 {
            return Err(format!("negative batch length at offset {base}"));
        }
        let total = 12 + len as usize;
        if bytes.len() < total {
            break;
        }
        let mut batch = bytes.split_to(total);
        let last_delta = if total >= 27 {
            (&batch[23..27]).get_i32() as i64
        } else {
            0
        };
        if is_control_batch(&batch) {
            // Decoded by hand: the dev broker writes markers with a zero CRC.
            if let Some(marker) = decode_marker(&batch) {
                out.push(marker);
            }
        } else if total >= 27 && pass_over(base, base + last_delta) {
            // Not needed: the caller's own records.
        } else {
            let set = RecordBatchDecoder::decode(&mut batch)
                .map_err(|e| format!("the batch at offset {base} does not decode: {e}"))?;
            for r in set.records {
                out.push(LogRecord {
                    offset: r.offset,
                    producer_id: r.producer_id,
                    producer_epoch: r.producer_epoch,
                    transactional: r.transactional,
                    control: None,
                    present: r.value.is_some(),
                    key: r.key,
                    writer: r
                        .headers
                        .iter()
                        .find(|(name, _)| &***name == WRITER_HEADER)
                        .and_then(|(_, value)| value.clone())
                        .or_else(|| r.value.clone()),
                    value: r.value,
                });
            }
        }
        next = Some(base + last_delta + 1);
    }
    Ok((out, next))
}

/// v2 batch header offsets.
const ATTRIBUTES: usize = 21;
const PRODUCER_ID: usize = 43;
const RECORDS: usize = 61;

fn is_control_batch(batch: &[u8]) -> bool {
    batch
        .get(ATTRIBUTES..ATTRIBUTES + 2)
        .is_some_and(|a| u16::from_be_bytes([a[0], a[1]]) & 0x20 != 0)
}

/// The transaction marker of a control batch: its one record's key says COMMIT or ABORT.
fn decode_marker(batch: &[u8]) -> Option<LogRecord> {
    let base = i64::from_be_bytes(batch.get(0..8)?.try_into().ok()?);
    let producer_id = i64::from_be_bytes(batch.get(PRODUCER_ID..PRODUCER_ID + 8)?.try_into().ok()?);
    let producer_epoch = i16::from_be_bytes(
        batch
            .get(PRODUCER_ID + 8..PRODUCER_ID + 10)?
            .try_into()
            .ok()?,
    );
    let mut record = batch.get(RECORDS..)?;
    let _length = varint(&mut record)?;
    let _attributes = record.get(..1)?;
    record = &record[1..];
    let _timestamp_delta = varint(&mut record)?;
    let offset_delta = varint(&mut record)?;
    let key_length = usize::try_from(varint(&mut record)?).ok()?;
    let key = record.get(..key_length)?;
    let marker = Marker::from_control_key(key)?;
    Some(LogRecord {
        offset: base + offset_delta,
        producer_id,
        producer_epoch,
        transactional: true,
        control: Some(marker),
        key: None,
        present: false,
        value: None,
        writer: None,
    })
}

/// A zigzag-encoded variable-length integer (Kafka's record fields).
fn varint(bytes: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(offset: i64, key: &[u8], value: Option<&[u8]>, control: bool) -> Record {
        Record {
            transactional: true,
            control,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 42,
            producer_epoch: 5,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: 0,
            timestamp: 0,
            key: Some(Bytes::copy_from_slice(key)),
            value: value.map(Bytes::copy_from_slice),
            headers: Default::default(),
        }
    }

    fn encode(records: &[Record]) -> BytesMut {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .expect("encodes");
        buf
    }

    #[test]
    fn data_and_a_zero_crc_marker_decode_in_order() {
        let mut log = encode(&[
            record(7, b"t/0/1", Some(b"x"), false),
            record(8, b"t/0/2", None, false),
        ]);
        let mut marker = encode(&[record(9, &[0, 0, 0, 1], Some(&[0, 0, 0, 0, 0, 0]), true)]);
        marker[17..21].copy_from_slice(&[0, 0, 0, 0]);
        log.extend_from_slice(&marker);
        let (records, next) = decode_log(log.freeze(), |_, _| false).expect("decodes");
        assert_eq!(next, Some(10));
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].key.as_deref(), Some(&b"t/0/1"[..]));
        assert!(records[0].present && !records[1].present);
        assert_eq!(records[2].control, Some(Marker::Commit));
        assert_eq!(
            (
                records[2].offset,
                records[2].producer_id,
                records[2].producer_epoch
            ),
            (9, 42, 5)
        );
        assert_eq!(records[0].writer.as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn batches_passed_over_are_not_decoded_but_read_past() {
        let mut log = encode(&[
            record(7, b"t/0/1", Some(b"x"), false),
            record(8, b"t/0/2", Some(b"x"), false),
        ]);
        log.extend_from_slice(&encode(&[record(9, b"t/0/3", Some(b"x"), false)]));
        let (records, next) =
            decode_log(log.freeze(), |first, last| first >= 7 && last <= 8).expect("decodes");
        assert_eq!(next, Some(10));
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![9]);
    }

    #[test]
    fn a_corrupt_data_batch_is_an_error_not_a_skip() {
        let mut log = encode(&[record(0, b"t/0/1", Some(b"x"), false)]);
        let n = log.len();
        log[n - 2] ^= 0xff;
        let err = decode_log(log.freeze(), |_, _| false).expect_err("corrupt");
        assert!(err.contains("offset 0"), "{err}");
    }

    #[test]
    fn varints_are_zigzag() {
        let mut b: &[u8] = &[0x02, 0x01, 0xac, 0x02];
        assert_eq!(varint(&mut b), Some(1));
        assert_eq!(varint(&mut b), Some(-1));
        assert_eq!(varint(&mut b), Some(150));
        assert_eq!(varint(&mut b), None);
    }
}
