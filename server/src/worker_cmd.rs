//! `spillway worker WORKER.properties`: a worker operated over Kafka Connect's REST API, with
//! its connectors kept in the state store under `state.dir`. On start it restores every stored
//! connector in its target state; on Ctrl-C or SIGTERM it stops them gracefully (in-flight
//! batches finish, acknowledgements are committed) without changing their target states.
//!
//! Once listening it prints `REST API listening on http://ADDRESS` on standard output, so a
//! caller that set `rest.port=0` learns the port.

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use anyhow::{bail, Context, Result};
use spillway_actors::Worker;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use spillway_core::ConfigMap;
use spillway_storage::SledStore;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::herder::Herder;
use crate::metrics::Telemetry;
use crate::rest::{self, Api};
use crate::standalone::read_config;

pub const REST_PORT: &str = "rest.port";
pub const REST_HOST_NAME: &str = "rest.host.name";
pub const LISTENERS: &str = "listeners";
pub const REST_ADVERTISED_HOST_NAME: &str = "rest.advertised.host.name";
pub const REST_MAX_BODY_BYTES: &str = "rest.max.body.bytes";
pub const STATE_DIR: &str = "state.dir";
pub const REST_AUTH_ENABLED: &str = "rest.auth.enabled";
pub const REST_ADMIN_TOKEN: &str = "rest.admin.token";
/// Shortest admin token accepted: it guards every tenant.
const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// How often task statuses are compared with the store and written when they changed.
const STATUS_PERSIST_INTERVAL: Duration = Duration::from_secs(1);
/// How long the worker waits for the Kafka cluster id shown by `GET /`.
const CLUSTER_ID_TIMEOUT: Duration = Duration::from_secs(5);

/// The worker keys of the REST server and the state store.
pub fn worker_rest_config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(REST_PORT, ConfigType::Int, Importance::Low, "Port of the REST API; 0 picks a free port (printed at start).")
                .default("8083")
                .validator(Validator::Between(0, 65535)),
        )
        .define(
            ConfigKey::new(REST_HOST_NAME, ConfigType::String, Importance::Low, "Address the REST API listens on; all interfaces when not set.")
                .null_default(),
        )
        .define(
            ConfigKey::new(LISTENERS, ConfigType::List, Importance::Low, "Kafka Connect's listener list (http://HOST:PORT); when set, its first entry wins over rest.host.name and rest.port.")
                .default(""),
        )
        .define(
            ConfigKey::new(REST_ADVERTISED_HOST_NAME, ConfigType::String, Importance::Low, "Host name in the worker id shown by the status API; the listening address when not set.")
                .null_default(),
        )
        .define(
            ConfigKey::new(REST_MAX_BODY_BYTES, ConfigType::Int, Importance::Low, "Largest request body the REST API reads; larger ones get 413.")
                .default(rest::DEFAULT_MAX_BODY_BYTES.to_string())
                .validator(Validator::AtLeast(1024)),
        )
        .define(
            ConfigKey::new(REST_AUTH_ENABLED, ConfigType::Boolean, Importance::High, "Whether the REST API requires bearer tokens: the admin's (rest.admin.token) or a tenant's. Off, there is one tenant, default, and the API is Kafka Connect's.")
                .default("false"),
        )
        .define(
            ConfigKey::new(REST_ADMIN_TOKEN, ConfigType::Password, Importance::High, "The admin's bearer token when rest.auth.enabled=true: manages tenants and acts on every tenant's connectors.")
                .null_default(),
        )
        .define(
            ConfigKey::new(STATE_DIR, ConfigType::String, Importance::High, "Directory of the worker's durable state (connector configurations, target states, task statuses).")
                .default("spillway-state")
                .validator(Validator::NonEmptyString),
        )
}

/// How the REST API authenticates, from `rest.auth.enabled` and `rest.admin.token`.
fn auth_settings(config: &ConfigMap) -> Result<rest::auth::AuthSettings> {
    let parsed = worker_rest_config_def().parse(config)?;
    if !parsed.boolean(REST_AUTH_ENABLED)? {
        return Ok(rest::auth::AuthSettings::default());
    }
    let Some(token) = parsed.password(REST_ADMIN_TOKEN)? else {
        bail!("{REST_AUTH_ENABLED}=true needs {REST_ADMIN_TOKEN}: set the admin's bearer token (at least {MIN_ADMIN_TOKEN_LEN} characters)");
    };
    if token.expose().trim().len() < MIN_ADMIN_TOKEN_LEN {
        bail!("{REST_ADMIN_TOKEN} is shorter than {MIN_ADMIN_TOKEN_LEN} characters; use a long random token, it guards every tenant");
    }
    Ok(rest::auth::AuthSettings::with_admin_token(
        token.expose().trim(),
    ))
}

