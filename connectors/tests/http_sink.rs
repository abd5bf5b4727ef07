//! The HTTP sink against an in-test receiver on 127.0.0.1 that answers from a script (429 with
//! Retry-After, 500, a slow answer, 400) and records every request it gets.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use spillway_connectors::http::HttpSinkTask;
use spillway_core::{ConfigMap, Disposition, PutOutcome, SinkRecord, SinkTask, Struct, Value};

/// What the receiver does with the next request.
#[derive(Clone)]
enum Answer {
    Status(u16, Option<&'static str>, &'static str),
    /// Answer 200, but only after this long.
    Slow(Duration),
    /// Answer 307 to this location.
    Redirect(&'static str),
}

/// A request as the receiver saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    headers: HeaderMap,
    body: String,
    at: Instant,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn key(&self) -> &str {
        self.header("idempotency-key")
            .expect("every request carries a key")
    }
}

#[derive(Default)]
struct Receiver {
    script: VecDeque<Answer>,
    seen: Vec<Seen>,
}

type Shared = Arc<Mutex<Receiver>>;

async fn receive(
    State(shared): State<Shared>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = {
        let mut receiver = shared.lock().expect("receiver lock");
        receiver.seen.push(Seen {
            method,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            at: Instant::now(),
        });
        receiver.script.pop_front()
    };
    match answer {
        None => StatusCode::OK.into_response(),
        Some(Answer::Redirect(to)) => {
            (StatusCode::TEMPORARY_REDIRECT, [("location", to)], "").into_response()
        }
        Some(Answer::Slow(wait)) => {
            tokio::time::sleep(wait).await;
            StatusCode::OK.into_response()
        }
        Some(Answer::Status(code, retry_after, body)) => {
            let status = StatusCode::from_u16(code).expect("a status code");
            match retry_after {
                Some(after) => (status, [("retry-after", after)], body).into_response(),
                None => (status, body).into_response(),
            }
        }
    }
}

/// Starts a receiver answering `script` in order (then 200s); returns its URL and state.
async fn receiver(script: Vec<Answer>) -> (String, Shared) {
    let shared: Shared = Arc::new(Mutex::new(Receiver {
        script: script.into(),
        seen: Vec::new(),
    }));
    let app = Router::new()
        .route("/ingest", axum::routing::any(receive))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let address = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/ingest"), shared)
}

fn seen(shared: &Shared) -> Vec<Seen> {
    shared.lock().expect("receiver lock").seen.clone()
}

fn config(url: &str, pairs: &[(&str, &str)]) -> ConfigMap {
    let mut config: ConfigMap = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    config.insert("http.url".into(), url.into());
    config.insert("name".into(), "orders-to-http".into());
    config
}

fn records(count: i64) -> Vec<SinkRecord> {
    (0..count)
        .map(|i| {
            let value = Value::Struct(
                Struct::new()
                    .with("id", i.into())
                    .with("item", "tea".into()),
            );
            SinkRecord::new("orders", (i % 2) as i32, 100 + i, value)
        })
        .collect()
}

async fn started(config: &ConfigMap) -> HttpSinkTask {
    let mut task = HttpSinkTask::new();
    task.start(config).await.expect("the sink starts");
    task
}

fn dispositions(outcomes: &[PutOutcome]) -> Vec<Disposition> {
    outcomes.iter().map(PutOutcome::disposition).collect()
}

