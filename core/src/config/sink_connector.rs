//! The keys every sink connector shares (Connect's `ConnectorConfig` and `SinkConnectorConfig`):
//! identity, topics, converters, transforms, error handling, and the group protocol override.
//! [`SinkConnectorConfig::parse`] gives them typed; [`validate_sink_connector`] gives the REST
//! `validate` answer, including the checks across keys and the connector's own keys.

use std::time::Duration;

use regex::Regex;

use crate::config::def::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use crate::config::group_protocol::{GroupProtocol, CONNECTOR_GROUP_PROTOCOL};
use crate::config::report::ValidationReport;
use crate::config::value::ConfigValue;
use crate::config::ConfigMap;
use crate::convert::{strip_prefix, ConverterKind};
use crate::error::ConfigError;
use crate::transforms::{validate_transforms, TransformChain};

/// The default consumer group id is this plus the connector's name (Kafka Connect's).
pub const CONSUMER_GROUP_ID_PREFIX: &str = "connect-";
/// The default share group id is this plus the connector's name.
pub const SHARE_GROUP_ID_PREFIX: &str = "connect-share-";

pub const NAME: &str = "name";
pub const CONNECTOR_CLASS: &str = "connector.class";
pub const TASKS_MAX: &str = "tasks.max";
pub const TOPICS: &str = "topics";
pub const TOPICS_REGEX: &str = "topics.regex";
pub const KEY_CONVERTER: &str = "key.converter";
pub const VALUE_CONVERTER: &str = "value.converter";
pub const KEY_CONVERTER_SCHEMAS_ENABLE: &str = "key.converter.schemas.enable";
pub const VALUE_CONVERTER_SCHEMAS_ENABLE: &str = "value.converter.schemas.enable";
pub const TRANSFORMS: &str = "transforms";
pub const PREDICATES: &str = "predicates";
pub const ERRORS_RETRY_TIMEOUT: &str = "errors.retry.timeout";
pub const ERRORS_RETRY_DELAY_MAX_MS: &str = "errors.retry.delay.max.ms";
pub const ERRORS_TOLERANCE: &str = "errors.tolerance";
pub const ERRORS_LOG_ENABLE: &str = "errors.log.enable";
pub const ERRORS_LOG_INCLUDE_MESSAGES: &str = "errors.log.include.messages";
pub const DLQ_TOPIC_NAME: &str = "errors.deadletterqueue.topic.name";
pub const DLQ_TOPIC_REPLICATION_FACTOR: &str = "errors.deadletterqueue.topic.replication.factor";
pub const DLQ_CONTEXT_HEADERS_ENABLE: &str = "errors.deadletterqueue.context.headers.enable";
/// Prefix of per-connector consumer settings (KIP-458).
pub const CONSUMER_OVERRIDE_PREFIX: &str = "consumer.override.";
pub const CONSUMER_OVERRIDE_GROUP_ID: &str = "consumer.override.group.id";

const COMMON: &str = "Common";
const TRANSFORMS_GROUP: &str = "Transforms";
const ERRORS_GROUP: &str = "Error Handling";
const CONSUMER_GROUP: &str = "Consumer";

fn check_name(value: &ConfigValue) -> Result<(), String> {
    match value {
        ConfigValue::String(s) if s.trim().is_empty() => Err("must not be empty".into()),
        ConfigValue::String(s) => match s.chars().find(|c| c.is_control()) {
            Some(c) => Err(format!(
                "contains the control character {c:?}; use printable characters only"
            )),
            None => Ok(()),
        },
        _ => Err("expected a string".into()),
    }
}

fn check_replication_factor(value: &ConfigValue) -> Result<(), String> {
    match value.as_i64() {
        Some(-1) => Ok(()),
        Some(n) if (1..=i64::from(i16::MAX)).contains(&n) => Ok(()),
        _ => Err("must be -1 (the broker's default) or from 1 to 32767".into()),
    }
}

