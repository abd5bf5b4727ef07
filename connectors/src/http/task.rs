//! The HTTP sink task: a batch of records becomes one or more requests of at most
//! `batch.max.records` values, each sent with an idempotency key and retried with backoff while
//! the endpoint's answer says a retry may help.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{HeaderMap, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use spillway_core::convert::JsonConverter;
use spillway_core::egress::{EgressPolicy, EgressRefusal};
use spillway_core::{ConfigMap, PutOutcome, SinkError, SinkRecord, SinkTask};

use crate::http::body::{idempotency_key, value_converter, value_json};
use crate::http::config::{Auth, HttpSinkConfig, NullValues};
use crate::http::error::{excerpt, HttpSinkError};
use crate::http::retry::{is_retriable_status, refuses_the_configuration, retry_after, Backoff};

/// How much of a refusing response's body goes into the reject reason.
const BODY_EXCERPT_CHARS: usize = 300;

/// Sends records to an HTTP endpoint; see the module docs.
#[derive(Default)]
pub struct HttpSinkTask {
    running: Option<Running>,
}

struct Running {
    config: HttpSinkConfig,
    client: Client,
    converter: JsonConverter,
}

/// Why an attempt failed, when a retry may help.
enum Retry {
    /// After this status, with the wait the endpoint asked for, if it did.
    Status(StatusCode, Option<std::time::Duration>),
    /// The request did not complete (connect error, reset, timeout).
    Transport(String),
}

impl HttpSinkTask {
    pub fn new() -> Self {
        HttpSinkTask::default()
    }
}

impl Running {
    fn method(&self) -> String {
        self.config.method.to_string()
    }

    /// One attempt: `Ok(Ok)` delivered, `Ok(Err)` worth retrying, `Err` refused for good.
    async fn attempt(&self, body: &Bytes, key: &str) -> Result<Result<(), Retry>, HttpSinkError> {
        let mut request = self
            .client
            .request(self.config.method.clone(), self.config.url.clone())
            .header(CONTENT_TYPE, self.config.batch_format.content_type())
            .header(&self.config.idempotency_key_header, key)
            .body(body.clone());
        let mut headers = HeaderMap::new();
        for (name, value) in &self.config.headers {
            headers.insert(name.clone(), value.clone());
        }
        request = request.headers(headers);
        request = match &self.config.auth {
            Auth::None => request,
            Auth::Basic { user, password } => request.basic_auth(user, Some(password.expose())),
            Auth::Bearer { token } => request.bearer_auth(token.expose()),
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                if let Some(refusal) = egress_refusal(&e) {
                    return Err(HttpSinkError::Egress {
                        method: self.method(),
                        url: self.config.url.to_string(),
                        refusal: refusal.to_string(),
                    });
                }
                return Ok(Err(Retry::Transport(transport_detail(&e))));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Ok(()));
        }
        if is_retriable_status(status) {
            let wait = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry_after(v, SystemTime::now()));
            return Ok(Err(Retry::Status(status, wait)));
        }
        let body = response.text().await.unwrap_or_default();
        if refuses_the_configuration(status) {
            return Err(HttpSinkError::RefusedConfiguration {
                method: self.method(),
                url: self.config.url.to_string(),
                status: status.to_string(),
                body: excerpt(&body, BODY_EXCERPT_CHARS),
            });
        }
        Err(HttpSinkError::Refused {
            method: self.method(),
            url: self.config.url.to_string(),
            status: status.to_string(),
            body: excerpt(&body, BODY_EXCERPT_CHARS),
        })
    }

    /// Sends one request body, retrying within the budget.
    async fn send(&self, body: Bytes, key: &str) -> Result<(), HttpSinkError> {
        let backoff = Backoff {
            initial: self.config.retry_backoff,
            max: self.config.retry_backoff_max,
        };
        let attempts = self.config.retry_max_attempts.max(1);
        for attempt in 1..=attempts {
            let failure = match self.attempt(&body, key).await? {
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            let (last, wait) = match failure {
                Retry::Status(status, Some(asked)) => {
                    if asked > backoff.max {
                        return Err(HttpSinkError::RetryAfterTooLong {
                            method: self.method(),
                            url: self.config.url.to_string(),
                            status: status.to_string(),
                            wait: asked,
                            max: backoff.max,
                        });
                    }
                    (status.to_string(), asked)
                }
                Retry::Status(status, None) => (status.to_string(), backoff.delay(attempt)),
                Retry::Transport(detail) => (detail, backoff.delay(attempt)),
            };
            tracing::debug!(url = %self.config.url, attempt, %last, ?wait, "request failed; retrying");
            if attempt == attempts {
                return Err(HttpSinkError::Exhausted {
                    method: self.method(),
                    url: self.config.url.to_string(),
                    attempts,
                    last,
                });
            }
            tokio::time::sleep(wait).await;
        }
        unreachable!("the loop returns on its last attempt (attempts >= 1)")
    }
}

