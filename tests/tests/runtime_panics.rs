//! A task that panics or fails gives its records back at once: they reach a task again well
//! within one acquisition lock (30 s here), the failure (a panic's message and location) is in
//! the task's status, and the connector's restart policy applies. A connector whose plugin
//! panics in its lifecycle ends FAILED with the panic in its trace.

mod runtime_support;

use std::time::{Duration, Instant};

use runtime_support::{config, coordinates, probe, share_broker, wait_until, Faults, Probe};
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::ConfigDef;
use spillway_core::{ConfigError, ConfigMap, SinkConnector, SinkTask};
use spillway_tests::{numbered_records, produce, DeliveryReport};

/// Far longer than any wait below: a record that waited for its lock would fail the test.
const LOCK_MS: i32 = 30_000;
const SESSION_MS: i32 = 20_000;
/// What "at once" means here: the task releases a lost batch within milliseconds (the unit
/// tests in `actors/src/task.rs` bound that), but the dev broker moves a partition to another
/// member only at that member's next heartbeat, every 5 s on the mock; then a fetch. A third
/// of the lock duration still tells a release from a lock that ran out.
const REDELIVERY_BOUND: Duration = Duration::from_secs(10);

async fn start_probe(worker: &Worker, name: &str, extra: &[(&str, &str)]) {
    let mut c = config(&[
        ("name", name),
        ("connector.class", "probe"),
        ("probe.id", name),
        ("topics", name),
        ("tasks.max", "2"),
        ("consumer.override.group.protocol", "share"),
        ("consumer.override.max.poll.records", "50"),
        ("probe.put.delay.ms", "20"),
    ]);
    for (k, v) in extra {
        c.insert((*k).to_owned(), (*v).to_owned());
    }
    worker.start_connector(c).await.expect("connector starts");
}

