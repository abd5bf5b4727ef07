//! Reading what transactions committed. The dev broker's classic Fetch ignores
//! `isolation.level` (it shows aborted and open transactions' records); its ShareFetch honours a
//! share group's read_committed isolation. So exactly-once output is read through a
//! read_committed share group.

use std::time::{Duration, Instant};

use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig, ShareRecord};

use crate::DevBroker;

/// Every committed record of `topic` on `broker`, read from the beginning by the new share
/// group `group` until `expected` records came (then 1.5 s longer, so a duplicate or a stray
/// record shows up too) or `limit` passed. Duplicates are kept, in the order read.
pub async fn read_committed(
    broker: &DevBroker,
    topic: &str,
    group: &str,
    expected: usize,
    limit: Duration,
) -> Vec<ShareRecord> {
    broker.set_share_isolation_level(true);
    broker.set_share_auto_offset_reset("earliest");
    let mut consumer = ShareConsumer::connect(ShareConsumerConfig::new(&broker.bootstrap(), group))
        .await
        .expect("the read_committed reader connects");
    consumer.subscribe(&[topic]);
    let mut read = Vec::new();
    let deadline = Instant::now() + limit;
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if read.len() >= expected && settle_until.is_none() {
            settle_until = Some(now + Duration::from_millis(1500));
        }
        if settle_until.is_some_and(|s| now >= s) || now >= deadline {
            break;
        }
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .expect("the read_committed reader polls");
        consumer
            .acknowledge_all(&records, AcknowledgeType::Accept)
            .expect("acknowledged");
        if !records.is_empty() {
            consumer
                .commit_sync(Duration::from_secs(5))
                .await
                .expect("committed");
        }
        read.extend(records);
    }
    let _ = consumer.close().await;
    read
}
