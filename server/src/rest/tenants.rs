//! `/tenants`: the worker admin manages tenants — their quotas, client override policy and
//! token. Connect has no such resource; the shapes follow Connect's (`{error_code, message}`
//! errors, 201 with the created resource).

use actix_web::web::{Data, Path, Payload, Query};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Map, Value as Json};
use spillway_actors::OverridePolicy;

use crate::rest::auth::{Admin, TenantReader};
use crate::rest::body;
use crate::rest::error::ApiError;
use crate::rest::Api;
use crate::tenants::{Quotas, QUOTA_NAMES};

const POLICY_KEY: &str = "client.config.override.policy";

/// `{tenant}` of a tenant path.
#[derive(serde::Deserialize)]
pub struct TenantPath {
    tenant: String,
}

fn object<'a>(json: &'a Json, what: &str) -> Result<&'a Map<String, Json>, ApiError> {
    json.as_object()
        .ok_or_else(|| ApiError::BadRequest(format!("{what} must be a JSON object, found {json}")))
}

/// Applies `{"quotas": {name: number|null}}` of `top` to `quotas`: a number sets the quota,
/// `null` removes it (unlimited).
fn apply_quotas(top: &Map<String, Json>, quotas: &mut Quotas) -> Result<(), ApiError> {
    let Some(given) = top.get("quotas") else {
        return Ok(());
    };
    if given.is_null() {
        *quotas = Quotas::default();
        return Ok(());
    }
    for (name, value) in object(given, "\"quotas\"")? {
        let value = match value {
            Json::Null => None,
            Json::Number(n) => Some(n.as_u64().ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "quota {name} must be a whole number of at least {}, found {n}",
                    Quotas::minimum(name)
                ))
            })?),
            other => {
                return Err(ApiError::BadRequest(format!(
                    "quota {name} must be a whole number (or null for no limit), found {other}; the quotas are {}",
                    QUOTA_NAMES.join(", ")
                )))
            }
        };
        quotas.set(name, value).map_err(ApiError::BadRequest)?;
    }
    Ok(())
}

fn policy(top: &Map<String, Json>) -> Result<Option<OverridePolicy>, ApiError> {
    match top.get(POLICY_KEY) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(text)) => OverridePolicy::parse(POLICY_KEY, text)
            .map(Some)
            .map_err(|e| ApiError::BadRequest(e.to_string())),
        Some(other) => Err(ApiError::BadRequest(format!(
            "{POLICY_KEY} must be one of None, Principal, Restricted, All, found {other}"
        ))),
    }
}

/// Refuses keys this API does not know, so a typo does not pass silently.
fn known_keys(top: &Map<String, Json>, allowed: &[&str]) -> Result<(), ApiError> {
    match top.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(ApiError::BadRequest(format!(
            "unknown key '{k}' in the body; expected {}",
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

/// `GET /tenants`: every tenant with its quotas and policy.
pub async fn list(api: Data<Api>, _admin: Admin) -> HttpResponse {
    HttpResponse::Ok().json(api.herder.tenants().list())
}

/// `POST /tenants`: `{name, quotas?, client.config.override.policy?}` → 201 with the tenant
/// and its `token`, which is shown only in this answer.
pub async fn create(
    api: Data<Api>,
    _admin: Admin,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let top = object(&json, "the body")?;
    known_keys(top, &["name", "quotas", POLICY_KEY])?;
    let name = match top.get("name") {
        Some(Json::String(name)) => name.clone(),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "the tenant name must be a string, found {other}"
            )))
        }
        None => {
            return Err(ApiError::BadRequest(
                "the body has no \"name\": give the tenant's name".into(),
            ))
        }
    };
    let mut quotas = Quotas::default();
    apply_quotas(top, &mut quotas)?;
    let (info, token) = api
        .herder
        .create_tenant(&name, quotas, policy(top)?)
        .await?;
    let mut shown = serde_json::to_value(&info).unwrap_or_default();
    shown["token"] = json!(token);
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/tenants/{name}")))
        .json(shown))
}

/// `GET /tenants/{tenant}`: quotas, policy and usage; the admin, or the tenant itself.
pub async fn get(
    api: Data<Api>,
    _reader: TenantReader,
    path: Path<TenantPath>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(api.herder.tenant_details(&path.tenant).await?))
}

/// `PUT /tenants/{tenant}`: replaces the quotas (those left out become unlimited), and the
/// policy when given.
pub async fn put(
    api: Data<Api>,
    _admin: Admin,
    path: Path<TenantPath>,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let top = object(&json, "the body")?;
    known_keys(top, &["name", "quotas", POLICY_KEY])?;
    if let Some(name) = top.get("name").filter(|n| n.as_str() != Some(&path.tenant)) {
        return Err(ApiError::BadRequest(format!(
            "the name in the body ({name}) does not match the tenant in the URL ({})",
            path.tenant
        )));
    }
    let mut quotas = Quotas::default();
    apply_quotas(top, &mut quotas)?;
    let details = api
        .herder
        .update_tenant(&path.tenant, quotas, policy(top)?)
        .await?;
    Ok(HttpResponse::Ok().json(details))
}

