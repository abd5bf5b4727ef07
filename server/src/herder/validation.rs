//! The checks a configuration passes before it is stored: the plugin's and the runtime's
//! definitions, the tenant's override policy, the worker's start checks, and group ids that
//! clash with another connector's group of the other type.

use spillway_actors::settings::runtime_config_def;
use spillway_actors::RuntimeError;
use spillway_core::config::{
    resolve_group_protocol, sink_connector::CONNECTOR_CLASS, validate_sink_connector, ConfigDef,
    ConfigKey, ConfigType, Importance, SinkConnectorConfig, ValidationReport,
};
use spillway_core::{ConfigError, ConfigMap};

use super::{Herder, HerderError, DEFAULT_TENANT};
use crate::mirror::connectors::{plan, MirrorConnector};
use crate::secrets;

/// The keys a MirrorMaker 2 connector's `validate` answer lists (the others are checked as the
/// flow reads them).
fn mirror_report(connector: MirrorConnector, config: &ConfigMap) -> ValidationReport {
    let key = |name: &str, doc: &str| {
        ConfigKey::new(name, ConfigType::String, Importance::High, doc).null_default()
    };
    let def = ConfigDef::new()
        .define(key(CONNECTOR_CLASS, "MM2's connector class"))
        .define(key("name", "The connector's name"))
        .define(key(
            "source.cluster.alias",
            "The cluster records are copied from",
        ))
        .define(
            ConfigKey::new(
                "target.cluster.alias",
                ConfigType::String,
                Importance::High,
                "The cluster records are copied to",
            )
            .default("target"),
        )
        .define(key(
            "source.cluster.bootstrap.servers",
            "The source cluster's bootstrap servers",
        ))
        .define(key(
            "target.cluster.bootstrap.servers",
            "The target cluster's bootstrap servers",
        ));
    ValidationReport::new(connector.class(), def.validate(config))
}

impl Herder {
    pub(super) fn group_of_config(
        &self,
        tenant: &str,
        name: &str,
        config: &ConfigMap,
    ) -> Result<(SinkConnectorConfig, bool, String, String), HerderError> {
        let refused = |source: ConfigError| RuntimeError::Config {
            connector: name.to_owned(),
            source,
        };
        let parsed = SinkConnectorConfig::parse(config).map_err(refused)?;
        let protocol = resolve_group_protocol(config, &self.worker_config).map_err(refused)?;
        let group = self
            .tenants
            .scope(tenant)
            .group_id(&parsed, protocol.protocol);
        let bootstrap = parsed
            .consumer_overrides
            .get("bootstrap.servers")
            .or_else(|| self.worker_config.get("bootstrap.servers"))
            .cloned()
            .unwrap_or_default();
        Ok((parsed, protocol.protocol.is_share(), group, bootstrap))
    }

    /// Another stored connector on the same cluster whose group id is this one's but whose
    /// group is of the other type: the two could never both run (Kafka has one namespace for
    /// group ids). Checked without the broker, so it holds while the cluster is down too.
    async fn group_id_clashes(&self, tenant: &str, config: &ConfigMap) -> Vec<ConfigError> {
        let name = config.get("name").cloned().unwrap_or_default();
        let Ok((_, share, group, bootstrap)) = self.group_of_config(tenant, &name, config) else {
            return Vec::new();
        };
        let Ok(stored) = self.stored_connectors().await else {
            return Vec::new();
        };
        let kind = |share: bool| if share { "share" } else { "consumer" };
        stored
            .into_iter()
            .filter(|(k, _)| !(k.tenant == tenant && k.name == name))
            .filter_map(|(k, record)| {
                let (_, other_share, other_group, other_bootstrap) = self
                    .group_of_config(&k.tenant, &k.name, &record.config)
                    .ok()?;
                (other_group == group && other_share != share && other_bootstrap == bootstrap).then(
                    || ConfigError::InvalidValue {
                        key: "consumer.override.group.id".into(),
                        value: group.clone(),
                        reason: format!(
                            "connector '{}' uses '{group}' as a {} group id, and Kafka has one \
                             namespace for group ids: a {} group cannot have the same id. Set \
                             consumer.override.group.id to an id no other connector uses (or \
                             remove it for the default, connect-<name> in classic mode and \
                             connect-share-<name> in share mode)",
                            k.name,
                            kind(other_share),
                            kind(share)
                        ),
                    },
                )
            })
            .collect()
    }

