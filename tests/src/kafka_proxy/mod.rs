//! A Kafka proxy in front of the dev broker, which speaks only plaintext: it adds TLS (with
//! certificates made per proxy), the SASL server side (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER)
//! and fault controls, so secured clients and failure handling can be tested locally.
//!
//! One listener per broker. Requests pass through unchanged; broker endpoints in Metadata,
//! FindCoordinator, DescribeCluster, ShareFetch/ShareAcknowledge (and Produce/Fetch) answers are
//! rewritten to the proxy's listeners so clients never leave the proxy.
//!
//! With `ProxyOptions::with_admin_emulation` it also answers Kafka's admin requests itself
//! (`admin`, `admin_configs`, `share_offsets`), which the dev broker lacks, and with
//! `with_one_group_namespace` it keeps group ids in one namespace as Kafka does (`groups`);
//! `with_kafka_share_sessions` keeps a member's records acquired across a share-session reopen,
//! as Kafka does (`share_sessions`); `with_partition_growth` lets topics gain partitions through
//! CreatePartitions, which the dev broker cannot (`partition_growth`).
//!
//! Layout: `connection` (listeners, TLS, SASL exchange, request/response pump), `local` (the
//! dispatch of requests the proxy answers itself), `rewrite` (endpoints, Kafka 4.2 heartbeat
//! rule), `pki` (certificates, rustls), `sasl` (mechanisms), `faults` (controls), `token` (the
//! OAUTHBEARER token issuer), `frame` (codec), `groups` (Kafka's one namespace for group ids).

mod admin;
mod admin_configs;
mod connection;
mod faults;
mod frame;
mod groups;
mod local;
mod partition_growth;
mod pki;
mod rewrite;
mod sasl;
mod share_offsets;
mod share_sessions;
mod token;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse, RequestHeader,
};
use kafka_protocol::protocol::StrBytes;
use tokio::net::{TcpListener, TcpStream};

pub use admin::{AdminEmulation, AdminEmulationOptions, AdminOperation};
pub use faults::{ProxyFaults, PARTITION_ERROR_APIS, TOP_LEVEL_ERROR_APIS};
pub use groups::{GroupNamespace, GroupType};
pub use partition_growth::{GrownTopic, PartitionGrowth, DEFAULT_PARTITION_CAPACITY};
pub use pki::TestPki;
pub use sasl::SaslMechanism;
pub use token::{TokenError, TokenIssuer};

use connection::Shared;
use local::LocalApis;
use rewrite::Rewriter;
use sasl::SaslConfig;

/// The listener's security protocol, as `security.protocol` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxySecurity {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl ProxySecurity {
    pub fn uses_tls(self) -> bool {
        matches!(self, ProxySecurity::Ssl | ProxySecurity::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, ProxySecurity::SaslPlaintext | ProxySecurity::SaslSsl)
    }

    /// The `security.protocol` value.
    pub fn name(self) -> &'static str {
        match self {
            ProxySecurity::Plaintext => "PLAINTEXT",
            ProxySecurity::Ssl => "SSL",
            ProxySecurity::SaslPlaintext => "SASL_PLAINTEXT",
            ProxySecurity::SaslSsl => "SASL_SSL",
        }
    }
}

impl std::fmt::Display for ProxySecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ProxySecurity {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [
            ProxySecurity::Plaintext,
            ProxySecurity::Ssl,
            ProxySecurity::SaslPlaintext,
            ProxySecurity::SaslSsl,
        ]
        .into_iter()
        .find(|s| s.name().eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            format!("unknown security protocol '{text}'; expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL")
        })
    }
}

/// How a proxy secures its listeners and what it emulates.
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    pub security: ProxySecurity,
    /// Mechanisms the SASL listeners accept.
    pub mechanisms: Vec<SaslMechanism>,
    /// Credentials for PLAIN and SCRAM.
    pub users: Vec<(String, String)>,
    /// OAUTHBEARER: tokens this issuer issued (and unexpired) are valid.
    pub token_issuer: Option<TokenIssuer>,
    /// mTLS: clients must present a certificate signed by the proxy's test CA.
    pub require_client_certificate: bool,
    /// ShareGroupHeartbeat answers carry the assignment only when Kafka 4.2's coordinator would.
    pub kafka42_coordinator: bool,
    /// Kafka's one namespace for group ids: a member of another group type is refused as
    /// Kafka 4.2 refuses it; ListGroups and DescribeGroups are answered (`groups.rs`).
    pub one_group_namespace: bool,
    /// An epoch-0 ShareFetch continues the member's session on the dev broker instead of
    /// replacing it, so its acquired records stay acquired, as on Kafka (`share_sessions.rs`).
    pub kafka_share_sessions: bool,
    /// Answer Kafka's admin requests (CreateTopics, DescribeConfigs, IncrementalAlterConfigs,
    /// the share-group offsets APIs) on top of the dev broker's launcher.
    pub admin: Option<AdminEmulationOptions>,
    /// Admin operations the emulation refuses as unauthorized.
    pub denied_operations: std::collections::BTreeSet<AdminOperation>,
    /// Topics can gain partitions (CreatePartitions), up to this many on the dev broker
    /// (`partition_growth.rs`); needs the admin emulation.
    pub partition_capacity: Option<i32>,
}

