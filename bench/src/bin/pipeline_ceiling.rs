//! Issue 18 item 4: the pipeline's own ceiling, with the broker taken out. One task's actors
//! (consumer → converter → sink → acker, the runtime's real code on one arbiter thread) drain
//! records fed from memory through the `string` converter into the `file` sink, and the bench
//! prints records per second of wall time and per CPU-second (one core's worth of work).
//!
//! `cargo run --release -p spillway-bench --bin pipeline_ceiling -- [--records N] [--record-bytes B]`
//!
//! The in-memory source hands out each poll's records as the share consumer's decoder would:
//! a `RawRecord` per record with its topic, coordinates, delivery count and lock deadline, the
//! value a slice of one shared buffer (no copy). Verdicts are settled and committed without
//! any network, and every ACCEPT is reported back as committed, as a share source does. The
//! reference is the goal itself: at least `--min-rate` (1,000,000) records per CPU-second for
//! 100-byte string records. It exits non-zero when missed.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use clap::Parser;
use futures::FutureExt;
use spillway_actors::consumer::SourceFactory;
use spillway_actors::lock_retry::TargetHealth;
use spillway_actors::metrics;
use spillway_actors::pool::TaskPool;
use spillway_actors::settings::{TaskSettings, SHARE_INFLIGHT_BATCHES_DEFAULT};
use spillway_actors::source::{AssignmentChange, Committed, Polled, RecordSource};
use spillway_actors::status::{StatusBoard, TaskCounters};
use spillway_actors::task::{spawn_task, TaskSpec};
use spillway_actors::{RuntimeError, State};
use spillway_bench::{config, cpu_time, mib, peak_rss_bytes};
use spillway_connectors::file::FileSinkTask;
use spillway_core::config::{ErrorHandling, ErrorTolerance, RetryTimeout};
use spillway_core::record::TimestampType;
use spillway_core::{Ack, Assignment, Disposition, RawRecord, RecordPipeline, Topic};

#[derive(Parser)]
struct Args {
    /// Records to drain.
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 100)]
    record_bytes: usize,
    /// Records per poll (`max.poll.records`).
    #[arg(long, default_value_t = 500)]
    poll_records: usize,
    /// Partitions the records are spread over.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// `task.inflight.batches`.
    #[arg(long, default_value_t = SHARE_INFLIGHT_BATCHES_DEFAULT)]
    inflight: usize,
    /// Goal: records per CPU-second at least this.
    #[arg(long, default_value_t = 1_000_000.0)]
    min_rate: f64,
    /// Record the task's metrics through the worker command's OpenTelemetry pipeline (bound
    /// histograms, Prometheus reader), as a running worker does; rendered once at the end and
    /// checked: one end-to-end latency per record.
    #[arg(long)]
    metrics: bool,
}

/// Hands out `total` records, `batch` per poll, built from one shared value buffer.
struct MemorySource {
    topic: Topic,
    values: Bytes,
    record_bytes: usize,
    partitions: i32,
    next: u64,
    total: u64,
    batch: usize,
    opened: bool,
    settled_accepts: Vec<spillway_core::RecordCoordinates>,
    lock_duration: Duration,
}

#[async_trait(?Send)]
impl RecordSource for MemorySource {
    async fn poll(&mut self, timeout: Duration) -> Result<Polled, RuntimeError> {
        let mut polled = Polled::default();
        if !self.opened {
            self.opened = true;
            polled
                .changes
                .push(AssignmentChange::Opened(self.assignment()));
        }
        let n = (self.batch as u64).min(self.total - self.next) as usize;
        if n == 0 {
            tokio::time::sleep(timeout).await;
            return Ok(polled);
        }
        let deadline = Instant::now() + self.lock_duration;
        // Produced just now, as a topic drained at full speed is.
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        polled.records.reserve(n);
        polled.lock_deadlines.reserve(n);
        let slots = self.values.len() / self.record_bytes;
        for i in self.next..self.next + n as u64 {
            let slot = (i as usize % slots) * self.record_bytes;
            let partition = (i % self.partitions as u64) as i32;
            polled.records.push(RawRecord {
                topic: self.topic.clone(),
                partition,
                offset: (i / self.partitions as u64) as i64,
                key: None,
                value: Some(self.values.slice(slot..slot + self.record_bytes)),
                headers: Vec::new(),
                timestamp: Some(timestamp),
                timestamp_type: TimestampType::CreateTime,
                delivery_count: Some(1),
                lock_deadline: Some(deadline),
            });
            polled.lock_deadlines.push(deadline);
        }
        self.next += n as u64;
        Ok(polled)
    }

