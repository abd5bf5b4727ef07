//! MirrorMaker 2's connectors on a REST worker: `POST /connectors` with
//! `connector.class=org.apache.kafka.connect.mirror.MirrorSourceConnector` (or
//! `MirrorCheckpointConnector`, `MirrorHeartbeatConnector`, by full or short name) and MM2's
//! connector keys runs the same flow `spillway mirror` runs for that pair of clusters, limited
//! to the connector's part ([`FlowParts`]).
//!
//! The connector's keys are MM2's (`MirrorConnectorConfig` and its subclasses):
//! `source.cluster.alias`, `target.cluster.alias`, `source.cluster.bootstrap.servers`,
//! `target.cluster.bootstrap.servers`, the clusters' client keys as `source.cluster.<key>` /
//! `target.cluster.<key>` (security), `source.consumer.*`, `target.producer.*`,
//! `source.admin.*`, `target.admin.*`, and the flow keys of MM2's file (`topics`, `groups`,
//! `replication.policy.class`, `emit.checkpoints.interval.seconds`, ...). They are read by turning
//! them into the dedicated mode's properties for the flow `source->target`, so a value is
//! checked, and refused naming its key, exactly as in a `mm2.properties` file.

use std::collections::BTreeMap;
use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};
use spillway_connectors::ConnectorRegistry;
use spillway_core::ConfigMap;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::config::{FlowSettings, MirrorConfig};
use super::flow::{checkpoints_apply, FlowParts, FlowRunner, SharedProgress};

const PACKAGE: &str = "org.apache.kafka.connect.mirror.";

/// Which of MM2's connectors a class names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorConnector {
    Source,
    Checkpoint,
    Heartbeat,
}

impl MirrorConnector {
    /// The connector a `connector.class` names, by MM2's full class name or its simple name.
    pub fn of_class(class: &str) -> Option<MirrorConnector> {
        let class = class.trim();
        let simple = class.strip_prefix(PACKAGE).unwrap_or(class);
        match simple {
            "MirrorSourceConnector" => Some(MirrorConnector::Source),
            "MirrorCheckpointConnector" => Some(MirrorConnector::Checkpoint),
            "MirrorHeartbeatConnector" => Some(MirrorConnector::Heartbeat),
            _ => None,
        }
    }

    /// The connector `config` names, if it is one of MM2's.
    pub fn of_config(config: &ConfigMap) -> Option<MirrorConnector> {
        config
            .get("connector.class")
            .and_then(|c| MirrorConnector::of_class(c))
    }

    pub fn class(self) -> String {
        format!(
            "{PACKAGE}{}",
            match self {
                MirrorConnector::Source => "MirrorSourceConnector",
                MirrorConnector::Checkpoint => "MirrorCheckpointConnector",
                MirrorConnector::Heartbeat => "MirrorHeartbeatConnector",
            }
        )
    }

    /// The part of the flow this connector runs.
    fn parts(self, flow: &FlowSettings) -> FlowParts {
        match self {
            MirrorConnector::Source => FlowParts {
                copy: true,
                offset_syncs: checkpoints_apply(flow),
                checkpoints: false,
                heartbeats: false,
            },
            MirrorConnector::Checkpoint => FlowParts {
                copy: false,
                offset_syncs: false,
                checkpoints: checkpoints_apply(flow),
                heartbeats: false,
            },
            MirrorConnector::Heartbeat => FlowParts {
                copy: false,
                offset_syncs: false,
                checkpoints: false,
                heartbeats: flow.emit_heartbeats,
            },
        }
    }
}

/// Connect's own connector keys, which mean nothing to the flow.
const CONNECT_KEYS: &[&str] = &[
    "name",
    "connector.class",
    "key.converter",
    "value.converter",
    "header.converter",
    "config.action.reload",
    "tenant",
];

/// A mirror connector's keys read as its flow: the flow, its clusters and the warnings.
#[derive(Debug)]
pub struct MirrorPlan {
    pub connector: MirrorConnector,
    pub config: MirrorConfig,
    pub flow: FlowSettings,
    pub parts: FlowParts,
}

/// Why a mirror connector's config cannot run: (key, message) pairs, as `validate` reports.
pub type MirrorConfigErrors = Vec<(String, String)>;

