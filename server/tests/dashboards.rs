//! The Grafana dashboards and alert rules of `dashboards/` against a real Prometheus scraping a
//! worker that runs a share-group and a classic connector: every panel query and every
//! template variable query returns data, every alert rule loads, evaluates and parses. Plus
//! static checks: every metric the dashboards name is exported and documented.

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::TopicPartitionList;
use serde_json::Value as Json;
use spillway::metrics::Telemetry;
use spillway::mirror::MirrorConfig;
use spillway_core::config::parse_properties;
use spillway_tests::{produce, ProxiedDevBroker, ProxyOptions, ProxySecurity, TestRecord};
use support::pipelines::{self, CLASSIC_TOPIC, SHARE};
use tokio::sync::oneshot;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The replication dashboard, checked against a running `spillway mirror` (the others against a
/// worker).
const REPLICATION: &str = "replication.json";

const DASHBOARDS: [&str; 4] = [
    "overview.json",
    "connector.json",
    "share-groups.json",
    "tenants.json",
];

fn dashboard(name: &str) -> Json {
    let path = repo_file(&format!("dashboards/{name}"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

/// Every query of a dashboard: (where, PromQL), template variables first.
fn queries(name: &str) -> Vec<(String, String)> {
    let board = dashboard(name);
    let mut out = Vec::new();
    for var in board["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        if var["type"] == "query" {
            let query = var["query"]["query"].as_str().expect("a variable query");
            out.push((
                format!("{name} variable {}", var["name"]),
                label_values_as_promql(query),
            ));
        }
    }
    for panel in board["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            out.push((
                format!("{name} panel '{}' {}", panel["title"], target["refId"]),
                expr.to_owned(),
            ));
        }
    }
    out
}

/// Grafana's `label_values(SELECTOR, LABEL)` as the PromQL that finds those values.
fn label_values_as_promql(query: &str) -> String {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected variable query {query}"));
    let (selector, label) = inner
        .rsplit_once(',')
        .expect("label_values(SELECTOR, LABEL)");
    format!("count by ({}) ({})", label.trim(), selector.trim())
}

/// What Grafana puts in place of the template variables ("All" for the multi-value ones; the
/// share connector where one connector is chosen).
fn substitute(expr: &str) -> String {
    let mut out = expr.replace("$__rate_interval", "15s");
    for var in ["tenant", "connector", "mode", "task", "source", "target"] {
        out = out.replace(&format!("=~\"${var}\""), "=~\".*\"");
    }
    out.replace("=\"$connector\"", &format!("=\"{SHARE}\""))
}

/// Every `kafka_connect_*` metric name in `text`, histogram suffixes removed.
fn metric_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| t.starts_with("kafka_connect_"))
        .map(|t| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| t.strip_suffix(s).filter(|b| b.ends_with("_ms")))
                .unwrap_or(t)
                .to_owned()
        })
        .collect()
}

#[test]
fn dashboards_and_alerts_name_only_exported_metrics_and_every_metric_is_documented() {
    let exported: Vec<String> = spillway_actors::metrics::all_prometheus_names()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let alerts = std::fs::read_to_string(repo_file("dashboards/alerts.yml")).expect("alerts.yml");
    let mut used: Vec<(String, String)> = metric_names(&alerts)
        .into_iter()
        .map(|n| ("alerts.yml".to_owned(), n))
        .collect();
    for name in DASHBOARDS {
        for (place, query) in queries(name) {
            used.extend(metric_names(&query).into_iter().map(|n| (place.clone(), n)));
        }
    }
    let unknown: Vec<&(String, String)> =
        used.iter().filter(|(_, n)| !exported.contains(n)).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:#?}");
    let docs = std::fs::read_to_string(repo_file("docs/metrics.md")).expect("docs/metrics.md");
    let undocumented: Vec<&String> = exported
        .iter()
        .filter(|n| !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:#?}"
    );
    for board in DASHBOARDS.map(dashboard) {
        let vars: Vec<&str> = board["templating"]["list"]
            .as_array()
            .expect("variables")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert!(
            vars.contains(&"datasource") && vars.contains(&"tenant"),
            "{vars:?}"
        );
    }
}

