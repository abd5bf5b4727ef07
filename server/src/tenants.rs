//! Tenants: who owns connectors, their quotas, client override policy and bearer token.
//!
//! A tenant is kept in the state store as a [`Tenant`] whose settings map holds, as text:
//! `quota.connectors`, `quota.tasks`, `quota.records.per.second`, `quota.bytes.per.second`,
//! `quota.inflight.records`, `quota.inflight.bytes` (absent: unlimited), `client.config.override.policy` and
//! `token.sha256`. Only the SHA-256 digest of a token is stored: tokens are 256 random bits,
//! so a fast digest is as good as a password hash and lets a request find its tenant in one
//! lookup. The token itself is shown once, in the answer that created (or rotated) it.
//!
//! The `default` tenant always exists (unlimited, the worker's override policy, no token);
//! the admin may give it quotas, which are then stored like any tenant's.
//!
//! Every request that authenticates reads the tenants in memory, so a change never holds
//! their locks while it writes the store (sled syncs to disk; in distributed mode the write is
//! a round trip to the config topic): it writes on a blocking thread first, then updates
//! memory. Changes take turns, so memory follows the store in the order the changes were
//! written, and a change the store refuses leaves memory as it was.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use rand::RngCore as _;
use serde::Serialize;
use sha2::{Digest, Sha256};
use spillway_actors::{Confinement, InflightBytes, OverridePolicy, TenantScope, Throttle};
use spillway_storage::{StateStore, StorageError, Tenant};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The tenant of every connector while authentication is off.
pub const DEFAULT_TENANT: &str = "default";

const TOKEN_DIGEST: &str = "token.sha256";
const POLICY: &str = "client.config.override.policy";

/// The quotas of one tenant; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Quotas {
    pub connectors: Option<u64>,
    pub tasks: Option<u64>,
    #[serde(rename = "records.per.second")]
    pub records_per_second: Option<u32>,
    #[serde(rename = "bytes.per.second")]
    pub bytes_per_second: Option<u32>,
    /// Records the tenant's tasks may hold between poll and commit: the sum over its
    /// connectors of `tasks.max × task.inflight.batches × max.poll.records`.
    #[serde(rename = "inflight.records")]
    pub inflight_records: Option<u64>,
    /// Bytes (keys, values and headers of the records) the tenant's tasks may hold between
    /// poll and commit, enforced while they run: a task does not poll while its tenant holds
    /// this much, so the total may exceed it by the batch of each poll already under way.
    #[serde(rename = "inflight.bytes")]
    pub inflight_bytes: Option<u64>,
}

/// The quota names, as in the API and the store (`quota.<name>`).
pub const QUOTA_NAMES: [&str; 6] = [
    "connectors",
    "tasks",
    "records.per.second",
    "bytes.per.second",
    "inflight.records",
    "inflight.bytes",
];

impl Quotas {
    /// The smallest value quota `name` takes: 0 refuses everything for counts; a rate or an
    /// in-flight bytes budget of 0 would stop the tenant's tasks for good, so it starts at 1.
    pub fn minimum(name: &str) -> u64 {
        match name {
            "records.per.second" | "bytes.per.second" | "inflight.bytes" => 1,
            _ => 0,
        }
    }