/// The shared keys, in Connect's groups.
pub fn sink_connector_config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(NAME, ConfigType::String, Importance::High, "Globally unique name for this connector.")
                .validator(Validator::Custom { check: check_name, allowed: "non-empty string without control characters" })
                .group(COMMON, 1)
                .display_name("Connector name"),
        )
        .define(
            ConfigKey::new(CONNECTOR_CLASS, ConfigType::Class, Importance::High, "The sink connector: a built-in alias (file, kafka, ...) or its Kafka Connect class name.")
                .group(COMMON, 2)
                .display_name("Connector class"),
        )
        .define(
            ConfigKey::new(TASKS_MAX, ConfigType::Int, Importance::High, "Maximum number of tasks for this connector. In share mode it is the number of share-group members; it may exceed the number of partitions.")
                .default("1")
                .validator(Validator::AtLeast(1))
                .group(COMMON, 3)
                .display_name("Tasks max"),
        )
        .define(
            ConfigKey::new(TOPICS, ConfigType::List, Importance::High, "Topics to consume, comma-separated. Set exactly one of topics and topics.regex.")
                .default("")
                .validator(Validator::Custom {
                    check: |v| match v {
                        ConfigValue::List(items) if items.is_empty() => Ok(()),
                        other => Validator::UniqueList.check(other),
                    },
                    allowed: "list of unique topic names",
                })
                .group(COMMON, 4)
                .display_name("Topics"),
        )
        .define(
            ConfigKey::new(TOPICS_REGEX, ConfigType::String, Importance::High, "Regular expression of topics to consume. Set exactly one of topics and topics.regex.")
                .default("")
                .validator(Validator::Regex)
                .group(COMMON, 5)
                .display_name("Topics regex"),
        )
        .define(
            ConfigKey::new(KEY_CONVERTER, ConfigType::Class, Importance::Low, "Converter for record keys (json, string, bytearray or a Connect class name); overrides the worker's.")
                .null_default()
                .group(COMMON, 6)
                .display_name("Key converter class"),
        )
        .define(
            ConfigKey::new(VALUE_CONVERTER, ConfigType::Class, Importance::Low, "Converter for record values (json, string, bytearray or a Connect class name); overrides the worker's.")
                .null_default()
                .group(COMMON, 7)
                .display_name("Value converter class"),
        )
        .define(
            ConfigKey::new(KEY_CONVERTER_SCHEMAS_ENABLE, ConfigType::Boolean, Importance::Low, "For the json key converter: whether keys are {schema, payload} envelopes (default true).")
                .null_default()
                .group(COMMON, 8),
        )
        .define(
            ConfigKey::new(VALUE_CONVERTER_SCHEMAS_ENABLE, ConfigType::Boolean, Importance::Low, "For the json value converter: whether values are {schema, payload} envelopes (default true).")
                .null_default()
                .group(COMMON, 9),
        )
        .define(
            ConfigKey::new(TRANSFORMS, ConfigType::List, Importance::Low, "Aliases of the transforms to apply, in order; configure each under transforms.<alias>.")
                .default("")
                .validator(Validator::Custom {
                    check: |v| match v {
                        ConfigValue::List(items) if items.is_empty() => Ok(()),
                        other => Validator::UniqueList.check(other),
                    },
                    allowed: "list of unique aliases",
                })
                .group(TRANSFORMS_GROUP, 1)
                .display_name("Transforms"),
        )
        .define(
            ConfigKey::new(PREDICATES, ConfigType::List, Importance::Low, "Aliases of the predicates transforms may refer to; configure each under predicates.<alias>.")
                .default("")
                .validator(Validator::Custom {
                    check: |v| match v {
                        ConfigValue::List(items) if items.is_empty() => Ok(()),
                        other => Validator::UniqueList.check(other),
                    },
                    allowed: "list of unique aliases",
                })
                .group(TRANSFORMS_GROUP, 2)
                .display_name("Predicates"),
        )
        .define(
            ConfigKey::new(ERRORS_RETRY_TIMEOUT, ConfigType::Long, Importance::Medium, "Total milliseconds to retry a failed operation (a retriable put error included) before errors.tolerance decides (classic mode) or the records are released (share mode); 0 means no retries, -1 retries forever. Default -1 where Connect's is 0: Connect does not apply this key to put, whose retriable errors it retries forever, and in Spillway it covers put.")
                .default("-1")
                .validator(Validator::AtLeast(-1))
                .group(ERRORS_GROUP, 1)
                .display_name("Retry timeout for errors"),
        )
        .define(
            ConfigKey::new(ERRORS_RETRY_DELAY_MAX_MS, ConfigType::Long, Importance::Medium, "Longest wait in milliseconds between retries; backoff grows exponentially up to it.")
                .default("60000")
                .validator(Validator::AtLeast(1))
                .group(ERRORS_GROUP, 2)
                .display_name("Maximum delay between retries for errors"),
        )
        .define(
            ConfigKey::new(ERRORS_TOLERANCE, ConfigType::String, Importance::Medium, "none: an error fails the task. all: a record that fails is skipped (rejected, and sent to the dead letter queue when one is set).")
                .default("none")
                .validator(Validator::OneOf(&["none", "all"]))
                .group(ERRORS_GROUP, 3)
                .display_name("Error tolerance"),
        )
        .define(
            ConfigKey::new(ERRORS_LOG_ENABLE, ConfigType::Boolean, Importance::Medium, "Log each error with the failed operation and the record's coordinates.")
                .default("false")
                .group(ERRORS_GROUP, 4)
                .display_name("Log errors"),
        )
        .define(
            ConfigKey::new(ERRORS_LOG_INCLUDE_MESSAGES, ConfigType::Boolean, Importance::Medium, "Include the record's key, value and headers in error logs.")
                .default("false")
                .group(ERRORS_GROUP, 5)
                .display_name("Log error messages"),
        )
        .define(
            ConfigKey::new(DLQ_TOPIC_NAME, ConfigType::String, Importance::Medium, "Topic that receives records that failed conversion, transformation or put; empty for none.")
                .default("")
                .group(ERRORS_GROUP, 6)
                .display_name("Dead letter queue topic name"),
        )
        .define(
            ConfigKey::new(DLQ_TOPIC_REPLICATION_FACTOR, ConfigType::Int, Importance::Medium, "Replication factor used when creating the dead letter queue topic.")
                .default("3")
                .validator(Validator::Custom { check: check_replication_factor, allowed: "-1 or [1,...,32767]" })
                .group(ERRORS_GROUP, 7)
                .display_name("Dead letter queue topic replication factor"),
        )
        .define(
            ConfigKey::new(DLQ_CONTEXT_HEADERS_ENABLE, ConfigType::Boolean, Importance::Medium, "Add __connect.errors.* headers describing the error to dead letter queue records.")
                .default("false")
                .group(ERRORS_GROUP, 8)
                .display_name("Enable error context headers"),
        )
        .define(
            ConfigKey::new(CONNECTOR_GROUP_PROTOCOL, ConfigType::String, Importance::High, "How this connector consumes: share (a KIP-932 share group), classic or consumer (consumer groups). Overrides the worker's consumer.group.protocol; removing it falls back to the worker's choice.")
                .null_default()
                .validator(Validator::OneOf(GroupProtocol::NAMES))
                .group(CONSUMER_GROUP, 1)
                .display_name("Group protocol"),
        )
}

