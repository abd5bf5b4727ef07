//! Kafka's admin API, spoken natively on the [`Cluster`] layer (the same connections, TLS and
//! SASL as the share consumer).
//!
//! Native rather than rdkafka's admin client because rdkafka 0.39 has neither
//! IncrementalAlterConfigs nor the share-group offsets APIs (KIP-932), which Spillway needs for
//! share-group settings and the offsets REST API.
//!
//! Requests go where Kafka 4.2's `KafkaAdminClient` sends them: config requests for groups,
//! topics and the cluster-wide broker defaults, and CreateTopics, to any broker; a config
//! request for one broker to that broker; the share-group offsets APIs to the group's
//! coordinator.
//!
//! One client serves every connector of a worker that reaches the same cluster with the same
//! security settings ([`AdminClients`]): its connections stay open for the worker's life. That is
//! good manners, and the development broker needs it (closing any connection to it ends every
//! share session on that broker).
//!
//! Errors are typed so that callers can tell the cases apart: the broker lacks the API
//! ([`AdminError::Unsupported`]), the principal lacks a permission
//! ([`AdminError::Authorization`], naming the operation, the permission and the resource), or
//! Kafka refused one resource ([`AdminError::Resource`], with Kafka's message).

mod configs;
mod consumer_offsets;
mod share_offsets;
mod topics;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;

use crate::cluster::{Cluster, ClusterError};
use crate::connection::{Connection, ConnectionError};
use crate::error_name;
use crate::security::{ClientSecurity, SecuritySettings};

pub use configs::{
    AlterOp, ConfigEntry, ConfigResource, ConfigSource, ResourceConfigs, GROUP_CONFIG_SOURCE,
};
pub use consumer_offsets::CommittedOffset;
pub use share_offsets::{ShareOffsets, SharePartitionOffset};
pub use topics::{NewTopic, TopicCreation};

/// Error codes the admin client tells apart.
pub mod codes {
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const GROUP_NOT_EMPTY: i16 = 68;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
}

/// What an admin request can fail with.
#[derive(Debug, Error)]
pub enum AdminError {
    /// The cluster could not be reached or the connection failed.
    #[error("{operation}: {source}")]
    Cluster {
        operation: String,
        #[source]
        source: ClusterError,
    },
    /// The broker does not offer the API (or no version Spillway speaks): an older Kafka, or
    /// a broker without the admin APIs.
    #[error("{operation}: the broker at {broker} does not support {api} ({detail})")]
    Unsupported {
        operation: String,
        api: &'static str,
        broker: String,
        detail: String,
    },
    /// The principal lacks a permission (Kafka's *_AUTHORIZATION_FAILED).
    #[error("{operation} was refused: it needs the {permission} permission on {resource} ({code_name}{message})")]
    Authorization {
        operation: String,
        permission: &'static str,
        resource: String,
        code_name: String,
        message: String,
    },
    /// The client's security settings cannot be used (a file that cannot be read).
    #[error("the admin client for {bootstrap} cannot be set up: {message}")]
    Setup { bootstrap: String, message: String },
    /// Kafka refused the request for one resource, with its error code and message.
    #[error("{}", resource_refusal(operation, resource, code_name, *code, message))]
    Resource {
        operation: String,
        resource: String,
        code: i16,
        code_name: String,
        message: String,
    },
}

/// "`operation` failed[ for `resource`]: `code_name` (`code`)`message`", naming the resource
/// only when the operation does not already.
fn resource_refusal(
    operation: &str,
    resource: &str,
    code_name: &str,
    code: i16,
    message: &str,
) -> String {
    let what = if operation.contains(resource) {
        String::new()
    } else {
        format!(" for {resource}")
    };
    format!("{operation} failed{what}: {code_name} ({code}){message}")
}

