//! The exactly-once ledger's data: what a ledger record says, and how a reader replays a
//! ledger partition's log into the set of entries that are committed and not yet removed.
//!
//! A ledger record's key names a source record (`topic/partition/offset`); its value is
//! non-null while the entry stands and null (a tombstone) once the record's ACCEPT is durable.
//! Entries are written inside the producer transaction that writes the record's output, so an
//! entry exists exactly when that output was committed.
//!
//! The reader fetches with read_uncommitted and resolves transactions itself from the control
//! records (transaction markers) in the log: a transactional record counts only once a COMMIT
//! marker of its producer follows it, and never after an ABORT. This is correct on any broker;
//! it does not rely on the broker's read_committed filtering, which the dev broker's classic
//! Fetch does not do (DESIGN.md, "Transactions on the dev broker").

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use spillway_core::RecordCoordinates;

/// The ledger key of a source record: `topic/partition/offset`. Kafka topic names cannot
/// contain `/`, so the key is unambiguous.
pub fn ledger_key(record: &RecordCoordinates) -> Bytes {
    Bytes::from(format!(
        "{}/{}/{}",
        record.topic, record.partition, record.offset
    ))
}

/// The source record a ledger key names; `None` for a key this module did not write.
pub fn parse_ledger_key(key: &[u8]) -> Option<RecordCoordinates> {
    let (topic, partition, offset) = ledger_key_parts(key)?;
    Some(RecordCoordinates::new(topic, partition, offset))
}

/// The topic, partition and offset a ledger key names, borrowed from it.
pub fn ledger_key_parts(key: &[u8]) -> Option<(&str, i32, i64)> {
    let text = std::str::from_utf8(key).ok()?;
    let mut parts = text.rsplitn(3, '/');
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next()?;
    (!topic.is_empty()).then_some((topic, partition, offset))
}

/// Classic mode: the ledger key of a source partition's checkpoint,
/// `checkpoint:<connector>/<topic>/<partition>`. One key per partition, so compaction keeps
/// only the latest; the `checkpoint:` prefix (`:` is not allowed in topic names) keeps it apart
/// from share-mode entry keys.
pub fn checkpoint_key(connector: &str, topic: &str, partition: i32) -> Bytes {
    Bytes::from(format!("checkpoint:{connector}/{topic}/{partition}"))
}

/// A checkpoint's value: the source partition's next offset, as decimal text.
pub fn checkpoint_value(next_offset: i64) -> Bytes {
    Bytes::from(next_offset.to_string())
}

/// The next offset a checkpoint value names; `None` for a value this module did not write.
pub fn parse_checkpoint_value(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value)
        .ok()?
        .parse()
        .ok()
        .filter(|o: &i64| *o >= 0)
}

/// The record header naming the transactional id that wrote a checkpoint (its value is the
/// offset), so a successor can find the transactions its predecessor left open.
pub const WRITER_HEADER: &str = "spillway.writer";

/// The ledger partition holding the entries of `source_partition`'s records: entries are
/// partitioned by source partition, so a lookup reads one ledger partition.
pub fn ledger_partition(source_partition: i32, ledger_partitions: i32) -> i32 {
    source_partition.rem_euclid(ledger_partitions.max(1))
}

/// What one record of the ledger log says, as the reader needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub offset: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub transactional: bool,
    /// A transaction marker; `commit` says which.
    pub control: Option<Marker>,
    pub key: Option<Bytes>,
    /// `false` for a tombstone.
    pub present: bool,
    /// The record's value (`None` for a tombstone).
    pub value: Option<Bytes>,
    /// The transactional id that wrote it: a share entry's value, a checkpoint's
    /// [`WRITER_HEADER`].
    pub writer: Option<Bytes>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    Commit,
    Abort,
}

impl Marker {
    /// A control record's key: version (int16) then type (int16; 0 abort, 1 commit). Other
    /// control types (e.g. leader change records) are not markers.
    pub fn from_control_key(key: &[u8]) -> Option<Marker> {
        let kind = i16::from_be_bytes(key.get(2..4)?.try_into().ok()?);
        match kind {
            0 => Some(Marker::Abort),
            1 => Some(Marker::Commit),
            _ => None,
        }
    }
}

/// A change the replay applies to the set of standing entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The key stands with this value.
    Put(Bytes, Bytes),
    Remove(Bytes),
}

/// The replay state of one ledger partition: the next offset to read and, per producer, the
/// entries of its open transaction.
#[derive(Debug, Default)]
pub struct PartitionReplay {
    pub next_offset: i64,
    pending: HashMap<i64, Vec<(Bytes, Option<Bytes>)>>,
    /// Per open transaction: the producer's epoch and the writer an entry of it names.
    pending_owner: HashMap<i64, (i16, Option<Bytes>)>,
    /// Keys in some open transaction, to tell a lookup to wait for its outcome.
    pending_keys: HashMap<Bytes, usize>,
}