/// What to do with a record that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorTolerance {
    /// Fail the task.
    None,
    /// Skip the record (reject it; dead-letter it when a DLQ topic is set).
    All,
}

/// `errors.retry.timeout`: how long a retriable failure (of `put`, in Spillway) is retried
/// within the task before it counts as failed (classic mode: `errors.tolerance` decides) or
/// its records are released (share mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryTimeout {
    /// `0`: one attempt, no retry (Connect's documented meaning).
    NoRetry,
    /// A positive number of milliseconds: retries start no later than this after the first
    /// attempt.
    Within(Duration),
    /// `-1`, and the default: retried until it succeeds, as Connect's `WorkerSinkTask` retries
    /// a `put` that throws `RetriableException` (share mode: as long as the locks allow).
    Infinite,
}

/// Where failed records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterQueue {
    pub topic: String,
    pub replication_factor: i16,
    /// Whether to add Connect's `__connect.errors.*` headers.
    pub context_headers: bool,
}

/// Connect's error-handling settings (KIP-298).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorHandling {
    pub tolerance: ErrorTolerance,
    pub retry_timeout: RetryTimeout,
    pub retry_delay_max: Duration,
    pub log_enable: bool,
    pub log_include_messages: bool,
    pub dead_letter_queue: Option<DeadLetterQueue>,
}

