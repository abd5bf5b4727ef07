//! Issue 13 item 3, last point: a broker without share groups, and heartbeat authorization
//! errors, end as a FAILED task whose trace names the broker requirement or the ACL to grant —
//! not a RUNNING connector that never receives a record.
//!
//! An older broker is the dev broker with ShareGroupHeartbeat removed from its ApiVersions
//! (launcher `set_api_version`); a Kafka 4.1 broker with share groups off answers
//! UNSUPPORTED_VERSION, and a broker with ACLs answers GROUP_/TOPIC_AUTHORIZATION_FAILED: the
//! test-kit proxy injects those answers.

mod runtime_support;

use std::time::{Duration, Instant};

use runtime_support::{config, share_broker};
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_tests::{DevBroker, KafkaProxy, ProxyOptions, ProxySecurity};

const SHARE_GROUP_HEARTBEAT: i16 = 76;

/// Starts a share-mode file sink on `bootstrap` and waits (at most 10 s, the bound) for
/// its task to end FAILED; returns the task's trace.
async fn failed_trace(bootstrap: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let worker = Worker::start(
        config(&[
            ("bootstrap.servers", bootstrap),
            ("task.poll.timeout.ms", "100"),
            // A requirement the broker does not meet cannot come right on a restart.
            ("task.restart.max.attempts", "0"),
        ]),
        ConnectorRegistry::builtin(),
    )
    .expect("worker starts");
    let file = dir.path().join("out.txt");
    worker
        .start_connector(config(&[
            ("name", "needs-share-groups"),
            ("connector.class", "file"),
            ("file", file.to_str().expect("utf-8")),
            ("topics", "orders"),
            ("consumer.override.group.protocol", "share"),
        ]))
        .await
        .expect("connector starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    let trace = loop {
        let status = worker.status("needs-share-groups").expect("registered");
        if let Some(task) = status.tasks.iter().find(|t| t.state == State::Failed) {
            break task.trace.clone().unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "no FAILED task within 10 s; status: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    worker.shutdown().await;
    trace
}

fn broker() -> DevBroker {
    let broker = share_broker(1, 5_000, 10_000);
    broker.create_topic("orders", 2);
    broker
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_without_share_groups_fails_the_task_naming_the_requirement() {
    let broker = broker();
    broker.set_api_version(SHARE_GROUP_HEARTBEAT, -1, -1);
    let trace = failed_trace(&broker.bootstrap()).await;
    assert!(
        trace.contains("Apache Kafka 4.1") && trace.contains("share.version"),
        "{trace}"
    );
}

/// The trace of a share task whose every heartbeat the proxy answers with `code`.
async fn failed_trace_with_heartbeat_error(code: i16) -> String {
    let broker = broker();
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext),
    )
    .expect("proxy");
    proxy
        .faults()
        .inject_error(SHARE_GROUP_HEARTBEAT, code, 1_000)
        .expect("injectable");
    failed_trace(&proxy.bootstrap()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn share_groups_switched_off_fail_the_task_naming_the_requirement() {
    // UNSUPPORTED_VERSION: what Kafka 4.1 answers while share.version is 0.
    let trace = failed_trace_with_heartbeat_error(35).await;
    assert!(trace.contains("error 35"), "{trace}");
    assert!(trace.contains("share.version=1"), "{trace}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_authorization_failure_fails_the_task_naming_the_group_acl() {
    let trace = failed_trace_with_heartbeat_error(30).await;
    assert!(
        trace.contains("READ on GROUP") && trace.contains("--operation Read --group"),
        "{trace}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_authorization_failure_on_the_heartbeat_fails_the_task_naming_the_topic_acl() {
    let trace = failed_trace_with_heartbeat_error(29).await;
    assert!(
        trace.contains("READ on each TOPIC") && trace.contains("orders"),
        "{trace}"
    );
}
