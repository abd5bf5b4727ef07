//! One task: its four actors, run on a thread of the worker's [`TaskPool`] that other tasks
//! share (so nothing in a task may block its thread), in the task's log span; a killed task's
//! actors are dropped together, its consumer with them.

use std::sync::Arc;

use actix::prelude::*;
use spillway_core::config::ErrorHandling;
use spillway_core::{ConfigMap, RecordPipeline, SinkTask};

use crate::acker::{AckerActor, AckerSetup, SharedSource};
use crate::consumer::{ConsumerActor, ConsumerSetup, SourceFactory};
use crate::converter::{ConverterActor, RawBytes};
use crate::dead_letter::DeadLetterWriter;
use crate::lock_retry::{LockFacts, TargetHealth};
use crate::messages::{CloseGate, Drain, Failing, FlushHeld, Reporter};
use crate::pool::{TaskPool, TaskScope, ThreadLease};
use crate::settings::TaskSettings;
use crate::sink::{SinkActor, SinkContext};
use crate::status::TaskCounters;
use crate::telemetry::TaskIdentity;
use crate::tenancy::{InflightBytes, Throttle};

/// Everything one run of a task needs.
pub struct TaskSpec {
    /// The tenant owning the connector (in log lines and trace spans).
    pub tenant: String,
    pub connector: String,
    pub connector_class: String,
    pub task: u32,
    /// Bumped on each restart, so events of a previous run are recognised and ignored.
    pub generation: u64,
    pub share: bool,
    pub errors: ErrorHandling,
    /// The configuration `SinkTask::start` receives.
    pub task_config: ConfigMap,
    pub pipeline: RecordPipeline,
    pub sink_task: Box<dyn SinkTask>,
    pub source: SourceFactory,
    pub dead_letters: Option<Arc<dyn DeadLetterWriter>>,
    pub settings: TaskSettings,
    pub counters: Arc<TaskCounters>,
    pub reporter: Reporter,
    /// The tenant's records/s and bytes/s budget, shared with its other tasks.
    pub throttle: Option<Arc<Throttle>>,
    /// The tenant's in-flight bytes budget, shared with its other tasks.
    pub inflight_bytes: Option<Arc<InflightBytes>>,
    /// Shared by the connector's tasks: a success of one ends the others' fetch pauses.
    pub target_health: TargetHealth,
}

/// A running task.
pub struct RunningTask {
    scope: TaskScope,
    consumer: Addr<ConsumerActor>,
    /// Told of a stop, so that it flushes what it holds for its flush interval at once.
    sink: Addr<SinkActor>,
    pub generation: u64,
    /// Its place on a pool thread, given back when the task is dropped.
    _lease: ThreadLease,
}

impl RunningTask {
    /// Graceful stop: in-flight batches finish, acknowledgements are committed, the group is
    /// left, the sink task is closed and stopped; then a `Stopped` (or `Failed`) event.
    pub fn drain(&self) {
        self.sink.do_send(FlushHeld { stopping: true });
        self.consumer.do_send(Drain::default());
    }

    /// [`drain`](Self::drain) as one of the tasks in `gate` that stop together.
    pub fn drain_together(&self, gate: Arc<CloseGate>) {
        self.sink.do_send(FlushHeld { stopping: true });
        self.consumer.do_send(Drain {
            together: Some(gate),
        });
    }

    /// Drops the task's actors at once, as a crash would: nothing more is acknowledged, and
    /// the broker redelivers what the task held (when its acquisition locks expire, or when
    /// its member leaves the group). The pool thread goes on with its other tasks.
    pub fn kill(&self) {
        self.scope.kill();
    }
}

/// Starts the task's actors on the pool thread with the fewest tasks.
pub fn spawn_task(spec: TaskSpec, pool: &TaskPool) -> RunningTask {
    let lease = pool.lease();
    let scope = TaskScope::default();
    let generation = spec.generation;
    let identity = Arc::new(TaskIdentity {
        tenant: spec.tenant.clone(),
        connector: spec.connector.clone(),
        task: spec.task,
    });
    let (consumer, mailbox) = TaskScope::mailbox::<ConsumerActor>();
    let (sink, sink_mailbox) = TaskScope::mailbox::<SinkActor>();
    let sink_stage = sink.clone();
    let task_scope = scope.clone();
    lease.arbiter().spawn_fn(move || {
        let scope = task_scope;
        let span = identity.log_span();
        let ctx = Context::with_receiver(mailbox);
        let TaskSpec {
            tenant: _,
            connector,
            connector_class,
            task,
            generation,
            share,
            errors,
            task_config,
            pipeline,
            sink_task,
            source,
            dead_letters,
            settings,
            counters,
            reporter,
            throttle,
            inflight_bytes,
            target_health,
        } = spec;
        let failing = Failing::default();
        let lock_facts = LockFacts::default();
        let raw_bytes = RawBytes::for_errors(&errors);
        // The acker's address first: the sink stage sends to it, and it to the converter.
        let (acker, acker_mailbox) = TaskScope::mailbox::<AckerActor>();
        let sink = sink_stage;
        scope.run(
            Context::with_receiver(sink_mailbox),
            SinkActor::new(
                sink_task,
                acker.clone(),
                ctx.address(),
                SinkContext {
                    connector,
                    connector_class,
                    task,
                    share,
                    errors,
                    config: task_config,
                    counters: Arc::clone(&counters),
                    failing: failing.clone(),
                    delivery_attempt_limit: settings.delivery_attempt_limit,
                    retry_lock_margin: settings.retry_lock_margin,
                    lock_facts: lock_facts.clone(),
                    target_health: target_health.clone(),
                    held_batches_max: settings.held_batches_max,
                },
            ),
            &span,
        );
        let converter = scope.start(
            ConverterActor::new(pipeline, sink, failing.clone(), raw_bytes),
            &span,
        );
        let client = SharedSource::default();
        scope.run(
            Context::with_receiver(acker_mailbox),
            AckerActor::new(AckerSetup {
                source: client.clone(),
                consumer: ctx.address(),
                converter: converter.clone(),
                dead_letters,
                counters: Arc::clone(&counters),
                task,
                generation,
                reporter: reporter.clone(),
                commit_timeout: settings.commit_timeout,
                delivery_attempt_limit: settings.delivery_attempt_limit,
                lock_facts: lock_facts.clone(),
                target_health: target_health.clone(),
            }),
            &span,
        );
        let owner = AckerActor::batch_owner(acker.clone());
        let actor = ConsumerActor::new(ConsumerSetup {
            factory: source,
            client,
            converter,
            acker,
            task,
            generation,
            max_inflight: settings.inflight_batches,
            poll_timeout: settings.poll_timeout,
            delivery_attempt_limit: settings.delivery_attempt_limit,
            shutdown_timeout: settings.shutdown_timeout,
            counters,
            reporter,
            throttle,
            inflight_bytes,
            identity,
            failing,
            lock_facts,
            target_health,
            owner,
        });
        scope.run(ctx, actor, &span);
    });
    RunningTask {
        scope,
        consumer,
        sink,
        generation,
        _lease: lease,
    }
}

#[cfg(test)]
mod tests {
    //! The poll → convert → put → acknowledge → commit loop on an in-memory source.

    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;
    use bytes::Bytes;
    use futures::FutureExt;
    use spillway_core::config::{DeadLetterQueue, ErrorTolerance, RetryTimeout};
    use spillway_core::{
        Ack, Assignment, DeadLetterRecord, Disposition, PutOutcome, RawRecord, SinkError,
        SinkRecord,
    };
    use tokio::sync::mpsc;