impl ProxyOptions {
    /// Options for `security`; SASL listeners accept PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
    /// (and OAUTHBEARER once a token issuer is given).
    pub fn new(security: ProxySecurity) -> Self {
        ProxyOptions {
            security,
            mechanisms: vec![
                SaslMechanism::Plain,
                SaslMechanism::ScramSha256,
                SaslMechanism::ScramSha512,
            ],
            users: Vec::new(),
            token_issuer: None,
            require_client_certificate: false,
            kafka42_coordinator: false,
            one_group_namespace: false,
            kafka_share_sessions: false,
            admin: None,
            denied_operations: Default::default(),
            partition_capacity: None,
        }
    }

    /// Accept only these mechanisms.
    pub fn with_mechanisms(mut self, mechanisms: &[SaslMechanism]) -> Self {
        self.mechanisms = mechanisms.to_vec();
        self
    }

    pub fn with_user(mut self, name: &str, password: &str) -> Self {
        self.users.push((name.to_string(), password.to_string()));
        self
    }

    /// Accept OAUTHBEARER tokens from `issuer` (adds the mechanism).
    pub fn with_token_issuer(mut self, issuer: TokenIssuer) -> Self {
        self.token_issuer = Some(issuer);
        if !self.mechanisms.contains(&SaslMechanism::OAuthBearer) {
            self.mechanisms.push(SaslMechanism::OAuthBearer);
        }
        self
    }

    pub fn with_client_certificate_required(mut self) -> Self {
        self.require_client_certificate = true;
        self
    }

    pub fn with_kafka42_coordinator(mut self) -> Self {
        self.kafka42_coordinator = true;
        self
    }

    pub fn with_one_group_namespace(mut self) -> Self {
        self.one_group_namespace = true;
        self
    }

    pub fn with_kafka_share_sessions(mut self) -> Self {
        self.kafka_share_sessions = true;
        self
    }

    /// Answer Kafka's admin requests as Apache Kafka 4.2 does, mapped onto the dev broker that
    /// `control` drives (`DevBroker::control()`). Clients then see these APIs in ApiVersions;
    /// without this option they see them as unsupported, as the dev broker has them.
    pub fn with_admin_emulation(mut self, control: crate::DevBrokerControl) -> Self {
        self.admin = Some(AdminEmulationOptions { control });
        self
    }

    /// Refuse `operation` as Kafka refuses an unauthorized principal (needs the admin emulation;
    /// `KafkaProxy::admin()` changes it at run time).
    pub fn with_denied_operation(mut self, operation: AdminOperation) -> Self {
        self.denied_operations.insert(operation);
        self
    }

    /// Topics gain partitions through CreatePartitions, as on Kafka: topics made through the
    /// proxy get [`DEFAULT_PARTITION_CAPACITY`] partitions on the dev broker (or as many as
    /// asked, if more) and clients see only as many as asked until CreatePartitions raises
    /// the count (`partition_growth.rs`). Needs the admin emulation.
    pub fn with_partition_growth(self) -> Self {
        self.with_partition_capacity(DEFAULT_PARTITION_CAPACITY)
    }

    /// As [`Self::with_partition_growth`], with room for `capacity` partitions per topic.
    pub fn with_partition_capacity(mut self, capacity: i32) -> Self {
        self.partition_capacity = Some(capacity);
        self
    }