/// The egress policy's refusal of an address, when that is why the request failed.
fn egress_refusal(error: &reqwest::Error) -> Option<&EgressRefusal> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(refusal) = cause.downcast_ref::<EgressRefusal>() {
            return refusal.is_internal().then_some(refusal);
        }
        source = cause.source();
    }
    None
}

/// Resolves the endpoint's host names for the HTTP client through the worker's egress
/// policy: the client connects to the addresses judged here, at connection time, and never
/// resolves the name again itself (a name rebound to an internal address is refused).
struct VettingResolver {
    policy: Arc<EgressPolicy>,
}

impl reqwest::dns::Resolve for VettingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // getaddrinfo blocks; the client sets the URL's port on the addresses.
            let vetted = tokio::task::spawn_blocking(move || policy.vet(&host, 0)).await??;
            let addrs: reqwest::dns::Addrs = Box::new(vetted.into_iter());
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(addrs)
        })
    }
}

/// Follows redirects (at most 10, as reqwest does) to addresses the policy allows: a redirect
/// to a host name goes through [`VettingResolver`]; one to an address is judged here.
fn vetting_redirects(policy: Arc<EgressPolicy>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            return attempt.error("more than 10 redirects");
        }
        let literal = attempt
            .url()
            .host_str()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .and_then(|h| h.parse::<IpAddr>().ok());
        let port = attempt.url().port_or_known_default().unwrap_or(0);
        match literal.map(|ip| policy.vet(&ip.to_string(), port)) {
            Some(Err(refusal)) => attempt.error(refusal),
            _ => attempt.follow(),
        }
    })
}

/// A transport error with its causes, e.g. "timed out" or "connection refused".
fn transport_detail(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "a timeout (no answer within http.timeout.ms)".into();
    }
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        detail.push_str(": ");
        detail.push_str(&cause.to_string());
        source = cause.source();
    }
    detail
}

#[async_trait]
impl SinkTask for HttpSinkTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let egress = EgressPolicy::from_plugin_config(config)
            .map_err(|e| SinkError::fatal(e.to_string()))?
            .map(Arc::new);
        let config = HttpSinkConfig::parse(config).map_err(|e| SinkError::fatal(e.to_string()))?;
        let mut builder = Client::builder()
            .timeout(config.timeout)
            .user_agent(concat!("spillway-http-sink/", env!("CARGO_PKG_VERSION")));
        if let Some(policy) = egress {
            // A proxy from the environment would connect on the tenant's behalf, unvetted.
            builder = builder
                .no_proxy()
                .dns_resolver(Arc::new(VettingResolver {
                    policy: Arc::clone(&policy),
                }))
                .redirect(vetting_redirects(policy));
        }
        let client = builder
            .build()
            .map_err(|e| SinkError::fatal(format!("cannot build the HTTP client: {e}")))?;
        self.running = Some(Running {
            config,
            client,
            converter: value_converter(),
        });
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        let running = self
            .running
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the HTTP sink task was not started"))?;
        let mut outcomes: Vec<Option<PutOutcome>> = vec![None; records.len()];
        let mut values: Vec<(usize, Bytes)> = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            if record.is_tombstone() {
                if running.config.null_values == NullValues::Fail {
                    let error = HttpSinkError::Tombstone {
                        record: record.original.clone(),
                    };
                    outcomes[index] = Some(PutOutcome::Fatal(error.into_sink_error()));
                }
                continue;
            }
            match value_json(&running.converter, record) {
                Ok(json) => values.push((index, json)),
                Err(detail) => {
                    let error = HttpSinkError::BadRecord {
                        record: record.original.clone(),
                        detail,
                    };
                    outcomes[index] = Some(PutOutcome::Fatal(error.into_sink_error()));
                }
            }
        }
        let mut gave_up: Option<String> = None;
        for chunk in values.chunks(running.config.batch_max_records) {
            let result = match &gave_up {
                // The endpoint is unwell: do not spend another retry budget on it now.
                Some(reason) => Err(HttpSinkError::NotSent(reason.clone())),
                None => {
                    let key = idempotency_key(
                        &running.config.connector_name,
                        chunk.iter().map(|(i, _)| &records[*i].original),
                    );
                    let body = running
                        .config
                        .batch_format
                        .encode(chunk.iter().map(|(_, v)| v));
                    running.send(Bytes::from(body), &key).await
                }
            };
            let outcome = match result {
                Ok(()) => PutOutcome::Ok,
                Err(e) => {
                    // A refusal of the configuration fails the task: no use sending the rest.
                    if (e.is_retriable() || e.is_task_level()) && gave_up.is_none() {
                        gave_up = Some(e.to_string());
                    }
                    PutOutcome::from_result(Err(e.into_sink_error()))
                }
            };
            for (index, _) in chunk {
                outcomes[*index] = Some(outcome.clone());
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or(PutOutcome::Ok))
            .collect())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        self.running = None;
        Ok(())
    }
}
