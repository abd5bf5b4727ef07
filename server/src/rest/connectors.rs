//! `/connectors/...`: Kafka Connect's connector resources, with its paths, status codes and
//! JSON shapes. The same handlers answer `/tenants/{tenant}/connectors/...`; [`Caller`] says
//! which tenant's connectors a request acts on.

use std::str::FromStr;

use actix_web::web::{Data, Path, Payload, Query};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Map, Value as Json};
use spillway_storage::TargetState;

use crate::herder::{OffsetChange, RestartRequest};
use crate::rest::auth::Caller;
use crate::rest::body;
use crate::rest::error::ApiError;
use crate::rest::Api;

type Params = Query<Vec<(String, String)>>;

/// `{name}` of a connector path (beside `{tenant}` on tenant-scoped paths).
#[derive(serde::Deserialize)]
pub struct NamePath {
    name: String,
}

/// `{name}` and `{task}` of a task path.
#[derive(serde::Deserialize)]
pub struct TaskPath {
    name: String,
    task: String,
}

/// Where a new connector is found: its path under the caller's routes.
fn location(request: &HttpRequest, name: &str) -> String {
    match request.match_info().get("tenant") {
        Some(tenant) => format!("/tenants/{tenant}/connectors/{name}"),
        None => format!("/connectors/{name}"),
    }
}

/// A boolean query parameter (`includeTasks=true`); absent means false.
fn flag(params: &Params, name: &str) -> Result<bool, ApiError> {
    match params.iter().rev().find(|(k, _)| k == name) {
        None => Ok(false),
        Some((_, v)) => match v.to_ascii_lowercase().as_str() {
            "true" | "" => Ok(true),
            "false" => Ok(false),
            _ => Err(ApiError::BadRequest(format!(
                "query parameter {name}='{v}' is not a boolean; expected true or false"
            ))),
        },
    }
}

fn task_id(name: &str, task: &str) -> Result<u32, ApiError> {
    task.parse().map_err(|_| {
        ApiError::NotFound(format!(
            "Task {task} of connector {name} not found: task ids are numbers"
        ))
    })
}

/// `GET /connectors`: the names, or with `expand=status` / `expand=info` an object keyed by
/// name holding what was asked for.
pub async fn list(
    api: Data<Api>,
    caller: Caller,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let tenant = caller.tenant.as_str();
    let names = api.herder.connector_names(tenant).await?;
    let expand: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k == "expand")
        .map(|(_, v)| v.as_str())
        .collect();
    let (status, info) = (expand.contains(&"status"), expand.contains(&"info"));
    if !status && !info {
        return Ok(HttpResponse::Ok().json(names));
    }
    let mut out = Map::new();
    for name in names {
        let mut entry = Map::new();
        // A connector deleted between listing and reading is left out.
        if status {
            match api.herder.status(tenant, &name).await {
                Ok(s) => entry.insert("status".into(), json!(s)),
                Err(_) => continue,
            };
        }
        if info {
            match api.herder.info(tenant, &name).await {
                Ok(i) => entry.insert("info".into(), json!(i)),
                Err(_) => continue,
            };
        }
        out.insert(name, Json::Object(entry));
    }
    Ok(HttpResponse::Ok().json(out))
}

/// `POST /connectors`: `{name, config, initial_state?}` → 201 with the connector's info.
pub async fn create(
    api: Data<Api>,
    caller: Caller,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let Json::Object(top) = &json else {
        return Err(ApiError::BadRequest(
            "the body must be an object {\"name\": ..., \"config\": {...}}".into(),
        ));
    };
    let config = match top.get("config") {
        Some(c) => body::config(c, "config")?,
        None => {
            return Err(ApiError::BadRequest(
                "the body has no \"config\" object".into(),
            ))
        }
    };
    let name = match (top.get("name"), config.get("name")) {
        (Some(Json::String(n)), Some(c)) if n != c => {
            return Err(ApiError::BadRequest(format!(
            "Connector name configuration ({c}) doesn't match connector name in the request ({n})"
        )))
        }
        (Some(Json::String(n)), _) => n.clone(),
        (Some(other), _) if !other.is_null() => {
            return Err(ApiError::BadRequest(format!(
                "the connector name must be a string, found {other}"
            )))
        }
        (_, Some(c)) => c.clone(),
        (_, None) => {
            return Err(ApiError::BadRequest(
                "Connector name must be provided: set \"name\"".into(),
            ))
        }
    };
    if name.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "Connector name must not be empty".into(),
        ));
    }
    let initial = match top.get("initial_state") {
        None | Some(Json::Null) => TargetState::Running,
        Some(Json::String(s)) => TargetState::from_str(s)
            .map_err(|e| ApiError::BadRequest(format!("initial_state: {e}")))?,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "initial_state must be one of RUNNING, PAUSED, STOPPED, found {other}"
            )))
        }
    };
    let info = api
        .herder
        .create(&caller.tenant, config, &name, initial)
        .await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", location(&request, &name)))
        .json(info))
}

pub async fn info(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    Ok(HttpResponse::Ok().json(api.herder.info(&caller.tenant, name).await?))
}

