//! Distributed mode: every worker answers reads from its own view of the cluster, and sends
//! writes on to the leader, as Kafka Connect's workers do — so that one worker, the leader,
//! checks and orders every change. While no leader is known (the worker is joining, or a
//! rebalance took its assignment) a write gets 409, Connect's answer during a rebalance; the
//! caller retries. A task restart goes to the worker that runs the task.
//!
//! Runs after authentication: a follower refuses a bad token itself, and the leader checks the
//! forwarded token again.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web::{Bytes, Data};
use actix_web::{HttpResponse, ResponseError};
use tracing::debug;

use super::{Api, ApiError};

/// Marks a request a worker forwarded, so that it is never forwarded again.
pub const FORWARDED_BY: &str = "x-spillway-forwarded-by";
/// How long a forwarded request may take (a create may wait for its validation).
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Request headers carried to the leader.
const CARRIED: [&str; 4] = ["authorization", "content-type", "accept", "origin"];

/// Whether the route changes the cluster's state (and so is the leader's to do).
fn is_cluster_write(method: &Method, pattern: &str) -> bool {
    let changes = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let cluster_state = pattern.starts_with("/connectors") || pattern.starts_with("/tenants");
    changes && cluster_state
}

fn conflict(message: String) -> HttpResponse {
    ApiError::Herder(crate::herder::HerderError::Conflict(message)).error_response()
}

pub async fn to_leader(
    mut request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let Some(api) = request.app_data::<Data<Api>>().cloned() else {
        return next.call(request).await.map(|r| r.map_into_left_body());
    };
    let Some(cluster) = api.herder.cluster().cloned() else {
        return next.call(request).await.map(|r| r.map_into_left_body());
    };
    let pattern = request.match_pattern().unwrap_or_default();
    if !is_cluster_write(request.method(), &pattern) {
        return next.call(request).await.map(|r| r.map_into_left_body());
    }
    let forwarded = request.headers().contains_key(FORWARDED_BY);
    let target = if pattern.ends_with("/tasks/{task}/restart") {
        // The worker running the task restarts it; the herder says where it runs.
        let info = request.match_info();
        let tenant = info
            .get("tenant")
            .unwrap_or(crate::herder::DEFAULT_TENANT)
            .to_owned();
        let name = info.get("name").unwrap_or_default().to_owned();
        let task = info.get("task").and_then(|t| t.parse::<u32>().ok());
        match task {
            Some(task) if !forwarded && !api.herder.runs_task_here(&tenant, &name, task) => api
                .herder
                .task_owner(&tenant, &name, task)
                .map(|owner| format!("{}://{owner}", scheme_of(cluster.url()))),
            _ => None,
        }
    } else if cluster.is_leader() {
        None
    } else if forwarded {
        let response = conflict(format!(
            "this worker ({}) is not the leader any more; a rebalance is under way, retry",
            cluster.url()
        ));
        return Ok(request.into_response(response).map_into_right_body());
    } else {
        match cluster.leader_url() {
            Some(url) => Some(url),
            None => {
                let response = conflict(
                    "Cannot complete request momentarily due to no known leader URL, likely because a rebalance is underway; retry"
                        .into(),
                );
                return Ok(request.into_response(response).map_into_right_body());
            }
        }
    };
    let Some(target) = target else {
        return next.call(request).await.map(|r| r.map_into_left_body());
    };
    let body = match request.extract::<Bytes>().await {
        Ok(body) => body,
        Err(e) => return Err(e),
    };
    let response = forward(&request, &target, cluster.url(), body).await;
    Ok(request.into_response(response).map_into_right_body())
}

/// The client a worker forwards requests with. A worker with an https listener trusts its
/// listener's truststore besides the system's CAs and presents its own certificate when its
/// listener asks clients for one ([`super::tls::peer_tls`]).
pub fn client(config: &spillway_core::ConfigMap, https: bool) -> anyhow::Result<reqwest::Client> {
    use anyhow::Context;
    let mut builder = reqwest::Client::builder().timeout(FORWARD_TIMEOUT);
    if https {
        let peer = super::tls::peer_tls(config)
            .context("the TLS settings for requests to the other workers")?;
        for root in &peer.roots {
            let cert = reqwest::Certificate::from_der(root)
                .context("a truststore certificate for requests to the other workers")?;
            builder = builder.add_root_certificate(cert);
        }
        if let Some(pem) = &peer.identity_pem {
            let identity = reqwest::Identity::from_pem(pem)
                .context("the worker's certificate and key for requests to the other workers")?;
            builder = builder.identity(identity);
        }
    }
    builder
        .build()
        .context("cannot build the client that forwards requests to the leader")
}

/// `http` or `https`, from a worker URL.
fn scheme_of(url: &str) -> &str {
    url.split_once("://").map_or("http", |(s, _)| s)
}

/// Sends the request on to `target` (a worker's base URL) and hands back its answer.
async fn forward(request: &ServiceRequest, target: &str, own: &str, body: Bytes) -> HttpResponse {
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.path().to_owned(), |p| p.as_str().to_owned());
    let url = format!("{}{path}", target.trim_end_matches('/'));
    debug!(%url, method = %request.method(), "forwarding");
    let Ok(method) = reqwest::Method::from_bytes(request.method().as_str().as_bytes()) else {
        return ApiError::BadRequest(format!("method {} cannot be forwarded", request.method()))
            .error_response();
    };
    let Some(client) = request
        .app_data::<Data<Api>>()
        .map(|api| api.forward_client.clone())
    else {
        return ApiError::Unavailable("cannot forward to the leader: no client".into())
            .error_response();
    };
    let mut outgoing = client.request(method, &url).header(FORWARDED_BY, own);
    for name in CARRIED {
        if let Some(value) = request.headers().get(name) {
            outgoing = outgoing.header(name, value.as_bytes());
        }
    }
    match outgoing.body(body.to_vec()).send().await {
        Ok(answer) => {
            let status = actix_web::http::StatusCode::from_u16(answer.status().as_u16())
                .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
            let content_type = answer
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = answer.bytes().await.unwrap_or_default();
            let mut response = HttpResponse::build(status);
            if let Some(ct) = content_type {
                response.insert_header(("content-type", ct));
            }
            response.body(bytes.to_vec())
        }
        Err(e) => conflict(format!(
            "cannot reach the worker at {target} to forward this request ({e}); a rebalance may be under way, retry"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_of_connectors_and_tenants_go_to_the_leader() {
        assert!(is_cluster_write(&Method::POST, "/connectors"));
        assert!(is_cluster_write(&Method::PUT, "/connectors/{name}/config"));
        assert!(is_cluster_write(&Method::DELETE, "/tenants/{tenant}"));
        assert!(is_cluster_write(
            &Method::PUT,
            "/tenants/{tenant}/connectors/{name}/pause"
        ));
        assert!(!is_cluster_write(&Method::GET, "/connectors"));
        // Validation changes nothing; logger levels are each worker's own (as in Connect).
        assert!(!is_cluster_write(
            &Method::PUT,
            "/connector-plugins/{plugin}/config/validate"
        ));
        assert!(!is_cluster_write(&Method::PUT, "/admin/loggers/{name}"));
    }
}
