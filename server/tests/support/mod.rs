//! Shared by the REST tests: a dev broker, a worker serving the REST API in this process, and
//! a small HTTP client that returns status and JSON.

#![allow(dead_code)] // Each test file uses a different part of this module.

pub mod eos;
pub mod pipelines;
pub mod process;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value as Json;
use spillway::worker_cmd::RunningWorker;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{
    ConfigError, ConfigMap, PutOutcome, SinkConnector, SinkError, SinkRecord, SinkTask,
};
use spillway_tests::DevBroker;

/// A dev broker whose share groups read from the earliest offset and give up locks quickly.
pub fn broker() -> DevBroker {
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(2000);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(3000);
    broker
}

pub use spillway_core::config::config_map as config;

/// The worker properties of the tests: a free port on localhost, quick restarts.
pub fn worker_config(broker: &DevBroker, state_dir: &Path) -> ConfigMap {
    config(&[
        ("bootstrap.servers", &broker.bootstrap()),
        ("rest.host.name", "127.0.0.1"),
        ("rest.port", "0"),
        ("state.dir", &state_dir.display().to_string()),
        ("task.restart.backoff.ms", "100"),
        ("task.restart.max.attempts", "0"),
        ("task.poll.timeout.ms", "100"),
    ])
}

/// The built-in sinks plus `vault`, a sink with a password key and a secret-named int key.
pub fn registry() -> ConnectorRegistry {
    ConnectorRegistry::builtin()
        .with(&["vault"], || Box::new(VaultConnector::default()))
        .with(&["slow"], || Box::new(SlowConnector::default()))
}

pub async fn start_worker(broker: &DevBroker, state_dir: &Path) -> (RunningWorker, Client) {
    start_worker_with(broker, state_dir, &[]).await
}

/// [`start_worker`] with more worker properties.
pub async fn start_worker_with(
    broker: &DevBroker,
    state_dir: &Path,
    extra: &[(&str, &str)],
) -> (RunningWorker, Client) {
    let mut properties = worker_config(broker, state_dir);
    properties.extend(config(extra));
    let worker = RunningWorker::start(properties, registry())
        .await
        .expect("the worker starts");
    let client = Client::new(&format!("http://{}", worker.address()));
    client
        .wait_for("/health", Duration::from_secs(30), |h| {
            h["status"] == "healthy"
        })
        .await;
    (worker, client)
}

/// Status and JSON body of one answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Json,
    pub text: String,
}

impl Answer {
    /// Asserts an error in Connect's shape: `{"error_code": status, "message": ...}`.
    pub fn assert_error(&self, status: u16) -> &str {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.body["error_code"], status, "{}", self.text);
        self.body["message"].as_str().expect("a message")
    }
}

#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer <token>`.
    token: Option<String>,
}

