//! The contracts a sink plugin implements, with Kafka Connect's names: a [`SinkConnector`]
//! validates its configuration and splits it into task configurations; each [`SinkTask`]
//! goes through `start` → `open` → `put`/`flush`… → `close` → `stop`.
//!
//! `put` reports an outcome per record, so one bad record is rejected alone while the rest of
//! its batch is accepted: success → ACCEPT, a retriable error → RELEASE (redelivered), a fatal
//! error → REJECT (or a failed task under `errors.tolerance=none`), a task-level error (the
//! target refuses the configuration, or the task broke this contract) → the task fails and the
//! whole batch is released, whatever `errors.tolerance` says.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::ack::Disposition;
use crate::config::{validate_sink_connector, ConfigDef, ConfigMap, ValidationReport};
use crate::error::{ConfigError, SinkError};
use crate::record::{RecordCoordinates, SinkRecord, TopicPartition};

/// What one record's `put` came to.
#[derive(Debug, Clone)]
pub enum PutOutcome {
    /// Written (or buffered so that the next successful `flush` writes it).
    Ok,
    /// Not written this time; it may succeed if delivered again.
    Retriable(SinkError),
    /// Will never be written (bad data for this sink).
    Fatal(SinkError),
    /// Not written, through no fault of the record: the target refuses the connector (its
    /// configuration or credentials) or the task broke the `put` contract. The task fails and
    /// the whole batch is released ([`SinkError::TaskLevel`]).
    TaskLevel(SinkError),
}

impl PutOutcome {
    /// Sorts a per-record result by what its error says.
    pub fn from_result(result: Result<(), SinkError>) -> Self {
        match result {
            Ok(()) => PutOutcome::Ok,
            Err(e) if e.is_retriable() => PutOutcome::Retriable(e),
            Err(e) if e.is_task_level() => PutOutcome::TaskLevel(e),
            Err(e) => PutOutcome::Fatal(e),
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, PutOutcome::Ok)
    }

    /// The task-level error, when this outcome fails the task.
    pub fn task_level(&self) -> Option<&SinkError> {
        match self {
            PutOutcome::TaskLevel(e) => Some(e),
            _ => None,
        }
    }

    /// The share-group acknowledgement for this outcome (KIP-1302): ACCEPT, RELEASE or REJECT
    /// (a task-level error releases the record: the task fails, the record is fine).
    pub fn disposition(&self) -> Disposition {
        match self {
            PutOutcome::Ok => Disposition::Accept,
            PutOutcome::Retriable(_) | PutOutcome::TaskLevel(_) => Disposition::Release,
            PutOutcome::Fatal(e) => Disposition::Reject {
                reason: e.message().to_owned(),
            },
        }
    }

    /// One outcome per record from what `put` returned: an error for the whole batch applies
    /// to every record (by its kind: a fatal one rejects each record, a task-level one fails
    /// the task), and a task that returns the wrong number of outcomes broke the `SinkTask`
    /// contract, which is no record's fault: a task-level error for every record, rather than
    /// guessing which outcome is whose.
    pub fn expand(result: Result<Vec<PutOutcome>, SinkError>, records: usize) -> Vec<PutOutcome> {
        match result {
            Ok(outcomes) if outcomes.len() == records => outcomes,
            Ok(outcomes) => {
                let error = SinkError::task_level(format!(
                    "SinkTask contract violated: put returned {} outcomes for a batch of \
                     {records} records; put must return one outcome per record, in order \
                     (a bug in the sink task, not in the records)",
                    outcomes.len()
                ));
                vec![PutOutcome::TaskLevel(error); records]
            }
            Err(e) => {
                let outcome = PutOutcome::from_result(Err(e));
                vec![outcome; records]
            }
        }
    }
}

/// What a task consumes from: known partitions in classic mode (assigned by the group), or
/// whole topics in share mode, where any member may receive records of any partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    Partitions(Vec<TopicPartition>),
    SharedTopics(Vec<String>),
}

/// The consumer group member a classic-mode batch was read by (group, generation, member), as
/// the Kafka client holds it. A sink that commits the consumer's offsets inside its own producer
/// transaction (exactly-once) passes it on, so the group coordinator fences a commit from a
/// member that has lost its partitions. Opaque here: core knows no Kafka client; the source
/// puts its client's metadata in and the producer takes it out with [`downcast`](Self::downcast).
#[derive(Clone)]
pub struct ConsumerGroupMetadata(Arc<dyn Any + Send + Sync>);