#[tokio::test]
async fn batches_are_json_arrays_and_redelivery_repeats_the_idempotency_keys() {
    let (url, shared) = receiver(Vec::new()).await;
    let mut task = started(&config(
        &url,
        &[
            ("batch.max.records", "2"),
            ("http.headers", "X-Tenant:acme|X-Source: spillway"),
            ("auth.type", "bearer"),
            ("bearer.token", "t0ken"),
        ],
    ))
    .await;
    let batch = records(5);
    let outcomes = task.put(&batch).await.expect("sent");
    assert!(outcomes.iter().all(PutOutcome::is_ok));

    let first = seen(&shared);
    let bodies: Vec<&str> = first.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(
        bodies,
        vec![
            r#"[{"id":0,"item":"tea"},{"id":1,"item":"tea"}]"#,
            r#"[{"id":2,"item":"tea"},{"id":3,"item":"tea"}]"#,
            r#"[{"id":4,"item":"tea"}]"#,
        ]
    );
    let request = &first[0];
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("x-tenant"), Some("acme"));
    assert_eq!(request.header("x-source"), Some("spillway"));
    assert_eq!(request.header("authorization"), Some("Bearer t0ken"));
    let keys: Vec<&str> = first.iter().map(Seen::key).collect();
    assert_eq!(keys[0].len(), 64);
    assert!(
        keys[0] != keys[1] && keys[1] != keys[2],
        "each request names other records"
    );

    // The same records again (a redelivery) carry the same keys.
    task.put(&batch).await.expect("sent again");
    let again = seen(&shared);
    let keys_again: Vec<&str> = again[3..].iter().map(Seen::key).collect();
    assert_eq!(keys_again, keys);
}

#[tokio::test]
async fn ndjson_is_one_value_per_line_sent_with_the_method_and_basic_auth() {
    let (url, shared) = receiver(Vec::new()).await;
    let mut task = started(&config(
        &url,
        &[
            ("batch.format", "ndjson"),
            ("http.method", "PUT"),
            ("auth.type", "basic"),
            ("connection.user", "ada"),
            ("connection.password", "s3cret"),
        ],
    ))
    .await;
    let mut batch = records(3);
    batch.push(SinkRecord::new("orders", 0, 200, Value::Null)); // ignored tombstone
    let outcomes = task.put(&batch).await.expect("sent");
    assert!(outcomes.iter().all(PutOutcome::is_ok));
    let requests = seen(&shared);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, Method::PUT);
    assert_eq!(
        requests[0].body,
        "{\"id\":0,\"item\":\"tea\"}\n{\"id\":1,\"item\":\"tea\"}\n{\"id\":2,\"item\":\"tea\"}\n"
    );
    assert_eq!(
        requests[0].header("content-type"),
        Some("application/x-ndjson")
    );
    // base64("ada:s3cret")
    assert_eq!(
        requests[0].header("authorization"),
        Some("Basic YWRhOnMzY3JldA==")
    );
}

#[tokio::test]
async fn a_429_with_retry_after_is_honoured_and_the_retry_repeats_the_key() {
    let (url, shared) = receiver(vec![Answer::Status(429, Some("1"), "slow down")]).await;
    let mut task = started(&config(&url, &[("retry.backoff.ms", "10")])).await;
    let outcomes = task.put(&records(2)).await.expect("sent");
    assert!(outcomes.iter().all(PutOutcome::is_ok));
    let requests = seen(&shared);
    assert_eq!(requests.len(), 2);
    let waited = requests[1].at - requests[0].at;
    assert!(
        waited >= Duration::from_millis(950),
        "waited {waited:?}, asked 1s"
    );
    assert_eq!(requests[0].key(), requests[1].key());
    assert_eq!(requests[0].body, requests[1].body);
}