/// Which topics the connector consumes.
#[derive(Debug, Clone)]
pub enum TopicSelection {
    Names(Vec<String>),
    /// The whole topic name must match, as with Connect's `topics.regex`.
    Pattern(Regex),
}

impl TopicSelection {
    pub fn includes(&self, topic: &str) -> bool {
        match self {
            TopicSelection::Names(names) => names.iter().any(|n| n == topic),
            TopicSelection::Pattern(regex) => regex
                .find(topic)
                .is_some_and(|m| m.start() == 0 && m.end() == topic.len()),
        }
    }
}

/// The shared settings of one sink connector, typed.
#[derive(Debug, Clone)]
pub struct SinkConnectorConfig {
    pub name: String,
    pub connector_class: String,
    pub tasks_max: usize,
    pub topics: TopicSelection,
    pub errors: ErrorHandling,
    /// The connector's `consumer.override.*` settings with the prefix removed.
    pub consumer_overrides: ConfigMap,
    /// Everything the user set, for the connector's own keys and the converters.
    pub originals: ConfigMap,
}

impl SinkConnectorConfig {
    /// Parses and checks the shared keys (including the checks across keys and the transform
    /// chain), reporting every problem at once.
    pub fn parse(props: &ConfigMap) -> Result<SinkConnectorConfig, ConfigError> {
        let parsed = sink_connector_config_def().parse(props);
        let mut errors: Vec<ConfigError> = match &parsed {
            Ok(_) => Vec::new(),
            Err(e) => e.flatten().into_iter().cloned().collect(),
        };
        errors.extend(cross_key_errors(props));
        if let Err(e) = TransformChain::from_config(props) {
            errors.extend(e.flatten().into_iter().cloned());
        }
        if let Some(e) = ConfigError::from_list(errors) {
            return Err(e);
        }
        let parsed = parsed?;
        let regex_text = parsed.string(TOPICS_REGEX)?.unwrap_or_default();
        let topics = if regex_text.is_empty() {
            TopicSelection::Names(parsed.list(TOPICS)?.to_vec())
        } else {
            // Validated by the Regex validator above.
            TopicSelection::Pattern(Regex::new(regex_text).map_err(|e| {
                ConfigError::InvalidValue {
                    key: TOPICS_REGEX.into(),
                    value: regex_text.into(),
                    reason: e.to_string(),
                }
            })?)
        };
        let retry_ms = parsed.long(ERRORS_RETRY_TIMEOUT)?;
        let dlq_topic = parsed.string(DLQ_TOPIC_NAME)?.unwrap_or_default();
        let tolerance = match parsed.string(ERRORS_TOLERANCE)?.unwrap_or("none") {
            t if t.eq_ignore_ascii_case("all") => ErrorTolerance::All,
            _ => ErrorTolerance::None,
        };
        Ok(SinkConnectorConfig {
            name: parsed.string(NAME)?.unwrap_or_default().to_owned(),
            connector_class: parsed
                .class(CONNECTOR_CLASS)?
                .unwrap_or_default()
                .to_owned(),
            // At least 1 by its validator.
            tasks_max: usize::try_from(parsed.int(TASKS_MAX)?).unwrap_or(1),
            topics,
            errors: ErrorHandling {
                tolerance,
                retry_timeout: match retry_ms {
                    -1 => RetryTimeout::Infinite,
                    0 => RetryTimeout::NoRetry,
                    ms => RetryTimeout::Within(Duration::from_millis(ms.unsigned_abs())),
                },
                retry_delay_max: Duration::from_millis(
                    parsed.long(ERRORS_RETRY_DELAY_MAX_MS)?.unsigned_abs(),
                ),
                log_enable: parsed.boolean(ERRORS_LOG_ENABLE)?,
                log_include_messages: parsed.boolean(ERRORS_LOG_INCLUDE_MESSAGES)?,
                dead_letter_queue: (!dlq_topic.is_empty())
                    .then(|| -> Result<_, ConfigError> {
                        Ok(DeadLetterQueue {
                            topic: dlq_topic.to_owned(),
                            replication_factor: i16::try_from(
                                parsed.int(DLQ_TOPIC_REPLICATION_FACTOR)?,
                            )
                            .unwrap_or(-1),
                            context_headers: parsed.boolean(DLQ_CONTEXT_HEADERS_ENABLE)?,
                        })
                    })
                    .transpose()?,
            },
            consumer_overrides: strip_prefix(props, CONSUMER_OVERRIDE_PREFIX),
            originals: props.clone(),
        })
    }

