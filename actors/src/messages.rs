//! The messages a task's actors exchange. Records travel in batches, one way:
//! ConsumerActor → [`SourceBatch`] → ConverterActor → [`SinkBatch`] → SinkActor → [`Outcomes`]
//! → AckerActor, which acknowledges and commits them; then only a credit goes back:
//! [`Committed`], which lets the consumer poll another batch.
//!
//! Each batch carries its [`BatchAck`] all the way: a stage that drops a batch (a panic, a
//! failure, a stop) drops the handle, which sends [`Unsettled`] to the acker, and the acker
//! releases the batch's records at once (it learnt them from [`BatchPolled`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::Message;
use std::collections::BTreeMap;
use std::time::Instant;

use spillway_core::{
    Ack, BatchAck, ConsumerGroupMetadata, DeadLetterRecord, Disposition, Processed, RawRecord,
    RecordCoordinates, SinkRecord, TopicPartition,
};

use crate::source::AssignmentChange;
use crate::telemetry::BatchTrace;

/// Records as polled, with the assignment changes that came before them.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SourceBatch {
    /// The batch's handle (its number is the batch's sequence number in the task).
    pub ack: BatchAck,
    pub changes: Vec<AssignmentChange>,
    pub records: Vec<RawRecord>,
    pub trace: BatchTrace,
    /// The member that read them, when the sink commits offsets itself (classic mode).
    pub group: Option<ConsumerGroupMetadata>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct SinkBatch {
    /// The batch's handle (its number is the batch's sequence number in the task).
    pub ack: BatchAck,
    pub changes: Vec<AssignmentChange>,
    /// The batch's records as read, kept for dead letters; moved here as the consumer's list,
    /// not record by record.
    pub raws: Vec<RawRecord>,
    /// What conversion and transforms made of the records not made ready for `put` (filtered
    /// or failed), with their index in `raws`, in batch order. The ready ones, nearly all, are
    /// in `ready` only: no entry per record here (a `Processed` is as large as a record).
    pub not_ready: Vec<(usize, Processed)>,
    /// The records ready for `put`, in batch order: the converter pushes each straight into
    /// this list, which `put` takes whole, so a record (several hundred bytes) is not copied
    /// from one list into another on its way.
    pub ready: Ready,
    pub trace: BatchTrace,
    pub group: Option<ConsumerGroupMetadata>,
}

/// The records a `put` gets, each with its entry's index in the batch.
#[derive(Default)]
pub struct Ready {
    pub indices: Vec<usize>,
    pub records: Vec<SinkRecord>,
}

/// ACCEPTs the broker made durable (share mode), passed down the pipeline to the sink task's
/// `acknowledged`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Acknowledged {
    pub records: Vec<RecordCoordinates>,
}

/// The verdict on one record, and the dead letter to write before a REJECT.
#[derive(Debug)]
pub struct Verdict {
    pub record: RecordCoordinates,
    pub disposition: Disposition,
    /// Boxed: rare, and a verdict per record travels in every batch.
    pub dead_letter: Option<Box<DeadLetterRecord>>,
}

/// A batch's verdicts as they travel to the acker: each record's acknowledgement in batch
/// order, and apart from them the few dead letters to write first, each with the index of
/// its record's acknowledgement.
///
/// Kept apart so that the acknowledgements are the list the acker commits, moved on whole:
/// a list of [`Verdict`]s was searched for dead letters and copied into acknowledgements,
/// record by record, in every batch (issue 18).
#[derive(Debug, Default)]
pub struct Verdicts {
    pub acks: Vec<Ack>,
    pub dead_letters: Vec<(usize, Box<DeadLetterRecord>)>,
}

impl Verdicts {
    pub fn with_capacity(records: usize) -> Self {
        Verdicts {
            acks: Vec::with_capacity(records),
            dead_letters: Vec::new(),
        }
    }

    /// Adds the verdict on the next record of the batch.
    pub fn push(&mut self, verdict: Verdict) {
        if let Some(letter) = verdict.dead_letter {
            self.dead_letters.push((self.acks.len(), letter));
        }
        self.ack(verdict.record, verdict.disposition);
    }

