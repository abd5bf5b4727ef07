//! Which sink plugin a `connector.class` names: built-in aliases and Kafka Connect class names
//! map to a factory. Tests and embedders register their own plugins beside the built-in ones.

use std::sync::Arc;

use spillway_core::{ConfigError, SinkConnector};

/// Makes a fresh, unstarted connector.
pub type ConnectorFactory = Arc<dyn Fn() -> Box<dyn SinkConnector> + Send + Sync>;

struct Entry {
    names: Vec<String>,
    factory: ConnectorFactory,
}

/// `connector.class` → connector.
#[derive(Clone, Default)]
pub struct ConnectorRegistry {
    entries: Arc<Vec<Entry>>,
}

impl std::fmt::Debug for ConnectorRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorRegistry")
            .field("classes", &self.classes())
            .finish()
    }
}

impl ConnectorRegistry {
    /// A registry without any plugin.
    pub fn empty() -> Self {
        ConnectorRegistry::default()
    }

    /// The built-in sinks.
    pub fn builtin() -> Self {
        ConnectorRegistry::empty()
            .with(crate::file::NAMES, || {
                Box::new(crate::file::FileSinkConnector::default())
            })
            .with(crate::kafka::NAMES, || {
                Box::new(crate::kafka::KafkaSinkConnector::default())
            })
            .with(crate::postgres::NAMES, || {
                Box::new(crate::postgres::PostgresSinkConnector::default())
            })
            .with(crate::http::NAMES, || {
                Box::new(crate::http::HttpSinkConnector::default())
            })
    }

    /// This registry plus a plugin known by `names` (the first is its main name).
    pub fn with(
        mut self,
        names: &[&str],
        factory: impl Fn() -> Box<dyn SinkConnector> + Send + Sync + 'static,
    ) -> Self {
        let mut entries: Vec<Entry> = match Arc::try_unwrap(self.entries) {
            Ok(entries) => entries,
            Err(shared) => shared
                .iter()
                .map(|e| Entry {
                    names: e.names.clone(),
                    factory: Arc::clone(&e.factory),
                })
                .collect(),
        };
        entries.push(Entry {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            factory: Arc::new(factory),
        });
        self.entries = Arc::new(entries);
        self
    }

    /// A new connector for `class`; the error lists the known names.
    pub fn create(&self, class: &str) -> Result<Box<dyn SinkConnector>, ConfigError> {
        let wanted = class.trim();
        self.entries
            .iter()
            .rev()
            .find(|e| e.names.iter().any(|n| n == wanted))
            .map(|e| (e.factory)())
            .ok_or_else(|| ConfigError::UnknownPlugin {
                kind: "connector",
                key: "connector.class".into(),
                name: class.to_owned(),
                expected: self.classes().join(", "),
            })
    }

    /// The main name of every plugin.
    pub fn classes(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|e| e.names.first().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_class_names_and_aliases_find_the_file_sink() {
        let registry = ConnectorRegistry::builtin();
        for name in [
            "file",
            "FileStreamSink",
            "org.apache.kafka.connect.file.FileStreamSinkConnector",
        ] {
            assert!(registry.create(name).is_ok(), "{name}");
        }
        assert!(registry.create("kafka").is_ok());
    }

    #[test]
    fn an_unknown_class_is_refused_listing_the_known_ones() {
        let err = ConnectorRegistry::builtin()
            .create("s3")
            .err()
            .expect("no s3 sink");
        assert!(
            err.to_string().starts_with(
                "unknown connector 's3' for connector.class; expected one of file, kafka, postgres, http"
            ),
            "{err}"
        );
    }

    /// Only the kafka sink writes the records' headers anywhere (it copies them); the others
    /// let a classic-mode consumer leave them unread.
    #[test]
    fn only_the_kafka_sink_reads_headers() {
        let registry = ConnectorRegistry::builtin();
        for (class, reads) in [
            ("file", false),
            ("postgres", false),
            ("http", false),
            ("kafka", true),
        ] {
            let connector = registry.create(class).expect("a builtin sink");
            assert_eq!(connector.tasks_read_headers(), reads, "{class}");
        }
    }
}