impl AdminError {
    /// Whether the broker lacks the API: the caller may fall back to older behaviour.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, AdminError::Unsupported { .. })
    }

    /// Whether a permission is missing.
    pub fn is_authorization(&self) -> bool {
        matches!(self, AdminError::Authorization { .. })
    }

    /// Kafka's error code for a refused resource.
    pub fn code(&self) -> Option<i16> {
        match self {
            AdminError::Resource { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn cluster(operation: &str, api: &'static str, source: ClusterError) -> AdminError {
        match source {
            ClusterError::Connection(e) => AdminError::connection(operation, api, e),
            source => AdminError::Cluster {
                operation: operation.to_owned(),
                source,
            },
        }
    }

    fn connection(operation: &str, api: &'static str, e: ConnectionError) -> AdminError {
        match e {
            ConnectionError::UnsupportedApi { addr, .. } => AdminError::Unsupported {
                operation: operation.to_owned(),
                api,
                broker: addr,
                detail: "the API is not in its ApiVersions answer".to_owned(),
            },
            ConnectionError::NoCommonVersion {
                addr,
                our_min,
                our_max,
                broker_min,
                broker_max,
                ..
            } => AdminError::Unsupported {
                operation: operation.to_owned(),
                api,
                broker: addr,
                detail: format!(
                    "it offers versions {broker_min}..={broker_max}, Spillway speaks {our_min}..={our_max}"
                ),
            },
            e => AdminError::Cluster {
                operation: operation.to_owned(),
                source: ClusterError::Connection(e),
            },
        }
    }

    /// The error for a non-zero `code` Kafka returned for `resource`; `permission` is what an
    /// authorization failure of this request means.
    pub(crate) fn from_code(
        operation: &str,
        resource: &str,
        code: i16,
        message: Option<&str>,
        permission: &'static str,
    ) -> AdminError {
        let message = message
            .filter(|m| !m.trim().is_empty())
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        match code {
            codes::TOPIC_AUTHORIZATION_FAILED
            | codes::GROUP_AUTHORIZATION_FAILED
            | codes::CLUSTER_AUTHORIZATION_FAILED => AdminError::Authorization {
                operation: operation.to_owned(),
                permission,
                resource: match code {
                    // The cluster resource is what was refused, whatever was asked about.
                    codes::CLUSTER_AUTHORIZATION_FAILED => "the cluster".to_owned(),
                    _ => resource.to_owned(),
                },
                code_name: error_name(code),
                message,
            },
            _ => AdminError::Resource {
                operation: operation.to_owned(),
                resource: resource.to_owned(),
                code,
                code_name: error_name(code),
                message,
            },
        }
    }
}

/// A Kafka admin client: configs, topics, share-group offsets.
pub struct AdminClient {
    cluster: Arc<Cluster>,
    timeout: Duration,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient").finish_non_exhaustive()
    }
}

/// Retries when the coordinator moved or is loading (Kafka's admin client retries these too).
const COORDINATOR_ATTEMPTS: u32 = 5;
const COORDINATOR_BACKOFF: Duration = Duration::from_millis(200);

impl AdminClient {
    /// Contact the cluster at `bootstrap` as `security` says.
    pub async fn connect(
        bootstrap: &str,
        client_id: &str,
        timeout: Duration,
        security: ClientSecurity,
    ) -> Result<AdminClient, AdminError> {
        let cluster = Cluster::connect_secured(bootstrap, client_id, timeout, security)
            .await
            .map_err(|source| AdminError::Cluster {
                operation: format!("connecting the admin client to {bootstrap}"),
                source,
            })?;
        Ok(AdminClient::from_cluster(cluster))
    }

    /// An admin client on an existing cluster view.
    pub fn from_cluster(cluster: Arc<Cluster>) -> AdminClient {
        let timeout = cluster.request_timeout();
        AdminClient { cluster, timeout }
    }

    /// The cluster view the client talks through (its connections stay open).
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The ids of the cluster's brokers (for DescribeConfigs of one broker), lowest first.
    pub fn broker_ids(&self) -> Vec<i32> {
        self.cluster.broker_ids()
    }

    /// Any broker (Kafka's "least loaded node"): a connection already open when there is one.
    async fn any_broker(
        &self,
        operation: &str,
        api: &'static str,
    ) -> Result<Arc<Connection>, AdminError> {
        self.cluster
            .any_connection()
            .await
            .map_err(|e| AdminError::cluster(operation, api, e))
    }

    /// The broker with id `id`, learning the cluster's brokers first when it is not known.
    async fn broker(
        &self,
        id: i32,
        operation: &str,
        api: &'static str,
    ) -> Result<Arc<Connection>, AdminError> {
        match self.cluster.broker(id).await {
            Err(ClusterError::UnknownBroker { .. }) => {
                self.cluster
                    .refresh_metadata(&[])
                    .await
                    .map_err(|e| AdminError::cluster(operation, api, e))?;
                self.cluster.broker(id).await
            }
            other => other,
        }
        .map_err(|e| AdminError::cluster(operation, api, e))
    }

    /// The coordinator of `group`.
    async fn coordinator(
        &self,
        group: &str,
        operation: &str,
        api: &'static str,
    ) -> Result<Arc<Connection>, AdminError> {
        let id = self
            .cluster
            .find_coordinator(group)
            .await
            .map_err(|e| AdminError::cluster(operation, api, e))?;
        self.cluster
            .broker(id)
            .await
            .map_err(|e| AdminError::cluster(operation, api, e))
    }

    /// Run `call` against the coordinator of `group`, again (after finding the coordinator
    /// anew) while the answer says the coordinator moved or is not ready.
    async fn with_coordinator<T, F, Fut>(
        &self,
        group: &str,
        operation: &str,
        api: &'static str,
        call: F,
    ) -> Result<T, AdminError>
    where
        F: Fn(Arc<Connection>) -> Fut,
        Fut: std::future::Future<Output = Result<T, AdminError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let conn = self.coordinator(group, operation, api).await?;
            match call(conn).await {
                Err(e)
                    if attempt < COORDINATOR_ATTEMPTS
                        && matches!(
                            e.code(),
                            Some(
                                codes::NOT_COORDINATOR
                                    | codes::COORDINATOR_NOT_AVAILABLE
                                    | codes::COORDINATOR_LOAD_IN_PROGRESS
                            )
                        ) =>
                {
                    tokio::time::sleep(COORDINATOR_BACKOFF * attempt).await;
                }
                other => return other,
            }
        }
    }

    /// Send `request` on `conn` with the highest version both sides speak.
    async fn send<R: kafka_protocol::protocol::Request>(
        &self,
        conn: &Connection,
        request: &R,
        versions: (i16, i16),
        operation: &str,
        api: &'static str,
    ) -> Result<R::Response, AdminError> {
        let (response, _) = conn
            .request_in_range(request, versions.0, versions.1, self.timeout)
            .await
            .map_err(|e| AdminError::connection(operation, api, e))?;
        Ok(response)
    }
}

