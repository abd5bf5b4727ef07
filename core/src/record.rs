//! Records as they arrive from Kafka ([`RawRecord`]) and as sinks see them ([`SinkRecord`]).
//!
//! A raw record holds bytes; the key and value converters turn it into a sink record with
//! Connect values and schemas, and the transform chain rewrites that. Neither type carries an
//! ack handle: a transform that filters a record must not release it, so the runtime keeps
//! one [`BatchAck`](crate::ack::BatchAck) per batch beside the records instead.

use std::fmt;
use std::time::Instant;

use bytes::Bytes;

use crate::data::Value;
use crate::schema::{Schema, SchemaRef};
use crate::topic::Topic;

/// A topic and partition, the unit of assignment in classic mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Where a record was read: what a share-group acknowledgement or an offset commit names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordCoordinates {
    pub topic: Topic,
    pub partition: i32,
    pub offset: i64,
}

impl RecordCoordinates {
    pub fn new(topic: impl Into<Topic>, partition: i32, offset: i64) -> Self {
        RecordCoordinates {
            topic: topic.into(),
            partition,
            offset,
        }
    }

    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition::new(self.topic.as_str(), self.partition)
    }
}

impl fmt::Display for RecordCoordinates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}@{}", self.topic, self.partition, self.offset)
    }
}

/// How the broker stamped the record's timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimestampType {
    #[default]
    NoTimestamp,
    CreateTime,
    LogAppendTime,
}

/// A record as the consumer hands it over: bytes not yet converted.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecord {
    pub topic: Topic,
    pub partition: i32,
    pub offset: i64,
    /// `None` is a null key.
    pub key: Option<Bytes>,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Header keys may repeat and header values may be null, as on the wire.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Milliseconds since the epoch.
    pub timestamp: Option<i64>,
    pub timestamp_type: TimestampType,
    /// How often the broker delivered this record (share groups, starting at 1); `None` in
    /// classic mode, where the broker does not count.
    pub delivery_count: Option<u16>,
    /// When the share group's acquisition lock on this delivery runs out (the time the fetch
    /// response arrived plus the lock duration it announced); `None` in classic mode. Work on
    /// the record that finishes after it may race with a redelivery to another member.
    pub lock_deadline: Option<Instant>,
}

impl RawRecord {
    /// A record at the given coordinates with null key and value and nothing else; fill in
    /// the fields that matter.
    pub fn new(topic: impl Into<Topic>, partition: i32, offset: i64) -> Self {
        RawRecord {
            topic: topic.into(),
            partition,
            offset,
            key: None,
            value: None,
            headers: Vec::new(),
            timestamp: None,
            timestamp_type: TimestampType::NoTimestamp,
            delivery_count: None,
            lock_deadline: None,
        }
    }

    pub fn coordinates(&self) -> RecordCoordinates {
        RecordCoordinates::new(self.topic.clone(), self.partition, self.offset)
    }
}

/// One header after conversion. Raw header bytes become `Value::Bytes` with no schema, so a
/// sink that re-serializes them writes the bytes it read.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub key: String,
    pub schema: Option<Schema>,
    pub value: Value,
}

impl Header {
    pub fn new(key: impl Into<String>, schema: Option<Schema>, value: Value) -> Self {
        Header {
            key: key.into(),
            schema,
            value,
        }
    }
}

/// A record as a sink task receives it: converted and transformed.
///
/// The schemas are shared (`Arc`): converters hand every record of a kind the same one, and a
/// transform that changes a schema makes a new one. Sharing keeps the record small, and it is
/// moved through every stage of the pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkRecord {
    /// Topic after transforms (`RegexRouter` may rename it); see `original` for where it was read.
    pub topic: Topic,
    pub partition: i32,
    pub offset: i64,
    pub key_schema: Option<SchemaRef>,
    pub key: Value,
    pub value_schema: Option<SchemaRef>,
    pub value: Value,
    pub headers: Vec<Header>,
    pub timestamp: Option<i64>,
    pub timestamp_type: TimestampType,
    pub delivery_count: Option<u16>,
    /// The acquisition lock's deadline (share mode), as on [`RawRecord::lock_deadline`].
    pub lock_deadline: Option<Instant>,
    /// Where the record was read; transforms never change it, so acks and offsets use it
    /// (Connect's `originalTopic()` and friends, KIP-793).
    pub original: RecordCoordinates,
}

impl SinkRecord {
    /// A schemaless record with a null key, for building records by hand (tests, generators).
    pub fn new(topic: impl Into<Topic>, partition: i32, offset: i64, value: Value) -> Self {
        let topic = topic.into();
        SinkRecord {
            original: RecordCoordinates::new(topic.clone(), partition, offset),
            topic,
            partition,
            offset,
            key_schema: None,
            key: Value::Null,
            value_schema: None,
            value,
            headers: Vec::new(),
            timestamp: None,
            timestamp_type: TimestampType::NoTimestamp,
            delivery_count: None,
            lock_deadline: None,
        }
    }

    /// The first header called `key`.
    pub fn header(&self, key: &str) -> Option<&Header> {
        self.headers.iter().find(|h| h.key == key)
    }

    /// A null value: Kafka's delete marker for compacted topics.
    pub fn is_tombstone(&self) -> bool {
        self.value.is_null()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sink_record_remembers_where_it_was_read() {
        let mut record = SinkRecord::new("orders", 3, 42, "v".into());
        record.topic = "renamed".into();
        assert_eq!(record.original, RecordCoordinates::new("orders", 3, 42));
        assert_eq!(record.original.to_string(), "orders-3@42");
    }

    #[test]
    fn null_value_is_a_tombstone() {
        assert!(SinkRecord::new("t", 0, 0, Value::Null).is_tombstone());
        assert!(!SinkRecord::new("t", 0, 0, "x".into()).is_tombstone());
    }
}
