//! MirrorMaker 2's offset syncs, written by a kafka sink that runs a mirror flow
//! (`offset.syncs.topic` set, as `spillway mirror` does for classic flows).
//!
//! Where they go is MM2's `offset-syncs.topic.location`: on the target (the sink's own producer;
//! under exactly-once, in the copies' transaction) unless `offset.syncs.bootstrap.servers` names
//! another cluster (`spillway mirror` names the source, MM2's default), which gets a producer of
//! its own: a transaction cannot span two clusters, so exactly-once flows send those syncs
//! after the transaction holding their copies committed, as MM2 does.
//!
//! An offset sync says "source record `upstreamOffset` of topic-partition T was written to the
//! target at `offset`". Checkpoints translate a consumer group's committed source offset with the
//! latest sync at or below it; the finer the syncs, the less a failed-over consumer re-reads. A
//! sync is written for a partition's first copied record, whenever `offset.lag.max` source offsets
//! passed since the last sync, and whenever the copy's offsets stop following the source's one
//! for one (a gap upstream or downstream), so the translation never lands past an uncopied record.
//!
//! Format (Kafka 4.2 `OffsetSync`): key = topic (i16 length + UTF-8) and partition (i32); value =
//! upstreamOffset (i64) and offset (i64), big-endian. The topic in the key is the source topic.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use spillway_core::Topic;
use spillway_kafka::producer::OutRecord;

use crate::topic_table::TopicTable;

/// Where a flow writes its offset syncs (MM2's topic name; see docs/mirror.md for the cluster).
pub const OFFSET_SYNCS_TOPIC: &str = "offset.syncs.topic";
/// The cluster of the offset syncs topic when it is not the target (MM2's
/// `offset-syncs.topic.location=source`: the source cluster).
pub const OFFSET_SYNCS_BOOTSTRAP_SERVERS: &str = "offset.syncs.bootstrap.servers";
/// Client keys (security) of the producer writing to [`OFFSET_SYNCS_BOOTSTRAP_SERVERS`].
pub const OFFSET_SYNCS_PRODUCER_PREFIX: &str = "offset.syncs.producer.";
/// MM2's `offset.lag.max`: at most this many source offsets between two syncs of a partition.
pub const OFFSET_LAG_MAX: &str = "offset.lag.max";

/// One offset sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetSync {
    pub upstream: i64,
    pub downstream: i64,
}

/// Encodes an offset sync record's key.
pub fn sync_key(topic: &str, partition: i32) -> Bytes {
    let mut buf = BytesMut::with_capacity(topic.len() + 6);
    let len = i16::try_from(topic.len()).unwrap_or(i16::MAX);
    buf.put_i16(len);
    buf.put_slice(&topic.as_bytes()[..len as usize]);
    buf.put_i32(partition);
    buf.freeze()
}

pub fn sync_value(sync: OffsetSync) -> Bytes {
    let mut buf = BytesMut::with_capacity(16);
    buf.put_i64(sync.upstream);
    buf.put_i64(sync.downstream);
    buf.freeze()
}

/// Reads an offset sync record: `((topic, partition), sync)`; `None` if it is not one.
pub fn decode(key: &[u8], value: &[u8]) -> Option<((String, i32), OffsetSync)> {
    let mut k = key;
    if k.remaining() < 2 {
        return None;
    }
    let len = usize::try_from(k.get_i16()).ok()?;
    if k.remaining() < len + 4 {
        return None;
    }
    let topic = std::str::from_utf8(&k[..len]).ok()?.to_owned();
    k.advance(len);
    let partition = k.get_i32();
    let mut v = value;
    if v.remaining() < 16 {
        return None;
    }
    let sync = OffsetSync {
        upstream: v.get_i64(),
        downstream: v.get_i64(),
    };
    Some(((topic, partition), sync))
}

/// Per source partition: the last sync written and the last record copied.
#[derive(Debug, Clone, Copy)]
struct PartitionState {
    synced: OffsetSync,
    last: OffsetSync,
}

/// Decides which copies need a sync.
#[derive(Debug)]
pub struct OffsetSyncs {
    topic: Topic,
    lag_max: i64,
    /// Per source topic, per partition (by number: a source partition is never negative).
    partitions: TopicTable<Vec<Option<PartitionState>>>,
}

impl OffsetSyncs {
    pub fn new(topic: String, lag_max: i64) -> OffsetSyncs {
        OffsetSyncs {
            topic: Topic::from(topic),
            lag_max: lag_max.max(0),
            partitions: TopicTable::default(),
        }
    }

