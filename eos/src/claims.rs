//! Claims in the ledger: how a share-mode writer finds out, before it commits, that another
//! writer has written ledger entries for the same source records.
//!
//! Two members can hold one record one after the other while the first still thinks it holds
//! it: the broker releases a member's records before their lock deadline when its share session
//! goes (Kafka: the connection that created the session closed; the dev broker: any connection to
//! that broker closed). The first member's transaction may then write the record while the
//! second member, whose ledger lookup came before the first one's entries, writes it too. The
//! deadline guard cannot see this, and both transactions would commit.
//!
//! The ledger's log order decides instead. Each writer's entries are in the log before it
//! commits; before committing, it reads its entries' ledger partitions past them and looks for an
//! entry of another writer (or of an earlier transaction of its own) for one of its records,
//! **earlier in the log** than its own and not aborted, or committed anywhere. If there is one, it
//! aborts and releases the records. Of two writers of a record, the later in the log always sees
//! the earlier, so at most one commits; when the earlier aborts too, the record is delivered again
//! and its next holder looks it up. A competing entry can only have been written after the record
//! was acquired, that is within one acquisition lock, so the window keeps what it has read for the
//! longest lock seen (`retention`), as runs of consecutive source offsets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_core::RecordCoordinates;

use crate::ledger::{ledger_key_parts, LogRecord, Marker};

/// Entries of one producer for consecutive offsets of a source partition, at consecutive ledger
/// offsets.
#[derive(Debug, Clone)]
struct ClaimRun {
    first: i64,
    last: i64,
    /// The ledger offset of the entry for `first`.
    ledger_first: i64,
    producer_id: i64,
    committed: bool,
    seen_at: Instant,
}

impl ClaimRun {
    fn ledger_offset_of(&self, offset: i64) -> i64 {
        self.ledger_first + (offset - self.first)
    }
}

/// What one ledger partition's claims of other writers look like, as read so far.
#[derive(Debug, Default)]
pub struct ClaimWindow {
    /// Per source (topic, partition), its runs in log order. A short list: a ledger partition
    /// holds the entries of the few source partitions that map to it.
    runs: Vec<(SourcePartition, Vec<ClaimRun>)>,
}

type SourcePartition = (Arc<str>, i32);

impl ClaimWindow {
    /// Takes in one ledger record, in log order, that is not an entry of the transaction being
    /// checked. Tombstones and checkpoints are no claims (a tombstoned record's ACCEPT is durable:
    /// it is not delivered again).
    pub fn observe(&mut self, record: &LogRecord, now: Instant) {
        if let Some(marker) = record.control {
            for (_, runs) in &mut self.runs {
                match marker {
                    Marker::Abort => {
                        runs.retain(|r| r.committed || r.producer_id != record.producer_id)
                    }
                    Marker::Commit => runs
                        .iter_mut()
                        .filter(|r| r.producer_id == record.producer_id)
                        .for_each(|r| r.committed = true),
                }
            }
            return;
        }
        if !record.present {
            return;
        }
        let Some((topic, partition, offset)) = record.key.as_deref().and_then(ledger_key_parts)
        else {
            return;
        };
        let committed = !record.transactional;
        let at = match self.position(topic, partition) {
            Some(at) => at,
            None => {
                self.runs.push(((Arc::from(topic), partition), Vec::new()));
                self.runs.len() - 1
            }
        };
        let runs = &mut self.runs[at].1;
        if let Some(run) = runs.last_mut() {
            if run.producer_id == record.producer_id
                && run.committed == committed
                && offset == run.last + 1
                && record.offset == run.ledger_offset_of(offset)
            {
                run.last = offset;
                run.seen_at = now;
                return;
            }
        }
        runs.push(ClaimRun {
            first: offset,
            last: offset,
            ledger_first: record.offset,
            producer_id: record.producer_id,
            committed,
            seen_at: now,
        });
    }

    /// Forgets runs read more than `retention` ago: no record held now was acquired before
    /// them.
    pub fn prune(&mut self, now: Instant, retention: Duration) {
        self.runs.retain_mut(|(_, runs)| {
            runs.retain(|r| now.saturating_duration_since(r.seen_at) <= retention);
            !runs.is_empty()
        });
    }

    /// Of `own` (a record and the ledger offset of this writer's entry for it), those another
    /// entry competes with: committed, or earlier in the log and not aborted.
    pub fn conflicts(&self, own: &[(RecordCoordinates, i64)]) -> Vec<RecordCoordinates> {
        let mut found = Vec::new();
        if self.runs.is_empty() {
            return found;
        }
        // `own` runs by source partition: each stretch is compared with the runs that overlap
        // its offsets, not record by record with every run.
        let mut rest = own;
        while let Some((first, _)) = rest.first() {
            let same = rest
                .iter()
                .position(|(r, _)| r.partition != first.partition || r.topic != first.topic)
                .unwrap_or(rest.len());
            let (stretch, after) = rest.split_at(same);
            rest = after;
            let Some(at) = self.position(first.topic.as_str(), first.partition) else {
                continue;
            };
            let (low, high) = stretch.iter().fold((i64::MAX, i64::MIN), |(l, h), (r, _)| {
                (l.min(r.offset), h.max(r.offset))
            });
            let overlapping: Vec<&ClaimRun> = self.runs[at]
                .1
                .iter()
                .filter(|r| r.first <= high && low <= r.last)
                .collect();
            if overlapping.is_empty() {
                continue;
            }
            for (record, ledger_offset) in stretch {
                let competing = overlapping.iter().any(|r| {
                    r.first <= record.offset
                        && record.offset <= r.last
                        && (r.committed || r.ledger_offset_of(record.offset) < *ledger_offset)
                });
                if competing {
                    found.push(record.clone());
                }
            }
        }
        found
    }

