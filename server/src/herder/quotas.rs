//! Tenants and what they may take: their quotas (connectors, tasks, records in flight), the
//! worker's `tasks.max.per.worker` (the cluster's capacity in distributed mode), and the
//! tenant administration calls.

use serde::Serialize;
use spillway_actors::consumer_settings::{ConsumerSettings, DEFAULT_MAX_POLL_RECORDS};
use spillway_actors::limits::TaskCost;
use spillway_actors::settings::TaskSettings;
use spillway_actors::OverridePolicy;
use spillway_core::ConfigMap;
use spillway_storage::{ConnectorKey, ConnectorRecord, TargetState};
use tracing::info;

use super::{Herder, HerderError, DEFAULT_TENANT};
use crate::tenants::{Quotas, TenantError, TenantInfo, Tenants};

/// Worker key: the `tasks` quota of a tenant created without one; empty: unlimited.
pub const TENANT_DEFAULT_QUOTA_TASKS: &str = "tenant.default.quota.tasks";
/// Its default: half the tasks one connector may have, so a new tenant cannot fill a worker
/// (whose default holds 48 tasks at an open-file limit of 1024) alone.
pub const DEFAULT_TENANT_TASKS: u64 = 32;

/// What a tenant's connectors take of its quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub connectors: u64,
    /// `tasks.max` of every connector not STOPPED.
    pub tasks: u64,
    #[serde(rename = "inflight.records")]
    pub inflight_records: u64,
    /// Bytes the tenant's running tasks hold between poll and commit now (a gauge).
    #[serde(rename = "inflight.bytes")]
    pub inflight_bytes: u64,
}

/// A tenant with what it uses (`GET /tenants/{tenant}`).
#[derive(Debug, Clone, Serialize)]
pub struct TenantDetails {
    #[serde(flatten)]
    pub tenant: TenantInfo,
    pub usage: Usage,
}

