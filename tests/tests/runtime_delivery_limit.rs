//! Issue 14, items 3–5: share-mode retries that hold their locks, the delivery limit, lock
//! sanity. Kafka archives a record after `group.share.delivery.count.limit` deliveries; none
//! of these tests may let that happen to a record Spillway did not deliver, dead-letter or
//! name in a FAILED status (`sink-record-archived-by-limit-total` stays 0).

mod runtime_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use runtime_support::{
    assert_nothing_archived, config, json_records, probe, share_broker, start_http_receiver,
    wait_until, worker,
};
use spillway_actors::State;
use spillway_tests::produce;

/// Issue 14's measured loss: an HTTP receiver answering 503 for 20 s, longer than 5 lock
/// durations (3 s), share mode, 4 tasks, delivery limit 5. Before: about 5 % of the records
/// were archived by the broker while every task stayed RUNNING. Now the records are retried
/// within their locks and the tasks fetch nothing between deliveries while the target is
/// down, so every record arrives and none reaches its last delivery.
#[tokio::test(flavor = "multi_thread")]
async fn a_20_s_outage_of_an_http_target_loses_nothing_with_a_3_s_lock_and_limit_5() {
    let broker = share_broker(1, 3_000, 10_000);
    broker.set_share_max_delivery_attempts(5);
    broker.create_topic("clicks", 4);
    const RECORDS: u64 = 4_000;
    produce(
        &broker.bootstrap(),
        "clicks",
        json_records(RECORDS, 4),
        "none",
    )
    .await;
    let outage = Duration::from_secs(20);
    let (url, receiver) = start_http_receiver(StatusCode::SERVICE_UNAVAILABLE, outage).await;
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "clicks-http"),
            ("connector.class", "http"),
            ("http.url", &url),
            ("topics", "clicks"),
            ("tasks.max", "4"),
            ("consumer.override.group.protocol", "share"),
            ("group.share.delivery.count.limit", "5"),
            (
                "value.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            ("value.converter.schemas.enable", "false"),
            ("errors.log.enable", "true"),
        ]))
        .await
        .expect("connector starts");
    wait_until(
        Duration::from_secs(150),
        "every record at the receiver",
        || receiver.taken.lock().expect("lock").len() as u64 >= RECORDS,
    )
    .await;
    let first = receiver
        .first_request
        .lock()
        .expect("lock")
        .expect("a request came");
    let answered_503 = *receiver.refused.lock().expect("lock");
    assert!(
        answered_503 > 0 && first.elapsed() > outage,
        "the outage happened ({answered_503} answers 503)"
    );
    assert_eq!(
        *receiver.taken.lock().expect("lock"),
        (0..RECORDS).collect::<BTreeSet<u64>>()
    );
    wait_until(Duration::from_secs(20), "every record accepted", || {
        worker
            .status("clicks-http")
            .is_some_and(|s| s.totals().accepted >= RECORDS)
    })
    .await;
    let status = worker.status("clicks-http").expect("registered");
    assert!(
        status.tasks.iter().all(|t| t.state == State::Running),
        "{status:?}"
    );
    let totals = status.totals();
    assert_eq!(totals.rejected, 0, "{totals:?}");
    assert_eq!(totals.dead_lettered, 0, "{totals:?}");
    assert_nothing_archived(&worker, "clicks-http");
    worker.shutdown().await;
}

/// The partition and offset of the record numbered `n` by `json_records(_, 3)`.
fn poison_of(produced: &[spillway_tests::Produced], n: usize) -> (i32, i64) {
    (produced[n].partition, produced[n].offset)
}