/// `PATCH /tenants/{tenant}`: changes the quotas given (`null` removes one), and the policy
/// when given.
pub async fn patch(
    api: Data<Api>,
    _admin: Admin,
    path: Path<TenantPath>,
    request: HttpRequest,
    payload: Payload,
) -> Result<HttpResponse, ApiError> {
    let json = body::read_json(&request, payload, api.max_body_bytes).await?;
    let top = object(&json, "the body")?;
    known_keys(top, &["quotas", POLICY_KEY])?;
    let mut quotas = api.herder.tenant_details(&path.tenant).await?.tenant.quotas;
    apply_quotas(top, &mut quotas)?;
    let details = api
        .herder
        .update_tenant(&path.tenant, quotas, policy(top)?)
        .await?;
    Ok(HttpResponse::Ok().json(details))
}

/// `DELETE /tenants/{tenant}?deleteConnectors=true`: 204. Without the parameter a tenant
/// that still owns connectors is refused (409).
pub async fn delete(
    api: Data<Api>,
    _admin: Admin,
    path: Path<TenantPath>,
    params: Query<Vec<(String, String)>>,
) -> Result<HttpResponse, ApiError> {
    let delete_connectors = match params
        .iter()
        .rev()
        .find(|(k, _)| k == "deleteConnectors")
        .map(|(_, v)| v.to_ascii_lowercase())
    {
        None => false,
        Some(v) if v == "true" || v.is_empty() => true,
        Some(v) if v == "false" => false,
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "query parameter deleteConnectors='{v}' is not a boolean; expected true or false"
            )))
        }
    };
    api.herder
        .delete_tenant(&path.tenant, delete_connectors)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `POST /tenants/{tenant}/token`: a new token for the tenant (the old one stops working),
/// shown only in this answer.
pub async fn rotate_token(
    api: Data<Api>,
    _admin: Admin,
    path: Path<TenantPath>,
) -> Result<HttpResponse, ApiError> {
    let token = api.herder.rotate_token(&path.tenant).await?;
    Ok(HttpResponse::Ok().json(json!({ "name": path.tenant, "token": token })))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use serde_json::{json, Value as Json};

    use crate::herder::test_store::{herder_on, CountingStore};
    use crate::metrics::Telemetry;
    use crate::rest::auth::AuthSettings;
    use crate::rest::{serve, Api};
    use crate::tenants::Quotas;

    const ADMIN: &str = "admin-token-for-the-slow-store-test";

    /// One answer: status and JSON body.
    async fn call(request: reqwest::RequestBuilder, token: &str) -> (u16, Json) {
        let answer = request.bearer_auth(token).send().await.expect("answered");
        let status = answer.status().as_u16();
        (status, answer.json().await.expect("a JSON body"))
    }

    /// While the admin's tenant change waits for a slow store (a disk slow to sync, a config
    /// topic slow to answer), another tenant's requests authenticate and are answered at once:
    /// the change holds neither a REST worker thread nor the tenants' lock while it writes.
    /// A change the store refuses is answered in Connect's error shape and changes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_request_is_answered_while_a_slow_tenant_write_runs() {
        let write_delay = Duration::from_millis(1000);
        let dir = tempfile::tempdir().expect("temp dir");
        let store = CountingStore::open(dir.path(), write_delay, Duration::ZERO);
        let herder = Arc::new(herder_on(&store));
        let (_, beta) = herder
            .create_tenant("beta", Quotas::default(), None)
            .await
            .expect("beta created");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = serve(
            vec![(listener, None)],
            Api {
                herder: Arc::clone(&herder),
                ready: Arc::new(AtomicBool::new(true)),
                kafka_cluster_id: None,
                max_body_bytes: 1 << 20,
                auth: AuthSettings::with_admin_token(ADMIN),
                telemetry: Arc::new(Telemetry::build(false).expect("telemetry")),
                forward_client: reqwest::Client::new(),
            },
        )
        .expect("serving");
        let handle = server.handle();
        let serving = tokio::spawn(server);
        let client = reqwest::Client::new();

        let creating = tokio::spawn({
            let (client, url) = (client.clone(), format!("{base}/tenants"));
            async move {
                let started = Instant::now();
                let answer = call(client.post(url).json(&json!({"name": "acme"})), ADMIN).await;
                (answer, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let (status, own) = call(client.get(format!("{base}/tenants/beta")), &beta).await;
        assert_eq!(status, 200, "{own}");
        let (status, listed) =
            call(client.get(format!("{base}/tenants/beta/connectors")), ADMIN).await;
        assert_eq!(status, 200, "{listed}");
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(400),
            "two requests took {took:?} while a tenant write waited for the store"
        );
        assert!(
            !creating.is_finished(),
            "the requests were answered while the creation was still being written"
        );
        let ((status, created), creation_took) = creating.await.expect("joined");
        assert_eq!(status, 201, "{created}");
        assert!(creation_took >= write_delay, "{creation_took:?}");

        store.refuse_tenant_writes.store(true, Ordering::SeqCst);
        let (status, refused) = call(
            client
                .put(format!("{base}/tenants/acme"))
                .json(&json!({"quotas": {"connectors": 1}})),
            ADMIN,
        )
        .await;
        assert_eq!(status, 500, "{refused}");
        assert_eq!(refused["error_code"], 500, "{refused}");
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(message.contains("refuses tenant writes"), "{refused}");
        let (_, acme) = call(client.get(format!("{base}/tenants/acme")), ADMIN).await;
        assert_eq!(acme["quotas"]["connectors"], Json::Null, "{acme}");

        handle.stop(true).await;
        serving.await.expect("joined").expect("the server stopped");
    }
}