/// Reads a mirror connector's config; `Err` names each key that is missing or invalid.
pub fn plan(
    connector: MirrorConnector,
    config: &ConfigMap,
) -> Result<MirrorPlan, MirrorConfigErrors> {
    let mut errors = Vec::new();
    let alias = |key: &str, default: Option<&str>| -> Option<String> {
        match config.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            Some(v) => Some(v.to_owned()),
            None => default.map(str::to_owned),
        }
    };
    let source = alias("source.cluster.alias", None);
    // MM2's default target alias.
    let target = alias("target.cluster.alias", Some("target"));
    if source.is_none() {
        errors.push((
            "source.cluster.alias".to_owned(),
            "source.cluster.alias is required: the name of the cluster records are copied from (MM2's source.cluster.alias)".to_owned(),
        ));
    }
    for key in [
        "source.cluster.bootstrap.servers",
        "target.cluster.bootstrap.servers",
    ] {
        if config.get(key).is_none_or(|v| v.trim().is_empty()) {
            errors.push((
                key.to_owned(),
                format!("{key} is required: the cluster's bootstrap servers, as MM2's connectors need them"),
            ));
        }
    }
    let (Some(source), Some(target)) = (source, target) else {
        return Err(errors);
    };
    if source == target {
        errors.push((
            "target.cluster.alias".to_owned(),
            format!("source.cluster.alias and target.cluster.alias are both '{source}': a flow copies between two clusters"),
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let flow_name = format!("{source}->{target}");
    let mut props = ConfigMap::new();
    props.insert("clusters".into(), format!("{source}, {target}"));
    // The file key each connector key becomes, to name the connector's key in errors.
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    let mut put = |props: &mut ConfigMap, file_key: String, key: &str, value: &str| {
        origin.insert(file_key.clone(), key.to_owned());
        props.insert(file_key, value.to_owned());
    };
    for (key, value) in config {
        if CONNECT_KEYS.contains(&key.as_str()) {
            continue;
        }
        let file_key = if let Some(rest) = key.strip_prefix("source.cluster.") {
            format!("{source}.{rest}")
        } else if let Some(rest) = key.strip_prefix("target.cluster.") {
            format!("{target}.{rest}")
        } else if let Some(rest) = key.strip_prefix("source.consumer.") {
            format!("{source}.consumer.{rest}")
        } else if let Some(rest) = key.strip_prefix("source.admin.") {
            format!("{source}.admin.{rest}")
        } else if let Some(rest) = key.strip_prefix("target.producer.") {
            format!("{target}.producer.{rest}")
        } else if let Some(rest) = key.strip_prefix("target.admin.") {
            format!("{target}.admin.{rest}")
        } else {
            format!("{flow_name}.{key}")
        };
        put(&mut props, file_key, key, value);
    }
    // The connector's part of the flow: the others are other connectors' (MM2 runs each
    // connector on its own).
    let set = |props: &mut ConfigMap, key: &str, value: &str| {
        props.insert(format!("{flow_name}.{key}"), value.to_owned());
    };
    match connector {
        MirrorConnector::Source => {
            set(&mut props, "enabled", "true");
            // Offset syncs are the source connector's (MM2's emit.offset-syncs.enabled); the
            // checkpoints they serve are the checkpoint connector's.
            set(&mut props, "emit.checkpoints.enabled", "true");
            set(&mut props, "emit.heartbeats.enabled", "false");
        }
        MirrorConnector::Checkpoint => {
            set(&mut props, "enabled", "true");
            set(&mut props, "emit.heartbeats.enabled", "false");
        }
        MirrorConnector::Heartbeat => {
            set(&mut props, "enabled", "false");
        }
    }
    // The reverse flow is not this connector's.
    props.insert(
        format!("{target}->{source}.emit.heartbeats.enabled"),
        "false".into(),
    );
    let parsed = MirrorConfig::parse(&props).map_err(|e| {
        let text = e.to_string();
        let key = match &e {
            super::config::MirrorConfigError::Missing { key, .. }
            | super::config::MirrorConfigError::Invalid { key, .. } => key.clone(),
        };
        let named = origin.get(&key).cloned().unwrap_or(key.clone());
        vec![(named.clone(), text.replace(&key, &named))]
    })?;
    let flow = parsed.flow(&flow_name).cloned().ok_or_else(|| {
        vec![(
            "source.cluster.alias".to_owned(),
            format!("no flow {flow_name}"),
        )]
    })?;
    let parts = connector.parts(&flow);
    if connector == MirrorConnector::Checkpoint && !parts.checkpoints {
        return Err(vec![(
            "emit.checkpoints.enabled".to_owned(),
            "this MirrorCheckpointConnector would do nothing: checkpoints need emit.checkpoints.enabled or sync.group.offsets.enabled, emit.offset-syncs.enabled, and a classic copy (consumer.group.protocol is not share)".to_owned(),
        )]);
    }
    Ok(MirrorPlan {
        connector,
        config: parsed,
        flow,
        parts,
    })
}

/// One mirror connector running on this worker.
struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    progress: SharedProgress,
}

/// What a running mirror connector reports for `GET /connectors/{name}/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorStatus {
    /// `RUNNING`, or `FAILED` when its flow stopped by itself.
    pub state: &'static str,
    /// The flow's last problem (a topic it cannot replicate yet, a checkpoint it could not
    /// write), while it goes on.
    pub trace: Option<String>,
}