    /// Sets one quota by name; `None` removes it. The error says what is wrong.
    pub fn set(&mut self, name: &str, value: Option<u64>) -> Result<(), String> {
        let rate = |v: Option<u64>| -> Result<Option<u32>, String> {
            v.map(|v| {
                u32::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| {
                    format!("quota {name} must be from 1 to {}, found {v}", u32::MAX)
                })
            })
            .transpose()
        };
        match name {
            "connectors" => self.connectors = value,
            "tasks" => self.tasks = value,
            "inflight.records" => self.inflight_records = value,
            "inflight.bytes" => {
                if value == Some(0) {
                    return Err("quota inflight.bytes must be a positive number of bytes \
                                (at least 1), found 0; use null for no limit"
                        .to_owned());
                }
                self.inflight_bytes = value;
            }
            "records.per.second" => self.records_per_second = rate(value)?,
            "bytes.per.second" => self.bytes_per_second = rate(value)?,
            other => {
                return Err(format!(
                    "unknown quota '{other}'; the quotas are {}",
                    QUOTA_NAMES.join(", ")
                ))
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<u64> {
        match name {
            "connectors" => self.connectors,
            "tasks" => self.tasks,
            "inflight.records" => self.inflight_records,
            "inflight.bytes" => self.inflight_bytes,
            "records.per.second" => self.records_per_second.map(u64::from),
            "bytes.per.second" => self.bytes_per_second.map(u64::from),
            _ => None,
        }
    }
}

/// A tenant as the API shows it (never its token).
#[derive(Debug, Clone, Serialize)]
pub struct TenantInfo {
    pub name: String,
    pub quotas: Quotas,
    #[serde(rename = "client.config.override.policy")]
    pub policy: &'static str,
}

/// One tenant in memory.
#[derive(Clone)]
struct Entry {
    quotas: Quotas,
    policy: OverridePolicy,
    token_digest: Option<String>,
    /// Shared by the tenant's running tasks; its rates follow the quotas.
    throttle: Arc<Throttle>,
    /// The bytes the tenant's running tasks hold in flight; its limit follows the quota.
    inflight: Arc<InflightBytes>,
}

impl Entry {
    fn to_record(&self, name: &str) -> Tenant {
        let mut settings = BTreeMap::new();
        for quota in QUOTA_NAMES {
            if let Some(v) = self.quotas.get(quota) {
                settings.insert(format!("quota.{quota}"), v.to_string());
            }
        }
        settings.insert(POLICY.to_owned(), self.policy.as_str().to_owned());
        if let Some(digest) = &self.token_digest {
            settings.insert(TOKEN_DIGEST.to_owned(), digest.clone());
        }
        Tenant {
            name: name.to_owned(),
            settings,
        }
    }

    fn from_record(record: &Tenant) -> Result<Entry, String> {
        let mut quotas = Quotas::default();
        for quota in QUOTA_NAMES {
            if let Some(text) = record.settings.get(&format!("quota.{quota}")) {
                let value = text
                    .parse::<u64>()
                    .map_err(|_| format!("quota.{quota}='{text}' is not a number"))?;
                quotas.set(quota, Some(value))?;
            }
        }
        let policy = match record.settings.get(POLICY) {
            Some(text) => OverridePolicy::parse(POLICY, text).map_err(|e| e.to_string())?,
            None => OverridePolicy::Restricted,
        };
        Ok(Entry {
            throttle: Arc::new(Throttle::new(
                quotas.records_per_second,
                quotas.bytes_per_second,
            )),
            inflight: Arc::new(InflightBytes::new(quotas.inflight_bytes)),
            quotas,
            policy,
            token_digest: record.settings.get(TOKEN_DIGEST).cloned(),
        })
    }
}

/// Why a tenant request failed.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("Tenant {0} not found")]
    Unknown(String),
    #[error("Tenant {0} already exists")]
    Exists(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The blocking thread that writes the change stopped before it finished (a panic in the
    /// store, or the worker shutting down); whether the store holds the change is unknown
    /// until the tenant is read again.
    #[error("the change of tenant {tenant} did not finish: {reason}")]
    Unfinished { tenant: String, reason: String },
}

/// The tenants of a worker: cached from the store, written through to it.
pub struct Tenants {
    store: Arc<dyn StateStore>,
    /// The override policy of the `default` tenant (the worker's).
    default_policy: OverridePolicy,
    /// What the store holds, as every request that authenticates reads it.
    known: Arc<Known>,
    /// One change at a time, held from its checks until memory follows the store: two changes
    /// cannot be written in one order and applied in the other.
    turn: Arc<AsyncMutex<()>>,
    /// Where tenants' files go and where their sinks may connect (authentication on).
    confinement: Confinement,
}

/// The tenants in memory.
struct Known {
    entries: RwLock<BTreeMap<String, Entry>>,
    /// Token digest → tenant.
    tokens: RwLock<HashMap<String, String>>,
}

/// A change of one tenant: written to the store, then applied to memory.
enum Change {
    /// Adds the tenant, or gives it new settings.
    Put {
        name: String,
        entry: Entry,
    },
    Delete {
        name: String,
    },
}

impl Change {
    fn name(&self) -> &str {
        match self {
            Change::Put { name, .. } | Change::Delete { name } => name,
        }
    }

    fn write(&self, store: &dyn StateStore) -> Result<(), StorageError> {
        match self {
            Change::Put { name, entry } => store.put_tenant(&entry.to_record(name)),
            Change::Delete { name } => store.delete_tenant(name).map(|_| ()),
        }
    }
}

impl Known {
    fn apply(&self, change: Change) {
        let mut entries = write(&self.entries);
        match change {
            Change::Put { name, entry } => {
                let old = entries.get(&name).and_then(|e| e.token_digest.clone());
                let new = entry.token_digest.clone();
                adopt(&mut entries, &name, entry);
                let mut tokens = write(&self.tokens);
                if let Some(old) = old {
                    tokens.remove(&old);
                }
                if let Some(new) = new {
                    tokens.insert(new, name);
                }
            }
            Change::Delete { name } => {
                if let Some(digest) = entries.remove(&name).and_then(|e| e.token_digest) {
                    write(&self.tokens).remove(&digest);
                }
            }
        }
    }
}

/// Gives tenant `name` the settings of `fresh`. A known tenant keeps its throttle and in-flight
/// budget, which its running tasks share, with the new limits.
fn adopt(entries: &mut BTreeMap<String, Entry>, name: &str, fresh: Entry) {
    match entries.get_mut(name) {
        Some(entry) => {
            entry.throttle.set_rates(
                fresh.quotas.records_per_second,
                fresh.quotas.bytes_per_second,
            );
            entry.inflight.set_limit(fresh.quotas.inflight_bytes);
            entry.quotas = fresh.quotas;
            entry.policy = fresh.policy;
            entry.token_digest = fresh.token_digest;
        }
        None => {
            entries.insert(name.to_owned(), fresh);
        }
    }
}

/// A tenant name: 1 to 64 letters, digits, `_` or `-`, so that `<tenant>.` prefixes and
/// `<tenant>/<connector>` keys can be split again.
pub fn check_tenant_name(name: &str) -> Result<(), TenantError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(TenantError::Invalid(format!(
            "invalid tenant name '{}': use 1 to 64 letters, digits, '_' or '-'",
            name.escape_debug()
        )))
    }
}

/// SHA-256 of a token, as lowercase hex.
pub fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!(
        "spw_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Writers replace whole entries; a panic elsewhere cannot leave one half written.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

impl Tenants {
    /// Loads every stored tenant; a tenant record that cannot be read stops the worker.
    pub fn load(
        store: Arc<dyn StateStore>,
        default_policy: OverridePolicy,
        confinement: Confinement,
    ) -> Result<Tenants, TenantError> {
        let mut entries = BTreeMap::new();
        let mut tokens = HashMap::new();
        for record in store.tenants()? {
            let mut entry = Entry::from_record(&record).map_err(|e| {
                TenantError::Invalid(format!(
                    "the stored tenant '{}' cannot be read: {e}",
                    record.name
                ))
            })?;
            if record.name == DEFAULT_TENANT {
                entry.policy = default_policy;
                entry.token_digest = None;
            }
            if let Some(d) = &entry.token_digest {
                tokens.insert(d.clone(), record.name.clone());
            }
            entries.insert(record.name.clone(), entry);
        }
        entries
            .entry(DEFAULT_TENANT.to_owned())
            .or_insert_with(|| Entry {
                quotas: Quotas::default(),
                policy: default_policy,
                token_digest: None,
                throttle: Arc::new(Throttle::new(None, None)),
                inflight: Arc::new(InflightBytes::new(None)),
            });
        Ok(Tenants {
            store,
            default_policy,
            known: Arc::new(Known {
                entries: RwLock::new(entries),
                tokens: RwLock::new(tokens),
            }),
            turn: Arc::new(AsyncMutex::new(())),
            confinement,
        })
    }

    /// Distributed mode: takes the tenants another worker wrote (read from the config topic).
    /// Known tenants keep their throttles and in-flight budgets, with the new limits; tenants
    /// gone are forgotten with their tokens. A record that cannot be read is logged and the
    /// tenant keeps what this worker knew of it.
    ///
    /// `read_at` is the config-topic offset the records were read at, `latest` the offset read
    /// to now. Checked under the lock this worker's own changes take to update memory, which
    /// they do once their write has returned (and been read back): records older than a change
    /// this worker just made are not applied (they would undo it); the next read brings both.
    pub fn sync(&self, records: &[Tenant], read_at: i64, latest: impl Fn() -> i64) {
        let mut entries = write(&self.known.entries);
        if latest() > read_at {
            return;
        }
        let mut tokens = HashMap::new();
        let mut seen = std::collections::BTreeSet::new();
        for record in records {
            seen.insert(record.name.clone());
            if record.name == DEFAULT_TENANT {
                continue;
            }
            match Entry::from_record(record) {
                Ok(fresh) => adopt(&mut entries, &record.name, fresh),
                Err(e) => {
                    tracing::warn!(tenant = %record.name, error = %e, "the tenant record in the config topic cannot be read; keeping what this worker knew");
                }
            }
        }
        entries.retain(|name, _| name == DEFAULT_TENANT || seen.contains(name));
        for (name, entry) in entries.iter() {
            if let Some(d) = &entry.token_digest {
                tokens.insert(d.clone(), name.clone());
            }
        }
        *write(&self.known.tokens) = tokens;
    }

    pub fn exists(&self, name: &str) -> bool {
        read(&self.known.entries).contains_key(name)
    }

    /// The tenant a bearer token belongs to.
    pub fn by_token(&self, token: &str) -> Option<String> {
        read(&self.known.tokens).get(&digest(token)).cloned()
    }

    pub fn list(&self) -> Vec<TenantInfo> {
        read(&self.known.entries)
            .iter()
            .map(|(name, e)| info(name, e))
            .collect()
    }

    pub fn get(&self, name: &str) -> Result<TenantInfo, TenantError> {
        read(&self.known.entries)
            .get(name)
            .map(|e| info(name, e))
            .ok_or_else(|| TenantError::Unknown(name.to_owned()))
    }

    pub fn quotas(&self, name: &str) -> Quotas {
        read(&self.known.entries)
            .get(name)
            .map(|e| e.quotas)
            .unwrap_or_default()
    }

    /// How the runtime runs a connector of `tenant`.
    pub fn scope(&self, tenant: &str) -> TenantScope {
        let entries = read(&self.known.entries);
        let entry = entries.get(tenant);
        let prefix = (tenant != DEFAULT_TENANT).then(|| tenant.to_owned());
        let (files_dir, egress) = self.confinement.for_tenant(prefix.as_deref());
        TenantScope {
            prefix,
            policy: entry.map_or(OverridePolicy::Restricted, |e| e.policy),
            throttle: entry.map(|e| Arc::clone(&e.throttle)),
            inflight: entry.map(|e| Arc::clone(&e.inflight)),
            files_dir,
            egress,
        }
    }

    /// The bytes the tenant's running tasks hold between poll and commit now.
    pub fn inflight_bytes(&self, tenant: &str) -> u64 {
        read(&self.known.entries)
            .get(tenant)
            .map_or(0, |e| e.inflight.used())
    }

    /// Creates a tenant; returns it with its token (shown only here).
    pub async fn create(
        &self,
        name: &str,
        quotas: Quotas,
        policy: Option<OverridePolicy>,
    ) -> Result<(TenantInfo, String), TenantError> {
        check_tenant_name(name)?;
        let turn = self.take_turn().await;
        if self.exists(name) {
            return Err(TenantError::Exists(name.to_owned()));
        }
        let token = new_token();
        let entry = Entry {
            quotas,
            policy: policy.unwrap_or(OverridePolicy::Restricted),
            token_digest: Some(digest(&token)),
            throttle: Arc::new(Throttle::new(
                quotas.records_per_second,
                quotas.bytes_per_second,
            )),
            inflight: Arc::new(InflightBytes::new(quotas.inflight_bytes)),
        };
        let shown = info(name, &entry);
        self.commit(
            turn,
            Change::Put {
                name: name.to_owned(),
                entry,
            },
        )
        .await?;
        Ok((shown, token))
    }

    /// Replaces a tenant's quotas and policy (`None` keeps the policy); running tasks follow
    /// the new rates from their next poll.
    pub async fn update(
        &self,
        name: &str,
        quotas: Quotas,
        policy: Option<OverridePolicy>,
    ) -> Result<TenantInfo, TenantError> {
        if name == DEFAULT_TENANT && policy.is_some_and(|p| p != self.default_policy) {
            return Err(TenantError::Invalid(format!(
                "the default tenant's client config override policy is the worker's {}; change it in the worker properties",
                spillway_actors::tenancy::OVERRIDE_POLICY
            )));
        }
        let turn = self.take_turn().await;
        let mut updated = self.entry(name)?;
        updated.quotas = quotas;
        if let Some(p) = policy {
            updated.policy = p;
        }
        let shown = info(name, &updated);
        self.commit(
            turn,
            Change::Put {
                name: name.to_owned(),
                entry: updated,
            },
        )
        .await?;
        Ok(shown)
    }

    /// Gives a tenant a new token (the old one stops working) and returns it.
    pub async fn rotate_token(&self, name: &str) -> Result<String, TenantError> {
        if name == DEFAULT_TENANT {
            return Err(TenantError::Invalid(
                "the default tenant has no token: callers with the admin token act on it".into(),
            ));
        }
        let turn = self.take_turn().await;
        let mut updated = self.entry(name)?;
        let token = new_token();
        updated.token_digest = Some(digest(&token));
        self.commit(
            turn,
            Change::Put {
                name: name.to_owned(),
                entry: updated,
            },
        )
        .await?;
        Ok(token)
    }

    /// Forgets a tenant (its connectors must be gone already).
    pub async fn delete(&self, name: &str) -> Result<(), TenantError> {
        if name == DEFAULT_TENANT {
            return Err(TenantError::Invalid(
                "the default tenant cannot be deleted".into(),
            ));
        }
        let turn = self.take_turn().await;
        self.entry(name)?;
        self.commit(
            turn,
            Change::Delete {
                name: name.to_owned(),
            },
        )
        .await
    }

    /// Waits for the changes before this one to be written and applied.
    async fn take_turn(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.turn).lock_owned().await
    }

    /// A copy of tenant `name` as memory holds it, to change and commit.
    fn entry(&self, name: &str) -> Result<Entry, TenantError> {
        read(&self.known.entries)
            .get(name)
            .cloned()
            .ok_or_else(|| TenantError::Unknown(name.to_owned()))
    }

    /// Writes `change` to the store, then applies it to memory, both on a blocking thread that
    /// holds `turn` until it is done: a caller that stops waiting (a REST client that hangs
    /// up) can neither leave memory behind the store nor let the next change in between. A
    /// write the store refuses changes nothing.
    async fn commit(&self, turn: OwnedMutexGuard<()>, change: Change) -> Result<(), TenantError> {
        let tenant = change.name().to_owned();
        let (store, known) = (Arc::clone(&self.store), Arc::clone(&self.known));
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            change.write(store.as_ref())?;
            known.apply(change);
            Ok(())
        })
        .await
        .map_err(|e| TenantError::Unfinished {
            tenant,
            reason: e.to_string(),
        })?
    }
}