    /// The sync record to write after source record `upstream` of `topic`/`partition` was
    /// written to the target at `downstream`, if one is due.
    pub fn copied(
        &mut self,
        topic: &Topic,
        partition: i32,
        upstream: i64,
        downstream: i64,
    ) -> Option<OutRecord> {
        let now = OffsetSync {
            upstream,
            downstream,
        };
        // A record read from Kafka has a partition; one without (-1) has no offset to sync.
        let Ok(at) = usize::try_from(partition) else {
            return None;
        };
        let states = self.partitions.get_or_insert_with(topic, Vec::new);
        if states.len() <= at {
            states.resize(at + 1, None);
        }
        let due = match &mut states[at] {
            vacant @ None => {
                *vacant = Some(PartitionState {
                    synced: now,
                    last: now,
                });
                true
            }
            Some(state) => {
                let due = upstream - state.synced.upstream >= self.lag_max
                    || upstream != state.last.upstream + 1
                    || downstream != state.last.downstream + 1;
                state.last = now;
                if due {
                    state.synced = now;
                }
                due
            }
        };
        due.then(|| OutRecord {
            topic: self.topic.clone(),
            partition: Some(0),
            key: Some(sync_key(topic, partition)),
            value: Some(sync_value(now)),
            headers: Vec::new(),
            timestamp: None,
        })
    }

    /// Forget `topic`/`partition` (it was revoked): its next copy starts with a sync.
    pub fn forget(&mut self, topic: &str, partition: i32) {
        if let Some(state) = self
            .partitions
            .get_mut(topic)
            .and_then(|states| states.get_mut(usize::try_from(partition).ok()?))
        {
            *state = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synced(s: &mut OffsetSyncs, up: i64, down: i64) -> bool {
        s.copied(&Topic::from("orders"), 0, up, down).is_some()
    }

    #[test]
    fn syncs_come_first_then_every_lag_max_and_at_every_gap() {
        let mut s = OffsetSyncs::new("mm2-offset-syncs.A.internal".into(), 10);
        assert!(synced(&mut s, 0, 100), "first copy");
        for up in 1..10 {
            assert!(!synced(&mut s, up, 100 + up), "{up}");
        }
        assert!(synced(&mut s, 10, 110), "lag max reached");
        assert!(!synced(&mut s, 11, 111));
        assert!(
            synced(&mut s, 15, 112),
            "a gap upstream (compacted or transactional source)"
        );
        assert!(synced(&mut s, 16, 120), "a gap downstream");
        s.forget("orders", 0);
        assert!(
            synced(&mut s, 17, 121),
            "a reassigned partition starts with a sync"
        );
        assert!(
            s.copied(&Topic::from("orders"), 1, 17, 0).is_some(),
            "partitions are separate"
        );
    }

    #[test]
    fn each_partition_keeps_its_own_state_as_copies_move_between_them() {
        let mut s = OffsetSyncs::new("syncs".into(), 100);
        let (orders, users) = (Topic::from("orders"), Topic::interned("users"));
        let mut due =
            |topic: &Topic, partition, up, down| s.copied(topic, partition, up, down).is_some();
        // Runs of copies by partition, as batches bring them, each run going on from its
        // partition's last copy.
        assert!(due(&orders, 0, 0, 0), "first copy of orders-0");
        assert!(!due(&orders, 0, 1, 1));
        assert!(due(&orders, 1, 0, 0), "first copy of orders-1");
        assert!(due(&users, 0, 0, 50), "first copy of users-0");
        assert!(!due(&orders, 0, 2, 2), "orders-0 goes on where it was");
        assert!(!due(&orders, 1, 1, 1), "orders-1 too");
        assert!(!due(&users, 0, 1, 51));
        assert!(due(&orders, 0, 4, 3), "a gap in orders-0");
        // Forgetting the partition copied last, or another one.
        s.forget("orders", 0);
        s.forget("users", 0);
        let mut due =
            |topic: &Topic, partition, up, down| s.copied(topic, partition, up, down).is_some();
        assert!(due(&orders, 0, 5, 4), "orders-0 starts again with a sync");
        assert!(due(&users, 0, 2, 52), "users-0 too");
        assert!(!due(&orders, 1, 2, 2), "orders-1 was not forgotten");
    }

    #[test]
    fn a_sync_record_round_trips_in_mm2s_layout() {
        let mut s = OffsetSyncs::new("syncs".into(), 100);
        let record = s.copied(&Topic::from("orders"), 3, 42, 7).expect("first");
        assert_eq!(record.topic, "syncs");
        let key = record.key.expect("key");
        assert_eq!(
            &key[..],
            &[0, 6, b'o', b'r', b'd', b'e', b'r', b's', 0, 0, 0, 3]
        );
        let value = record.value.expect("value");
        assert_eq!(&value[..8], &42i64.to_be_bytes());
        assert_eq!(
            decode(&key, &value),
            Some((
                ("orders".into(), 3),
                OffsetSync {
                    upstream: 42,
                    downstream: 7
                }
            ))
        );
        assert_eq!(decode(&key[..5], &value), None);
    }
}