    use super::*;
    use crate::error::RuntimeError;
    use crate::messages::TaskEvent;
    use crate::settings::HELD_BATCHES_MAX;
    use crate::source::{AssignmentChange, Committed, Polled, RecordSource};

    /// What the fake source saw.
    #[derive(Default)]
    struct Seen {
        /// Verdicts in commit order: (offset, disposition).
        committed: Vec<(i64, Disposition)>,
        commits: usize,
        closed: bool,
        /// Highest number of batches out at once.
        max_outstanding: usize,
        /// The tenant's bytes in flight as each poll started.
        inflight_bytes_at_poll: Vec<u64>,
    }

    /// Hands out records in batches of `batch`; verdicts count once committed.
    struct FakeSource {
        records: VecDeque<RawRecord>,
        /// Records that arrive once a poll has come back empty.
        later: Vec<RawRecord>,
        /// How long each commit holds the client.
        commit_delay: Duration,
        batch: usize,
        pending: Vec<Ack>,
        seen: Arc<Mutex<Seen>>,
        opened: bool,
        outstanding: usize,
        budget: Option<Arc<InflightBytes>>,
    }

    #[async_trait(?Send)]
    impl RecordSource for FakeSource {
        async fn poll(&mut self, timeout: Duration) -> Result<Polled, RuntimeError> {
            let mut polled = Polled::default();
            if let Some(budget) = &self.budget {
                let used = budget.used();
                self.seen.lock().unwrap().inflight_bytes_at_poll.push(used);
            }
            if !self.opened {
                self.opened = true;
                polled
                    .changes
                    .push(AssignmentChange::Opened(self.assignment()));
            }
            let n = self.batch.min(self.records.len());
            if n == 0 && polled.changes.is_empty() {
                // Nothing to hand out: waits as a consumer would, though not past 50 ms (a
                // test's long poll timeout would otherwise hold its stop), and the records
                // still to come arrive meanwhile.
                tokio::time::sleep(timeout.min(Duration::from_millis(50))).await;
                self.records.extend(self.later.drain(..));
            }
            polled.records = self.records.drain(..n).collect();
            if !polled.records.is_empty() {
                self.outstanding += 1;
                let mut seen = self.seen.lock().unwrap();
                seen.max_outstanding = seen.max_outstanding.max(self.outstanding);
            }
            Ok(polled)
        }

        fn settle(&mut self, acks: &[Ack]) -> Result<(), RuntimeError> {
            self.pending.extend_from_slice(acks);
            Ok(())
        }

        async fn commit(&mut self, _timeout: Duration) -> Result<Committed, RuntimeError> {
            if !self.commit_delay.is_zero() {
                tokio::time::sleep(self.commit_delay).await;
            }
            let mut seen = self.seen.lock().unwrap();
            seen.commits += 1;
            self.outstanding = 0;
            let mut committed = Committed::default();
            for ack in self.pending.drain(..) {
                if ack.disposition == Disposition::Accept {
                    committed.accepted.push(ack.record.clone());
                }
                seen.committed.push((ack.record.offset, ack.disposition));
            }
            Ok(committed)
        }

        async fn close(self: Box<Self>) -> Result<(), RuntimeError> {
            self.seen.lock().unwrap().closed = true;
            Ok(())
        }

        fn assignment(&self) -> Assignment {
            Assignment::SharedTopics(vec!["t".into()])
        }

        /// The records not handed out yet stand for a share consumer's fetched-ahead buffer.
        fn take_unpolled(&mut self) -> Vec<(spillway_core::RecordCoordinates, u16)> {
            self.records
                .drain(..)
                .filter_map(|r| Some((r.coordinates(), r.delivery_count?)))
                .collect()
        }
    }

    /// Values decide the outcome: "fatal…" is refused for good, "flaky…" fails retriably on
    /// its first `flaky_failures` attempts; everything else is written.
    #[derive(Clone, Default)]
    struct ScriptedSink {
        written: Arc<Mutex<Vec<String>>>,
        opened: Arc<Mutex<Vec<Assignment>>>,
        stopped: Arc<Mutex<bool>>,
        attempts: Arc<Mutex<BTreeMap<String, usize>>>,
        flaky_failures: usize,
        /// How long each `put` takes.
        put_delay: Duration,
        /// The call that panics ("start", "open", "put", "flush", "acknowledged", "close",
        /// "stop"), as a plugin with a bug would.
        panic_in: Option<&'static str>,
        /// `put` returns one outcome fewer than records (a task breaking its contract).
        wrong_count: bool,
    }

    impl ScriptedSink {
        fn maybe_panic(&self, call: &str) {
            if self.panic_in == Some(call) {
                panic!("scripted panic in {call}");
            }
        }
    }

    #[async_trait]
    impl SinkTask for ScriptedSink {
        async fn start(&mut self, _config: &ConfigMap) -> Result<(), SinkError> {
            self.maybe_panic("start");
            Ok(())
        }

        async fn open(&mut self, assignment: &Assignment) -> Result<(), SinkError> {
            self.maybe_panic("open");
            self.opened.lock().unwrap().push(assignment.clone());
            Ok(())
        }

        async fn flush(
            &mut self,
            _offsets: &BTreeMap<spillway_core::TopicPartition, i64>,
        ) -> Result<(), SinkError> {
            self.maybe_panic("flush");
            Ok(())
        }

        async fn acknowledged(&mut self, _committed: &[spillway_core::RecordCoordinates]) {
            self.maybe_panic("acknowledged");
        }

        async fn close(&mut self, _assignment: &Assignment) -> Result<(), SinkError> {
            self.maybe_panic("close");
            Ok(())
        }

        async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
            if !self.put_delay.is_zero() {
                tokio::time::sleep(self.put_delay).await;
            }
            self.maybe_panic("put");
            Ok(records
                .iter()
                .map(|r| {
                    let text = r.value.to_string();
                    let mut attempts = self.attempts.lock().unwrap();
                    let n = attempts.entry(text.clone()).or_default();
                    *n += 1;
                    if text.starts_with("fatal") {
                        PutOutcome::Fatal(SinkError::fatal(format!("cannot store {text}")))
                    } else if text.starts_with("refused") {
                        PutOutcome::TaskLevel(SinkError::task_level(
                            "POST http://target/in answered 401 Unauthorized",
                        ))
                    } else if text.starts_with("flaky") && *n <= self.flaky_failures {
                        PutOutcome::Retriable(SinkError::retriable("target busy"))
                    } else {
                        self.written.lock().unwrap().push(text);
                        PutOutcome::Ok
                    }
                })
                .skip(usize::from(self.wrong_count))
                .collect())
        }