    fn settle(&mut self, acks: &[Ack]) -> Result<(), RuntimeError> {
        self.settled_accepts.reserve(acks.len());
        for ack in acks {
            if ack.disposition != Disposition::Accept {
                return Err(RuntimeError::Source(format!(
                    "{} was not accepted: {:?}",
                    ack.record, ack.disposition
                )));
            }
            self.settled_accepts.push(ack.record.clone());
        }
        Ok(())
    }

    async fn commit(&mut self, _timeout: Duration) -> Result<Committed, RuntimeError> {
        Ok(Committed {
            accepted: std::mem::take(&mut self.settled_accepts),
            ..Committed::default()
        })
    }

    async fn close(self: Box<Self>) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn assignment(&self) -> Assignment {
        Assignment::SharedTopics(vec![self.topic.to_string()])
    }

    fn lock_duration(&self) -> Option<Duration> {
        Some(self.lock_duration)
    }
}

/// Printable values: `record_bytes`-long lines of digits, 4,096 of them.
fn value_buffer(record_bytes: usize) -> Bytes {
    let mut text = Vec::with_capacity(4096 * record_bytes);
    for i in 0..4096usize {
        let line = format!("{i:0width$}", width = record_bytes);
        text.extend_from_slice(&line.as_bytes()[..record_bytes]);
    }
    Bytes::from(text)
}

fn main() -> Result<()> {
    // As the worker does (`spillway` main).
    spillway_actors::allocator::use_jemalloc();
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("ceiling.txt");
    let system = actix::System::new();
    let result = system.block_on(run(&args, &file));
    let written = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let (records, seconds, cpu_seconds) = result?;
    let expected_bytes = records * (args.record_bytes as u64 + 1);
    if written != expected_bytes {
        bail!("the file sink wrote {written} bytes, expected {expected_bytes} ({records} lines)");
    }
    let per_cpu_second = records as f64 / cpu_seconds.max(1e-9);
    println!(
        "pipeline_ceiling: {records} records x {} B, string converter -> file sink, one task, no broker (records from memory), {} per poll, task.inflight.batches {}",
        args.record_bytes, args.poll_records, args.inflight
    );
    println!(
        "  wall: {:.2} s = {:.0} rec/s; CPU: {:.2} s = {:.0} rec/s per core ({:.3} us CPU/record); peak RSS {:.1} MiB; file {:.1} MiB",
        seconds,
        records as f64 / seconds.max(1e-9),
        cpu_seconds,
        per_cpu_second,
        cpu_seconds * 1e6 / records.max(1) as f64,
        mib(peak_rss_bytes().unwrap_or(0)),
        mib(written)
    );
    println!(
        "  records per CPU-second / goal: {:.2}  (goal >= {:.0} rec/s per core)",
        per_cpu_second / args.min_rate,
        args.min_rate
    );
    if per_cpu_second < args.min_rate {
        bail!(
            "goal missed: {per_cpu_second:.0} records per CPU-second (goal >= {:.0})",
            args.min_rate
        );
    }
    Ok(())
}

/// The worker command's metrics pipeline with the task's metrics bound to it, as the
/// supervisor binds a task's.
struct Metrics {
    telemetry: spillway::metrics::Telemetry,
    _board: StatusBoard,
}

fn bound_metrics(counters: &mut Arc<TaskCounters>) -> Result<Metrics> {
    let telemetry = spillway::metrics::Telemetry::build(false)?;
    let board = StatusBoard::default();
    metrics::register(&telemetry.meter(), &board);
    board.connector_started("ceiling", "share".into(), "connect-ceiling".into());
    let labels = metrics::ConnectorLabels {
        tenant: "bench".into(),
        connector: "ceiling".into(),
        mode: "share",
        connector_class: "FileStreamSink".into(),
        connector_version: "bench".into(),
    };
    board.set_labels("ceiling", labels.clone());
    *counters = board.task_counters("ceiling", 0);
    counters
        .metrics
        .bind(board.telemetry(), &metrics::task_labels(&labels, 0));
    board.set_task("ceiling", 0, State::Running, None);
    Ok(Metrics {
        telemetry,
        _board: board,
    })
}