impl ConsumerGroupMetadata {
    pub fn new<T: Any + Send + Sync>(metadata: T) -> Self {
        ConsumerGroupMetadata(Arc::new(metadata))
    }

    /// The client's own metadata, when it is of type `T`.
    pub fn downcast<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        Arc::clone(&self.0).downcast::<T>().ok()
    }
}

impl std::fmt::Debug for ConsumerGroupMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConsumerGroupMetadata")
    }
}

/// One task: the unit of work the runtime runs and restarts.
#[async_trait]
pub trait SinkTask: Send {
    /// Called once with the task's configuration (one of the connector's `task_configs`).
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError>;

    /// Called before records arrive: on each assignment in classic mode, once at start for
    /// all topics in share mode.
    async fn open(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
        let _ = assignment;
        Ok(())
    }

    /// Classic mode, asked after each `open`: per newly assigned partition, the offset the task
    /// needs records from, where it knows one (an exactly-once sink's checkpoint, which may be
    /// ahead of the group's committed offset when the broker did not keep it). The runtime
    /// moves its consumer forward to it; it never moves back, and records already read may
    /// still arrive, so the task must still recognise them. Connect's
    /// `SinkTaskContext.offset`, forward only.
    fn start_offsets(&mut self) -> BTreeMap<TopicPartition, i64> {
        BTreeMap::new()
    }

    /// Writes a batch, reporting one outcome per record in order (or an error for the whole
    /// batch). Records are acknowledged only after this returns.
    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError>;

    /// Makes everything `put` so far durable. `offsets` holds, per partition, the offset after
    /// the last record put (Connect's `currentOffsets`).
    async fn flush(&mut self, offsets: &BTreeMap<TopicPartition, i64>) -> Result<(), SinkError> {
        let _ = offsets;
        Ok(())
    }

    /// Classic mode: how long batches `put` may wait for their `flush`, for a task whose
    /// `flush` is costly per call (a transaction's commit). The runtime then holds the batches'
    /// verdicts (nothing of them is committed to the group) and flushes them together, with
    /// their offsets merged, when this long has passed since the first of them was put, when
    /// the consumer could poll no further batch (`task.inflight.batches` less one are held),
    /// before partitions are opened or closed, and when a record fails the task. `None`:
    /// after every batch. Share mode flushes every batch whatever this says: the records'
    /// acquisition locks run while they wait. Asked once, after `start`.
    fn flush_interval(&self) -> Option<std::time::Duration> {
        None
    }

    /// Classic mode, for a task whose connector says
    /// [`task_commits_offsets`](SinkConnector::task_commits_offsets): the consumer group member
    /// the next batch was read by, before its `put` (it changes with every rebalance).
    fn consumer_group(&mut self, group: &ConsumerGroupMetadata) {
        let _ = group;
    }

    /// Share mode: the records whose ACCEPT the broker has durably applied (`commit_sync`
    /// succeeded for their partitions). They will not be delivered again, so state kept to
    /// recognise a redelivery (the exactly-once ledger) may be dropped. Called after the commit,
    /// in commit order, on the task's own thread.
    async fn acknowledged(&mut self, committed: &[RecordCoordinates]) {
        let _ = committed;
    }

    /// Called when partitions are taken away (classic mode) and before `stop`.
    async fn close(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
        let _ = assignment;
        Ok(())
    }

    /// Share mode: how long before a record's acquisition lock runs out the task must be
    /// done with it (an exactly-once sink commits its transaction by then), and the setting
    /// that says so. The runtime keeps that time free when it retries, and fails the task
    /// when the group's lock is not longer than it (every batch would be given up).
    fn lock_margin(&self) -> Option<(std::time::Duration, &'static str)> {
        None
    }

    /// Releases the task's resources; called once, last.
    async fn stop(&mut self) -> Result<(), SinkError>;
}

/// A sink plugin: validates configuration, splits it among tasks and creates them.
pub trait SinkConnector: Send + Sync {
    /// The plugin's version, shown by the REST API.
    fn version(&self) -> &str;

