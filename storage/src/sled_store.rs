//! [`SledStore`]: the [`StateStore`] on sled 0.34, one directory per worker (`state.dir`).
//!
//! Trees: `meta` (the format version), `tenants` (name → [`Tenant`]), `connectors`
//! (`tenant NUL name` → [`ConnectorRecord`]), `tasks` (`tenant NUL name NUL task-id` →
//! [`TaskRecord`]). Every write ends with a flush of sled's log, so it is on disk when the call
//! returns.
//!
//! Beside sled's files lies a marker file written once the store is initialised. sled recovers
//! a damaged log by keeping what it can read, which can be nothing; the marker tells "a new
//! store" from "a store whose contents vanished", and the second stops the worker.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use crate::error::StorageError;
use crate::model::{tenant_prefix, ConnectorKey, ConnectorRecord, TargetState, TaskRecord, Tenant};
use crate::StateStore;

/// The format this build writes and the newest it reads. Raise it when old code could not
/// read what new code writes.
pub const FORMAT_VERSION: u32 = 1;

const FORMAT_KEY: &[u8] = b"format_version";
/// Written after the format version; its presence means the store was initialised.
const MARKER_FILE: &str = "SPILLWAY_STATE";

/// The state store in a sled database.
pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    tenants: sled::Tree,
    connectors: sled::Tree,
    tasks: sled::Tree,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .finish()
    }
}

/// How long `open` waits for the file lock of a store that was just closed in this process:
/// sled's background flusher lets go of it shortly after the last handle is dropped.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens sled, waiting up to [`LOCK_WAIT`] while its file lock is held; a panic inside sled
/// (unreadable files) is returned as `Err`.
fn open_sled(path: &Path) -> std::thread::Result<sled::Result<sled::Db>> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        let opened = std::panic::catch_unwind(|| sled::Config::new().path(path).open());
        match &opened {
            Ok(Err(sled::Error::Io(e)))
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            _ => return opened,
        }
    }
}

