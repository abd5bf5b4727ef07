//! The draft TxnShareAcknowledge v0 request and response (KIP-1289).
//!
//! The layout follows `shared/briefs/share-protocol.md` §7.3, which matches the draft schema
//! with api key 94 (apache/kafka) and the fork's with key 95: per-batch `AcknowledgeTypes`
//! array, per-partition `ErrorMessage` in the response. Version 0 is flexible: compact strings
//! and arrays, a tagged-field section closing every struct, request header v2 and response
//! header v1. The api key is not part of the body; the drafts disagree on it (93, 94, 95), so
//! the caller passes it to the connection (see [`super::settings`]).
//!
//! Everything a request carries is checked before it is encoded: a transaction may only
//! ACCEPT (1) or REJECT (3), batches must be non-empty, in order, non-overlapping, and carry
//! one type or one per offset.

use std::collections::HashSet;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::Encodable;
use spillway_kafka::share::{ShareGroupMetadata, TransactionAcknowledgements};
use thiserror::Error;
use uuid::Uuid;

/// The only version any draft defines.
pub const VERSION: i16 = 0;

/// The drafts disagree on two fields besides the api key; this picks which layout to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftLayout {
    /// `AcknowledgeTypes: []int8` per batch (one type, or one per offset), and an
    /// `ErrorMessage` per partition result: the brief's §7.3, the apache/kafka snapshot with
    /// key 94 and the author's fork (key 95).
    #[default]
    TypesArray,
    /// A single `AcknowledgeType: int8` per batch, and no `ErrorMessage` in partition results:
    /// the apache/kafka snapshot that declares key 93. Batches with mixed types are sent as one
    /// batch per run of equal types.
    SingleType,
}

/// Wire values of the acknowledge types a transaction may carry.
const ACCEPT: i8 = 1;
const REJECT: i8 = 3;

/// A request that must not be sent, or a response that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("TxnShareAcknowledge carries no acknowledgements; there is nothing to add to the transaction")]
    NoAcknowledgements,
    #[error("TxnShareAcknowledge field {field} is empty; it must name the {what}")]
    EmptyField {
        field: &'static str,
        what: &'static str,
    },
    #[error("producer id {producer_id} / epoch {producer_epoch} is not a transactional producer's identity; both must be >= 0 (did init_transactions run?)")]
    BadProducer {
        producer_id: i64,
        producer_epoch: i16,
    },
    #[error("partition {partition} has a nil topic id; the share protocol names topics by id, so refresh metadata and take the acknowledgements again")]
    NilTopicId { partition: i32 },
    #[error("topic {topic_id} partition {partition} is listed twice; list each partition once with all its batches")]
    DuplicatePartition { topic_id: Uuid, partition: i32 },
    #[error("topic {topic_id} partition {partition} has no acknowledgement batches; leave the partition out instead")]
    EmptyBatches { topic_id: Uuid, partition: i32 },
    #[error("topic {topic_id} partition {partition}: batch {first}..={last} is not a valid offset range (need 0 <= first <= last)")]
    BadRange {
        topic_id: Uuid,
        partition: i32,
        first: i64,
        last: i64,
    },
    #[error("topic {topic_id} partition {partition}: batch {first}..={last} starts at or before the previous batch's last offset {previous_last}; batches must be sorted and must not overlap")]
    Overlap {
        topic_id: Uuid,
        partition: i32,
        first: i64,
        last: i64,
        previous_last: i64,
    },
    #[error("topic {topic_id} partition {partition}: batch {first}..={last} has {got} acknowledge types; expected 1 (one type for the range) or {expected} (one per offset)")]
    TypesLength {
        topic_id: Uuid,
        partition: i32,
        first: i64,
        last: i64,
        expected: i64,
        got: usize,
    },
    #[error("topic {topic_id} partition {partition}: offset {offset} has acknowledge type {value} ({name}), which a transaction cannot carry; only ACCEPT (1) and REJECT (3) can{hint}")]
    TypeNotAllowed {
        topic_id: Uuid,
        partition: i32,
        offset: i64,
        value: i8,
        name: &'static str,
        hint: &'static str,
    },
    #[error("cannot encode the TxnShareAcknowledge v0 request: {0}")]
    Encode(String),
    #[error("cannot decode the TxnShareAcknowledge v0 response: {0}")]
    Decode(String),
}