impl Client {
    pub fn new(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            token: None,
        }
    }

    /// The same server, called with `token`.
    pub fn with_token(&self, token: &str) -> Client {
        Client {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    pub async fn send(&self, method: Method, path: &str, body: Option<String>) -> Answer {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(Duration::from_secs(60));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let plain_text = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/plain"));
        let text = response.text().await.expect("a body");
        // `/metrics` answers Prometheus text; everything else answers JSON.
        let body = if text.is_empty() || plain_text {
            Json::Null
        } else {
            serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{method} {path} answered non-JSON '{text}': {e}"))
        };
        Answer { status, body, text }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(Method::DELETE, path, None).await
    }

    pub async fn post(&self, path: &str, body: Json) -> Answer {
        self.send(Method::POST, path, Some(body.to_string())).await
    }

    pub async fn post_empty(&self, path: &str) -> Answer {
        self.send(Method::POST, path, None).await
    }

    pub async fn put(&self, path: &str, body: Json) -> Answer {
        self.send(Method::PUT, path, Some(body.to_string())).await
    }

    pub async fn put_empty(&self, path: &str) -> Answer {
        self.send(Method::PUT, path, None).await
    }

    pub async fn patch(&self, path: &str, body: Json) -> Answer {
        self.send(Method::PATCH, path, Some(body.to_string())).await
    }

    /// Polls `GET path` until `check` holds for the body, or panics after `timeout`.
    pub async fn wait_for(
        &self,
        path: &str,
        timeout: Duration,
        check: impl Fn(&Json) -> bool,
    ) -> Json {
        let start = Instant::now();
        loop {
            let answer = self.get(path).await;
            if answer.status == 200 && check(&answer.body) {
                return answer.body;
            }
            assert!(
                start.elapsed() < timeout,
                "GET {path} did not reach the expected state in {timeout:?}; last answer {} {}",
                answer.status,
                answer.text
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A sink whose configuration holds secrets: `vault.password` (declared PASSWORD) and
/// `vault.token.ttl` (an int whose name says secret). Tasks accept every record.
#[derive(Default)]
pub struct VaultConnector {
    config: ConfigMap,
}

fn vault_def() -> ConfigDef {
    ConfigDef::new()
        .define(ConfigKey::new(
            "vault.password",
            ConfigType::Password,
            Importance::High,
            "Password.",
        ))
        .define(
            ConfigKey::new("vault.token.ttl", ConfigType::Int, Importance::Low, "TTL.")
                .default("60"),
        )
}

impl SinkConnector for VaultConnector {
    fn version(&self) -> &str {
        "1.0"
    }

    fn config_def(&self) -> ConfigDef {
        vault_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        vault_def().parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(spillway_connectors::file::FileSinkTask::default())
    }
}

/// A sink that takes `slow.put.ms` for every batch, or with `slow.fail=true` fails every
/// batch for good: a tenant in trouble. With `slow.file` it appends `topic/partition/offset`
/// of every record it took to that file.
#[derive(Default)]
pub struct SlowConnector {
    config: ConfigMap,
}

fn slow_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                "slow.put.ms",
                ConfigType::Long,
                Importance::Low,
                "Time per batch.",
            )
            .default("1000"),
        )
        .define(
            ConfigKey::new(
                "slow.fail",
                ConfigType::Boolean,
                Importance::Low,
                "Fail batches.",
            )
            .default("false"),
        )
        .define(
            ConfigKey::new(
                "slow.file",
                ConfigType::String,
                Importance::Low,
                "Where to note the records taken.",
            )
            .default(""),
        )
}

impl SinkConnector for SlowConnector {
    fn version(&self) -> &str {
        "1.0"
    }

    fn config_def(&self) -> ConfigDef {
        slow_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        slow_def().parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(SlowTask::default())
    }
}

#[derive(Default)]
struct SlowTask {
    put_time: Duration,
    fail: bool,
    file: Option<std::path::PathBuf>,
}

#[async_trait::async_trait]
impl SinkTask for SlowTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let parsed = slow_def()
            .parse(config)
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        let ms = parsed
            .long("slow.put.ms")
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        self.put_time = Duration::from_millis(ms.unsigned_abs());
        self.fail = parsed
            .boolean("slow.fail")
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        self.file = config
            .get("slow.file")
            .filter(|f| !f.is_empty())
            .map(std::path::PathBuf::from);
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        if self.fail {
            return Err(SinkError::fatal("the slow sink was told to fail"));
        }
        tokio::time::sleep(self.put_time).await;
        if let Some(path) = &self.file {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| SinkError::fatal(format!("{}: {e}", path.display())))?;
            let lines: String = records
                .iter()
                .map(|r| format!("{}/{}/{}\n", r.topic, r.partition, r.offset))
                .collect();
            file.write_all(lines.as_bytes())
                .map_err(|e| SinkError::fatal(format!("{}: {e}", path.display())))?;
        }
        Ok(records.iter().map(|_| PutOutcome::Ok).collect())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
