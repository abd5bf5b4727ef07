//! DescribeConfigs and IncrementalAlterConfigs for groups, brokers and topics.

use std::collections::BTreeMap;
use std::fmt;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{DescribeConfigsRequest, IncrementalAlterConfigsRequest};
use kafka_protocol::protocol::StrBytes;

use super::{AdminClient, AdminError};

const DESCRIBE_CONFIGS: &str = "DescribeConfigs";
const INCREMENTAL_ALTER_CONFIGS: &str = "IncrementalAlterConfigs";
/// v4 adds the config type and documentation; v1 is the oldest the crate speaks.
const DESCRIBE_CONFIGS_VERSIONS: (i16, i16) = (1, 4);
const INCREMENTAL_ALTER_CONFIGS_VERSIONS: (i16, i16) = (0, 1);

/// `configSource` of a value set on the group itself (Kafka's `DYNAMIC_GROUP_CONFIG`).
pub const GROUP_CONFIG_SOURCE: i8 = 8;

/// A resource whose configs are read or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigResource {
    /// A group's dynamic configs (Kafka 4.0+), e.g. `share.auto.offset.reset`.
    Group(String),
    /// One broker's configs (`Some(id)`, asked of that broker) or the cluster-wide broker
    /// defaults (`None`).
    Broker(Option<i32>),
    Topic(String),
}

impl ConfigResource {
    fn resource_type(&self) -> i8 {
        match self {
            ConfigResource::Topic(_) => 2,
            ConfigResource::Broker(_) => 4,
            ConfigResource::Group(_) => 32,
        }
    }

    fn resource_name(&self) -> String {
        match self {
            ConfigResource::Group(name) | ConfigResource::Topic(name) => name.clone(),
            ConfigResource::Broker(Some(id)) => id.to_string(),
            ConfigResource::Broker(None) => String::new(),
        }
    }
}

impl fmt::Display for ConfigResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigResource::Group(name) => write!(f, "group '{name}'"),
            ConfigResource::Topic(name) => write!(f, "topic '{name}'"),
            ConfigResource::Broker(Some(id)) => write!(f, "broker {id}"),
            ConfigResource::Broker(None) => f.write_str("the cluster's broker defaults"),
        }
    }
}

/// Where a config value comes from (Kafka's `ConfigSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// Set on the group itself.
    Group,
    /// Set on the topic itself.
    Topic,
    /// Set dynamically for one broker.
    DynamicBroker,
    /// Set dynamically as the cluster-wide broker default.
    DynamicDefaultBroker,
    /// From a broker's `server.properties`.
    StaticBroker,
    /// Kafka's built-in default.
    Default,
    /// Anything else (loggers, client metrics, unknown).
    Other(i8),
}

impl ConfigSource {
    fn from_id(id: i8) -> ConfigSource {
        match id {
            1 => ConfigSource::Topic,
            2 => ConfigSource::DynamicBroker,
            3 => ConfigSource::DynamicDefaultBroker,
            4 => ConfigSource::StaticBroker,
            5 => ConfigSource::Default,
            GROUP_CONFIG_SOURCE => ConfigSource::Group,
            other => ConfigSource::Other(other),
        }
    }

    /// Where the value comes from, for messages.
    pub fn describe(self) -> String {
        match self {
            ConfigSource::Group => "set on the group".to_owned(),
            ConfigSource::Topic => "set on the topic".to_owned(),
            ConfigSource::DynamicBroker => "set dynamically on the broker".to_owned(),
            ConfigSource::DynamicDefaultBroker => {
                "set dynamically as the cluster's broker default".to_owned()
            }
            ConfigSource::StaticBroker => "from the broker's server.properties".to_owned(),
            ConfigSource::Default => "Kafka's default".to_owned(),
            ConfigSource::Other(id) => format!("config source {id}"),
        }
    }
}

/// One config value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: String,
    /// `None` for a sensitive value or one that is not set.
    pub value: Option<String>,
    pub source: ConfigSource,
    pub read_only: bool,
}

/// The configs of one resource, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceConfigs {
    pub entries: BTreeMap<String, ConfigEntry>,
}

impl ResourceConfigs {
    pub fn get(&self, name: &str) -> Option<&ConfigEntry> {
        self.entries.get(name)
    }
}

/// One change of IncrementalAlterConfigs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterOp {
    /// Set the value on the resource.
    Set(String),
    /// Remove the resource's own value (its default applies again).
    Delete,
}

impl AlterOp {
    fn code(&self) -> i8 {
        match self {
            AlterOp::Set(_) => 0,
            AlterOp::Delete => 1,
        }
    }
}

