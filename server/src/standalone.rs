//! `spillway standalone WORKER.properties CONNECTOR.properties...`: Kafka Connect's standalone
//! mode. The worker file and each connector file are `.properties` (Connect's format) or JSON
//! (`{"name": ..., "config": {...}}` or a flat object). Runs until SIGTERM or SIGINT (Ctrl-C),
//! then stops every connector gracefully and exits 0: no more polls, in-flight batches finish
//! (or are released once `task.shutdown.graceful.timeout.ms` has passed), acknowledgements and
//! offsets are committed, groups are left. It serves the REST API as Connect's standalone
//! worker does (see [`run_until`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{config_map_from_json, parse_properties};
use spillway_core::ConfigMap;
use spillway_storage::{SledStore, TargetState};
use tracing::info;

use crate::herder::{Herder, DEFAULT_TENANT};
use crate::signals::StopSignals;
use crate::worker_cmd::RunningWorker;

/// Reads a configuration file: JSON when its first non-blank character is `{`, otherwise
/// `.properties`. Errors name the file (and the line, for properties).
pub fn read_config(path: &Path) -> Result<ConfigMap> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read configuration file {}", path.display()))?;
    let parsed = if text.trim_start().starts_with('{') {
        config_map_from_json(&text)
    } else {
        parse_properties(&text).map(|p| p.to_map())
    };
    parsed.with_context(|| format!("{} is not a valid configuration", path.display()))
}

/// Runs a worker configured by `worker_props` with the connectors of `connector_props` until
/// SIGTERM or SIGINT.
pub async fn run(worker_props: PathBuf, connector_props: Vec<PathBuf>) -> Result<()> {
    // Before anything else: a signal during start-up must stop gracefully too.
    let mut signals = StopSignals::listen()?;
    run_until(worker_props, connector_props, async move {
        let signal = signals.recv().await;
        info!(signal, "stop requested");
        Ok(())
    })
    .await
}

/// [`run`], stopping gracefully when `stop` completes (or failing with its error).
///
/// As Kafka Connect's standalone worker, it serves the REST API on `rest.port` (8083 unless
/// set; `listeners`, `rest.host.name` and the worker's other REST keys apply) and prints
/// `REST API listening on http://ADDRESS` once its files' connectors exist. Changes made over
/// REST last until the process stops: its state is in memory, and the connector files are read
/// again at every start.
pub async fn run_until(
    worker_props: PathBuf,
    connector_props: Vec<PathBuf>,
    stop: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    let worker_config = read_config(&worker_props)?;
    let connectors = connector_props
        .iter()
        .map(|p| read_config(p))
        .collect::<Result<Vec<_>>>()?;
    let store = SledStore::temporary().context("cannot open the in-memory state store")?;
    let worker = RunningWorker::start_with_store(
        worker_config,
        ConnectorRegistry::builtin(),
        Arc::new(store),
    )
    .await
    .with_context(|| format!("cannot start the worker of {}", worker_props.display()))?;
    let herder = Arc::clone(worker.herder());
    for (config, path) in connectors.into_iter().zip(&connector_props) {
        if let Err(e) = start_connector(&herder, config).await {
            worker.stop().await;
            return Err(e)
                .with_context(|| format!("cannot start the connector of {}", path.display()));
        }
    }
    // Printed once the files' connectors exist, so that a caller reading it finds them.
    for (scheme, address) in worker.listening() {
        println!("REST API listening on {}://{address}", scheme.as_str());
    }
    let _ = std::io::stdout().flush();
    for name in herder
        .connector_names(DEFAULT_TENANT)
        .await
        .unwrap_or_default()
    {
        if let Ok(status) = herder.status(DEFAULT_TENANT, &name).await {
            info!(connector = %name, state = %status.connector.state, tasks = status.tasks.len(), "running");
        }
    }
    worker
        .run_until(async move {
            let mut report = tokio::time::interval(PROGRESS_INTERVAL);
            report.tick().await;
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    stopped = &mut stop => return stopped,
                    _ = report.tick() => log_progress(&herder),
                }
            }
        })
        .await
}

/// How often the progress of each connector is logged.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(30);

