//! Who is calling: bearer tokens, when `rest.auth.enabled=true`.
//!
//! The admin token (`rest.admin.token`) may do everything: manage tenants under `/tenants`,
//! act on any tenant's connectors under `/tenants/{tenant}/connectors/...`, and on the
//! `default` tenant's through Connect's plain routes. A tenant's token acts on that tenant's
//! connectors only, through the plain routes or its own `/tenants/{tenant}/...`; another
//! tenant is answered 404, as if it did not exist. `/`, `/health` and `/openapi.json` need no
//! token. With authentication off every caller is the admin, and the plain routes act on the
//! `default` tenant, exactly as Kafka Connect.

use std::future::{ready, Ready};

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web::Data;
use actix_web::{FromRequest, HttpMessage, HttpRequest, ResponseError};

use crate::rest::error::ApiError;
use crate::rest::Api;
use crate::tenants::{digest, DEFAULT_TENANT};

/// Paths anyone may read.
const PUBLIC_PATHS: [&str; 3] = ["/", "/health", "/openapi.json"];

/// How the REST API authenticates.
#[derive(Debug, Clone, Default)]
pub struct AuthSettings {
    /// `rest.auth.enabled`: off, every caller is the admin.
    pub enabled: bool,
    /// SHA-256 of `rest.admin.token`.
    pub admin_token_digest: Option<String>,
}

impl AuthSettings {
    /// Authentication with `admin_token` as the admin's token.
    pub fn with_admin_token(admin_token: &str) -> AuthSettings {
        AuthSettings {
            enabled: true,
            admin_token_digest: Some(digest(admin_token)),
        }
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Tenant(String),
}

fn bearer(request: &ServiceRequest) -> Option<&str> {
    let value = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn identify(request: &ServiceRequest, api: &Api) -> Result<Principal, ApiError> {
    if !api.auth.enabled {
        return Ok(Principal::Admin);
    }
    let Some(token) = bearer(request) else {
        return Err(ApiError::Unauthorized(
            "this worker requires a bearer token (Authorization: Bearer <token>): the admin's rest.admin.token or a tenant's token".into(),
        ));
    };
    if api.auth.admin_token_digest.as_deref() == Some(digest(token).as_str()) {
        return Ok(Principal::Admin);
    }
    match api.herder.tenants().by_token(token) {
        Some(tenant) => Ok(Principal::Tenant(tenant)),
        None => Err(ApiError::Unauthorized(
            "the bearer token is not valid for this worker".into(),
        )),
    }
}

/// Middleware: finds the caller of every request but the public ones, answers 401 when there
/// is none, and keeps `/admin/...` to the admin.
pub async fn authenticate(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let path = request.path().to_owned();
    if PUBLIC_PATHS.contains(&path.as_str()) {
        return next.call(request).await.map(|r| r.map_into_left_body());
    }
    let Some(api) = request.app_data::<Data<Api>>().cloned() else {
        return next.call(request).await.map(|r| r.map_into_left_body());
    };
    let refused = match identify(&request, &api) {
        Ok(Principal::Tenant(tenant)) if path == "/admin" || path.starts_with("/admin/") => {
            ApiError::Forbidden(format!(
                "{path} is the worker admin's; tenant {tenant}'s token cannot use it"
            ))
        }
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            return next.call(request).await.map(|r| r.map_into_left_body());
        }
        Err(e) => e,
    };
    let response = refused.error_response();
    Ok(request.into_response(response).map_into_right_body())
}

fn principal(request: &HttpRequest) -> Result<Principal, ApiError> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| ApiError::Unauthorized("the request was not authenticated".into()))
}

/// The tenant a connector request acts on: `{tenant}` of a tenant-scoped path, else the
/// caller's own (the admin's is `default`).
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: String,
}

impl Caller {
    fn resolve(request: &HttpRequest) -> Result<Caller, ApiError> {
        let principal = principal(request)?;
        let not_found = |tenant: &str| ApiError::NotFound(format!("Tenant {tenant} not found"));
        let tenant = match (request.match_info().get("tenant"), principal) {
            (None, Principal::Admin) => DEFAULT_TENANT.to_owned(),
            (None, Principal::Tenant(own)) => own,
            (Some(asked), Principal::Admin) => {
                let exists = request
                    .app_data::<Data<Api>>()
                    .is_some_and(|api| api.herder.tenants().exists(asked));
                if !exists {
                    return Err(not_found(asked));
                }
                asked.to_owned()
            }
            (Some(asked), Principal::Tenant(own)) if asked == own => own,
            (Some(asked), Principal::Tenant(_)) => return Err(not_found(asked)),
        };
        Ok(Caller { tenant })
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Caller, ApiError>>;

    fn from_request(request: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(Caller::resolve(request))
    }
}

/// A request only the admin may make (tenant management). `GET /tenants/{tenant}` is also
/// open to that tenant itself, see [`TenantReader`].
#[derive(Debug, Clone)]
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Admin, ApiError>>;

    fn from_request(request: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(match principal(request) {
            Ok(Principal::Admin) => Ok(Admin),
            Ok(Principal::Tenant(tenant)) => Err(ApiError::Forbidden(format!(
                "managing tenants takes the admin token (rest.admin.token); tenant {tenant}'s token cannot"
            ))),
            Err(e) => Err(e),
        })
    }
}

/// The admin, or the tenant of `{tenant}` reading itself.
#[derive(Debug, Clone)]
pub struct TenantReader;

impl FromRequest for TenantReader {
    type Error = ApiError;
    type Future = Ready<Result<TenantReader, ApiError>>;

    fn from_request(request: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let asked = request.match_info().get("tenant").unwrap_or_default();
        ready(match principal(request) {
            Ok(Principal::Admin) => Ok(TenantReader),
            Ok(Principal::Tenant(own)) if own == asked => Ok(TenantReader),
            Ok(Principal::Tenant(_)) => {
                Err(ApiError::NotFound(format!("Tenant {asked} not found")))
            }
            Err(e) => Err(e),
        })
    }
}