/// The mirror connectors of one worker, by runtime name.
#[derive(Default)]
pub struct MirrorConnectors {
    running: Mutex<BTreeMap<String, Running>>,
}

impl MirrorConnectors {
    /// Starts `config`'s part of its flow under `name` (stopping one of that name first).
    pub async fn start(
        &self,
        name: &str,
        config: &ConfigMap,
        registry: ConnectorRegistry,
    ) -> Result<()> {
        self.stop(name).await;
        let connector = MirrorConnector::of_config(config)
            .ok_or_else(|| anyhow!("{name} is not a MirrorMaker 2 connector"))?;
        let plan = plan(connector, config).map_err(|errors| {
            anyhow!(
                "{}",
                errors
                    .into_iter()
                    .map(|(_, message)| message)
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })?;
        for warning in &plan.config.warnings {
            warn!(connector = %name, "{warning}");
        }
        let meter = opentelemetry::global::meter(crate::metrics::METER_NAME);
        let runner = FlowRunner::start_parts(
            plan.flow.clone(),
            plan.parts,
            plan.config.cluster(&plan.flow.source).clone(),
            plan.config.cluster(&plan.flow.target).clone(),
            registry,
            &meter,
        )
        .await
        .with_context(|| format!("cannot start {} {name}", connector.class()))?;
        let progress = runner.progress();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(runner.run(stopped));
        info!(connector = %name, class = %connector.class(), flow = %plan.flow.name(), "mirror connector started");
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                name.to_owned(),
                Running {
                    stop,
                    task,
                    progress,
                },
            );
        Ok(())
    }

    /// Stops `name` gracefully (its copy finishes the batches in flight and commits); false
    /// when it was not running here.
    pub async fn stop(&self, name: &str) -> bool {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        let Some(running) = running else {
            return false;
        };
        let _ = running.stop.send(true);
        if let Err(e) = running.task.await {
            warn!(connector = %name, error = %e, "the mirror connector's flow ended abnormally");
        }
        true
    }

