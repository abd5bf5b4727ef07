//! With `OTEL_EXPORTER_OTLP_ENDPOINT` set, the worker exports its metrics over OTLP/HTTP: an
//! in-test receiver gets Connect's metrics with the task labels. (Its own test binary: the
//! variables are process-wide.)

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::web::{self, Bytes, Data};
use actix_web::{App, HttpResponse, HttpServer};
use serde_json::Value as Json;
use support::pipelines::{self, SHARE};

type Received = Arc<Mutex<Vec<Json>>>;

async fn collect(body: Bytes, received: Data<Received>) -> HttpResponse {
    match serde_json::from_slice::<Json>(&body) {
        Ok(request) => {
            received
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(request);
            HttpResponse::Ok()
                .content_type("application/json")
                .body("{}")
        }
        Err(e) => HttpResponse::BadRequest().body(format!("not OTLP/JSON: {e}")),
    }
}

fn attribute<'a>(point: &'a Json, key: &str) -> Option<&'a str> {
    point["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?["value"]["stringValue"]
        .as_str()
}

/// A number of OTLP/JSON, which writes 64-bit integers as strings.
fn number(v: &Json) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str()?.parse().ok())
}

/// The value of `metric`'s data point for connector `SHARE` in the latest export that has it.
fn exported(requests: &[Json], metric: &str) -> Option<(Json, Json)> {
    requests.iter().rev().find_map(|request| {
        for rm in request["resourceMetrics"].as_array()? {
            for sm in rm["scopeMetrics"].as_array()? {
                for m in sm["metrics"].as_array()? {
                    if m["name"] != metric {
                        continue;
                    }
                    let data = ["sum", "gauge", "histogram"]
                        .iter()
                        .find_map(|kind| m.get(*kind))?;
                    let point = data["dataPoints"]
                        .as_array()?
                        .iter()
                        .find(|p| attribute(p, "connector") == Some(SHARE))?;
                    return Some((rm["resource"].clone(), point.clone()));
                }
            }
        }
        None
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exported_over_otlp_when_the_otel_variables_ask_for_it() {
    let received: Received = Arc::default();
    let data = Data::new(Arc::clone(&received));
    let receiver = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/v1/metrics", web::post().to(collect))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("a free port");
    let address = receiver.addrs()[0];
    let receiver = receiver.run();
    let receiver_handle = receiver.handle();
    tokio::spawn(receiver);
    // Read by the worker's Telemetry::from_env and by the OTLP exporter it builds.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{address}"));
    std::env::set_var("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json");
    std::env::set_var("OTEL_METRIC_EXPORT_INTERVAL", "300");
    std::env::set_var("OTEL_SERVICE_NAME", "spillway-otlp-test");

    let p = pipelines::start().await;
    let read_total = "kafka.connect.sink-task-metrics.sink-record-read-total";
    let latency = "kafka.connect.sink-task-metrics.sink-record-e2e-latency-ms";
    let deadline = Instant::now() + Duration::from_secs(60);
    let (resource, point, histogram) = loop {
        let requests = received.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let read = exported(&requests, read_total);
        let hist = exported(&requests, latency);
        if let (Some((resource, point)), Some((_, histogram))) = (read, hist) {
            let count = number(&histogram["count"]).unwrap_or(0.0);
            if number(&point["asInt"]).unwrap_or(0.0) >= (pipelines::SHARE_RECORDS + 1) as f64
                && count >= pipelines::SHARE_RECORDS as f64
            {
                break (resource, point, histogram);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no complete export of {read_total} and {latency} for {SHARE} in time; {} requests received",
            requests.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(attribute(&point, "tenant"), Some("acme"));
    assert_eq!(attribute(&point, "mode"), Some("share"));
    assert_eq!(attribute(&point, "task"), Some("0"));
    let service = resource["attributes"]
        .as_array()
        .and_then(|a| a.iter().find(|kv| kv["key"] == "service.name"))
        .map(|kv| kv["value"]["stringValue"].clone());
    assert_eq!(service, Some(Json::from("spillway-otlp-test")));
    assert!(
        histogram["bucketCounts"]
            .as_array()
            .is_some_and(|b| !b.is_empty()),
        "{histogram}"
    );
    p.stop().await;
    receiver_handle.stop(true).await;
}
