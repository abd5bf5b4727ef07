//! What the store keeps, as plain serde types. Records are JSON so a field added later with
//! `#[serde(default)]` reads old stores without a format change; a change that old code could
//! not read raises [`FORMAT_VERSION`](crate::FORMAT_VERSION) instead.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::StorageError;

/// Which connector: names are unique per tenant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectorKey {
    pub tenant: String,
    pub name: String,
}

impl ConnectorKey {
    pub fn new(tenant: impl Into<String>, name: impl Into<String>) -> Self {
        ConnectorKey {
            tenant: tenant.into(),
            name: name.into(),
        }
    }

    /// `tenant NUL name`: keys of one tenant sort together, and neither part may hold a NUL
    /// (names with control characters are refused by config validation anyway).
    pub(crate) fn encode(&self) -> Result<Vec<u8>, StorageError> {
        let mut bytes = tenant_prefix(&self.tenant)?;
        check_name("connector", &self.name)?;
        bytes.extend_from_slice(self.name.as_bytes());
        Ok(bytes)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<ConnectorKey> {
        let split = bytes.iter().position(|b| *b == 0)?;
        let tenant = std::str::from_utf8(&bytes[..split]).ok()?;
        let name = std::str::from_utf8(&bytes[split + 1..]).ok()?;
        Some(ConnectorKey::new(tenant, name))
    }

    /// The prefix of this connector's task keys.
    pub(crate) fn task_prefix(&self) -> Result<Vec<u8>, StorageError> {
        let mut bytes = self.encode()?;
        bytes.push(0);
        Ok(bytes)
    }
}

impl std::fmt::Display for ConnectorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.name)
    }
}

pub(crate) fn tenant_prefix(tenant: &str) -> Result<Vec<u8>, StorageError> {
    check_name("tenant", tenant)?;
    let mut bytes = tenant.as_bytes().to_vec();
    bytes.push(0);
    Ok(bytes)
}

fn check_name(kind: &'static str, name: &str) -> Result<(), StorageError> {
    if name.is_empty() || name.contains('\0') {
        return Err(StorageError::InvalidName {
            kind,
            name: name.escape_debug().to_string(),
        });
    }
    Ok(())
}

/// The state a connector should be in, whatever it is in now (Connect's target state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TargetState {
    Running,
    /// Tasks stopped, configuration kept; resumed by `resume`.
    Paused,
    /// Connector and tasks shut down (KIP-875); resumed by `resume`.
    Stopped,
}

impl TargetState {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetState::Running => "RUNNING",
            TargetState::Paused => "PAUSED",
            TargetState::Stopped => "STOPPED",
        }
    }
}

impl std::fmt::Display for TargetState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TargetState {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_uppercase().as_str() {
            "RUNNING" => Ok(TargetState::Running),
            "PAUSED" => Ok(TargetState::Paused),
            "STOPPED" => Ok(TargetState::Stopped),
            _ => Err(format!(
                "unknown target state '{text}'; expected one of RUNNING, PAUSED, STOPPED"
            )),
        }
    }
}

/// One connector as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectorRecord {
    /// The configuration as the user gave it (secrets included: the store is the worker's
    /// own, like Connect's config topic).
    pub config: BTreeMap<String, String>,
    pub target_state: TargetState,
    /// Restarts asked for over the REST API since the connector was created.
    #[serde(default)]
    pub restarts: u32,
}

impl ConnectorRecord {
    pub fn new(config: BTreeMap<String, String>, target_state: TargetState) -> Self {
        ConnectorRecord {
            config,
            target_state,
            restarts: 0,
        }
    }
}

/// A task's last known status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Connect's state name (RUNNING, FAILED, ...).
    pub state: String,
    /// The error that failed the task, when it failed.
    #[serde(default)]
    pub trace: Option<String>,
    /// Restarts of the task (by the runtime after failures, or asked for over REST).
    #[serde(default)]
    pub restarts: u32,
}

/// A tenant: owner of connectors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub name: String,
    /// The tenant's settings (token digest, quotas), as text so that a new setting needs no
    /// change of format.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}
