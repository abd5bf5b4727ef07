//! Dead-letter records: what goes to `errors.deadletterqueue.topic.name` when a record fails
//! conversion, transformation or `put`. As in Connect, the dead letter carries the record's
//! original key, value, headers and timestamp untouched (the bytes that failed, not a
//! re-serialization), plus — with `errors.deadletterqueue.context.headers.enable` — the
//! `__connect.errors.*` headers that say where it came from and why it failed.

use std::error::Error as _;

use bytes::Bytes;

use crate::error::{ConnectError, Stage};
use crate::record::RawRecord;

/// Prefix of the error-context header names.
pub const ERROR_HEADER_PREFIX: &str = "__connect.errors.";

/// Where and why a record failed, for the context headers.
#[derive(Debug, Clone)]
pub struct ErrorContext<'a> {
    pub connector: &'a str,
    pub task_id: u32,
    pub stage: Stage,
    /// What was running: a converter, a transform's alias and type, or the connector class.
    pub executing: &'a str,
    pub error: &'a ConnectError,
}

/// A record to produce to the dead letter queue; the producer chooses its partition.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterRecord {
    pub topic: String,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    pub timestamp: Option<i64>,
}

impl ConnectError {
    /// The error's kind, written where Connect writes the exception class name.
    pub fn kind_name(&self) -> &'static str {
        match self {
            ConnectError::Config(_) => "ConfigError",
            ConnectError::Convert(_) => "ConvertError",
            ConnectError::Transform(_) => "TransformError",
            ConnectError::Sink(e) if e.is_retriable() => "SinkError::Retriable",
            ConnectError::Sink(_) => "SinkError::Fatal",
        }
    }
}

/// The dead letter for `raw`; context headers are added when `context` is given, except
/// those the record already has (a record that failed twice keeps its first context).
pub fn dead_letter_record(
    raw: &RawRecord,
    dlq_topic: &str,
    context: Option<&ErrorContext<'_>>,
) -> DeadLetterRecord {
    let mut headers = raw.headers.clone();
    if let Some(ctx) = context {
        for (name, value) in context_headers(raw, ctx) {
            if !headers.iter().any(|(k, _)| *k == name) {
                headers.push((name, value));
            }
        }
    }
    DeadLetterRecord {
        topic: dlq_topic.to_owned(),
        key: raw.key.clone(),
        value: raw.value.clone(),
        headers,
        timestamp: raw.timestamp,
    }
}