    fn position(&self, topic: &str, partition: i32) -> Option<usize> {
        self.runs
            .iter()
            .position(|((t, p), _)| *p == partition && &**t == topic)
    }

    /// Runs held (for tests).
    pub fn runs(&self) -> usize {
        self.runs.iter().map(|(_, runs)| runs.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(offset: i64, pid: i64, source_offset: i64) -> LogRecord {
        LogRecord {
            offset,
            producer_id: pid,
            producer_epoch: 0,
            transactional: true,
            control: None,
            key: Some(Bytes::from(format!("src/3/{source_offset}"))),
            present: true,
            value: Some(Bytes::from_static(b"spillway-m-1")),
            writer: Some(Bytes::from_static(b"spillway-m-1")),
        }
    }

    use crate::ledger::marker_record as marker;

    fn own(source_offset: i64, ledger_offset: i64) -> (RecordCoordinates, i64) {
        (
            RecordCoordinates::new("src", 3, source_offset),
            ledger_offset,
        )
    }

    #[test]
    fn consecutive_entries_of_a_producer_make_one_run() {
        let now = Instant::now();
        let mut window = ClaimWindow::default();
        for i in 0..500 {
            window.observe(&entry(100 + i, 7, 5000 + i), now);
        }
        assert_eq!(window.runs(), 1);
        // Another producer, then the first again: three runs.
        window.observe(&entry(600, 8, 6000), now);
        window.observe(&entry(601, 7, 5500), now);
        assert_eq!(window.runs(), 3);
    }

    #[test]
    fn an_earlier_open_entry_competes_and_a_later_one_does_not() {
        let now = Instant::now();
        let mut window = ClaimWindow::default();
        for i in 0..10 {
            window.observe(&entry(100 + i, 7, 5000 + i), now);
        }
        // Ours at ledger offsets after theirs: all ten compete.
        let ours: Vec<_> = (0..10).map(|i| own(5000 + i, 200 + i)).collect();
        assert_eq!(window.conflicts(&ours).len(), 10);
        // Ours before theirs (they are still open): they must abort, not us.
        let ours: Vec<_> = (0..10).map(|i| own(5000 + i, 50 + i)).collect();
        assert!(window.conflicts(&ours).is_empty());
        // Records they did not write do not compete.
        assert!(window.conflicts(&[own(5010, 300)]).is_empty());
        assert!(window
            .conflicts(&[(RecordCoordinates::new("src", 4, 5000), 300)])
            .is_empty());
    }

    #[test]
    fn a_committed_entry_competes_wherever_it_is_and_an_aborted_one_never() {
        let now = Instant::now();
        let mut window = ClaimWindow::default();
        window.observe(&entry(100, 7, 5000), now);
        window.observe(&entry(101, 8, 5001), now);
        window.observe(&marker(102, 7, Marker::Commit), now);
        window.observe(&marker(103, 8, Marker::Abort), now);
        assert_eq!(
            window.conflicts(&[own(5000, 50), own(5001, 200)]),
            vec![RecordCoordinates::new("src", 3, 5000)]
        );
        assert_eq!(window.runs(), 1, "the aborted run is gone");
    }

    #[test]
    fn a_commit_marker_settles_only_its_producers_runs() {
        let now = Instant::now();
        let mut window = ClaimWindow::default();
        window.observe(&entry(100, 7, 5000), now);
        window.observe(&entry(101, 8, 5001), now);
        window.observe(&marker(102, 8, Marker::Commit), now);
        // 5000 is still open and after ours: no conflict; 5001 is committed: conflict.
        assert_eq!(
            window.conflicts(&[own(5000, 90), own(5001, 90)]),
            vec![RecordCoordinates::new("src", 3, 5001)]
        );
        // A later transaction of producer 7 aborts: only its open runs go.
        window.observe(&marker(103, 7, Marker::Abort), now);
        assert_eq!(window.runs(), 1);
    }

    #[test]
    fn tombstones_and_checkpoints_are_no_claims() {
        let now = Instant::now();
        let mut window = ClaimWindow::default();
        window.observe(
            &LogRecord {
                present: false,
                value: None,
                ..entry(100, 7, 5000)
            },
            now,
        );
        window.observe(
            &LogRecord {
                key: Some(Bytes::from_static(b"checkpoint:m/src/3")),
                ..entry(101, 7, 0)
            },
            now,
        );
        assert_eq!(window.runs(), 0);
        assert!(window.conflicts(&[own(5000, 200)]).is_empty());
    }

    #[test]
    fn runs_older_than_the_retention_are_forgotten() {
        let start = Instant::now();
        let mut window = ClaimWindow::default();
        window.observe(&entry(100, 7, 5000), start);
        window.observe(&entry(101, 8, 6000), start + Duration::from_secs(20));
        window.prune(start + Duration::from_secs(35), Duration::from_secs(30));
        assert_eq!(window.runs(), 1);
        assert!(window.conflicts(&[own(5000, 200)]).is_empty());
        assert_eq!(window.conflicts(&[own(6000, 200)]).len(), 1);
    }
}
