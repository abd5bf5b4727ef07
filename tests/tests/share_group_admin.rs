//! Issue 14, items 1, 2 and 8: a share connector sets its group's configs through Kafka's admin
//! API before its tasks run, creates the dead letter queue topic, and answers the offsets API
//! through the share-group offsets APIs.
//!
//! The plain dev broker has no admin APIs: there the degraded path is tested (a WARN and a
//! status naming what is in force; a FAILED task when an explicit earliest cannot be had).

mod runtime_support;

use std::time::Duration;

use runtime_support::{config, probe, wait_until, worker};
use spillway_actors::share_group::{GroupSettingsReport, SettingInForce};
use spillway_actors::{State, Worker};
use spillway_connectors::ConnectorRegistry;
use spillway_eos::ledger_reader::LedgerReader;
use spillway_kafka::admin::{AdminClient, AlterOp, ConfigResource, ConfigSource};
use spillway_kafka::cluster::Cluster;
use spillway_kafka::security::ClientSecurity;
use spillway_tests::kafka_proxy::AdminOperation;
use spillway_tests::{
    numbered_records, produce, DevBroker, KafkaProxy, ProxyOptions, ProxySecurity, SaslMechanism,
};

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
    assert_eq!(report.group, "connect-share-plain");
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
    assert!(
        reset.source.contains("Kafka's default: latest"),
        "{reset:?}"
    );
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
        "share group 'connect-share-explicit' is new",
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

// ---- Through the test-kit proxy, which answers the admin APIs as Kafka 4.2 does. ----

/// A dev broker left at Kafka's default (latest), behind a proxy emulating the admin APIs.
struct Emulated {
    broker: DevBroker,
    proxy: KafkaProxy,
}

fn emulated(options: impl FnOnce(ProxyOptions) -> ProxyOptions) -> Emulated {
    let broker = latest_broker();
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        options(ProxyOptions::new(ProxySecurity::Plaintext)).with_admin_emulation(broker.control()),
    )
    .expect("proxy starts");
    Emulated { broker, proxy }
}

impl Emulated {
    fn worker(&self) -> Worker {
        Worker::start(
            config(&[
                ("bootstrap.servers", &self.proxy.bootstrap()),
                ("task.restart.backoff.ms", "200"),
                ("task.restart.max.attempts", "0"),
                ("task.poll.timeout.ms", "100"),
            ]),
            ConnectorRegistry::builtin().with(&["probe"], || {
                Box::new(runtime_support::ProbeConnector::default())
            }),
        )
        .expect("worker starts")
    }

    /// An admin client of its own, as another team's tool would be.
    async fn admin(&self) -> AdminClient {
        AdminClient::connect(
            &self.proxy.bootstrap(),
            "someone-else",
            Duration::from_secs(10),
            ClientSecurity::plaintext(),
        )
        .await
        .expect("admin client")
    }
}

async fn report_of(worker: &Worker, name: &str) -> GroupSettingsReport {
    wait_until(Duration::from_secs(30), "the settings report", || {
        worker
            .status(name)
            .is_some_and(|s| s.group_settings.is_some())
    })
    .await;
    worker
        .status(name)
        .and_then(|s| s.group_settings)
        .expect("report")
}

fn setting<'a>(report: &'a GroupSettingsReport, name: &str) -> &'a SettingInForce {
    report
        .settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} in {report:?}"))
}

async fn wait_running(worker: &Worker, name: &str) {
    wait_until(Duration::from_secs(30), "the task running", || {
        worker.status(name).is_some_and(|s| {
            !s.tasks.is_empty() && s.tasks.iter().all(|t| t.state == State::Running)
        })
    })
    .await;
}

async fn wait_failed(worker: &Worker, name: &str) -> String {
    wait_until(Duration::from_secs(30), "the task failed", || {
        worker
            .status(name)
            .is_some_and(|s| !s.tasks.is_empty() && s.tasks[0].state == State::Failed)
    })
    .await;
    worker.status(name).expect("registered").tasks[0]
        .trace
        .clone()
        .expect("a trace")
}

