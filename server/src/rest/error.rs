//! The REST layer's errors, answered as Kafka Connect does: `{"error_code": <status>,
//! "message": <text>}` for every failure, whatever its cause.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use spillway_actors::RuntimeError;
use spillway_storage::StorageError;

use crate::herder::HerderError;
use crate::log_levels::LoggerError;
use crate::tenants::TenantError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Herder(#[from] HerderError),
    #[error("the request body is not valid JSON: {0}")]
    BadJson(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the request body is larger than {limit} bytes (rest.max.body.bytes)")]
    TooLarge { limit: usize },
    #[error("{0}")]
    NotFound(String),
    #[error("{method} is not allowed on {path}; it allows {allow} (see /openapi.json)")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: String,
    },
    #[error("Plugin type '{plugin}' does not match connector.class '{class}' in the request body")]
    PluginMismatch { plugin: String, class: String },
    /// No valid bearer token (with `rest.auth.enabled=true`).
    #[error("{0}")]
    Unauthorized(String),
    /// A valid token that may not do this.
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Logger(#[from] LoggerError),
    /// A body that is not `application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The worker's connector runtime has stopped; the reason says why.
    #[error("{0}")]
    Unavailable(String),
}

/// The body of every error answer.
#[derive(Debug, serde::Serialize)]
struct ErrorBody {
    error_code: u16,
    message: String,
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Herder(e) => match e {
                HerderError::UnknownConnector(_)
                | HerderError::UnknownTask { .. }
                | HerderError::UnknownPlugin { .. } => StatusCode::NOT_FOUND,
                HerderError::ConnectorExists(_) => StatusCode::CONFLICT,
                HerderError::InvalidConfig(_) | HerderError::BadRequest(_) => {
                    StatusCode::BAD_REQUEST
                }
                HerderError::Runtime(RuntimeError::Config { .. }) => StatusCode::BAD_REQUEST,
                HerderError::Runtime(RuntimeError::UnknownConnector(_)) => StatusCode::NOT_FOUND,
                HerderError::Storage(StorageError::InvalidName { .. }) => StatusCode::BAD_REQUEST,
                HerderError::Quota { .. } => StatusCode::FORBIDDEN,
                HerderError::TenantHasConnectors { .. } | HerderError::Conflict(_) => {
                    StatusCode::CONFLICT
                }
                HerderError::Tenant(e) => match e {
                    TenantError::Unknown(_) => StatusCode::NOT_FOUND,
                    TenantError::Exists(_) => StatusCode::CONFLICT,
                    TenantError::Invalid(_) => StatusCode::BAD_REQUEST,
                    TenantError::Storage(StorageError::InvalidName { .. }) => {
                        StatusCode::BAD_REQUEST
                    }
                    TenantError::Storage(_) | TenantError::Unfinished { .. } => {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                },
                HerderError::Storage(_) | HerderError::Runtime(_) | HerderError::Offsets { .. } => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            },
            ApiError::BadJson(_) | ApiError::BadRequest(_) | ApiError::PluginMismatch { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Logger(e) => match e {
                LoggerError::InvalidLevel(_) | LoggerError::InvalidName(_) => {
                    StatusCode::BAD_REQUEST
                }
                LoggerError::NotFound(_) => StatusCode::NOT_FOUND,
                LoggerError::Detached => StatusCode::CONFLICT,
                LoggerError::Apply { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), error = %self, "request failed");
        }
        let mut response = HttpResponse::build(status);
        if status == StatusCode::UNAUTHORIZED {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            response.insert_header((actix_web::http::header::ALLOW, allow.as_str()));
        }
        response.json(ErrorBody {
            error_code: status.as_u16(),
            message: self.to_string(),
        })
    }
}
