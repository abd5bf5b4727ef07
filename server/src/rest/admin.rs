//! The worker's own resources: `/` (version), `/health` (KIP-1017), `/admin/loggers`
//! (KIP-495, levels changed at runtime; KIP-976's `scope`) and `/openapi.json`.

use std::sync::atomic::Ordering;

use actix_web::web::{Data, Path, Payload, Query};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Map, Value as Json};

use crate::log_levels::LoggerLevel;
use crate::rest::body::read_json;
use crate::rest::error::ApiError;
use crate::rest::{Api, OPENAPI};
use crate::telemetry::log_levels;

/// `GET /`: Connect's `{version, commit, kafka_cluster_id}`.
pub async fn root(api: Data<Api>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "commit": option_env!("SPILLWAY_COMMIT").unwrap_or("unknown"),
        "kafka_cluster_id": api.kafka_cluster_id,
    }))
}

/// `GET /health`: 503 while the worker still restores its connectors, 200 after, and 503 for
/// good (with the reason) once its connector runtime is broken: restarting the worker is the
/// way back.
pub async fn health(api: Data<Api>) -> HttpResponse {
    if let Some(reason) = api.herder.runtime_failure() {
        HttpResponse::ServiceUnavailable().json(json!({
            "status": "unhealthy",
            "message": format!("The worker cannot run connectors: {reason}. Restart the worker; its connectors are restored from the state store."),
        }))
    } else if api.ready.load(Ordering::Acquire) {
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

fn level_json(level: &LoggerLevel) -> Json {
    json!({ "level": level.level.to_string(), "last_modified": level.last_modified })
}

/// `GET /admin/loggers`: logger name → `{level, last_modified}` for every logger that exists.
pub async fn loggers() -> HttpResponse {
    let all: Map<String, Json> = log_levels()
        .all()
        .iter()
        .map(|(name, level)| (name.clone(), level_json(level)))
        .collect();
    HttpResponse::Ok().json(all)
}

/// `GET /admin/loggers/{name}`.
pub async fn logger(name: Path<String>) -> Result<HttpResponse, ApiError> {
    let level = log_levels().get(&name)?;
    Ok(HttpResponse::Ok().json(level_json(&level)))
}

/// `PUT /admin/loggers/{name}?scope=worker|cluster` with `{"level": "DEBUG"}`: sets the level
/// of the logger and the loggers below it. Worker scope answers the loggers whose level
/// changed; cluster scope answers 204, as Connect does (this worker is the whole cluster).
pub async fn set_logger(
    request: HttpRequest,
    name: Path<String>,
    query: Query<Vec<(String, String)>>,
    payload: Payload,
    api: Data<Api>,
) -> Result<HttpResponse, ApiError> {
    let mut cluster = false;
    for (key, value) in query.iter().filter(|(k, _)| k == "scope") {
        match value.to_ascii_lowercase().as_str() {
            "worker" => cluster = false,
            "cluster" => cluster = true,
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "invalid {key} '{value}'; use worker or cluster"
                )))
            }
        }
    }
    let body = read_json(&request, payload, api.max_body_bytes).await?;
    let level = match body.get("level") {
        Some(Json::String(level)) => level.clone(),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "'level' must be a string such as \"DEBUG\", not {other}"
            )))
        }
        None => return Err(ApiError::BadRequest(
            "Desired 'level' parameter was not specified in request; send {\"level\": \"DEBUG\"}"
                .into(),
        )),
    };
    let changed = log_levels().set(&name, &level)?;
    if cluster {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Ok(HttpResponse::Ok().json(changed))
    }
}

pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}
