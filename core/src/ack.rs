//! Acknowledgements: each record's verdict ([`Disposition`]) and the handle that guarantees a
//! batch is never lost inside the pipeline.
//!
//! The safe outcome is the default. A [`BatchAck`] travels with a batch from the poll that read
//! it to the commit of its verdicts, owned by whichever stage holds the batch (Vector's event
//! finalizers: the last owner's drop settles). A batch dropped on any path before its verdicts
//! are decided — a panic unwinding through a stage, a `put` or `flush` that fails the task, a
//! stage that stops with batches in its mailbox, a failing task skipping work — drops its
//! handle, and the drop tells the consumer, which RELEASEs every record of the batch at once
//! (share mode) or leaves its offsets uncommitted and reads it again (classic mode) instead of
//! waiting for the broker's acquisition lock to run out. Settling consumes the handle, so a
//! batch cannot be settled twice.
use std::fmt;
use std::sync::Arc;

use crate::record::RecordCoordinates;

/// What happens to a record once the pipeline is done with it (KIP-932's acknowledgement types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Processed; the broker will not deliver it again.
    Accept,
    /// Not processed this time; the broker delivers it again (to any member).
    Release,
    /// Cannot ever be processed; the broker archives it (or dead-letters it, KIP-1191).
    Reject { reason: String },
}

impl fmt::Display for Disposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disposition::Accept => f.write_str("ACCEPT"),
            Disposition::Release => f.write_str("RELEASE"),
            Disposition::Reject { reason } => write!(f, "REJECT ({reason})"),
        }
    }
}

/// A record's verdict, as the consumer applies and commits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub record: RecordCoordinates,
    pub disposition: Disposition,
    /// True for a RELEASE because the record's batch was dropped unsettled ([`BatchAck`]):
    /// worth counting, since it means a task failed or stopped with the record in hand.
    pub implicit: bool,
}

/// Whoever must hear of a batch dropped before its verdicts were decided (the task's consumer,
/// which knows the batch's records and releases them).
pub trait BatchOwner: Send + Sync {
    /// Batch `batch` will never be settled; `reason` says why (for the task's status trace).
    fn unsettled(&self, batch: u64, reason: String);
}

impl BatchOwner for std::sync::mpsc::Sender<(u64, String)> {
    /// A closed receiver means the consumer is gone with its task; the broker then redelivers
    /// when the acquisition locks expire, or at once when the member's session ends.
    fn unsettled(&self, batch: u64, reason: String) {
        let _ = self.send((batch, reason));
    }
}

/// What a dropped handle reports when nobody said why.
pub const DROPPED_UNSETTLED: &str =
    "the batch was dropped before its verdicts were decided (a stage of the task stopped)";

/// The verdicts-to-be of one batch. Dropping it unsettled reports the batch to its owner, which
/// releases the batch's records; [`settle`](Self::settle) consumes it once the verdicts are
/// decided and on their way to the commit.
pub struct BatchAck {
    batch: u64,
    /// Said by the stage that gave up on the batch, reported on drop.
    reason: Option<String>,
    /// `None` once settled, so `Drop` knows there is nothing left to report.
    owner: Option<Arc<dyn BatchOwner>>,
}

impl BatchAck {
    pub fn new(batch: u64, owner: Arc<dyn BatchOwner>) -> Self {
        BatchAck {
            batch,
            reason: None,
            owner: Some(owner),
        }
    }

    /// The batch this handle settles.
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// The verdicts arrived where they are committed: nothing to report on drop.
    pub fn settle(mut self) -> u64 {
        self.owner = None;
        self.batch
    }

    /// Gives the batch up now, its records released, with `reason` in the task's trace.
    pub fn release(mut self, reason: impl Into<String>) {
        self.reason = Some(reason.into());
    }
}

impl Drop for BatchAck {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            let reason = self
                .reason
                .take()
                .unwrap_or_else(|| DROPPED_UNSETTLED.to_owned());
            owner.unsettled(self.batch, reason);
        }
    }
}

impl fmt::Debug for BatchAck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchAck")
            .field("batch", &self.batch)
            .field("settled", &self.owner.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    fn owner() -> (Arc<dyn BatchOwner>, mpsc::Receiver<(u64, String)>) {
        let (tx, rx) = mpsc::channel();
        (Arc::new(tx), rx)
    }

    #[test]
    fn a_handle_dropped_unsettled_reports_its_batch() {
        let (owner, rx) = owner();
        drop(BatchAck::new(7, owner));
        assert_eq!(rx.try_recv(), Ok((7, DROPPED_UNSETTLED.to_owned())));
    }

    #[test]
    fn a_settled_handle_reports_nothing() {
        let (owner, rx) = owner();
        assert_eq!(BatchAck::new(3, owner).settle(), 3);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_released_handle_reports_its_reason_once() {
        let (owner, rx) = owner();
        BatchAck::new(4, owner).release("put panicked");
        assert_eq!(rx.try_recv(), Ok((4, "put panicked".to_owned())));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_handle_dropped_in_a_panicking_thread_still_reports() {
        let (owner, rx) = owner();
        let handle = BatchAck::new(9, owner);
        let result = std::thread::spawn(move || {
            let _owned = handle;
            panic!("sink crashed mid-batch");
        })
        .join();
        assert!(result.is_err());
        assert_eq!(rx.try_recv().map(|(b, _)| b), Ok(9));
    }
}
