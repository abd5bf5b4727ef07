//! The per-record bookkeeping of the two consumers, driven from memory, so that its cost can
//! be counted (`valgrind --tool=callgrind` on `examples/per_record_cost.rs`, issue 18) without
//! a broker, whose timing would change how often the consumers poll.
//!
//! Each cycle hands out one batch of records the way a poll does and settles it the way the
//! runtime's sources do (`spillway_actors::source`): share mode absorbs a ShareFetch
//! partition response (decode, acquire), acknowledges every record, takes the acks for the
//! next request, encodes them and completes them; classic mode turns librdkafka messages into
//! records, marks them delivered, done, and commits the watermark. Not part of the API.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::share_fetch_response::AcquiredRecords;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use rdkafka::message::OwnedMessage;
use rdkafka::Timestamp;

use crate::classic::{push_owned, OffsetTracker};
use crate::copies::{Copies, COPY_CHUNK};
use crate::share::ack::{encode_batches, Ledger, Owner};
use crate::share::consumer::acknowledge_each;
use crate::share::fetch::{absorb_partition, lock_ledger};
use crate::share::AcknowledgeType;

fn value(offset: i64) -> Vec<u8> {
    let mut v = format!("value-{offset:010}-").into_bytes();
    v.resize(100, b'x');
    v
}

/// One record batch of `n` 100-byte values at offsets `0..n` (v2, uncompressed).
fn record_batch(n: usize) -> Bytes {
    let records: Vec<Record> = (0..n as i64)
        .map(|offset| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            // Consecutive: one batch (the encoder starts a batch where sequences jump).
            sequence: offset as i32,
            timestamp: 1_000 + offset,
            key: None,
            value: Some(Bytes::from(value(offset))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, &records, &options)
        .unwrap_or_else(|e| panic!("encoding a record batch: {e}"));
    buf.freeze()
}

/// `records` records through the share consumer's ledger in fetches of `batch`; returns how
/// many were delivered.
pub fn share_cycles(records: usize, batch: usize) -> usize {
    share_cycles_in(records, batch, batch)
}

/// As [`share_cycles`], but the records are stored in batches of `stored` (a multiple of
/// `batch`): every fetch acquires the next `batch` of them and carries the whole stored batch
/// around them, as a broker does when the producer's batches are larger than a fetch's
/// MaxRecords (the benchmarks' producer writes batches of up to 1 MB).
pub fn share_cycles_in(records: usize, batch: usize, stored: usize) -> usize {
    let stored = stored.max(batch) / batch * batch;
    let template = record_batch(stored);
    let ledger = Mutex::new(Ledger::default());
    let topic: Arc<str> = Arc::from("bench");
    let owner = Owner {
        broker: 1,
        generation: 1,
    };
    let mut delivered = 0;
    let mut first = 0i64;
    let mut response: Option<(i64, Bytes)> = None;
    while delivered < records {
        // The same batch at the next offsets: the base offset is outside the CRC. Made once
        // per stored batch (the fixture's cost), handed to every fetch inside it.
        let base = first - first % stored as i64;
        if response.as_ref().is_none_or(|(b, _)| *b != base) {
            let mut bytes = BytesMut::with_capacity(template.len());
            bytes.put_i64(base);
            bytes.extend_from_slice(&template[8..]);
            response = Some((base, bytes.freeze()));
        }
        let bytes = response
            .as_ref()
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        let mut acquired = AcquiredRecords::default();
        acquired.first_offset = first;
        acquired.last_offset = first + batch as i64 - 1;
        acquired.delivery_count = 1;
        let mut out = Vec::with_capacity(batch);
        absorb_partition(
            &mut lock_ledger(&ledger),
            &topic,
            0,
            owner,
            &[acquired],
            bytes,
            Instant::now(),
            &mut out,
        )
        .unwrap_or_else(|e| panic!("absorbing: {e}"));
        // The fetch task's check before it fetches again.
        assert_eq!(lock_ledger(&ledger).unsettled_held(1), out.len());
        // The source's settle: one verdict per record, under one lock.
        acknowledge_each(
            &ledger,
            out.iter()
                .map(|r| (&*r.topic, r.partition, r.offset, AcknowledgeType::Accept)),
            |_, result| result.unwrap_or_else(|e| panic!("acknowledging: {e}")),
        );
        assert!(lock_ledger(&ledger).awaits_confirmation(1));
        let sent = lock_ledger(&ledger).take_pending(1, 1);
        for (_, _, acks) in &sent {
            std::hint::black_box(encode_batches(acks));
        }
        let mut l = lock_ledger(&ledger);
        for (t, p, acks) in &sent {
            l.complete(t, *p, acks, Ok(()));
        }
        assert!(l.take_results().values().all(Result::is_ok));
        drop(l);
        delivered += out.len();
        first += batch as i64;
    }
    delivered
}

/// What librdkafka hands out for one poll (its own buffers: callgrind's inclusive cost of this
/// function is the fixture's, to be left out of the consumer's).
#[inline(never)]
fn librdkafka_messages(base: i64, batch: usize) -> Vec<OwnedMessage> {
    (0..batch as i64)
        .map(|i| {
            OwnedMessage::new(
                Some(value(base + i)),
                None,
                "bench".to_string(),
                Timestamp::CreateTime(1_000),
                0,
                base + i,
                None,
            )
        })
        .collect()
}

/// `records` records through the classic consumer's conversion and offset tracking in polls
/// of `batch`; returns how many were handed out.
pub fn classic_cycles(records: usize, batch: usize) -> usize {
    let tracker = Mutex::new(OffsetTracker::default());
    let lock = || tracker.lock().unwrap_or_else(|e| e.into_inner());
    let mut handed = 0;
    let mut base = 0i64;
    while handed < records {
        let messages = librdkafka_messages(base, batch);
        let mut last_topic = None;
        let mut copies = Copies::new(COPY_CHUNK);
        let mut polled = Vec::with_capacity(messages.len());
        for m in &messages {
            push_owned(&mut polled, m, &mut last_topic, &mut copies);
        }
        lock().delivered_all(
            polled
                .iter()
                .map(|r| (r.topic.as_str(), r.partition, r.offset)),
        );
        // The source's settle: every record done, under one lock.
        lock().done_all(
            polled
                .iter()
                .map(|r| (r.topic.as_str(), r.partition, r.offset)),
        );
        let commit = lock().to_commit();
        assert_eq!(commit.len(), 1);
        lock().committed(&commit);
        handed += polled.len();
        drop(polled);
        base += batch as i64;
    }
    handed
}
