//! The worker's own resources: `/` (version), `/health` (KIP-1017), `/admin/loggers`
//! (KIP-495, read only) and `/openapi.json`.

use std::sync::atomic::Ordering;

use actix_web::web::{Data, Path};
use actix_web::HttpResponse;
use serde_json::json;

use crate::rest::error::ApiError;
use crate::rest::{Api, OPENAPI};

/// `GET /`: Connect's `{version, commit, kafka_cluster_id}`.
pub async fn root(api: Data<Api>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "commit": option_env!("SPILLWAY_COMMIT").unwrap_or("unknown"),
        "kafka_cluster_id": api.kafka_cluster_id,
    }))
}

/// `GET /health`: 503 while the worker still restores its connectors, 200 after.
pub async fn health(api: Data<Api>) -> HttpResponse {
    if api.ready.load(Ordering::Acquire) {
        HttpResponse::Ok().json(json!({
            "status": "healthy",
            "message": "Worker has completed startup and is ready to handle requests."
        }))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({
            "status": "starting",
            "message": "Worker is still starting up: connectors are being restored from the state store."
        }))
    }
}

/// The level of the root logger: what `RUST_LOG` set, or INFO.
fn root_level() -> String {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|filter| {
            filter
                .split(',')
                .find(|directive| !directive.contains('='))
                .map(|level| level.trim().to_ascii_uppercase())
        })
        .filter(|level| !level.is_empty())
        .unwrap_or_else(|| "INFO".to_owned())
}

/// `GET /admin/loggers`: logger name → `{level, last_modified}`. Levels are set at start with
/// `RUST_LOG`; only the root logger is reported.
pub async fn loggers() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "root": { "level": root_level(), "last_modified": null } }))
}

/// `GET /admin/loggers/{name}`.
pub async fn logger(name: Path<String>) -> Result<HttpResponse, ApiError> {
    if name.as_str() == "root" {
        Ok(HttpResponse::Ok().json(json!({ "level": root_level(), "last_modified": null })))
    } else {
        Err(ApiError::NotFound(format!(
            "Logger {name} not found; this worker reports the root logger (levels are set with RUST_LOG)"
        )))
    }
}

pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}