fn type_name(value: i8) -> (&'static str, &'static str) {
    match value {
        0 => ("GAP", "; GAPs go out through ShareFetch/ShareAcknowledge"),
        2 => (
            "RELEASE",
            "; release the record with ShareConsumer::acknowledge, outside the transaction",
        ),
        4 => ("RENEW", "; renew locks through ShareAcknowledge"),
        _ => ("unknown", ""),
    }
}

/// TxnShareAcknowledge v0 request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnShareAcknowledgeRequest {
    /// Nullable in the schema; we always send the producer's transactional id.
    pub transactional_id: Option<String>,
    pub group_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub member_id: String,
    /// Lets the broker fence a member that was removed from the group.
    pub member_epoch: i32,
    pub topics: Vec<TopicAcknowledgements>,
    /// Which draft's layout the batches are encoded in (not a field on the wire).
    pub layout: DraftLayout,
}

/// `Topics[]` of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicAcknowledgements {
    pub topic_id: Uuid,
    pub partitions: Vec<PartitionBatches>,
}

/// `Topics[].Partitions[]` of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionBatches {
    pub partition_index: i32,
    pub batches: Vec<Batch>,
}

/// `AcknowledgementBatches[]`: an inclusive offset range and one type for all of it or one per
/// offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub acknowledge_types: Vec<i8>,
}

impl TxnShareAcknowledgeRequest {
    /// The request that adds `acks` (taken from a share consumer) to the transaction of the
    /// producer `transactional_id` with `producer_id`/`producer_epoch`. Partitions of one
    /// topic id are grouped, in the order they come. Checked with
    /// [`TxnShareAcknowledgeRequest::validate`].
    pub fn new(
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        member: &ShareGroupMetadata,
        acks: &TransactionAcknowledgements,
    ) -> Result<TxnShareAcknowledgeRequest, WireError> {
        let mut topics: Vec<TopicAcknowledgements> = Vec::new();
        for p in &acks.partitions {
            let partition = PartitionBatches {
                partition_index: p.partition,
                batches: p
                    .batches
                    .iter()
                    .map(|b| Batch {
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        acknowledge_types: b.types.clone(),
                    })
                    .collect(),
            };
            match topics.iter_mut().find(|t| t.topic_id == p.topic_id) {
                Some(topic) => topic.partitions.push(partition),
                None => topics.push(TopicAcknowledgements {
                    topic_id: p.topic_id,
                    partitions: vec![partition],
                }),
            }
        }
        let request = TxnShareAcknowledgeRequest {
            transactional_id: Some(transactional_id.to_string()),
            group_id: member.group_id.clone(),
            producer_id,
            producer_epoch,
            member_id: member.member_id.clone(),
            member_epoch: member.member_epoch,
            topics,
            layout: DraftLayout::default(),
        };
        request.validate()?;
        Ok(request)
    }