    /// The status of `name`, if it runs here.
    pub fn status(&self, name: &str) -> Option<MirrorStatus> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let r = running.get(name)?;
        let trace = r
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error
            .clone();
        Some(if r.task.is_finished() {
            MirrorStatus {
                state: "FAILED",
                trace: Some(trace.unwrap_or_else(|| "the mirror flow stopped".to_owned())),
            }
        } else {
            MirrorStatus {
                state: "RUNNING",
                trace,
            }
        })
    }

    /// The names running here.
    pub fn names(&self) -> Vec<String> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// What `name` has done so far (for tests and logs).
    pub fn progress(&self, name: &str) -> Option<SharedProgress> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|r| std::sync::Arc::clone(&r.progress))
    }

    /// Stops every mirror connector (the worker's shutdown).
    pub async fn stop_all(&self) {
        for name in self.names() {
            self.stop(&name).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::config::config_map;

    fn source_config(extra: &[(&str, &str)]) -> ConfigMap {
        let mut config = config_map(&[
            (
                "connector.class",
                "org.apache.kafka.connect.mirror.MirrorSourceConnector",
            ),
            ("name", "a-to-b"),
            ("source.cluster.alias", "A"),
            ("target.cluster.alias", "B"),
            ("source.cluster.bootstrap.servers", "a:9092"),
            ("target.cluster.bootstrap.servers", "b:9092"),
        ]);
        for (k, v) in extra {
            config.insert((*k).into(), (*v).into());
        }
        config
    }

    #[test]
    fn the_three_classes_are_known_by_full_and_simple_name() {
        for (class, kind) in [
            ("MirrorSourceConnector", MirrorConnector::Source),
            ("MirrorCheckpointConnector", MirrorConnector::Checkpoint),
            ("MirrorHeartbeatConnector", MirrorConnector::Heartbeat),
        ] {
            assert_eq!(MirrorConnector::of_class(class), Some(kind));
            assert_eq!(MirrorConnector::of_class(&kind.class()), Some(kind));
        }
        assert_eq!(MirrorConnector::of_class("file"), None);
    }

    #[test]
    fn a_source_connectors_keys_become_its_flow() {
        let config = source_config(&[
            ("topics", "orders.*"),
            ("replication.factor", "1"),
            ("source.cluster.security.protocol", "SASL_PLAINTEXT"),
            ("source.cluster.sasl.mechanism", "PLAIN"),
            ("source.cluster.sasl.username", "u"),
            ("source.cluster.sasl.password", "p"),
            ("refresh.topics.interval.seconds", "5"),
        ]);
        let plan = plan(MirrorConnector::Source, &config).expect("valid");
        assert_eq!(plan.flow.name(), "A->B");
        assert!(plan.flow.enabled);
        assert!(plan.flow.topics.matches("orders-eu"));
        assert!(!plan.flow.topics.matches("payments"));
        assert_eq!(plan.flow.replication_factor, 1);
        assert_eq!(plan.flow.refresh_topics_interval.as_secs(), 5);
        assert_eq!(plan.config.cluster("A").bootstrap_servers, "a:9092");
        assert_eq!(
            plan.config
                .cluster("A")
                .security
                .get("sasl.username")
                .map(String::as_str),
            Some("u")
        );
        assert_eq!(
            plan.parts,
            FlowParts {
                copy: true,
                offset_syncs: true,
                checkpoints: false,
                heartbeats: false
            }
        );
    }

    #[test]
    fn checkpoint_and_heartbeat_connectors_run_only_their_part() {
        let mut config = source_config(&[("groups", "app-.*")]);
        let checkpoint = plan(MirrorConnector::Checkpoint, &config).expect("valid");
        assert_eq!(
            checkpoint.parts,
            FlowParts {
                copy: false,
                offset_syncs: false,
                checkpoints: true,
                heartbeats: false
            }
        );
        assert!(checkpoint.flow.groups.matches("app-1"));
        config.insert("connector.class".into(), "MirrorHeartbeatConnector".into());
        let heartbeat = plan(MirrorConnector::Heartbeat, &config).expect("valid");
        assert_eq!(
            heartbeat.parts,
            FlowParts {
                copy: false,
                offset_syncs: false,
                checkpoints: false,
                heartbeats: true
            }
        );
    }

    #[test]
    fn missing_and_invalid_keys_are_named_as_the_connector_has_them() {
        let mut config = source_config(&[]);
        config.remove("source.cluster.alias");
        config.remove("target.cluster.bootstrap.servers");
        let errors = plan(MirrorConnector::Source, &config).expect_err("refused");
        let keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["source.cluster.alias", "target.cluster.bootstrap.servers"]
        );
        let errors = plan(
            MirrorConnector::Source,
            &source_config(&[("refresh.topics.interval.seconds", "soon")]),
        )
        .expect_err("refused");
        assert_eq!(errors[0].0, "refresh.topics.interval.seconds");
        assert!(
            errors[0].1.contains("refresh.topics.interval.seconds") && errors[0].1.contains("soon"),
            "{errors:?}"
        );
        assert!(!errors[0].1.contains("A->B."), "{errors:?}");
    }

    #[test]
    fn a_checkpoint_connector_on_a_share_flow_is_refused_as_doing_nothing() {
        let config = source_config(&[("consumer.group.protocol", "share")]);
        let errors = plan(MirrorConnector::Checkpoint, &config).expect_err("refused");
        assert_eq!(errors[0].0, "emit.checkpoints.enabled");
    }
}