/// The `prometheus` binary. A missing Prometheus fails the test (as a missing PostgreSQL fails
/// the sink tests): a skip was swallowed by the harness's output capture and passed having
/// checked nothing.
fn prometheus_binary() -> PathBuf {
    find_binary("prometheus").unwrap_or_else(|| {
        panic!(
            "Prometheus is not installed, so the dashboards cannot be checked: install it \
             (Debian/Ubuntu: `apt-get install prometheus`, which .ci/run does; elsewhere put the \
             `prometheus` binary from https://prometheus.io/download/ on PATH)"
        )
    })
}

/// Waits until Prometheus scraped `metric` at least 8 times in the last minute (rate() over
/// 15 s needs two scrapes in the window: more than enough).
async fn wait_for_scrapes(prometheus: &Prometheus, metric: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let scrapes = prometheus
            .query(&format!("count_over_time({metric}[1m])"))
            .await
            .unwrap_or_default();
        let count = scrapes
            .iter()
            .filter_map(|s| s["value"][1].as_str()?.parse::<f64>().ok())
            .fold(0.0, f64::max);
        if count >= 8.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus scraped {metric} only {count} times"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every query of dashboard `name` against `prometheus`: the failures, and how many ran.
async fn failed_queries(prometheus: &Prometheus, name: &str) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (place, query) in queries(name) {
        let promql = substitute(&query);
        checked += 1;
        match prometheus.query(&promql).await {
            Ok(result) if result.is_empty() => {
                failures.push(format!("{place}: no data for {promql}"))
            }
            Ok(_) => {}
            Err(e) => failures.push(format!("{place}: {promql} fails: {e}")),
        }
    }
    (failures, checked)
}