/// Connect's error-context headers, values as UTF-8 text.
pub fn context_headers(raw: &RawRecord, ctx: &ErrorContext<'_>) -> Vec<(String, Option<Bytes>)> {
    let mut causes = Vec::new();
    let mut source = ctx.error.source();
    while let Some(cause) = source {
        causes.push(format!("caused by: {cause}"));
        source = cause.source();
    }
    let trace = std::iter::once(ctx.error.to_string())
        .chain(causes)
        .collect::<Vec<_>>()
        .join("\n");
    [
        ("topic", raw.topic.to_string()),
        ("partition", raw.partition.to_string()),
        ("offset", raw.offset.to_string()),
        ("connector.name", ctx.connector.to_owned()),
        ("task.id", ctx.task_id.to_string()),
        ("stage", ctx.stage.as_str().to_owned()),
        ("class.name", ctx.executing.to_owned()),
        ("exception.class.name", ctx.error.kind_name().to_owned()),
        ("exception.message", ctx.error.to_string()),
        ("exception.stacktrace", trace),
    ]
    .into_iter()
    .map(|(name, value)| {
        (
            format!("{ERROR_HEADER_PREFIX}{name}"),
            Some(Bytes::from(value)),
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ConvertError, RecordPart, SinkError};

    fn raw() -> RawRecord {
        let mut r = RawRecord::new("orders", 4, 77);
        r.key = Some(Bytes::from_static(b"k"));
        r.value = Some(Bytes::from_static(b"{broken"));
        r.headers = vec![("traceparent".into(), Some(Bytes::from_static(b"00-1")))];
        r.timestamp = Some(123);
        r
    }

    fn header<'a>(record: &'a DeadLetterRecord, name: &str) -> Option<&'a str> {
        record
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    #[test]
    fn the_dead_letter_keeps_the_original_bytes_headers_and_timestamp() {
        let dl = dead_letter_record(&raw(), "orders-dlq", None);
        assert_eq!(dl.topic, "orders-dlq");
        assert_eq!(dl.value.as_deref(), Some(&b"{broken"[..]));
        assert_eq!(dl.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(dl.timestamp, Some(123));
        assert_eq!(
            dl.headers,
            raw().headers,
            "no context headers unless enabled"
        );
    }

    #[test]
    fn context_headers_say_where_the_record_came_from_and_why_it_failed() {
        let error = ConnectError::from(ConvertError::Deserialize {
            converter: "json",
            part: RecordPart::Value,
            topic: "orders".into(),
            detail: "'{broken' is not valid JSON".into(),
        });
        let ctx = ErrorContext {
            connector: "pg",
            task_id: 2,
            stage: error.stage().unwrap_or(Stage::TaskPut),
            executing: "json",
            error: &error,
        };
        let dl = dead_letter_record(&raw(), "dlq", Some(&ctx));
        assert_eq!(header(&dl, "__connect.errors.topic"), Some("orders"));
        assert_eq!(header(&dl, "__connect.errors.partition"), Some("4"));
        assert_eq!(header(&dl, "__connect.errors.offset"), Some("77"));
        assert_eq!(header(&dl, "__connect.errors.connector.name"), Some("pg"));
        assert_eq!(header(&dl, "__connect.errors.task.id"), Some("2"));
        assert_eq!(
            header(&dl, "__connect.errors.stage"),
            Some("VALUE_CONVERTER")
        );
        assert_eq!(header(&dl, "__connect.errors.class.name"), Some("json"));
        assert_eq!(
            header(&dl, "__connect.errors.exception.class.name"),
            Some("ConvertError")
        );
        assert_eq!(
            header(&dl, "__connect.errors.exception.message"),
            Some("json converter cannot read the value of a record from topic 'orders': '{broken' is not valid JSON")
        );
        assert_eq!(header(&dl, "traceparent"), Some("00-1"));
    }

    #[test]
    fn the_stacktrace_header_lists_the_cause_chain() {
        let error = ConnectError::from(
            SinkError::fatal("insert failed").caused_by(std::io::Error::other("duplicate key")),
        );
        let ctx = ErrorContext {
            connector: "pg",
            task_id: 0,
            stage: Stage::TaskPut,
            executing: "postgres",
            error: &error,
        };
        let dl = dead_letter_record(&raw(), "dlq", Some(&ctx));
        assert_eq!(
            header(&dl, "__connect.errors.exception.stacktrace"),
            Some("fatal: insert failed\ncaused by: duplicate key")
        );
        assert_eq!(
            header(&dl, "__connect.errors.exception.class.name"),
            Some("SinkError::Fatal")
        );
    }

    #[test]
    fn existing_context_headers_are_not_overwritten() {
        let mut r = raw();
        r.headers.push((
            "__connect.errors.stage".into(),
            Some(Bytes::from_static(b"TRANSFORMATION")),
        ));
        let error = ConnectError::from(SinkError::fatal("x"));
        let ctx = ErrorContext {
            connector: "c",
            task_id: 0,
            stage: Stage::TaskPut,
            executing: "c",
            error: &error,
        };
        let dl = dead_letter_record(&r, "dlq", Some(&ctx));
        let stages: Vec<_> = dl
            .headers
            .iter()
            .filter(|(k, _)| k == "__connect.errors.stage")
            .collect();
        assert_eq!(stages.len(), 1);
        assert_eq!(
            header(&dl, "__connect.errors.stage"),
            Some("TRANSFORMATION")
        );
    }
}