/// Where the REST API listens, from `listeners` or `rest.host.name` / `rest.port`.
fn listen_address(config: &ConfigMap) -> Result<(String, u16)> {
    let parsed = worker_rest_config_def().parse(config)?;
    if let Some(first) = parsed.list(LISTENERS)?.first() {
        let Some(rest) = first.strip_prefix("http://") else {
            bail!("listeners entry '{first}' is not supported; use http://HOST:PORT (https is not available yet)");
        };
        let (host, port) = rest.rsplit_once(':').with_context(|| {
            format!("listeners entry '{first}' has no port; use http://HOST:PORT")
        })?;
        let port: u16 = port.parse().with_context(|| {
            format!("listeners entry '{first}': port '{port}' is not a number from 0 to 65535")
        })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        return Ok((host.to_owned(), port));
    }
    let host = parsed
        .string(REST_HOST_NAME)?
        .unwrap_or("0.0.0.0")
        .to_owned();
    let port = u16::try_from(parsed.int(REST_PORT)?).context("rest.port out of range")?;
    Ok((host, port))
}

/// The Kafka cluster id, or `None` when the cluster does not answer in time. The worker's
/// own client: its top-level security keys apply (as for Connect's internal clients).
async fn kafka_cluster_id(bootstrap: String, security: Vec<(String, String)>) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", &bootstrap);
        let context = spillway_kafka::security::rdkafka_config(
            &mut config,
            security.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .ok()?;
        let consumer: BaseConsumer<spillway_kafka::security::SecurityContext> =
            config.create_with_context(context).ok()?;
        consumer.client().fetch_cluster_id(CLUSTER_ID_TIMEOUT)
    })
    .await
    .ok()
    .flatten()
}

/// Runs the worker of `worker_properties` until Ctrl-C or SIGTERM.
pub async fn run(worker_properties: PathBuf) -> Result<()> {
    let config = read_config(&worker_properties)?;
    let worker = RunningWorker::start(config, ConnectorRegistry::builtin())
        .await
        .with_context(|| format!("cannot start the worker of {}", worker_properties.display()))?;
    println!("REST API listening on http://{}", worker.address());
    let _ = std::io::stdout().flush();
    worker.run_until_signal().await
}

/// A worker serving the REST API, its connectors restored.
pub struct RunningWorker {
    address: SocketAddr,
    telemetry: Arc<Telemetry>,
    herder: Arc<Herder>,
    server: ServerHandle,
    serving: JoinHandle<std::io::Result<()>>,
    persisting: JoinHandle<()>,
    /// Brings the stored connectors back; `/health` answers 503 until it is done.
    restoring: JoinHandle<()>,
}

impl RunningWorker {
    /// Opens the state store, starts the worker and the REST server, and starts restoring
    /// every stored connector in its target state (`/health` answers 200 once that is done).
    pub async fn start(config: ConfigMap, registry: ConnectorRegistry) -> Result<RunningWorker> {
        let parsed = worker_rest_config_def().parse(&config)?;
        let state_dir = PathBuf::from(parsed.string(STATE_DIR)?.unwrap_or("spillway-state"));
        let max_body_bytes = usize::try_from(parsed.int(REST_MAX_BODY_BYTES)?)
            .unwrap_or(rest::DEFAULT_MAX_BODY_BYTES);
        let advertised = parsed.string(REST_ADVERTISED_HOST_NAME)?.map(str::to_owned);
        let (host, port) = listen_address(&config)?;
        let auth = auth_settings(&config)?;

        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("cannot create state.dir {}", state_dir.display()))?;
        let store = SledStore::open(&state_dir)?;
        info!(path = %state_dir.display(), "state store opened");

        let listener = TcpListener::bind((host.as_str(), port)).with_context(|| {
            format!("cannot listen on {host}:{port} (rest.host.name / rest.port / listeners)")
        })?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let worker_id = format!(
            "{}:{}",
            advertised.unwrap_or_else(|| address.ip().to_string()),
            address.port()
        );

