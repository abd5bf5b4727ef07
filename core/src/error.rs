//! The core crate's errors: one enum per layer (config, conversion, transformation, sink task),
//! and [`ConnectError`] to carry any of them through the pipeline.
//!
//! Every message names the offending value and, where there is one, the fix. The question a
//! runtime asks of an error is [`ConnectError::is_retriable`]: retriable errors release the
//! record for redelivery, fatal ones reject it (or fail the task under `errors.tolerance=none`),
//! and task-level sink errors ([`SinkError::TaskLevel`]) fail the task whatever
//! `errors.tolerance` says, releasing its records: they are not the records' fault.

use std::fmt;
use std::sync::Arc;

/// Which part of a record a converter was working on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordPart {
    Key,
    Value,
    Header,
}

impl fmt::Display for RecordPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordPart::Key => "key",
            RecordPart::Value => "value",
            RecordPart::Header => "header",
        })
    }
}

/// Where in a record's way an error happened; Connect's `__connect.errors.stage` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    KeyConverter,
    ValueConverter,
    HeaderConverter,
    Transformation,
    TaskPut,
    KafkaConsume,
    KafkaProduce,
}

impl Stage {
    /// Connect's name for the stage, as written in DLQ context headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::KeyConverter => "KEY_CONVERTER",
            Stage::ValueConverter => "VALUE_CONVERTER",
            Stage::HeaderConverter => "HEADER_CONVERTER",
            Stage::Transformation => "TRANSFORMATION",
            Stage::TaskPut => "TASK_PUT",
            Stage::KafkaConsume => "KAFKA_CONSUME",
            Stage::KafkaProduce => "KAFKA_PRODUCE",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A configuration that cannot be used as given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid value '{value}' for {key}: {reason}")]
    InvalidValue {
        key: String,
        /// Already masked (`[hidden]`) when the key is a password.
        value: String,
        reason: String,
    },
    #[error("missing required configuration '{key}', which has no default value")]
    Missing { key: String },
    #[error("unknown {kind} '{name}' for {key}; expected one of {expected}")]
    UnknownPlugin {
        kind: &'static str,
        key: String,
        name: String,
        expected: String,
    },
    /// Keys that are fine alone but not together; the message names them.
    #[error("{0}")]
    Conflict(String),
    /// A key read by code that never declared it: a bug in the reader, not the user's config.
    #[error("configuration '{key}' was read as {wanted} but is declared as {declared}; this is a bug in the code reading it")]
    Undeclared {
        key: String,
        wanted: &'static str,
        declared: &'static str,
    },
    /// A configuration file that cannot be read (properties or JSON).
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("{} configuration errors: {}", .0.len(), join(.0))]
    Many(Vec<ConfigError>),
}

fn join(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ConfigError {
    /// One error as itself, several as [`ConfigError::Many`].
    pub fn from_list(mut errors: Vec<ConfigError>) -> Option<ConfigError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(ConfigError::Many(errors)),
        }
    }

    /// The individual errors (one for anything but `Many`).
    pub fn flatten(&self) -> Vec<&ConfigError> {
        match self {
            ConfigError::Many(all) => all.iter().flat_map(ConfigError::flatten).collect(),
            other => vec![other],
        }
    }

    /// The configuration key the error is about, when there is exactly one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::InvalidValue { key, .. }
            | ConfigError::Missing { key }
            | ConfigError::UnknownPlugin { key, .. }
            | ConfigError::Undeclared { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// A key, value or header that a converter could not read or write.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvertError {
    #[error(
        "{converter} converter cannot read the {part} of a record from topic '{topic}': {detail}"
    )]
    Deserialize {
        converter: &'static str,
        part: RecordPart,
        topic: String,
        detail: String,
    },
    #[error(
        "{converter} converter cannot write the {part} of a record for topic '{topic}': {detail}"
    )]
    Serialize {
        converter: &'static str,
        part: RecordPart,
        topic: String,
        detail: String,
    },
}

impl ConvertError {
    pub fn part(&self) -> RecordPart {
        match self {
            ConvertError::Deserialize { part, .. } | ConvertError::Serialize { part, .. } => *part,
        }
    }

    /// The pipeline stage to report in DLQ context headers.
    pub fn stage(&self) -> Stage {
        match self.part() {
            RecordPart::Key => Stage::KeyConverter,
            RecordPart::Value => Stage::ValueConverter,
            RecordPart::Header => Stage::HeaderConverter,
        }
    }
}

/// A transform (SMT) or predicate that could not handle a record.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("transform {transform} failed: {detail}")]
pub struct TransformError {
    /// The transform's type and, once in a chain, its alias: `'ts' (InsertField$Value)`.
    pub transform: String,
    pub detail: String,
}

impl TransformError {
    pub fn new(transform: impl Into<String>, detail: impl Into<String>) -> Self {
        TransformError {
            transform: transform.into(),
            detail: detail.into(),
        }
    }
}