impl SledStore {
    /// Opens (or creates) the store in `dir`, checks its format version and reads every record
    /// once, so that a damaged record stops startup instead of a later call.
    pub fn open(dir: &Path) -> Result<SledStore, StorageError> {
        let path = dir.to_path_buf();
        let initialised = path.join(MARKER_FILE).exists();
        let db = match open_sled(&path) {
            Ok(Ok(db)) => db,
            Ok(Err(sled::Error::Corruption { at, .. })) => {
                return Err(StorageError::Damaged {
                    path,
                    detail: match at {
                        Some(at) => format!("sled found corrupt data at {at}"),
                        None => "sled found corrupt data".to_owned(),
                    },
                })
            }
            Ok(Err(error)) => return Err(StorageError::Open { path, error }),
            Err(_) => {
                return Err(StorageError::Damaged {
                    path,
                    detail: "sled could not read its files".to_owned(),
                })
            }
        };
        let tree = |name: &str| {
            db.open_tree(name).map_err(|error| StorageError::Open {
                path: path.clone(),
                error,
            })
        };
        let meta = tree("meta")?;
        let store = SledStore {
            tenants: tree("tenants")?,
            connectors: tree("connectors")?,
            tasks: tree("tasks")?,
            db: db.clone(),
            path: path.clone(),
        };
        let version = meta.get(FORMAT_KEY).map_err(|e| store.read_error(e))?;
        match version {
            Some(bytes) => {
                let found = <[u8; 4]>::try_from(bytes.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| store.damaged(format!("the format version is {} bytes long, not 4", bytes.len())))?;
                if found > FORMAT_VERSION {
                    return Err(StorageError::NewerFormat {
                        path,
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
            }
            None if initialised => {
                return Err(store.damaged(format!(
                    "its format version is gone although {MARKER_FILE} says it was initialised (sled's log was cut or overwritten)"
                )))
            }
            None => {
                if !store.connectors.is_empty() || !store.tenants.is_empty() || !store.tasks.is_empty() {
                    return Err(store.damaged("it holds records but no format version".to_owned()));
                }
                meta.insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes())
                    .map_err(|e| store.write_error(e))?;
                store.flush()?;
            }
        }
        if !initialised {
            std::fs::write(
                path.join(MARKER_FILE),
                format!("Spillway worker state (sled), format version {FORMAT_VERSION}. Do not delete: without it a damaged store cannot be told from a new one.\n"),
            )
            .map_err(|e| store.damaged(format!("cannot write {MARKER_FILE}: {e}")))?;
        }
        store.tenants()?;
        for (key, _) in store.connectors()? {
            store.tasks(&key)?;
        }
        Ok(store)
    }

    /// A store that lives only as long as this process (sled's temporary mode): `spillway
    /// standalone` keeps changes made over its REST API until it stops, as Kafka Connect's
    /// standalone worker does; its connectors come from its files at every start.
    pub fn temporary() -> Result<SledStore, StorageError> {
        let path = PathBuf::from("(temporary)");
        let db = sled::Config::new()
            .temporary(true)
            .open()
            .map_err(|error| StorageError::Open {
                path: path.clone(),
                error,
            })?;
        let tree = |name: &str| {
            db.open_tree(name).map_err(|error| StorageError::Open {
                path: path.clone(),
                error,
            })
        };
        Ok(SledStore {
            tenants: tree("tenants")?,
            connectors: tree("connectors")?,
            tasks: tree("tasks")?,
            db: db.clone(),
            path,
        })
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn flush(&self) -> Result<(), StorageError> {
        self.db.flush().map_err(|e| self.write_error(e))?;
        Ok(())
    }

    fn damaged(&self, detail: String) -> StorageError {
        StorageError::Damaged {
            path: self.path.clone(),
            detail,
        }
    }

    fn read_error(&self, error: sled::Error) -> StorageError {
        StorageError::Read {
            path: self.path.clone(),
            error,
        }
    }

    fn write_error(&self, error: sled::Error) -> StorageError {
        StorageError::Write {
            path: self.path.clone(),
            error,
        }
    }

    fn transaction_error(&self, e: TransactionError<StorageError>) -> StorageError {
        match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(error) => self.write_error(error),
        }
    }

    fn decode<T: DeserializeOwned>(
        &self,
        tree: &str,
        key: &[u8],
        bytes: &[u8],
    ) -> Result<T, StorageError> {
        serde_json::from_slice(bytes).map_err(|e| {
            self.damaged(format!(
                "the record '{}' in '{tree}' cannot be read ({e})",
                String::from_utf8_lossy(key).replace('\0', "/")
            ))
        })
    }

    fn encode<T: Serialize>(value: &T) -> Vec<u8> {
        // Plain structs of strings, numbers and maps with string keys: serializing cannot fail.
        serde_json::to_vec(value).unwrap_or_default()
    }

    fn task_key(key: &ConnectorKey, task: u32) -> Result<Vec<u8>, StorageError> {
        let mut bytes = key.task_prefix()?;
        bytes.extend_from_slice(&task.to_be_bytes());
        Ok(bytes)
    }

    /// Reads the connector record at `key`, applies `change` and writes it back, atomically.
    fn update_connector<T>(
        &self,
        key: &ConnectorKey,
        change: impl Fn(&mut ConnectorRecord) -> T,
    ) -> Result<Option<T>, StorageError> {
        let encoded = key.encode()?;
        let result = self
            .connectors
            .transaction(|tx| {
                let Some(bytes) = tx.get(&encoded)? else {
                    return Ok(None);
                };
                let mut record: ConnectorRecord = self
                    .decode("connectors", &encoded, &bytes)
                    .map_err(ConflictableTransactionError::Abort)?;
                let out = change(&mut record);
                tx.insert(encoded.as_slice(), Self::encode(&record))?;
                Ok(Some(out))
            })
            .map_err(|e| self.transaction_error(e))?;
        self.flush()?;
        Ok(result)
    }
}

impl StateStore for SledStore {
    fn put_tenant(&self, tenant: &Tenant) -> Result<(), StorageError> {
        tenant_prefix(&tenant.name)?;
        self.tenants
            .insert(tenant.name.as_bytes(), Self::encode(tenant))
            .map_err(|e| self.write_error(e))?;
        self.flush()
    }

    fn delete_tenant(&self, name: &str) -> Result<bool, StorageError> {
        let prefix = tenant_prefix(name)?;
        let owned: Vec<ConnectorKey> = self
            .connectors
            .scan_prefix(&prefix)
            .keys()
            .filter_map(|k| k.ok().and_then(|k| ConnectorKey::decode(&k)))
            .collect();
        for key in &owned {
            self.delete_connector(key)?;
        }
        let existed = self
            .tenants
            .remove(name.as_bytes())
            .map_err(|e| self.write_error(e))?
            .is_some();
        self.flush()?;
        Ok(existed)
    }

    fn tenants(&self) -> Result<Vec<Tenant>, StorageError> {
        self.tenants
            .iter()
            .map(|entry| {
                let (k, v) = entry.map_err(|e| self.read_error(e))?;
                self.decode("tenants", &k, &v)
            })
            .collect()
    }

    fn put_connector(
        &self,
        key: &ConnectorKey,
        record: &ConnectorRecord,
    ) -> Result<(), StorageError> {
        self.connectors
            .insert(key.encode()?, Self::encode(record))
            .map_err(|e| self.write_error(e))?;
        self.flush()
    }

    fn connector(&self, key: &ConnectorKey) -> Result<Option<ConnectorRecord>, StorageError> {
        let encoded = key.encode()?;
        match self
            .connectors
            .get(&encoded)
            .map_err(|e| self.read_error(e))?
        {
            Some(bytes) => self.decode("connectors", &encoded, &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn set_target_state(
        &self,
        key: &ConnectorKey,
        state: TargetState,
    ) -> Result<bool, StorageError> {
        Ok(self
            .update_connector(key, |record| record.target_state = state)?
            .is_some())
    }

    fn count_connector_restart(&self, key: &ConnectorKey) -> Result<Option<u32>, StorageError> {
        self.update_connector(key, |record| {
            record.restarts = record.restarts.saturating_add(1);
            record.restarts
        })
    }

    fn delete_connector(&self, key: &ConnectorKey) -> Result<bool, StorageError> {
        let encoded = key.encode()?;
        let prefix = key.task_prefix()?;
        let task_keys: Vec<sled::IVec> = self
            .tasks
            .scan_prefix(&prefix)
            .keys()
            .collect::<Result<_, _>>()
            .map_err(|e| self.read_error(e))?;
        // put_task checks the connector inside a transaction over both trees, so no task
        // record can be added between this scan and the removal.
        let existed = (&self.connectors, &self.tasks)
            .transaction(|(connectors, tasks)| {
                for task in &task_keys {
                    tasks.remove(task)?;
                }
                Ok(connectors.remove(encoded.as_slice())?.is_some())
            })
            .map_err(|e: TransactionError<StorageError>| self.transaction_error(e))?;
        // Task records written before the connector existed again under this name.
        for leftover in self.tasks.scan_prefix(&prefix).keys() {
            let leftover = leftover.map_err(|e| self.read_error(e))?;
            self.tasks
                .remove(leftover)
                .map_err(|e| self.write_error(e))?;
        }
        self.flush()?;
        Ok(existed)
    }

    fn connectors(&self) -> Result<Vec<(ConnectorKey, ConnectorRecord)>, StorageError> {
        self.connectors
            .iter()
            .map(|entry| {
                let (k, v) = entry.map_err(|e| self.read_error(e))?;
                let key = ConnectorKey::decode(&k).ok_or_else(|| {
                    self.damaged(format!(
                        "the connector key '{}' is not 'tenant NUL name'",
                        String::from_utf8_lossy(&k)
                    ))
                })?;
                Ok((key, self.decode("connectors", &k, &v)?))
            })
            .collect()
    }

    fn put_task(
        &self,
        key: &ConnectorKey,
        task: u32,
        record: &TaskRecord,
    ) -> Result<bool, StorageError> {
        let connector = key.encode()?;
        let task_key = Self::task_key(key, task)?;
        let value = Self::encode(record);
        let stored = (&self.connectors, &self.tasks)
            .transaction(|(connectors, tasks)| {
                if connectors.get(&connector)?.is_none() {
                    return Ok(false);
                }
                tasks.insert(task_key.as_slice(), value.as_slice())?;
                Ok(true)
            })
            .map_err(|e: TransactionError<StorageError>| self.transaction_error(e))?;
        if stored {
            self.flush()?;
        }
        Ok(stored)
    }

    fn tasks(&self, key: &ConnectorKey) -> Result<Vec<(u32, TaskRecord)>, StorageError> {
        let prefix = key.task_prefix()?;
        self.tasks
            .scan_prefix(&prefix)
            .map(|entry| {
                let (k, v) = entry.map_err(|e| self.read_error(e))?;
                let id = <[u8; 4]>::try_from(&k[prefix.len()..])
                    .map(u32::from_be_bytes)
                    .map_err(|_| {
                        self.damaged(format!(
                            "the task key of connector {key} has no 4-byte task id"
                        ))
                    })?;
                Ok((id, self.decode("tasks", &k, &v)?))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn config(name: &str) -> BTreeMap<String, String> {
        [
            ("name", name),
            ("connector.class", "file"),
            ("topics", "orders"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    fn failed(trace: &str, restarts: u32) -> TaskRecord {
        TaskRecord {
            state: "FAILED".into(),
            trace: Some(trace.into()),
            restarts,
        }
    }

    #[test]
    fn connectors_tasks_and_tenants_round_trip() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SledStore::open(dir.path()).expect("opens");
        let key = ConnectorKey::new("default", "files");
        let record = ConnectorRecord::new(config("files"), TargetState::Paused);
        store.put_connector(&key, &record).expect("put");
        assert_eq!(store.connector(&key).expect("get"), Some(record.clone()));
        assert!(store.put_task(&key, 1, &failed("boom", 2)).expect("task"));
        assert_eq!(
            store.tasks(&key).expect("tasks"),
            vec![(1, failed("boom", 2))]
        );
        assert!(store
            .set_target_state(&key, TargetState::Stopped)
            .expect("target"));
        assert_eq!(
            store.count_connector_restart(&key).expect("restart"),
            Some(1)
        );
        let stored = store.connector(&key).expect("get").expect("present");
        assert_eq!(stored.target_state, TargetState::Stopped);
        assert_eq!(stored.restarts, 1);
        let tenant = Tenant {
            name: "acme".into(),
            settings: BTreeMap::from([("quota.connectors".into(), "3".into())]),
        };
        store.put_tenant(&tenant).expect("tenant");
        assert_eq!(store.tenants().expect("tenants"), vec![tenant]);
    }

    #[test]
    fn a_reopened_store_sees_every_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let a = ConnectorKey::new("default", "a");
        let b = ConnectorKey::new("acme", "a");
        {
            let store = SledStore::open(dir.path()).expect("opens");
            store
                .put_connector(&a, &ConnectorRecord::new(config("a"), TargetState::Running))
                .expect("put a");
            store
                .put_connector(&b, &ConnectorRecord::new(config("a"), TargetState::Stopped))
                .expect("put b");
            store
                .put_task(&a, 0, &failed("disk full", 3))
                .expect("task");
            store
                .put_tenant(&Tenant {
                    name: "acme".into(),
                    settings: BTreeMap::new(),
                })
                .expect("tenant");
        }
        let store = reopen(dir.path()).expect("reopens");
        let all = store.connectors().expect("list");
        assert_eq!(
            all.iter()
                .map(|(k, r)| (k.clone(), r.target_state))
                .collect::<Vec<_>>(),
            vec![(b, TargetState::Stopped), (a.clone(), TargetState::Running)]
        );
        assert_eq!(
            store.tasks(&a).expect("tasks"),
            vec![(0, failed("disk full", 3))]
        );
        assert_eq!(store.tenants().expect("tenants").len(), 1);
    }

    #[test]
    fn deleting_a_connector_removes_its_tasks_and_late_task_reports_are_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SledStore::open(dir.path()).expect("opens");
        let key = ConnectorKey::new("default", "files");
        store
            .put_connector(
                &key,
                &ConnectorRecord::new(config("files"), TargetState::Running),
            )
            .expect("put");
        store.put_task(&key, 0, &failed("x", 0)).expect("task");
        assert!(store.delete_connector(&key).expect("delete"));
        assert!(!store.delete_connector(&key).expect("second delete"));
        assert!(!store
            .put_task(&key, 0, &failed("late", 0))
            .expect("late task"));
        store
            .put_connector(
                &key,
                &ConnectorRecord::new(config("files"), TargetState::Running),
            )
            .expect("recreate");
        assert!(store.tasks(&key).expect("tasks").is_empty());
        assert_eq!(
            store
                .count_connector_restart(&ConnectorKey::new("default", "nope"))
                .expect("count"),
            None
        );
    }

    #[test]
    fn deleting_a_tenant_removes_only_its_connectors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SledStore::open(dir.path()).expect("opens");
        for tenant in ["acme", "acme2"] {
            store
                .put_tenant(&Tenant {
                    name: tenant.into(),
                    settings: BTreeMap::new(),
                })
                .expect("tenant");
            store
                .put_connector(
                    &ConnectorKey::new(tenant, "c"),
                    &ConnectorRecord::new(config("c"), TargetState::Running),
                )
                .expect("put");
        }
        assert!(store.delete_tenant("acme").expect("delete"));
        let left: Vec<String> = store
            .connectors()
            .expect("list")
            .into_iter()
            .map(|(k, _)| k.tenant)
            .collect();
        assert_eq!(left, vec!["acme2".to_owned()]);
    }

    #[test]
    fn a_store_of_a_newer_format_is_refused_naming_the_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let store = SledStore::open(dir.path()).expect("opens");
            let meta = store.db.open_tree("meta").expect("meta");
            meta.insert(FORMAT_KEY, &(FORMAT_VERSION + 1).to_be_bytes())
                .expect("insert");
            store.flush().expect("flush");
        }
        let err = reopen(dir.path()).expect_err("newer format");
        assert!(
            matches!(err, StorageError::NewerFormat { found, .. } if found == FORMAT_VERSION + 1),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(message.contains("format version 2"), "{message}");
    }

    /// Writes a store with one connector, overwrites the files `damage` selects with garbage,
    /// and returns the error of opening it again.
    /// Opens the store at `path` again once sled's background flusher of the handle dropped
    /// just before has let go of the directory's file lock (it may hold it a moment longer).
    fn reopen(path: &std::path::Path) -> Result<SledStore, StorageError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match SledStore::open(path) {
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50))
                }
                other => return other,
            }
        }
    }

    fn open_after_overwriting(damage: impl Fn(&str) -> bool) -> (tempfile::TempDir, StorageError) {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let store = SledStore::open(dir.path()).expect("opens");
            store
                .put_connector(
                    &ConnectorKey::new("default", "files"),
                    &ConnectorRecord::new(config("files"), TargetState::Running),
                )
                .expect("put");
        }
        for entry in std::fs::read_dir(dir.path()).expect("list") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if path.is_file() && damage(&name) {
                let len = std::fs::metadata(&path).expect("metadata").len().max(64);
                let garbage: Vec<u8> = (0..len).map(|i| (i * 7 + 13) as u8).collect();
                std::fs::write(&path, garbage).expect("overwrite");
            }
        }
        let err = reopen(dir.path()).expect_err("a damaged store must not open");
        (dir, err)
    }

    #[test]
    fn a_store_whose_files_were_overwritten_is_refused_not_reset() {
        let (dir, err) = open_after_overwriting(|name| name != MARKER_FILE);
        let message = err.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(message.contains("backup"), "{message}");
    }

    #[test]
    fn a_store_whose_log_was_overwritten_is_refused_not_reset() {
        let (dir, err) = open_after_overwriting(|name| name == "db");
        assert!(matches!(err, StorageError::Damaged { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(message.contains("backup"), "{message}");
    }

    #[test]
    fn an_unreadable_record_is_refused_at_open_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let store = SledStore::open(dir.path()).expect("opens");
            store
                .connectors
                .insert(b"default\0files".as_slice(), b"{not json".as_slice())
                .expect("insert");
            store.flush().expect("flush");
        }
        let err = reopen(dir.path()).expect_err("damaged record");
        assert!(matches!(err, StorageError::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("default/files"), "{err}");
    }

    #[test]
    fn names_with_nul_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SledStore::open(dir.path()).expect("opens");
        let err = store
            .put_connector(
                &ConnectorKey::new("default", "a\0b"),
                &ConnectorRecord::new(config("x"), TargetState::Running),
            )
            .expect_err("nul");
        assert!(err.to_string().contains("a\\0b"), "{err}");
    }
}