/// Every record of every faulted batch reached a task again within [`REDELIVERY_BOUND`].
fn assert_redelivered_at_once(probe: &Probe) {
    let faulted = probe.faulted();
    assert!(!faulted.is_empty(), "the fault was injected");
    let received = probe.received();
    for (at, records) in faulted {
        assert!(!records.is_empty());
        for c in records {
            let again = received
                .iter()
                .filter(|r| (r.topic.as_str(), r.partition, r.offset) == (&c.0[..], c.1, c.2))
                .filter(|r| r.at > at)
                .min_by_key(|r| r.at)
                .unwrap_or_else(|| panic!("{c:?} never came back after the fault"));
            let took = again.at.duration_since(at);
            assert!(
                took < REDELIVERY_BOUND,
                "{c:?} came back to task {} {took:?} after the fault (lock: {LOCK_MS} ms)",
                again.task
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_put_fails_the_task_with_its_location_and_its_records_come_back_at_once() {
    let broker = share_broker(1, LOCK_MS, SESSION_MS);
    let name = "panic-put";
    broker.create_topic(name, 4);
    let produced = produce(
        &broker.bootstrap(),
        name,
        numbered_records(600, 16, 4),
        "none",
    )
    .await;
    let probe = probe(name);
    probe.inject(Faults {
        panic_in: Some("put"),
        panics: 1,
        task: Some(0),
        ..Faults::default()
    });
    let worker = runtime_support::worker(&broker);
    // A long backoff keeps the task RESTARTING long enough to read its trace.
    start_probe(&worker, name, &[("task.restart.backoff.ms", "1500")]).await;

    let mut trace = None;
    wait_until(
        Duration::from_secs(30),
        "task 0 restarting after its panic",
        || {
            let status = worker.status(name).expect("registered");
            let task = &status.tasks[0];
            if task.state == State::Restarting {
                trace = task.trace.clone();
            }
            trace.is_some()
        },
    )
    .await;
    let trace = trace.expect("a trace");
    assert!(trace.contains("injected panic in put (task 0)"), "{trace}");
    assert!(
        trace.contains("panicked at ") && trace.contains("runtime_support/mod.rs:"),
        "the panic's location is in the trace: {trace}"
    );

    wait_until(Duration::from_secs(60), "every record", || {
        probe.distinct() >= 600
    })
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    assert_redelivered_at_once(&probe);
    wait_until(Duration::from_secs(30), "task 0 running again", || {
        worker.status(name).expect("registered").tasks[0].state == State::Running
    })
    .await;
    let status = worker.status(name).expect("registered");
    assert!(
        status.totals().released > 0,
        "the panicked batch was released: {:?}",
        status.totals()
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_flush_releases_its_batch_at_once_and_the_task_is_restarted() {
    let broker = share_broker(1, LOCK_MS, SESSION_MS);
    let name = "flush-fails";
    broker.create_topic(name, 4);
    let produced = produce(
        &broker.bootstrap(),
        name,
        numbered_records(600, 16, 4),
        "none",
    )
    .await;
    let probe = probe(name);
    probe.inject(Faults {
        flush_errors: 1,
        task: Some(1),
        ..Faults::default()
    });
    let worker = runtime_support::worker(&broker);
    start_probe(&worker, name, &[]).await;
    wait_until(Duration::from_secs(60), "every record", || {
        probe.distinct() >= 600
    })
    .await;
    let report = DeliveryReport::compare(coordinates(&produced), probe.coordinates());
    assert!(report.nothing_lost(), "{}", report.summary());
    assert_redelivered_at_once(&probe);
    let status = worker.status(name).expect("registered");
    assert!(
        status.tasks.iter().all(|t| t.state == State::Running),
        "restarted under the restart policy: {:?}",
        status.tasks
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_panics_on_every_put_ends_failed_after_its_restarts() {
    let broker = share_broker(1, LOCK_MS, SESSION_MS);
    let name = "panic-always";
    broker.create_topic(name, 2);
    produce(
        &broker.bootstrap(),
        name,
        numbered_records(100, 16, 2),
        "none",
    )
    .await;
    let probe = probe(name);
    probe.inject(Faults {
        panic_in: Some("put"),
        panics: u32::MAX,
        ..Faults::default()
    });
    let worker = runtime_support::worker(&broker);
    start_probe(
        &worker,
        name,
        &[("task.restart.max.attempts", "2"), ("tasks.max", "1")],
    )
    .await;
    let started = Instant::now();
    wait_until(Duration::from_secs(60), "the task FAILED for good", || {
        worker.status(name).expect("registered").tasks[0].state == State::Failed
    })
    .await;
    let status = worker.status(name).expect("registered");
    let task = &status.tasks[0];
    assert_eq!(
        task.restarts, 3,
        "two restarts, then the third failure stays"
    );
    let trace = task.trace.as_deref().unwrap_or("");
    assert!(trace.contains("injected panic in put"), "{trace}");
    assert!(trace.contains("panicked at "), "{trace}");
    // Each failure released its batch at once: three runs went by in far less than a lock.
    assert!(
        started.elapsed() < Duration::from_millis(LOCK_MS as u64),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(probe.faulted().len(), 3, "each run got the records again");
    worker.shutdown().await;
}

/// A plugin with a bug in `start`.
struct PanickyConnector;

impl SinkConnector for PanickyConnector {
    fn version(&self) -> &str {
        "test"
    }

    fn config_def(&self) -> ConfigDef {
        ConfigDef::new()
    }

    fn start(&mut self, _config: &ConfigMap) -> Result<(), ConfigError> {
        panic!("connector start bug")
    }

    fn task_configs(&self, _max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(Vec::new())
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        unreachable!("never started")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connector_that_panics_in_start_is_failed_with_the_panic_in_its_trace() {
    let worker = Worker::start(
        config(&[("bootstrap.servers", "127.0.0.1:1")]),
        ConnectorRegistry::builtin().with(&["panicky"], || Box::new(PanickyConnector)),
    )
    .expect("worker starts");
    worker
        .start_connector(config(&[
            ("name", "panicky"),
            ("connector.class", "panicky"),
            ("topics", "t"),
            ("consumer.override.group.protocol", "share"),
        ]))
        .await
        .expect("registered (its failure shows in its status)");
    let status = worker.status("panicky").expect("registered");
    assert_eq!(status.state, State::Failed);
    let trace = status.trace.unwrap_or_default();
    assert!(trace.contains("connector start bug"), "{trace}");
    assert!(
        trace.contains("panicked at ") && trace.contains("runtime_panics.rs:"),
        "{trace}"
    );
    // The worker goes on: another connector still starts and stops.
    worker.shutdown().await;
}
