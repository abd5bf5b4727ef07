//! Kafka Connect's REST API on actix-web: the same paths, status codes and JSON shapes, so
//! Connect's tooling works unchanged. [`endpoints`] is the one list of routes: the server is
//! built from it and the OpenAPI document (`openapi.json`, served at `/openapi.json`) is tested
//! against it.
//!
//! Tenants: every `/connectors/...` route is also served under `/tenants/{tenant}`, and
//! `/tenants` manages the tenants; [`auth`] says who may do what.

mod admin;
pub mod auth;
mod body;
mod connectors;
mod error;
pub mod forward;
mod plugins;
mod tenants;
pub mod tls;

use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::http::Method;
use actix_web::web::{self, Data};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, ResponseError, Route};

pub use error::ApiError;

use crate::herder::Herder;

/// The OpenAPI document of this API.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Default of `rest.max.body.bytes`: connector configurations are a few kilobytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// What every handler shares.
pub struct Api {
    pub herder: Arc<Herder>,
    /// False while the worker restores its connectors (`/health` answers 503).
    pub ready: Arc<AtomicBool>,
    pub kafka_cluster_id: Option<String>,
    pub max_body_bytes: usize,
    pub auth: auth::AuthSettings,
    /// The runtime's metrics, served at `/metrics`.
    pub telemetry: Arc<crate::metrics::Telemetry>,
    /// Distributed mode: forwards writes to the leader (`forward::client`).
    pub forward_client: reqwest::Client,
}

/// Who may call a route. Decided per matched route (method and pattern), never from the raw
/// request path, which may spell the same route differently (`/%61dmin/...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token: `/`, `/health`, `/openapi.json`.
    Public,
    /// Any valid token; a tenant acts on its own resources only.
    Caller,
    /// The admin token only (`rest.admin.token`).
    Admin,
}

/// One route: method, path (in OpenAPI's `{param}` form, which actix shares), who may call
/// it, and its handler.
pub struct Endpoint {
    pub method: Method,
    pub path: String,
    pub access: Access,
    route: fn() -> Route,
}

fn endpoint(method: Method, path: &str, access: Access, route: fn() -> Route) -> Endpoint {
    Endpoint {
        method,
        path: path.to_owned(),
        access,
        route,
    }
}

/// The tenant routes: `/tenants` management, and every `/connectors/...` route again under
/// `/tenants/{tenant}`.
fn tenant_endpoints(connector_routes: &[Endpoint]) -> Vec<Endpoint> {
    let mut all = vec![
        endpoint(Method::GET, "/tenants", Access::Admin, || {
            web::get().to(tenants::list)
        }),
        endpoint(Method::POST, "/tenants", Access::Admin, || {
            web::post().to(tenants::create)
        }),
        endpoint(Method::GET, "/tenants/{tenant}", Access::Caller, || {
            web::get().to(tenants::get)
        }),
        endpoint(Method::PUT, "/tenants/{tenant}", Access::Admin, || {
            web::put().to(tenants::put)
        }),
        endpoint(Method::PATCH, "/tenants/{tenant}", Access::Admin, || {
            web::patch().to(tenants::patch)
        }),
        endpoint(Method::DELETE, "/tenants/{tenant}", Access::Admin, || {
            web::delete().to(tenants::delete)
        }),
        endpoint(
            Method::POST,
            "/tenants/{tenant}/token",
            Access::Admin,
            || web::post().to(tenants::rotate_token),
        ),
    ];
    all.extend(
        connector_routes
            .iter()
            .filter(|e| e.path.starts_with("/connectors"))
            .map(|e| Endpoint {
                method: e.method.clone(),
                path: format!("/tenants/{{tenant}}{}", e.path),
                access: e.access,
                route: e.route,
            }),
    );
    all
}

/// Every route the server answers.
pub fn endpoints() -> Vec<Endpoint> {
    let mut all = connect_endpoints();
    let tenant_routes = tenant_endpoints(&all);
    all.extend(tenant_routes);
    all
}

