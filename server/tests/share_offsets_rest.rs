//! Issue 14 item 8: Connect's offsets API for a share-mode connector, through the share-group
//! offsets APIs (DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets),
//! over REST, on the test-kit proxy that answers them as Kafka 4.2 does.

mod support;

use serde_json::{json, Value as Json};
use spillway_tests::{DevBroker, KafkaProxy, ProxyOptions, ProxySecurity};
use support::start_worker_with;

fn start_offsets(body: &Json) -> Vec<(String, i64, i64)> {
    let mut offsets: Vec<_> = body["offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|o| {
            (
                o["partition"]["kafka_topic"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["partition"]["kafka_partition"].as_i64().unwrap_or(-1),
                o["offset"]["kafka_offset"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    offsets.sort();
    offsets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_connectors_start_offsets_are_read_altered_and_reset_while_stopped() {
    let broker = DevBroker::start(1);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(3000);
    broker.create_topic("queue", 2);
    let proxy = KafkaProxy::start(
        &broker.bootstrap(),
        ProxyOptions::new(ProxySecurity::Plaintext).with_admin_emulation(broker.control()),
    )
    .expect("proxy starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker_with(
        &broker,
        &dir.path().join("state"),
        &[("bootstrap.servers", &proxy.bootstrap())],
    )
    .await;
    let created = api
        .post(
            "/connectors",
            json!({"name": "queue", "config": {
                "connector.class": "file",
                "topics": "queue",
                "file": dir.path().join("q.txt").display().to_string(),
                "consumer.override.group.protocol": "share",
            }}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let offsets = |partition: i64, offset: Json| json!({"offsets": [{"partition": {"kafka_topic": "queue", "kafka_partition": partition}, "offset": offset}]});

    // The status names the group's settings in force and where they came from.
    let status = api
        .wait_for(
            "/connectors/queue/status",
            std::time::Duration::from_secs(30),
            |s| s["connector"]["group_settings"].is_object(),
        )
        .await;
    let settings = &status["connector"]["group_settings"];
    assert_eq!(settings["group"], "connect-share-queue", "{status}");
    let reset = settings["settings"]
        .as_array()
        .expect("settings")
        .iter()
        .find(|s| s["name"] == "share.auto.offset.reset")
        .expect("listed")
        .clone();
    assert_eq!(reset["value"], "earliest", "{status}");
    assert!(
        reset["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("set by Spillway")),
        "{status}"
    );

    // Running: readable, not changeable.
    let read = api.get("/connectors/queue/offsets").await;
    assert_eq!(read.status, 200, "{}", read.text);
    assert!(
        read.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("start offset")),
        "{}",
        read.text
    );
    let refused = api
        .patch(
            "/connectors/queue/offsets",
            offsets(0, json!({"kafka_offset": 5})),
        )
        .await;
    assert!(
        refused.assert_error(400).contains("STOPPED"),
        "{}",
        refused.text
    );
    assert!(api
        .delete("/connectors/queue/offsets")
        .await
        .assert_error(400)
        .contains("STOPPED"));

    assert_eq!(api.put_empty("/connectors/queue/stop").await.status, 204);
    // Kafka refuses while the group still has members; the tasks leave on stop.
    let mut altered = api
        .patch(
            "/connectors/queue/offsets",
            offsets(0, json!({"kafka_offset": 5})),
        )
        .await;
    for _ in 0..50 {
        if altered.status != 409 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        altered = api
            .patch(
                "/connectors/queue/offsets",
                offsets(0, json!({"kafka_offset": 5})),
            )
            .await;
    }
    assert_eq!(altered.status, 200, "{}", altered.text);
    assert_eq!(
        altered.body["message"],
        "The offsets for this connector have been altered successfully"
    );
    assert_eq!(
        proxy
            .admin()
            .expect("emulating")
            .share_start_offsets("connect-share-queue")
            .get(&("queue".to_owned(), 0)),
        Some(&5),
        "AlterShareGroupOffsets reached the group"
    );
    assert_eq!(
        start_offsets(&api.get("/connectors/queue/offsets").await.body),
        [("queue".to_owned(), 0, 5)]
    );
    let refused = api
        .patch("/connectors/queue/offsets", offsets(1, Json::Null))
        .await;
    assert!(
        refused
            .assert_error(400)
            .contains("DELETE /connectors/queue/offsets"),
        "{}",
        refused.text
    );

    let reset = api.delete("/connectors/queue/offsets").await;
    assert_eq!(reset.status, 200, "{}", reset.text);
    assert_eq!(
        reset.body["message"],
        "The offsets for this connector have been reset successfully"
    );
    assert!(start_offsets(&api.get("/connectors/queue/offsets").await.body).is_empty());
    worker.stop().await;
}
