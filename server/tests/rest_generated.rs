//! Drives every operation of `/openapi.json` with generated inputs — path parameters, query
//! parameters and bodies, valid and not — and asserts that the worker never answers 5xx and
//! that every error is Connect's `{"error_code", "message"}`. The inputs come from a seeded
//! generator: set `SPILLWAY_REST_SEED` to replay a failure.

mod support;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{json, Map, Value as Json};
use support::{broker, start_worker};

const ROUNDS_PER_OPERATION: usize = 30;

const WORDS: &[&str] = &[
    "",
    "files",
    "orders",
    "a b",
    "x/y",
    "..",
    "%",
    "名前",
    "\u{0}",
    "\n",
    "-1",
    "0",
    "1",
    "99999999999",
    "true",
    "RUNNING",
    "PAUSED",
    "STOPPED",
    "ASLEEP",
    "file",
    "kafka",
    "vault",
    "share",
    "classic",
    "status",
    "info",
    "[hidden]",
];

const KEYS: &[&str] = &[
    "name",
    "config",
    "initial_state",
    "connector.class",
    "topics",
    "topics.regex",
    "tasks.max",
    "errors.tolerance",
    "transforms",
    "consumer.override.group.protocol",
    "vault.password",
    "level",
    "task.inflight.batches",
    "errors.deadletterqueue.topic.name",
];

fn word(rng: &mut StdRng) -> String {
    match rng.gen_range(0..10) {
        0 => "x".repeat(rng.gen_range(100..400)),
        1 => (0..rng.gen_range(0..12))
            .map(|_| rng.gen_range(0x20u8..0x7f) as char)
            .collect(),
        _ => WORDS[rng.gen_range(0..WORDS.len())].to_owned(),
    }
}

fn value(rng: &mut StdRng, depth: u32) -> Json {
    match rng.gen_range(0..if depth > 2 { 6 } else { 9 }) {
        0 => Json::Null,
        1 => json!(rng.gen_bool(0.5)),
        2 => json!(rng.gen_range(-5i64..100)),
        3 => json!(rng.gen::<f64>() * 1e12),
        4 | 5 => json!(word(rng)),
        6 => Json::Array(
            (0..rng.gen_range(0..4))
                .map(|_| value(rng, depth + 1))
                .collect(),
        ),
        _ => object(rng, depth + 1),
    }
}

fn object(rng: &mut StdRng, depth: u32) -> Json {
    let mut map = Map::new();
    for _ in 0..rng.gen_range(0..7) {
        let key = if rng.gen_bool(0.8) {
            KEYS[rng.gen_range(0..KEYS.len())].to_owned()
        } else {
            word(rng)
        };
        map.insert(key, value(rng, depth));
    }
    // Often a plausible connector, so that generated requests also reach the deeper paths.
    if depth == 0 && rng.gen_bool(0.3) {
        let config = json!({"connector.class": "file", "topics": "orders", "tasks.max": "1"});
        map.insert("config".into(), config);
        map.insert("name".into(), json!(format!("gen-{}", rng.gen_range(0..5))));
    }
    Json::Object(map)
}

fn body(rng: &mut StdRng) -> Option<String> {
    match rng.gen_range(0..8) {
        0 => None,
        1 => Some(
            (0..rng.gen_range(1..40))
                .map(|_| rng.gen_range(0x20u8..0x7f) as char)
                .collect(),
        ),
        2 => Some(value(rng, 1).to_string()),
        _ => Some(object(rng, 0).to_string()),
    }
}

/// Percent-encodes everything but unreserved characters, so any generated text is one path
/// segment.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn query(rng: &mut StdRng) -> String {
    let names = [
        "expand",
        "includeTasks",
        "onlyFailed",
        "connectorsOnly",
        "x",
    ];
    let pairs: Vec<String> = (0..rng.gen_range(0..4))
        .map(|_| {
            let value = if rng.gen_bool(0.1) {
                "%zz".to_owned()
            } else {
                segment(&word(rng))
            };
            format!("{}={value}", names[rng.gen_range(0..names.len())])
        })
        .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

fn seed() -> u64 {
    std::env::var("SPILLWAY_REST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(932)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_for_every_documented_operation_never_get_a_5xx() {
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, api) = start_worker(&broker, &dir.path().join("state")).await;
    drive(std::slice::from_ref(&api), seed()).await;
    worker.stop().await;
}

/// The same with authentication on: requests come with the admin's token, a tenant's, a
/// made-up one or none, and still never get a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_requests_with_any_token_never_get_a_5xx() {
    const ADMIN: &str = "generated-admin-token-0123456789";
    let broker = broker();
    let dir = tempfile::tempdir().expect("temp dir");
    let (worker, anonymous) = support::start_worker_with(
        &broker,
        &dir.path().join("state"),
        &[("rest.auth.enabled", "true"), ("rest.admin.token", ADMIN)],
    )
    .await;
    let admin = anonymous.with_token(ADMIN);
    let created = admin.post("/tenants", json!({"name": "files"})).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let tenant = anonymous.with_token(created.body["token"].as_str().expect("token"));
    let callers = [admin, tenant, anonymous.with_token("made-up"), anonymous];
    drive(&callers, seed().wrapping_add(1)).await;
    worker.stop().await;
}

/// Sends every documented operation `ROUNDS_PER_OPERATION` times with generated inputs, each
/// time as one of `callers`.
async fn drive(callers: &[support::Client], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let doc: Json = serde_json::from_str(spillway::rest::OPENAPI).expect("the document is JSON");
    let mut operations: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            operations.push((method.to_uppercase(), path.clone()));
        }
    }
    for round in 0..ROUNDS_PER_OPERATION {
        for (method, path) in &operations {
            let mut concrete = path.clone();
            for param in ["{name}", "{task}", "{plugin}", "{tenant}"] {
                let text = match (param, rng.gen_range(0..3)) {
                    ("{task}", 0) => rng.gen_range(0..3).to_string(),
                    ("{name}", 0) => format!("gen-{}", rng.gen_range(0..5)),
                    ("{plugin}", 0) => "file".to_owned(),
                    ("{tenant}", 0) => "default".to_owned(),
                    ("{tenant}", 1) => "files".to_owned(),
                    _ => word(&mut rng),
                };
                concrete = concrete.replace(param, &segment(&text));
            }
            concrete.push_str(&query(&mut rng));
            let sent = body(&mut rng);
            let api = &callers[rng.gen_range(0..callers.len())];
            let answer = api
                .send(
                    Method::from_bytes(method.as_bytes()).expect("method"),
                    &concrete,
                    sent.clone(),
                )
                .await;
            let context = format!(
                "seed {seed} round {round}: {method} {concrete} with body {sent:?} answered {} {}",
                answer.status, answer.text
            );
            assert!(answer.status < 500, "{context}");
            if answer.status >= 400 {
                assert_eq!(answer.body["error_code"], answer.status, "{context}");
                assert!(answer.body["message"].is_string(), "{context}");
            }
        }
    }
    let health = callers[0]
        .wait_for("/health", Duration::from_secs(5), |h| {
            h["status"] == "healthy"
        })
        .await;
    assert_eq!(health["status"], "healthy");
}