/// A Prometheus server of our own: free port, temporary storage, killed on drop.
struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_binary(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Prometheus {
    async fn start(binary: &Path, target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        let rules = repo_file("dashboards/alerts.yml")
            .canonicalize()
            .expect("alerts.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: spillway\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .expect("prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
        let prometheus = Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = reqwest::get(format!("{}/-/ready", prometheus.base)).await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus did not get ready; its log:\n{}",
                std::fs::read_to_string(prometheus._dir.path().join("prometheus.log"))
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// An instant query: `Ok(result)` or `Err(the error Prometheus gave)`.
    async fn query(&self, promql: &str) -> Result<Vec<Json>, String> {
        let answer: Json = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", promql)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    async fn get(&self, path: &str) -> Json {
        reqwest::get(format!("{}{path}", self.base))
            .await
            .expect("Prometheus answers")
            .json()
            .await
            .expect("JSON")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_returns_data_and_every_alert_rule_evaluates_on_a_real_prometheus() {
    let binary = prometheus_binary();
    if let Some(promtool) = find_binary("promtool") {
        let checked = Command::new(promtool)
            .args(["check", "rules"])
            .arg(repo_file("dashboards/alerts.yml"))
            .output()
            .expect("promtool runs");
        assert!(
            checked.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
    }
    let pipelines = pipelines::start().await;
    let prometheus = Prometheus::start(&binary, &pipelines.worker.address().to_string()).await;
    // Records keep flowing while Prometheus scrapes, so rates and latencies move.
    let bootstrap = pipelines.broker.bootstrap();
    let producing = tokio::spawn(async move {
        for round in 0..60u32 {
            let records = (0..5)
                .map(|n| TestRecord {
                    value: Some(format!("round {round} record {n}").into_bytes()),
                    ..TestRecord::default()
                })
                .collect();
            produce(&bootstrap, CLASSIC_TOPIC, records, "none").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    wait_for_scrapes(
        &prometheus,
        "kafka_connect_connect_worker_metrics_task_count",
    )
    .await;

    let mut failures = Vec::new();
    let mut checked = 0;
    for name in DASHBOARDS {
        let (failed, ran) = failed_queries(&prometheus, name).await;
        failures.extend(failed);
        checked += ran;
    }

    let alerts = std::fs::read_to_string(repo_file("dashboards/alerts.yml")).expect("alerts.yml");
    let expected_rules = alerts.matches("- alert:").count();
    let rules = prometheus.get("/api/v1/rules").await;
    let loaded: Vec<Json> = rules["data"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(loaded.len(), expected_rules, "{rules}");
    for rule in &loaded {
        let name = rule["name"].as_str().unwrap_or("?");
        let query = rule["query"].as_str().expect("a rule query");
        if let Err(e) = prometheus.query(query).await {
            failures.push(format!("alert {name}: {e}"));
        }
        // Rules are evaluated every second; one that cannot be evaluated says why.
        if rule["health"] == "err" {
            failures.push(format!(
                "alert {name} cannot be evaluated: {}",
                rule["lastError"]
            ));
        }
    }
    producing.abort();
    assert!(
        failures.is_empty(),
        "{} of {checked} dashboard queries and {} alert rules failed:\n{}",
        failures.len(),
        loaded.len(),
        failures.join("\n")
    );
    drop(prometheus);
    pipelines.stop().await;
}

/// The replication dashboard against a real Prometheus scraping `spillway mirror`'s /metrics
/// while a flow copies records and checkpoints a consumer group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replication_panel_query_returns_data_for_a_running_mirror() {
    let binary = prometheus_binary();
    // Checkpoints list the source's groups: the proxies answer ListGroups as Kafka does.
    let groups = || ProxyOptions::new(ProxySecurity::Plaintext).with_one_group_namespace();
    let a = ProxiedDevBroker::start_with(1, &[("orders", 2)], groups()).expect("cluster A");
    let b = ProxiedDevBroker::start_with(1, &[], groups()).expect("cluster B");
    produce(&a.broker().bootstrap(), "orders", numbered(0, 20), "none").await;
    // A group with committed offsets on A (through A's proxy, which learns groups from what
    // it forwards), so that every round checkpoints it.
    let group: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", a.bootstrap())
        .set("group.id", "billing")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut offsets = TopicPartitionList::new();
    for p in 0..2 {
        offsets
            .add_partition_offset("orders", p, rdkafka::Offset::Offset(5))
            .expect("offset");
    }
    group.commit(&offsets, CommitMode::Sync).expect("commit");

    let text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
         replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         refresh.topics.interval.seconds = 1\nemit.heartbeats.interval.seconds = 1\n\
         A->B.enabled = true\nA->B.topics = orders\ngroups = billing\n\
         emit.checkpoints.interval.seconds = 1\noffset.lag.max = 1\n",
        a.bootstrap(),
        b.bootstrap()
    );
    let config =
        MirrorConfig::parse(&parse_properties(&text).expect("properties").to_map()).expect("valid");
    // The kafka sink records MM2's metrics through the global provider.
    let telemetry = Arc::new(Telemetry::build(false).expect("metrics pipeline"));
    telemetry.install_global();
    let (metrics_tx, metrics_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let mirror = tokio::spawn(spillway::mirror::run_until(
        config,
        telemetry,
        Some("127.0.0.1:0".parse().expect("address")),
        move |started| {
            let _ = metrics_tx.send(started.metrics.expect("metrics served"));
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let metrics = tokio::time::timeout(Duration::from_secs(60), metrics_rx)
        .await
        .expect("the flows start in time")
        .expect("the flows started");
    let prometheus = Prometheus::start(&binary, &metrics.to_string()).await;
    let bootstrap = a.broker().bootstrap();
    let producing = tokio::spawn(async move {
        for round in 1..120u64 {
            produce(&bootstrap, "orders", numbered(round * 20, 20), "none").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    wait_for_scrapes(
        &prometheus,
        "kafka_connect_mirror_checkpoint_connector_checkpoint_latency_ms_count",
    )
    .await;
    let (failures, checked) = failed_queries(&prometheus, REPLICATION).await;
    producing.abort();
    assert!(
        failures.is_empty(),
        "{} of {checked} replication dashboard queries failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    drop(prometheus);
    let _ = stop_tx.send(());
    mirror
        .await
        .expect("joins")
        .expect("the mirror stops cleanly");
}

/// Records `first..first + n`, spread over both partitions.
fn numbered(first: u64, n: u64) -> Vec<TestRecord> {
    (first..first + n)
        .map(|i| TestRecord {
            partition: Some((i % 2) as i32),
            key: Some(format!("k{i}").into_bytes()),
            value: Some(format!("v{i}").into_bytes()),
            timestamp: Some(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_millis() as i64,
            ),
            ..TestRecord::default()
        })
        .collect()
}