    fn validate(&self) -> Result<(), ProxyError> {
        let bad = |m: String| Err(ProxyError::Options(m));
        if self.require_client_certificate && !self.security.uses_tls() {
            return bad(format!(
                "require_client_certificate needs a TLS listener (SSL or SASL_SSL), not {}",
                self.security
            ));
        }
        if self.security.uses_sasl() {
            if self.mechanisms.is_empty() {
                return bad(format!(
                    "{} needs at least one SASL mechanism",
                    self.security
                ));
            }
            let password_based = self
                .mechanisms
                .iter()
                .any(|m| *m != SaslMechanism::OAuthBearer);
            if password_based && self.users.is_empty() {
                return bad(format!(
                    "SASL mechanisms {:?} need at least one user (with_user(name, password))",
                    self.mechanisms
                ));
            }
            if self.mechanisms.contains(&SaslMechanism::OAuthBearer) && self.token_issuer.is_none()
            {
                return bad("OAUTHBEARER needs a token issuer (with_token_issuer)".into());
            }
        }
        if let Some((name, _)) = self.users.iter().find(|(n, _)| n.is_empty()) {
            return bad(format!("user name '{name}' is empty"));
        }
        if self.admin.is_none() && self.partition_capacity.is_some() {
            return bad(
                "partition growth needs the admin emulation (with_admin_emulation), which answers CreatePartitions".into(),
            );
        }
        if let Some(capacity) = self.partition_capacity.filter(|c| *c < 1) {
            return bad(format!("partition capacity {capacity} must be at least 1"));
        }
        if self.admin.is_none() && !self.denied_operations.is_empty() {
            return bad(format!(
                "denied operations {:?} need the admin emulation (with_admin_emulation)",
                self.denied_operations
            ));
        }
        Ok(())
    }
}

/// Why a proxy could not start or a control was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("invalid proxy options: {0}")]
    Options(String),
    #[error("cannot learn the brokers from the upstream bootstrap {bootstrap}: {reason}")]
    Upstream { bootstrap: String, reason: String },
    #[error("cannot bind a proxy listener on 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("cannot make the test certificates: {0}")]
    Pki(String),
    #[error("cannot configure TLS: {0}")]
    Tls(String),
    #[error("cannot start the proxy's runtime: {0}")]
    Runtime(String),
    #[error("unsupported fault: {0}")]
    UnsupportedFault(String),
}

/// A running proxy. It owns a thread with its own tokio runtime, so sync and async tests can
/// start it; dropping it closes the listeners and every connection and removes its PEM files.
pub struct KafkaProxy {
    bootstrap: String,
    listeners: Vec<(i32, SocketAddr)>,
    security: ProxySecurity,
    pki: Option<TestPki>,
    shared: Arc<Shared>,
    /// The group id registry, when the proxy emulates Kafka's one namespace.
    groups: Option<Arc<GroupNamespace>>,
    admin: Option<Arc<AdminEmulation>>,
    growth: Option<Arc<PartitionGrowth>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for KafkaProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaProxy")
            .field("bootstrap", &self.bootstrap)
            .field("security", &self.security)
            .finish_non_exhaustive()
    }
}

