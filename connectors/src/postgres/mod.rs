//! The PostgreSQL sink (type name `postgres`), modelled on Kafka Connect's JDBC sink: rows
//! from struct values (JSON with a schema envelope), `insert.mode=upsert` so that share-group
//! redelivery rewrites the same rows, tables created and evolved from the record schema,
//! tombstones as deletes, each batch in one transaction with only poison records rejected.

mod column;
pub mod config;
mod error;
mod row;
mod statement;
mod table;
mod task;

use spillway_core::config::{validate_sink_connector, ConfigDef, ValidationReport};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{ConfigError, ConfigMap, SinkConnector, SinkTask};

pub use config::PostgresSinkConfig;
pub use error::{DbFailure, PostgresSinkError};
pub use task::PostgresSinkTask;

/// Names `connector.class` may use for this sink: the type name first. Confluent's JDBC sink
/// class is an alias because its keys carry over (for PostgreSQL URLs).
pub const NAMES: &[&str] = &[
    "postgres",
    "PostgresSink",
    "io.confluent.connect.jdbc.JdbcSinkConnector",
];

/// The PostgreSQL sink connector: checks its configuration and gives every task the same.
#[derive(Debug, Default)]
pub struct PostgresSinkConnector {
    config: ConfigMap,
}

impl PostgresSinkConnector {
    pub fn new() -> Self {
        PostgresSinkConnector::default()
    }
}

impl SinkConnector for PostgresSinkConnector {
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_def(&self) -> ConfigDef {
        config::config_def()
    }

    fn validate(&self, config: &ConfigMap) -> ValidationReport {
        let mut report = validate_sink_connector(config, &self.config_def());
        if let Ok(parsed) = PostgresSinkConfig::parse_keys(config) {
            for (key, message) in parsed.conflicts() {
                report.add_error(key, message);
            }
        }
        report
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        PostgresSinkConfig::parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(PostgresSinkTask::new())
    }

    /// A row is made of the record's topic, key and value.
    fn tasks_read_headers(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> ConfigMap {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn validate_reports_checks_across_keys_under_the_key_to_change() {
        let report = PostgresSinkConnector::new().validate(&props(&[
            ("name", "pg"),
            ("connector.class", "postgres"),
            ("topics", "orders"),
            ("connection.url", "postgres://db/shop"),
            ("insert.mode", "upsert"),
        ]));
        assert_eq!(
            report.errors(),
            vec![
                "insert.mode: insert.mode=upsert needs a primary key to detect conflicts on, but \
                 pk.mode is 'none'; set pk.mode=record_key or record_value"
            ]
        );
    }

    #[test]
    fn a_valid_configuration_starts_and_is_given_to_every_task() {
        let mut connector = PostgresSinkConnector::new();
        let config = props(&[
            ("connection.url", "postgres://db/shop"),
            ("pk.mode", "record_key"),
            ("pk.fields", "id"),
            ("delete.enabled", "true"),
        ]);
        connector.start(&config).expect("valid");
        assert_eq!(connector.task_configs(3).expect("split"), vec![config; 3]);
        assert_eq!(NAMES[0], "postgres");
    }
}