#[tokio::test]
async fn a_retry_after_beyond_the_backoff_cap_releases_at_once() {
    let (url, shared) = receiver(vec![Answer::Status(503, Some("120"), "maintenance")]).await;
    let mut task = started(&config(&url, &[])).await;
    let started_at = Instant::now();
    let outcomes = task.put(&records(2)).await.expect("per record");
    assert!(started_at.elapsed() < Duration::from_secs(5));
    assert_eq!(seen(&shared).len(), 1);
    let PutOutcome::Retriable(e) = &outcomes[0] else {
        panic!("expected a release, got {:?}", dispositions(&outcomes))
    };
    assert!(
        e.message().ends_with(
            "answered 503 Service Unavailable with Retry-After 120s, longer than \
             retry.backoff.max.ms (10s); releasing the records for redelivery"
        ),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff_then_released_and_the_redelivery_lands() {
    let script = vec![Answer::Status(500, None, "boom"); 3];
    let (url, shared) = receiver(script).await;
    let mut task = started(&config(
        &url,
        &[
            ("retry.max.attempts", "3"),
            ("retry.backoff.ms", "100"),
            ("batch.max.records", "2"),
        ],
    ))
    .await;
    let batch = records(4);
    let outcomes = task.put(&batch).await.expect("per record");
    assert_eq!(dispositions(&outcomes), vec![Disposition::Release; 4]);
    let PutOutcome::Retriable(first) = &outcomes[0] else {
        panic!("released")
    };
    assert!(
        first.message().ends_with(
            "failed 3 time(s), last with 500 Internal Server Error; releasing the records for \
             redelivery"
        ),
        "{}",
        first.message()
    );
    let PutOutcome::Retriable(second) = &outcomes[2] else {
        panic!("released")
    };
    assert!(second
        .message()
        .starts_with("not sent because an earlier request"));
    let requests = seen(&shared);
    assert_eq!(
        requests.len(),
        3,
        "the second request was not tried once the first gave up"
    );
    let gaps: Vec<Duration> = requests.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps[0] >= Duration::from_millis(90), "{gaps:?}");
    assert!(
        gaps[1] >= Duration::from_millis(190),
        "backoff doubles: {gaps:?}"
    );

    // The broker redelivers the released records; the endpoint has recovered.
    let outcomes = task.put(&batch).await.expect("sent");
    assert!(outcomes.iter().all(PutOutcome::is_ok));
    let requests = seen(&shared);
    assert_eq!(requests.len(), 5);
    assert_eq!(
        requests[3].key(),
        requests[0].key(),
        "the redelivery carries the same key"
    );
}

#[tokio::test]
async fn a_timeout_is_retried_with_the_same_key() {
    let (url, shared) = receiver(vec![Answer::Slow(Duration::from_secs(3))]).await;
    let mut task = started(&config(
        &url,
        &[("http.timeout.ms", "300"), ("retry.backoff.ms", "10")],
    ))
    .await;
    let outcomes = task.put(&records(1)).await.expect("sent");
    assert!(
        outcomes.iter().all(PutOutcome::is_ok),
        "{:?}",
        dispositions(&outcomes)
    );
    let requests = seen(&shared);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].key(), requests[1].key());
}

