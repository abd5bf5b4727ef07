//! The `kafka` sink: MirrorMaker-style replication into a target cluster (the source cluster
//! unless `target.bootstrap.servers` says otherwise), into the topic `topic.rename.format`
//! names (`${topic}` is the record's topic after transforms).
//!
//! Key, value, headers and timestamp are written as read: the record is serialized back with
//! the connector's own converters (the `bytearray` default passes the original bytes through).
//! The partition is kept (`target.partition=keep`, the target topic needs at least as many
//! partitions) or chosen by hashing the key (`hash`). The producer is idempotent, and `put`
//! returns only once the target confirmed every record, so an accepted source record is in the
//! target.
//!
//! When tracing is on, each record's `traceparent`/`tracestate` headers are replaced by the
//! context of the runtime's `put` span (see docs/observability.md), so the trace goes on.

use async_trait::async_trait;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use spillway_core::connector::replicate_task_configs;
use spillway_core::convert::{strip_prefix, RecordConverter};
use spillway_core::{
    ConfigError, ConfigMap, PutOutcome, SinkConnector, SinkError, SinkRecord, SinkTask,
};
use spillway_kafka::producer::{IdempotentProducer, OutRecord};

use crate::runtime_keys::SOURCE_BOOTSTRAP_SERVERS;

pub const TARGET_BOOTSTRAP_SERVERS: &str = "target.bootstrap.servers";
pub const TOPIC_RENAME_FORMAT: &str = "topic.rename.format";
pub const TARGET_PARTITION: &str = "target.partition";
pub const PRODUCER_OVERRIDE_PREFIX: &str = "producer.override.";

/// Names `connector.class` may use for this sink.
pub const NAMES: &[&str] = &["kafka", "KafkaSink", "KafkaSinkConnector"];

fn config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                TARGET_BOOTSTRAP_SERVERS,
                ConfigType::String,
                Importance::High,
                "Bootstrap servers of the target cluster; the source cluster when not set.",
            )
            .null_default()
            .display_name("Target bootstrap servers"),
        )
        .define(
            ConfigKey::new(
                TOPIC_RENAME_FORMAT,
                ConfigType::String,
                Importance::High,
                "Target topic name; ${topic} stands for the record's topic.",
            )
            .default("${topic}")
            .display_name("Topic rename format"),
        )
        .define(
            ConfigKey::new(
                TARGET_PARTITION,
                ConfigType::String,
                Importance::Medium,
                "keep: write to the source record's partition; hash: let the key's hash choose.",
            )
            .default("keep")
            .validator(Validator::OneOf(&["keep", "hash"]))
            .display_name("Target partition"),
        )
}

/// The connector: every task gets the same configuration.
#[derive(Default)]
pub struct KafkaSinkConnector {
    config: ConfigMap,
}

impl SinkConnector for KafkaSinkConnector {
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_def(&self) -> ConfigDef {
        config_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        config_def().parse(config)?;
        target_bootstrap(config)?;
        let format = config
            .get(TOPIC_RENAME_FORMAT)
            .map(String::as_str)
            .unwrap_or("${topic}");
        if format.trim().is_empty() {
            return Err(ConfigError::InvalidValue {
                key: TOPIC_RENAME_FORMAT.into(),
                value: format.into(),
                reason: "must name a topic; use ${topic} for the source topic's name".into(),
            });
        }
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(KafkaSinkTask::default())
    }
}

fn target_bootstrap(config: &ConfigMap) -> Result<String, ConfigError> {
    config
        .get(TARGET_BOOTSTRAP_SERVERS)
        .or_else(|| config.get(SOURCE_BOOTSTRAP_SERVERS))
        .filter(|s| !s.trim().is_empty())
        .cloned()
        .ok_or_else(|| ConfigError::Missing {
            key: TARGET_BOOTSTRAP_SERVERS.into(),
        })
}

/// The target topic for `topic` under `format`.
pub fn rename(format: &str, topic: &str) -> String {
    format.replace("${topic}", topic)
}

/// One replicating producer.
#[derive(Default)]
pub struct KafkaSinkTask {
    state: Option<Running>,
}

struct Running {
    producer: IdempotentProducer,
    converter: RecordConverter,
    format: String,
    keep_partition: bool,
}