    /// The group id under `protocol`: `consumer.override.group.id`, else the default —
    /// Connect's `connect-<name>` for a consumer group (so a connector moved from Connect, or
    /// rolled back from share mode, resumes from its committed offsets), and
    /// `connect-share-<name>` for a share group. Kafka has one namespace for group ids and a
    /// group of one type refuses members of another (a share group is kept until deleted), so
    /// the two defaults must differ for KIP-1302's rollback and migration to work
    /// (docs/runtime.md, "Mode and groups").
    pub fn group_id(&self, protocol: GroupProtocol) -> String {
        match self.consumer_overrides.get("group.id") {
            Some(id) => id.clone(),
            None if protocol.is_share() => format!("{SHARE_GROUP_ID_PREFIX}{}", self.name),
            None => format!("{CONSUMER_GROUP_ID_PREFIX}{}", self.name),
        }
    }
}

/// Problems that involve more than one key, each attached to the key a user should change.
fn cross_key_errors(props: &ConfigMap) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    let topics = crate::config::parse_list(props.get(TOPICS).map(String::as_str).unwrap_or(""));
    let regex = props.get(TOPICS_REGEX).map(|s| s.trim()).unwrap_or("");
    match (topics.is_empty(), regex.is_empty()) {
        (true, true) => errors.push(ConfigError::Conflict(format!(
            "must configure one of {TOPICS} or {TOPICS_REGEX}"
        ))),
        (false, false) => errors.push(ConfigError::Conflict(format!(
            "{TOPICS} and {TOPICS_REGEX} are mutually exclusive, but both are set \
             ({TOPICS}='{}', {TOPICS_REGEX}='{regex}'); remove one",
            topics.join(",")
        ))),
        _ => {}
    }
    for key in [KEY_CONVERTER, VALUE_CONVERTER] {
        if let Some(name) = props.get(key) {
            if let Err(e) = ConverterKind::from_name(key, name) {
                errors.push(e);
            }
        }
    }
    let dlq = props.get(DLQ_TOPIC_NAME).map(|s| s.trim()).unwrap_or("");
    if !dlq.is_empty() {
        let consumed = if topics.iter().any(|t| t == dlq) {
            Some(format!("{TOPICS}={}", topics.join(",")))
        } else if !regex.is_empty()
            && TopicSelection::Pattern(match Regex::new(regex) {
                Ok(r) => r,
                Err(_) => return errors, // The regex's own error is reported on its key.
            })
            .includes(dlq)
        {
            Some(format!("{TOPICS_REGEX}={regex}"))
        } else {
            None
        };
        if let Some(source) = consumed {
            errors.push(ConfigError::InvalidValue {
                key: DLQ_TOPIC_NAME.into(),
                value: dlq.into(),
                reason: format!(
                    "the dead letter queue topic is also consumed by the connector ({source}); \
                     failed records would be read again. Choose another topic"
                ),
            });
        }
    }
    errors
}

