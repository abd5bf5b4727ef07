//! The records of the config and status topics, and the views rebuilt from them.
//!
//! Keys are JSON arrays (`["connector","tenant","name"]`): unambiguous whatever a tenant or
//! connector name holds, and readable with `kafka-console-consumer`. Values are JSON objects;
//! no value (a tombstone) deletes the key, which compaction then forgets.
//!
//! The config topic has one partition, so every worker reads its records in the one order they
//! were written. The view applies them as Kafka Connect's config store does:
//! - a connector's config, its target state, tenants and restart counts take effect at once;
//! - task configs are written first and take effect only when the connector's commit record
//!   (`["commit",tenant,name]` with the task count) follows, so a reader never runs half of a
//!   new set of task configs. A commit whose task configs are not all there (compaction kept a
//!   newer commit than some task record, or a writer died half-way) leaves the connector
//!   *inconsistent*: its previous tasks stay, and it is named in the view until a complete set
//!   is written;
//! - deleting a connector writes tombstones for its target state and config; its tasks go with
//!   it.
//!
//! The status topic may have many partitions (each key stays in one). A status carries the
//! generation of the group it was written in; an older generation's status never replaces a
//! newer one, so a worker that lost its tasks cannot overwrite the status of their new owner.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::model::{ConnectorKey, TargetState, Tenant};

/// A config-topic key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigKey {
    Tenant(String),
    Connector(ConnectorKey),
    TargetState(ConnectorKey),
    Task(ConnectorKey, u32),
    Commit(ConnectorKey),
    Restarts(ConnectorKey),
}

impl ConfigKey {
    pub fn encode(&self) -> Bytes {
        let parts: Vec<String> = match self {
            ConfigKey::Tenant(name) => vec!["tenant".into(), name.clone()],
            ConfigKey::Connector(k) => vec!["connector".into(), k.tenant.clone(), k.name.clone()],
            ConfigKey::TargetState(k) => {
                vec!["target-state".into(), k.tenant.clone(), k.name.clone()]
            }
            ConfigKey::Task(k, task) => vec![
                "task".into(),
                k.tenant.clone(),
                k.name.clone(),
                task.to_string(),
            ],
            ConfigKey::Commit(k) => vec!["commit".into(), k.tenant.clone(), k.name.clone()],
            ConfigKey::Restarts(k) => vec!["restarts".into(), k.tenant.clone(), k.name.clone()],
        };
        Bytes::from(serde_json::to_vec(&parts).expect("strings serialise"))
    }

    pub fn decode(bytes: &[u8]) -> Option<ConfigKey> {
        let parts: Vec<String> = serde_json::from_slice(bytes).ok()?;
        let connector = |i: usize| Some(ConnectorKey::new(parts.get(i)?, parts.get(i + 1)?));
        match (parts.first()?.as_str(), parts.len()) {
            ("tenant", 2) => Some(ConfigKey::Tenant(parts[1].clone())),
            ("connector", 3) => Some(ConfigKey::Connector(connector(1)?)),
            ("target-state", 3) => Some(ConfigKey::TargetState(connector(1)?)),
            ("task", 4) => Some(ConfigKey::Task(connector(1)?, parts[3].parse().ok()?)),
            ("commit", 3) => Some(ConfigKey::Commit(connector(1)?)),
            ("restarts", 3) => Some(ConfigKey::Restarts(connector(1)?)),
            _ => None,
        }
    }
}

/// `["connector",…]`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectorConfigValue {
    pub config: BTreeMap<String, String>,
}

/// `["target-state",…]`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStateValue {
    pub state: TargetState,
}

/// `["task",…]`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskConfigValue {
    pub config: BTreeMap<String, String>,
}

/// `["commit",…]`'s value: how many task configs make the new set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitValue {
    pub tasks: u32,
}

/// `["restarts",…]`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartsValue {
    pub restarts: u32,
}

/// `["tenant",…]`'s value: the tenant's settings (token digest, quotas, override policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantValue {
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

/// One connector as the config topic describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorState {
    pub config: BTreeMap<String, String>,
    pub target_state: TargetState,
    pub restarts: u32,
    /// The committed task configs, by task id.
    pub tasks: Vec<BTreeMap<String, String>>,
}