/// The underlying cause of a sink error, shareable so outcomes can be cloned for reporting.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// An error a sink task reports, saying whether trying again may succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// Transient (timeout, unavailable target, throttling): the record may succeed later.
    #[error("retriable: {message}")]
    Retriable {
        message: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Permanent for this record (bad data, constraint violation): the record is rejected
    /// (dead-lettered) under `errors.tolerance=all`, or fails the task under `none`.
    #[error("fatal: {message}")]
    Fatal {
        message: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Not the record's fault and the same for every record: the target refuses the
    /// connector's configuration (an HTTP 401/403/404, a wrong database password) or the task
    /// broke the `SinkTask` contract. Connect fails the task for it; so does Spillway, whatever
    /// `errors.tolerance` says (it covers bad records, not a target that refuses everyone):
    /// the batch is released (share mode) or left uncommitted (classic mode), never rejected,
    /// and the restart policy applies.
    #[error("task-level: {message}")]
    TaskLevel {
        message: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl SinkError {
    pub fn retriable(message: impl Into<String>) -> Self {
        SinkError::Retriable {
            message: message.into(),
            cause: None,
        }
    }

    pub fn fatal(message: impl Into<String>) -> Self {
        SinkError::Fatal {
            message: message.into(),
            cause: None,
        }
    }

    /// A configuration or contract error: fails the task, releases its records.
    pub fn task_level(message: impl Into<String>) -> Self {
        SinkError::TaskLevel {
            message: message.into(),
            cause: None,
        }
    }

    /// This error with an underlying cause attached.
    pub fn caused_by(self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        let cause: Option<Cause> = Some(Arc::new(cause));
        match self {
            SinkError::Retriable { message, .. } => SinkError::Retriable { message, cause },
            SinkError::Fatal { message, .. } => SinkError::Fatal { message, cause },
            SinkError::TaskLevel { message, .. } => SinkError::TaskLevel { message, cause },
        }
    }

    pub fn is_retriable(&self) -> bool {
        matches!(self, SinkError::Retriable { .. })
    }

    /// Whether the error fails the task rather than any one record.
    pub fn is_task_level(&self) -> bool {
        matches!(self, SinkError::TaskLevel { .. })
    }

    pub fn message(&self) -> &str {
        match self {
            SinkError::Retriable { message, .. }
            | SinkError::Fatal { message, .. }
            | SinkError::TaskLevel { message, .. } => message,
        }
    }
}

/// Any error on a record's way through the pipeline.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error(transparent)]
    Transform(#[from] TransformError),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

impl ConnectError {
    /// Only a sink can say "try again": bad config, bad data and failing transforms fail the
    /// same way every time.
    pub fn is_retriable(&self) -> bool {
        match self {
            ConnectError::Sink(e) => e.is_retriable(),
            _ => false,
        }
    }

    /// The stage to report in DLQ context headers; `None` for configuration errors.
    pub fn stage(&self) -> Option<Stage> {
        match self {
            ConnectError::Config(_) => None,
            ConnectError::Convert(e) => Some(e.stage()),
            ConnectError::Transform(_) => Some(Stage::Transformation),
            ConnectError::Sink(_) => Some(Stage::TaskPut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_retriable_sink_errors_are_retriable() {
        assert!(ConnectError::from(SinkError::retriable("timeout")).is_retriable());
        assert!(!ConnectError::from(SinkError::fatal("constraint")).is_retriable());
        assert!(!ConnectError::from(TransformError::new("Cast$Value", "bad")).is_retriable());
        assert!(!ConnectError::from(ConfigError::Missing { key: "name".into() }).is_retriable());
    }

    #[test]
    fn task_level_errors_are_neither_retriable_nor_a_records_fault() {
        let e = SinkError::task_level("401 Unauthorized").caused_by(std::io::Error::other("x"));
        assert!(e.is_task_level());
        assert!(!e.is_retriable());
        assert_eq!(e.message(), "401 Unauthorized");
        assert_eq!(e.to_string(), "task-level: 401 Unauthorized");
        assert!(!SinkError::fatal("bad row").is_task_level());
        assert!(!SinkError::retriable("timeout").is_task_level());
    }

    #[test]
    fn messages_name_the_key_and_the_bad_value() {
        let e = ConfigError::InvalidValue {
            key: "tasks.max".into(),
            value: "zero".into(),
            reason: "not a number; expected an int".into(),
        };
        assert_eq!(
            e.to_string(),
            "invalid value 'zero' for tasks.max: not a number; expected an int"
        );
        let e = ConfigError::UnknownPlugin {
            kind: "converter",
            key: "key.converter".into(),
            name: "jsn".into(),
            expected: "json, string, bytearray".into(),
        };
        assert_eq!(
            e.to_string(),
            "unknown converter 'jsn' for key.converter; expected one of json, string, bytearray"
        );
    }

    #[test]
    fn several_config_errors_are_counted_and_flattened() {
        let many = ConfigError::from_list(vec![
            ConfigError::Missing { key: "a".into() },
            ConfigError::Missing { key: "b".into() },
        ])
        .expect("two errors make an error");
        assert!(many.to_string().starts_with("2 configuration errors: "));
        assert_eq!(many.flatten().len(), 2);
        assert!(ConfigError::from_list(vec![]).is_none());
    }

    #[test]
    fn conversion_errors_report_the_converter_stage() {
        let e = ConvertError::Deserialize {
            converter: "json",
            part: RecordPart::Key,
            topic: "t".into(),
            detail: "x".into(),
        };
        assert_eq!(ConnectError::from(e).stage(), Some(Stage::KeyConverter));
        let cause = std::io::Error::other("reset");
        let e = SinkError::retriable("write failed").caused_by(cause);
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(e.message(), "write failed");
    }
}