/// The REST `validate` answer for a sink connector: the shared keys, the checks across keys,
/// every transform and predicate, and the connector's own keys (`connector_def`).
pub fn validate_sink_connector(props: &ConfigMap, connector_def: &ConfigDef) -> ValidationReport {
    let mut configs = sink_connector_config_def().validate(props);
    configs.extend(validate_transforms(props));
    configs.extend(connector_def.validate(props));
    let name = props.get(CONNECTOR_CLASS).cloned().unwrap_or_default();
    let mut report = ValidationReport::new(name, configs);
    for error in cross_key_errors(props) {
        let key = match &error {
            ConfigError::Conflict(_) => TOPICS,
            other => other.key().unwrap_or(TOPICS),
        };
        report.add_error(key, error.to_string());
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::def::ConfigKey;

    use crate::config::config_map as config;

    fn minimal() -> ConfigMap {
        config(&[
            ("name", "files"),
            ("connector.class", "file"),
            ("topics", "orders"),
        ])
    }

    #[test]
    fn a_minimal_config_gets_connects_defaults() {
        let c = SinkConnectorConfig::parse(&minimal()).expect("valid");
        assert_eq!(c.tasks_max, 1);
        assert!(c.topics.includes("orders"));
        assert_eq!(c.errors.tolerance, ErrorTolerance::None);
        assert_eq!(
            c.errors.retry_timeout,
            RetryTimeout::Infinite,
            "put is retried until it succeeds unless errors.retry.timeout says otherwise"
        );
        assert_eq!(c.errors.retry_delay_max, Duration::from_secs(60));
        assert_eq!(c.errors.dead_letter_queue, None);
        assert_eq!(c.group_id(GroupProtocol::Classic), "connect-files");
        assert_eq!(c.group_id(GroupProtocol::Consumer), "connect-files");
        assert_eq!(c.group_id(GroupProtocol::Share), "connect-share-files");
    }

    #[test]
    fn error_handling_keys_are_read_typed() {
        let mut props = minimal();
        props.extend(config(&[
            ("errors.tolerance", "ALL"),
            ("errors.retry.timeout", "-1"),
            ("errors.deadletterqueue.topic.name", "orders-dlq"),
            ("errors.deadletterqueue.context.headers.enable", "true"),
            ("consumer.override.group.id", "my-group"),
        ]));
        let c = SinkConnectorConfig::parse(&props).expect("valid");
        assert_eq!(c.errors.tolerance, ErrorTolerance::All);
        assert_eq!(c.errors.retry_timeout, RetryTimeout::Infinite);
        for (value, expected) in [
            ("0", RetryTimeout::NoRetry),
            ("2500", RetryTimeout::Within(Duration::from_millis(2500))),
        ] {
            props.insert("errors.retry.timeout".into(), value.into());
            let c = SinkConnectorConfig::parse(&props).expect("valid");
            assert_eq!(c.errors.retry_timeout, expected, "{value}");
        }
        assert_eq!(
            c.errors.dead_letter_queue,
            Some(DeadLetterQueue {
                topic: "orders-dlq".into(),
                replication_factor: 3,
                context_headers: true
            })
        );
        assert_eq!(c.group_id(GroupProtocol::Share), "my-group");
        assert_eq!(c.group_id(GroupProtocol::Classic), "my-group");
        assert_eq!(
            c.consumer_overrides.get("group.id").map(String::as_str),
            Some("my-group")
        );
    }

    #[test]
    fn neither_topics_nor_topics_regex_is_refused() {
        let err =
            SinkConnectorConfig::parse(&config(&[("name", "n"), ("connector.class", "file")]))
                .expect_err("no topics");
        assert_eq!(
            err.to_string(),
            "must configure one of topics or topics.regex"
        );
    }

    #[test]
    fn both_topics_and_topics_regex_are_refused_showing_both_values() {
        let mut props = minimal();
        props.insert("topics.regex".into(), "orders-.*".into());
        let err = SinkConnectorConfig::parse(&props).expect_err("both");
        assert_eq!(
            err.to_string(),
            "topics and topics.regex are mutually exclusive, but both are set (topics='orders', topics.regex='orders-.*'); remove one"
        );
    }

    #[test]
    fn a_topics_regex_must_match_whole_topic_names() {
        let props = config(&[
            ("name", "n"),
            ("connector.class", "file"),
            ("topics.regex", "orders-.*"),
        ]);
        let c = SinkConnectorConfig::parse(&props).expect("valid");
        assert!(c.topics.includes("orders-eu"));
        assert!(!c.topics.includes("old-orders-eu"));
    }

    #[test]
    fn a_dead_letter_queue_that_is_also_consumed_is_refused() {
        let props = config(&[
            ("name", "n"),
            ("connector.class", "file"),
            ("topics.regex", "orders.*"),
            ("errors.deadletterqueue.topic.name", "orders-dlq"),
        ]);
        let err = SinkConnectorConfig::parse(&props).expect_err("loop");
        assert_eq!(
            err.to_string(),
            "invalid value 'orders-dlq' for errors.deadletterqueue.topic.name: the dead letter queue topic is also consumed by the connector (topics.regex=orders.*); failed records would be read again. Choose another topic"
        );
    }

    #[test]
    fn all_problems_are_reported_together() {
        let props = config(&[
            ("connector.class", "file"),
            ("tasks.max", "0"),
            ("errors.tolerance", "some"),
            ("transforms", "x"),
        ]);
        let err = SinkConnectorConfig::parse(&props).expect_err("many problems");
        let messages: Vec<String> = err.flatten().iter().map(|e| e.to_string()).collect();
        assert_eq!(
            messages,
            vec![
                "missing required configuration 'name', which has no default value",
                "invalid value '0' for tasks.max: must be at least 1",
                "invalid value 'some' for errors.tolerance: expected one of none, all",
                "must configure one of topics or topics.regex",
                "missing required configuration 'transforms.x.type', which has no default value",
            ]
        );
    }

    #[test]
    fn unknown_converters_and_group_protocols_are_refused_naming_the_key() {
        let mut props = minimal();
        props.insert("value.converter".into(), "avro".into());
        props.insert("consumer.override.group.protocol".into(), "queue".into());
        let messages: Vec<String> = SinkConnectorConfig::parse(&props)
            .expect_err("two problems")
            .flatten()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            messages,
            vec![
                "invalid value 'queue' for consumer.override.group.protocol: expected one of share, classic, consumer",
                "unknown converter 'avro' for value.converter; expected one of json, string, bytearray",
            ]
        );
    }

    #[test]
    fn control_characters_in_the_name_are_refused() {
        let mut props = minimal();
        props.insert("name".into(), "a\tb".into());
        let err = SinkConnectorConfig::parse(&props).expect_err("tab");
        assert_eq!(err.to_string(), "invalid value 'a\tb' for name: contains the control character '\\t'; use printable characters only");
    }

    #[test]
    fn validation_report_attaches_cross_key_transform_and_connector_errors() {
        let connector_def = ConfigDef::new().define(ConfigKey::new(
            "file",
            ConfigType::String,
            Importance::High,
            "Output file.",
        ));
        let props = config(&[
            ("name", "n"),
            ("connector.class", "file"),
            ("transforms", "m"),
            ("transforms.m.type", "MaskField$Value"),
        ]);
        let report = validate_sink_connector(&props, &connector_def);
        assert_eq!(report.name, "file");
        assert_eq!(
            report.errors(),
            vec![
                "topics: must configure one of topics or topics.regex",
                "transforms.m.fields: missing required configuration 'transforms.m.fields', which has no default value",
                "file: missing required configuration 'file', which has no default value",
            ]
        );
        assert_eq!(report.error_count, 3);
        assert!(report.groups.contains(&"Error Handling".to_owned()));
        assert!(report.groups.contains(&"Transforms: m".to_owned()));
    }

    #[test]
    fn docs_cover_every_shared_key() {
        let docs = sink_connector_config_def().to_markdown();
        for key in [
            NAME,
            TOPICS_REGEX,
            ERRORS_TOLERANCE,
            DLQ_CONTEXT_HEADERS_ENABLE,
            CONNECTOR_GROUP_PROTOCOL,
        ] {
            assert!(
                docs.contains(&format!("#### `{key}`")),
                "{key} missing from docs"
            );
        }
    }
}
