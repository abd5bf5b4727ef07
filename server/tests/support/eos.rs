//! Reading what an exactly-once kafka sink wrote, as a consumer of its output would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use spillway_kafka::share::{AcknowledgeType, ShareConsumer, ShareConsumerConfig};

/// A source record: topic, partition, offset.
pub type Source = (String, i32, i64);

/// Reads the output through a read_committed share group until every expected source record
/// was seen (then a few seconds more, to catch extras) or `limit` passed. Returns, per source
/// record, the distinct output positions holding it: a record the reader itself got twice (its
/// session was reset) has one position; a duplicate written by the sink has two.
pub async fn read_output(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    limit: Duration,
) -> BTreeMap<Source, BTreeSet<(i32, i64)>> {
    let mut config = ShareConsumerConfig::new(bootstrap, "crash-output-reader");
    config.max_poll_records = 2000;
    let mut consumer = ShareConsumer::connect(config)
        .await
        .expect("the output reader connects");
    consumer.subscribe(&[topic]);
    let mut found: BTreeMap<Source, BTreeSet<(i32, i64)>> = BTreeMap::new();
    let deadline = Instant::now() + limit;
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if found.len() >= expected && settle_until.is_none() {
            settle_until = Some(now + Duration::from_secs(3));
        }
        if settle_until.is_some_and(|s| now >= s) || now >= deadline {
            break;
        }
        let records = match consumer.poll(Duration::from_millis(300)).await {
            Ok(records) => records,
            Err(e) => {
                eprintln!("output reader: {e}");
                continue;
            }
        };
        for r in &records {
            let header = |name: &str| -> String {
                r.headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| v.as_ref())
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| {
                        panic!(
                            "output {}-{}@{} lacks {name}",
                            r.topic, r.partition, r.offset
                        )
                    })
            };
            let source = (
                header("spillway.source.topic"),
                header("spillway.source.partition")
                    .parse()
                    .expect("partition"),
                header("spillway.source.offset").parse().expect("offset"),
            );
            found
                .entry(source)
                .or_default()
                .insert((r.partition, r.offset));
        }
        let _ = consumer.acknowledge_all(&records, AcknowledgeType::Accept);
        if !records.is_empty() {
            let _ = consumer.commit_sync(Duration::from_secs(5)).await;
        }
    }
    let _ = consumer.close().await;
    found
}

/// Asserts that `found` (from [`read_output`]) holds every `expected` source record once and
/// nothing else; prints the counts with `what` (the scenario) first.
pub fn assert_exactly_once(
    what: &str,
    expected: &BTreeSet<Source>,
    found: &BTreeMap<Source, BTreeSet<(i32, i64)>>,
) {
    let duplicated: Vec<_> = found.iter().filter(|(_, at)| at.len() > 1).collect();
    let missing: Vec<_> = expected
        .iter()
        .filter(|s| !found.contains_key(*s))
        .collect();
    let extra: Vec<_> = found.keys().filter(|s| !expected.contains(*s)).collect();
    eprintln!(
        "{what}: {} source records: {} found, {} duplicated, {} missing, {} extra",
        expected.len(),
        found.len(),
        duplicated.len(),
        missing.len(),
        extra.len()
    );
    assert!(
        duplicated.is_empty() && missing.is_empty() && extra.is_empty(),
        "duplicated (first 5): {:?}; missing (first 5): {:?}; extra (first 5): {:?}",
        duplicated.iter().take(5).collect::<Vec<_>>(),
        missing.iter().take(5).collect::<Vec<_>>(),
        extra.iter().take(5).collect::<Vec<_>>()
    );
}