impl AdminClient {
    /// The configs of `resource`, all of them when `keys` is empty. Group, topic and
    /// cluster-default requests go to any broker, a broker's to that broker (as Kafka's
    /// admin client routes them).
    pub async fn describe_configs(
        &self,
        resource: &ConfigResource,
        keys: &[&str],
    ) -> Result<ResourceConfigs, AdminError> {
        let operation = format!("reading the configs of {resource}");
        let conn = match resource {
            ConfigResource::Broker(Some(id)) => {
                self.broker(*id, &operation, DESCRIBE_CONFIGS).await?
            }
            _ => self.any_broker(&operation, DESCRIBE_CONFIGS).await?,
        };
        let mut wanted = DescribeConfigsResource::default();
        wanted.resource_type = resource.resource_type();
        wanted.resource_name = StrBytes::from_string(resource.resource_name());
        wanted.configuration_keys = (!keys.is_empty()).then(|| {
            keys.iter()
                .map(|k| StrBytes::from_string((*k).to_owned()))
                .collect()
        });
        let mut request = DescribeConfigsRequest::default();
        request.resources = vec![wanted];
        let response = self
            .send(
                &conn,
                &request,
                DESCRIBE_CONFIGS_VERSIONS,
                &operation,
                DESCRIBE_CONFIGS,
            )
            .await?;
        let result = response
            .results
            .into_iter()
            .find(|r| r.resource_type == resource.resource_type())
            .ok_or_else(|| AdminError::Resource {
                operation: operation.clone(),
                resource: resource.to_string(),
                code: -1,
                code_name: "UnknownServerError".to_owned(),
                message: ": the answer has no result for the resource".to_owned(),
            })?;
        if result.error_code != 0 {
            return Err(AdminError::from_code(
                &operation,
                &resource.to_string(),
                result.error_code,
                result.error_message.as_deref(),
                "DESCRIBE_CONFIGS",
            ));
        }
        let entries = result
            .configs
            .into_iter()
            .map(|c| {
                let name = c.name.to_string();
                let entry = ConfigEntry {
                    name: name.clone(),
                    value: c.value.map(|v| v.to_string()),
                    source: ConfigSource::from_id(c.config_source),
                    read_only: c.read_only,
                };
                (name, entry)
            })
            .collect();
        Ok(ResourceConfigs { entries })
    }

    /// Change configs of `resource` one by one (what is not named keeps its value). Group,
    /// topic and cluster-default changes go to any broker (which forwards them to the
    /// controller), a broker's to that broker.
    pub async fn incremental_alter_configs(
        &self,
        resource: &ConfigResource,
        changes: &[(&str, AlterOp)],
    ) -> Result<(), AdminError> {
        let operation = format!("changing the configs of {resource}");
        let conn = match resource {
            ConfigResource::Broker(Some(id)) => {
                self.broker(*id, &operation, INCREMENTAL_ALTER_CONFIGS)
                    .await?
            }
            _ => {
                self.any_broker(&operation, INCREMENTAL_ALTER_CONFIGS)
                    .await?
            }
        };
        let mut alter = AlterConfigsResource::default();
        alter.resource_type = resource.resource_type();
        alter.resource_name = StrBytes::from_string(resource.resource_name());
        alter.configs = changes
            .iter()
            .map(|(name, op)| {
                let mut config = AlterableConfig::default();
                config.name = StrBytes::from_string((*name).to_owned());
                config.config_operation = op.code();
                config.value = match op {
                    AlterOp::Set(v) => Some(StrBytes::from_string(v.clone())),
                    AlterOp::Delete => None,
                };
                config
            })
            .collect();
        let mut request = IncrementalAlterConfigsRequest::default();
        request.resources = vec![alter];
        let response = self
            .send(
                &conn,
                &request,
                INCREMENTAL_ALTER_CONFIGS_VERSIONS,
                &operation,
                INCREMENTAL_ALTER_CONFIGS,
            )
            .await?;
        match response
            .responses
            .iter()
            .find(|r| r.resource_type == resource.resource_type())
        {
            None => Err(AdminError::Resource {
                operation,
                resource: resource.to_string(),
                code: -1,
                code_name: "UnknownServerError".to_owned(),
                message: ": the answer has no result for the resource".to_owned(),
            }),
            Some(r) if r.error_code != 0 => Err(AdminError::from_code(
                &operation,
                &resource.to_string(),
                r.error_code,
                r.error_message.as_deref(),
                "ALTER_CONFIGS",
            )),
            Some(_) => Ok(()),
        }
    }
}