/// A record `put` can never take, errors.tolerance=none, 3 tasks: before, each task failure
/// released it, another task (or the restarted one) failed on it again, until the broker
/// archived it and the tasks went back to RUNNING. Now it is released while deliveries are
/// left; on its last allowed delivery it is rejected and the task stays FAILED naming it.
async fn poison_under_tolerance_none(retriable: bool, broker_limit: i32) {
    let name = if retriable { "stubborn" } else { "poisoned" };
    let broker = share_broker(1, 3_000, 10_000);
    broker.set_share_max_delivery_attempts(broker_limit);
    broker.create_topic(name, 3);
    let produced = produce(&broker.bootstrap(), name, json_records(300, 3), "none").await;
    let (partition, offset) = poison_of(&produced, 137);
    let poison = format!("{partition}:{offset}");
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", name),
            ("connector.class", "probe"),
            ("probe.id", name),
            ("probe.poison", &poison),
            (
                "probe.poison.retriable",
                if retriable { "true" } else { "false" },
            ),
            ("topics", name),
            ("tasks.max", "3"),
            ("consumer.override.group.protocol", "share"),
            ("group.share.delivery.count.limit", "5"),
            ("errors.retry.delay.max.ms", "1000"),
            ("errors.tolerance", "none"),
        ]))
        .await
        .expect("connector starts");
    let named = format!("{name}-{partition}@{offset}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = worker.status(name).expect("registered");
        let done = status.tasks.iter().any(|t| {
            t.state == State::Failed
                && t.trace.as_deref().is_some_and(|trace| {
                    trace.contains(&named) && trace.contains("last allowed delivery")
                })
        });
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no task FAILED naming {named} at the delivery limit: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = probe(name);
    wait_until(Duration::from_secs(30), "every other record", || {
        p.distinct() >= 299
    })
    .await;
    assert!(
        !p.coordinates()
            .iter()
            .any(|(_, pa, o)| (*pa, *o) == (partition, offset)),
        "the poison record was never taken"
    );
    // It stays FAILED: no restart brings the task back to RUNNING.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = worker.status(name).expect("registered");
    assert!(
        status.tasks.iter().any(|t| t.state == State::Failed
            && t.trace.as_deref().is_some_and(|tr| tr.contains(&named))),
        "{status:?}"
    );
    assert_nothing_archived(&worker, name);
    worker.shutdown().await;
}

/// A poison record the target refuses for good (a fatal `put` error). Each failure below the
/// limit restarts a task, and on the dev broker every restart's closed connection also ends
/// the other members' share sessions (a mock-only behaviour, docs/dev-broker.md), which
/// releases what they hold and spends deliveries no task saw. The mock's own limit is therefore
/// set above the connector's 5 here, so that what is tested is the runtime's rule (never
/// release at the limit it knows) rather than the mock's extra deliveries.
#[tokio::test(flavor = "multi_thread")]
async fn a_poison_record_under_tolerance_none_ends_failed_naming_it_and_nothing_is_archived() {
    poison_under_tolerance_none(false, 10).await;
}

/// A poison record the target refuses retriably for ever: retried within its locks and
/// released with pauses (no task failure, so no restart), until its last allowed delivery,
/// where it is rejected and the task fails for good naming it. The broker's limit and the
/// connector's are both 5.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_refused_retriably_under_tolerance_none_fails_the_task_at_its_last_delivery() {
    poison_under_tolerance_none(true, 5).await;
}