    /// The connector's own keys (the shared ones are added by [`validate`](Self::validate)).
    fn config_def(&self) -> ConfigDef;

    /// The REST `validate` answer: shared keys, transforms and the connector's own keys.
    fn validate(&self, config: &ConfigMap) -> ValidationReport {
        validate_sink_connector(config, &self.config_def())
    }

    /// Called with the connector's configuration before `task_configs`.
    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError>;

    /// At most `max_tasks` task configurations, one per task to run.
    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError>;

    /// A new, unstarted task.
    fn create_task(&self) -> Box<dyn SinkTask>;

    /// Whether the tasks commit the consumer group's offsets themselves, inside their own
    /// producer transactions (exactly-once, classic mode), from the offsets `flush` receives and
    /// the metadata `consumer_group` hands over. The runtime then never commits offsets for
    /// this connector: a commit of its own could land after a later transaction's and move the
    /// group's position back. Called after `start`.
    fn task_commits_offsets(&self) -> bool {
        false
    }

    /// Whether the tasks read the records' headers ([`SinkRecord::headers`]). A connector whose
    /// tasks never do says so, and in classic mode the runtime then does not read headers
    /// that nothing would look at (librdkafka allocates a buffer per record to find even that
    /// a record has none), unless transforms, the dead letter queue, error logs with
    /// messages, tracing or the tenant's bytes-per-second quota need them. Called after
    /// `start`.
    fn tasks_read_headers(&self) -> bool {
        true
    }

    fn stop(&mut self) {}
}

