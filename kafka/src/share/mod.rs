//! The KIP-932 share-group consumer, v1 of the share APIs.
//!
//! - [`membership`]: ShareGroupHeartbeat — join, heartbeat, assignment, leave.
//! - `session`: the share-session epoch bookkeeping per broker.
//! - `fetch`: one task per broker that runs ShareFetch/ShareAcknowledge and turns responses
//!   into deliverable records.
//! - [`ack`]: what we hold, what the application acknowledged, and how acks are encoded.
//! - [`consumer`]: [`ShareConsumer`], the public face tying these together.
//!
//! The rules these follow are in `shared/briefs/share-protocol.md`; comments cite its sections.

pub mod ack;
pub mod consumer;
pub(crate) mod fetch;
mod fetched;
mod held;
pub mod membership;
mod session;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use thiserror::Error;
use uuid::Uuid;

pub use ack::{
    AcknowledgeType, AcknowledgementBatch, PartitionAcknowledgements, ShareGroupMetadata,
    TransactionAcknowledgements, TransactionOutcome,
};
pub use consumer::{LockRenewal, ShareConsumer, ShareConsumerConfig};

use crate::cluster::ClusterError;
use crate::connection::ConnectionError;

/// One record handed to the application. It stays *held* (acquired by this member) until it is
/// acknowledged or its lock deadline passes.
#[derive(Debug, Clone)]
pub struct ShareRecord {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Milliseconds since the epoch, as the producer or the log stamped it.
    pub timestamp: i64,
    /// 1 on first delivery; higher when the record was released or its lock expired before.
    pub delivery_count: i16,
    /// When the broker's acquisition lock on this record runs out.
    pub lock_deadline: Instant,
}

/// Per-partition result of acknowledgements that could not be applied. Every acknowledgement
/// ends as `Ok` or one of these in [`ShareConsumer::commit_sync`]'s answer; none are dropped.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum AckError {
    #[error("broker {broker} refused the acknowledgements for {topic}-{partition}: error {code} ({name})")]
    Refused {
        broker: i32,
        topic: String,
        partition: i32,
        code: i16,
        name: String,
    },
    #[error("the share session on broker {broker} was lost ({reason}), so the acknowledgements for {topic}-{partition} were not applied; the broker will redeliver those records")]
    SessionLost {
        broker: i32,
        topic: String,
        partition: i32,
        reason: String,
    },
    #[error("the leader of {topic}-{partition} moved away from broker {from}, so the acknowledgements for records acquired there were not applied; the records will be redelivered")]
    LeaderMoved {
        from: i32,
        topic: String,
        partition: i32,
    },
    #[error("acknowledgements for {topic}-{partition} were not confirmed before commit_sync timed out after {after:?}; their result will be reported by a later commit_sync")]
    Timeout {
        topic: String,
        partition: i32,
        after: Duration,
    },
}

/// Errors the share consumer reports to the application.
#[derive(Debug, Error)]
pub enum ShareError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    #[error("record {topic}-{partition}@{offset} is not held by this consumer (never delivered, already acknowledged, or its session or leader was lost)")]
    NotHeld {
        topic: String,
        partition: i32,
        offset: i64,
    },
    #[error("record {topic}-{partition}@{offset} was already acknowledged")]
    AlreadyAcknowledged {
        topic: String,
        partition: i32,
        offset: i64,
    },
    #[error("share group '{group}': heartbeat failed with error {code} ({name}){message}; the consumer cannot continue")]
    Fatal {
        group: String,
        code: i16,
        name: String,
        message: String,
    },
    #[error("fetching {topic}-{partition} from broker {broker} failed with error {code} ({name})")]
    Partition {
        broker: i32,
        topic: String,
        partition: i32,
        code: i16,
        name: String,
    },
    #[error("share group '{group}' may not fetch {topic} from broker {broker}: error {code} ({name}); grant the consumer's principal the ACL {acl}")]
    NotAuthorized {
        broker: i32,
        group: String,
        topic: String,
        code: i16,
        name: String,
        acl: String,
    },
    #[error("record batch of {topic}-{partition} starting near offset {offset} cannot be decoded: {reason}; its acquired records {first}..={last} were {outcome}")]
    CorruptRecords {
        topic: String,
        partition: i32,
        offset: i64,
        first: i64,
        last: i64,
        reason: String,
        /// What became of them: rejected on a CRC failure, released otherwise.
        outcome: &'static str,
    },
    #[error(
        "record {topic}-{partition}@{offset} cannot be acknowledged in a transaction: {reason}"
    )]
    TransactionAck {
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
    #[error("topic '{topic}' has no known topic id, so its acknowledgements cannot go into a transaction; nothing was taken, try again after the next metadata refresh")]
    UnknownTopicId { topic: String },
    #[error("invalid share consumer config: {0}")]
    Config(String),
    #[error("the share consumer is closed")]
    Closed,
}

impl ShareError {
    /// Whether the worker's egress policy refused a broker: no retry helps.
    pub fn is_egress_refusal(&self) -> bool {
        match self {
            ShareError::Cluster(e) => e.is_egress_refusal(),
            ShareError::Connection(e) => e.is_egress_refusal(),
            _ => false,
        }
    }
}

/// Result of one [`ShareSource::commit_sync`]: per (topic, partition), whether its
/// acknowledgements were applied.
pub type CommitResult = HashMap<(String, i32), Result<(), AckError>>;

/// What the pipeline needs from a share-group consumer. [`ShareConsumer`] is the native
/// implementation; a librdkafka-based one can replace it behind this trait (DESIGN.md).
pub trait ShareSource: Send {
    /// Records acquired for this member; an empty vector when `timeout` passed without any.
    fn poll(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<ShareRecord>, ShareError>> + Send;
    /// Settle one held record. Sent with the next request to its leader.
    fn acknowledge(&self, record: &ShareRecord, kind: AcknowledgeType) -> Result<(), ShareError>;
    /// Send every acknowledgement made so far and report the per-partition outcome.
    fn commit_sync(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<CommitResult, ShareError>> + Send;
    /// Send pending acknowledgements, close the share sessions and leave the group.
    fn close(self) -> impl Future<Output = Result<CommitResult, ShareError>> + Send;
}

/// A partition as the share protocol names it: by topic id; the name is kept for people.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tp {
    pub topic: Arc<str>,
    pub id: Uuid,
    pub partition: i32,
}

impl std::fmt::Display for Tp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}
