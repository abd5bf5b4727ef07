//! Acknowledgement handles: each record's verdict travels from wherever it is decided to the
//! acker, which turns it into a share-group acknowledgement or an offset commit.
//!
//! The safe outcome is the default: an [`AckHandle`] dropped without a verdict reports
//! [`Disposition::Release`], so a record lost inside the pipeline (a panic, a cancelled future,
//! a forgotten branch) is redelivered by the broker instead of being silently accepted.
//! Settling consumes the handle, so a record cannot be settled twice.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

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

/// A settled record, as the acker receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub record: RecordCoordinates,
    pub disposition: Disposition,
    /// True when the handle was dropped unsettled: worth counting, since it means a record
    /// went missing inside the pipeline.
    pub implicit: bool,
}

/// Whoever consumes acknowledgements: a collector, a channel, an actor's mailbox.
pub trait AckSink: Send + Sync {
    fn deliver(&self, ack: Ack);
}

impl AckSink for std::sync::mpsc::Sender<Ack> {
    /// A closed receiver means the acker is gone; the broker's acquisition lock then expires
    /// and redelivers, which is what a release would have done.
    fn deliver(&self, ack: Ack) {
        let _ = self.send(ack);
    }
}

/// The verdict-to-be for one record. Settle it with [`accept`](Self::accept),
/// [`release`](Self::release) or [`reject`](Self::reject); dropping it releases the record.
pub struct AckHandle {
    record: RecordCoordinates,
    /// `None` once settled, so `Drop` knows there is nothing left to report.
    sink: Option<Arc<dyn AckSink>>,
}

impl AckHandle {
    pub fn new(record: RecordCoordinates, sink: Arc<dyn AckSink>) -> Self {
        AckHandle {
            record,
            sink: Some(sink),
        }
    }

    /// The record this handle settles.
    pub fn record(&self) -> &RecordCoordinates {
        &self.record
    }

    pub fn accept(self) {
        self.settle(Disposition::Accept);
    }

    pub fn release(self) {
        self.settle(Disposition::Release);
    }

    pub fn reject(self, reason: impl Into<String>) {
        self.settle(Disposition::Reject {
            reason: reason.into(),
        });
    }

    pub fn settle(mut self, disposition: Disposition) {
        self.report(disposition, false);
    }

    fn report(&mut self, disposition: Disposition, implicit: bool) {
        if let Some(sink) = self.sink.take() {
            sink.deliver(Ack {
                record: self.record.clone(),
                disposition,
                implicit,
            });
        }
    }
}

impl Drop for AckHandle {
    fn drop(&mut self) {
        self.report(Disposition::Release, true);
    }
}

impl fmt::Debug for AckHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckHandle")
            .field("record", &self.record)
            .field("settled", &self.sink.is_none())
            .finish()
    }
}

/// A shared buffer of acknowledgements that the acker drains, and that knows how many
/// handles it issued are still unsettled (so a batch counts as done only when that is zero).
#[derive(Clone, Default)]
pub struct AckCollector {
    inner: Arc<CollectorState>,
}

#[derive(Default)]
struct CollectorState {
    state: Mutex<Collected>,
}

#[derive(Default)]
struct Collected {
    acks: Vec<Ack>,
    outstanding: usize,
}

impl CollectorState {
    /// A poisoned lock only means another thread panicked while pushing; the data (a Vec and
    /// a counter) is still consistent, and losing acks would be worse than using it.
    fn lock(&self) -> std::sync::MutexGuard<'_, Collected> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl AckSink for CollectorState {
    fn deliver(&self, ack: Ack) {
        let mut state = self.lock();
        state.outstanding = state.outstanding.saturating_sub(1);
        state.acks.push(ack);
    }
}

impl AckCollector {
    pub fn new() -> Self {
        AckCollector::default()
    }

    /// Issues a handle for `record` whose verdict lands in this collector.
    pub fn handle(&self, record: RecordCoordinates) -> AckHandle {
        self.inner.lock().outstanding += 1;
        AckHandle::new(record, self.inner.clone() as Arc<dyn AckSink>)
    }

    /// Takes every acknowledgement reported so far, in the order they arrived.
    pub fn drain(&self) -> Vec<Ack> {
        std::mem::take(&mut self.inner.lock().acks)
    }

    /// Handles issued and not yet settled or dropped.
    pub fn outstanding(&self) -> usize {
        self.inner.lock().outstanding
    }
}

impl fmt::Debug for AckCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("AckCollector")
            .field("pending_acks", &state.acks.len())
            .field("outstanding", &state.outstanding)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: i64) -> RecordCoordinates {
        RecordCoordinates::new("orders", 0, offset)
    }

    #[test]
    fn a_handle_dropped_without_a_verdict_releases_its_record() {
        let collector = AckCollector::new();
        drop(collector.handle(at(7)));
        assert_eq!(
            collector.drain(),
            vec![Ack {
                record: at(7),
                disposition: Disposition::Release,
                implicit: true,
            }]
        );
    }

    #[test]
    fn explicit_verdicts_are_reported_once_and_not_again_on_drop() {
        let collector = AckCollector::new();
        collector.handle(at(1)).accept();
        collector.handle(at(2)).reject("bad json");
        collector.handle(at(3)).release();
        let acks = collector.drain();
        assert_eq!(acks.len(), 3);
        assert_eq!(acks[0].disposition, Disposition::Accept);
        assert_eq!(
            acks[1].disposition,
            Disposition::Reject {
                reason: "bad json".into()
            }
        );
        assert_eq!(acks[2].disposition, Disposition::Release);
        assert!(acks.iter().all(|a| !a.implicit));
        assert!(collector.drain().is_empty());
    }

    #[test]
    fn handles_dropped_in_a_panicking_thread_still_release() {
        let collector = AckCollector::new();
        let handle = collector.handle(at(9));
        let result = std::thread::spawn(move || {
            let _owned = handle;
            panic!("sink crashed mid-batch");
        })
        .join();
        assert!(result.is_err());
        let acks = collector.drain();
        assert_eq!(acks.len(), 1);
        assert_eq!(acks[0].disposition, Disposition::Release);
        assert!(acks[0].implicit);
    }

    #[test]
    fn outstanding_counts_handles_until_they_settle_or_drop() {
        let collector = AckCollector::new();
        let a = collector.handle(at(1));
        let b = collector.handle(at(2));
        assert_eq!(collector.outstanding(), 2);
        a.accept();
        assert_eq!(collector.outstanding(), 1);
        drop(b);
        assert_eq!(collector.outstanding(), 0);
    }

    #[test]
    fn a_channel_receives_verdicts_and_drop_releases() {
        let (tx, rx) = std::sync::mpsc::channel::<Ack>();
        let sink: Arc<dyn AckSink> = Arc::new(tx);
        AckHandle::new(at(1), sink.clone()).accept();
        drop(AckHandle::new(at(2), sink));
        let got: Vec<_> = rx
            .iter()
            .map(|a| (a.record.offset, a.disposition))
            .collect();
        assert_eq!(
            got,
            vec![(1, Disposition::Accept), (2, Disposition::Release)]
        );
    }
}