/// The worker's admin clients: one per cluster and security setting, shared by every connector
/// that reaches that cluster so, and kept open for the worker's life.
#[derive(Default)]
pub struct AdminClients {
    clients: tokio::sync::Mutex<Vec<(String, SecuritySettings, Arc<AdminClient>)>>,
    /// Connection attempts in flight are serialised by the mutex above; this counts the clients
    /// made, for tests.
    made: Mutex<usize>,
}

impl std::fmt::Debug for AdminClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClients").finish_non_exhaustive()
    }
}

impl AdminClients {
    /// The client for `bootstrap` with `security`, connected on first use.
    pub async fn get(
        &self,
        bootstrap: &str,
        security: &SecuritySettings,
        timeout: Duration,
    ) -> Result<Arc<AdminClient>, AdminError> {
        let mut clients = self.clients.lock().await;
        if let Some((_, _, client)) = clients
            .iter()
            .find(|(b, s, _)| b == bootstrap && s == security)
        {
            return Ok(Arc::clone(client));
        }
        let client_security = security.client_security().map_err(|e| AdminError::Setup {
            bootstrap: bootstrap.to_owned(),
            message: e.to_string(),
        })?;
        let client = Arc::new(
            AdminClient::connect(bootstrap, "spillway-admin", timeout, client_security).await?,
        );
        clients.push((bootstrap.to_owned(), security.clone(), Arc::clone(&client)));
        *self.made.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Ok(client)
    }

    /// How many clients were made so far.
    pub fn made(&self) -> usize {
        *self.made.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;