#[tokio::test]
async fn a_timeout_on_every_attempt_releases_the_records() {
    let script = vec![Answer::Slow(Duration::from_secs(3)); 2];
    let (url, _shared) = receiver(script).await;
    let mut task = started(&config(
        &url,
        &[
            ("http.timeout.ms", "200"),
            ("retry.backoff.ms", "10"),
            ("retry.max.attempts", "2"),
        ],
    ))
    .await;
    let outcomes = task.put(&records(1)).await.expect("per record");
    let PutOutcome::Retriable(e) = &outcomes[0] else {
        panic!("expected a release, got {:?}", dispositions(&outcomes))
    };
    assert!(
        e.message()
            .contains("last with a timeout (no answer within http.timeout.ms)"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn a_400_rejects_the_records_with_status_and_body_and_is_not_retried() {
    let (url, shared) = receiver(vec![Answer::Status(
        400,
        None,
        "{\"error\":\"field 'customer' is required\"}",
    )])
    .await;
    let mut task = started(&config(&url, &[])).await;
    let outcomes = task.put(&records(2)).await.expect("per record");
    let expected = format!(
        "POST {url} answered 400 Bad Request: {{\"error\":\"field 'customer' is required\"}}"
    );
    assert_eq!(
        dispositions(&outcomes),
        vec![Disposition::Reject { reason: expected }; 2]
    );
    assert_eq!(seen(&shared).len(), 1);
}

/// 401, 403, 404, ... refuse the connector, not the records: task-level outcomes (the task
/// fails and the batch is released, whatever errors.tolerance says), not retried, and the
/// rest of the batch is not sent (docs/runtime.md, "Error kinds").
#[tokio::test]
async fn a_401_or_404_is_a_task_level_refusal_and_the_rest_of_the_batch_is_not_sent() {
    for (status, reason) in [
        (401, "401 Unauthorized"),
        (403, "403 Forbidden"),
        (404, "404 Not Found"),
    ] {
        let (url, shared) = receiver(vec![Answer::Status(status, None, "token expired")]).await;
        let mut task = started(&config(&url, &[("batch.max.records", "1")])).await;
        let outcomes = task.put(&records(3)).await.expect("per record");
        let Some(error) = outcomes[0].task_level() else {
            panic!("{status}: expected a task-level outcome, got {outcomes:?}");
        };
        assert!(
            error
                .message()
                .starts_with(&format!("POST {url} answered {reason}: token expired"))
                && error.message().contains("check http.url"),
            "{error}"
        );
        assert!(
            dispositions(&outcomes)
                .iter()
                .all(|d| *d == Disposition::Release),
            "nothing rejected: {outcomes:?}"
        );
        assert_eq!(
            seen(&shared).len(),
            1,
            "{status}: not retried, the rest not sent"
        );
    }
}

#[tokio::test]
async fn an_unreachable_endpoint_releases_the_records() {
    // Bind a port, then close it: nothing listens there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("bound");
    drop(listener);
    let mut task = started(&config(
        &format!("http://{address}/ingest"),
        &[("retry.max.attempts", "2"), ("retry.backoff.ms", "10")],
    ))
    .await;
    let outcomes = task.put(&records(1)).await.expect("per record");
    assert_eq!(dispositions(&outcomes), vec![Disposition::Release]);
}

#[tokio::test]
async fn tombstones_are_rejected_when_configured_to_fail() {
    let (url, shared) = receiver(Vec::new()).await;
    let mut task = started(&config(&url, &[("behavior.on.null.values", "fail")])).await;
    let mut batch = records(1);
    batch.push(SinkRecord::new("orders", 1, 7, Value::Null));
    let outcomes = task.put(&batch).await.expect("per record");
    assert_eq!(
        dispositions(&outcomes),
        vec![
            Disposition::Accept,
            Disposition::Reject {
                reason: "record orders-1@7 is a tombstone (null value) and behavior.on.null.values is fail"
                    .into()
            }
        ]
    );
    assert_eq!(seen(&shared).len(), 1);
}

/// The task-level error of the one record's outcome.
fn task_level_message(outcomes: &[PutOutcome]) -> String {
    outcomes[0]
        .task_level()
        .unwrap_or_else(|| panic!("a task-level refusal, not {:?}", outcomes[0]))
        .to_string()
}

/// A confined tenant's sink (the runtime sets `spillway.egress.allow`) resolves the endpoint's
/// name through the egress policy when it connects and connects to the judged address:
/// `localhost` is loopback, refused unless the allow-list names it. The task fails (a
/// task-level outcome) naming the host, the address and `tenant.egress.allow`; nothing is sent.
#[tokio::test]
async fn a_confined_sink_judges_the_address_it_connects_to() {
    let (url, shared) = receiver(Vec::new()).await;
    let by_name = url.replace("127.0.0.1", "localhost");
    let mut task = started(&config(&by_name, &[("spillway.egress.allow", "")])).await;
    let outcomes = task.put(&records(1)).await.expect("outcomes");
    let message = task_level_message(&outcomes);
    for part in ["localhost", "loopback", "tenant.egress.allow"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(seen(&shared).is_empty(), "nothing reached the endpoint");

    let mut allowed = started(&config(
        &by_name,
        &[("spillway.egress.allow", "127.0.0.0/8,::1")],
    ))
    .await;
    let outcomes = allowed.put(&records(1)).await.expect("outcomes");
    assert!(outcomes[0].is_ok(), "{:?}", outcomes[0]);
    assert_eq!(seen(&shared).len(), 1);
}

/// A redirect from an allowed endpoint to an internal address literal is not followed.
#[tokio::test]
async fn a_confined_sink_does_not_follow_a_redirect_into_the_private_network() {
    let (url, shared) = receiver(vec![Answer::Redirect("http://10.255.0.1:8083/connectors")]).await;
    let mut task = started(&config(&url, &[("spillway.egress.allow", "127.0.0.1")])).await;
    let outcomes = task.put(&records(1)).await.expect("outcomes");
    let message = task_level_message(&outcomes);
    for part in ["10.255.0.1", "private", "tenant.egress.allow"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(
        seen(&shared).len(),
        1,
        "only the allowed endpoint was reached"
    );
}