/// Everything the config topic says, as of [`ConfigView::offset`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigView {
    /// The offset of the next record to read: every record below it is applied.
    pub offset: i64,
    pub tenants: BTreeMap<String, Tenant>,
    pub connectors: BTreeMap<ConnectorKey, ConnectorState>,
    /// Target states written before (or without) their connector's config.
    pending_target_states: BTreeMap<ConnectorKey, TargetState>,
    /// Task configs written but not yet committed.
    pending_tasks: BTreeMap<ConnectorKey, BTreeMap<u32, BTreeMap<String, String>>>,
    /// Connectors whose last commit named task configs that are not there.
    pub inconsistent: BTreeSet<ConnectorKey>,
    /// Records that could not be read, with why (counted, never silently skipped).
    pub unreadable: Vec<String>,
}

impl ConfigView {
    /// Applies one record read at `offset`.
    pub fn apply(&mut self, offset: i64, key: Option<&[u8]>, value: Option<&[u8]>) {
        self.offset = self.offset.max(offset + 1);
        let Some(parsed) = key.and_then(ConfigKey::decode) else {
            self.unreadable.push(format!(
                "offset {offset}: key {:?} is not a Spillway config key",
                key.map(String::from_utf8_lossy)
            ));
            return;
        };
        if let Err(reason) = self.apply_key(parsed, value) {
            self.unreadable.push(format!(
                "offset {offset}: key {}: {reason}",
                String::from_utf8_lossy(key.unwrap_or_default())
            ));
        }
    }

    fn apply_key(&mut self, key: ConfigKey, value: Option<&[u8]>) -> Result<(), String> {
        fn parse<T: serde::de::DeserializeOwned>(value: &[u8]) -> Result<T, String> {
            serde_json::from_slice(value).map_err(|e| e.to_string())
        }
        match (key, value) {
            (ConfigKey::Tenant(name), None) => {
                self.tenants.remove(&name);
                self.connectors.retain(|k, _| k.tenant != name);
            }
            (ConfigKey::Tenant(name), Some(v)) => {
                let v: TenantValue = parse(v)?;
                self.tenants.insert(
                    name.clone(),
                    Tenant {
                        name,
                        settings: v.settings,
                    },
                );
            }
            (ConfigKey::Connector(k), None) => {
                self.connectors.remove(&k);
                self.pending_tasks.remove(&k);
                self.pending_target_states.remove(&k);
                self.inconsistent.remove(&k);
            }
            (ConfigKey::Connector(k), Some(v)) => {
                let v: ConnectorConfigValue = parse(v)?;
                match self.connectors.get_mut(&k) {
                    Some(c) => c.config = v.config,
                    None => {
                        let target_state = self
                            .pending_target_states
                            .remove(&k)
                            .unwrap_or(TargetState::Running);
                        self.connectors.insert(
                            k,
                            ConnectorState {
                                config: v.config,
                                target_state,
                                restarts: 0,
                                tasks: Vec::new(),
                            },
                        );
                    }
                }
            }
            (ConfigKey::TargetState(k), None) => {
                self.pending_target_states.remove(&k);
            }
            (ConfigKey::TargetState(k), Some(v)) => {
                let v: TargetStateValue = parse(v)?;
                match self.connectors.get_mut(&k) {
                    Some(c) => c.target_state = v.state,
                    // Connect writes the target state before the config of a new connector.
                    None => {
                        self.pending_target_states.insert(k, v.state);
                    }
                }
            }
            (ConfigKey::Task(k, task), None) => {
                if let Some(p) = self.pending_tasks.get_mut(&k) {
                    p.remove(&task);
                }
            }
            (ConfigKey::Task(k, task), Some(v)) => {
                let v: TaskConfigValue = parse(v)?;
                self.pending_tasks
                    .entry(k)
                    .or_default()
                    .insert(task, v.config);
            }
            (ConfigKey::Commit(_), None) => {}
            (ConfigKey::Commit(k), Some(v)) => {
                let v: CommitValue = parse(v)?;
                let pending = self.pending_tasks.remove(&k).unwrap_or_default();
                let complete = (0..v.tasks).all(|t| pending.contains_key(&t));
                if !complete {
                    // Keep what is pending: a later complete set will commit again.
                    self.pending_tasks.insert(k.clone(), pending);
                    self.inconsistent.insert(k);
                    return Ok(());
                }
                self.inconsistent.remove(&k);
                if let Some(c) = self.connectors.get_mut(&k) {
                    let mut pending = pending;
                    c.tasks = (0..v.tasks)
                        .map(|t| pending.remove(&t).expect("checked complete"))
                        .collect();
                }
            }
            (ConfigKey::Restarts(_), None) => {}
            (ConfigKey::Restarts(k), Some(v)) => {
                let v: RestartsValue = parse(v)?;
                if let Some(c) = self.connectors.get_mut(&k) {
                    c.restarts = v.restarts;
                }
            }
        }
        Ok(())
    }
}