impl PartitionReplay {
    pub fn starting_at(offset: i64) -> Self {
        PartitionReplay {
            next_offset: offset,
            ..PartitionReplay::default()
        }
    }

    /// Applies one record in log order; returns the changes to the standing entries it
    /// settles (none while its transaction is open). Records before `next_offset` were seen
    /// already (a fetch may return a batch from its start) and are skipped.
    pub fn apply(&mut self, record: LogRecord) -> Vec<Change> {
        if record.offset < self.next_offset {
            return Vec::new();
        }
        self.next_offset = record.offset + 1;
        if let Some(marker) = record.control {
            self.pending_owner.remove(&record.producer_id);
            let Some(entries) = self.pending.remove(&record.producer_id) else {
                return Vec::new();
            };
            for (key, _) in &entries {
                if let Some(n) = self.pending_keys.get_mut(key) {
                    *n -= 1;
                    if *n == 0 {
                        self.pending_keys.remove(key);
                    }
                }
            }
            if marker == Marker::Abort {
                return Vec::new();
            }
            return entries.into_iter().map(change).collect();
        }
        let Some(key) = record.key else {
            return Vec::new();
        };
        let value = if record.present {
            Some(record.value.unwrap_or_default())
        } else {
            None
        };
        if !record.transactional {
            return vec![change((key, value))];
        }
        let owner = self
            .pending_owner
            .entry(record.producer_id)
            .or_insert((record.producer_epoch, None));
        if owner.1.is_none() {
            owner.1 = record.writer;
        }
        *self.pending_keys.entry(key.clone()).or_default() += 1;
        self.pending
            .entry(record.producer_id)
            .or_default()
            .push((key, value));
        Vec::new()
    }

    /// Whether `key` is written by a transaction whose outcome the log does not show yet.
    pub fn is_pending(&self, key: &[u8]) -> bool {
        self.pending_keys.contains_key(key)
    }

    /// Forgets open transactions (the reader starts over from `offset`).
    pub fn reset(&mut self, offset: i64) {
        *self = PartitionReplay::starting_at(offset);
    }

    pub fn open_transactions(&self) -> usize {
        self.pending.len()
    }

    /// The open transactions: producer id, epoch and the writer its entries name.
    pub fn open_transaction_owners(&self) -> Vec<(i64, i16, Option<Bytes>)> {
        self.pending_owner
            .iter()
            .map(|(pid, (epoch, writer))| (*pid, *epoch, writer.clone()))
            .collect()
    }
}

fn change((key, value): (Bytes, Option<Bytes>)) -> Change {
    match value {
        Some(value) => Change::Put(key, value),
        None => Change::Remove(key),
    }
}

/// Keys a lookup must wait for, among `keys`.
pub fn pending_among<'a>(replay: &PartitionReplay, keys: &'a [Bytes]) -> HashSet<&'a Bytes> {
    keys.iter().filter(|k| replay.is_pending(k)).collect()
}