/// The same poison record, failing retriably for ever (a target that never takes it), with
/// errors.tolerance=all and a dead letter queue: it is retried within its locks and released
/// while deliveries are left, and on its last allowed delivery written to the dead letter
/// queue with a reason header naming the limit — never archived by the broker.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_still_failing_on_its_last_delivery_goes_to_the_dead_letter_queue_with_the_reason()
{
    let broker = share_broker(1, 1_500, 10_000);
    broker.set_share_max_delivery_attempts(5);
    broker.create_topic("stuck", 3);
    broker.create_topic("stuck-dlq", 1);
    let produced = produce(&broker.bootstrap(), "stuck", json_records(150, 3), "none").await;
    let (partition, offset) = poison_of(&produced, 42);
    let poison = format!("{partition}:{offset}");
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "stuck"),
            ("connector.class", "probe"),
            ("probe.id", "stuck"),
            ("probe.poison", &poison),
            ("probe.poison.retriable", "true"),
            ("topics", "stuck"),
            ("tasks.max", "2"),
            ("consumer.override.group.protocol", "share"),
            ("group.share.delivery.count.limit", "5"),
            ("share.retry.lock.margin.ms", "300"),
            ("errors.retry.delay.max.ms", "2000"),
            ("errors.tolerance", "all"),
            ("errors.deadletterqueue.topic.name", "stuck-dlq"),
        ]))
        .await
        .expect("connector starts");
    wait_until(Duration::from_secs(90), "one dead letter", || {
        worker
            .status("stuck")
            .is_some_and(|s| s.totals().dead_lettered >= 1)
    })
    .await;
    let p = probe("stuck");
    wait_until(Duration::from_secs(30), "every other record", || {
        p.distinct() >= 149
    })
    .await;

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "stuck-dlq-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("dlq reader");
    consumer.subscribe(&["stuck-dlq"]).expect("subscribes");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut letters = Vec::new();
    while letters.is_empty() && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let headers: BTreeMap<String, String> = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            letters.push((m.payload().map(<[u8]>::to_vec), headers));
        }
    }
    let (value, headers) = letters.first().expect("the dead letter");
    assert_eq!(
        value.as_deref(),
        Some(&b"{\"n\":42}"[..]),
        "the original value"
    );
    let reason = headers
        .get("__connect.errors.reason")
        .unwrap_or_else(|| panic!("a reason header: {headers:?}"));
    assert!(
        reason.contains("last allowed delivery")
            && reason.contains("group.share.delivery.count.limit=5"),
        "{reason}"
    );
    let status = worker.status("stuck").expect("registered");
    assert!(
        status.tasks.iter().all(|t| t.state == State::Running),
        "{status:?}"
    );
    assert_eq!(status.totals().dead_lettered, 1);
    assert_nothing_archived(&worker, "stuck");
    worker.shutdown().await;
}

/// Issue 14's endless loop: an exactly-once kafka sink on a share group whose lock (4 s) is
/// not longer than `delivery.lock.margin.ms` (5 s) aborted every transaction and released
/// every batch for ever. Now the task fails for good within one lock duration of reading its
/// first records, naming both values and the settings to change.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_shorter_than_the_exactly_once_margin_fails_the_task_within_one_lock_duration() {
    let broker = share_broker(1, 4_000, 10_000);
    broker.create_topic("src", 3);
    broker.create_topic("out.src", 3);
    broker.create_topic("ledger", 3);
    produce(&broker.bootstrap(), "src", json_records(60, 3), "none").await;
    let cache = tempfile::tempdir().expect("tempdir");
    let worker = worker(&broker);
    worker
        .start_connector(config(&[
            ("name", "mirror"),
            ("connector.class", "kafka"),
            ("topics", "src"),
            ("tasks.max", "1"),
            ("topic.rename.format", "out.${topic}"),
            ("consumer.override.group.protocol", "share"),
            ("delivery.guarantee", "exactly_once"),
            ("delivery.ledger.topic", "ledger"),
            ("delivery.ledger.cache.dir", &cache.path().to_string_lossy()),
        ]))
        .await
        .expect("connector starts");
    let task = || {
        worker
            .status("mirror")
            .and_then(|s| s.tasks.first().cloned())
    };
    wait_until(Duration::from_secs(60), "the task read records", || {
        task().is_some_and(|t| t.counts.read > 0)
    })
    .await;
    let read_at = Instant::now();
    wait_until(Duration::from_secs(30), "the task FAILED", || {
        task().is_some_and(|t| t.state == State::Failed)
    })
    .await;
    let failed_after = read_at.elapsed();
    let t = task().expect("the task");
    let trace = t.trace.expect("a trace");
    assert!(
        failed_after < Duration::from_secs(4),
        "failed {failed_after:?} after reading, more than one lock duration: {trace}"
    );
    for needed in [
        "4000 ms",
        "delivery.lock.margin.ms=5000",
        "share.record.lock.duration.ms",
    ] {
        assert!(trace.contains(needed), "{needed:?} not in: {trace}");
    }
    assert_eq!(t.restarts, 0, "a restart cannot help: it stays FAILED");
    assert_eq!(t.counts.accepted, 0);
    assert_nothing_archived(&worker, "mirror");
    worker.shutdown().await;
}