/// The value of the Prometheus sample `name` (the one task's series).
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let n = series.split_once('{').map_or(series, |(n, _)| n);
        (n == name).then(|| value.parse().ok()).flatten()
    })
}

async fn run(args: &Args, file: &std::path::Path) -> Result<(u64, f64, f64)> {
    let mut counters = Arc::new(TaskCounters::default());
    let metrics = if args.metrics {
        Some(bound_metrics(&mut counters)?)
    } else {
        None
    };
    let (events, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let source = MemorySource {
        topic: "bench".into(),
        values: value_buffer(args.record_bytes),
        record_bytes: args.record_bytes,
        partitions: args.partitions.max(1),
        next: 0,
        total: args.records,
        batch: args.poll_records.max(1),
        opened: false,
        settled_accepts: Vec::new(),
        lock_duration: Duration::from_secs(30),
    };
    let factory: SourceFactory = Box::new(move || {
        async move { Ok(Box::new(source) as Box<dyn RecordSource>) }.boxed_local()
    });
    let connector = config(&[("value.converter", "string")]);
    let file_text = file.to_string_lossy().into_owned();
    let task_config = config(&[("file", file_text.as_str())]);
    // One pool thread: the task's actors share it, as tasks of a worker do.
    let pool = TaskPool::start(1);
    let cpu_start = cpu_time();
    let started = Instant::now();
    let task = spawn_task(
        TaskSpec {
            tenant: "bench".into(),
            connector: "ceiling".into(),
            connector_class: "FileStreamSink".into(),
            task: 0,
            generation: 1,
            share: true,
            errors: ErrorHandling {
                tolerance: ErrorTolerance::None,
                retry_timeout: RetryTimeout::Infinite,
                retry_delay_max: Duration::from_secs(1),
                log_enable: false,
                log_include_messages: false,
                dead_letter_queue: None,
            },
            task_config,
            pipeline: RecordPipeline::from_config(&connector, &BTreeMap::new())
                .context("the string converter")?,
            sink_task: Box::new(FileSinkTask::default()),
            source: factory,
            dead_letters: None,
            settings: TaskSettings {
                inflight_batches: args.inflight.max(1),
                poll_timeout: Duration::from_millis(50),
                ..TaskSettings::default()
            },
            counters: Arc::clone(&counters),
            reporter: Arc::new(move |e| {
                let _ = events.send(e);
            }),
            throttle: None,
            inflight_bytes: None,
            target_health: TargetHealth::default(),
        },
        &pool,
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let accepted = counters.accepted.load(Ordering::Relaxed);
        if accepted >= args.records {
            break;
        }
        if let Ok(event) = events_rx.try_recv() {
            if !matches!(event, spillway_actors::messages::TaskEvent::Progress { .. }) {
                bail!("the task ended early: {event:?}");
            }
        }
        if Instant::now() > deadline {
            bail!(
                "only {accepted} of {} records accepted in 600 s",
                args.records
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = (cpu_time() - cpu_start).as_secs_f64();
    task.drain();
    let stop_deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < stop_deadline {
        match tokio::time::timeout(Duration::from_secs(1), events_rx.recv()).await {
            Ok(Some(spillway_actors::messages::TaskEvent::Progress { .. })) | Err(_) => continue,
            Ok(Some(spillway_actors::messages::TaskEvent::Stopped { .. })) | Ok(None) => break,
            Ok(Some(other)) => bail!("the task did not stop cleanly: {other:?}"),
        }
    }
    if let Some(metrics) = metrics {
        let text = metrics.telemetry.render()?;
        let get = |metric: &str| {
            sample(&text, &format!("kafka_connect_sink_task_metrics_{metric}")).unwrap_or(0.0)
        };
        let latencies = get("sink_record_e2e_latency_ms_count");
        let margins = get("sink_record_lock_margin_ms_count");
        println!(
            "  metrics: {latencies} end-to-end latencies, {margins} lock margins, mean latency {:.1} ms",
            get("sink_record_e2e_latency_ms_sum") / latencies.max(1.0)
        );
        if latencies != args.records as f64 || margins < 1.0 {
            bail!("the metrics missed records: {latencies} latencies, {margins} lock margins for {} records", args.records);
        }
    }
    Ok((args.records, seconds, cpu_seconds))
}
