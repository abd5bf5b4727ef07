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
use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::web::Data;
use actix_web::{FromRequest, HttpMessage, HttpRequest, ResponseError};

use crate::rest::error::ApiError;
use crate::rest::{Access, Api};
use crate::tenants::{digest, DEFAULT_TENANT};

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

/// Whether a media type (`Content-Type` value) is JSON: `application/json`, parameters
/// such as `charset=utf-8` allowed.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether the request carries a body (a `Content-Length` above 0, or a chunked one).
fn has_body(request: &ServiceRequest) -> bool {
    let headers = request.headers();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    declared.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// Refuses a request whose body is not declared JSON (415): a body of another type, or one
/// with no `Content-Type`. A browser can send a cross-site `text/plain` or form POST without
/// asking first; it cannot send `application/json` without a CORS preflight.
pub fn check_media_type(request: &ServiceRequest) -> Result<(), ApiError> {
    let declared = request.headers().get(header::CONTENT_TYPE);
    match declared {
        Some(value) => {
            let text = value.to_str().unwrap_or("(not text)");
            if is_json(text) {
                Ok(())
            } else {
                Err(ApiError::UnsupportedMediaType(format!(
                    "Content-Type '{text}' is not supported; request bodies of this API are JSON: send Content-Type: application/json"
                )))
            }
        }
        None if has_body(request) => Err(ApiError::UnsupportedMediaType(
            "the request has a body but no Content-Type; request bodies of this API are JSON: send Content-Type: application/json".into(),
        )),
        None => Ok(()),
    }
}

/// Refuses a request a browser sent from another origin (403). Browsers add `Origin` to
/// cross-origin requests (and to same-origin POSTs); this API grants no CORS, so a page of
/// another site must not act on it even where the browser sends the request anyway (a
/// bodyless cross-site POST needs no preflight). Clients that are not browsers send no
/// `Origin`.
pub fn check_origin(request: &ServiceRequest) -> Result<(), ApiError> {
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("(not text)");
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let authority = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'))
        .unwrap_or_default();
    if !host.is_empty() && authority.eq_ignore_ascii_case(host) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "a cross-origin request (Origin: {origin}) is refused: this API grants no cross-origin access; call it from a client that is not a web page"
        )))
    }
}

/// Who may call the matched route: `rules` holds its methods' [`Access`]; a method the route
/// does not have (answered 405) needs a valid token like the route's strictest method.
pub fn access_of(rules: &[(Method, Access)], method: &Method) -> Access {
    rules
        .iter()
        .find(|(m, _)| m == method)
        .map(|(_, a)| *a)
        .unwrap_or_else(|| {
            if rules.iter().any(|(_, a)| *a == Access::Admin) {
                Access::Admin
            } else if rules.iter().all(|(_, a)| *a == Access::Public) {
                Access::Public
            } else {
                Access::Caller
            }
        })
}

/// Resource middleware, so it runs on the route the router matched (whatever spelling of the
/// path reached it): finds the caller, answers 401 when there is none, 403 when the route is
/// the admin's, 404 when a tenant names another tenant in `{tenant}`; then refuses bodies that
/// are not JSON (415).
pub async fn guard(
    rules: Arc<Vec<(Method, Access)>>,
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let checked = check_origin(&request)
        .and_then(|()| authorize(&rules, &request))
        .and_then(|()| check_media_type(&request));
    match checked {
        Ok(()) => next.call(request).await.map(|r| r.map_into_left_body()),
        Err(refused) => {
            let response = refused.error_response();
            Ok(request.into_response(response).map_into_right_body())
        }
    }
}

fn authorize(rules: &[(Method, Access)], request: &ServiceRequest) -> Result<(), ApiError> {
    let access = access_of(rules, request.method());
    if access == Access::Public {
        return Ok(());
    }
    let Some(api) = request.app_data::<Data<Api>>().cloned() else {
        return Err(ApiError::Unauthorized(
            "the worker's API state is missing".into(),
        ));
    };
    let principal = identify(request, &api)?;
    if let Principal::Tenant(own) = &principal {
        let route = request.match_pattern().unwrap_or_default();
        if access == Access::Admin {
            return Err(ApiError::Forbidden(format!(
                "{} {route} takes the worker's admin token (rest.admin.token); tenant {own}'s token cannot use it",
                request.method()
            )));
        }
        if let Some(asked) = request.match_info().get("tenant") {
            if asked != own {
                return Err(ApiError::NotFound(format!("Tenant {asked} not found")));
            }
        }
    }
    request.extensions_mut().insert(principal);
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_media_types_are_json() {
        for json in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
        ] {
            assert!(is_json(json), "{json}");
        }
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert!(!is_json(other), "{other}");
        }
    }

    #[test]
    fn a_method_a_route_lacks_needs_its_strictest_access() {
        let tenants = [(Method::GET, Access::Caller), (Method::PUT, Access::Admin)];
        assert_eq!(access_of(&tenants, &Method::GET), Access::Caller);
        assert_eq!(access_of(&tenants, &Method::POST), Access::Admin);
        let public = [(Method::GET, Access::Public)];
        assert_eq!(access_of(&public, &Method::DELETE), Access::Public);
        let caller = [(Method::GET, Access::Caller)];
        assert_eq!(access_of(&caller, &Method::DELETE), Access::Caller);
    }
}