/// A transaction marker of `producer_id` at `offset`, as the log reader makes it (for tests).
#[cfg(test)]
pub(crate) fn marker_record(offset: i64, producer_id: i64, marker: Marker) -> LogRecord {
    LogRecord {
        offset,
        producer_id,
        producer_epoch: 3,
        transactional: true,
        control: Some(marker),
        key: None,
        present: false,
        value: None,
        writer: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(offset: i64, pid: i64, key: &str, present: bool) -> LogRecord {
        LogRecord {
            offset,
            producer_id: pid,
            producer_epoch: 3,
            transactional: true,
            control: None,
            key: Some(Bytes::from(key.to_owned())),
            present,
            value: present.then(|| Bytes::from_static(b"spillway-m-0")),
            writer: present.then(|| Bytes::from_static(b"spillway-m-0")),
        }
    }

    use super::marker_record as marker;

    fn key(s: &str) -> Bytes {
        Bytes::from(s.to_owned())
    }

    fn writer() -> Bytes {
        Bytes::from_static(b"spillway-m-0")
    }

    #[test]
    fn checkpoints_have_one_key_per_partition_and_parse_back() {
        let k = checkpoint_key("acme/mirror", "orders", 3);
        assert_eq!(&k[..], b"checkpoint:acme/mirror/orders/3");
        assert_ne!(k, checkpoint_key("acme/mirror", "orders", 4));
        assert_eq!(parse_checkpoint_value(&checkpoint_value(1234)), Some(1234));
        assert_eq!(parse_checkpoint_value(b"-1"), None);
        assert_eq!(parse_checkpoint_value(b"spillway-m-0"), None);
    }

    #[test]
    fn the_latest_committed_checkpoint_value_is_what_a_replay_settles() {
        let mut replay = PartitionReplay::default();
        let checkpoint = |offset: i64, pid: i64, next: i64| LogRecord {
            value: Some(checkpoint_value(next)),
            ..data(offset, pid, "checkpoint:m/t/0", true)
        };
        replay.apply(checkpoint(0, 1, 500));
        assert_eq!(
            replay.apply(marker(1, 1, Marker::Commit)),
            vec![Change::Put(key("checkpoint:m/t/0"), checkpoint_value(500))]
        );
        replay.apply(checkpoint(2, 2, 900));
        assert!(replay.apply(marker(3, 2, Marker::Abort)).is_empty());
        assert!(!replay.is_pending(b"checkpoint:m/t/0"));
    }

    #[test]
    fn keys_name_the_source_record_and_parse_back() {
        let c = RecordCoordinates::new("orders.v1-eu", 7, 123_456);
        let k = ledger_key(&c);
        assert_eq!(&k[..], b"orders.v1-eu/7/123456");
        assert_eq!(parse_ledger_key(&k), Some(c));
        assert_eq!(parse_ledger_key(b"no-slashes"), None);
        assert_eq!(parse_ledger_key(b"/1/2"), None);
    }

    #[test]
    fn source_partitions_spread_over_ledger_partitions() {
        assert_eq!(ledger_partition(5, 4), 1);
        assert_eq!(ledger_partition(3, 4), 3);
        assert_eq!(ledger_partition(9, 1), 0);
        assert_eq!(
            ledger_partition(2, 0),
            0,
            "a topic without partitions is refused earlier"
        );
    }

    #[test]
    fn control_keys_tell_commit_from_abort() {
        assert_eq!(
            Marker::from_control_key(&[0, 0, 0, 1]),
            Some(Marker::Commit)
        );
        assert_eq!(Marker::from_control_key(&[0, 0, 0, 0]), Some(Marker::Abort));
        assert_eq!(Marker::from_control_key(&[0, 0, 0, 2]), None);
        assert_eq!(Marker::from_control_key(&[0]), None);
    }

    #[test]
    fn entries_count_only_once_their_transaction_commits() {
        let mut replay = PartitionReplay::default();
        assert!(replay.apply(data(0, 1, "t/0/5", true)).is_empty());
        assert!(replay.is_pending(b"t/0/5"));
        assert_eq!(
            replay.open_transaction_owners(),
            vec![(1, 3, Some(Bytes::from_static(b"spillway-m-0")))]
        );
        assert_eq!(
            replay.apply(marker(1, 1, Marker::Commit)),
            vec![Change::Put(key("t/0/5"), writer())]
        );
        assert!(!replay.is_pending(b"t/0/5"));
        assert_eq!(replay.next_offset, 2);
    }

    #[test]
    fn an_aborted_transaction_leaves_nothing() {
        let mut replay = PartitionReplay::default();
        replay.apply(data(0, 1, "t/0/5", true));
        replay.apply(data(1, 1, "t/0/6", true));
        assert!(replay.apply(marker(2, 1, Marker::Abort)).is_empty());
        assert!(!replay.is_pending(b"t/0/5"));
        assert!(replay.open_transaction_owners().is_empty());
        assert_eq!(replay.open_transactions(), 0);
    }

    #[test]
    fn interleaved_producers_resolve_separately_and_tombstones_remove() {
        let mut replay = PartitionReplay::default();
        replay.apply(data(0, 1, "t/0/1", true));
        replay.apply(data(1, 2, "t/1/1", true));
        replay.apply(data(2, 1, "t/0/0", false));
        assert_eq!(
            replay.apply(marker(3, 2, Marker::Commit)),
            vec![Change::Put(key("t/1/1"), writer())]
        );
        assert!(replay.is_pending(b"t/0/1"), "producer 1 is still open");
        assert_eq!(
            replay.apply(marker(4, 1, Marker::Commit)),
            vec![
                Change::Put(key("t/0/1"), writer()),
                Change::Remove(key("t/0/0"))
            ]
        );
    }

    #[test]
    fn records_already_replayed_are_skipped_and_plain_records_apply_at_once() {
        let mut replay = PartitionReplay::starting_at(10);
        assert!(replay.apply(data(9, 1, "t/0/9", true)).is_empty());
        assert_eq!(replay.open_transactions(), 0);
        let plain = LogRecord {
            transactional: false,
            ..data(10, -1, "t/0/10", true)
        };
        assert_eq!(
            replay.apply(plain),
            vec![Change::Put(key("t/0/10"), writer())]
        );
    }
}
