//! A connector's life beyond create and delete, over the REST API on the dev broker: its
//! offsets altered and reset while STOPPED (KIP-875), and PAUSED holding no consumer.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use spillway_tests::{numbered_records, produce};
use support::{broker, start_worker};

const WAIT: Duration = Duration::from_secs(30);

fn lines_in(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

async fn wait_for_lines(path: &Path, n: usize) {
    let start = Instant::now();
    while lines_in(path).len() < n {
        assert!(
            start.elapsed() < WAIT,
            "only {} of {n} lines in {}",
            lines_in(path).len(),
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sink(name: &str, topic: &str, file: &Path, protocol: &str) -> Json {
    json!({"name": name, "config": {
        "connector.class": "file",
        "topics": topic,
        "file": file.display().to_string(),
        "consumer.override.group.protocol": protocol,
    }})
}

fn committed(body: &Json) -> Vec<(String, i64, i64)> {
    body["offsets"]
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
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_classic_connectors_offsets_are_altered_and_reset_and_it_reads_from_there() {
    let broker = broker();
    broker.create_topic("ledger", 1);
    broker.create_topic("queue", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    produce(
        &broker.bootstrap(),
        "ledger",
        numbered_records(10, 8, 1),
        "none",
    )
    .await;
    // Offsets can be changed only while STOPPED; a share-mode connector's go through the
    // share-group offsets APIs, which the dev broker lacks (the proxy's emulation has them:
    // tests/tests/share_group_admin.rs).
    let created = api
        .post(
            "/connectors",
            sink("queue", "queue", &dir.path().join("q.txt"), "share"),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let partition = |offset: Json| json!({"offsets": [{"partition": {"kafka_topic": "ledger", "kafka_partition": 0}, "offset": offset}]});
    let refused = api
        .patch("/connectors/queue/offsets", partition(Json::Null))
        .await;
    assert!(
        refused.assert_error(400).contains("STOPPED"),
        "{}",
        refused.text
    );
    assert_eq!(api.put_empty("/connectors/queue/stop").await.status, 204);
    let refused = api.delete("/connectors/queue/offsets").await;
    let message = refused.assert_error(500);
    assert!(message.contains("group 'connect-share-queue'"), "{message}");
    assert!(
        message.contains("does not support DeleteShareGroupOffsets"),
        "{message}"
    );

    // Two classic connectors, created STOPPED: the group of each is empty. (The dev broker,
    // unlike Kafka, refuses commits from outside a classic group once it has had members.)
    let ledger_out = dir.path().join("ledger.txt");
    let replay_out = dir.path().join("replay.txt");
    for (name, file) in [("ledger", &ledger_out), ("replay", &replay_out)] {
        let mut body = sink(name, "ledger", file, "classic");
        body["initial_state"] = json!("STOPPED");
        assert_eq!(api.post("/connectors", body).await.status, 201);
    }
    for (body, names) in [
        (json!({}), "\"offsets\""),
        (json!({"offsets": []}), "empty"),
        (
            json!({"offsets": [{"partition": {"kafka_topic": "ledger"}}]}),
            "kafka_partition",
        ),
        (partition(json!({"kafka_offset": -2})), "kafka_offset"),
        (
            json!({"offsets": [{"partition": {"kafka_topic": "other", "kafka_partition": 0}, "offset": null}]}),
            "'other'",
        ),
    ] {
        let refused = api.patch("/connectors/ledger/offsets", body.clone()).await;
        let message = refused.assert_error(400);
        assert!(message.contains(names), "{body}: {message}");
    }

    // Altered to 4: the connector writes records 4..9.
    let altered = api
        .patch(
            "/connectors/ledger/offsets",
            partition(json!({"kafka_offset": 4})),
        )
        .await;
    assert_eq!(altered.status, 200, "{}", altered.text);
    assert_eq!(
        altered.body["message"],
        "The offsets for this connector have been altered successfully"
    );
    assert_eq!(
        committed(&api.get("/connectors/ledger/offsets").await.body),
        [("ledger".to_owned(), 0, 4)]
    );
    assert_eq!(api.put_empty("/connectors/ledger/resume").await.status, 202);
    wait_for_lines(&ledger_out, 6).await;
    assert_eq!(lines_in(&ledger_out), ["v4", "v5", "v6", "v7", "v8", "v9"]);

    // Altered to 7, then reset: back to where auto.offset.reset (earliest) starts, all ten.
    let altered = api
        .patch(
            "/connectors/replay/offsets",
            partition(json!({"kafka_offset": 7})),
        )
        .await;
    assert_eq!(altered.status, 200, "{}", altered.text);
    let reset = api.delete("/connectors/replay/offsets").await;
    assert_eq!(reset.status, 200, "{}", reset.text);
    assert_eq!(
        reset.body["message"],
        "The offsets for this connector have been reset successfully"
    );
    assert_eq!(
        committed(&api.get("/connectors/replay/offsets").await.body),
        [("ledger".to_owned(), 0, 0)]
    );
    assert_eq!(api.put_empty("/connectors/replay/resume").await.status, 202);
    wait_for_lines(&replay_out, 10).await;
    api.wait_for("/connectors/replay/offsets", WAIT, |o| {
        committed(o) == [("ledger".to_owned(), 0, 10)]
    })
    .await;
    assert_eq!(lines_in(&replay_out).len(), 10);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_connector_leaves_its_share_group_and_resumes_where_the_group_left_off() {
    let broker = broker();
    broker.create_topic("events", 2);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    let out = dir.path().join("events.txt");
    let mut body = sink("events", "events", &out, "share");
    body["config"]["tasks.max"] = json!("2");
    assert_eq!(api.post("/connectors", body).await.status, 201);
    produce(
        &broker.bootstrap(),
        "events",
        numbered_records(100, 8, 2),
        "none",
    )
    .await;
    wait_for_lines(&out, 100).await;
    assert!(!broker.share_member_ids("connect-share-events").is_empty());

    assert_eq!(api.put_empty("/connectors/events/pause").await.status, 202);
    let start = Instant::now();
    while !broker.share_member_ids("connect-share-events").is_empty() {
        assert!(
            start.elapsed() < WAIT,
            "the paused connector's members are still in the share group: {:?}",
            broker.share_member_ids("connect-share-events")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = api.get("/connectors/events/status").await;
    assert_eq!(
        status.body["connector"]["state"], "PAUSED",
        "{}",
        status.text
    );

    // Records produced while PAUSED wait in the group and arrive after resume. (Lines written
    // before the pause may repeat records: the dev broker ends every share session when a
    // connection closes, and records whose acknowledgement was lost come again.)
    let before = lines_in(&out);
    let later: Vec<_> = numbered_records(200, 8, 2).into_iter().skip(100).collect();
    produce(&broker.bootstrap(), "events", later, "none").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(lines_in(&out), before, "nothing is written while PAUSED");
    assert_eq!(api.put_empty("/connectors/events/resume").await.status, 202);
    let expected: BTreeSet<String> = (0..200).map(|n| format!("v{n}")).collect();
    let start = Instant::now();
    while lines_in(&out).into_iter().collect::<BTreeSet<_>>() != expected {
        assert!(
            start.elapsed() < WAIT,
            "not every record arrived after resume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!broker.share_member_ids("connect-share-events").is_empty());
    worker.stop().await;
}