impl KafkaProxy {
    /// Starts a proxy in front of the cluster reachable at `upstream_bootstrap`.
    pub fn start(
        upstream_bootstrap: &str,
        options: ProxyOptions,
    ) -> Result<KafkaProxy, ProxyError> {
        options.validate()?;
        let pki = if options.security.uses_tls() {
            Some(TestPki::generate()?)
        } else {
            None
        };
        let tls = match &pki {
            Some(pki) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                pki.server_config(options.require_client_certificate)?,
            ))),
            None => None,
        };
        let sasl = options.security.uses_sasl().then(|| SaslConfig {
            mechanisms: options.mechanisms.clone(),
            users: Arc::new(options.users.iter().cloned().collect()),
            token_issuer: options.token_issuer.clone(),
        });
        let kafka42 = options.kafka42_coordinator;
        let groups = options
            .one_group_namespace
            .then(|| Arc::new(GroupNamespace::default()));
        let proxy_groups = groups.clone();
        let share_sessions = options
            .kafka_share_sessions
            .then(|| Arc::new(share_sessions::ShareSessions::default()));
        let uses_sasl = options.security.uses_sasl();
        let admin_options = options.admin.clone();
        let denied = options.denied_operations.clone();
        let growth = options
            .partition_capacity
            .map(|capacity| Arc::new(PartitionGrowth::new(capacity)));
        let proxy_growth = growth.clone();
        let upstream = upstream_bootstrap.to_string();
        let (ready, ready_rx) = std::sync::mpsc::channel::<Result<Started, ProxyError>>();
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        // Everything async runs on the proxy's own thread, so `start` works from sync code and
        // from inside another runtime alike.
        let thread = std::thread::Builder::new()
            .name("kafka-proxy".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("kafka-proxy")
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready.send(Err(ProxyError::Runtime(e.to_string())));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let emulating = admin_options.is_some();
                    let answers_locally = emulating || groups.is_some();
                    let (bound, upstream_versions) = match bind(&upstream, answers_locally).await {
                        Ok(bound) => bound,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let mut endpoints = HashMap::new();
                    let mut upstream_of = HashMap::new();
                    let mut addresses = Vec::new();
                    for (node, address, local, _) in &bound {
                        endpoints.insert(*node, ("127.0.0.1".to_string(), local.port()));
                        upstream_of.insert(*node, address.clone());
                        addresses.push((*node, *local));
                    }
                    let faults = ProxyFaults::default();
                    let mut rewriter = Rewriter::new(endpoints, uses_sasl, kafka42, faults.clone());
                    rewriter.name_controller = emulating;
                    rewriter.growth = growth.clone();
                    let mut local = LocalApis::new(upstream_versions.clone(), uses_sasl);
                    let admin = admin_options.map(|options| {
                        // Its Metadata lookups go to the lowest-numbered broker.
                        let first = upstream_of
                            .iter()
                            .min_by_key(|(node, _)| **node)
                            .map(|(_, address)| address.clone())
                            .unwrap_or_default();
                        let versions = upstream_versions.unwrap_or_default();
                        Arc::new(AdminEmulation::new(
                            options,
                            denied,
                            first,
                            &versions,
                            growth.clone(),
                        ))
                    });
                    // Emulated APIs register here, one line each (keyed by API key); while any
                    // is registered the proxy answers ApiVersions itself, which needs
                    // `upstream_versions` (fetched when `emulating` or `groups`).
                    if let Some(admin) = &admin {
                        local.register(Arc::new(Arc::clone(admin)));
                    }
                    if let Some(groups) = &groups {
                        local.register(Arc::clone(groups) as Arc<dyn local::LocalApi>);
                    }
                    let shared = Arc::new(
                        Shared::new(upstream_of, tls, sasl, rewriter, faults, local)
                            .with_groups(groups)
                            .with_share_sessions(share_sessions),
                    );
                    for (node, _, _, listener) in bound {
                        tokio::spawn(connection::accept_loop(listener, node, Arc::clone(&shared)));
                    }
                    let _ = ready.send(Ok((addresses, shared, admin)));
                    let _ = shutdown_rx.await;
                });
                // Ends every listener and connection task.
                runtime.shutdown_timeout(Duration::from_secs(2));
            })
            .map_err(|e| ProxyError::Runtime(e.to_string()))?;
        let (addresses, shared, admin) = match ready_rx.recv() {
            Ok(Ok(started)) => started,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ProxyError::Runtime(
                    "the proxy thread ended while starting".into(),
                ));
            }
        };
        let bootstrap = addresses
            .iter()
            .map(|(_, a)| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        Ok(KafkaProxy {
            bootstrap,
            listeners: addresses,
            security: options.security,
            pki,
            shared,
            groups: proxy_groups,
            admin,
            growth: proxy_growth,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,...`, one listener per broker.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The proxy listener standing for broker `node`.
    pub fn listener(&self, node: i32) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, a)| *a)
    }

    pub fn security(&self) -> ProxySecurity {
        self.security
    }

    /// The test certificates; `Some` when TLS is on.
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_ref()
    }

    pub fn faults(&self) -> &ProxyFaults {
        &self.shared.faults
    }

    /// The group ids and types the proxy learned (`with_one_group_namespace()`).
    pub fn groups(&self) -> Option<&GroupNamespace> {
        self.groups.as_deref()
    }

    /// The admin emulation's state and controls; `Some` with `with_admin_emulation`.
    pub fn admin(&self) -> Option<&AdminEmulation> {
        self.admin.as_deref()
    }

    /// The visible partition counts; `Some` with `with_partition_growth`.
    pub fn partition_growth(&self) -> Option<&PartitionGrowth> {
        self.growth.as_deref()
    }

    /// Connections the proxy opened to the dev broker on behalf of clients: one per client
    /// connection, at its first forwarded request (the admin emulation's own Metadata connection
    /// is counted by `AdminEmulation::metadata_connections_opened`).
    pub fn upstream_connections_opened(&self) -> u64 {
        self.shared
            .upstream_opened
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// With `with_kafka_share_sessions`: the clients' epoch-0 ShareFetches that continued the
    /// member's dev-broker session instead of replacing it.
    pub fn share_sessions_continued(&self) -> u64 {
        self.shared
            .share_sessions
            .as_ref()
            .map_or(0, |s| s.continued())
    }

    /// Requests with `api_key` the proxy received from clients (answered by it or forwarded).
    pub fn request_count(&self, api_key: i16) -> u64 {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&api_key)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for KafkaProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

type Started = (
    Vec<(i32, SocketAddr)>,
    Arc<Shared>,
    Option<Arc<AdminEmulation>>,
);

type Bound = (
    Vec<(i32, String, SocketAddr, TcpListener)>,
    Option<Vec<ApiVersion>>,
);

/// Learns the brokers and binds one listener for each: (node, broker address, listener address);
/// with `api_versions`, also the brokers' ApiVersions list.
async fn bind(upstream: &str, api_versions: bool) -> Result<Bound, ProxyError> {
    let mut bound = Vec::new();
    let (brokers, versions) = learn_brokers(upstream, api_versions).await?;
    for (node, address) in brokers {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ProxyError::Bind)?;
        let local = listener.local_addr().map_err(ProxyError::Bind)?;
        bound.push((node, address, local, listener));
    }
    Ok((bound, versions))
}

type Learned = (Vec<(i32, String)>, Option<Vec<ApiVersion>>);

/// Asks the upstream cluster for its brokers: (node id, host:port), and with `api_versions` for
/// its ApiVersions list too (on the same connection).
async fn learn_brokers(bootstrap: &str, api_versions: bool) -> Result<Learned, ProxyError> {
    let fail = |reason: String| ProxyError::Upstream {
        bootstrap: bootstrap.to_string(),
        reason,
    };
    let mut last = String::from("no address in the bootstrap list");
    for address in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match metadata(address, api_versions).await {
            Ok((brokers, versions)) if !brokers.is_empty() => return Ok((brokers, versions)),
            Ok(_) => last = format!("{address} named no brokers"),
            Err(e) => last = format!("{address}: {e}"),
        }
    }
    Err(fail(last))
}

async fn metadata(address: &str, api_versions: bool) -> Result<Learned, String> {
    const VERSION: i16 = 4;
    // v0 is what every broker answers; its list is the same.
    const API_VERSIONS_VERSION: i16 = 0;
    let mut stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(address))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let mut header = RequestHeader::default();
    header.request_api_key = rewrite::METADATA;
    header.request_api_version = VERSION;
    header.correlation_id = 1;
    header.client_id = Some(StrBytes::from_static_str("spillway-kafka-proxy"));
    let mut request = MetadataRequest::default();
    request.topics = Some(Vec::new());
    let frame = frame::encode_request(&header, &request, VERSION)?;
    let exchange = async {
        frame::write_frame(&mut stream, &frame)
            .await
            .map_err(|e| format!("send Metadata: {e}"))?;
        frame::read_frame(&mut stream)
            .await
            .map_err(|e| format!("read Metadata: {e}"))?
            .ok_or_else(|| "closed before answering Metadata".to_string())
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "Metadata got no answer within 10s".to_string())??;
    let (_, response) = frame::decode_response::<MetadataResponse>(&reply, VERSION)?;
    let brokers = response
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    if !api_versions {
        return Ok((brokers, None));
    }
    let mut header = RequestHeader::default();
    header.request_api_key = rewrite::API_VERSIONS;
    header.request_api_version = API_VERSIONS_VERSION;
    header.correlation_id = 2;
    header.client_id = Some(StrBytes::from_static_str("spillway-kafka-proxy"));
    let request = ApiVersionsRequest::default();
    let frame = frame::encode_request(&header, &request, API_VERSIONS_VERSION)?;
    let exchange = async {
        frame::write_frame(&mut stream, &frame)
            .await
            .map_err(|e| format!("send ApiVersions: {e}"))?;
        frame::read_frame(&mut stream)
            .await
            .map_err(|e| format!("read ApiVersions: {e}"))?
            .ok_or_else(|| "closed before answering ApiVersions".to_string())
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "ApiVersions got no answer within 10s".to_string())??;
    let (_, response) =
        frame::decode_response::<ApiVersionsResponse>(&reply, API_VERSIONS_VERSION)?;
    if response.error_code != 0 {
        return Err(format!(
            "ApiVersions v{API_VERSIONS_VERSION} answered error {}",
            response.error_code
        ));
    }
    Ok((brokers, Some(response.api_keys)))
}