/// Creates a connector file's connector through the herder, as `POST /connectors` would, and
/// fails when it cannot start (Connect's standalone worker exits then too).
async fn start_connector(herder: &Herder, config: ConfigMap) -> Result<()> {
    let name = config
        .get("name")
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .context("the connector configuration has no 'name'; add name=<connector name>")?;
    herder
        .create(DEFAULT_TENANT, config, &name, TargetState::Running)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let status = herder
        .status(DEFAULT_TENANT, &name)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if status.connector.state == "FAILED" {
        bail!(
            "connector {name} failed to start: {}",
            status
                .connector
                .trace
                .as_deref()
                .unwrap_or("no reason given")
        );
    }
    Ok(())
}

/// Logs each connector's counts, and the trace of every task that has one.
fn log_progress(herder: &Herder) {
    for status in herder.worker().statuses() {
        let t = status.totals();
        info!(connector = %status.name, state = %status.state, read = t.read, accepted = t.accepted, released = t.released, rejected = t.rejected, "progress");
        for task in status.tasks.iter().filter(|t| t.trace.is_some()) {
            info!(connector = %status.name, task = task.id, state = %task.state, trace = task.trace.as_deref().unwrap_or(""), "task problem");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("spillway-standalone-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("temp file");
        path
    }

    #[test]
    fn properties_and_json_files_are_both_read() {
        let props = write(
            "c.properties",
            "name=files\nconnector.class=FileStreamSink\ntopics=orders\nfile=/tmp/out.txt\n",
        );
        let json = write(
            "c.json",
            r#"{"name": "files", "config": {"connector.class": "FileStreamSink", "topics": "orders", "tasks.max": 2}}"#,
        );
        let a = read_config(&props).expect("properties");
        let b = read_config(&json).expect("json");
        assert_eq!(a["connector.class"], "FileStreamSink");
        assert_eq!(b["name"], "files");
        assert_eq!(b["tasks.max"], "2");
        let _ = std::fs::remove_file(props);
        let _ = std::fs::remove_file(json);
    }

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let err = read_config(Path::new("/no/such/worker.properties")).expect_err("missing");
        assert!(
            err.to_string().contains("/no/such/worker.properties"),
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn standalone_runs_connect_style_files_until_stopped() {
        let broker = spillway_tests::DevBroker::start(1);
        broker.set_share_auto_offset_reset("earliest");
        broker.create_topic("standalone", 2);
        spillway_tests::produce(
            &broker.bootstrap(),
            "standalone",
            spillway_tests::numbered_records(100, 16, 2),
            "none",
        )
        .await;
        let out = std::env::temp_dir().join(format!(
            "spillway-standalone-{}-out.txt",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&out);
        let worker = write(
            "worker.properties",
            &format!(
                "# Connect standalone worker\nbootstrap.servers={}\n\
                 key.converter=org.apache.kafka.connect.storage.StringConverter\n\
                 value.converter=org.apache.kafka.connect.storage.StringConverter\n\
                 offset.storage.file.filename=/tmp/connect.offsets\nrest.port=0\n",
                broker.bootstrap()
            ),
        );
        let connector = write(
            "sink.properties",
            &format!(
                "name=local-file-sink\nconnector.class=FileStreamSink\ntasks.max=2\n\
                 topics=standalone\nfile={}\nconsumer.override.group.protocol=share\n",
                out.display()
            ),
        );
        let lines = || {
            std::fs::read_to_string(&out)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        let stop = async {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while lines() < 100 && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(())
        };
        run_until(worker.clone(), vec![connector.clone()], stop)
            .await
            .expect("runs and stops");
        assert!(lines() >= 100, "{} lines", lines());
        for f in [worker, connector, out] {
            let _ = std::fs::remove_file(f);
        }
    }

    #[tokio::test]
    async fn a_worker_file_without_bootstrap_servers_is_refused_naming_the_key() {
        let worker = write(
            "w.properties",
            "consumer.group.protocol=share\nrest.port=0\n",
        );
        let err = run(worker.clone(), Vec::new())
            .await
            .expect_err("no bootstrap");
        assert!(format!("{err:#}").contains("bootstrap.servers"), "{err:#}");
        let _ = std::fs::remove_file(worker);
    }
}