fn info(name: &str, entry: &Entry) -> TenantInfo {
    TenantInfo {
        name: name.to_owned(),
        quotas: entry.quotas,
        policy: entry.policy.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use spillway_storage::SledStore;

    use super::*;

    fn store(dir: &std::path::Path) -> Arc<dyn StateStore> {
        Arc::new(SledStore::open(dir).expect("store"))
    }

    /// The tenants as a starting worker loads them from `store`.
    fn tenants(store: &Arc<dyn StateStore>) -> Tenants {
        Tenants::load(
            Arc::clone(store),
            OverridePolicy::All,
            Confinement::default(),
        )
        .expect("load")
    }

    /// Distributed mode: another worker's tenants follow the writer's records — creation, a new
    /// quota, a rotated token, deletion — and records read before this worker's own change
    /// do not undo it.
    #[tokio::test]
    async fn a_worker_follows_the_tenants_another_wrote_and_ignores_records_older_than_its_own_change(
    ) {
        let (writer_dir, reader_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let writer_store = store(writer_dir.path());
        let (writer, reader) = (tenants(&writer_store), tenants(&store(reader_dir.path())));
        let records = || writer_store.tenants().expect("records");
        let (_, token) = writer
            .create("acme", Quotas::default(), None)
            .await
            .unwrap();
        reader.sync(&records(), 1, || 1);
        assert_eq!(reader.by_token(&token).as_deref(), Some("acme"));
        let quotas = Quotas {
            connectors: Some(3),
            ..Quotas::default()
        };
        writer.update("acme", quotas, None).await.unwrap();
        let rotated = writer.rotate_token("acme").await.unwrap();
        reader.sync(&records(), 2, || 2);
        assert_eq!(reader.quotas("acme").connectors, Some(3));
        assert_eq!(
            reader.by_token(&token),
            None,
            "the old token stopped working"
        );
        assert_eq!(reader.by_token(&rotated).as_deref(), Some("acme"));
        // Read before a change made at offset 4: not applied.
        reader.sync(&[], 3, || 4);
        assert!(reader.exists("acme"));
        writer.delete("acme").await.unwrap();
        reader.sync(&records(), 5, || 5);
        assert!(!reader.exists("acme") && reader.by_token(&rotated).is_none());
        assert!(reader.exists(DEFAULT_TENANT));
    }

    #[tokio::test]
    async fn a_created_tenant_survives_a_restart_and_only_its_token_finds_it() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store(dir.path());
        let quotas = Quotas {
            connectors: Some(2),
            records_per_second: Some(100),
            inflight_bytes: Some(1 << 20),
            ..Quotas::default()
        };
        let token = {
            let t = tenants(&store);
            let (info, token) = t.create("acme", quotas, None).await.expect("create");
            assert_eq!(info.policy, "Restricted");
            assert!(matches!(
                t.create("acme", quotas, None).await,
                Err(TenantError::Exists(_))
            ));
            token
        };
        let t = tenants(&store);
        assert_eq!(t.by_token(&token).as_deref(), Some("acme"));
        assert_eq!(t.by_token("spw_guess"), None);
        assert_eq!(t.quotas("acme"), quotas);
        let budget = t
            .scope("acme")
            .inflight
            .expect("a tenant's tasks share a budget");
        assert_eq!(budget.limit(), Some(1 << 20));
        let held = budget.hold(300);
        assert_eq!(t.inflight_bytes("acme"), 300);
        t.update("acme", Quotas::default(), None)
            .await
            .expect("update");
        assert_eq!(budget.limit(), None, "running tasks follow the new quota");
        drop(held);
        assert_eq!(t.inflight_bytes("acme"), 0);
        let names: Vec<String> = t.list().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["acme", "default"]);
        let stored = t.store.tenants().expect("tenants");
        let text = format!("{stored:?}");
        assert!(!text.contains(&token), "the token itself is never stored");

        let rotated = t.rotate_token("acme").await.expect("rotate");
        assert_eq!(t.by_token(&token), None, "the old token stops working");
        assert_eq!(t.by_token(&rotated).as_deref(), Some("acme"));
        t.delete("acme").await.expect("delete");
        assert_eq!(t.by_token(&rotated), None);
        assert!(!t.exists("acme"));
        assert!(!tenants(&store).exists("acme"), "the deletion is stored");
    }

    #[test]
    fn a_bare_stored_tenant_loads_with_defaults_and_a_damaged_one_stops_the_load() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store(dir.path());
        store
            .put_tenant(&Tenant {
                name: "old".into(),
                settings: BTreeMap::new(),
            })
            .expect("put");
        let t = tenants(&store);
        let old = t.get("old").expect("loaded");
        assert_eq!(old.quotas, Quotas::default());
        assert_eq!(old.policy, "Restricted");
        assert_eq!(t.scope("old").prefix.as_deref(), Some("old"));
        store
            .put_tenant(&Tenant {
                name: "bad".into(),
                settings: BTreeMap::from([("quota.tasks".into(), "lots".into())]),
            })
            .expect("put");
        let err = Tenants::load(store, OverridePolicy::All, Confinement::default())
            .err()
            .expect("a damaged tenant stops the load");
        let message = err.to_string();
        assert!(message.contains("'bad'"), "{message}");
        assert!(message.contains("quota.tasks='lots'"), "{message}");
    }

    #[tokio::test]
    async fn bad_names_quotas_and_default_tenant_changes_are_refused_clearly() {
        let dir = tempfile::tempdir().expect("dir");
        let store = store(dir.path());
        let t = tenants(&store);
        for bad in ["", "a.b", "a/b", "ä", &"x".repeat(65)] {
            let err = t
                .create(bad, Quotas::default(), None)
                .await
                .expect_err("bad name");
            assert!(err.to_string().contains("invalid tenant name"), "{err}");
        }
        let err = Quotas::default()
            .set("records.per.second", Some(0))
            .expect_err("zero rate");
        assert!(err.contains("records.per.second"), "{err}");
        let err = Quotas::default()
            .set("inflight.bytes", Some(0))
            .expect_err("zero bytes in flight");
        assert!(err.contains("inflight.bytes"), "{err}");
        let err = Quotas::default().set("cpu", Some(1)).expect_err("unknown");
        assert!(err.contains("'cpu'"), "{err}");
        assert!(t.delete(DEFAULT_TENANT).await.is_err());
        assert!(t
            .update(
                DEFAULT_TENANT,
                Quotas::default(),
                Some(OverridePolicy::None)
            )
            .await
            .is_err());
        let updated = t
            .update(
                DEFAULT_TENANT,
                Quotas {
                    tasks: Some(3),
                    ..Quotas::default()
                },
                None,
            )
            .await
            .expect("default quotas");
        assert_eq!(updated.quotas.tasks, Some(3));
        assert_eq!(updated.policy, "All");
        assert!(t.scope(DEFAULT_TENANT).prefix.is_none());
        assert_eq!(
            tenants(&store).quotas(DEFAULT_TENANT).tasks,
            Some(3),
            "the default tenant's quotas are stored too"
        );
    }
}