pub async fn delete(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    api.herder.delete(&caller.tenant, name).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub async fn get_config(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    Ok(HttpResponse::Ok().json(api.herder.config(&caller.tenant, name).await?))
}

/// `PUT /connectors/{name}/config`: 201 when created, 200 when updated.
pub async fn put_config(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let config = body::config(&json, "the configuration")?;
    let (created, info) = api.herder.put_config(&caller.tenant, name, config).await?;
    Ok(if created {
        HttpResponse::Created()
            .insert_header(("Location", location(&request, name)))
            .json(info)
    } else {
        HttpResponse::Ok().json(info)
    })
}

/// `PATCH /connectors/{name}/config`: changes the keys given; `null` removes a key.
pub async fn patch_config(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let patch = body::settings(&json, "the configuration patch")?;
    Ok(HttpResponse::Ok().json(
        api.herder
            .patch_config(&caller.tenant, &path.name, patch)
            .await?,
    ))
}

pub async fn status(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    Ok(HttpResponse::Ok().json(api.herder.status(&caller.tenant, name).await?))
}

pub async fn tasks(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    Ok(HttpResponse::Ok().json(api.herder.task_configs(&caller.tenant, name).await?))
}

pub async fn task_status(
    api: Data<Api>,
    caller: Caller,
    path: Path<TaskPath>,
) -> Result<HttpResponse, ApiError> {
    let task = task_id(&path.name, &path.task)?;
    Ok(HttpResponse::Ok().json(
        api.herder
            .task_status(&caller.tenant, &path.name, task)
            .await?,
    ))
}

/// `POST /connectors/{name}/restart?includeTasks=&onlyFailed=`: 204 for the plain request,
/// 202 with the status showing what restarts otherwise (KIP-745).
pub async fn restart(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let request = RestartRequest {
        include_tasks: flag(&params, "includeTasks")?,
        only_failed: flag(&params, "onlyFailed")?,
    };
    Ok(
        match api
            .herder
            .restart(&caller.tenant, &path.name, request)
            .await?
        {
            None => HttpResponse::NoContent().finish(),
            Some(status) => HttpResponse::Accepted().json(status),
        },
    )
}

pub async fn restart_task(
    api: Data<Api>,
    caller: Caller,
    path: Path<TaskPath>,
) -> Result<HttpResponse, ApiError> {
    let task = task_id(&path.name, &path.task)?;
    api.herder
        .restart_task(&caller.tenant, &path.name, task)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

pub async fn pause(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    api.herder
        .set_target(&caller.tenant, name, TargetState::Paused)
        .await?;
    Ok(HttpResponse::Accepted().finish())
}

pub async fn resume(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    api.herder
        .set_target(&caller.tenant, name, TargetState::Running)
        .await?;
    Ok(HttpResponse::Accepted().finish())
}

pub async fn stop(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    api.herder
        .set_target(&caller.tenant, name, TargetState::Stopped)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `GET /connectors/{name}/topics`: `{name: {topics: [...]}}`.
pub async fn topics(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    let topics = api.herder.topics(&caller.tenant, name).await?;
    Ok(HttpResponse::Ok().json(json!({ name.as_str(): { "topics": topics } })))
}

pub async fn offsets(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let name = &path.name;
    Ok(HttpResponse::Ok().json(api.herder.offsets(&caller.tenant, name).await?))
}

/// Reads Connect's offsets body: `{"offsets": [{"partition": {"kafka_topic", "kafka_partition"},
/// "offset": {"kafka_offset"} | null}]}`.
fn offset_changes(json: &Json) -> Result<Vec<OffsetChange>, ApiError> {
    let shape = "expected {\"offsets\": [{\"partition\": {\"kafka_topic\": ..., \"kafka_partition\": ...}, \"offset\": {\"kafka_offset\": ...} or null}]}";
    let entries = json
        .get("offsets")
        .and_then(Json::as_array)
        .ok_or_else(|| {
            ApiError::BadRequest(format!("the body has no \"offsets\" array; {shape}"))
        })?;
    if entries.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "the \"offsets\" array is empty; {shape}"
        )));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let bad = |what: String| ApiError::BadRequest(format!("offsets[{i}]: {what}; {shape}"));
            let partition = entry
                .get("partition")
                .ok_or_else(|| bad("no \"partition\"".into()))?;
            let topic = partition
                .get("kafka_topic")
                .and_then(Json::as_str)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| bad("\"kafka_topic\" must be a topic name".into()))?;
            let number = partition
                .get("kafka_partition")
                .and_then(Json::as_i64)
                .and_then(|p| i32::try_from(p).ok())
                .filter(|p| *p >= 0)
                .ok_or_else(|| bad("\"kafka_partition\" must be a partition number".into()))?;
            let offset = match entry.get("offset") {
                None | Some(Json::Null) => None,
                Some(offset) => Some(
                    offset
                        .get("kafka_offset")
                        .and_then(Json::as_i64)
                        .filter(|o| *o >= 0)
                        .ok_or_else(|| {
                            bad(format!(
                                "\"offset\" must be {{\"kafka_offset\": <offset of at least 0>}} or null, found {offset}"
                            ))
                        })?,
                ),
            };
            Ok(OffsetChange {
                topic: topic.to_owned(),
                partition: number,
                offset,
            })
        })
        .collect()
}

/// `PATCH /connectors/{name}/offsets` (KIP-875): 200 `{message}`; the connector must be
/// STOPPED and read through a consumer group.
pub async fn alter_offsets(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let changes = offset_changes(&json)?;
    let message = api
        .herder
        .alter_offsets(&caller.tenant, &path.name, Some(changes))
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "message": message })))
}

/// `DELETE /connectors/{name}/offsets` (KIP-875): resets every partition; 200 `{message}`.
pub async fn reset_offsets(
    api: Data<Api>,
    caller: Caller,
    path: Path<NamePath>,
) -> Result<HttpResponse, ApiError> {
    let message = api
        .herder
        .alter_offsets(&caller.tenant, &path.name, None)
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "message": message })))
}