        async fn stop(&mut self) -> Result<(), SinkError> {
            self.maybe_panic("stop");
            *self.stopped.lock().unwrap() = true;
            Ok(())
        }
    }

    #[derive(Default)]
    struct MemoryDeadLetters {
        written: Mutex<Vec<DeadLetterRecord>>,
        fail: bool,
    }

    #[async_trait]
    impl DeadLetterWriter for MemoryDeadLetters {
        async fn write(&self, records: Vec<DeadLetterRecord>) -> Vec<Result<(), String>> {
            if self.fail {
                return records.iter().map(|_| Err("broker down".into())).collect();
            }
            let n = records.len();
            self.written.lock().unwrap().extend(records);
            vec![Ok(()); n]
        }
    }

    fn raw(offset: i64, value: &str) -> RawRecord {
        let mut r = RawRecord::new("t", 0, offset);
        r.value = Some(Bytes::from(value.to_owned()));
        r
    }

    struct Run {
        seen: Arc<Mutex<Seen>>,
        events: mpsc::UnboundedReceiver<TaskEvent>,
        task: RunningTask,
        counters: Arc<TaskCounters>,
    }

    struct Options {
        share: bool,
        tolerance: ErrorTolerance,
        dlq: Option<Arc<MemoryDeadLetters>>,
        inflight: usize,
        /// `TaskSettings::held_batches_max`.
        held_max: usize,
        pipeline: ConfigMap,
        throttle: Option<Arc<Throttle>>,
        inflight_bytes: Option<Arc<InflightBytes>>,
        /// A value converter that panics on the first record it sees.
        panicking_converter: bool,
        shutdown_timeout: Duration,
        retry_timeout: RetryTimeout,
        poll_timeout: Duration,
        /// [`FakeSource::later`].
        later: Vec<RawRecord>,
        /// [`FakeSource::commit_delay`].
        commit_delay: Duration,
    }

    /// A converter with a bug.
    #[derive(Debug)]
    struct PanickingConverter;

    impl spillway_core::convert::Converter for PanickingConverter {
        fn name(&self) -> &'static str {
            "panicking"
        }

        fn to_connect(
            &self,
            topic: &str,
            _data: Option<&[u8]>,
        ) -> Result<spillway_core::convert::SchemaAndValue, spillway_core::error::ConvertError>
        {
            panic!("scripted converter panic on {topic}")
        }

        fn from_connect(
            &self,
            _topic: &str,
            _schema: Option<&spillway_core::schema::Schema>,
            _value: &spillway_core::Value,
        ) -> Result<Option<Bytes>, spillway_core::error::ConvertError> {
            Ok(None)
        }
    }

    impl Default for Options {
        fn default() -> Self {
            Options {
                share: true,
                tolerance: ErrorTolerance::All,
                dlq: None,
                inflight: 2,
                held_max: HELD_BATCHES_MAX,
                pipeline: [("value.converter", "string")]
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                throttle: None,
                inflight_bytes: None,
                panicking_converter: false,
                shutdown_timeout: TaskSettings::default().shutdown_timeout,
                retry_timeout: RetryTimeout::Infinite,
                poll_timeout: Duration::from_millis(10),
                later: Vec::new(),
                commit_delay: Duration::ZERO,
            }
        }
    }

    fn start(records: Vec<RawRecord>, sink: ScriptedSink, o: Options) -> Run {
        start_with(records, Box::new(sink), o)
    }

    fn start_with(records: Vec<RawRecord>, sink: Box<dyn SinkTask>, o: Options) -> Run {
        start_on(records, sink, o, &TaskPool::start(1))
    }

    fn start_on(
        records: Vec<RawRecord>,
        sink: Box<dyn SinkTask>,
        o: Options,
        pool: &TaskPool,
    ) -> Run {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let source_seen = Arc::clone(&seen);
        let (tx, events) = mpsc::unbounded_channel();
        let counters = Arc::new(TaskCounters::default());
        let budget = o.inflight_bytes.clone();
        let (later, commit_delay) = (o.later, o.commit_delay);
        let factory: SourceFactory = Box::new(move || {
            async move {
                Ok(Box::new(FakeSource {
                    records: records.into(),
                    later,
                    commit_delay,
                    batch: 3,
                    pending: Vec::new(),
                    seen: source_seen,
                    opened: false,
                    outstanding: 0,
                    budget,
                }) as Box<dyn RecordSource>)
            }
            .boxed_local()
        });
        let task = spawn_task(
            TaskSpec {
                tenant: "t1".into(),
                connector: "c".into(),
                connector_class: "scripted".into(),
                task: 0,
                generation: 1,
                share: o.share,
                errors: ErrorHandling {
                    tolerance: o.tolerance,
                    retry_timeout: o.retry_timeout,
                    retry_delay_max: Duration::from_millis(20),
                    log_enable: true,
                    log_include_messages: false,
                    dead_letter_queue: o.dlq.as_ref().map(|_| DeadLetterQueue {
                        topic: "dlq".into(),
                        replication_factor: 1,
                        context_headers: true,
                    }),
                },
                task_config: ConfigMap::new(),
                pipeline: if o.panicking_converter {
                    RecordPipeline::new(
                        spillway_core::convert::RecordConverter::new(
                            Box::new(spillway_core::convert::StringConverter::new(
                                spillway_core::RecordPart::Key,
                            )),
                            Box::new(PanickingConverter),
                        ),
                        spillway_core::transforms::TransformChain::empty(),
                    )
                } else {
                    RecordPipeline::from_config(&o.pipeline, &ConfigMap::new()).expect("valid")
                },
                sink_task: sink,
                source: factory,
                dead_letters: o.dlq.map(|d| d as Arc<dyn DeadLetterWriter>),
                settings: TaskSettings {
                    inflight_batches: o.inflight,
                    held_batches_max: o.held_max,
                    poll_timeout: o.poll_timeout,
                    shutdown_timeout: o.shutdown_timeout,
                    ..TaskSettings::default()
                },
                counters: Arc::clone(&counters),
                reporter: Arc::new(move |e| {
                    let _ = tx.send(e);
                }),
                throttle: o.throttle,
                inflight_bytes: o.inflight_bytes,
                target_health: TargetHealth::default(),
            },
            pool,
        );
        Run {
            seen,
            events,
            task,
            counters,
        }
    }

    /// Waits until `n` verdicts are committed, then stops the task gracefully.
    async fn finish(run: &mut Run, n: usize) -> TaskEvent {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while run.seen.lock().unwrap().committed.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} of {n} verdicts committed",
                run.seen.lock().unwrap().committed.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run.task.drain();
        next_final_event(run).await
    }

    async fn next_final_event(run: &mut Run) -> TaskEvent {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), run.events.recv())
                .await
                .expect("an event in time")
                .expect("reporter alive");
            if !matches!(event, TaskEvent::Progress { .. }) {
                return event;
            }
        }
    }

    fn verdicts(run: &Run) -> Vec<(i64, Disposition)> {
        let mut v = run.seen.lock().unwrap().committed.clone();
        v.sort_by_key(|(o, _)| *o);
        v
    }

    /// ACCEPT for offsets `0..n`, as [`verdicts`] lists them.
    fn accepted(n: i64) -> Vec<(i64, Disposition)> {
        (0..n).map(|o| (o, Disposition::Accept)).collect()
    }

    #[actix::test]
    async fn a_task_killed_on_a_shared_thread_is_dropped_and_its_sibling_goes_on() {
        let pool = TaskPool::start(1);
        let hanging = ScriptedSink {
            put_delay: Duration::from_secs(60),
            ..ScriptedSink::default()
        };
        let mut killed = start_on(
            (0..6).map(|i| raw(i, "k")).collect(),
            Box::new(hanging),
            Options::default(),
            &pool,
        );
        let sink = ScriptedSink::default();
        let mut sibling = start_on(
            (0..9).map(|i| raw(i, "s")).collect(),
            Box::new(sink.clone()),
            Options::default(),
            &pool,
        );
        assert_eq!(
            pool.tasks_per_thread(),
            vec![2],
            "both tasks share the one thread"
        );
        killed.task.kill();
        // Every actor of the killed task is dropped: its reporter goes with them.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, killed.events.recv()).await {
                Ok(None) => break,
                Ok(Some(_)) => continue,
                Err(_) => panic!("the killed task's actors are still alive"),
            }
        }
        assert!(
            !killed.seen.lock().unwrap().closed,
            "a kill closes nothing gracefully"
        );
        let event = finish(&mut sibling, 9).await;
        assert_eq!(
            event,
            TaskEvent::Stopped {
                task: 0,
                generation: 1
            }
        );
        assert_eq!(sink.written.lock().unwrap().len(), 9);
        drop(killed);
        assert_eq!(
            pool.tasks_per_thread(),
            vec![1],
            "the killed task's place is free"
        );
    }

    #[actix::test]
    async fn records_put_successfully_are_accepted_and_committed() {
        let sink = ScriptedSink::default();
        let records = (0..7).map(|i| raw(i, &format!("r{i}"))).collect();
        let mut run = start(records, sink.clone(), Options::default());
        let event = finish(&mut run, 7).await;
        assert_eq!(
            event,
            TaskEvent::Stopped {
                task: 0,
                generation: 1
            }
        );
        assert!(verdicts(&run)
            .iter()
            .all(|(_, d)| *d == Disposition::Accept));
        assert_eq!(sink.written.lock().unwrap().len(), 7);
        assert_eq!(
            *sink.opened.lock().unwrap(),
            vec![Assignment::SharedTopics(vec!["t".into()])],
            "open() once at start for all topics"
        );
        assert!(*sink.stopped.lock().unwrap());
        let seen = run.seen.lock().unwrap();
        assert!(seen.closed, "the group is left on a graceful stop");
        assert!(seen.max_outstanding <= 2, "in-flight batches stay bounded");
        assert_eq!(run.counters.snapshot().accepted, 7);
    }

    #[actix::test]
    async fn records_arriving_while_a_commit_lands_during_an_empty_poll_are_polled_at_once() {
        // Classic mode, two batches in flight, each commit holding the client for 30 ms: the
        // poll that the first commit's credit starts waits behind the second commit, finds
        // nothing, and returns after that commit landed. Nothing is in flight any more, so
        // no commit would end a park: the records that arrived meanwhile must be polled at
        // once, not after the 30 s poll timeout (`finish` gives up after 10 s).
        let sink = ScriptedSink::default();
        let records = (0..6).map(|i| raw(i, &format!("r{i}"))).collect();
        let later = (6..9).map(|i| raw(i, &format!("r{i}"))).collect();
        let mut run = start(
            records,
            sink.clone(),
            Options {
                share: false,
                inflight: 2,
                poll_timeout: Duration::from_secs(30),
                later,
                commit_delay: Duration::from_millis(30),
                ..Options::default()
            },
        );
        finish(&mut run, 9).await;
        assert_eq!(verdicts(&run), accepted(9));
        assert_eq!(sink.written.lock().unwrap().len(), 9);
    }

    #[actix::test]
    async fn a_records_budget_slows_polling_down_without_dropping_records() {
        // 30 records/s with a burst of 30: the first 30 go at once, the other 30 take at
        // least (30 - one batch of 3) / 30 s, whatever the machine's speed.
        let sink = ScriptedSink::default();
        let records = (0..60).map(|i| raw(i, &format!("r{i}"))).collect();
        let started = std::time::Instant::now();
        let mut run = start(
            records,
            sink.clone(),
            Options {
                throttle: Some(Arc::new(Throttle::new(Some(30), None))),
                ..Options::default()
            },
        );
        finish(&mut run, 60).await;
        let elapsed = started.elapsed().as_secs_f64();
        assert!(
            elapsed >= 0.9,
            "60 records under a 30 records/s budget took only {elapsed:.2}s"
        );
        assert_eq!(sink.written.lock().unwrap().len(), 60, "nothing dropped");
        assert!(verdicts(&run)
            .iter()
            .all(|(_, d)| *d == Disposition::Accept));
    }

    /// Records of exactly 10 bytes (value only), so a batch of 3 weighs 30.
    fn ten_byte_records(n: i64) -> Vec<RawRecord> {
        (0..n).map(|i| raw(i, &format!("{i:010}"))).collect()
    }

    /// Samples `budget` every millisecond until `stop`; returns the highest value seen.
    fn sample_max(
        budget: &Arc<InflightBytes>,
        stop: &Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<u64> {
        let (budget, stop) = (Arc::clone(budget), Arc::clone(stop));
        tokio::spawn(async move {
            let mut max = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                max = max.max(budget.used());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            max
        })
    }

    #[actix::test]
    async fn an_inflight_bytes_budget_holds_polls_back_and_delivers_everything() {
        // Batches of 30 bytes, 4 batches allowed in flight by credits (120 bytes), a slow
        // sink: only the 45-byte budget keeps the task to two batches (60 bytes) at most.
        let budget = Arc::new(InflightBytes::new(Some(45)));
        let sink = ScriptedSink {
            put_delay: Duration::from_millis(15),
            ..ScriptedSink::default()
        };
        let mut run = start(
            ten_byte_records(30),
            sink.clone(),
            Options {
                inflight: 4,
                inflight_bytes: Some(Arc::clone(&budget)),
                ..Options::default()
            },
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = sample_max(&budget, &stop);
        finish(&mut run, 30).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let max = sampler.await.expect("sampler");
        assert!(max > 0, "the batches were counted");
        assert!(
            max <= 45 + 30,
            "{max} bytes in flight: over the limit plus one batch"
        );
        let at_poll = run.seen.lock().unwrap().inflight_bytes_at_poll.clone();
        assert!(
            at_poll.iter().all(|used| *used < 45),
            "a poll started with the budget full: {at_poll:?}"
        );
        assert!(
            run.seen.lock().unwrap().max_outstanding <= 2,
            "the budget, not the credits, bounded the batches"
        );
        assert_eq!(sink.written.lock().unwrap().len(), 30, "nothing dropped");
        assert_eq!(budget.used(), 0, "every batch's bytes are released");
    }

    #[actix::test]
    async fn a_killed_task_gives_its_inflight_bytes_back() {
        let budget = Arc::new(InflightBytes::new(None));
        let sink = ScriptedSink {
            put_delay: Duration::from_secs(30),
            ..ScriptedSink::default()
        };
        let run = start(
            ten_byte_records(30),
            sink,
            Options {
                inflight_bytes: Some(Arc::clone(&budget)),
                ..Options::default()
            },
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while budget.used() < 60 {
            assert!(tokio::time::Instant::now() < deadline, "two batches polled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            budget.used(),
            60,
            "two credits of 30 bytes, stuck in the sink"
        );
        run.task.kill();
        while budget.used() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a killed task still holds {} bytes",
                budget.used()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A share record whose acquisition lock runs out `lock` from now.
    fn locked(offset: i64, value: &str, lock: Duration) -> RawRecord {
        let mut r = raw(offset, value);
        r.lock_deadline = Some(std::time::Instant::now() + lock);
        r.delivery_count = Some(1);
        r
    }

    #[actix::test]
    async fn retriable_failures_are_retried_within_the_lock_in_share_mode() {
        let sink = ScriptedSink {
            flaky_failures: 1,
            ..ScriptedSink::default()
        };
        let lock = Duration::from_secs(30);
        let mut run = start(
            vec![
                locked(0, "ok", lock),
                locked(1, "flaky-1", lock),
                locked(2, "ok2", lock),
            ],
            sink.clone(),
            Options::default(),
        );
        finish(&mut run, 3).await;
        assert_eq!(
            verdicts(&run),
            vec![
                (0, Disposition::Accept),
                (1, Disposition::Accept),
                (2, Disposition::Accept)
            ]
        );
        assert_eq!(sink.attempts.lock().unwrap()["flaky-1"], 2);
        assert_eq!(run.counters.snapshot().released, 0);
    }

    #[actix::test]
    async fn retriable_failures_are_released_when_the_lock_leaves_no_room_for_a_retry() {
        let sink = ScriptedSink {
            flaky_failures: 1,
            ..ScriptedSink::default()
        };
        // Less than share.retry.lock.margin.ms (1 s) is left: released after one attempt.
        let lock = Duration::from_millis(500);
        let mut run = start(
            vec![
                locked(0, "ok", lock),
                locked(1, "flaky-1", lock),
                locked(2, "ok2", lock),
            ],
            sink.clone(),
            Options::default(),
        );
        finish(&mut run, 3).await;
        assert_eq!(
            verdicts(&run),
            vec![
                (0, Disposition::Accept),
                (1, Disposition::Release),
                (2, Disposition::Accept)
            ]
        );
        assert_eq!(sink.attempts.lock().unwrap()["flaky-1"], 1);
        assert_eq!(run.counters.snapshot().released, 1);
    }

    #[actix::test]
    async fn on_its_last_allowed_delivery_a_failing_record_is_rejected_and_fails_the_task_for_good()
    {
        let sink = ScriptedSink {
            flaky_failures: 10,
            ..ScriptedSink::default()
        };
        let mut last = locked(1, "flaky-1", Duration::from_millis(500));
        last.delivery_count = Some(5);
        let mut run = start(
            vec![locked(0, "ok", Duration::from_millis(500)), last],
            sink.clone(),
            Options {
                tolerance: ErrorTolerance::None,
                ..Options::default()
            },
        );
        let event = next_final_event(&mut run).await;
        let TaskEvent::Failed {
            trace, for_good, ..
        } = event
        else {
            panic!("expected a failure: {event:?}");
        };
        assert!(for_good, "a restart would not see the record again");
        assert!(
            trace.contains("t-0@1") && trace.contains("group.share.delivery.count.limit=5"),
            "{trace}"
        );
        let verdicts = verdicts(&run);
        assert!(
            matches!(verdicts[1], (1, Disposition::Reject { .. })),
            "never released at the limit: {verdicts:?}"
        );
    }

    #[actix::test]
    async fn retriable_failures_are_retried_in_classic_mode_until_they_succeed() {
        let sink = ScriptedSink {
            flaky_failures: 2,
            ..ScriptedSink::default()
        };
        let mut run = start(
            vec![raw(0, "flaky-a"), raw(1, "ok")],
            sink.clone(),
            Options {
                share: false,
                ..Options::default()
            },
        );
        finish(&mut run, 2).await;
        assert_eq!(
            verdicts(&run),
            vec![(0, Disposition::Accept), (1, Disposition::Accept)]
        );
        assert_eq!(sink.attempts.lock().unwrap()["flaky-a"], 3);
    }

    /// The task failed (to be restarted: not for good) and returns its trace.
    async fn failed_for_a_restart(run: &mut Run) -> String {
        let event = next_final_event(run).await;
        let TaskEvent::Failed {
            trace, for_good, ..
        } = event
        else {
            panic!("expected a failure: {event:?}");
        };
        assert!(!for_good, "the restart policy applies: {trace}");
        trace
    }

    /// Every record of the first batch (offsets 0..3) went back, none was rejected.
    fn assert_batch_released(run: &Run) {
        let v = verdicts(run);
        assert_eq!(
            v.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            vec![0, 1, 2],
            "{v:?}"
        );
        assert!(
            v.iter().all(|(_, d)| *d == Disposition::Release),
            "released, never rejected nor accepted: {v:?}"
        );
        assert_eq!(run.counters.snapshot().rejected, 0);
        assert_eq!(run.counters.snapshot().dead_lettered, 0);
    }

    #[actix::test]
    async fn a_task_level_put_error_under_tolerance_all_fails_the_task_and_releases_the_batch() {
        for share in [true, false] {
            let dlq = Arc::new(MemoryDeadLetters::default());
            let sink = ScriptedSink::default();
            let mut run = start(
                vec![
                    raw(0, "ok"),
                    raw(1, "refused-1"),
                    raw(2, "ok2"),
                    raw(3, "later"),
                ],
                sink.clone(),
                Options {
                    share,
                    tolerance: ErrorTolerance::All,
                    dlq: Some(Arc::clone(&dlq)),
                    inflight: 1,
                    ..Options::default()
                },
            );
            let trace = failed_for_a_restart(&mut run).await;
            assert!(
                trace.contains("task-level") && trace.contains("401 Unauthorized"),
                "{trace}"
            );
            assert_batch_released(&run);
            assert!(dlq.written.lock().unwrap().is_empty(), "share={share}");
            assert_eq!(
                sink.attempts.lock().unwrap()["refused-1"],
                1,
                "a task-level error is not retried"
            );
            assert!(
                !sink.attempts.lock().unwrap().contains_key("later"),
                "the task stops at its first failure"
            );
        }
    }

    #[actix::test]
    async fn a_task_level_error_on_a_records_last_delivery_dead_letters_it_and_fails_for_good() {
        let dlq = Arc::new(MemoryDeadLetters::default());
        let lock = Duration::from_secs(30);
        let mut last = locked(1, "refused-1", lock);
        last.delivery_count = Some(5);
        let mut run = start(
            vec![locked(0, "ok", lock), last, locked(2, "ok2", lock)],
            ScriptedSink::default(),
            Options {
                dlq: Some(Arc::clone(&dlq)),
                inflight: 1,
                ..Options::default()
            },
        );
        let TaskEvent::Failed {
            trace, for_good, ..
        } = next_final_event(&mut run).await
        else {
            panic!("expected a failure");
        };
        assert!(for_good, "a restart would spend more deliveries: {trace}");
        assert!(
            trace.contains("first t-0@1") && trace.contains("group.share.delivery.count.limit=5"),
            "{trace}"
        );
        let v = verdicts(&run);
        assert_eq!(v[0], (0, Disposition::Release));
        assert!(matches!(v[1], (1, Disposition::Reject { .. })), "{v:?}");
        assert_eq!(v[2], (2, Disposition::Release));
        assert_eq!(dlq.written.lock().unwrap().len(), 1, "kept, not archived");
    }

    #[actix::test]
    async fn the_wrong_number_of_outcomes_fails_the_task_naming_the_contract() {
        for tolerance in [ErrorTolerance::All, ErrorTolerance::None] {
            let sink = ScriptedSink {
                wrong_count: true,
                ..ScriptedSink::default()
            };
            let mut run = start(
                vec![raw(0, "a"), raw(1, "b"), raw(2, "c")],
                sink,
                Options {
                    tolerance,
                    inflight: 1,
                    ..Options::default()
                },
            );
            let trace = failed_for_a_restart(&mut run).await;
            assert!(
                trace.contains("SinkTask contract violated")
                    && trace.contains("put returned 2 outcomes for a batch of 3 records"),
                "{trace}"
            );
            assert_batch_released(&run);
        }
    }

    #[actix::test]
    async fn a_retry_timeout_of_zero_does_not_retry_in_share_mode() {
        let sink = ScriptedSink {
            flaky_failures: 1,
            ..ScriptedSink::default()
        };
        // A 30 s lock leaves room for many retries: only errors.retry.timeout=0 stops them.
        let lock = Duration::from_secs(30);
        let mut run = start(
            vec![locked(0, "ok", lock), locked(1, "flaky-1", lock)],
            sink.clone(),
            Options {
                retry_timeout: RetryTimeout::NoRetry,
                ..Options::default()
            },
        );
        finish(&mut run, 2).await;
        assert_eq!(
            verdicts(&run),
            vec![(0, Disposition::Accept), (1, Disposition::Release)]
        );
        assert_eq!(sink.attempts.lock().unwrap()["flaky-1"], 1);
    }

    #[actix::test]
    async fn a_retry_timeout_of_zero_does_not_retry_in_classic_mode_and_tolerance_decides() {
        // errors.tolerance=all: the record that still fails is skipped (dead-lettered).
        let dlq = Arc::new(MemoryDeadLetters::default());
        let sink = ScriptedSink {
            flaky_failures: 1,
            ..ScriptedSink::default()
        };
        let mut run = start(
            vec![raw(0, "ok"), raw(1, "flaky-1")],
            sink.clone(),
            Options {
                share: false,
                retry_timeout: RetryTimeout::NoRetry,
                dlq: Some(Arc::clone(&dlq)),
                ..Options::default()
            },
        );
        finish(&mut run, 2).await;
        let v = verdicts(&run);
        assert_eq!(v[0], (0, Disposition::Accept));
        assert!(matches!(v[1], (1, Disposition::Reject { .. })), "{v:?}");
        assert_eq!(sink.attempts.lock().unwrap()["flaky-1"], 1);
        assert_eq!(dlq.written.lock().unwrap().len(), 1);
        // errors.tolerance=none: the task fails and the record is read again after a restart.
        let sink = ScriptedSink {
            flaky_failures: 1,
            ..ScriptedSink::default()
        };
        let mut run = start(
            vec![raw(0, "ok"), raw(1, "flaky-1")],
            sink.clone(),
            Options {
                share: false,
                retry_timeout: RetryTimeout::NoRetry,
                tolerance: ErrorTolerance::None,
                ..Options::default()
            },
        );
        failed_for_a_restart(&mut run).await;
        assert_eq!(
            verdicts(&run),
            vec![(0, Disposition::Accept), (1, Disposition::Release)]
        );
        assert_eq!(sink.attempts.lock().unwrap()["flaky-1"], 1);
    }

    #[actix::test]
    async fn fatal_failures_are_rejected_and_dead_lettered_with_context_headers() {
        let dlq = Arc::new(MemoryDeadLetters::default());
        let mut run = start(
            vec![raw(0, "ok"), raw(1, "fatal-x"), raw(2, "ok2")],
            ScriptedSink::default(),
            Options {
                dlq: Some(Arc::clone(&dlq)),
                ..Options::default()
            },
        );
        finish(&mut run, 3).await;
        let v = verdicts(&run);
        assert!(matches!(v[1].1, Disposition::Reject { .. }), "{v:?}");
        assert_eq!(v[0].1, Disposition::Accept);
        let letters = dlq.written.lock().unwrap();
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].value.as_deref(), Some(&b"fatal-x"[..]));
        let stage = letters[0]
            .headers
            .iter()
            .find(|(k, _)| k == "__connect.errors.stage")
            .and_then(|(_, v)| v.clone());
        assert_eq!(stage.as_deref(), Some(&b"TASK_PUT"[..]));
        assert_eq!(run.counters.snapshot().dead_lettered, 1);
    }

    #[actix::test]
    async fn conversion_failures_go_to_the_dead_letter_queue_and_the_rest_is_delivered() {
        let dlq = Arc::new(MemoryDeadLetters::default());
        let sink = ScriptedSink::default();
        let mut run = start(
            vec![raw(0, "{\"a\":1}"), raw(1, "{broken"), raw(2, "{\"b\":2}")],
            sink.clone(),
            Options {
                dlq: Some(Arc::clone(&dlq)),
                pipeline: [
                    ("value.converter", "json"),
                    ("value.converter.schemas.enable", "false"),
                ]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
                ..Options::default()
            },
        );
        finish(&mut run, 3).await;
        assert_eq!(sink.written.lock().unwrap().len(), 2);
        let letters = dlq.written.lock().unwrap();
        assert_eq!(letters.len(), 1);
        assert!(letters[0]
            .headers
            .iter()
            .any(|(k, v)| k == "__connect.errors.stage"
                && v.as_deref() == Some(&b"VALUE_CONVERTER"[..])));
    }

    #[actix::test]
    async fn with_tolerance_none_a_fatal_error_fails_the_task_and_keeps_the_record() {
        let mut run = start(
            vec![raw(0, "ok"), raw(1, "fatal-y")],
            ScriptedSink::default(),
            Options {
                tolerance: ErrorTolerance::None,
                ..Options::default()
            },
        );
        let event = next_final_event(&mut run).await;
        let TaskEvent::Failed { trace, .. } = event else {
            panic!("expected a failure, got {event:?}")
        };
        assert!(trace.contains("t-0@1"), "{trace}");
        assert!(trace.contains("errors.tolerance is none"), "{trace}");
        assert_eq!(
            verdicts(&run),
            vec![(0, Disposition::Accept), (1, Disposition::Release)],
            "the good record is committed; the bad one is released, not lost"
        );
        assert!(run.seen.lock().unwrap().closed);
    }

    #[actix::test]
    async fn a_dead_letter_that_cannot_be_written_releases_its_record_and_fails_the_task() {
        let dlq = Arc::new(MemoryDeadLetters {
            fail: true,
            ..MemoryDeadLetters::default()
        });
        let mut run = start(
            vec![raw(0, "fatal-z")],
            ScriptedSink::default(),
            Options {
                dlq: Some(dlq),
                ..Options::default()
            },
        );
        let TaskEvent::Failed { trace, .. } = next_final_event(&mut run).await else {
            panic!("expected a failure")
        };
        assert!(trace.contains("cannot write the dead letter"), "{trace}");
        assert_eq!(verdicts(&run), vec![(0, Disposition::Release)]);
    }

    #[actix::test]
    async fn filtered_records_are_accepted_without_reaching_put() {
        let sink = ScriptedSink::default();
        let mut run = start(
            vec![raw(0, "a"), raw(1, "b")],
            sink.clone(),
            Options {
                pipeline: [
                    ("value.converter", "string"),
                    ("transforms", "drop"),
                    ("transforms.drop.type", "Filter"),
                ]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
                ..Options::default()
            },
        );
        finish(&mut run, 2).await;
        assert!(sink.written.lock().unwrap().is_empty());
        assert!(verdicts(&run)
            .iter()
            .all(|(_, d)| *d == Disposition::Accept));
        assert_eq!(run.counters.snapshot().filtered, 2);
    }

    /// Runs 6 records through a sink that panics in `call`; returns the final event's trace.
    async fn panicking_run(call: &'static str, o: Options) -> (Run, String) {
        let sink = ScriptedSink {
            panic_in: Some(call),
            ..ScriptedSink::default()
        };
        let records = (0..6).map(|i| raw(i, &format!("r{i}"))).collect();
        let mut run = start(records, sink, o);
        if matches!(call, "close" | "stop") {
            // These run only on the way out: let every record through first.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while run.seen.lock().unwrap().committed.len() < 6 {
                assert!(tokio::time::Instant::now() < deadline, "records committed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            run.task.drain();
        }
        let event = next_final_event(&mut run).await;
        let TaskEvent::Failed { trace, .. } = event else {
            panic!("a panic in {call} must fail the task, got {event:?}")
        };
        (run, trace)
    }

    /// The trace names the panic's message and where it happened.
    fn assert_panic_trace(trace: &str, message: &str) {
        assert!(trace.contains(message), "{trace}");
        assert!(trace.contains("panicked at "), "{trace}");
        assert!(trace.contains(file!()), "no location in: {trace}");
    }

    #[actix::test]
    async fn a_panic_in_each_sink_task_call_fails_the_task_with_its_message_and_location() {
        for call in ["start", "open", "put", "flush"] {
            let started = std::time::Instant::now();
            let (run, trace) = panicking_run(call, Options::default()).await;
            assert_panic_trace(&trace, &format!("scripted panic in {call}"));
            let v = verdicts(&run);
            assert!(
                v.iter().all(|(_, d)| *d == Disposition::Release),
                "{call}: nothing is accepted after the panic: {v:?}"
            );
            if call != "start" {
                // (A task whose start panicked may fail before its first poll.)
                assert!(
                    v.iter().any(|(o, _)| *o == 0),
                    "{call}: the batch in hand: {v:?}"
                );
            }
            let counts = run.counters.snapshot();
            assert_eq!(counts.released as usize, v.len(), "{call}");
            assert_eq!(
                run.counters
                    .metrics
                    .released_unsettled
                    .load(std::sync::atomic::Ordering::Relaxed) as usize,
                v.len(),
                "{call}: counted as released unsettled"
            );
            assert!(run.seen.lock().unwrap().closed, "{call}: the group is left");
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{call}: released at once, not after a timeout ({:?})",
                started.elapsed()
            );
        }
    }

    /// A batch lost to a panic is released without verdicts; its records on their last
    /// allowed delivery are archived by the broker, so the FAILED trace names each of them.
    #[actix::test]
    async fn records_released_on_their_last_delivery_by_a_lost_batch_are_named_in_the_trace() {
        let sink = ScriptedSink {
            panic_in: Some("put"),
            ..ScriptedSink::default()
        };
        let lock = Duration::from_secs(30);
        let mut last = locked(1, "r1", lock);
        last.delivery_count = Some(5);
        let mut run = start(
            vec![locked(0, "r0", lock), last, locked(2, "r2", lock)],
            sink,
            Options::default(),
        );
        let event = next_final_event(&mut run).await;
        let TaskEvent::Failed { trace, .. } = event else {
            panic!("a panic in put fails the task, got {event:?}")
        };
        assert_panic_trace(&trace, "scripted panic in put");
        assert!(
            trace.contains("1 record(s) on their last allowed delivery")
                && trace.contains("t-0@1 (delivery 5 of 5)")
                && trace.contains("the broker archives them"),
            "{trace}"
        );
        assert!(
            !trace.contains("t-0@0 ("),
            "only the last delivery: {trace}"
        );
        assert!(verdicts(&run)
            .iter()
            .all(|(_, d)| *d == Disposition::Release));
    }

    /// A stop leaves records the consumer fetched ahead unhandled; the close releases them,
    /// so those on their last allowed delivery (archived by the broker) fail the task by name.
    #[actix::test]
    async fn a_stop_names_fetched_ahead_records_on_their_last_delivery_that_its_close_releases() {
        let sink = ScriptedSink {
            put_delay: Duration::from_millis(300),
            ..ScriptedSink::default()
        };
        let lock = Duration::from_secs(30);
        let mut records: Vec<RawRecord> = (0..6).map(|i| locked(i, "r", lock)).collect();
        records[4].delivery_count = Some(5);
        let mut run = start(
            records,
            sink,
            Options {
                inflight: 1,
                ..Options::default()
            },
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        run.task.drain();
        let event = next_final_event(&mut run).await;
        let TaskEvent::Failed { trace, .. } = event else {
            panic!("an archived record must be named in a FAILED status, got {event:?}")
        };
        assert!(
            trace.contains("t-0@4 (delivery 5 of 5)")
                && trace.contains("fetched ahead but not handed to the task"),
            "{trace}"
        );
        assert_eq!(
            verdicts(&run),
            vec![
                (0, Disposition::Accept),
                (1, Disposition::Accept),
                (2, Disposition::Accept)
            ],
            "the batch in hand was finished"
        );
        assert_eq!(
            run.counters
                .metrics
                .archived_by_limit
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    #[actix::test]
    async fn in_classic_mode_a_panicked_batch_is_released_so_no_offset_is_committed_past_it() {
        let (run, trace) = panicking_run(
            "put",
            Options {
                share: false,
                ..Options::default()
            },
        )
        .await;
        assert_panic_trace(&trace, "scripted panic in put");
        let v = verdicts(&run);
        // RELEASE is what makes a classic source read the records again (and commit nothing
        // past them); an ACCEPT here would move the committed offset over unwritten records.
        assert!(v.iter().any(|(o, _)| *o == 0), "{v:?}");
        assert!(v.iter().all(|(_, d)| *d == Disposition::Release), "{v:?}");
    }

    #[actix::test]
    async fn a_panic_in_acknowledged_fails_the_task() {
        let (run, trace) = panicking_run("acknowledged", Options::default()).await;
        assert_panic_trace(&trace, "scripted panic in acknowledged");
        assert!(trace.contains("acknowledged"), "{trace}");
        assert!(run.seen.lock().unwrap().closed);
    }

    #[actix::test]
    async fn a_panic_in_close_or_stop_fails_the_task_after_the_records_are_committed() {
        for call in ["close", "stop"] {
            let (run, trace) = panicking_run(call, Options::default()).await;
            assert_panic_trace(&trace, &format!("scripted panic in {call}"));
            assert!(verdicts(&run)
                .iter()
                .all(|(_, d)| *d == Disposition::Accept));
        }
    }

    #[actix::test]
    async fn a_panic_in_a_converter_fails_the_task_and_releases_the_batch() {
        let (run, trace) = panicking_run(
            "none",
            Options {
                panicking_converter: true,
                ..Options::default()
            },
        )
        .await;
        assert_panic_trace(&trace, "scripted converter panic on t");
        assert!(trace.contains("converter"), "{trace}");
        let v = verdicts(&run);
        assert!(!v.is_empty());
        assert!(v.iter().all(|(_, d)| *d == Disposition::Release), "{v:?}");
    }

    #[actix::test]
    async fn a_put_error_that_fails_the_task_releases_its_batch_at_once() {
        // A fatal flush error is a task failure (not a record's): the batch goes back now.
        struct FailingFlush(ScriptedSink);
        #[async_trait]
        impl SinkTask for FailingFlush {
            async fn start(&mut self, c: &ConfigMap) -> Result<(), SinkError> {
                self.0.start(c).await
            }
            async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
                self.0.put(records).await
            }
            async fn flush(
                &mut self,
                _offsets: &BTreeMap<spillway_core::TopicPartition, i64>,
            ) -> Result<(), SinkError> {
                Err(SinkError::fatal("disk full"))
            }
            async fn stop(&mut self) -> Result<(), SinkError> {
                self.0.stop().await
            }
        }
        let stopped = Arc::new(Mutex::new(false));
        let sink = ScriptedSink {
            stopped: Arc::clone(&stopped),
            ..ScriptedSink::default()
        };
        let records = (0..6).map(|i| raw(i, &format!("r{i}"))).collect();
        let mut run = start_with(records, Box::new(FailingFlush(sink)), Options::default());
        let TaskEvent::Failed { trace, .. } = next_final_event(&mut run).await else {
            panic!("a failed flush fails the task")
        };
        assert!(trace.contains("disk full"), "{trace}");
        let v = verdicts(&run);
        assert!(v.iter().any(|(o, _)| *o == 0), "{v:?}");
        assert!(v.iter().all(|(_, d)| *d == Disposition::Release), "{v:?}");
        assert!(
            *stopped.lock().unwrap(),
            "a task that failed (not panicked) is still stopped"
        );
    }

    /// A sink whose flush is costly per call (a transaction): it asks for a flush interval and
    /// logs each flush's offsets; `fail_flush` makes every flush fail.
    struct IntervalSink {
        inner: ScriptedSink,
        interval: Duration,
        flushes: Arc<Mutex<Vec<BTreeMap<spillway_core::TopicPartition, i64>>>>,
        fail_flush: bool,
    }

    impl IntervalSink {
        fn new(interval: Duration) -> Self {
            IntervalSink {
                inner: ScriptedSink::default(),
                interval,
                flushes: Arc::default(),
                fail_flush: false,
            }
        }

        /// Each flush's offset of partition t-0.
        fn flushed(flushes: &Mutex<Vec<BTreeMap<spillway_core::TopicPartition, i64>>>) -> Vec<i64> {
            flushes
                .lock()
                .unwrap()
                .iter()
                .map(|o| o[&spillway_core::TopicPartition::new("t", 0)])
                .collect()
        }
    }

    #[async_trait]
    impl SinkTask for IntervalSink {
        async fn start(&mut self, c: &ConfigMap) -> Result<(), SinkError> {
            self.inner.start(c).await
        }
        fn flush_interval(&self) -> Option<Duration> {
            Some(self.interval)
        }
        async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
            self.inner.put(records).await
        }
        async fn flush(
            &mut self,
            offsets: &BTreeMap<spillway_core::TopicPartition, i64>,
        ) -> Result<(), SinkError> {
            self.flushes.lock().unwrap().push(offsets.clone());
            if self.fail_flush {
                return Err(SinkError::retriable("transaction aborted: broker gone"));
            }
            Ok(())
        }
        async fn stop(&mut self) -> Result<(), SinkError> {
            self.inner.stop().await
        }
    }

    /// `n` records (`r0`, `r1`…) in batches of three through `sink`, classic mode, with
    /// `inflight` batches in flight and at most `held_max` in one flush.
    fn start_classic_interval(sink: IntervalSink, n: i64, inflight: usize, held_max: usize) -> Run {
        let records = (0..n).map(|i| raw(i, &format!("r{i}"))).collect();
        start_with(
            records,
            Box::new(sink),
            Options {
                share: false,
                inflight,
                held_max,
                ..Options::default()
            },
        )
    }

    #[actix::test]
    async fn held_batches_give_their_credits_back_and_are_flushed_when_the_source_runs_dry() {
        let sink = IntervalSink::new(Duration::from_secs(60));
        let flushes = Arc::clone(&sink.flushes);
        // Ten batches of three with two in flight: the held ones do not stop the consumer,
        // and all go in one flush, with their offsets merged, as soon as the consumer finds
        // nothing more to poll (long before the interval).
        let mut run = start_classic_interval(sink, 30, 2, HELD_BATCHES_MAX);
        finish(&mut run, 30).await;
        assert_eq!(IntervalSink::flushed(&flushes), vec![30]);
        assert_eq!(verdicts(&run), accepted(30));
    }

    #[actix::test]
    async fn held_batches_give_their_inflight_bytes_back() {
        // Batches of 30 bytes against a 45-byte budget: were the held batches' bytes kept,
        // the consumer would stop after two batches and wait for the 60 s interval.
        let budget = Arc::new(InflightBytes::new(Some(45)));
        let sink = IntervalSink::new(Duration::from_secs(60));
        let flushes = Arc::clone(&sink.flushes);
        let mut run = start_with(
            ten_byte_records(30),
            Box::new(sink),
            Options {
                share: false,
                inflight: 4,
                inflight_bytes: Some(Arc::clone(&budget)),
                ..Options::default()
            },
        );
        finish(&mut run, 30).await;
        assert_eq!(IntervalSink::flushed(&flushes), vec![30]);
        assert_eq!(budget.used(), 0, "every batch's bytes are released");
    }

    #[actix::test]
    async fn one_flush_covers_at_most_held_batches_max_batches() {
        let sink = IntervalSink::new(Duration::from_secs(60));
        let flushes = Arc::clone(&sink.flushes);
        let mut run = start_classic_interval(sink, 30, 2, 4);
        finish(&mut run, 30).await;
        assert_eq!(IntervalSink::flushed(&flushes), vec![12, 24, 30]);
        assert_eq!(verdicts(&run), accepted(30));
    }

    #[actix::test]
    async fn a_stop_flushes_the_held_batches_at_once() {
        let mut sink = IntervalSink::new(Duration::from_secs(60));
        sink.inner.put_delay = Duration::from_millis(100);
        let flushes = Arc::clone(&sink.flushes);
        let written = Arc::clone(&sink.inner.written);
        let mut run = start_classic_interval(sink, 60, 4, HELD_BATCHES_MAX);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while written.lock().unwrap().len() < 6 {
            assert!(std::time::Instant::now() < deadline, "never put");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(flushes.lock().unwrap().is_empty());
        // Records are left to poll, so only the stop makes the batches held now go.
        let started = std::time::Instant::now();
        run.task.drain();
        assert!(matches!(
            next_final_event(&mut run).await,
            TaskEvent::Stopped { .. }
        ));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let v = verdicts(&run);
        let last = *IntervalSink::flushed(&flushes).last().expect("flushed");
        assert!((6..60).contains(&last), "flushed up to {last}");
        assert_eq!(
            v,
            accepted(last),
            "what was flushed is committed, nothing else"
        );
    }

    #[actix::test]
    async fn held_batches_are_flushed_when_the_interval_has_passed() {
        let sink = IntervalSink::new(Duration::from_millis(200));
        let flushes = Arc::clone(&sink.flushes);
        let mut run = start_classic_interval(sink, 6, 8, HELD_BATCHES_MAX);
        // Committed without a stop: the interval's timer flushed them.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while run.seen.lock().unwrap().committed.len() < 6 {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(IntervalSink::flushed(&flushes), vec![6]);
        finish(&mut run, 6).await;
        assert_eq!(verdicts(&run), accepted(6));
    }

    #[actix::test]
    async fn a_failed_flush_of_held_batches_releases_them_all_and_fails_the_task() {
        let mut sink = IntervalSink::new(Duration::from_secs(60));
        sink.fail_flush = true;
        let mut run = start_classic_interval(sink, 9, 4, HELD_BATCHES_MAX);
        let trace = failed_for_a_restart(&mut run).await;
        assert!(trace.contains("broker gone"), "{trace}");
        let v = verdicts(&run);
        assert!(v.iter().any(|(o, _)| *o == 0), "{v:?}");
        assert!(
            v.iter().all(|(_, d)| *d == Disposition::Release),
            "nothing accepted whose flush failed: {v:?}"
        );
    }

    #[actix::test]
    async fn share_mode_flushes_every_batch_whatever_the_task_asks() {
        let sink = IntervalSink::new(Duration::from_secs(60));
        let flushes = Arc::clone(&sink.flushes);
        let records = (0..6).map(|i| raw(i, &format!("r{i}"))).collect();
        let mut run = start_with(records, Box::new(sink), Options::default());
        finish(&mut run, 6).await;
        assert_eq!(IntervalSink::flushed(&flushes), vec![3, 6]);
    }

    #[actix::test]
    async fn a_stop_whose_put_hangs_releases_the_batch_by_the_graceful_timeout() {
        let sink = ScriptedSink {
            put_delay: Duration::from_secs(60),
            ..ScriptedSink::default()
        };
        let records = (0..6).map(|i| raw(i, &format!("r{i}"))).collect();
        let mut run = start(
            records,
            sink,
            Options {
                shutdown_timeout: Duration::from_millis(1000),
                ..Options::default()
            },
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        run.task.drain();
        let event = next_final_event(&mut run).await;
        assert!(
            matches!(event, TaskEvent::Stopped { .. }),
            "a stop cut off by its timeout is still a stop: {event:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "stopped in {:?}",
            started.elapsed()
        );
        let v = verdicts(&run);
        assert!(v.iter().any(|(o, _)| *o == 0), "{v:?}");
        assert!(v.iter().all(|(_, d)| *d == Disposition::Release), "{v:?}");
        assert!(run.seen.lock().unwrap().closed, "the group is left");
    }
}