/// A status-topic key: a connector's status or one task's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum StatusKey {
    Connector(ConnectorKey),
    Task(ConnectorKey, u32),
}

impl StatusKey {
    pub fn encode(&self) -> Bytes {
        let parts: Vec<String> = match self {
            StatusKey::Connector(k) => {
                vec!["connector-status".into(), k.tenant.clone(), k.name.clone()]
            }
            StatusKey::Task(k, task) => vec![
                "task-status".into(),
                k.tenant.clone(),
                k.name.clone(),
                task.to_string(),
            ],
        };
        Bytes::from(serde_json::to_vec(&parts).expect("strings serialise"))
    }

    pub fn decode(bytes: &[u8]) -> Option<StatusKey> {
        let parts: Vec<String> = serde_json::from_slice(bytes).ok()?;
        match (parts.first()?.as_str(), parts.len()) {
            ("connector-status", 3) => Some(StatusKey::Connector(ConnectorKey::new(
                &parts[1], &parts[2],
            ))),
            ("task-status", 4) => Some(StatusKey::Task(
                ConnectorKey::new(&parts[1], &parts[2]),
                parts[3].parse().ok()?,
            )),
            _ => None,
        }
    }
}

/// A connector's or task's status as a worker reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Connect's state name (RUNNING, PAUSED, FAILED, UNASSIGNED, ...).
    pub state: String,
    #[serde(default)]
    pub trace: Option<String>,
    /// The worker that runs it (Connect's `worker_id`, host:port).
    pub worker_id: String,
    /// The group generation the worker was in when it wrote this.
    pub generation: i32,
    /// Restarts of the task since it was started on its worker.
    #[serde(default)]
    pub restarts: u32,
}

/// Every status the topic holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusView {
    pub statuses: BTreeMap<StatusKey, Status>,
    /// Records that could not be read, with why.
    pub unreadable: Vec<String>,
}