    /// Adds the verdict on the next record of the batch when it has no dead letter: the
    /// common case, built where it is kept.
    #[inline(always)]
    pub fn ack(&mut self, record: RecordCoordinates, disposition: Disposition) {
        self.acks.push(Ack {
            record,
            disposition,
            implicit: false,
        });
    }
}

impl FromIterator<Verdict> for Verdicts {
    fn from_iter<I: IntoIterator<Item = Verdict>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut verdicts = Verdicts::with_capacity(iter.size_hint().0);
        iter.for_each(|v| verdicts.push(v));
        verdicts
    }
}

/// What became of each record of a batch in the sink stage: its verdict (ACCEPT, RELEASE,
/// REJECT) and any dead letter to write first.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Outcomes {
    /// The batch's handle (its number is the batch's sequence number in the task).
    pub ack: BatchAck,
    pub verdicts: Verdicts,
    /// Set when a record failed under `errors.tolerance=none`: the task fails once this
    /// batch's verdicts are committed.
    pub fail_task: Option<String>,
    /// The failure is for good: restarting the task cannot help (a record named in it was
    /// given up on its last allowed delivery, or the group's lock is too short), so it stays
    /// FAILED rather than being restarted.
    pub fail_for_good: bool,
    pub trace: BatchTrace,
    /// Classic mode: where the task asked partitions it opened to start
    /// (`SinkTask::start_offsets`).
    pub start_offsets: BTreeMap<TopicPartition, i64>,
    /// Share mode: the target is failing; fetch no new records before this instant (the
    /// retry backoff's next attempt), so none wait out their locks meanwhile.
    pub pause_fetch_until: Option<Instant>,
}

/// The consumer polled batch `seq`: what the acker needs to release its records should the
/// batch be lost, and to measure its commit. Sent before the batch goes down the pipeline.
#[derive(Message)]
#[rtype(result = "()")]
pub struct BatchPolled {
    pub seq: u64,
    pub records: crate::acker::BatchRecords,
    pub last_deliveries: Vec<String>,
    pub meta: crate::metrics::BatchMeta,
}

/// The credits of batches `seqs`, committed (or given up on): the consumer may poll again.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Committed {
    pub seqs: Vec<u64>,
    /// The commit failed: the task fails, and closes without committing again.
    pub result: Result<(), crate::error::RuntimeError>,
    /// Share mode: the target is failing; no fetch before this instant, unless the connector's
    /// successful puts no longer number the count given.
    pub pause: Option<(Instant, u64)>,
    /// A verdict asked the task to fail (`errors.tolerance=none`) once its batch was
    /// committed; `true`: for good.
    pub failure: Option<(String, bool)>,
}

/// Records released without a verdict on their last allowed delivery (the broker archives
/// them), for the task's final trace.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Archived {
    pub records: Vec<String>,
    pub reason: String,
}

/// The stop's deadline passed: release every batch still in flight, because `why`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ReleaseInFlight {
    pub why: &'static str,
}

/// The task is stopping (draining or failing): no fetch pause is set from now on.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Stopping;

/// Stop polling, finish the batches in flight, commit, leave the group, stop the task.
/// `together`: the tasks stopping with it (a connector's stop), whose consumers close only once
/// every one of them has committed ([`CloseGate`]).
#[derive(Message, Default)]
#[rtype(result = "()")]
pub struct Drain {
    pub together: Option<Arc<CloseGate>>,
}

/// The tasks of a connector that stop together close their consumers together: each commits,
/// then waits (bounded) for the others before its connections close. On the dev broker a
/// closing connection ends every share session on that broker, so a task closing first would
/// cost the others their last commit and redeliver what they had already written; on Kafka a
/// close only ends its own session, and the wait costs the few milliseconds the commits take.
pub struct CloseGate {
    expected: usize,
    arrived: tokio::sync::watch::Sender<usize>,
}

impl CloseGate {
    pub fn new(expected: usize) -> Arc<CloseGate> {
        Arc::new(CloseGate {
            expected,
            arrived: tokio::sync::watch::Sender::new(0),
        })
    }

