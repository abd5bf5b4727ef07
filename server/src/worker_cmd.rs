//! `spillway worker WORKER.properties`: a worker operated over Kafka Connect's REST API, with
//! its connectors kept in the state store under `state.dir`. On start it restores every stored
//! connector in its target state; on Ctrl-C or SIGTERM it stops them gracefully (in-flight
//! batches finish, acknowledgements are committed) without changing their target states.
//!
//! Once listening it prints `REST API listening on http://ADDRESS` (or `https://`) on standard
//! output, one line per listener, so a caller that set `rest.port=0` learns the port.

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
use spillway_storage::{SledStore, StateStore};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::distributed::{self, Reconciler, ReconcilerHandle};
use crate::distributed_config::DistributedConfig;
use crate::herder::Herder;
use crate::metrics::Telemetry;
use crate::rest::{self, Api};
use crate::signals::StopSignals;
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
            ConfigKey::new(REST_HOST_NAME, ConfigType::String, Importance::Low, "Address the REST API listens on. When not set: all interfaces with rest.auth.enabled=true, loopback (127.0.0.1) without authentication.")
                .null_default(),
        )
        .define(
            ConfigKey::new(LISTENERS, ConfigType::List, Importance::Low, "Kafka Connect's listener list (http://HOST:PORT, https://HOST:PORT with listeners.https.ssl.* keys); when set, it wins over rest.host.name and rest.port. An entry without a host (http://:8083) gets rest.host.name's default.")
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

/// Whether a listener serves HTTP or HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// One address the REST API listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Whether the host was given (`rest.host.name`, or a host in the `listeners` entry);
    /// otherwise it is the default, which depends on authentication.
    pub explicit_host: bool,
}

/// Where the REST API listens when no host is given: every interface with authentication on
/// (Kafka Connect's default), loopback only without it, so that an unauthenticated worker is
/// not open to its network by accident.
fn default_host(auth_enabled: bool) -> &'static str {
    if auth_enabled {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    }
}

/// Where the REST API listens, from `listeners` (every entry) or `rest.host.name` /
/// `rest.port`.
fn listen_addresses(config: &ConfigMap) -> Result<Vec<ListenerSpec>> {
    let parsed = worker_rest_config_def().parse(config)?;
    let auth = parsed.boolean(REST_AUTH_ENABLED)?;
    let entries = parsed.list(LISTENERS)?;
    if entries.is_empty() {
        let given = parsed
            .string(REST_HOST_NAME)?
            .filter(|h| !h.trim().is_empty());
        let port = u16::try_from(parsed.int(REST_PORT)?).context("rest.port out of range")?;
        return Ok(vec![ListenerSpec {
            scheme: Scheme::Http,
            host: given.unwrap_or(default_host(auth)).trim().to_owned(),
            port,
            explicit_host: given.is_some(),
        }]);
    }
    let mut specs = Vec::new();
    for entry in entries {
        let entry = entry.trim();
        let (scheme, rest) = match entry.split_once("://") {
            Some((s, rest)) if s.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
            Some((s, rest)) if s.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
            _ => bail!("listeners entry '{entry}' is not supported; use http://HOST:PORT or https://HOST:PORT"),
        };
        let (host, port) = rest.rsplit_once(':').with_context(|| {
            format!(
                "listeners entry '{entry}' has no port; use {}://HOST:PORT",
                scheme.as_str()
            )
        })?;
        let port: u16 = port.parse().with_context(|| {
            format!("listeners entry '{entry}': port '{port}' is not a number from 0 to 65535")
        })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        specs.push(ListenerSpec {
            scheme,
            host: if host.is_empty() {
                default_host(auth).to_owned()
            } else {
                host.to_owned()
            },
            port,
            explicit_host: !host.is_empty(),
        });
    }
    Ok(specs)
}