impl StatusView {
    pub fn apply(&mut self, offset: i64, key: Option<&[u8]>, value: Option<&[u8]>) {
        let Some(parsed) = key.and_then(StatusKey::decode) else {
            self.unreadable.push(format!(
                "offset {offset}: key {:?} is not a Spillway status key",
                key.map(String::from_utf8_lossy)
            ));
            return;
        };
        let Some(value) = value else {
            self.statuses.remove(&parsed);
            return;
        };
        match serde_json::from_slice::<Status>(value) {
            Ok(status) => {
                // As Connect's status store: a worker may always overwrite its own status (its
                // generation can restart from 0 when the whole group restarts); another
                // worker's only from the same or a newer generation.
                let stale = self.statuses.get(&parsed).is_some_and(|known| {
                    status.worker_id != known.worker_id && status.generation < known.generation
                });
                if !stale {
                    self.statuses.insert(parsed, status);
                }
            }
            Err(e) => self.unreadable.push(format!("offset {offset}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ConnectorKey {
        ConnectorKey::new("acme", "orders/sink")
    }

    fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Applies records in order, at offsets 0, 1, ...
    fn view(records: &[(ConfigKey, Option<Vec<u8>>)]) -> ConfigView {
        let mut view = ConfigView::default();
        for (offset, (k, v)) in records.iter().enumerate() {
            view.apply(offset as i64, Some(&k.encode()), v.as_deref());
        }
        view
    }

    fn json<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        Some(serde_json::to_vec(value).unwrap())
    }

    fn task(n: u32) -> (ConfigKey, Option<Vec<u8>>) {
        (
            ConfigKey::Task(key(), n),
            json(&TaskConfigValue {
                config: config(&[("task.id", &n.to_string())]),
            }),
        )
    }

    fn commit(tasks: u32) -> (ConfigKey, Option<Vec<u8>>) {
        (ConfigKey::Commit(key()), json(&CommitValue { tasks }))
    }

    fn connector() -> (ConfigKey, Option<Vec<u8>>) {
        (
            ConfigKey::Connector(key()),
            json(&ConnectorConfigValue {
                config: config(&[("connector.class", "http"), ("tasks.max", "2")]),
            }),
        )
    }

    #[test]
    fn keys_read_back_whatever_the_names_hold() {
        for k in [
            ConfigKey::Tenant("a/b\"c".into()),
            ConfigKey::Connector(key()),
            ConfigKey::TargetState(key()),
            ConfigKey::Task(key(), 7),
            ConfigKey::Commit(key()),
            ConfigKey::Restarts(key()),
        ] {
            assert_eq!(ConfigKey::decode(&k.encode()), Some(k));
        }
        let s = StatusKey::Task(key(), 3);
        assert_eq!(StatusKey::decode(&s.encode()), Some(s));
        assert_eq!(ConfigKey::decode(b"connector-orders"), None);
    }

    #[test]
    fn task_configs_take_effect_only_with_their_commit() {
        let written = view(&[connector(), task(0), task(1)]);
        assert!(
            written.connectors[&key()].tasks.is_empty(),
            "uncommitted tasks ran"
        );
        let committed = view(&[connector(), task(0), task(1), commit(2)]);
        assert_eq!(committed.connectors[&key()].tasks.len(), 2);
        assert_eq!(committed.connectors[&key()].tasks[1]["task.id"], "1");
        assert_eq!(committed.offset, 4);
    }

    #[test]
    fn a_commit_missing_task_configs_keeps_the_old_tasks_and_names_the_connector() {
        let v = view(&[connector(), task(0), commit(1), task(0), commit(2)]);
        assert_eq!(v.connectors[&key()].tasks.len(), 1, "old set kept");
        assert!(v.inconsistent.contains(&key()));
        // The writer completes the set and commits again.
        let mut records = vec![connector(), task(0), commit(1), task(0), commit(2)];
        records.extend([task(1), commit(2)]);
        let v = view(&records);
        assert_eq!(v.connectors[&key()].tasks.len(), 2);
        assert!(v.inconsistent.is_empty());
    }

    #[test]
    fn a_target_state_written_before_the_config_applies_to_the_new_connector() {
        let paused = (
            ConfigKey::TargetState(key()),
            json(&TargetStateValue {
                state: TargetState::Paused,
            }),
        );
        let v = view(&[paused.clone(), connector()]);
        assert_eq!(v.connectors[&key()].target_state, TargetState::Paused);
        let v = view(&[connector(), paused]);
        assert_eq!(v.connectors[&key()].target_state, TargetState::Paused);
    }

    #[test]
    fn deleting_a_connector_or_its_tenant_removes_it_with_its_tasks() {
        let tenant = (
            ConfigKey::Tenant("acme".into()),
            json(&TenantValue {
                settings: config(&[("token.digest", "abc")]),
            }),
        );
        let mut records = vec![tenant, connector(), task(0), commit(1)];
        let v = view(&records);
        assert_eq!(v.tenants["acme"].settings["token.digest"], "abc");
        records.push((ConfigKey::Connector(key()), None));
        assert!(view(&records).connectors.is_empty());
        records.truncate(4);
        records.push((ConfigKey::Tenant("acme".into()), None));
        let v = view(&records);
        assert!(v.tenants.is_empty() && v.connectors.is_empty());
    }

    #[test]
    fn an_unreadable_record_is_named_not_skipped_silently() {
        let mut v = ConfigView::default();
        v.apply(0, Some(b"garbage"), Some(b"{}"));
        v.apply(
            1,
            Some(&ConfigKey::Connector(key()).encode()),
            Some(b"not json"),
        );
        assert_eq!(v.unreadable.len(), 2, "{:?}", v.unreadable);
        assert!(v.unreadable[1].contains("offset 1"));
        assert_eq!(v.offset, 2);
    }

    #[test]
    fn a_status_from_an_older_generation_does_not_replace_a_newer_one() {
        let k = StatusKey::Task(key(), 0);
        let status = |worker: &str, generation| {
            serde_json::to_vec(&Status {
                state: "RUNNING".into(),
                trace: None,
                worker_id: worker.into(),
                generation,
                restarts: 0,
            })
            .unwrap()
        };
        let mut v = StatusView::default();
        v.apply(0, Some(&k.encode()), Some(&status("w2", 5)));
        v.apply(1, Some(&k.encode()), Some(&status("w1", 4)));
        assert_eq!(v.statuses[&k].worker_id, "w2");
        v.apply(2, Some(&k.encode()), Some(&status("w3", 5)));
        assert_eq!(v.statuses[&k].worker_id, "w3");
        // The same worker after a restart of the whole group (generations start again).
        v.apply(3, Some(&k.encode()), Some(&status("w3", 1)));
        assert_eq!(v.statuses[&k].generation, 1);
        v.apply(4, Some(&k.encode()), None);
        assert!(v.statuses.is_empty());
    }
}
