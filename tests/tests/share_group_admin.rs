//! Issue 14, items 1, 2 and 8: a share connector sets its group's configs through Kafka's admin
//! API before its tasks run, creates the dead letter queue topic, and answers the offsets API
//! through the share-group offsets APIs.
//!
//! The plain dev broker has no admin APIs: there the degraded path is tested (a WARN and a
//! status naming what is in force; a FAILED task when an explicit earliest cannot be had).

mod runtime_support;

use std::time::Duration;

use runtime_support::{config, probe, wait_until, worker};
use spillway_actors::State;
use spillway_tests::{numbered_records, produce, DevBroker};

/// A dev broker left at Kafka's share-group default (latest), short heartbeats.
fn latest_broker() -> DevBroker {
    let broker = DevBroker::start(1);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(10_000);
    broker
}

fn probe_connector(name: &str, topic: &str, extra: &[(&str, &str)]) -> spillway_core::ConfigMap {
    let mut c = config(&[
        ("name", name),
        ("connector.class", "probe"),
        ("topics", topic),
        ("tasks.max", "1"),
        ("probe.id", name),
        ("consumer.override.group.protocol", "share"),
    ]);
    for (k, v) in extra {
        c.insert((*k).to_owned(), (*v).to_owned());
    }
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_admin_apis_a_share_connector_runs_and_its_status_says_what_is_unknown() {
    let broker = latest_broker();
    broker.create_topic("plain", 1);
    let worker = worker(&broker);
    worker
        .start_connector(probe_connector("plain", "plain", &[]))
        .await
        .expect("starts");
    wait_until(Duration::from_secs(30), "the settings report", || {
        worker
            .status("plain")
            .is_some_and(|s| s.group_settings.is_some())
    })
    .await;
    let status = worker.status("plain").expect("registered");
    let report = status.group_settings.clone().expect("report");
    assert_eq!(report.group, "connect-plain");
    let warnings = report.warnings.join("\n");
    assert!(
        warnings.contains("cannot describe group configs")
            && warnings.contains("does not support DescribeConfigs"),
        "{warnings}"
    );
    let reset = report
        .settings
        .iter()
        .find(|s| s.name == "share.auto.offset.reset")
        .expect("listed");
    assert_eq!(reset.value, None);
    assert!(reset.source.contains("Kafka's default: latest"), "{reset:?}");
    wait_until(Duration::from_secs(30), "the task running", || {
        worker
            .status("plain")
            .is_some_and(|s| s.tasks.len() == 1 && s.tasks[0].state == State::Running)
    })
    .await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_admin_apis_an_explicit_earliest_for_a_new_group_fails_its_task() {
    let broker = latest_broker();
    broker.create_topic("backlog", 1);
    produce(
        &broker.bootstrap(),
        "backlog",
        numbered_records(10, 8, 1),
        "none",
    )
    .await;
    let worker = worker(&broker);
    worker
        .start_connector(probe_connector(
            "explicit",
            "backlog",
            &[("consumer.override.auto.offset.reset", "earliest")],
        ))
        .await
        .expect("a valid configuration");
    wait_until(Duration::from_secs(30), "the task failed", || {
        worker
            .status("explicit")
            .is_some_and(|s| s.tasks.len() == 1 && s.tasks[0].state == State::Failed)
    })
    .await;
    let status = worker.status("explicit").expect("registered");
    let trace = status.tasks[0].trace.clone().expect("a trace");
    for part in [
        "share group 'connect-explicit' is new",
        "consumer.override.auto.offset.reset",
        "does not support DescribeConfigs",
        "kafka-configs.sh",
    ] {
        assert!(trace.contains(part), "{part}: {trace}");
    }
    assert!(
        probe("explicit").received().is_empty(),
        "no task ran, so nothing was skipped"
    );
    worker.shutdown().await;
}
