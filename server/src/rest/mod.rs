//! Kafka Connect's REST API on actix-web: the same paths, status codes and JSON shapes, so
//! Connect's tooling works unchanged. [`endpoints`] is the one list of routes: the server is
//! built from it and the OpenAPI document (`openapi.json`, served at `/openapi.json`) is tested
//! against it.

mod admin;
mod body;
mod connectors;
mod error;
mod plugins;

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
}

/// One route: method, path (in OpenAPI's `{param}` form, which actix shares) and handler.
pub struct Endpoint {
    pub method: Method,
    pub path: &'static str,
    route: fn() -> Route,
}

const fn endpoint(method: Method, path: &'static str, route: fn() -> Route) -> Endpoint {
    Endpoint {
        method,
        path,
        route,
    }
}

/// Every route the server answers.
pub fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(Method::GET, "/", || web::get().to(admin::root)),
        endpoint(Method::GET, "/health", || web::get().to(admin::health)),
        endpoint(Method::GET, "/openapi.json", || {
            web::get().to(admin::openapi)
        }),
        endpoint(Method::GET, "/connectors", || {
            web::get().to(connectors::list)
        }),
        endpoint(Method::POST, "/connectors", || {
            web::post().to(connectors::create)
        }),
        endpoint(Method::GET, "/connectors/{name}", || {
            web::get().to(connectors::info)
        }),
        endpoint(Method::DELETE, "/connectors/{name}", || {
            web::delete().to(connectors::delete)
        }),
        endpoint(Method::GET, "/connectors/{name}/config", || {
            web::get().to(connectors::get_config)
        }),
        endpoint(Method::PUT, "/connectors/{name}/config", || {
            web::put().to(connectors::put_config)
        }),
        endpoint(Method::PATCH, "/connectors/{name}/config", || {
            web::patch().to(connectors::patch_config)
        }),
        endpoint(Method::GET, "/connectors/{name}/status", || {
            web::get().to(connectors::status)
        }),
        endpoint(Method::GET, "/connectors/{name}/tasks", || {
            web::get().to(connectors::tasks)
        }),
        endpoint(
            Method::GET,
            "/connectors/{name}/tasks/{task}/status",
            || web::get().to(connectors::task_status),
        ),
        endpoint(
            Method::POST,
            "/connectors/{name}/tasks/{task}/restart",
            || web::post().to(connectors::restart_task),
        ),
        endpoint(Method::POST, "/connectors/{name}/restart", || {
            web::post().to(connectors::restart)
        }),
        endpoint(Method::PUT, "/connectors/{name}/pause", || {
            web::put().to(connectors::pause)
        }),
        endpoint(Method::PUT, "/connectors/{name}/resume", || {
            web::put().to(connectors::resume)
        }),
        endpoint(Method::PUT, "/connectors/{name}/stop", || {
            web::put().to(connectors::stop)
        }),
        endpoint(Method::GET, "/connectors/{name}/topics", || {
            web::get().to(connectors::topics)
        }),
        endpoint(Method::GET, "/connectors/{name}/offsets", || {
            web::get().to(connectors::offsets)
        }),
        endpoint(Method::GET, "/connector-plugins", || {
            web::get().to(plugins::list)
        }),
        endpoint(Method::GET, "/connector-plugins/{plugin}/config", || {
            web::get().to(plugins::config)
        }),
        endpoint(
            Method::PUT,
            "/connector-plugins/{plugin}/config/validate",
            || web::put().to(plugins::validate),
        ),
        endpoint(Method::GET, "/admin/loggers", || {
            web::get().to(admin::loggers)
        }),
        endpoint(Method::GET, "/admin/loggers/{name}", || {
            web::get().to(admin::logger)
        }),
        endpoint(Method::PUT, "/admin/loggers/{name}", || {
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

async fn method_not_allowed(request: HttpRequest) -> HttpResponse {
    ApiError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.path().to_owned(),
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
    let mut paths: Vec<&'static str> = Vec::new();
    for e in &all {
        if !paths.contains(&e.path) {
            paths.push(e.path);
        }
    }
    for path in paths {
        let mut resource = web::resource(path);
        for e in all.iter().filter(|e| e.path == path) {
            resource = resource.route((e.route)());
        }
        config.service(resource.default_service(web::to(method_not_allowed)));
    }
    config.default_service(web::to(no_such_path));
}

/// Starts serving on `listener`; the returned server runs until stopped.
pub fn serve(listener: TcpListener, api: Api) -> std::io::Result<Server> {
    let api = Data::new(api);
    Ok(
        HttpServer::new(move || App::new().app_data(api.clone()).configure(configure))
            .workers(2)
            .disable_signals()
            .listen(listener)?
            .run(),
    )
}
