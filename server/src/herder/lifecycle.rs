//! A connector's life: restore at start, create, reconfigure, delete, pause, resume, stop,
//! restart, and the worker's shutdown. Each change is written to the store (on a blocking
//! thread) before the worker acts on it, under the lock that serialises changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use spillway_actors::RuntimeError;
use spillway_core::ConfigMap;
use spillway_storage::{ConnectorKey, ConnectorRecord, TargetState};
use tracing::{info, warn};

use super::{key, lock, runtime_key, ConnectorInfo, ConnectorStateInfo, Herder, HerderError};
use crate::mirror::connectors::MirrorConnector;
use crate::secrets;

/// Which restarts a restart request asked for (KIP-745).
#[derive(Debug, Clone, Copy, Default)]
pub struct RestartRequest {
    pub include_tasks: bool,
    pub only_failed: bool,
}

impl Herder {
    /// Takes the lock that serialises changes, for [`restore`](Self::restore): taken before
    /// the REST API serves, so that no change can come before the restore.
    pub async fn lock_for_restore(&self) -> tokio::sync::OwnedMutexGuard<()> {
        Arc::clone(&self.control).lock_owned().await
    }

    /// Starts every stored connector whose target state is RUNNING. A connector that cannot
    /// start shows as FAILED with the reason; the others start regardless. `_guard` (from
    /// [`lock_for_restore`](Self::lock_for_restore)) is held until every connector is back.
    pub async fn restore(
        &self,
        _guard: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<(), HerderError> {
        if self.cluster.is_some() {
            // The group's assignments start what runs here.
            return Ok(());
        }
        for (key, record) in self.stored_connectors().await? {
            secrets::remember(&record.config, &self.secret_keys(&record.config));
            let runtime = runtime_key(&key.tenant, &key.name);
            if !self.tenants.exists(&key.tenant) {
                warn!(tenant = %key.tenant, connector = %key.name, "the connector's tenant is gone; not starting it");
                continue;
            }
            let k = key.clone();
            for (task, stored) in self.read(move |store| store.tasks(&k)).await? {
                lock(&self.persisted).insert((runtime.clone(), task), stored);
            }
            info!(tenant = %key.tenant, connector = %key.name, target = %record.target_state, "restoring");
            if record.target_state == TargetState::Running {
                self.start(&key, record.config).await;
            }
        }
        Ok(())
    }

    /// Starts a connector in the worker, remembering a failure for the status API. In
    /// distributed mode the reconciler starts it where the group assigned it.
    async fn start(&self, key: &ConnectorKey, config: ConfigMap) {
        if let Some(cluster) = &self.cluster {
            cluster.changed();
            return;
        }
        self.launch(key, config).await
    }

    /// Starts a connector in this worker's runtime now.
    pub(crate) async fn launch(&self, key: &ConnectorKey, config: ConfigMap) {
        let runtime = runtime_key(&key.tenant, &key.name);
        lock(&self.failures).remove(&runtime);
        if MirrorConnector::of_config(&config).is_some() {
            if let Err(e) = self
                .mirrors
                .start(&runtime, &config, self.registry.clone())
                .await
            {
                let message = self.redact(&config, &format!("{e:#}"));
                warn!(tenant = %key.tenant, connector = %key.name, error = %message, "the mirror connector cannot start");
                lock(&self.failures).insert(runtime, message);
            }
            return;
        }
        let scope = self.tenants.scope(&key.tenant);
        if let Err(e) = self
            .worker
            .start_tenant_connector(runtime, scope, config.clone())
            .await
        {
            self.failed(key, &config, &e);
        }
    }

    /// Logs why a connector cannot run and keeps it for the status API, secrets hidden.
    fn failed(&self, key: &ConnectorKey, config: &ConfigMap, error: &RuntimeError) {
        let message = self.redact(config, &error.to_string());
        warn!(tenant = %key.tenant, connector = %key.name, error = %message, "the connector cannot start");
        lock(&self.failures).insert(runtime_key(&key.tenant, &key.name), message);
    }

    /// Stops a connector in the worker if it runs there (in distributed mode: wherever it
    /// runs, through the reconcilers).
    async fn halt(&self, key: &ConnectorKey) -> Result<(), HerderError> {
        if let Some(cluster) = &self.cluster {
            cluster.changed();
            return Ok(());
        }
        self.shut(key).await
    }

    /// Stops a connector in this worker's runtime now.
    pub(crate) async fn shut(&self, key: &ConnectorKey) -> Result<(), HerderError> {
        let runtime = runtime_key(&key.tenant, &key.name);
        lock(&self.failures).remove(&runtime);
        if self.mirrors.stop(&runtime).await {
            return Ok(());
        }
        match self.worker.stop_connector(&runtime).await {
            // A stopped runtime runs nothing: the connector is stopped already.
            Ok(()) | Err(RuntimeError::UnknownConnector(_)) | Err(RuntimeError::WorkerStopped) => {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Creates a connector (`POST /connectors`).
    pub async fn create(
        &self,
        tenant: &str,
        mut config: ConfigMap,
        name: &str,
        initial: TargetState,
    ) -> Result<ConnectorInfo, HerderError> {
        config
            .entry("name".to_owned())
            .or_insert_with(|| name.to_owned());
        let _guard = self.control.lock().await;
        let k = key(tenant, name);
        if self.read(move |store| store.connector(&k)).await?.is_some() {
            return Err(HerderError::ConnectorExists(name.to_owned()));
        }
        self.check(tenant, &config).await?;
        self.check_quotas(tenant, name, &config, initial).await?;
        let record = ConnectorRecord::new(config.clone(), initial);
        let key = key(tenant, name);
        let (k, r) = (key.clone(), record.clone());
        self.write(move |store| store.put_connector(&k, &r)).await?;
        info!(tenant, connector = %name, target = %initial, "created");
        if initial == TargetState::Running {
            self.start(&key, config).await;
        }
        Ok(self.info_of(tenant, name, &record))
    }

    /// Creates or replaces a configuration (`PUT /connectors/{name}/config`); true when created.
    pub async fn put_config(
        &self,
        tenant: &str,
        name: &str,
        mut config: ConfigMap,
    ) -> Result<(bool, ConnectorInfo), HerderError> {
        match config.get("name") {
            Some(n) if n != name => {
                return Err(HerderError::BadRequest(format!(
                    "Connector name configuration ({n}) doesn't match connector name in the URL ({name})"
                )))
            }
            Some(_) => {}
            None => {
                config.insert("name".into(), name.to_owned());
            }
        }
        let _guard = self.control.lock().await;
        self.write_config(tenant, name, config).await
    }

    /// Writes a whole configuration and applies it; the caller holds the control lock.
    async fn write_config(
        &self,
        tenant: &str,
        name: &str,
        mut config: ConfigMap,
    ) -> Result<(bool, ConnectorInfo), HerderError> {
        let key = key(tenant, name);
        let k = key.clone();
        let existing = self.read(move |store| store.connector(&k)).await?;
        let created = existing.is_none();
        let mut record = existing
            .unwrap_or_else(|| ConnectorRecord::new(ConfigMap::new(), TargetState::Running));
        // A value sent back as GET shows it (`[hidden]`, a URL with `****`) keeps the stored
        // secret.
        let shown = self.masked(&record.config);
        for (k, v) in config.iter_mut() {
            if let (Some(old), Some(old_shown)) = (record.config.get(k), shown.get(k)) {
                if v == old_shown || v == secrets::HIDDEN {
                    v.clone_from(old);
                }
            }
        }
        self.check(tenant, &config).await?;
        self.check_quotas(tenant, name, &config, record.target_state)
            .await?;
        record.config = config.clone();
        let (k, r) = (key.clone(), record.clone());
        self.write(move |store| store.put_connector(&k, &r)).await?;
        info!(tenant, connector = %name, created, "configuration written");
        let runtime = runtime_key(tenant, name);
        if let Some(cluster) = &self.cluster {
            cluster.changed();
        } else if record.target_state == TargetState::Running {
            if created || lock(&self.failures).contains_key(&runtime) {
                self.halt(&key).await?;
                self.start(&key, config).await;
            } else if let Err(e) = self
                .worker
                .reconfigure_tenant_connector(runtime, self.tenants.scope(tenant), config.clone())
                .await
            {
                self.failed(&key, &config, &e);
            }
        }
        Ok((created, self.info_of(tenant, name, &record)))
    }

    /// Changes some keys (`PATCH /connectors/{name}/config`); a `None` value removes the key.
    pub async fn patch_config(
        &self,
        tenant: &str,
        name: &str,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<ConnectorInfo, HerderError> {
        if let Some(Some(n)) = patch.get("name") {
            if n != name {
                return Err(HerderError::BadRequest(format!(
                    "Connector name configuration ({n}) doesn't match connector name in the URL ({name})"
                )));
            }
        }
        let _guard = self.control.lock().await;
        let mut config = self.record(tenant, name).await?.config;
        for (k, v) in patch {
            match v {
                Some(v) => {
                    config.insert(k, v);
                }
                None => {
                    config.remove(&k);
                }
            }
        }
        config.insert("name".into(), name.to_owned());
        let (_, info) = self.write_config(tenant, name, config).await?;
        Ok(info)
    }

    /// Deletes a connector: stops it, then forgets it.
    pub async fn delete(&self, tenant: &str, name: &str) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        self.delete_locked(tenant, name).await
    }

    pub(super) async fn delete_locked(&self, tenant: &str, name: &str) -> Result<(), HerderError> {
        self.record(tenant, name).await?;
        let key = key(tenant, name);
        self.halt(&key).await?;
        let k = key.clone();
        self.write(move |store| store.delete_connector(&k)).await?;
        let runtime = runtime_key(tenant, name);
        lock(&self.persisted).retain(|(n, _), _| *n != runtime);
        info!(tenant, connector = %name, "deleted");
        Ok(())
    }

    /// Moves a connector to `target`: PAUSED and STOPPED stop its tasks (keeping the
    /// configuration), RUNNING starts them again.
    pub async fn set_target(
        &self,
        tenant: &str,
        name: &str,
        target: TargetState,
    ) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name).await?;
        if record.target_state == target {
            return Ok(());
        }
        if record.target_state == TargetState::Stopped {
            // A stopped connector takes no tasks of the quota; coming back it does again.
            self.check_quotas(tenant, name, &record.config, target)
                .await?;
        }
        let key = key(tenant, name);
        let k = key.clone();
        self.write(move |store| store.set_target_state(&k, target))
            .await?;
        info!(tenant, connector = %name, from = %record.target_state, to = %target, "target state");
        match target {
            TargetState::Running => self.start(&key, record.config).await,
            TargetState::Paused | TargetState::Stopped => self.halt(&key).await?,
        }
        Ok(())
    }

    /// Restarts a connector (`POST /connectors/{name}/restart`). Returns `None` for the plain
    /// request (Connect answers 204), or the status showing what restarts (202).
    ///
    /// Restarting the connector instance restarts it with all its tasks (the worker runs the
    /// instance and its tasks as one); `includeTasks=true&onlyFailed=true` on a connector that
    /// did not fail restarts only the failed tasks, each on its own.
    pub async fn restart(
        &self,
        tenant: &str,
        name: &str,
        request: RestartRequest,
    ) -> Result<Option<ConnectorStateInfo>, HerderError> {
        let mut status = self.status(tenant, name).await?;
        let plain = !request.include_tasks && !request.only_failed;
        let connector_failed = status.connector.state == "FAILED";
        let failed_tasks: Vec<u32> = status
            .tasks
            .iter()
            .filter(|t| t.state == "FAILED")
            .map(|t| t.id)
            .collect();
        if request.include_tasks && request.only_failed && !connector_failed {
            for id in &failed_tasks {
                self.restart_task(tenant, name, *id).await?;
            }
            for t in status
                .tasks
                .iter_mut()
                .filter(|t| failed_tasks.contains(&t.id))
            {
                t.state = "RESTARTING".into();
                t.trace = None;
            }
            return Ok(Some(status));
        }
        let wanted = !request.only_failed || connector_failed;
        if wanted {
            self.restart_all(tenant, name).await?;
            if !plain {
                status.connector.state = "RESTARTING".into();
                status.connector.trace = None;
                for t in &mut status.tasks {
                    t.state = "RESTARTING".into();
                    t.trace = None;
                }
            }
        }
        Ok((!plain).then_some(status))
    }

    /// Restarts one task (`POST /connectors/{name}/tasks/{id}/restart`): it stops gracefully
    /// and runs again while the connector's other tasks go on.
    pub async fn restart_task(
        &self,
        tenant: &str,
        name: &str,
        task: u32,
    ) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name).await?;
        let runtime = runtime_key(tenant, name);
        if self.cluster.is_some()
            && record.target_state == TargetState::Running
            && !self.runs_task_here(tenant, name, task)
        {
            drop(_guard);
            self.task_status(tenant, name, task).await?;
            return Err(HerderError::Conflict(format!(
                "task {task} of connector {name} does not run on this worker ({}); ask the worker that runs it ({}), or retry after the rebalance",
                self.worker_id,
                self.task_owner(tenant, name, task).unwrap_or_else(|| "none yet".into())
            )));
        }
        if MirrorConnector::of_config(&record.config).is_some() {
            // A mirror connector's flow is one unit: its task restarts with it.
            drop(_guard);
            self.task_status(tenant, name, task).await?;
            if record.target_state == TargetState::Running {
                self.restart_all(tenant, name).await?;
            }
            return Ok(());
        }
        if record.target_state != TargetState::Running
            || lock(&self.failures).contains_key(&runtime)
        {
            // Not running (or its instance failed to start): only an existing task id is
            // accepted, and there is nothing to restart on its own.
            drop(_guard);
            self.task_status(tenant, name, task).await?;
            return Ok(());
        }
        match self.worker.restart_task(&runtime, task).await {
            Ok(()) => {
                info!(tenant, connector = %name, task, "task restarted");
                Ok(())
            }
            Err(RuntimeError::UnknownTask { .. }) | Err(RuntimeError::UnknownConnector(_)) => {
                Err(HerderError::UnknownTask {
                    connector: name.to_owned(),
                    task,
                })
            }
            Err(RuntimeError::Task(message)) => Err(HerderError::Conflict(message)),
            Err(e) => Err(e.into()),
        }
    }

    async fn restart_all(&self, tenant: &str, name: &str) -> Result<(), HerderError> {
        let _guard = self.control.lock().await;
        let record = self.record(tenant, name).await?;
        let key = key(tenant, name);
        let k = key.clone();
        self.write(move |store| store.count_connector_restart(&k))
            .await?;
        if record.target_state == TargetState::Running {
            info!(tenant, connector = %name, "restarting");
            self.halt(&key).await?;
            self.start(&key, record.config).await;
        }
        Ok(())
    }

    /// Stops every connector gracefully without changing target states (worker shutdown).
    pub async fn shutdown(&self) {
        let _guard = self.control.lock().await;
        if let Err(e) = self.persist_task_statuses().await {
            warn!(error = %e, "cannot record the last task statuses");
        }
        for status in self.worker.statuses() {
            if let Err(e) = self.worker.stop_connector(&status.name).await {
                warn!(connector = %status.name, error = %e, "stopping the connector failed");
            }
        }
        self.mirrors.stop_all().await;
    }
}