    /// This task has committed: counts it, then waits until every task has (at most `limit`).
    pub async fn arrive_and_wait(&self, limit: std::time::Duration) {
        let mut arrived = self.arrived.subscribe();
        self.arrived.send_modify(|n| *n += 1);
        let expected = self.expected;
        let _ = tokio::time::timeout(limit, arrived.wait_for(|n| *n >= expected)).await;
    }
}

/// The consumer is closed: close and stop the sink task. The answer is a failure of that
/// (a panic in `close` or `stop`), for the task's final event, which the consumer reports.
#[derive(Message, Clone)]
#[rtype(result = "Option<String>")]
pub struct Finish;

/// The sink stage flushes the batches it holds for its task's flush interval now: the
/// consumer found nothing more to poll (they would wait for the interval while it waits for
/// their commit), or the task is stopping (their verdicts must be committed before the
/// consumer closes; from then on no batch is held).
#[derive(Message, Debug, Default)]
#[rtype(result = "()")]
pub struct FlushHeld {
    pub stopping: bool,
}

/// Classic mode: the sink stage put batch `seq` and holds it for its flush interval. Its
/// records are written and dropped; only its commit is left. So it gives its credit and its
/// in-flight bytes back, and the consumer may poll past it. Its stop still waits for the commit.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct BatchHeld {
    pub seq: u64,
}

/// A batch was dropped before its verdicts were decided ([`BatchAck`]'s drop): the acker
/// releases its records and the task fails with `reason`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Unsettled {
    pub seq: u64,
    pub reason: String,
}

/// A stage failed outside a batch (the sink task's `start` or `acknowledged`): the task fails.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct TaskFailure(pub String);

/// Set once the task is going to fail: the stages release the batches they still receive
/// instead of converting and putting them (Connect stops a task at its first failure).
#[derive(Debug, Clone, Default)]
pub struct Failing(Arc<AtomicBool>);

impl Failing {
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a task tells its connector.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub enum TaskEvent {
    /// The task committed its first batch since it started: it works.
    Progress { task: u32, generation: u64 },
    /// The task failed; `trace` says why. `for_good`: a restart cannot help, the task stays
    /// FAILED.
    Failed {
        task: u32,
        generation: u64,
        trace: String,
        for_good: bool,
    },
    /// The task stopped as asked.
    Stopped { task: u32, generation: u64 },
}

/// Where a task's events go (its connector, or a test).
pub type Reporter = Arc<dyn Fn(TaskEvent) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(offset: i64, disposition: Disposition, letter: Option<&str>) -> Verdict {
        Verdict {
            record: RecordCoordinates::new("orders", 0, offset),
            disposition,
            dead_letter: letter.map(|dlq| {
                Box::new(DeadLetterRecord {
                    topic: dlq.to_owned(),
                    key: None,
                    value: None,
                    headers: Vec::new(),
                    timestamp: None,
                })
            }),
        }
    }

    #[test]
    fn dead_letters_point_at_their_records_acknowledgements() {
        let reject = || Disposition::Reject {
            reason: "bad".into(),
        };
        let verdicts: Verdicts = [
            verdict(10, Disposition::Accept, None),
            verdict(11, reject(), Some("dlq-a")),
            verdict(12, Disposition::Release, None),
            verdict(13, reject(), Some("dlq-b")),
        ]
        .into_iter()
        .collect();
        let offsets: Vec<i64> = verdicts.acks.iter().map(|a| a.record.offset).collect();
        assert_eq!(offsets, [10, 11, 12, 13]);
        assert!(verdicts.acks.iter().all(|a| !a.implicit));
        assert!(matches!(verdicts.acks[2].disposition, Disposition::Release));
        let letters: Vec<(i64, &str)> = verdicts
            .dead_letters
            .iter()
            .map(|(i, letter)| (verdicts.acks[*i].record.offset, letter.topic.as_str()))
            .collect();
        assert_eq!(letters, [(11, "dlq-a"), (13, "dlq-b")]);
    }
}
