//! Distributed mode's state in Kafka (`spillway_storage::kafka_store`) on the dev broker behind
//! the test-kit proxy, whose admin emulation answers CreateTopics and DescribeConfigs as Kafka
//! does (the dev broker has no admin APIs): the worker creates its config and status topics
//! compacted, writes configs, tenants and statuses, and a second worker reading the same
//! topics rebuilds the same view.

use std::collections::BTreeMap;
use std::time::Duration;

use spillway_kafka::admin::{AdminClient, ConfigResource, NewTopic};
use spillway_kafka::security::ClientSecurity;
use spillway_storage::kafka_store::{
    KafkaConfigStore, KafkaStatusStore, KafkaStoreError, Status, StatusKey, StoreTopic,
};
use spillway_storage::{ConnectorKey, TargetState, Tenant};
use spillway_tests::ProxiedDevBroker;

const TIMEOUT: Duration = Duration::from_secs(20);

fn topic(bootstrap: &str, name: &str, partitions: i32) -> StoreTopic {
    StoreTopic {
        bootstrap: bootstrap.to_owned(),
        client: Vec::new(),
        topic: name.to_owned(),
        partitions,
        replication_factor: 1,
        read_timeout: TIMEOUT,
    }
}

async fn admin(bootstrap: &str) -> AdminClient {
    AdminClient::connect(
        bootstrap,
        "state-test",
        TIMEOUT,
        ClientSecurity::plaintext(),
    )
    .await
    .expect("admin client")
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_reading_the_config_topic_rebuilds_the_same_view() {
    let cluster = ProxiedDevBroker::start(1, &[]).expect("dev broker behind the proxy");
    let bootstrap = cluster.bootstrap();
    let admin = admin(&bootstrap).await;
    let configs = topic(&bootstrap, "spillway-configs", 1);
    let first = KafkaConfigStore::open(&admin, &configs)
        .await
        .expect("config store");

    // Created compacted, with one partition.
    let described = admin
        .describe_configs(
            &ConfigResource::Topic("spillway-configs".into()),
            &["cleanup.policy"],
        )
        .await
        .unwrap();
    assert_eq!(
        described
            .get("cleanup.policy")
            .and_then(|e| e.value.clone())
            .as_deref(),
        Some("compact")
    );
    assert_eq!(first.offset(), 0, "a new topic holds nothing");

    let acme = Tenant {
        name: "acme".into(),
        settings: map(&[
            ("token.digest", "sha256:0f3c"),
            ("quota.connectors", "5"),
            ("override.policy", "none"),
        ]),
    };
    first.put_tenant(&acme).await.unwrap();
    first
        .put_tenant(&Tenant {
            name: "gone".into(),
            settings: BTreeMap::new(),
        })
        .await
        .unwrap();
    let orders = ConnectorKey::new("acme", "orders");
    let audit = ConnectorKey::new("acme", "audit");
    let old = ConnectorKey::new("gone", "old");
    let orders_config = map(&[("connector.class", "http"), ("tasks.max", "2")]);
    first
        .put_connector(&orders, &orders_config, Some(TargetState::Running))
        .await
        .unwrap();
    first
        .put_connector(
            &audit,
            &map(&[("connector.class", "postgres")]),
            Some(TargetState::Paused),
        )
        .await
        .unwrap();
    first
        .put_connector(&old, &map(&[("connector.class", "http")]), None)
        .await
        .unwrap();
    first
        .put_task_configs(&orders, &[map(&[("task", "0")]), map(&[("task", "1")])])
        .await
        .unwrap();
    assert!(first
        .set_target_state(&orders, TargetState::Stopped)
        .await
        .unwrap());
    assert_eq!(
        first.count_connector_restart(&orders).await.unwrap(),
        Some(1)
    );
    assert!(first.delete_tenant("gone").await.unwrap());
    assert!(!first
        .delete_connector(&ConnectorKey::new("acme", "never"))
        .await
        .unwrap());

    let view = first.view();
    assert_eq!(view.tenants["acme"], acme);
    assert!(!view.tenants.contains_key("gone") && !view.connectors.contains_key(&old));
    let o = &view.connectors[&orders];
    assert_eq!(o.config, orders_config);
    assert_eq!(o.target_state, TargetState::Stopped);
    assert_eq!(o.restarts, 1);
    assert_eq!(o.tasks, vec![map(&[("task", "0")]), map(&[("task", "1")])]);
    assert_eq!(view.connectors[&audit].target_state, TargetState::Paused);
    assert!(view.unreadable.is_empty(), "{:?}", view.unreadable);

    // Another worker opens the same topic (it exists now) and reads everything back.
    let second = KafkaConfigStore::open(&admin, &configs)
        .await
        .expect("second store");
    assert_eq!(second.view(), view);

    // A write by the second is seen by the first after its next read to the end.
    assert!(second.delete_connector(&audit).await.unwrap());
    let refreshed = first.refresh().await.unwrap();
    assert!(!refreshed.connectors.contains_key(&audit));
    assert_eq!(refreshed.offset, second.offset());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_are_shared_and_an_older_generation_cannot_overwrite_a_newer_one() {
    let cluster = ProxiedDevBroker::start(1, &[]).expect("dev broker behind the proxy");
    let bootstrap = cluster.bootstrap();
    let admin = admin(&bootstrap).await;
    let statuses = topic(&bootstrap, "spillway-status", 3);
    let first = KafkaStatusStore::open(&admin, &statuses)
        .await
        .expect("status store");
    let second = KafkaStatusStore::open(&admin, &statuses)
        .await
        .expect("status store");
    let orders = ConnectorKey::new("acme", "orders");
    let task0 = StatusKey::Task(orders.clone(), 0);
    let status = |worker: &str, generation, state: &str| Status {
        state: state.into(),
        trace: None,
        worker_id: worker.into(),
        generation,
        restarts: 0,
    };
    first
        .put(
            &StatusKey::Connector(orders.clone()),
            &status("w1:8083", 3, "RUNNING"),
        )
        .await
        .unwrap();
    first
        .put(&task0, &status("w1:8083", 3, "RUNNING"))
        .await
        .unwrap();
    // The task moved to w2 in generation 4; w1, late, still reports it from generation 3.
    second
        .put(&task0, &status("w2:8083", 4, "RUNNING"))
        .await
        .unwrap();
    first
        .put(&task0, &status("w1:8083", 3, "UNASSIGNED"))
        .await
        .unwrap();
    for store in [&first, &second] {
        let view = store.refresh().await.unwrap();
        assert_eq!(view.statuses[&task0], status("w2:8083", 4, "RUNNING"));
        assert_eq!(view.statuses.len(), 2);
    }
    second.delete_connector(&orders, 1).await.unwrap();
    assert!(first.refresh().await.unwrap().statuses.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_topic_that_is_not_compacted_or_has_many_partitions_is_refused() {
    let cluster = ProxiedDevBroker::start(1, &[]).expect("dev broker behind the proxy");
    let bootstrap = cluster.bootstrap();
    let admin = admin(&bootstrap).await;
    admin
        .create_topic(&NewTopic {
            name: "deleting".into(),
            partitions: 1,
            replication_factor: 1,
            configs: vec![("cleanup.policy".into(), "delete".into())],
        })
        .await
        .unwrap();
    let err = KafkaConfigStore::open(&admin, &topic(&bootstrap, "deleting", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, KafkaStoreError::Log(_)) && err.to_string().contains("cleanup.policy=delete"),
        "{err}"
    );
    admin
        .create_topic(&NewTopic {
            name: "wide".into(),
            partitions: 3,
            replication_factor: 1,
            configs: vec![("cleanup.policy".into(), "compact".into())],
        })
        .await
        .unwrap();
    let err = KafkaConfigStore::open(&admin, &topic(&bootstrap, "wide", 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("exactly one"), "{err}");
}