/// `max_tasks` copies of one configuration: the split for sinks whose tasks all share the
/// same settings (the runtime's group or share group divides the records).
pub fn replicate_task_configs(config: &ConfigMap, max_tasks: usize) -> Vec<ConfigMap> {
    vec![config.clone(); max_tasks]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigKey, ConfigType, Importance};
    use crate::data::Value;
    use futures::executor::block_on;

    /// Remembers good records, refuses "bad" ones for good and "flaky" ones for now.
    #[derive(Default)]
    struct MemoryTask {
        written: Vec<String>,
        opened: Option<Assignment>,
        flushed: usize,
        stopped: bool,
    }

    #[async_trait]
    impl SinkTask for MemoryTask {
        async fn start(&mut self, _config: &ConfigMap) -> Result<(), SinkError> {
            Ok(())
        }

        async fn open(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
            self.opened = Some(assignment.clone());
            Ok(())
        }

        async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
            Ok(records
                .iter()
                .map(|r| match &r.value {
                    Value::String(s) if s == "bad" => {
                        PutOutcome::Fatal(SinkError::fatal(format!("cannot store '{s}'")))
                    }
                    Value::String(s) if s == "flaky" => {
                        PutOutcome::Retriable(SinkError::retriable("target busy"))
                    }
                    other => {
                        self.written.push(other.to_string());
                        PutOutcome::Ok
                    }
                })
                .collect())
        }

        async fn flush(
            &mut self,
            _offsets: &BTreeMap<TopicPartition, i64>,
        ) -> Result<(), SinkError> {
            self.flushed += 1;
            Ok(())
        }

        async fn stop(&mut self) -> Result<(), SinkError> {
            self.stopped = true;
            Ok(())
        }
    }

    struct MemoryConnector {
        config: ConfigMap,
    }

    impl SinkConnector for MemoryConnector {
        fn version(&self) -> &str {
            "test"
        }

        fn config_def(&self) -> ConfigDef {
            ConfigDef::new().define(
                ConfigKey::new("capacity", ConfigType::Int, Importance::Low, "Max records.")
                    .default("10"),
            )
        }

        fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
            self.config_def().parse(config)?;
            self.config = config.clone();
            Ok(())
        }

        fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
            Ok(replicate_task_configs(&self.config, max_tasks))
        }

        fn create_task(&self) -> Box<dyn SinkTask> {
            Box::new(MemoryTask::default())
        }
    }

    fn batch(values: &[&str]) -> Vec<SinkRecord> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| SinkRecord::new("t", 0, i as i64, (*v).into()))
            .collect()
    }

    #[test]
    fn one_bad_record_is_rejected_alone_and_the_rest_of_the_batch_is_accepted() {
        let mut task = MemoryTask::default();
        let records = batch(&["a", "bad", "b", "flaky"]);
        let outcomes = PutOutcome::expand(block_on(task.put(&records)), records.len());
        let dispositions: Vec<Disposition> = outcomes.iter().map(PutOutcome::disposition).collect();
        assert_eq!(
            dispositions,
            vec![
                Disposition::Accept,
                Disposition::Reject {
                    reason: "cannot store 'bad'".into()
                },
                Disposition::Accept,
                Disposition::Release,
            ]
        );
        assert_eq!(task.written, vec!["a", "b"]);
    }

    #[test]
    fn a_batch_error_applies_to_every_record_by_its_kind() {
        let released = PutOutcome::expand(Err(SinkError::retriable("connection reset")), 3);
        assert!(released
            .iter()
            .all(|o| o.disposition() == Disposition::Release));
        let rejected = PutOutcome::expand(Err(SinkError::fatal("table missing")), 2);
        assert_eq!(rejected.len(), 2);
        assert!(rejected.iter().all(|o| matches!(o, PutOutcome::Fatal(_))));
    }

    #[test]
    fn the_wrong_number_of_outcomes_is_a_task_level_contract_violation_naming_both_counts() {
        let outcomes = PutOutcome::expand(Ok(vec![PutOutcome::Ok]), 3);
        assert_eq!(outcomes.len(), 3);
        for outcome in &outcomes {
            let Some(e) = outcome.task_level() else {
                panic!("expected a task-level outcome, got {outcome:?}")
            };
            assert!(e.message().starts_with(
                "SinkTask contract violated: put returned 1 outcomes for a batch of 3 records"
            ));
            assert_eq!(outcome.disposition(), Disposition::Release, "never REJECT");
        }
        let too_many = PutOutcome::expand(Ok(vec![PutOutcome::Ok; 4]), 3);
        assert!(too_many.iter().all(|o| o.task_level().is_some()));
    }

    #[test]
    fn a_task_level_batch_error_releases_every_record() {
        let outcomes = PutOutcome::expand(Err(SinkError::task_level("401 Unauthorized")), 2);
        assert!(outcomes
            .iter()
            .all(|o| o.task_level().is_some() && o.disposition() == Disposition::Release));
    }

    #[test]
    fn a_task_runs_through_connects_lifecycle() {
        let mut connector = MemoryConnector {
            config: ConfigMap::new(),
        };
        let config: ConfigMap = [("capacity".to_owned(), "5".to_owned())]
            .into_iter()
            .collect();
        connector.start(&config).expect("valid");
        let configs = connector.task_configs(3).expect("split");
        assert_eq!(configs.len(), 3);
        let mut task = connector.create_task();
        let assignment = Assignment::SharedTopics(vec!["t".into()]);
        block_on(async {
            task.start(&configs[0]).await.expect("starts");
            task.open(&assignment).await.expect("opens");
            let outcomes = task.put(&batch(&["x"])).await.expect("puts");
            assert!(outcomes[0].is_ok());
            task.flush(&BTreeMap::new()).await.expect("flushes");
            task.close(&assignment).await.expect("closes");
            task.stop().await.expect("stops");
        });
    }

    #[test]
    fn connector_validation_covers_shared_and_own_keys() {
        let connector = MemoryConnector {
            config: ConfigMap::new(),
        };
        let config: ConfigMap = [
            ("name", "m"),
            ("connector.class", "memory"),
            ("topics", "t"),
            ("capacity", "lots"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let report = connector.validate(&config);
        assert_eq!(
            report.errors(),
            vec!["capacity: invalid value 'lots' for capacity: not a number; expected an int (32-bit integer)"]
        );
    }

    #[test]
    fn from_result_sorts_errors_by_retriability() {
        assert!(PutOutcome::from_result(Ok(())).is_ok());
        assert!(matches!(
            PutOutcome::from_result(Err(SinkError::retriable("x"))),
            PutOutcome::Retriable(_)
        ));
        assert!(matches!(
            PutOutcome::from_result(Err(SinkError::fatal("x"))),
            PutOutcome::Fatal(_)
        ));
        assert!(matches!(
            PutOutcome::from_result(Err(SinkError::task_level("x"))),
            PutOutcome::TaskLevel(_)
        ));
    }
}