impl Herder {
    /// What one connector takes of its tenant's quotas in `target`.
    fn footprint(&self, config: &ConfigMap, target: TargetState) -> Usage {
        if target == TargetState::Stopped {
            return Usage {
                connectors: 1,
                ..Usage::default()
            };
        }
        let tasks = config
            .get("tasks.max")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1);
        let batches = TaskSettings::resolve(config, &self.worker_config)
            .map(|s| s.inflight_batches as u64)
            .unwrap_or(1);
        let overrides = spillway_core::convert::strip_prefix(config, "consumer.override.");
        let poll = ConsumerSettings::collect(&self.worker_config, &overrides)
            .max_poll_records()
            .unwrap_or(DEFAULT_MAX_POLL_RECORDS) as u64;
        Usage {
            connectors: 1,
            tasks,
            inflight_records: tasks.saturating_mul(batches).saturating_mul(poll),
            inflight_bytes: 0,
        }
    }

    /// What the tenant's connectors take of its quotas.
    async fn usage(&self, tenant: &str) -> Result<Usage, HerderError> {
        let stored = self.stored_connectors().await?;
        Ok(self.usage_of(&stored, tenant, None))
    }

    /// What the tenant's connectors among `stored` take of its quotas, leaving out `except`.
    fn usage_of(
        &self,
        stored: &[(ConnectorKey, ConnectorRecord)],
        tenant: &str,
        except: Option<&str>,
    ) -> Usage {
        let mut usage = Usage::default();
        for (k, record) in stored {
            if k.tenant != tenant || Some(k.name.as_str()) == except {
                continue;
            }
            let one = self.footprint(&record.config, record.target_state);
            usage.connectors += one.connectors;
            usage.tasks = usage.tasks.saturating_add(one.tasks);
            usage.inflight_records = usage.inflight_records.saturating_add(one.inflight_records);
        }
        usage.inflight_bytes = self.tenants.inflight_bytes(tenant);
        usage
    }

    /// Refuses a connector (new or changed) that would take its tenant over a quota.
    pub(super) async fn check_quotas(
        &self,
        tenant: &str,
        name: &str,
        config: &ConfigMap,
        target: TargetState,
    ) -> Result<(), HerderError> {
        let quotas = self.tenants.quotas(tenant);
        let limited = quotas != Quotas::default();
        if target == TargetState::Stopped && !limited {
            return Ok(());
        }
        // One read of the store serves both checks.
        let stored = self.stored_connectors().await?;
        self.check_worker_tasks(&stored, tenant, name, config, target)?;
        if !limited {
            return Ok(());
        }
        let others = self.usage_of(&stored, tenant, Some(name));
        let this = self.footprint(config, target);
        let over = |quota: &'static str, limit: Option<u64>, total: u64, detail: String| match limit
        {
            Some(limit) if total > limit => Err(HerderError::Quota {
                tenant: tenant.to_owned(),
                quota,
                limit,
                detail,
            }),
            _ => Ok(()),
        };
        let connectors = others.connectors + 1;
        over(
            "connectors",
            quotas.connectors,
            connectors,
            format!("it would own {connectors} connectors"),
        )?;
        let tasks = others.tasks.saturating_add(this.tasks);
        over(
            "tasks",
            quotas.tasks,
            tasks,
            format!(
                "its connectors would have {tasks} tasks (tasks.max of every connector not STOPPED; {name} asks for {})",
                this.tasks
            ),
        )?;
        let inflight = others
            .inflight_records
            .saturating_add(this.inflight_records);
        over(
            "inflight.records",
            quotas.inflight_records,
            inflight,
            format!(
                "its tasks could hold {inflight} records in flight (tasks.max x task.inflight.batches x max.poll.records of every connector not STOPPED; {name} asks for {})",
                this.inflight_records
            ),
        )
    }

    /// Refuses a connector (new, changed or coming back from STOPPED) that would take the
    /// worker over `tasks.max.per.worker`, counting every tenant's connectors not STOPPED; in
    /// distributed mode, the cluster over the sum of its live workers' caps.
    fn check_worker_tasks(
        &self,
        stored: &[(ConnectorKey, ConnectorRecord)],
        tenant: &str,
        name: &str,
        config: &ConfigMap,
        target: TargetState,
    ) -> Result<(), HerderError> {
        if target == TargetState::Stopped {
            return Ok(());
        }
        let others = stored
            .iter()
            .filter(|(k, r)| {
                !(k.tenant == tenant && k.name == name) && r.target_state != TargetState::Stopped
            })
            .map(|(_, r)| self.worker.task_cost(&r.config))
            .fold(TaskCost::default(), TaskCost::plus);
        // Distributed mode: the store is the cluster's, and so is the capacity — the sum of
        // every live worker's cap (the assignor gives no worker more than its own; each worker
        // still weighs the tasks it is given against its own descriptors and threads).
        if let Some(caps) = self.cluster.as_ref().and_then(|c| c.role().worker_caps()) {
            return spillway_actors::limits::check_cluster_tasks(
                name,
                others.tasks,
                self.worker.task_cost(config).tasks,
                &caps,
            )
            .map_err(|e| HerderError::BadRequest(e.to_string()));
        }
        self.worker
            .limits()
            .check_worker_tasks(name, others, self.worker.task_cost(config))
            .map_err(|e| HerderError::BadRequest(e.to_string()))
    }

    /// The worker's tenants (token lookup, scopes, quotas).
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// A tenant with what its connectors use of its quotas.
    pub async fn tenant_details(&self, name: &str) -> Result<TenantDetails, HerderError> {
        Ok(TenantDetails {
            tenant: self.tenants.get(name)?,
            usage: self.usage(name).await?,
        })
    }

    /// Creates a tenant; the answer holds its token, shown this once.
    pub async fn create_tenant(
        &self,
        name: &str,
        quotas: Quotas,
        policy: Option<OverridePolicy>,
    ) -> Result<(TenantInfo, String), HerderError> {
        let _guard = self.control.lock().await;
        let mut quotas = quotas;
        if quotas.tasks.is_none() {
            quotas.tasks = self.default_tasks;
        }
        let created = self.tenants.create(name, quotas, policy).await?;
        info!(tenant = %name, "tenant created");
        Ok(created)
    }

    /// Replaces a tenant's quotas (and policy when given). Lower quotas than what the tenant
    /// uses are accepted: running connectors go on, and further growth is refused.
    pub async fn update_tenant(
        &self,
        name: &str,
        quotas: Quotas,
        policy: Option<OverridePolicy>,
    ) -> Result<TenantDetails, HerderError> {
        let _guard = self.control.lock().await;
        self.tenants.update(name, quotas, policy).await?;
        info!(tenant = %name, ?quotas, "tenant quotas changed");
        drop(_guard);
        self.tenant_details(name).await
    }

    /// Gives a tenant a new token; the old one stops working at once.
    pub async fn rotate_token(&self, name: &str) -> Result<String, HerderError> {
        let _guard = self.control.lock().await;
        let token = self.tenants.rotate_token(name).await?;
        info!(tenant = %name, "tenant token rotated");
        Ok(token)
    }

    /// Deletes a tenant. One that still owns connectors is refused unless
    /// `delete_connectors`, which stops and deletes them first.
    pub async fn delete_tenant(
        &self,
        name: &str,
        delete_connectors: bool,
    ) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        self.tenants.get(name)?;
        if name == DEFAULT_TENANT {
            return Err(TenantError::Invalid("the default tenant cannot be deleted".into()).into());
        }
        let owned = self.connector_names(name).await?;
        if !owned.is_empty() && !delete_connectors {
            return Err(HerderError::TenantHasConnectors {
                tenant: name.to_owned(),
                connectors: owned,
            });
        }
        for connector in owned {
            self.delete_locked(name, &connector).await?;
        }
        self.tenants.delete(name).await?;
        info!(tenant = %name, "tenant deleted");
        Ok(())
    }
}
