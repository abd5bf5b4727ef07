//! The HTTP sink's errors. Whether a failure is worth a retry is decided per status by
//! [`is_retriable_status`](crate::http::retry::is_retriable_status); here each failure is
//! named with the URL, the status and what the endpoint said.

use std::time::Duration;

use spillway_core::{RecordCoordinates, SinkError};

/// An error of the HTTP sink.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpSinkError {
    /// The endpoint refused the request's content for good (a 4xx other than 408/429 and
    /// those that refuse the configuration): the records' fault.
    #[error("{method} {url} answered {status}: {body}")]
    Refused {
        method: String,
        url: String,
        status: String,
        /// The start of the response body.
        body: String,
    },
    /// The endpoint refused the connector, not a record (401/403/404/...: see
    /// [`refuses_the_configuration`](crate::http::retry::refuses_the_configuration)): the task
    /// fails and its records are released, whatever `errors.tolerance` says.
    #[error("{method} {url} answered {status}: {body}; every record would get this answer, so the task fails and its records are released: check http.url, http.method, auth.type and its credentials, http.headers and batch.format")]
    RefusedConfiguration {
        method: String,
        url: String,
        status: String,
        /// The start of the response body.
        body: String,
    },
    /// Every attempt failed in a way worth retrying; the records are released.
    #[error("{method} {url} failed {attempts} time(s), last with {last}; releasing the records for redelivery")]
    Exhausted {
        method: String,
        url: String,
        attempts: u32,
        last: String,
    },
    /// The endpoint asked to wait longer than the sink may hold the records.
    #[error("{method} {url} answered {status} with Retry-After {wait:?}, longer than retry.backoff.max.ms ({max:?}); releasing the records for redelivery")]
    RetryAfterTooLong {
        method: String,
        url: String,
        status: String,
        wait: Duration,
        max: Duration,
    },
    /// The worker's egress policy refused the address the endpoint's host has now (checked at
    /// connection, so a name that resolved to a public address at validation and to an internal
    /// one later is caught): the task fails and its records are released.
    #[error("{method} {url} was not sent: {refusal}; the task fails and its records are released")]
    Egress {
        method: String,
        url: String,
        refusal: String,
    },
    /// An earlier request of the same batch gave up; this one was not sent.
    #[error("not sent because an earlier request of the batch failed: {0}")]
    NotSent(String),
    /// A record whose value cannot be written as JSON.
    #[error("record {record} cannot be sent as JSON: {detail}")]
    BadRecord {
        record: RecordCoordinates,
        detail: String,
    },
    /// A tombstone with `behavior.on.null.values=fail`.
    #[error("record {record} is a tombstone (null value) and behavior.on.null.values is fail")]
    Tombstone { record: RecordCoordinates },
}

impl HttpSinkError {
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            HttpSinkError::Exhausted { .. }
                | HttpSinkError::RetryAfterTooLong { .. }
                | HttpSinkError::NotSent(_)
        )
    }

    /// The endpoint refuses the connector's configuration: no record would get through.
    pub fn is_task_level(&self) -> bool {
        matches!(
            self,
            HttpSinkError::RefusedConfiguration { .. } | HttpSinkError::Egress { .. }
        )
    }

    /// The runtime's view: retriable → RELEASE, task-level → the task fails (its records are
    /// released), otherwise → REJECT with this message.
    pub fn into_sink_error(self) -> SinkError {
        let message = self.to_string();
        if self.is_retriable() {
            SinkError::retriable(message).caused_by(self)
        } else if self.is_task_level() {
            SinkError::task_level(message).caused_by(self)
        } else {
            SinkError::fatal(message).caused_by(self)
        }
    }
}

/// At most `limit` characters of a response body, for messages.
pub fn excerpt(body: &str, limit: usize) -> String {
    let body = body.trim();
    if body.chars().count() > limit {
        format!("{}...", body.chars().take(limit).collect::<String>())
    } else if body.is_empty() {
        "(empty body)".into()
    } else {
        body.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_method_url_status_and_body() {
        let e = HttpSinkError::Refused {
            method: "POST".into(),
            url: "http://h/in".into(),
            status: "400 Bad Request".into(),
            body: excerpt("{\"error\":\"id missing\"}", 200),
        };
        assert_eq!(
            e.to_string(),
            "POST http://h/in answered 400 Bad Request: {\"error\":\"id missing\"}"
        );
        assert!(!e.into_sink_error().is_retriable());
    }

    #[test]
    fn a_refused_configuration_fails_the_task_naming_what_to_check() {
        let e = HttpSinkError::RefusedConfiguration {
            method: "POST".into(),
            url: "http://h/in".into(),
            status: "401 Unauthorized".into(),
            body: excerpt("token expired", 200),
        };
        assert!(e.to_string().starts_with(
            "POST http://h/in answered 401 Unauthorized: token expired; every record would get this answer"
        ));
        let sink = e.into_sink_error();
        assert!(sink.is_task_level());
        assert!(!sink.is_retriable());
    }

    #[test]
    fn exhausted_retries_release() {
        let e = HttpSinkError::Exhausted {
            method: "POST".into(),
            url: "http://h/in".into(),
            attempts: 3,
            last: "503 Service Unavailable".into(),
        };
        assert!(e.is_retriable());
        assert_eq!(
            e.to_string(),
            "POST http://h/in failed 3 time(s), last with 503 Service Unavailable; releasing the \
             records for redelivery"
        );
    }

    #[test]
    fn long_bodies_are_cut() {
        assert_eq!(excerpt(&"x".repeat(300), 5), "xxxxx...");
        assert_eq!(excerpt("  ", 5), "(empty body)");
    }
}