        let bootstrap = config.get("bootstrap.servers").cloned().unwrap_or_default();
        let security: Vec<(String, String)> = config
            .iter()
            .filter(|(k, _)| spillway_kafka::security::is_security_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let telemetry = Arc::new(Telemetry::from_env()?);
        let worker = Worker::start_with_meter(config, registry.clone(), &telemetry.meter())?;
        let herder = Arc::new(Herder::new(worker, Arc::new(store), registry, worker_id)?);
        let ready = Arc::new(AtomicBool::new(false));
        let server = rest::serve(
            listener,
            Api {
                herder: Arc::clone(&herder),
                ready: Arc::clone(&ready),
                kafka_cluster_id: kafka_cluster_id(bootstrap, security).await,
                max_body_bytes,
                auth,
                telemetry: Arc::clone(&telemetry),
            },
        )?;
        let handle = server.handle();
        let guard = herder.lock_for_restore().await;
        let serving = tokio::spawn(server);
        info!(address = %address, "REST API listening; restoring connectors");
        let restoring = tokio::spawn({
            let herder = Arc::clone(&herder);
            async move {
                match herder.restore(guard).await {
                    Ok(()) => {
                        ready.store(true, Ordering::Release);
                        info!("worker ready: every connector is back in its target state");
                    }
                    Err(e) => {
                        error!(error = %e, "cannot restore the connectors; /health stays 'starting'")
                    }
                }
            }
        });
        let persisting = tokio::spawn({
            let herder = Arc::clone(&herder);
            async move {
                let mut tick = tokio::time::interval(STATUS_PERSIST_INTERVAL);
                loop {
                    tick.tick().await;
                    if let Err(e) = herder.persist_task_statuses() {
                        warn!(error = %e, "cannot record task statuses");
                    }
                }
            }
        });
        Ok(RunningWorker {
            address,
            telemetry,
            herder,
            server: handle,
            serving,
            persisting,
            restoring,
        })
    }

    /// Where the REST API listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves until Ctrl-C or SIGTERM (or until the server fails), then stops gracefully.
    pub async fn run_until_signal(mut self) -> Result<()> {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("cannot listen for SIGTERM")?;
        let outcome = tokio::select! {
            signal = tokio::signal::ctrl_c() => signal.context("cannot listen for Ctrl-C"),
            _ = terminate.recv() => Ok(()),
            served = &mut self.serving => match served {
                Ok(result) => result.context("the REST server stopped"),
                Err(e) => Err(e).context("the REST server stopped"),
            },
        };
        self.stop().await;
        outcome
    }

    /// Stops serving, then stops every connector gracefully (their target states unchanged).
    pub async fn stop(self) {
        info!("stopping: finishing in-flight batches and committing");
        self.server.stop(true).await;
        self.persisting.abort();
        self.restoring.abort();
        self.herder.shutdown().await;
        // Flushing OTLP blocks on its HTTP export.
        let telemetry = Arc::clone(&self.telemetry);
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        info!("stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use spillway_core::config::config_map as config;

    #[test]
    fn listeners_win_over_rest_port_and_default_to_8083_on_all_interfaces() {
        assert_eq!(
            listen_address(&ConfigMap::new()).expect("defaults"),
            ("0.0.0.0".into(), 8083)
        );
        assert_eq!(
            listen_address(&config(&[
                (REST_PORT, "9000"),
                (REST_HOST_NAME, "127.0.0.1")
            ]))
            .expect("port"),
            ("127.0.0.1".into(), 9000)
        );
        assert_eq!(
            listen_address(&config(&[(REST_PORT, "9000"), (LISTENERS, "http://:8084")]))
                .expect("listeners"),
            ("0.0.0.0".into(), 8084)
        );
    }

    #[test]
    fn an_https_listener_or_bad_port_is_refused_naming_it() {
        let err = listen_address(&config(&[(LISTENERS, "https://a:1")])).expect_err("https");
        assert!(err.to_string().contains("https://a:1"), "{err}");
        let err = listen_address(&config(&[(REST_PORT, "70000")])).expect_err("port");
        assert!(err.to_string().contains("70000"), "{err}");
    }

    #[test]
    fn authentication_needs_a_long_admin_token() {
        assert!(!auth_settings(&ConfigMap::new()).expect("off").enabled);
        let err = auth_settings(&config(&[(REST_AUTH_ENABLED, "true")])).expect_err("no token");
        assert!(err.to_string().contains(REST_ADMIN_TOKEN), "{err}");
        let err = auth_settings(&config(&[
            (REST_AUTH_ENABLED, "true"),
            (REST_ADMIN_TOKEN, "short"),
        ]))
        .expect_err("short");
        assert!(err.to_string().contains("16 characters"), "{err}");
        let on = auth_settings(&config(&[
            (REST_AUTH_ENABLED, "true"),
            (REST_ADMIN_TOKEN, "0123456789abcdef0123"),
        ]))
        .expect("on");
        assert!(on.enabled);
        assert_eq!(
            on.admin_token_digest.as_deref(),
            Some(crate::tenants::digest("0123456789abcdef0123").as_str())
        );
    }
}