    /// The `validate` answer for `config` in `tenant`, secrets hidden: every refusal starting
    /// the connector would meet (the client overrides the tenant's policy refuses, the
    /// worker's start checks, a group id another type of group holds — asked of the cluster
    /// when it answers, and of the other stored connectors), so what it accepts also starts.
    pub async fn validate(&self, tenant: &str, config: &ConfigMap) -> ValidationReport {
        if MirrorConnector::of_config(config).is_some() {
            // No consumer group of the worker's: the flow's own groups are named by MM2's rules.
            return self.validate_with(tenant, config, Vec::new());
        }
        let scope = self.tenants.scope(tenant);
        let mut errors = self.group_id_clashes(tenant, config).await;
        if errors.is_empty() {
            errors = self.worker.group_id_errors(&scope, config).await;
        }
        self.validate_with(tenant, config, errors)
    }

    /// The `validate` answer without asking the cluster, plus `extra` errors.
    fn validate_with(
        &self,
        tenant: &str,
        config: &ConfigMap,
        extra: Vec<ConfigError>,
    ) -> ValidationReport {
        let class = config.get(CONNECTOR_CLASS).cloned().unwrap_or_default();
        if let Some(connector) = MirrorConnector::of_config(config) {
            let mut report = mirror_report(connector, config);
            let mut messages = match plan(connector, config) {
                Ok(_) => Vec::new(),
                Err(errors) => errors,
            };
            if tenant != DEFAULT_TENANT {
                // A flow reaches its clusters by the addresses it is given, outside a tenant's
                // egress policy and cluster confinement: the worker's operator runs it.
                messages.push((
                    CONNECTOR_CLASS.to_owned(),
                    format!(
                        "{} runs only for the worker's own connectors, not for tenant {tenant}: a                          MirrorMaker 2 flow reaches the clusters it names outside a tenant's                          egress policy; ask the worker's operator to run it",
                        connector.class()
                    ),
                ));
            }
            for (key, message) in messages {
                self.add_report_error(&mut report, config, &key, message);
            }
            return self.shown(report, config);
        }
        let (mut report, plugin_error) = match self.registry.create(&class) {
            Ok(plugin) => (plugin.validate(config), None),
            Err(e) => (validate_sink_connector(config, &ConfigDef::new()), Some(e)),
        };
        let mut configs = std::mem::take(&mut report.configs);
        configs.extend(runtime_config_def().validate(config));
        let mut report = ValidationReport::new(report.name, configs);
        let mut errors: Vec<ConfigError> = plugin_error.into_iter().collect();
        if let Err(e) = resolve_group_protocol(config, &self.worker_config) {
            errors.extend(e.flatten().into_iter().cloned());
        }
        let owner = if tenant == DEFAULT_TENANT {
            format!("the worker ({})", spillway_actors::tenancy::OVERRIDE_POLICY)
        } else {
            format!("tenant {tenant}")
        };
        let scope = self.tenants.scope(tenant);
        errors.extend(scope.policy.violations(config, &owner));
        errors.extend(self.worker.start_checks(&scope, config));
        errors.extend(extra);
        for error in errors {
            let key = error.key().unwrap_or(CONNECTOR_CLASS).to_owned();
            self.add_report_error(&mut report, config, &key, error.to_string());
        }
        self.shown(report, config)
    }

    /// Adds `message` to `key`'s entry of `report`, making one when no definition covers it.
    fn add_report_error(
        &self,
        report: &mut ValidationReport,
        config: &ConfigMap,
        key: &str,
        message: String,
    ) {
        if report.add_error(key, message.clone()) {
            return;
        }
        // A key no definition covers gets an entry of its own to carry the error.
        let mut extra = ConfigDef::new()
            .define(ConfigKey::new(key, ConfigType::String, Importance::Medium, "").null_default())
            .validate(config);
        for entry in &mut extra {
            entry.value.errors.push(message.clone());
        }
        let mut configs = std::mem::take(&mut report.configs);
        configs.extend(extra);
        *report = ValidationReport::new(std::mem::take(&mut report.name), configs);
    }

    /// `report` as the REST answer shows it: secrets masked, in values and in messages.
    fn shown(&self, mut report: ValidationReport, config: &ConfigMap) -> ValidationReport {
        let shown = self.masked(config);
        let declared = self.secret_keys(config);
        for entry in &mut report.configs {
            if let Some(value) = &entry.value.value {
                entry.value.value = Some(match shown.get(&entry.value.name) {
                    Some(masked) => masked.clone(),
                    None => secrets::mask_value(&entry.value.name, value, &declared, config),
                });
            }
            for e in &mut entry.value.errors {
                *e = self.redact(config, e);
            }
        }
        report
    }

    /// Refuses a configuration with errors.
    pub(super) async fn check(&self, tenant: &str, config: &ConfigMap) -> Result<(), HerderError> {
        // Its secrets are kept out of every log line from now on (secrets::RedactingWriter).
        secrets::remember(config, &self.secret_keys(config));
        let report = self.validate(tenant, config).await;
        if report.is_valid() {
            Ok(())
        } else {
            Err(HerderError::InvalidConfig(Box::new(report)))
        }
    }
}
