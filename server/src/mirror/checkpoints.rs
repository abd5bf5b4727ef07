//! Checkpoints and group offset sync of one classic flow A->B: consumer groups of A selected by
//! `groups`/`groups.exclude` get their committed offsets translated to B's offsets with the
//! flow's offset syncs, written as MM2 checkpoints to `A.checkpoints.internal` on B and, with
//! `sync.group.offsets.enabled`, committed for the group on B while it has no members there.
//!
//! Translation never skips a record: a committed source offset U is translated with the latest
//! sync (u, d) with u <= U: to d when U == u (record u not consumed yet: resume at its copy),
//! else to d + 1 (records after u were copied after d, in order: classic mode keeps it). A
//! consumer that fails over re-reads at most the records between u and U, fewer than
//! `offset.lag.max` plus one. A share-mode flow has no order per partition and its group no
//! offsets, so it gets no checkpoints.
//!
//! Checkpoint format (Kafka 4.2 `Checkpoint`, version 0): key = group, remote topic (strings),
//! partition (i32); value = version (i16), upstreamOffset (i64), offset (i64), metadata (string).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use spillway_connectors::kafka_offset_syncs::{decode, OffsetSync};
use spillway_kafka::producer::OutRecord;

use super::cluster_client::{cluster_client, cluster_reader};
use super::config::{ClusterSettings, FlowSettings};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The offset syncs read so far, per source topic-partition, by upstream offset.
#[derive(Debug, Default)]
pub struct OffsetSyncStore {
    syncs: BTreeMap<(String, i32), BTreeMap<i64, i64>>,
    /// Where reading the syncs topic goes on.
    position: i64,
}

impl OffsetSyncStore {
    pub fn add(&mut self, topic: String, partition: i32, sync: OffsetSync) {
        self.syncs
            .entry((topic, partition))
            .or_default()
            .insert(sync.upstream, sync.downstream);
    }

    /// The target offset a consumer that committed `upstream` resumes at; `None` before any
    /// sync at or below it (nothing safe to say yet).
    pub fn translate(&self, topic: &str, partition: i32, upstream: i64) -> Option<i64> {
        let syncs = self.syncs.get(&(topic.to_owned(), partition))?;
        let (&u, &d) = syncs.range(..=upstream).next_back()?;
        Some(if u == upstream { d } else { d + 1 })
    }
}

/// An MM2 checkpoint record's key and value.
pub fn checkpoint_record(
    topic: &str,
    group: &str,
    remote_topic: &str,
    partition: i32,
    upstream: i64,
    downstream: i64,
) -> OutRecord {
    let string = |buf: &mut BytesMut, s: &str| {
        buf.put_i16(s.len() as i16);
        buf.put_slice(s.as_bytes());
    };
    let mut key = BytesMut::new();
    string(&mut key, group);
    string(&mut key, remote_topic);
    key.put_i32(partition);
    let mut value = BytesMut::new();
    value.put_i16(0);
    value.put_i64(upstream);
    value.put_i64(downstream);
    string(&mut value, "");
    OutRecord {
        topic: topic.into(),
        partition: Some(0),
        key: Some(Bytes::from(key.to_vec())),
        value: Some(Bytes::from(value.to_vec())),
        headers: Vec::new(),
        timestamp: None,
    }
}

/// One flow's checkpointing. Blocking (rdkafka); run it on the blocking pool.
pub struct Checkpointer {
    pub flow: FlowSettings,
    pub source: ClusterSettings,
    pub target: ClusterSettings,
    /// The cluster of the syncs topic: the source (MM2's default location) or the target.
    pub syncs_cluster: ClusterSettings,
    /// The syncs topic (`mm2-offset-syncs.B.internal` on A, `mm2-offset-syncs.A.internal` on B).
    pub syncs_topic: String,
    pub store: OffsetSyncStore,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Round {
    pub checkpoints: Vec<OutRecord>,
    /// Per checkpoint, in the same order: its group, remote topic and partition (the labels of
    /// MM2's `checkpoint-latency-ms`) and when it was made (ms since the epoch).
    pub made: Vec<CheckpointMade>,
    /// (group, remote topic, partition, target offset) committed on the target.
    pub committed: Vec<(String, String, i32, i64)>,
}

/// One checkpoint's labels and the time it was made.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointMade {
    pub group: String,
    pub remote_topic: String,
    pub partition: i32,
    pub at_ms: i64,
}

