//! The HTTP sink (type name `http`): record values as JSON, batched into `json_array` or
//! `ndjson` request bodies, sent with basic or bearer auth. Every request carries an
//! idempotency key derived from its records' topic, partition and offset, so a receiver can
//! drop a share-group redelivery it has already applied. Throttling (429, honouring
//! `Retry-After`), 408, 5xx and timeouts are retried with exponential backoff and release the
//! records once the budget is spent; any other 4xx rejects them with the status and the start
//! of the response body.
//!
//! The key names the exact set of records in one request: a redelivery grouped differently
//! (share groups may hand the records to another task in other batches) gets another key.

mod body;
pub mod config;
mod error;
mod retry;
mod task;

use spillway_core::config::{validate_sink_connector, ConfigDef, ValidationReport};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{ConfigError, ConfigMap, SinkConnector, SinkTask};

pub use body::idempotency_key;
pub use config::HttpSinkConfig;
pub use error::HttpSinkError;
pub use task::HttpSinkTask;

/// Names `connector.class` may use for this sink: the type name first.
pub const NAMES: &[&str] = &["http", "HttpSink"];

/// The HTTP sink connector: checks its configuration and gives every task the same.
#[derive(Debug, Default)]
pub struct HttpSinkConnector {
    config: ConfigMap,
}

impl HttpSinkConnector {
    pub fn new() -> Self {
        HttpSinkConnector::default()
    }
}

impl SinkConnector for HttpSinkConnector {
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_def(&self) -> ConfigDef {
        config::config_def()
    }

    fn validate(&self, config: &ConfigMap) -> ValidationReport {
        let mut report = validate_sink_connector(config, &self.config_def());
        for (key, message) in HttpSinkConfig::cross_key_problems(config) {
            report.add_error(key, message);
        }
        report
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        HttpSinkConfig::parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(HttpSinkTask::new())
    }

    /// A request carries the records' values (the configured `http.headers` are its own).
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
    fn validate_reports_bad_headers_and_missing_credentials_under_their_keys() {
        let report = HttpSinkConnector::new().validate(&props(&[
            ("name", "web"),
            ("connector.class", "http"),
            ("topics", "orders"),
            ("http.url", "https://example.com/in"),
            ("http.headers", "X-Tenant"),
            ("auth.type", "basic"),
        ]));
        assert_eq!(
            report.errors(),
            vec![
                "http.headers: invalid value 'X-Tenant' for http.headers: 'X-Tenant' is not a \
                 Name:value pair (pairs are separated by '|')",
                "connection.user: auth.type=basic needs connection.user (and usually \
                 connection.password), but connection.user is not set",
            ]
        );
    }

    #[test]
    fn a_missing_url_is_reported_by_the_key_itself() {
        let err = HttpSinkConnector::new()
            .start(&props(&[("http.method", "POST")]))
            .expect_err("no url");
        assert_eq!(
            err.to_string(),
            "missing required configuration 'http.url', which has no default value"
        );
    }
}