/// Kafka Connect's routes.
fn connect_endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(Method::GET, "/", Access::Public, || {
            web::get().to(admin::root)
        }),
        endpoint(Method::GET, "/health", Access::Public, || {
            web::get().to(admin::health)
        }),
        endpoint(Method::GET, "/openapi.json", Access::Public, || {
            web::get().to(admin::openapi)
        }),
        endpoint(Method::GET, "/metrics", Access::Caller, || {
            web::get().to(crate::metrics::scrape)
        }),
        endpoint(Method::GET, "/connectors", Access::Caller, || {
            web::get().to(connectors::list)
        }),
        endpoint(Method::POST, "/connectors", Access::Caller, || {
            web::post().to(connectors::create)
        }),
        endpoint(Method::GET, "/connectors/{name}", Access::Caller, || {
            web::get().to(connectors::info)
        }),
        endpoint(Method::DELETE, "/connectors/{name}", Access::Caller, || {
            web::delete().to(connectors::delete)
        }),
        endpoint(
            Method::GET,
            "/connectors/{name}/config",
            Access::Caller,
            || web::get().to(connectors::get_config),
        ),
        endpoint(
            Method::PUT,
            "/connectors/{name}/config",
            Access::Caller,
            || web::put().to(connectors::put_config),
        ),
        endpoint(
            Method::PATCH,
            "/connectors/{name}/config",
            Access::Caller,
            || web::patch().to(connectors::patch_config),
        ),
        endpoint(
            Method::GET,
            "/connectors/{name}/status",
            Access::Caller,
            || web::get().to(connectors::status),
        ),
        endpoint(
            Method::GET,
            "/connectors/{name}/tasks",
            Access::Caller,
            || web::get().to(connectors::tasks),
        ),
        endpoint(
            Method::GET,
            "/connectors/{name}/tasks/{task}/status",
            Access::Caller,
            || web::get().to(connectors::task_status),
        ),
        endpoint(
            Method::POST,
            "/connectors/{name}/tasks/{task}/restart",
            Access::Caller,
            || web::post().to(connectors::restart_task),
        ),
        endpoint(
            Method::POST,
            "/connectors/{name}/restart",
            Access::Caller,
            || web::post().to(connectors::restart),
        ),
        endpoint(
            Method::PUT,
            "/connectors/{name}/pause",
            Access::Caller,
            || web::put().to(connectors::pause),
        ),
        endpoint(
            Method::PUT,
            "/connectors/{name}/resume",
            Access::Caller,
            || web::put().to(connectors::resume),
        ),
        endpoint(
            Method::PUT,
            "/connectors/{name}/stop",
            Access::Caller,
            || web::put().to(connectors::stop),
        ),
        endpoint(
            Method::GET,
            "/connectors/{name}/topics",
            Access::Caller,
            || web::get().to(connectors::topics),
        ),
        endpoint(
            Method::GET,
            "/connectors/{name}/offsets",
            Access::Caller,
            || web::get().to(connectors::offsets),
        ),
        endpoint(
            Method::PATCH,
            "/connectors/{name}/offsets",
            Access::Caller,
            || web::patch().to(connectors::alter_offsets),
        ),
        endpoint(
            Method::DELETE,
            "/connectors/{name}/offsets",
            Access::Caller,
            || web::delete().to(connectors::reset_offsets),
        ),
        endpoint(Method::GET, "/connector-plugins", Access::Caller, || {
            web::get().to(plugins::list)
        }),
        endpoint(
            Method::GET,
            "/connector-plugins/{plugin}/config",
            Access::Caller,
            || web::get().to(plugins::config),
        ),
        endpoint(
            Method::PUT,
            "/connector-plugins/{plugin}/config/validate",
            Access::Caller,
            || web::put().to(plugins::validate),
        ),
        endpoint(Method::GET, "/admin/loggers", Access::Admin, || {
            web::get().to(admin::loggers)
        }),
        endpoint(Method::GET, "/admin/loggers/{name}", Access::Admin, || {
            web::get().to(admin::logger)
        }),
        endpoint(Method::PUT, "/admin/loggers/{name}", Access::Admin, || {
            web::put().to(admin::set_logger)
        }),
    ]
}

async fn no_such_path(request: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!(
        "no resource at {}; see /openapi.json for the paths of this API",
        request.path()
    ))
    .error_response()
}

/// 405 with `Allow` naming the methods `path` has.
async fn method_not_allowed(request: HttpRequest, allow: String) -> HttpResponse {
    ApiError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.path().to_owned(),
        allow,
    }
    .error_response()
}

/// Registers every endpoint, and JSON errors for unknown paths, wrong methods and unreadable
/// path or query parameters.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .app_data(web::QueryConfig::default().error_handler(|e, _| {
            ApiError::BadRequest(format!("cannot read the query parameters: {e}")).into()
        }))
        .app_data(web::PathConfig::default().error_handler(|e, request| {
            ApiError::NotFound(format!("no resource at {}: {e}", request.path())).into()
        }));
    let all = endpoints();
    let mut paths: Vec<&str> = Vec::new();
    for e in &all {
        if !paths.contains(&e.path.as_str()) {
            paths.push(&e.path);
        }
    }
    for path in paths {
        let mut resource = web::resource(path);
        let mut rules = Vec::new();
        for e in all.iter().filter(|e| e.path == path) {
            resource = resource.route((e.route)());
            rules.push((e.method.clone(), e.access));
        }
        let allow = rules
            .iter()
            .map(|(m, _)| m.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let rules = Arc::new(rules);
        config.service(
            resource
                .default_service(web::to(move |request: HttpRequest| {
                    method_not_allowed(request, allow.clone())
                }))
                // Outermost last: authentication, then forwarding to the leader.
                .wrap(actix_web::middleware::from_fn(forward::to_leader))
                .wrap(actix_web::middleware::from_fn(move |request, next| {
                    auth::guard(Arc::clone(&rules), request, next)
                })),
        );
    }
    config.default_service(web::to(no_such_path));
}

/// Starts serving on every listener (HTTPS where it has a TLS configuration); the returned
/// server runs until stopped.
pub fn serve(
    listeners: Vec<(TcpListener, Option<rustls::ServerConfig>)>,
    api: Api,
) -> std::io::Result<Server> {
    let api = Data::new(api);
    let mut server = HttpServer::new(move || App::new().app_data(api.clone()).configure(configure))
        .workers(2)
        .disable_signals();
    for (listener, tls) in listeners {
        server = match tls {
            Some(tls) => server.listen_rustls_0_23(listener, tls)?,
            None => server.listen(listener)?,
        };
    }
    Ok(server.run())
}