impl Checkpointer {
    /// Reads the syncs written since the last round.
    fn read_syncs(&mut self) -> Result<()> {
        let reader = cluster_reader(&self.syncs_cluster, "spillway-mirror-offset-syncs")?;
        // A new client knows no topic yet; watermarks need the partition's leader.
        reader
            .fetch_metadata(Some(&self.syncs_topic), TIMEOUT)
            .with_context(|| format!("cannot find {}", self.syncs_topic))?;
        let (low, high) = reader
            .fetch_watermarks(&self.syncs_topic, 0, TIMEOUT)
            .with_context(|| format!("cannot read {}", self.syncs_topic))?;
        let from = self.store.position.max(low);
        if from >= high {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.syncs_topic, 0, Offset::Offset(from))?;
        reader.assign(&tpl)?;
        let deadline = std::time::Instant::now() + TIMEOUT;
        // Exactly-once flows write their syncs in transactions: the partition may end with a
        // marker, which is never delivered; the end is then told by PartitionEOF.
        while self.store.position < high && std::time::Instant::now() < deadline {
            match reader.poll(Duration::from_millis(200)) {
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(m) => {
                    let m = m?;
                    self.store.position = m.offset() + 1;
                    if let Some(((topic, partition), sync)) =
                        decode(m.key().unwrap_or_default(), m.payload().unwrap_or_default())
                    {
                        self.store.add(topic, partition, sync);
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    fn selected(&self, group: &str) -> bool {
        self.flow.groups.matches(group) && !self.flow.groups_exclude.matches(group)
    }

    /// One round: translate every selected group's offsets; with `sync_offsets`, commit them on
    /// the target for groups without members there (never moving a group back).
    pub fn round(&mut self, topics: &[String], sync_offsets: bool) -> Result<Round> {
        self.read_syncs()?;
        let lister = cluster_client(&self.source, "spillway-mirror-groups")?;
        let groups = lister
            .fetch_group_list(None, TIMEOUT)
            .context("cannot list the source's consumer groups (ListGroups)")?;
        let names: Vec<String> = groups
            .groups()
            .iter()
            .map(|g| g.name().to_owned())
            .filter(|g| self.selected(g))
            .collect();
        let checkpoints_topic = self.flow.policy.checkpoints_topic(&self.flow.source);
        let mut round = Round::default();
        for group in names {
            let reader = cluster_client(&self.source, &group)?;
            let mut tpl = TopicPartitionList::new();
            for topic in topics {
                let metadata = reader.fetch_metadata(Some(topic), TIMEOUT)?;
                for t in metadata.topics() {
                    for p in t.partitions() {
                        tpl.add_partition(topic, p.id());
                    }
                }
            }
            let committed = reader.committed_offsets(tpl, TIMEOUT)?;
            let mut translated = TopicPartitionList::new();
            for e in committed.elements() {
                let Offset::Offset(upstream) = e.offset() else {
                    continue;
                };
                let Some(downstream) = self.store.translate(e.topic(), e.partition(), upstream)
                else {
                    continue;
                };
                let remote = self
                    .flow
                    .policy
                    .format_remote_topic(&self.flow.source, e.topic());
                round.checkpoints.push(checkpoint_record(
                    &checkpoints_topic,
                    &group,
                    &remote,
                    e.partition(),
                    upstream,
                    downstream,
                ));
                round.made.push(CheckpointMade {
                    group: group.clone(),
                    remote_topic: remote.clone(),
                    partition: e.partition(),
                    at_ms: spillway_connectors::kafka_mirror_metrics::now_ms(),
                });
                translated.add_partition_offset(
                    &remote,
                    e.partition(),
                    Offset::Offset(downstream),
                )?;
            }
            if sync_offsets && translated.count() > 0 {
                round
                    .committed
                    .extend(self.commit_on_target(&group, translated)?);
            }
        }
        Ok(round)
    }

    /// Commits `translated` for `group` on the target where it is ahead of what the group has
    /// there, unless the group has members there (it is live on the target: leave it alone).
    fn commit_on_target(
        &self,
        group: &str,
        translated: TopicPartitionList,
    ) -> Result<Vec<(String, String, i32, i64)>> {
        let target = cluster_client(&self.target, group)?;
        let described = target.fetch_group_list(Some(group), TIMEOUT)?;
        if described
            .groups()
            .iter()
            .any(|g| g.name() == group && !g.members().is_empty())
        {
            return Ok(Vec::new());
        }
        let mut ask = TopicPartitionList::new();
        for e in translated.elements() {
            ask.add_partition(e.topic(), e.partition());
        }
        let current = target.committed_offsets(ask, TIMEOUT)?;
        let mut ahead = TopicPartitionList::new();
        let mut out = Vec::new();
        for e in translated.elements() {
            let Offset::Offset(offset) = e.offset() else {
                continue;
            };
            let have = current
                .find_partition(e.topic(), e.partition())
                .and_then(|c| match c.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            if have.is_none_or(|h| offset > h) {
                ahead.add_partition_offset(e.topic(), e.partition(), Offset::Offset(offset))?;
                out.push((
                    group.to_owned(),
                    e.topic().to_owned(),
                    e.partition(),
                    offset,
                ));
            }
        }
        if ahead.count() > 0 {
            target.commit(&ahead, CommitMode::Sync).with_context(|| {
                format!(
                    "cannot commit translated offsets of group '{group}' on cluster {}",
                    self.target.alias
                )
            })?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> OffsetSyncStore {
        let mut s = OffsetSyncStore::default();
        s.add(
            "orders".into(),
            0,
            OffsetSync {
                upstream: 0,
                downstream: 100,
            },
        );
        s.add(
            "orders".into(),
            0,
            OffsetSync {
                upstream: 10,
                downstream: 110,
            },
        );
        s.add(
            "orders".into(),
            0,
            OffsetSync {
                upstream: 25,
                downstream: 112,
            },
        );
        s
    }

    #[test]
    fn translation_resumes_at_the_copy_of_the_first_unconsumed_record_or_before_it() {
        let s = store();
        assert_eq!(
            s.translate("orders", 0, 10),
            Some(110),
            "exactly a sync: its copy"
        );
        assert_eq!(
            s.translate("orders", 0, 15),
            Some(111),
            "after a sync: just after its copy"
        );
        assert_eq!(s.translate("orders", 0, 25), Some(112));
        assert_eq!(s.translate("orders", 0, 1000), Some(113));
        assert_eq!(
            s.translate("orders", 1, 5),
            None,
            "no sync for the partition"
        );
        let mut later = OffsetSyncStore::default();
        later.add(
            "orders".into(),
            0,
            OffsetSync {
                upstream: 50,
                downstream: 0,
            },
        );
        assert_eq!(
            later.translate("orders", 0, 49),
            None,
            "nothing below: no guess"
        );
    }

    #[test]
    fn a_checkpoint_record_has_mm2s_layout() {
        let r = checkpoint_record("A.checkpoints.internal", "g", "A.t", 2, 40, 7);
        assert_eq!(r.topic, "A.checkpoints.internal");
        assert_eq!(
            &r.key.expect("key")[..],
            &[0, 1, b'g', 0, 3, b'A', b'.', b't', 0, 0, 0, 2]
        );
        let v = r.value.expect("value");
        assert_eq!(&v[..2], &[0, 0], "version 0");
        assert_eq!(&v[2..10], &40i64.to_be_bytes());
        assert_eq!(&v[10..18], &7i64.to_be_bytes());
        assert_eq!(&v[18..], &[0, 0], "empty metadata");
    }
}
