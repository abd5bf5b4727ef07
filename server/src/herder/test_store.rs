//! A state store for the herder's and the REST API's unit tests: counts its reads, can be
//! slow, and can refuse tenant writes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spillway_actors::Worker;
use spillway_connectors::ConnectorRegistry;
use spillway_core::config::config_map;
use spillway_storage::{
    ConnectorKey, ConnectorRecord, SledStore, StateStore, StorageError, TargetState, TaskRecord,
    Tenant,
};

use super::Herder;

/// The worker's store, counting the reads of connector records; its connector and tenant
/// writes take `write_delay` (a disk that is slow to sync), its reads of connector records
/// `read_delay` (a cold page cache on a busy disk).
pub(crate) struct CountingStore {
    pub inner: SledStore,
    pub connector_reads: AtomicUsize,
    pub write_delay: Duration,
    pub read_delay: Duration,
    /// While set, tenant writes fail (after their delay), as a full disk or an unreachable
    /// config topic would.
    pub refuse_tenant_writes: AtomicBool,
}

impl CountingStore {
    /// A sled store in `dir`, its writes taking `write_delay` and its reads `read_delay`.
    pub fn open(dir: &std::path::Path, write_delay: Duration, read_delay: Duration) -> Arc<Self> {
        Arc::new(CountingStore {
            inner: SledStore::open(dir).expect("store"),
            connector_reads: AtomicUsize::new(0),
            write_delay,
            read_delay,
            refuse_tenant_writes: AtomicBool::new(false),
        })
    }

    /// Waits `write_delay`, then fails if tenant writes are refused.
    fn tenant_write(&self) -> Result<(), StorageError> {
        std::thread::sleep(self.write_delay);
        if self.refuse_tenant_writes.load(Ordering::SeqCst) {
            return Err(StorageError::Kafka(
                "the test store refuses tenant writes".into(),
            ));
        }
        Ok(())
    }
}

/// Runs `work` on this executor while a task beside it counts 10 ms ticks; returns what the
/// work gave, the ticks counted meanwhile and how long it took. On a current-thread runtime
/// (a worker under load has every executor thread busy) work that blocks the thread leaves
/// the ticker at 0 or 1.
pub(crate) async fn ticks_during<T>(
    work: impl std::future::Future<Output = T>,
) -> (T, usize, Duration) {
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let started = std::time::Instant::now();
    let out = work.await;
    let took = started.elapsed();
    let during = ticks.load(Ordering::SeqCst);
    ticker.abort();
    (out, during, took)
}

impl StateStore for CountingStore {
    fn put_tenant(&self, tenant: &Tenant) -> Result<(), StorageError> {
        self.tenant_write()?;
        self.inner.put_tenant(tenant)
    }
    fn delete_tenant(&self, name: &str) -> Result<bool, StorageError> {
        self.tenant_write()?;
        self.inner.delete_tenant(name)
    }
    fn tenants(&self) -> Result<Vec<Tenant>, StorageError> {
        self.inner.tenants()
    }
    fn put_connector(
        &self,
        key: &ConnectorKey,
        record: &ConnectorRecord,
    ) -> Result<(), StorageError> {
        std::thread::sleep(self.write_delay);
        self.inner.put_connector(key, record)
    }
    fn connector(&self, key: &ConnectorKey) -> Result<Option<ConnectorRecord>, StorageError> {
        self.connector_reads.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.read_delay);
        self.inner.connector(key)
    }
    fn set_target_state(
        &self,
        key: &ConnectorKey,
        state: TargetState,
    ) -> Result<bool, StorageError> {
        self.inner.set_target_state(key, state)
    }
    fn count_connector_restart(&self, key: &ConnectorKey) -> Result<Option<u32>, StorageError> {
        self.inner.count_connector_restart(key)
    }
    fn delete_connector(&self, key: &ConnectorKey) -> Result<bool, StorageError> {
        self.inner.delete_connector(key)
    }
    fn connectors(&self) -> Result<Vec<(ConnectorKey, ConnectorRecord)>, StorageError> {
        std::thread::sleep(self.read_delay);
        self.inner.connectors()
    }
    fn put_task(
        &self,
        key: &ConnectorKey,
        task: u32,
        record: &TaskRecord,
    ) -> Result<bool, StorageError> {
        self.inner.put_task(key, task, record)
    }
    fn tasks(&self, key: &ConnectorKey) -> Result<Vec<(u32, TaskRecord)>, StorageError> {
        self.inner.tasks(key)
    }
}

/// A herder on `store` whose worker reaches no broker.
pub(crate) fn herder_on(store: &Arc<CountingStore>) -> Herder {
    let worker = Worker::start(
        config_map(&[("bootstrap.servers", "127.0.0.1:1")]),
        ConnectorRegistry::builtin(),
    )
    .expect("worker");
    Herder::new(
        worker,
        Arc::clone(store) as Arc<dyn StateStore>,
        ConnectorRegistry::builtin(),
        "w1".into(),
    )
    .expect("herder")
}