    /// The same request in another draft's layout.
    pub fn with_layout(mut self, layout: DraftLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Everything the draft requires of a request, checked before anything is sent.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.transactional_id.as_deref() == Some("") {
            return Err(WireError::EmptyField {
                field: "TransactionalId",
                what: "producer's transactional id",
            });
        }
        if self.group_id.is_empty() {
            return Err(WireError::EmptyField {
                field: "GroupId",
                what: "share group",
            });
        }
        if self.member_id.is_empty() {
            return Err(WireError::EmptyField {
                field: "MemberId",
                what: "share group member",
            });
        }
        if self.producer_id < 0 || self.producer_epoch < 0 {
            return Err(WireError::BadProducer {
                producer_id: self.producer_id,
                producer_epoch: self.producer_epoch,
            });
        }
        if self.topics.iter().all(|t| t.partitions.is_empty()) {
            return Err(WireError::NoAcknowledgements);
        }
        let mut seen = HashSet::new();
        for topic in &self.topics {
            let topic_id = topic.topic_id;
            for p in &topic.partitions {
                let partition = p.partition_index;
                if topic_id.is_nil() {
                    return Err(WireError::NilTopicId { partition });
                }
                if !seen.insert((topic_id, partition)) {
                    return Err(WireError::DuplicatePartition {
                        topic_id,
                        partition,
                    });
                }
                if p.batches.is_empty() {
                    return Err(WireError::EmptyBatches {
                        topic_id,
                        partition,
                    });
                }
                let mut previous_last: Option<i64> = None;
                for b in &p.batches {
                    let (first, last) = (b.first_offset, b.last_offset);
                    if first < 0 || last < first {
                        return Err(WireError::BadRange {
                            topic_id,
                            partition,
                            first,
                            last,
                        });
                    }
                    if let Some(previous_last) = previous_last.filter(|&l| first <= l) {
                        return Err(WireError::Overlap {
                            topic_id,
                            partition,
                            first,
                            last,
                            previous_last,
                        });
                    }
                    previous_last = Some(last);
                    let expected = last - first + 1;
                    let got = b.acknowledge_types.len();
                    if got != 1 && got as i64 != expected {
                        return Err(WireError::TypesLength {
                            topic_id,
                            partition,
                            first,
                            last,
                            expected,
                            got,
                        });
                    }
                    for (i, &value) in b.acknowledge_types.iter().enumerate() {
                        if value != ACCEPT && value != REJECT {
                            let (name, hint) = type_name(value);
                            return Err(WireError::TypeNotAllowed {
                                topic_id,
                                partition,
                                offset: first + i as i64,
                                value,
                                name,
                                hint,
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The body bytes, checked first.
    pub fn to_bytes(&self) -> Result<Bytes, WireError> {
        self.validate()?;
        let mut buf = BytesMut::new();
        self.encode(&mut buf, VERSION)
            .map_err(|e| WireError::Encode(e.to_string()))?;
        Ok(buf.freeze())
    }
}

// `kafka-protocol` 0.18 keeps its field encoders (`types::CompactString` and friends) behind
// crate-private traits, so only whole generated messages can use them. The pieces here are the
// protocol's primitives on top of `bytes` (fixed-width big-endian integers) and prost's
// unsigned LEB128 varints, which are exactly Kafka's UNSIGNED_VARINT.

/// Kafka's UNSIGNED_VARINT (compact lengths, tagged-field counts).
fn put_uvarint<B: BufMut>(buf: &mut B, value: u32) {
    prost::encoding::encode_varint(u64::from(value), buf);
}

/// COMPACT_ARRAY / COMPACT_STRING length prefix: the length plus one (zero means null).
fn put_compact_len<B: BufMut>(buf: &mut B, len: usize) -> anyhow::Result<()> {
    let len = u32::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(1))
        .ok_or_else(|| anyhow::anyhow!("{len} elements do not fit a compact length"))?;
    put_uvarint(buf, len);
    Ok(())
}

/// COMPACT_NULLABLE_STRING.
fn put_compact_nullable_string<B: BufMut>(buf: &mut B, value: Option<&str>) -> anyhow::Result<()> {
    match value {
        None => put_uvarint(buf, 0),
        Some(s) => {
            put_compact_len(buf, s.len())?;
            buf.put_slice(s.as_bytes());
        }
    }
    Ok(())
}

/// COMPACT_STRING.
fn put_compact_string<B: BufMut>(buf: &mut B, value: &str) -> anyhow::Result<()> {
    put_compact_nullable_string(buf, Some(value))
}

/// COMPACT_ARRAY of structs, each written by `put`.
fn put_compact_array<B: BufMut, T>(
    buf: &mut B,
    items: &[T],
    put: impl Fn(&mut B, &T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    put_compact_len(buf, items.len())?;
    items.iter().try_for_each(|item| put(buf, item))
}

/// An empty tagged-field section: we set no tagged fields.
fn put_no_tagged_fields<B: BufMut>(buf: &mut B) {
    put_uvarint(buf, 0);
}

fn put_request<B: BufMut>(buf: &mut B, r: &TxnShareAcknowledgeRequest) -> anyhow::Result<()> {
    put_compact_nullable_string(buf, r.transactional_id.as_deref())?;
    put_compact_string(buf, &r.group_id)?;
    buf.put_i64(r.producer_id);
    buf.put_i16(r.producer_epoch);
    put_compact_string(buf, &r.member_id)?;
    buf.put_i32(r.member_epoch);
    put_compact_array(buf, &r.topics, |buf, topic| {
        buf.put_slice(topic.topic_id.as_bytes());
        put_compact_array(buf, &topic.partitions, |buf, partition| {
            buf.put_i32(partition.partition_index);
            match r.layout {
                DraftLayout::TypesArray => {
                    put_compact_array(buf, &partition.batches, |buf, batch| {
                        buf.put_i64(batch.first_offset);
                        buf.put_i64(batch.last_offset);
                        put_compact_len(buf, batch.acknowledge_types.len())?;
                        batch.acknowledge_types.iter().for_each(|t| buf.put_i8(*t));
                        put_no_tagged_fields(buf);
                        Ok(())
                    })?;
                }
                DraftLayout::SingleType => {
                    let runs: Vec<(i64, i64, i8)> =
                        partition.batches.iter().flat_map(uniform_runs).collect();
                    put_compact_array(buf, &runs, |buf, &(first, last, kind)| {
                        buf.put_i64(first);
                        buf.put_i64(last);
                        buf.put_i8(kind);
                        put_no_tagged_fields(buf);
                        Ok(())
                    })?;
                }
            }
            put_no_tagged_fields(buf);
            Ok(())
        })?;
        put_no_tagged_fields(buf);
        Ok(())
    })?;
    put_no_tagged_fields(buf);
    Ok(())
}

/// A batch as runs of one type each: (first, last, type).
fn uniform_runs(batch: &Batch) -> Vec<(i64, i64, i8)> {
    let types = &batch.acknowledge_types;
    if types.len() <= 1 {
        return types
            .first()
            .map(|&t| (batch.first_offset, batch.last_offset, t))
            .into_iter()
            .collect();
    }
    let mut runs: Vec<(i64, i64, i8)> = Vec::new();
    for (offset, &kind) in (batch.first_offset..).zip(types) {
        match runs.last_mut() {
            Some(run) if run.2 == kind && run.1 + 1 == offset => run.1 = offset,
            _ => runs.push((offset, offset, kind)),
        }
    }
    runs
}

fn check_version(version: i16) -> anyhow::Result<()> {
    anyhow::ensure!(
        version == VERSION,
        "TxnShareAcknowledge has only version 0, not {version}"
    );
    Ok(())
}

/// So the request can go through [`spillway_kafka::connection::Connection::request_raw`].
impl Encodable for TxnShareAcknowledgeRequest {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        check_version(version)?;
        put_request(buf, self)
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        check_version(version)?;
        let mut counted = BytesMut::new();
        put_request(&mut counted, self)?;
        Ok(counted.len())
    }
}

/// TxnShareAcknowledge v0 response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnShareAcknowledgeResponse {
    pub throttle_time_ms: i32,
    /// Top-level error: nothing was added to the transaction.
    pub error_code: i16,
    pub responses: Vec<TopicResult>,
}

/// `Responses[]` of the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicResult {
    pub topic_id: Uuid,
    pub partitions: Vec<PartitionResult>,
}

/// `Responses[].Partitions[]` of the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResult {
    pub partition_index: i32,
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// Reads the protocol's primitives off a response body, failing (never panicking) when the
/// body ends early.
struct Reader {
    buf: Bytes,
}

impl Reader {
    fn need(&self, n: usize, what: &str) -> Result<(), String> {
        if self.buf.remaining() < n {
            return Err(format!(
                "{what} needs {n} bytes, {} left",
                self.buf.remaining()
            ));
        }
        Ok(())
    }

    fn i16(&mut self, what: &str) -> Result<i16, String> {
        self.need(2, what)?;
        Ok(self.buf.get_i16())
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        self.need(4, what)?;
        Ok(self.buf.get_i32())
    }

    fn uuid(&mut self, what: &str) -> Result<Uuid, String> {
        self.need(16, what)?;
        let mut bytes = [0u8; 16];
        self.buf.copy_to_slice(&mut bytes);
        Ok(Uuid::from_bytes(bytes))
    }

    fn uvarint(&mut self, what: &str) -> Result<u32, String> {
        let value = prost::encoding::decode_varint(&mut self.buf)
            .map_err(|e| format!("{what}: bad unsigned varint ({e})"))?;
        u32::try_from(value).map_err(|_| format!("{what}: varint {value} exceeds 32 bits"))
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<Bytes, String> {
        self.need(n, what)?;
        Ok(self.buf.split_to(n))
    }

    /// COMPACT_ARRAY length; null is refused (no array in v0 is nullable).
    fn compact_len(&mut self, what: &str) -> Result<usize, String> {
        match self.uvarint(what)? {
            0 => Err(format!("{what} is null")),
            n => Ok(n as usize - 1),
        }
    }

    fn compact_nullable_string(&mut self, what: &str) -> Result<Option<String>, String> {
        match self.uvarint(what)? {
            0 => Ok(None),
            n => {
                let bytes = self.bytes(n as usize - 1, what)?;
                String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|e| format!("{what} is not UTF-8: {e}"))
            }
        }
    }

    /// Skip a tagged-field section: v0 defines no tagged fields, and a later draft may add
    /// some we do not know.
    fn tagged_fields(&mut self, what: &str) -> Result<(), String> {
        let count = self.uvarint(what)?;
        for _ in 0..count {
            let _tag = self.uvarint(what)?;
            let size = self.uvarint(what)?;
            self.bytes(size as usize, what)?;
        }
        Ok(())
    }

    fn array<T>(
        &mut self,
        what: &str,
        mut item: impl FnMut(&mut Reader) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let n = self.compact_len(what)?;
        // Each element takes at least one byte, so a length beyond the rest is a lie.
        self.need(n, what)?;
        (0..n).map(|_| item(self)).collect()
    }
}

impl TxnShareAcknowledgeResponse {
    /// Decode a response body (the response header already stripped). Bytes after the body
    /// are ignored, as newer brokers may append fields.
    pub fn from_bytes(
        body: Bytes,
        layout: DraftLayout,
    ) -> Result<TxnShareAcknowledgeResponse, WireError> {
        let mut r = Reader { buf: body };
        let decode = |r: &mut Reader| -> Result<TxnShareAcknowledgeResponse, String> {
            let throttle_time_ms = r.i32("ThrottleTimeMs")?;
            let error_code = r.i16("ErrorCode")?;
            let responses = r.array("Responses", |r| {
                let topic_id = r.uuid("TopicId")?;
                let partitions = r.array("Partitions", |r| {
                    let partition_index = r.i32("PartitionIndex")?;
                    let error_code = r.i16("ErrorCode")?;
                    let error_message = match layout {
                        DraftLayout::TypesArray => r.compact_nullable_string("ErrorMessage")?,
                        DraftLayout::SingleType => None,
                    };
                    r.tagged_fields("partition tagged fields")?;
                    Ok(PartitionResult {
                        partition_index,
                        error_code,
                        error_message,
                    })
                })?;
                r.tagged_fields("topic tagged fields")?;
                Ok(TopicResult {
                    topic_id,
                    partitions,
                })
            })?;
            r.tagged_fields("response tagged fields")?;
            Ok(TxnShareAcknowledgeResponse {
                throttle_time_ms,
                error_code,
                responses,
            })
        };
        decode(&mut r).map_err(WireError::Decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_kafka::share::{AcknowledgementBatch, PartitionAcknowledgements};
    use std::sync::Arc;

    const TOPIC_A: Uuid = Uuid::from_bytes([
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e,
        0x1f,
    ]);
    const TOPIC_B: Uuid = Uuid::from_bytes([0xb0; 16]);

    fn member() -> ShareGroupMetadata {
        ShareGroupMetadata {
            group_id: "g".into(),
            member_id: "m1".into(),
            member_epoch: 5,
        }
    }

    fn partition(
        topic_id: Uuid,
        partition: i32,
        batches: &[(i64, i64, &[i8])],
    ) -> PartitionAcknowledgements {
        PartitionAcknowledgements {
            topic: Arc::from("t"),
            topic_id,
            partition,
            batches: batches
                .iter()
                .map(|(first, last, types)| AcknowledgementBatch {
                    first_offset: *first,
                    last_offset: *last,
                    types: types.to_vec(),
                })
                .collect(),
        }
    }

    fn acks(partitions: Vec<PartitionAcknowledgements>) -> TransactionAcknowledgements {
        TransactionAcknowledgements { partitions }
    }

    fn request(partitions: Vec<PartitionAcknowledgements>) -> Result<Bytes, WireError> {
        TxnShareAcknowledgeRequest::new(
            "tx",
            0x0102_0304_0506_0708,
            7,
            &member(),
            &acks(partitions),
        )?
        .to_bytes()
    }

    #[test]
    fn the_request_is_encoded_field_by_field_as_the_draft_schema_says() {
        let body = request(vec![
            partition(TOPIC_A, 0, &[(10, 12, &[1]), (15, 16, &[1, 3])]),
            partition(TOPIC_B, 4, &[(300, 300, &[3])]),
            partition(TOPIC_A, 2, &[(0, 0, &[1])]),
        ])
        .unwrap();
        let mut want: Vec<u8> = Vec::new();
        // TransactionalId: compact nullable string = unsigned varint (length + 1), bytes.
        want.extend([3, b't', b'x']);
        // GroupId: compact string.
        want.extend([2, b'g']);
        // ProducerId: int64, big-endian.
        want.extend([1, 2, 3, 4, 5, 6, 7, 8]);
        // ProducerEpoch: int16.
        want.extend([0, 7]);
        // MemberId: compact string.
        want.extend([3, b'm', b'1']);
        // MemberEpoch: int32.
        want.extend([0, 0, 0, 5]);
        // Topics: compact array = unsigned varint (count + 1). Two topic ids.
        want.push(3);
        //   Topics[0].TopicId: 16 raw bytes.
        want.extend(TOPIC_A.as_bytes());
        //   Topics[0].Partitions: two partitions of TOPIC_A, in the order given.
        want.push(3);
        //     PartitionIndex 0.
        want.extend([0, 0, 0, 0]);
        //     AcknowledgementBatches: two.
        want.push(3);
        //       FirstOffset 10, LastOffset 12.
        want.extend(10i64.to_be_bytes());
        want.extend(12i64.to_be_bytes());
        //       AcknowledgeTypes: compact array of int8, one type (ACCEPT) for the range.
        want.extend([2, 1]);
        //       Batch tagged fields: none.
        want.push(0);
        //       FirstOffset 15, LastOffset 16, types one per offset: ACCEPT, REJECT.
        want.extend(15i64.to_be_bytes());
        want.extend(16i64.to_be_bytes());
        want.extend([3, 1, 3]);
        want.push(0);
        //     Partition tagged fields.
        want.push(0);
        //     PartitionIndex 2: one batch 0..=0 ACCEPT.
        want.extend([0, 0, 0, 2]);
        want.push(2);
        want.extend(0i64.to_be_bytes());
        want.extend(0i64.to_be_bytes());
        want.extend([2, 1]);
        want.push(0);
        want.push(0);
        //   Topic tagged fields.
        want.push(0);
        //   Topics[1]: TOPIC_B, partition 4, one batch 300..=300 REJECT.
        want.extend(TOPIC_B.as_bytes());
        want.push(2);
        want.extend([0, 0, 0, 4]);
        want.push(2);
        want.extend(300i64.to_be_bytes());
        want.extend(300i64.to_be_bytes());
        want.extend([2, 3]);
        want.push(0);
        want.push(0);
        want.push(0);
        // Request tagged fields.
        want.push(0);
        assert_eq!(body.as_ref(), want.as_slice());
        let parsed = TxnShareAcknowledgeRequest::new("tx", 0x0102_0304_0506_0708, 7, &member(), &{
            acks(vec![partition(TOPIC_A, 0, &[(10, 12, &[1])])])
        })
        .unwrap();
        assert_eq!(
            parsed.compute_size(VERSION).unwrap(),
            parsed.to_bytes().unwrap().len(),
            "compute_size agrees with the encoding"
        );
    }

    #[test]
    fn a_null_transactional_id_is_encoded_as_a_zero_length_prefix() {
        let mut r = TxnShareAcknowledgeRequest::new(
            "tx",
            1,
            0,
            &member(),
            &acks(vec![partition(TOPIC_A, 0, &[(1, 1, &[1])])]),
        )
        .unwrap();
        r.transactional_id = None;
        let body = r.to_bytes().unwrap();
        // Compact nullable string: 0 means null; GroupId follows at once.
        assert_eq!(&body[..3], &[0, 2, b'g']);
        assert_eq!(body.len(), r.compute_size(VERSION).unwrap());
    }

    #[test]
    fn lengths_of_128_and_more_use_multi_byte_varints() {
        // 200 per-offset types: compact array length 201 = 0xC9 0x01 as an unsigned varint.
        let types: Vec<i8> = (0..200).map(|i| if i % 2 == 0 { 1 } else { 3 }).collect();
        let body = request(vec![partition(TOPIC_A, 0, &[(1000, 1199, &types)])]).unwrap();
        let batch_start = 3 + 2 + 8 + 2 + 3 + 4 + 1 + 16 + 1 + 4 + 1;
        let types_at = batch_start + 16;
        assert_eq!(&body[types_at..types_at + 2], &[0xC9, 0x01]);
        assert_eq!(&body[types_at + 2..types_at + 4], &[1, 3]);
    }

    #[test]
    fn release_cannot_be_encoded_into_a_transaction() {
        let err = request(vec![partition(TOPIC_A, 3, &[(10, 12, &[1, 2, 1])])]).unwrap_err();
        assert_eq!(
            err,
            WireError::TypeNotAllowed {
                topic_id: TOPIC_A,
                partition: 3,
                offset: 11,
                value: 2,
                name: "RELEASE",
                hint: type_name(2).1,
            }
        );
        assert!(err.to_string().contains(
            "offset 11 has acknowledge type 2 (RELEASE), which a transaction cannot carry"
        ));
        for bad in [0i8, 4, 9, -1] {
            assert!(
                matches!(
                    request(vec![partition(TOPIC_A, 0, &[(1, 1, &[bad])])]),
                    Err(WireError::TypeNotAllowed { value, .. }) if value == bad
                ),
                "type {bad}"
            );
        }
    }

    #[test]
    fn empty_requests_partitions_and_type_arrays_are_refused() {
        assert_eq!(request(vec![]), Err(WireError::NoAcknowledgements));
        assert_eq!(
            request(vec![partition(TOPIC_A, 1, &[])]),
            Err(WireError::EmptyBatches {
                topic_id: TOPIC_A,
                partition: 1
            })
        );
        assert!(matches!(
            request(vec![partition(TOPIC_A, 1, &[(5, 6, &[])])]),
            Err(WireError::TypesLength {
                got: 0,
                expected: 2,
                ..
            })
        ));
    }

    #[test]
    fn a_types_array_must_have_one_entry_or_one_per_offset() {
        let err = request(vec![partition(TOPIC_A, 1, &[(5, 9, &[1, 1])])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "topic {TOPIC_A} partition 1: batch 5..=9 has 2 acknowledge types; expected 1 \
                 (one type for the range) or 5 (one per offset)"
            )
        );
        assert!(request(vec![partition(TOPIC_A, 1, &[(5, 9, &[1, 1, 3, 1, 1])])]).is_ok());
        assert!(request(vec![partition(TOPIC_A, 1, &[(5, 9, &[3])])]).is_ok());
    }

    #[test]
    fn ranges_must_be_valid_sorted_and_disjoint() {
        assert!(matches!(
            request(vec![partition(TOPIC_A, 0, &[(9, 5, &[1])])]),
            Err(WireError::BadRange {
                first: 9,
                last: 5,
                ..
            })
        ));
        assert!(matches!(
            request(vec![partition(TOPIC_A, 0, &[(-1, 5, &[1])])]),
            Err(WireError::BadRange { first: -1, .. })
        ));
        assert!(matches!(
            request(vec![partition(TOPIC_A, 0, &[(1, 5, &[1]), (5, 6, &[1])])]),
            Err(WireError::Overlap {
                previous_last: 5,
                ..
            })
        ));
        assert!(matches!(
            request(vec![partition(TOPIC_A, 0, &[(7, 8, &[1]), (1, 2, &[1])])]),
            Err(WireError::Overlap { .. })
        ));
    }

    #[test]
    fn identities_must_be_complete() {
        let one = acks(vec![partition(TOPIC_A, 0, &[(1, 1, &[1])])]);
        let mut m = member();
        m.member_id.clear();
        assert!(matches!(
            TxnShareAcknowledgeRequest::new("tx", 1, 0, &m, &one),
            Err(WireError::EmptyField {
                field: "MemberId",
                ..
            })
        ));
        let mut m = member();
        m.group_id.clear();
        assert!(matches!(
            TxnShareAcknowledgeRequest::new("tx", 1, 0, &m, &one),
            Err(WireError::EmptyField {
                field: "GroupId",
                ..
            })
        ));
        assert!(matches!(
            TxnShareAcknowledgeRequest::new("", 1, 0, &member(), &one),
            Err(WireError::EmptyField {
                field: "TransactionalId",
                ..
            })
        ));
        assert!(matches!(
            TxnShareAcknowledgeRequest::new("tx", -1, 0, &member(), &one),
            Err(WireError::BadProducer { .. })
        ));
        assert!(matches!(
            request(vec![partition(Uuid::nil(), 0, &[(1, 1, &[1])])]),
            Err(WireError::NilTopicId { partition: 0 })
        ));
        assert!(matches!(
            request(vec![
                partition(TOPIC_A, 0, &[(1, 1, &[1])]),
                partition(TOPIC_A, 0, &[(5, 5, &[1])])
            ]),
            Err(WireError::DuplicatePartition { partition: 0, .. })
        ));
    }

    /// A response as the draft schema lays it out, built byte by byte.
    fn response_bytes() -> Vec<u8> {
        let mut b: Vec<u8> = Vec::new();
        // ThrottleTimeMs: int32.
        b.extend(25i32.to_be_bytes());
        // ErrorCode: int16.
        b.extend(0i16.to_be_bytes());
        // Responses: compact array, one topic.
        b.push(2);
        //   TopicId.
        b.extend(TOPIC_A.as_bytes());
        //   Partitions: two.
        b.push(3);
        //     PartitionIndex 0, ErrorCode 0, ErrorMessage null (compact length 0), no tags.
        b.extend([0, 0, 0, 0, 0, 0, 0, 0]);
        //     PartitionIndex 1, ErrorCode 121 (INVALID_RECORD_STATE), ErrorMessage "lock".
        b.extend([0, 0, 0, 1, 0, 121, 5, b'l', b'o', b'c', b'k']);
        //     One tagged field the draft does not define (tag 3, 2 bytes): skipped.
        b.extend([1, 3, 2, 0xEE, 0xFF]);
        //   Topic tagged fields.
        b.push(0);
        // Response tagged fields.
        b.push(0);
        b
    }

    #[test]
    fn the_response_is_decoded_as_the_draft_schema_says() {
        let response = TxnShareAcknowledgeResponse::from_bytes(
            Bytes::from(response_bytes()),
            DraftLayout::TypesArray,
        )
        .unwrap();
        assert_eq!(
            response,
            TxnShareAcknowledgeResponse {
                throttle_time_ms: 25,
                error_code: 0,
                responses: vec![TopicResult {
                    topic_id: TOPIC_A,
                    partitions: vec![
                        PartitionResult {
                            partition_index: 0,
                            error_code: 0,
                            error_message: None
                        },
                        PartitionResult {
                            partition_index: 1,
                            error_code: 121,
                            error_message: Some("lock".into())
                        },
                    ]
                }]
            }
        );
    }

    #[test]
    fn a_truncated_response_is_an_error_not_a_panic() {
        let full = response_bytes();
        for cut in [0, 3, 6, 7, 20, full.len() - 1] {
            let err = TxnShareAcknowledgeResponse::from_bytes(
                Bytes::copy_from_slice(&full[..cut]),
                DraftLayout::TypesArray,
            )
            .unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("cannot decode the TxnShareAcknowledge v0 response"),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn the_single_type_draft_sends_one_int8_per_batch_split_into_runs() {
        let body = TxnShareAcknowledgeRequest::new(
            "tx",
            0x0102_0304_0506_0708,
            7,
            &member(),
            &acks(vec![partition(TOPIC_A, 0, &[(10, 13, &[1, 1, 3, 1])])]),
        )
        .unwrap()
        .with_layout(DraftLayout::SingleType)
        .to_bytes()
        .unwrap();
        let mut want: Vec<u8> = Vec::new();
        // Header fields as in the other layout.
        want.extend([3, b't', b'x', 2, b'g']);
        want.extend([1, 2, 3, 4, 5, 6, 7, 8, 0, 7]);
        want.extend([3, b'm', b'1', 0, 0, 0, 5]);
        // One topic, one partition (index 0).
        want.push(2);
        want.extend(TOPIC_A.as_bytes());
        want.push(2);
        want.extend([0, 0, 0, 0]);
        // AcknowledgementBatches: 10..=13 with ACCEPT, ACCEPT, REJECT, ACCEPT becomes three
        // runs, each FirstOffset, LastOffset, AcknowledgeType (a plain int8), tagged fields.
        want.push(4);
        for (first, last, kind) in [(10i64, 11i64, 1u8), (12, 12, 3), (13, 13, 1)] {
            want.extend(first.to_be_bytes());
            want.extend(last.to_be_bytes());
            want.push(kind);
            want.push(0);
        }
        // Partition, topic and request tagged fields.
        want.extend([0, 0, 0]);
        assert_eq!(body.as_ref(), want.as_slice());
    }

    #[test]
    fn the_single_type_drafts_response_has_no_error_message() {
        let mut b: Vec<u8> = Vec::new();
        b.extend(0i32.to_be_bytes());
        b.extend(0i16.to_be_bytes());
        // One topic, one partition: PartitionIndex 2, ErrorCode 110, tagged fields.
        b.push(2);
        b.extend(TOPIC_B.as_bytes());
        b.push(2);
        b.extend([0, 0, 0, 2, 0, 110, 0]);
        b.push(0);
        b.push(0);
        let response = TxnShareAcknowledgeResponse::from_bytes(
            Bytes::from(b.clone()),
            DraftLayout::SingleType,
        )
        .unwrap();
        assert_eq!(
            response.responses[0].partitions,
            vec![PartitionResult {
                partition_index: 2,
                error_code: 110,
                error_message: None
            }]
        );
        // Read with the other layout the same bytes are short by the message.
        assert!(
            TxnShareAcknowledgeResponse::from_bytes(Bytes::from(b), DraftLayout::TypesArray)
                .is_err()
        );
    }
}