/// Says where the REST API listens and how open that is, once at start.
fn log_exposure(specs: &[ListenerSpec], auth: bool) {
    for spec in specs {
        let loopback = spec
            .host
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(spec.host == "localhost");
        match (auth, spec.explicit_host, loopback) {
            (false, false, _) => warn!(
                host = %spec.host,
                port = spec.port,
                "authentication is off ({REST_AUTH_ENABLED}=false), so the REST API listens on loopback only; \
                 set {REST_HOST_NAME} or {LISTENERS} to listen on another address, and turn authentication on first"
            ),
            (false, true, false) => warn!(
                host = %spec.host,
                port = spec.port,
                "the REST API listens beyond loopback without authentication ({REST_AUTH_ENABLED}=false): \
                 anyone who can reach it can run connectors as this worker"
            ),
            _ => info!(
                host = %spec.host,
                port = spec.port,
                scheme = spec.scheme.as_str(),
                authentication = auth,
                "REST API address"
            ),
        }
        if spec.scheme == Scheme::Http && auth && !loopback {
            warn!(
                host = %spec.host,
                port = spec.port,
                "bearer tokens travel in clear text over http; use listeners=https://... with {}ssl.* keys",
                rest::tls::HTTPS_PREFIX
            );
        }
    }
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

/// Runs the worker of `worker_properties` until SIGTERM or SIGINT (Ctrl-C).
pub async fn run(worker_properties: PathBuf) -> Result<()> {
    // Before anything else: a signal during start-up must stop gracefully too.
    let signals = StopSignals::listen()?;
    let config = read_config(&worker_properties)?;
    let worker = RunningWorker::start(config, ConnectorRegistry::builtin())
        .await
        .with_context(|| format!("cannot start the worker of {}", worker_properties.display()))?;
    for (scheme, address) in worker.listening() {
        println!("REST API listening on {}://{address}", scheme.as_str());
    }
    let _ = std::io::stdout().flush();
    worker.run_until_signal(signals).await
}

/// A worker serving the REST API, its connectors restored.
pub struct RunningWorker {
    address: SocketAddr,
    listening: Vec<(Scheme, SocketAddr)>,
    telemetry: Arc<Telemetry>,
    herder: Arc<Herder>,
    server: ServerHandle,
    serving: JoinHandle<std::io::Result<()>>,
    persisting: JoinHandle<()>,
    /// Ends the status tick after its current write (see [`RunningWorker::stop`]).
    stop_persisting: tokio::sync::watch::Sender<bool>,
    /// Brings the stored connectors back; `/health` answers 503 until it is done.
    restoring: JoinHandle<()>,
    /// Distributed mode: the reconciler that runs what the group assigns.
    reconciler: Option<ReconcilerHandle>,
}

/// Where a worker keeps its state.
pub enum StateBackend {
    /// A single worker's store (sled under `state.dir`, or in memory for standalone).
    Local(Arc<dyn StateStore>),
    /// Distributed mode: the cluster's config and status topics.
    Cluster(DistributedConfig),
}

/// The REST server's settings, checked and loaded (certificates included) before anything
/// else starts.
struct RestSetup {
    max_body_bytes: usize,
    advertised: Option<String>,
    specs: Vec<ListenerSpec>,
    auth: rest::auth::AuthSettings,
    tls: Option<rustls::ServerConfig>,
    forward_client: reqwest::Client,
}

impl RestSetup {
    fn from_config(config: &ConfigMap) -> Result<RestSetup> {
        let parsed = worker_rest_config_def().parse(config)?;
        let max_body_bytes = usize::try_from(parsed.int(REST_MAX_BODY_BYTES)?)
            .unwrap_or(rest::DEFAULT_MAX_BODY_BYTES);
        let advertised = parsed.string(REST_ADVERTISED_HOST_NAME)?.map(str::to_owned);
        let specs = listen_addresses(config)?;
        let auth = auth_settings(config)?;
        let https = specs.iter().any(|s| s.scheme == Scheme::Https);
        let tls = if https {
            Some(rest::tls::server_config(config).context("cannot set up the https listener")?)
        } else {
            None
        };
        let forward_client = rest::forward::client(config, https)?;
        Ok(RestSetup {
            max_body_bytes,
            advertised,
            specs,
            auth,
            tls,
            forward_client,
        })
    }
}

impl RunningWorker {
    /// Opens the state store, starts the worker and the REST server, and starts restoring
    /// every stored connector in its target state (`/health` answers 200 once that is done).
    pub async fn start(config: ConfigMap, registry: ConnectorRegistry) -> Result<RunningWorker> {
        if let Some(distributed) = DistributedConfig::from_worker_config(&config)? {
            info!(group = %distributed.group_id, config_topic = %distributed.config_topic.name, status_topic = %distributed.status_topic.name, "distributed mode");
            return Self::start_with(config, registry, StateBackend::Cluster(distributed)).await;
        }
        let parsed = worker_rest_config_def().parse(&config)?;
        // A REST setting that cannot work is refused before the state store is opened: a
        // refused start leaves nothing behind (sled releases its lock only after its
        // background thread ends, so a store opened here would stay locked for a while).
        let rest = RestSetup::from_config(&config)?;
        let state_dir = PathBuf::from(parsed.string(STATE_DIR)?.unwrap_or("spillway-state"));
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("cannot create state.dir {}", state_dir.display()))?;
        let store = SledStore::open(&state_dir)?;
        info!(path = %state_dir.display(), "state store opened");
        Self::start_set_up(config, registry, StateBackend::Local(Arc::new(store)), rest).await
    }

    /// [`start`](Self::start) on a given state store (`spillway standalone` keeps its state in
    /// memory).
    pub async fn start_with_store(
        config: ConfigMap,
        registry: ConnectorRegistry,
        store: Arc<dyn StateStore>,
    ) -> Result<RunningWorker> {
        Self::start_with(config, registry, StateBackend::Local(store)).await
    }

    /// [`start`](Self::start) with the state where `backend` says.
    pub async fn start_with(
        config: ConfigMap,
        registry: ConnectorRegistry,
        backend: StateBackend,
    ) -> Result<RunningWorker> {
        let rest = RestSetup::from_config(&config)?;
        Self::start_set_up(config, registry, backend, rest).await
    }

    async fn start_set_up(
        config: ConfigMap,
        registry: ConnectorRegistry,
        backend: StateBackend,
        rest: RestSetup,
    ) -> Result<RunningWorker> {
        let mut listeners = Vec::new();
        let mut listening = Vec::new();
        for spec in &rest.specs {
            let (host, port) = (spec.host.as_str(), spec.port);
            let listener = TcpListener::bind((host, port)).with_context(|| {
                format!("cannot listen on {host}:{port} (rest.host.name / rest.port / listeners)")
            })?;
            listener.set_nonblocking(true)?;
            listening.push((spec.scheme, listener.local_addr()?));
            let tls = (spec.scheme == Scheme::Https)
                .then(|| rest.tls.clone())
                .flatten();
            listeners.push((listener, tls));
        }
        log_exposure(&rest.specs, rest.auth.enabled);
        let address = listening[0].1;
        let worker_id = format!(
            "{}:{}",
            rest.advertised.unwrap_or_else(|| address.ip().to_string()),
            address.port()
        );

        let bootstrap = config.get("bootstrap.servers").cloned().unwrap_or_default();
        let security: Vec<(String, String)> = config
            .iter()
            .filter(|(k, _)| spillway_kafka::security::is_security_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let telemetry = Arc::new(Telemetry::from_env()?);
        let (herder, group) = match backend {
            StateBackend::Local(store) => {
                let worker =
                    Worker::start_with_meter(config, registry.clone(), &telemetry.meter())?;
                (Herder::new(worker, store, registry, worker_id)?, None)
            }
            StateBackend::Cluster(distributed) => {
                let url = format!("{}://{worker_id}", listening[0].0.as_str());
                let link =
                    distributed::open_link(&config, &distributed, worker_id.clone(), url).await?;
                let cluster =
                    distributed::connect(&config, &format!("spillway-worker-{worker_id}")).await?;
                let worker =
                    Worker::start_with_meter(config, registry.clone(), &telemetry.meter())?;
                let herder = Herder::distributed(worker, link, registry, worker_id)?;
                (
                    herder,
                    Some((cluster, distributed::group_config(&distributed))),
                )
            }
        };
        let herder = Arc::new(herder);
        let ready = Arc::new(AtomicBool::new(false));
        let server = rest::serve(
            listeners,
            Api {
                herder: Arc::clone(&herder),
                ready: Arc::clone(&ready),
                kafka_cluster_id: kafka_cluster_id(bootstrap, security).await,
                max_body_bytes: rest.max_body_bytes,
                auth: rest.auth,
                telemetry: Arc::clone(&telemetry),
                forward_client: rest.forward_client,
            },
        )?;
        let handle = server.handle();
        let guard = herder.lock_for_restore().await;
        let serving = tokio::spawn(server);
        for (scheme, address) in &listening {
            info!(address = %address, scheme = scheme.as_str(), "REST API listening; restoring connectors");
        }
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
        let (stop_persisting, mut persisting_stopped) = tokio::sync::watch::channel(false);
        let persisting = tokio::spawn({
            let herder = Arc::clone(&herder);
            async move {
                let mut tick = tokio::time::interval(STATUS_PERSIST_INTERVAL);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = persisting_stopped.changed() => return,
                    }
                    // The herder writes them (sled, with fsync) on a blocking thread.
                    if let Err(e) = herder.persist_task_statuses().await {
                        warn!(error = %e, "cannot record task statuses");
                    }
                }
            }
        });
        let reconciler = match group {
            Some((cluster, group)) => Some(Reconciler::start(Arc::clone(&herder), cluster, group)?),
            None => None,
        };
        Ok(RunningWorker {
            address,
            listening,
            telemetry,
            herder,
            server: handle,
            serving,
            persisting,
            stop_persisting,
            restoring,
            reconciler,
        })
    }

    /// The herder behind the REST API.
    pub fn herder(&self) -> &Arc<Herder> {
        &self.herder
    }

    /// Where the REST API listens (the first listener).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Every listener: its scheme and address.
    pub fn listening(&self) -> &[(Scheme, SocketAddr)] {
        &self.listening
    }

    /// Serves until SIGTERM or SIGINT (or until the server fails), then stops gracefully.
    pub async fn run_until_signal(self, mut signals: StopSignals) -> Result<()> {
        self.run_until(async move {
            let signal = signals.recv().await;
            info!(signal, "stop requested");
            Ok(())
        })
        .await
    }

    /// Serves until `stop` completes (or fails, or the server fails), then stops gracefully.
    pub async fn run_until(
        mut self,
        stop: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        let failed = self.reconciler.as_mut().and_then(|r| r.failed.take());
        let group_failed = async move {
            match failed {
                Some(failed) => match failed.await {
                    Ok(reason) => reason,
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            stopped = stop => stopped,
            reason = group_failed => Err(anyhow::anyhow!("the worker cannot take part in its group: {reason}")),
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
        self.restoring.abort();
        // Distributed mode: no more assignments; the tasks stop, then the worker leaves the
        // group so that the others take its work at once.
        let member = match self.reconciler {
            Some(reconciler) => reconciler.stop().await,
            None => None,
        };
        // The tick ends after the write it may be making: aborted, its blocking write would
        // go on and could land after the UNASSIGNED statuses written below.
        let _ = self.stop_persisting.send(true);
        let _ = self.persisting.await;
        self.herder.shutdown().await;
        if let Some(member) = member {
            if let Some(link) = self.herder.cluster() {
                distributed::mark_unassigned_on_stop(link).await;
            }
            member.leave().await;
        }
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

    fn one(config: &ConfigMap) -> (Scheme, String, u16, bool) {
        let specs = listen_addresses(config).expect("valid");
        assert_eq!(specs.len(), 1, "{specs:?}");
        let s = &specs[0];
        (s.scheme, s.host.clone(), s.port, s.explicit_host)
    }

    // The issue asks for the new default: loopback without authentication (the test pinned
    // 0.0.0.0 before).
    #[test]
    fn without_authentication_the_default_host_is_loopback_and_listeners_win_over_rest_port() {
        assert_eq!(
            one(&ConfigMap::new()),
            (Scheme::Http, "127.0.0.1".into(), 8083, false)
        );
        assert_eq!(
            one(&config(&[(REST_AUTH_ENABLED, "true")])),
            (Scheme::Http, "0.0.0.0".into(), 8083, false)
        );
        assert_eq!(
            one(&config(&[(REST_PORT, "9000"), (REST_HOST_NAME, "0.0.0.0")])),
            (Scheme::Http, "0.0.0.0".into(), 9000, true)
        );
        assert_eq!(
            one(&config(&[(REST_PORT, "9000"), (LISTENERS, "http://:8084")])),
            (Scheme::Http, "127.0.0.1".into(), 8084, false)
        );
        assert_eq!(
            one(&config(&[(LISTENERS, "HTTPS://[::1]:8443")])),
            (Scheme::Https, "::1".into(), 8443, true)
        );
        let both = listen_addresses(&config(&[(
            LISTENERS,
            "https://0.0.0.0:8443,http://127.0.0.1:8083",
        )]))
        .expect("two listeners");
        assert_eq!(both.len(), 2);
        assert_eq!(both[1].scheme, Scheme::Http);
    }

    #[test]
    fn an_unknown_scheme_or_bad_port_is_refused_naming_it() {
        let err = listen_addresses(&config(&[(LISTENERS, "ftp://a:1")])).expect_err("ftp");
        assert!(err.to_string().contains("ftp://a:1"), "{err}");
        let err = listen_addresses(&config(&[(REST_PORT, "70000")])).expect_err("port");
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
