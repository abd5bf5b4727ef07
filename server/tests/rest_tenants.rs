//! Tenants over the REST API with `rest.auth.enabled=true`: isolation (another tenant's
//! connectors are 404, names are per tenant, group ids carry the tenant's prefix), quotas
//! refused with 4xx naming the quota, the client override policy, a records/s quota slowing a
//! running connector, an in-flight bytes quota bounding a slow one, and a slow or failing
//! tenant leaving the others at full speed.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use spillway_tests::{numbered_records, produce};
use support::{broker, start_worker_with, Client};

const WAIT: Duration = Duration::from_secs(30);
const ADMIN_TOKEN: &str = "admin-token-for-the-tenant-tests";

fn auth() -> [(&'static str, &'static str); 2] {
    [
        ("rest.auth.enabled", "true"),
        ("rest.admin.token", ADMIN_TOKEN),
    ]
}

/// A share-mode file sink on `topic`.
fn file_sink(name: &str, topic: &str, file: &Path) -> Json {
    json!({"name": name, "config": {
        "connector.class": "file",
        "topics": topic,
        "file": file.display().to_string(),
        "consumer.override.group.protocol": "share",
    }})
}

/// The record numbers in a file sink's output (`v<n>:...` per line).
fn numbers_in(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a tenant with `body` as the admin and returns its token.
async fn tenant(admin: &Client, body: Json) -> String {
    let created = admin.post("/tenants", body).await;
    assert_eq!(created.status, 201, "{}", created.text);
    created.body["token"].as_str().expect("a token").to_owned()
}

/// Starts the worker again on `state` in this process. sled releases its directory lock from
/// a background thread shortly after the last handle is dropped, so the open is retried while
/// the lock is still held (a restarted worker process does not meet this).
async fn restart_worker(
    broker: &spillway_tests::DevBroker,
    state: &Path,
) -> (spillway::worker_cmd::RunningWorker, Client) {
    let mut properties = support::worker_config(broker, state);
    properties.extend(support::config(&auth()));
    let start = Instant::now();
    let worker = loop {
        match spillway::worker_cmd::RunningWorker::start(properties.clone(), support::registry())
            .await
        {
            Ok(worker) => break worker,
            Err(e) if format!("{e:#}").contains("lock") && start.elapsed() < WAIT => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the worker does not start again: {e:#}"),
        }
    };
    let client = Client::new(&format!("http://{}", worker.address()));
    client
        .wait_for("/health", WAIT, |h| h["status"] == "healthy")
        .await;
    (worker, client)
}

/// Where a tenant's file sink writes: inside the tenant's directory under the worker's
/// default `tenant.files.dir` (`<state.dir>/tenant-files`), where authentication confines it.
fn tenant_file(state: &Path, tenant: &str, file: &str) -> std::path::PathBuf {
    state.join("tenant-files").join(tenant).join(file)
}

fn names(answer: &support::Answer) -> Vec<String> {
    serde_json::from_value(answer.body.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_connectors_and_read_through_groups_of_their_own() {
    let broker = broker();
    broker.create_topic("shared", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let (worker, anonymous) = start_worker_with(&broker, &state, &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);

    // Without a valid token only /, /health and /openapi.json answer.
    assert_eq!(anonymous.get("/").await.status, 200);
    assert_eq!(anonymous.get("/openapi.json").await.status, 200);
    let refused = anonymous.get("/connectors").await;
    assert!(refused.assert_error(401).contains("bearer token"));
    anonymous
        .with_token("spw_made_up")
        .get("/connectors")
        .await
        .assert_error(401);

    let acme_token = tenant(&admin, json!({"name": "acme"})).await;
    let globex_token = tenant(&admin, json!({"name": "globex"})).await;
    let acme = anonymous.with_token(&acme_token);
    let globex = anonymous.with_token(&globex_token);
    admin
        .post("/tenants", json!({"name": "acme"}))
        .await
        .assert_error(409);

    // One name in two tenants: two connectors, each seen only by its tenant.
    let acme_out = tenant_file(&state, "acme", "acme.txt");
    let globex_out = tenant_file(&state, "globex", "globex.txt");
    let created = acme
        .post("/connectors", file_sink("orders", "shared", &acme_out))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.body["name"], "orders");
    let created = admin
        .post(
            "/tenants/globex/connectors",
            file_sink("orders", "shared", &globex_out),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(names(&acme.get("/connectors").await), ["orders"]);
    assert_eq!(names(&globex.get("/connectors").await), ["orders"]);
    assert_eq!(
        names(&admin.get("/connectors").await),
        Vec::<String>::new(),
        "the admin's plain routes are the default tenant's"
    );
    assert_eq!(
        names(&admin.get("/tenants/acme/connectors").await),
        ["orders"]
    );
    assert_eq!(
        names(&acme.get("/tenants/acme/connectors").await),
        ["orders"]
    );

    // Another tenant's connectors do not exist for a tenant, whatever it tries.
    for (method, path) in [
        ("GET", "/tenants/globex/connectors"),
        ("GET", "/tenants/globex/connectors/orders/status"),
        ("DELETE", "/tenants/globex/connectors/orders"),
        ("PUT", "/tenants/globex/connectors/orders/pause"),
        ("GET", "/tenants/globex"),
        ("GET", "/tenants/nobody/connectors"),
    ] {
        let answer = acme
            .send(
                reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                path,
                None,
            )
            .await;
        let message = answer.assert_error(404);
        assert!(message.contains("not found"), "{method} {path}: {message}");
    }
    assert!(acme
        .get("/tenants")
        .await
        .assert_error(403)
        .contains("admin token"));
    acme.post("/tenants", json!({"name": "evil"}))
        .await
        .assert_error(403);
    acme.get("/admin/loggers").await.assert_error(403);
    assert_eq!(acme.get("/tenants/acme").await.status, 200);

    // Each tenant's connector reads through a share group of its own: both get every record.
    produce(
        &broker.bootstrap(),
        "shared",
        numbered_records(300, 16, 1),
        "none",
    )
    .await;
    let expected: BTreeSet<String> = (0..300).map(|n| format!("v{n}")).collect();
    wait_until("every record in both tenants' files", || {
        numbers_in(&acme_out) == expected && numbers_in(&globex_out) == expected
    })
    .await;
    assert!(!broker
        .share_member_ids("acme.connect-share-orders")
        .is_empty());
    assert!(!broker
        .share_member_ids("globex.connect-share-orders")
        .is_empty());
    assert!(broker.share_member_ids("connect-share-orders").is_empty());
    let offsets = acme.get("/connectors/orders/offsets").await;
    assert!(
        offsets.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("share group 'acme.connect-share-orders'")),
        "{}",
        offsets.text
    );

    // Tenants, tokens and connectors survive a restart.
    worker.stop().await;
    let (worker, anonymous) = restart_worker(&broker, &state).await;
    let globex = anonymous.with_token(&globex_token);
    assert_eq!(names(&globex.get("/connectors").await), ["orders"]);
    globex
        .wait_for("/connectors/orders/status", WAIT, |s| {
            s["connector"]["state"] == "RUNNING"
        })
        .await;

    // A tenant that owns connectors is deleted only with them; then its token is void.
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let refused = admin.delete("/tenants/acme").await;
    assert!(refused.assert_error(409).contains("orders"));
    assert_eq!(
        admin
            .delete("/tenants/acme?deleteConnectors=true")
            .await
            .status,
        204
    );
    let acme = anonymous.with_token(&acme_token);
    acme.get("/connectors").await.assert_error(401);
    assert_eq!(names(&globex.get("/connectors").await), ["orders"]);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_and_the_override_policy_are_refused_over_rest_naming_what_and_the_limit() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let bad = admin
        .post(
            "/tenants",
            json!({"name": "acme", "quotas": {"tasks": "many"}}),
        )
        .await;
    assert!(
        bad.assert_error(400).contains("quota tasks"),
        "{}",
        bad.text
    );
    let bad = admin
        .post("/tenants", json!({"name": "acme", "quotas": {"cpus": 1}}))
        .await;
    assert!(bad.assert_error(400).contains("'cpus'"), "{}", bad.text);
    for (value, says) in [
        (json!(0), "at least 1"),
        (json!(-5), "at least 1"),
        (json!(1.5), "at least 1"),
        (json!("1MB"), "whole number"),
    ] {
        let bad = admin
            .post(
                "/tenants",
                json!({"name": "acme", "quotas": {"inflight.bytes": value}}),
            )
            .await;
        let message = bad.assert_error(400);
        assert!(
            message.contains("quota inflight.bytes") && message.contains(says),
            "{value}: {message}"
        );
    }
    assert_eq!(
        admin.get("/tenants/acme").await.status,
        404,
        "nothing is created by a refused request"
    );
    let acme = anonymous.with_token(
        &tenant(
            &admin,
            json!({"name": "acme", "quotas": {"connectors": 2, "tasks": 3, "inflight.records": 1500}}),
        )
        .await,
    );
    // PAUSED connectors hold their tasks' share of the quota without running them.
    let sink = |name: &str, tasks: u32| {
        let path = tenant_file(&dir.path().join("state"), "acme", &format!("{name}.txt"));
        let mut body = file_sink(name, "t", &path);
        body["config"]["tasks.max"] = json!(tasks.to_string());
        body["config"]["consumer.override.max.poll.records"] = json!("100");
        // Share mode's default is 1 batch in flight; 4 makes the in-flight quota bite sooner.
        body["config"]["task.inflight.batches"] = json!("4");
        body["initial_state"] = json!("PAUSED");
        body
    };
    assert_eq!(acme.post("/connectors", sink("a", 1)).await.status, 201);
    let refused = acme.post("/connectors", sink("b", 3)).await;
    let message = refused.assert_error(403);
    assert!(message.contains("quota tasks=3"), "{message}");
    assert!(message.contains("4 tasks"), "{message}");
    assert_eq!(acme.post("/connectors", sink("b", 2)).await.status, 201);
    let refused = acme.post("/connectors", sink("c", 1)).await;
    assert!(
        refused.assert_error(403).contains("quota connectors=2"),
        "{}",
        refused.text
    );
    let refused = acme
        .patch("/connectors/a/config", json!({"tasks.max": "2"}))
        .await;
    assert!(refused.assert_error(403).contains("quota tasks=3"));
    // In flight: a, 1 task x 4 batches x 250 records, and b, 2 x 4 x 100: 1800 > 1500.
    let refused = acme
        .patch(
            "/connectors/a/config",
            json!({"consumer.override.max.poll.records": "250"}),
        )
        .await;
    let message = refused.assert_error(403);
    assert!(message.contains("quota inflight.records=1500"), "{message}");
    // A STOPPED connector frees its tasks; resuming it takes them again.
    assert_eq!(acme.put_empty("/connectors/b/stop").await.status, 204);
    assert_eq!(
        acme.patch("/connectors/a/config", json!({"tasks.max": "3"}))
            .await
            .status,
        200
    );
    let refused = acme.put_empty("/connectors/b/resume").await;
    assert!(refused.assert_error(403).contains("quota tasks=3"));
    let usage = acme.get("/tenants/acme").await;
    assert_eq!(
        usage.body["usage"],
        json!({"connectors": 2, "tasks": 3, "inflight.records": 1200, "inflight.bytes": 0}),
        "{}",
        usage.text
    );
    // The admin raises the quota; the refused change now goes through.
    let raised = admin
        .patch(
            "/tenants/acme",
            json!({"quotas": {"tasks": 5, "inflight.records": null}}),
        )
        .await;
    assert_eq!(raised.status, 200, "{}", raised.text);
    assert_eq!(raised.body["quotas"]["connectors"], 2);
    assert_eq!(raised.body["quotas"]["inflight.records"], Json::Null);
    // inflight.bytes is set like the others, on PATCH and PUT, and refused the same way.
    let set = admin
        .patch(
            "/tenants/acme",
            json!({"quotas": {"inflight.bytes": 65536}}),
        )
        .await;
    assert_eq!(set.status, 200, "{}", set.text);
    assert_eq!(set.body["quotas"]["inflight.bytes"], 65536);
    assert_eq!(
        set.body["quotas"]["tasks"], 5,
        "PATCH keeps the other quotas"
    );
    let refused = admin
        .put(
            "/tenants/acme",
            json!({"quotas": {"tasks": 5, "connectors": 2, "inflight.bytes": 0}}),
        )
        .await;
    assert!(
        refused.assert_error(400).contains("quota inflight.bytes"),
        "{}",
        refused.text
    );
    assert_eq!(
        admin.get("/tenants/acme").await.body["quotas"]["inflight.bytes"],
        65536,
        "a refused PUT changes nothing"
    );
    let replaced = admin
        .put(
            "/tenants/acme",
            json!({"quotas": {"tasks": 5, "connectors": 2, "inflight.bytes": 1048576}}),
        )
        .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text);
    assert_eq!(replaced.body["quotas"]["inflight.bytes"], 1048576);
    assert_eq!(acme.put_empty("/connectors/b/resume").await.status, 202);

    // A tenant cannot point a connector at another cluster or change its security.
    for key in [
        "consumer.override.bootstrap.servers",
        "consumer.override.sasl.jaas.config",
        "producer.override.security.protocol",
        "admin.override.ssl.keystore.location",
    ] {
        let mut body = sink("x", 1);
        body["config"][key] = json!("elsewhere:9092");
        admin.delete("/tenants/acme/connectors/b").await;
        let refused = acme.post("/connectors", body).await;
        let message = refused.assert_error(400);
        assert!(message.contains(key), "{message}");
        assert!(message.contains("'Restricted'"), "{message}");
    }
    // ...unless the admin allows it; the default tenant follows the worker's policy (All).
    let allowed = admin
        .patch(
            "/tenants/acme",
            json!({"client.config.override.policy": "All"}),
        )
        .await;
    assert_eq!(allowed.status, 200, "{}", allowed.text);
    let mut body = sink("x", 1);
    body["config"]["consumer.override.security.protocol"] = json!("PLAINTEXT");
    let created = acme.post("/connectors", body.clone()).await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(admin.post("/connectors", body).await.status, 201);
    let validated = acme
        .put(
            "/connector-plugins/file/config/validate",
            json!({"name": "v", "connector.class": "file", "topics": "t", "file": "x",
                   // A public address: under All a cluster may be named, but it is held to
                   // the worker's egress policy (a name that does not resolve is refused).
                   "consumer.override.bootstrap.servers": "203.0.113.5:9092"}),
        )
        .await;
    assert_eq!(validated.body["error_count"], 0, "{}", validated.text);
    worker.stop().await;
}

/// Waits until `path` holds `total` lines; returns the records/s from the first line seen
/// to the last (infinite when all were there at the first look), and how many lines were
/// there at the first look.
async fn observed_rate(path: &Path, total: usize) -> (f64, usize) {
    let start = Instant::now();
    let (first_seen, first_count) = loop {
        let n = lines_in(path);
        if n > 0 {
            break (Instant::now(), n);
        }
        assert!(
            start.elapsed() < WAIT,
            "no record reached {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if first_count >= total {
        // Every record was there at the first look: no time at all after the first batch.
        return (f64::INFINITY, first_count);
    }
    loop {
        let n = lines_in(path);
        if n >= total {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "only {n} of {total} records reached {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = first_seen.elapsed().as_secs_f64().max(0.001);
    ((total - first_count) as f64 / elapsed, first_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_records_per_second_quota_bounds_the_rate_of_a_running_connector() {
    const RATE: usize = 200;
    const RECORDS: usize = 900;
    let broker = broker();
    broker.create_topic("metered", 1);
    produce(
        &broker.bootstrap(),
        "metered",
        numbered_records(RECORDS as u64, 16, 1),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let metered = anonymous.with_token(
        &tenant(
            &admin,
            json!({"name": "metered", "quotas": {"records.per.second": RATE}}),
        )
        .await,
    );
    let out = tenant_file(&dir.path().join("state"), "metered", "metered.txt");
    let mut body = file_sink("orders", "metered", &out);
    body["config"]["consumer.override.max.poll.records"] = json!("50");
    assert_eq!(metered.post("/connectors", body).await.status, 201);
    let (rate, first) = observed_rate(&out, RECORDS).await;
    eprintln!("{RECORDS} records under a {RATE}/s quota: {rate:.0}/s after the first {first}");
    // The budget holds one second's burst (200) plus one poll (50) ahead; the rest flows at
    // 200/s. Unthrottled, the file sink writes these records in well under a second.
    assert!(
        first <= RATE + 100,
        "{first} records arrived before the first look"
    );
    assert!(
        rate < (RATE * 2) as f64,
        "{rate:.0} records/s under a quota of {RATE}/s"
    );
    assert!(
        rate > (RATE / 4) as f64,
        "{rate:.0} records/s: the quota should slow, not stop, the connector"
    );
    wait_until("every record in the file", || {
        numbers_in(&out).len() == RECORDS
    })
    .await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_failing_tenant_does_not_slow_another() {
    const RECORDS: usize = 3000;
    let broker = broker();
    broker.create_topic("a-slow", 2);
    broker.create_topic("b-fast", 2);
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let troubled = anonymous.with_token(&tenant(&admin, json!({"name": "troubled"})).await);
    let healthy = anonymous.with_token(&tenant(&admin, json!({"name": "healthy"})).await);
    for records in [
        ("a-slow", numbered_records(RECORDS as u64, 16, 2)),
        ("b-fast", numbered_records(RECORDS as u64, 16, 2)),
    ] {
        produce(&broker.bootstrap(), records.0, records.1, "none").await;
    }
    // Tenant "troubled": one connector takes 2 s per batch, another fails every batch.
    let slow = json!({"name": "slow", "config": {
        "connector.class": "slow", "topics": "a-slow", "tasks.max": "2", "slow.put.ms": "2000",
        "consumer.override.group.protocol": "share"}});
    assert_eq!(troubled.post("/connectors", slow).await.status, 201);
    let failing = json!({"name": "failing", "config": {
        "connector.class": "slow", "topics": "a-slow", "slow.fail": "true",
        "consumer.override.group.protocol": "share"}});
    assert_eq!(troubled.post("/connectors", failing).await.status, 201);
    troubled
        .wait_for("/connectors/failing/status", WAIT, |s| {
            s["tasks"][0]["state"] == "FAILED"
        })
        .await;

    // Tenant "healthy" drains its topic at full speed meanwhile.
    let out = tenant_file(&dir.path().join("state"), "healthy", "healthy.txt");
    let mut body = file_sink("orders", "b-fast", &out);
    body["config"]["tasks.max"] = json!("2");
    assert_eq!(healthy.post("/connectors", body).await.status, 201);
    let started = Instant::now();
    let (rate, _) = observed_rate(&out, RECORDS).await;
    let took = started.elapsed();
    eprintln!("the healthy tenant wrote {RECORDS} records in {took:?} ({rate:.0}/s after its first batch) while the other tenant's sink was slow and failing");
    let status = troubled.get("/connectors/slow/status").await;
    assert_eq!(
        status.body["connector"]["state"], "RUNNING",
        "{}",
        status.text
    );
    // In that time the slow tenant finished at most a few 2-second batches per task: had it
    // held the healthy tenant up, the healthy one could not have finished first.
    assert!(
        took < Duration::from_secs(12),
        "the healthy tenant took {took:?} for {RECORDS} records"
    );
    assert!(
        rate > 500.0,
        "the healthy tenant wrote only {rate:.0} records/s"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inflight_bytes_quota_bounds_a_slow_tenant() {
    const RECORDS: usize = 400;
    const POLL: usize = 20;
    // Keys "k<n>" of at most 4 bytes, values of 100, no headers.
    const BATCH_BYTES: u64 = (POLL * (4 + 100)) as u64;
    // One and a half batches: 4 batches in flight by credits (about 8 KB) would exceed it.
    const QUOTA: u64 = 3000;
    let broker = broker();
    broker.create_topic("held", 1);
    produce(
        &broker.bootstrap(),
        "held",
        numbered_records(RECORDS as u64, 100, 1),
        "none",
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = start_worker_with(&broker, &dir.path().join("state"), &auth()).await;
    let admin = anonymous.with_token(ADMIN_TOKEN);
    let held = anonymous.with_token(
        &tenant(
            &admin,
            json!({"name": "held", "quotas": {"inflight.bytes": QUOTA}}),
        )
        .await,
    );
    let out = dir.path().join("held.txt");
    let slow = json!({"name": "slow", "config": {
        "connector.class": "slow", "topics": "held", "slow.put.ms": "40",
        "slow.file": out.display().to_string(),
        "task.inflight.batches": "4",
        "consumer.override.max.poll.records": POLL.to_string(),
        "consumer.override.group.protocol": "share"}});
    assert_eq!(held.post("/connectors", slow).await.status, 201);

    // Sample the tenant's gauge while the slow sink works through the topic.
    let start = Instant::now();
    let (mut samples, mut max) = (0, 0);
    let delivered = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<BTreeSet<String>>()
    };
    while delivered().len() < RECORDS {
        assert!(
            start.elapsed() < WAIT,
            "only {} of {RECORDS} records delivered",
            delivered().len()
        );
        let usage = held.get("/tenants/held").await;
        assert_eq!(usage.status, 200, "{}", usage.text);
        let bytes = usage.body["usage"]["inflight.bytes"]
            .as_u64()
            .expect("usage.inflight.bytes");
        max = max.max(bytes);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("{RECORDS} records under inflight.bytes={QUOTA}: at most {max} bytes in flight over {samples} samples, {:?}", start.elapsed());
    assert!(max > 0, "the gauge never showed a batch in flight");
    assert!(
        max <= QUOTA + BATCH_BYTES,
        "{max} bytes in flight: more than the quota {QUOTA} plus one batch of {BATCH_BYTES}"
    );
    assert_eq!(delivered().len(), RECORDS, "every record delivered");
    held.wait_for("/tenants/held", WAIT, |t| t["usage"]["inflight.bytes"] == 0)
        .await;
    worker.stop().await;
}