#[async_trait]
impl SinkTask for KafkaSinkTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let fatal = |e: ConfigError| SinkError::fatal(e.to_string());
        let parsed = config_def().parse(config).map_err(fatal)?;
        let bootstrap = target_bootstrap(config).map_err(fatal)?;
        let overrides = strip_prefix(config, PRODUCER_OVERRIDE_PREFIX);
        let producer = IdempotentProducer::new(
            &bootstrap,
            overrides.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .map_err(|e| SinkError::fatal(e.to_string()))?;
        let converter = RecordConverter::from_config(config, &ConfigMap::new()).map_err(fatal)?;
        self.state = Some(Running {
            producer,
            converter,
            format: parsed
                .string(TOPIC_RENAME_FORMAT)
                .map_err(fatal)?
                .unwrap_or("${topic}")
                .to_owned(),
            keep_partition: parsed.string(TARGET_PARTITION).map_err(fatal)? != Some("hash"),
        });
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        let Some(state) = &self.state else {
            return Err(SinkError::fatal("put before start"));
        };
        // A record that cannot be serialized fails alone; the rest are sent.
        let mut outcomes: Vec<Option<PutOutcome>> = vec![None; records.len()];
        let mut out = Vec::with_capacity(records.len());
        let mut positions = Vec::with_capacity(records.len());
        // The runtime's `put` span is current here (it enters it around `put`).
        let trace_context = opentelemetry::Context::current();
        for (i, record) in records.iter().enumerate() {
            match state.converter.to_raw_record(record) {
                Ok(mut raw) => {
                    crate::trace_context::replace(&mut raw.headers, &trace_context);
                    out.push(OutRecord {
                        topic: rename(&state.format, &record.topic),
                        partition: state.keep_partition.then_some(record.partition),
                        key: raw.key,
                        value: raw.value,
                        headers: raw.headers,
                        timestamp: raw.timestamp,
                    });
                    positions.push(i);
                }
                Err(e) => outcomes[i] = Some(PutOutcome::Fatal(SinkError::fatal(e.to_string()))),
            }
        }
        for (i, result) in positions
            .into_iter()
            .zip(state.producer.send_all(&out).await)
        {
            outcomes[i] = Some(match result {
                Ok(_) => PutOutcome::Ok,
                Err(e) if e.is_retriable() => {
                    PutOutcome::Retriable(SinkError::retriable(e.to_string()))
                }
                Err(e) => PutOutcome::Fatal(SinkError::fatal(e.to_string())),
            });
        }
        // Every position was filled above: by a conversion error or by a send result.
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| PutOutcome::Fatal(SinkError::fatal("not sent"))))
            .collect())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        self.state = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rename_format_substitutes_the_topic() {
        assert_eq!(rename("${topic}", "orders"), "orders");
        assert_eq!(rename("backup.${topic}.v2", "orders"), "backup.orders.v2");
        assert_eq!(rename("all", "orders"), "all");
    }

    #[test]
    fn the_target_defaults_to_the_source_cluster() {
        let mut config: ConfigMap = [(SOURCE_BOOTSTRAP_SERVERS.to_owned(), "src:9092".to_owned())]
            .into_iter()
            .collect();
        assert_eq!(target_bootstrap(&config).expect("source"), "src:9092");
        config.insert(TARGET_BOOTSTRAP_SERVERS.into(), "dst:9092".into());
        assert_eq!(target_bootstrap(&config).expect("target"), "dst:9092");
        let err = target_bootstrap(&ConfigMap::new()).expect_err("neither");
        assert_eq!(err.key(), Some(TARGET_BOOTSTRAP_SERVERS));
    }

    #[test]
    fn a_bad_partition_strategy_is_refused_naming_the_key() {
        let mut connector = KafkaSinkConnector::default();
        let config: ConfigMap = [
            (SOURCE_BOOTSTRAP_SERVERS.to_owned(), "src:9092".to_owned()),
            (TARGET_PARTITION.to_owned(), "random".to_owned()),
        ]
        .into_iter()
        .collect();
        let err = connector.start(&config).expect_err("not keep or hash");
        assert!(err.to_string().contains("target.partition"), "{err}");
    }
}
