//! `/connector-plugins/...`: the sink plugins this worker has, their keys, and validation.

use actix_web::web::{Data, Path, Payload};
use actix_web::{HttpRequest, HttpResponse};
use spillway_core::config::sink_connector::CONNECTOR_CLASS;

use crate::herder::HerderError;
use crate::rest::auth::Caller;
use crate::rest::body;
use crate::rest::error::ApiError;
use crate::rest::Api;

pub async fn list(api: Data<Api>) -> HttpResponse {
    HttpResponse::Ok().json(api.herder.plugins())
}

pub async fn config(api: Data<Api>, plugin: Path<String>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(api.herder.plugin_config(&plugin)?))
}

/// `PUT /connector-plugins/{plugin}/config/validate`: Connect's `ConfigInfos`, always 200
/// for a readable request; clients look at `error_count`.
pub async fn validate(
    api: Data<Api>,
    caller: Caller,
    plugin: Path<String>,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let mut config = body::config(&json, "the configuration")?;
    if !api.herder.knows_plugin(&plugin) {
        return Err(HerderError::UnknownPlugin {
            name: plugin.into_inner(),
            known: api
                .herder
                .plugins()
                .into_iter()
                .map(|p| p.class)
                .collect::<Vec<_>>()
                .join(", "),
        }
        .into());
    }
    match config.get(CONNECTOR_CLASS) {
        Some(class) if class != plugin.as_str() && !class.ends_with(&format!(".{plugin}")) => {
            return Err(ApiError::PluginMismatch {
                plugin: plugin.into_inner(),
                class: class.clone(),
            })
        }
        Some(_) => {}
        None => {
            config.insert(CONNECTOR_CLASS.into(), plugin.into_inner());
        }
    }
    Ok(HttpResponse::Ok().json(api.herder.validate(&caller.tenant, &config).await))
}
