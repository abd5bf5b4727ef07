//! Learning the producer id and epoch of an rdkafka transactional producer.
//!
//! TxnShareAcknowledge must carry the producer id and epoch of the transaction it joins, and
//! librdkafka keeps them private: its public API (and so `rdkafka`/`rdkafka-sys`) has no
//! getter. Running our own InitProducerId with the same transactional id is not an option: it
//! would fence the rdkafka producer. But every record batch in the log carries the id and
//! epoch of the producer that wrote it. So after the transaction's first record is delivered
//! (acks=all, which transactions force, so it is below the high watermark), one
//! read_uncommitted Fetch of that offset from the partition leader yields exactly the identity
//! of the producer's current transaction, also after an epoch bump (KIP-890 bumps it per
//! transaction). The cost is one Fetch per transaction.

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use spillway_kafka::cluster::Cluster;
use spillway_kafka::error_name;
use std::time::Duration;

use super::Kip1289Error;

/// Fetch by topic name (v4..=12); v13+ name topics by id. Kafka 4.x still serves v4..=12.
const FETCH_VERSIONS: (i16, i16) = (4, 12);
/// Api key of Fetch.
const FETCH_KEY: i16 = 1;
/// Enough for the batch holding the offset; the broker returns a whole first batch anyway.
const FETCH_MAX_BYTES: i32 = 1024 * 1024;

/// The producer id and epoch a record batch was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdentity {
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// The identity of the transactional producer that wrote `topic`-`partition`@`offset`.
pub async fn producer_identity_at(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> Result<ProducerIdentity, Kip1289Error> {
    let fail = |reason: String| Kip1289Error::ProducerIdentity {
        topic: topic.to_string(),
        partition,
        offset,
        reason,
    };
    let leader = |cluster: &Cluster| {
        cluster
            .topic(topic)
            .and_then(|meta| meta.leaders.get(&partition).copied())
            .filter(|leader| *leader >= 0)
    };
    let leader = match leader(cluster) {
        Some(leader) => leader,
        None => {
            cluster.refresh_metadata(&[topic.to_string()]).await?;
            leader(cluster).ok_or_else(|| fail("the partition has no known leader".into()))?
        }
    };
    let conn = cluster.broker(leader).await?;
    let mut request = FetchRequest::default();
    request.max_wait_ms = 0;
    request.min_bytes = 0;
    request.max_bytes = FETCH_MAX_BYTES;
    // read_uncommitted: the transaction is still open.
    request.isolation_level = 0;
    let mut wanted = FetchPartition::default();
    wanted.partition = partition;
    wanted.fetch_offset = offset;
    wanted.partition_max_bytes = FETCH_MAX_BYTES;
    let mut fetch_topic = FetchTopic::default();
    fetch_topic.topic = TopicName(StrBytes::from_string(topic.to_string()));
    fetch_topic.partitions = vec![wanted];
    request.topics = vec![fetch_topic];
    let version = conn.pick(FETCH_KEY, FETCH_VERSIONS.0, FETCH_VERSIONS.1)?;
    let response = conn.request(&request, version, timeout).await?;
    if response.error_code != 0 {
        return Err(fail(format!(
            "Fetch failed with error {} ({})",
            response.error_code,
            error_name(response.error_code)
        )));
    }
    let data = response
        .responses
        .iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition)
        .ok_or_else(|| fail("the Fetch response does not list the partition".into()))?;
    if data.error_code != 0 {
        return Err(fail(format!(
            "Fetch failed with error {} ({})",
            data.error_code,
            error_name(data.error_code)
        )));
    }
    identity_in(data.records.clone().unwrap_or_default(), offset).map_err(fail)
}

/// Find the batch holding `offset` among the record batches in `bytes`.
fn identity_in(mut bytes: Bytes, offset: i64) -> Result<ProducerIdentity, String> {
    // Each batch starts with baseOffset (int64) and batchLength (int32) counting what follows.
    while bytes.len() >= 12 {
        let length = i32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let total = usize::try_from(length)
            .map_err(|_| format!("a record batch has negative length {length}"))?
            .saturating_add(12);
        if bytes.len() < total {
            // The broker cut the last batch at max bytes.
            break;
        }
        let mut batch = bytes.split_to(total);
        let set = RecordBatchDecoder::decode(&mut batch)
            .map_err(|e| format!("a record batch cannot be decoded: {e}"))?;
        if let Some(record) = set.records.iter().find(|r| r.offset == offset) {
            if !record.transactional || record.producer_id < 0 {
                return Err(format!(
                    "the record there was not written by a transactional producer (producer id \
                     {}, transactional {})",
                    record.producer_id, record.transactional
                ));
            }
            return Ok(ProducerIdentity {
                producer_id: record.producer_id,
                producer_epoch: record.producer_epoch,
            });
        }
    }
    Err("the leader returned no record at that offset (was it deleted or compacted?)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(offset: i64, producer_id: i64, epoch: i16, transactional: bool) -> Record {
        Record {
            transactional,
            control: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: offset as i32,
            timestamp: 0,
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
            delete_horizon: false,
        }
    }

    fn batches(batches: &[Vec<Record>]) -> Bytes {
        let mut buf = BytesMut::new();
        for records in batches {
            RecordBatchEncoder::encode(
                &mut buf,
                records,
                &RecordEncodeOptions {
                    version: 2,
                    compression: Compression::None,
                },
            )
            .unwrap();
        }
        buf.freeze()
    }

    #[test]
    fn the_identity_comes_from_the_batch_holding_the_offset() {
        let bytes = batches(&[
            vec![record(10, 7, 0, true), record(11, 7, 0, true)],
            vec![record(12, 42, 3, true)],
        ]);
        assert_eq!(
            identity_in(bytes.clone(), 12),
            Ok(ProducerIdentity {
                producer_id: 42,
                producer_epoch: 3
            })
        );
        assert_eq!(identity_in(bytes, 11).unwrap().producer_id, 7);
    }

    #[test]
    fn a_record_written_without_a_transaction_is_refused() {
        let bytes = batches(&[vec![record(5, -1, -1, false)]]);
        let err = identity_in(bytes, 5).unwrap_err();
        assert!(
            err.contains("not written by a transactional producer"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_offset_or_a_cut_batch_is_reported() {
        let bytes = batches(&[vec![record(5, 1, 0, true)]]);
        assert!(identity_in(bytes.clone(), 6)
            .unwrap_err()
            .contains("no record"));
        let cut = bytes.slice(..bytes.len() - 3);
        assert!(identity_in(cut, 5).unwrap_err().contains("no record"));
    }
}