/// The issue's first "done when": a new share connector on a topic with 10,000 existing
/// records delivers all of them, with the broker left at Kafka's default (latest).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_share_connector_delivers_the_whole_backlog_with_the_broker_left_at_latest() {
    let setup = emulated(|o| o);
    setup.broker.create_topic("backlog", 4);
    produce(
        &setup.broker.bootstrap(),
        "backlog",
        numbered_records(10_000, 32, 4),
        "lz4",
    )
    .await;
    let worker = setup.worker();
    worker
        .start_connector(probe_connector("fresh", "backlog", &[("tasks.max", "2")]))
        .await
        .expect("starts");
    let probe = probe("fresh");
    wait_until(
        Duration::from_secs(90),
        "all 10,000 records delivered",
        || probe.distinct() == 10_000,
    )
    .await;
    let report = report_of(&worker, "fresh").await;
    let reset = setting(&report, "share.auto.offset.reset");
    assert_eq!(reset.value.as_deref(), Some("earliest"), "{report:?}");
    assert!(reset.source.contains("set by Spillway"), "{reset:?}");
    assert!(report.warnings.is_empty(), "{report:?}");
    // The group really has it (another client reads it back).
    let configs = setup
        .admin()
        .await
        .describe_configs(&ConfigResource::Group("connect-share-fresh".into()), &[])
        .await
        .expect("describe");
    let entry = configs.get("share.auto.offset.reset").expect("listed");
    assert_eq!(entry.value.as_deref(), Some("earliest"));
    assert_eq!(entry.source, ConfigSource::Group);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_someone_else_set_on_the_group_is_kept_and_an_explicit_one_replaces_it_loudly() {
    let setup = emulated(|o| o);
    setup.broker.create_topic("shared", 1);
    setup.broker.set_share_max_delivery_attempts(7);
    let admin = setup.admin().await;
    for group in ["connect-share-kept", "connect-share-replaced"] {
        admin
            .incremental_alter_configs(
                &ConfigResource::Group(group.into()),
                &[("share.auto.offset.reset", AlterOp::Set("latest".into()))],
            )
            .await
            .expect("someone else sets latest");
    }
    let worker = setup.worker();
    worker
        .start_connector(probe_connector("kept", "shared", &[]))
        .await
        .expect("starts");
    let report = report_of(&worker, "kept").await;
    let reset = setting(&report, "share.auto.offset.reset");
    assert_eq!(reset.value.as_deref(), Some("latest"), "{report:?}");
    assert!(
        reset
            .source
            .contains("set on the group (by someone else; kept"),
        "{reset:?}"
    );
    assert_eq!(
        report.delivery_count_limit,
        Some(7),
        "the brokers' group.share.delivery.count.limit"
    );
    wait_running(&worker, "kept").await;

    worker
        .start_connector(probe_connector(
            "replaced",
            "shared",
            &[("consumer.override.auto.offset.reset", "earliest")],
        ))
        .await
        .expect("starts");
    let report = report_of(&worker, "replaced").await;
    let reset = setting(&report, "share.auto.offset.reset");
    assert_eq!(reset.value.as_deref(), Some("earliest"), "{report:?}");
    assert!(
        reset.source.contains("consumer.override.auto.offset.reset"),
        "{reset:?}"
    );
    let warnings = report.warnings.join("\n");
    assert!(
        warnings.contains("was latest on the group; replaced with earliest"),
        "{warnings}"
    );
    // The first group still has the other team's value.
    let kept = admin
        .describe_configs(&ConfigResource::Group("connect-share-kept".into()), &[])
        .await
        .expect("describe");
    assert_eq!(
        kept.get("share.auto.offset.reset")
            .and_then(|e| e.value.as_deref()),
        Some("latest")
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_alter_configs_permission_the_connector_warns_or_fails_for_an_explicit_earliest() {
    let setup = emulated(|o| o.with_denied_operation(AdminOperation::AlterConfigs));
    setup.broker.create_topic("guarded", 1);
    let worker = setup.worker();
    worker
        .start_connector(probe_connector("lenient", "guarded", &[]))
        .await
        .expect("starts");
    let report = report_of(&worker, "lenient").await;
    let warnings = report.warnings.join("\n");
    assert!(
        warnings.contains("ALTER_CONFIGS") && warnings.contains("group 'connect-share-lenient'"),
        "{warnings}"
    );
    let reset = setting(&report, "share.auto.offset.reset");
    assert_eq!(reset.value.as_deref(), Some("latest"), "{report:?}");
    assert!(reset.source.contains("not set on the group"), "{reset:?}");
    wait_running(&worker, "lenient").await;

    worker
        .start_connector(probe_connector(
            "strict",
            "guarded",
            &[("consumer.override.auto.offset.reset", "earliest")],
        ))
        .await
        .expect("a valid configuration");
    let trace = wait_failed(&worker, "strict").await;
    for part in [
        "share group 'connect-share-strict' is new",
        "consumer.override.auto.offset.reset",
        "ALTER_CONFIGS",
    ] {
        assert!(trace.contains(part), "{part}: {trace}");
    }
    // Once the permission is granted, restarting the task sets the group up and runs it.
    setup
        .proxy
        .admin()
        .expect("emulating")
        .allow(AdminOperation::AlterConfigs);
    worker.restart_task("strict", 0).await.expect("restart");
    wait_running(&worker, "strict").await;
    let report = report_of(&worker, "strict").await;
    assert_eq!(
        setting(&report, "share.auto.offset.reset").value.as_deref(),
        Some("earliest"),
        "{report:?}"
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dead_letter_topic_is_created_and_a_refusal_names_the_topic_and_permission() {
    let setup = emulated(|o| o);
    setup.broker.create_topic("input", 1);
    let worker = setup.worker();
    let dlq = |name: &str, topic: &str, rf: &str| {
        probe_connector(
            name,
            "input",
            &[
                ("errors.tolerance", "all"),
                ("errors.deadletterqueue.topic.name", topic),
                ("errors.deadletterqueue.topic.replication.factor", rf),
            ],
        )
    };
    worker
        .start_connector(dlq("with-dlq", "dlq-made", "1"))
        .await
        .expect("starts");
    wait_running(&worker, "with-dlq").await;
    let cluster = Cluster::connect(&setup.proxy.bootstrap(), "check", Duration::from_secs(10))
        .await
        .expect("cluster");
    cluster
        .refresh_metadata(&["dlq-made".to_owned()])
        .await
        .expect("metadata");
    assert_eq!(
        cluster.topic("dlq-made").map(|t| t.leaders.len()),
        Some(1),
        "created with one partition"
    );

    // Connect's default replication factor (3) on a one-broker cluster: refused by Kafka.
    worker
        .start_connector(dlq("three", "dlq-three", "3"))
        .await
        .expect("a valid configuration");
    let trace = wait_failed(&worker, "three").await;
    assert!(
        trace.contains("'dlq-three'")
            && trace.contains("errors.deadletterqueue.topic.replication.factor"),
        "{trace}"
    );

    setup
        .proxy
        .admin()
        .expect("emulating")
        .deny(AdminOperation::Create);
    worker
        .start_connector(dlq("refused", "dlq-refused", "1"))
        .await
        .expect("a valid configuration");
    let trace = wait_failed(&worker, "refused").await;
    assert!(
        trace.contains("'dlq-refused'") && trace.contains("CREATE"),
        "{trace}"
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_topic_is_created_compacted_and_a_refusal_names_the_topic_and_permission() {
    let setup = emulated(|o| o);
    let dir = tempfile::tempdir().expect("temp dir");
    let reader = LedgerReader::open(
        &setup.proxy.bootstrap(),
        "ledger-made",
        &dir.path().join("a"),
        "ledger-test",
        &ClientSecurity::plaintext(),
    )
    .await
    .expect("the missing ledger topic is created and opened");
    drop(reader);
    let configs = setup
        .admin()
        .await
        .describe_configs(
            &ConfigResource::Topic("ledger-made".into()),
            &["cleanup.policy"],
        )
        .await
        .expect("topic configs");
    assert_eq!(
        configs
            .get("cleanup.policy")
            .and_then(|e| e.value.as_deref()),
        Some("compact")
    );
    setup
        .proxy
        .admin()
        .expect("emulating")
        .deny(AdminOperation::Create);
    let err = LedgerReader::open(
        &setup.proxy.bootstrap(),
        "ledger-refused",
        &dir.path().join("b"),
        "ledger-test",
        &ClientSecurity::plaintext(),
    )
    .await
    .err()
    .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("'ledger-refused'") && text.contains("CREATE"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_duration_the_brokers_refuse_does_not_keep_the_start_position_out() {
    let setup = emulated(|o| o);
    setup.broker.create_topic("bounded", 1);
    let worker = setup.worker();
    worker
        .start_connector(probe_connector(
            "bounded",
            "bounded",
            &[
                ("consumer.override.share.record.lock.duration.ms", "3600000"),
                ("consumer.override.isolation.level", "read_committed"),
            ],
        ))
        .await
        .expect("within Kafka's own bounds");
    let report = report_of(&worker, "bounded").await;
    let warnings = report.warnings.join("\n");
    assert!(
        warnings.contains("could not set share.record.lock.duration.ms=3600000"),
        "{warnings}"
    );
    for (name, value, from) in [
        (
            "share.auto.offset.reset",
            "earliest",
            "set by Spillway (its default",
        ),
        (
            "share.isolation.level",
            "read_committed",
            "set by Spillway from consumer.override.isolation.level",
        ),
    ] {
        let s = setting(&report, name);
        assert_eq!(s.value.as_deref(), Some(value), "{report:?}");
        assert!(s.source.starts_with(from), "{s:?}");
    }
    let lock = setting(&report, "share.record.lock.duration.ms");
    assert_ne!(lock.value.as_deref(), Some("3600000"), "{report:?}");
    assert!(lock.source.contains("not set on the group"), "{lock:?}");
    wait_running(&worker, "bounded").await;
    worker.shutdown().await;
}

/// The admin client opens its connections as the connector's consumer settings say (TLS and
/// SASL), like the share consumer.
#[tokio::test(flavor = "multi_thread")]
async fn group_settings_are_set_over_sasl_ssl_with_the_consumers_security_settings() {
    let setup = emulated(|_| {
        ProxyOptions::new(ProxySecurity::SaslSsl)
            .with_mechanisms(&[SaslMechanism::ScramSha512])
            .with_user("alice", "alice-secret")
    });
    setup.broker.create_topic("secured", 1);
    let ca = setup
        .proxy
        .pki()
        .expect("TLS on")
        .ca_path
        .display()
        .to_string();
    let worker = Worker::start(
        config(&[
            ("bootstrap.servers", &setup.proxy.bootstrap()),
            ("task.poll.timeout.ms", "100"),
            ("consumer.security.protocol", "SASL_SSL"),
            ("consumer.ssl.truststore.type", "PEM"),
            ("consumer.ssl.truststore.location", &ca),
            ("consumer.sasl.mechanism", "SCRAM-SHA-512"),
            (
                "consumer.sasl.jaas.config",
                r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="alice-secret";"#,
            ),
        ]),
        ConnectorRegistry::builtin()
            .with(&["probe"], || Box::new(runtime_support::ProbeConnector::default())),
    )
    .expect("worker starts");
    worker
        .start_connector(probe_connector("secured", "secured", &[]))
        .await
        .expect("starts");
    let report = report_of(&worker, "secured").await;
    assert!(report.warnings.is_empty(), "{report:?}");
    assert_eq!(
        setting(&report, "share.auto.offset.reset").value.as_deref(),
        Some("earliest"),
        "{report:?}"
    );
    wait_running(&worker, "secured").await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_change_sets_the_group_again() {
    let setup = emulated(|o| o);
    setup.broker.create_topic("changing", 1);
    let worker = setup.worker();
    worker
        .start_connector(probe_connector("changing", "changing", &[]))
        .await
        .expect("starts");
    let report = report_of(&worker, "changing").await;
    assert_eq!(
        setting(&report, "share.record.lock.duration.ms")
            .value
            .as_deref(),
        Some("30000"),
        "{report:?}"
    );
    wait_running(&worker, "changing").await;
    worker
        .reconfigure_connector(probe_connector(
            "changing",
            "changing",
            &[("consumer.override.share.record.lock.duration.ms", "20000")],
        ))
        .await
        .expect("reconfigured");
    wait_until(
        Duration::from_secs(30),
        "the new lock duration in force",
        || {
            worker
                .status("changing")
                .and_then(|s| s.group_settings)
                .is_some_and(|r| {
                    setting(&r, "share.record.lock.duration.ms")
                        .value
                        .as_deref()
                        == Some("20000")
                })
        },
    )
    .await;
    let report = report_of(&worker, "changing").await;
    assert!(
        setting(&report, "share.record.lock.duration.ms")
            .source
            .contains("consumer.override.share.record.lock.duration.ms"),
        "{report:?}"
    );
    wait_running(&worker, "changing").await;
    worker.shutdown().await;
}

// ---- KIP-1302 migration: the share group starts where the consumer group left off. ----

fn classic_probe_connector(name: &str, topic: &str) -> spillway_core::ConfigMap {
    let mut c = probe_connector(name, topic, &[]);
    c.remove("consumer.override.group.protocol");
    c
}

/// A connector moved from classic to share mode: its new share group `connect-share-<name>`
/// gets the consumer group `connect-<name>`'s committed offsets as its start offsets
/// (AlterShareGroupOffsets before the tasks join), and its status says so. The proxy keeps
/// the start offsets as Kafka's share coordinator would (the mock cannot move a
/// share-partition's start), so the copy is checked there.
#[tokio::test(flavor = "multi_thread")]
async fn a_connector_moved_to_share_mode_starts_its_share_group_where_the_consumer_group_left_off()
{
    let e = emulated(|o| o);
    e.broker.create_topic("moves", 2);
    let produced = produce(
        &e.broker.bootstrap(),
        "moves",
        numbered_records(200, 32, 2),
        "none",
    )
    .await;
    let mut per_partition = std::collections::BTreeMap::new();
    for r in &produced {
        let next = per_partition
            .entry(("moves".to_owned(), r.partition))
            .or_insert(0);
        *next = (*next).max(r.offset + 1);
    }
    let worker = e.worker();
    let p = probe("mover");
    worker
        .start_connector(classic_probe_connector("mover", "moves"))
        .await
        .expect("classic mode starts");
    wait_until(Duration::from_secs(30), "classic mode reads all", || {
        p.distinct() >= 200
    })
    .await;

    // KIP-1302: the share setting is added; the classic tasks stop (committing their
    // offsets), then the share group is prepared before its tasks join.
    worker
        .reconfigure_connector(probe_connector("mover", "moves", &[]))
        .await
        .expect("moves to share mode");
    let report = report_of(&worker, "mover").await;
    let positions = report.start_positions.clone().unwrap_or_default();
    assert!(
        positions.contains("copied from consumer group 'connect-mover'"),
        "{report:?}"
    );
    assert!(
        positions.contains("moves-0@") && positions.contains("moves-1@"),
        "{positions}"
    );
    assert_eq!(
        e.proxy
            .admin()
            .expect("emulated")
            .share_start_offsets("connect-share-mover"),
        per_partition,
        "the share group starts at the consumer group's committed offsets"
    );

    // Moved again later (share → classic → share), the share group has start offsets of its
    // own and keeps them: nothing is copied over them.
    let mut altered = per_partition.clone();
    for offset in altered.values_mut() {
        *offset += 1_000;
    }
    worker
        .reconfigure_connector(classic_probe_connector("mover", "moves"))
        .await
        .expect("rolls back");
    wait_until(Duration::from_secs(30), "the share member left", || {
        e.broker.share_member_ids("connect-share-mover").is_empty()
    })
    .await;
    let someone = e.admin().await;
    let offsets: Vec<(String, i32, i64)> = altered
        .iter()
        .map(|((t, p), o)| (t.clone(), *p, *o))
        .collect();
    someone
        .alter_share_offsets("connect-share-mover", &offsets)
        .await
        .expect("the share group is empty");
    worker
        .reconfigure_connector(probe_connector("mover", "moves", &[]))
        .await
        .expect("migrates again");
    wait_until(
        Duration::from_secs(30),
        "the share group keeps its own start offsets",
        || {
            worker
                .status("mover")
                .and_then(|s| s.group_settings)
                .and_then(|r| r.start_positions)
                .is_some_and(|s| s.starts_with("kept"))
        },
    )
    .await;
    assert_eq!(
        e.proxy
            .admin()
            .expect("emulated")
            .share_start_offsets("connect-share-mover"),
        altered
    );
    worker.shutdown().await;
}

/// Without the share-group offsets APIs (the plain dev broker, a Kafka before 4.1) the
/// positions cannot be copied: the status and a WARN say so and what happens instead.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_share_offsets_apis_a_moved_connector_is_told_where_its_share_group_starts() {
    let broker = latest_broker();
    broker.create_topic("stays", 1);
    produce(
        &broker.bootstrap(),
        "stays",
        numbered_records(50, 32, 1),
        "none",
    )
    .await;
    let worker = worker(&broker);
    let p = probe("stayer");
    worker
        .start_connector(classic_probe_connector("stayer", "stays"))
        .await
        .expect("classic mode starts");
    wait_until(Duration::from_secs(30), "classic mode reads all", || {
        p.distinct() >= 50
    })
    .await;
    worker
        .reconfigure_connector(probe_connector("stayer", "stays", &[]))
        .await
        .expect("moves to share mode");
    let report = report_of(&worker, "stayer").await;
    let positions = report.start_positions.clone().unwrap_or_default();
    assert!(
        positions.contains("not copied from consumer group 'connect-stayer'")
            && positions.contains("needs Kafka 4.1 or later")
            && positions.contains("share.auto.offset.reset"),
        "{report:?}"
    );
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("positions of consumer group 'connect-stayer' were not copied")),
        "{report:?}"
    );
    worker.shutdown().await;
}

/// Where the cluster can list groups, only a share group that does not exist yet takes the
/// consumer group's positions: one whose start offsets were deleted on purpose (the offsets
/// API's DELETE, to start at share.auto.offset.reset) is not set back to the consumer group's.
#[tokio::test(flavor = "multi_thread")]
async fn an_existing_share_group_whose_offsets_were_deleted_is_not_given_the_consumer_groups() {
    let e = emulated(|o| o.with_one_group_namespace());
    e.broker.create_topic("resets", 1);
    produce(
        &e.broker.bootstrap(),
        "resets",
        numbered_records(40, 32, 1),
        "none",
    )
    .await;
    let worker = e.worker();
    let p = probe("resetter");
    worker
        .start_connector(classic_probe_connector("resetter", "resets"))
        .await
        .expect("classic mode starts");
    wait_until(Duration::from_secs(30), "classic mode reads all", || {
        p.distinct() >= 40
    })
    .await;
    worker
        .reconfigure_connector(probe_connector("resetter", "resets", &[]))
        .await
        .expect("moves to share mode");
    let report = report_of(&worker, "resetter").await;
    assert!(
        report
            .start_positions
            .as_deref()
            .is_some_and(|s| s.contains("copied from consumer group 'connect-resetter'")),
        "a new share group takes the positions: {report:?}"
    );
    let admin = e.proxy.admin().expect("emulated");
    assert_eq!(
        admin.share_start_offsets("connect-share-resetter"),
        [(("resets".to_owned(), 0), 40)].into_iter().collect()
    );

    // Back to classic, the share group's start offsets deleted, then share mode again.
    worker
        .reconfigure_connector(classic_probe_connector("resetter", "resets"))
        .await
        .expect("rolls back");
    wait_until(Duration::from_secs(30), "the share member left", || {
        e.broker
            .share_member_ids("connect-share-resetter")
            .is_empty()
    })
    .await;
    e.admin()
        .await
        .delete_share_offsets("connect-share-resetter", &["resets".to_owned()])
        .await
        .expect("the share group is empty");
    assert!(admin
        .share_start_offsets("connect-share-resetter")
        .is_empty());
    worker
        .reconfigure_connector(probe_connector("resetter", "resets", &[]))
        .await
        .expect("migrates again");
    wait_until(
        Duration::from_secs(30),
        "the existing share group is left alone",
        || {
            worker
                .status("resetter")
                .and_then(|s| s.group_settings)
                .and_then(|r| r.start_positions)
                .is_some_and(|s| s.contains("share group 'connect-share-resetter' exists"))
        },
    )
    .await;
    assert!(
        admin
            .share_start_offsets("connect-share-resetter")
            .is_empty(),
        "nothing copied over the deletion"
    );
    worker.shutdown().await;
}
