//! Replication between two clusters (issue 17's benchmark, issue 18 item 3): `spillway mirror`
//! copying one topic from cluster A to cluster B, at least once and exactly once, against the C
//! reference's consume → produce loop (`bench/c/librdkafka_reference.c`, `copy` with the target
//! on the other cluster), on the same kind of clusters with the same records in the same run.
//!
//! `cargo run --release -p spillway-bench --bin mirror_replication -- [--records 100000]
//! [--rounds 3] [--partitions 8] [--max-poll-records N] [--transaction-boundary poll]`
//!
//! Each contender gets two fresh dev clusters, each behind the test kit's admin-emulating proxy
//! (the mirror creates the remote topic through it), with the records produced to A before it
//! starts. The order alternates between rounds. The mirror is this program run again with
//! `--mirror-process FILE` (the `spillway mirror` code), one flow `A->B` with MirrorMaker 2's
//! defaults (offset syncs, heartbeats, one task) but no checkpoints (a per-interval cost, not a
//! per-record one, and the dev cluster cannot list groups); its CPU is counted from the moment
//! its flow's connector starts replicating (its remote topic made, as the C loop's is before it
//! subscribes) until every record is copied and its source offset committed on A, as the
//! process reports it with `getrusage` when asked on its standard input (`/proc`'s 10 ms ticks
//! were 2–3% of a run); its rate from the first copy on B to the last. The C loop reports the
//! same, its CPU from before it makes its clients (the mirror's window holds its task making its
//! own). The harness reads each contender's progress (B's watermarks, the group's commits on
//! A) every 20 ms while it runs, the C loop's too, so that both share their cores with that
//! neighbour.
//!
//! Goals (issue 18; exit non-zero when missed): CPU per record at least once ≤ 1.3× the C
//! loop's, exactly once ≤ 1.6×; every record copied. Exactly once runs with
//! `transaction.boundary=interval` unless told otherwise: each transaction costs librdkafka
//! about 0.27 ms of CPU whatever it holds, and `poll` pays it for every batch of 500.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use spillway_bench::c_reference::{CReference, Rounds};
use spillway_tests::{numbered_records, ProxiedDevBroker, TestProducer};

#[derive(Parser)]
struct Args {
    /// Records replicated per run.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Partitions of the replicated topic.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Runs of each contender; the order alternates.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Goal: at-least-once CPU per record against the C loop's.
    #[arg(long, default_value_t = 1.3)]
    max_at_least_once_ratio: f64,
    /// Goal: exactly-once CPU per record against the C loop's.
    #[arg(long, default_value_t = 1.6)]
    max_exactly_once_ratio: f64,
    /// The flow's `max.poll.records` (`A->B.consumer.max.poll.records`): records per batch,
    /// so per transaction under exactly once. Unset: the runtime's default (500).
    #[arg(long)]
    max_poll_records: Option<usize>,
    /// The exactly-once flow's `transaction.boundary`: `interval` (several batches per
    /// transaction) or `poll` (one per batch, Connect's default).
    #[arg(long, default_value = "interval", value_parser = ["poll", "interval"])]
    transaction_boundary: String,
    /// More lines for the mirror's mm2.properties (`KEY = VALUE`), for example
    /// `--property "A->B.producer.linger.ms = 0"`; may be given several times.
    #[arg(long = "property")]
    properties: Vec<String>,
    /// Run as the mirror process with this mm2.properties (internal).
    #[arg(long, hide = true)]
    mirror_process: Option<PathBuf>,
}

const TOPIC: &str = "bench";
const REMOTE: &str = "A.bench";
/// The flow's consumer group on A (Connect's `connect-<connector name>`).
const FLOW_GROUP: &str = "connect-mirror-A-B";
const WAIT: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Contender {
    CLoop,
    AtLeastOnce,
    ExactlyOnce,
}

impl Contender {
    fn label(self) -> &'static str {
        match self {
            Contender::CLoop => "librdkafka C consume->produce loop",
            Contender::AtLeastOnce => "spillway mirror, at least once",
            Contender::ExactlyOnce => "spillway mirror, exactly once",
        }
    }
}

/// Two fresh clusters, `TOPIC` on A holding the bench's records.
async fn clusters(args: &Args) -> Result<(ProxiedDevBroker, ProxiedDevBroker)> {
    let a = ProxiedDevBroker::start(1, &[(TOPIC, args.partitions)]).map_err(anyhow::Error::msg)?;
    let b = ProxiedDevBroker::start(1, &[]).map_err(anyhow::Error::msg)?;
    let records = numbered_records(args.records, args.value_size, args.partitions);
    let produced = TestProducer::new(&a.broker().bootstrap(), "none")
        .send(TOPIC, records)
        .await;
    if produced.len() as u64 != args.records {
        bail!("produced {} of {} records", produced.len(), args.records);
    }
    Ok((a, b))
}

/// What one run measured.
struct Run {
    records: u64,
    seconds: f64,
    cpu_seconds: f64,
    peak_rss_bytes: u64,
    /// Fetch requests A received and Produce requests B received while the contender ran.
    requests: Requests,
}

/// What a contender asked of the clusters, counted by the dev brokers from its start.
struct Requests {
    fetches: u64,
    produces: u64,
}

impl Requests {
    /// Counting from now on, on both clusters.
    fn start(a: &ProxiedDevBroker, b: &ProxiedDevBroker) {
        a.broker().start_request_tracking();
        b.broker().start_request_tracking();
    }

    fn read(a: &ProxiedDevBroker, b: &ProxiedDevBroker) -> Requests {
        Requests {
            fetches: a
                .broker()
                .request_counts()
                .get(&FETCH)
                .copied()
                .unwrap_or(0),
            produces: b
                .broker()
                .request_counts()
                .get(&PRODUCE)
                .copied()
                .unwrap_or(0),
        }
    }

    /// "Fetch x, Produce y per 1,000 records".
    fn per_thousand(&self, records: u64) -> String {
        let per = |n: u64| n as f64 * 1000.0 / records.max(1) as f64;
        format!(
            "Fetch {:.2}, Produce {:.2} per 1,000 records",
            per(self.fetches),
            per(self.produces)
        )
    }
}

const PRODUCE: i16 = 0;
const FETCH: i16 = 1;

async fn run_c(c: &CReference, args: &Args) -> Result<Run> {
    let (a, b) = clusters(args).await?;
    b.broker().create_topic(REMOTE, args.partitions);
    let watch = Watch::new(&a, C_GROUP, &b, args.partitions)?;
    Requests::start(&a, &b);
    // The C loop times itself; the harness still reads its progress as it reads the mirror's,
    // so that both contenders share their cores and brokers with the same neighbour.
    let watching = watch.in_background();
    let summary = c
        .copy(
            &a.bootstrap(),
            C_GROUP,
            TOPIC,
            REMOTE,
            Some(&b.bootstrap()),
            args.records,
        )
        .await;
    let watch = watching.stop()?;
    let summary = summary?;
    if summary.records != args.records {
        bail!("the C loop copied {} of {}", summary.records, args.records);
    }
    let copies = watch.copies()?;
    if copies < args.records {
        bail!("B holds {copies} copies of {} records", args.records);
    }
    Ok(Run {
        records: summary.records,
        seconds: summary.seconds,
        cpu_seconds: summary.cpu_seconds,
        peak_rss_bytes: summary.peak_rss_bytes,
        requests: Requests::read(&a, &b),
    })
}

fn mm2_properties(
    a: &ProxiedDevBroker,
    b: &ProxiedDevBroker,
    exactly_once: bool,
    max_poll_records: Option<usize>,
    transaction_boundary: &str,
    properties: &[String],
) -> String {
    let mut text = format!(
        "clusters = A, B\nA.bootstrap.servers = {}\nB.bootstrap.servers = {}\n\
         replication.factor = 1\nheartbeats.topic.replication.factor = 1\n\
         offset-syncs.topic.replication.factor = 1\ncheckpoints.topic.replication.factor = 1\n\
         A->B.enabled = true\nA->B.topics = {TOPIC}\nemit.checkpoints.enabled = false\n",
        a.bootstrap(),
        b.bootstrap()
    );
    if exactly_once {
        text.push_str("B.exactly.once.source.support = enabled\n");
        text.push_str(&format!("transaction.boundary = {transaction_boundary}\n"));
    }
    if let Some(n) = max_poll_records {
        text.push_str(&format!("A->B.consumer.max.poll.records = {n}\n"));
    }
    for line in properties {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// The mirror process; stopped when dropped.
struct MirrorChild(Child);

/// How long a stopped mirror may take to leave before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);

impl Drop for MirrorChild {
    fn drop(&mut self) {
        // SIGTERM first, as an operator stops it: the process leaves through its own exit,
        // so a profiler that runs it (`valgrind --trace-children=yes`) writes its output.
        let asked = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if asked {
            let deadline = Instant::now() + STOP_WAIT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How the mirror process starts the line that reports its CPU time, in microseconds.
const CPU_REPORT: &str = "mirror cpu_us=";

/// In the mirror process: for each line on standard input, its CPU time so far (all threads,
/// `getrusage`, as the C loop reads its own) on standard error. The thread waits in a read:
/// it wakes only when asked.
fn report_cpu_when_asked() {
    std::thread::spawn(|| {
        for _ in std::io::stdin().lock().lines().map_while(Result::ok) {
            eprintln!("{CPU_REPORT}{}", spillway_bench::cpu_time().as_micros());
        }
    });
}

/// The harness's side of the mirror's CPU reports: a question written to its standard input,
/// the answer read from its standard error by the thread that reads its log.
#[derive(Clone)]
struct CpuReports {
    stdin: Arc<Mutex<std::process::ChildStdin>>,
    answers: Arc<Mutex<Option<mpsc::Sender<Result<Duration>>>>>,
}

/// A question asked; its answer comes through the channel.
struct Asked(mpsc::Receiver<Result<Duration>>);

impl Asked {
    fn answer(self) -> Result<Duration> {
        self.0
            .recv_timeout(WAIT)
            .context("the mirror did not report its CPU time")?
    }
}

impl CpuReports {
    fn of(child: &mut Child) -> Result<CpuReports> {
        Ok(CpuReports {
            stdin: Arc::new(Mutex::new(
                child.stdin.take().context("the mirror's stdin")?,
            )),
            answers: Arc::new(Mutex::new(None)),
        })
    }

    /// Asks once; the next report answers.
    fn ask(&self) -> Asked {
        let (tx, rx) = mpsc::channel();
        *self.answers.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx.clone());
        let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writeln!(stdin, "cpu").and_then(|()| stdin.flush()) {
            let _ = tx.send(Err(anyhow::anyhow!(
                "cannot ask the mirror its CPU time: {e}"
            )));
        }
        Asked(rx)
    }

    /// A report read from the mirror's log.
    fn answered(&self, micros: &str) {
        let answer = micros
            .trim()
            .parse::<u64>()
            .map(Duration::from_micros)
            .with_context(|| format!("the mirror reported its CPU time as {micros:?}"));
        if let Some(tx) = self
            .answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = tx.send(answer);
        }
    }
}

/// Reads the mirror's log on a thread of its own: asks for its CPU time when its flow's
/// connector starts replicating (the question goes to `started`), hands CPU reports to
/// `reports`, and passes warnings and errors on.
fn follow_log(
    log: impl std::io::Read + Send + 'static,
    reports: CpuReports,
    started: mpsc::Sender<Asked>,
) {
    std::thread::spawn(move || {
        let mut asked = false;
        for line in BufReader::new(log).lines().map_while(Result::ok) {
            // The flow's connector started on its remote topic: what the C loop has when it
            // subscribes (its remote topic made by the harness beforehand).
            if !asked && line.contains("replicating") && line.contains("connector=") {
                asked = true;
                let _ = started.send(reports.ask());
            }
            if let Some(micros) = line.strip_prefix(CPU_REPORT) {
                reports.answered(micros);
            }
            if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("  mirror: {line}");
            }
        }
    });
}

async fn run_mirror(args: &Args, exactly_once: bool, dir: &Path) -> Result<Run> {
    let (a, b) = clusters(args).await?;
    let properties = dir.join(if exactly_once {
        "eos.properties"
    } else {
        "alo.properties"
    });
    std::fs::write(
        &properties,
        mm2_properties(
            &a,
            &b,
            exactly_once,
            args.max_poll_records,
            &args.transaction_boundary,
            &args.properties,
        ),
    )?;
    Requests::start(&a, &b);
    let mut child = MirrorChild(
        Command::new(std::env::current_exe()?)
            .arg("--mirror-process")
            .arg(&properties)
            .env("RUST_LOG", "warn,spillway::mirror=info")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the mirror process")?,
    );
    let pid = child.0.id();
    let cpu = CpuReports::of(&mut child.0)?;
    // The flow's connector starting is the mirror's "subscription": its log says so.
    let (started_tx, started_rx) = mpsc::channel();
    let stderr = child.0.stderr.take().context("the mirror's stderr")?;
    follow_log(stderr, cpu.clone(), started_tx);
    let cpu_start = tokio::task::spawn_blocking(move || -> Result<Duration> {
        let asked = started_rx
            .recv_timeout(WAIT)
            .context("the mirror's flow never started replicating")?;
        asked.answer()
    })
    .await??;

    let watch = Watch::new(&a, FLOW_GROUP, &b, args.partitions)?;
    let want = args.records;
    let flow_started = Instant::now();
    let measured = tokio::task::spawn_blocking(move || -> Result<(f64, u64, f64)> {
        let deadline = Instant::now() + WAIT;
        let mut first: Option<(Instant, u64)> = None;
        let mut last_copy = Instant::now();
        let mut copies = 0;
        // A read that fails (a coordinator still loading, a commit not stable yet) counts as
        // nothing read; it is named if the run times out.
        let mut failed_read: Option<anyhow::Error> = None;
        loop {
            if Instant::now() > deadline {
                let why = failed_read.map_or_else(String::new, |e| format!(" ({e:#})"));
                bail!("{copies} copies on B after {WAIT:?}{why}");
            }
            let now = watch.copies().unwrap_or_else(|e| {
                failed_read = Some(e);
                0
            });
            if now > copies {
                copies = now;
                last_copy = Instant::now();
                first.get_or_insert((last_copy, now));
            }
            let committed = watch.committed().unwrap_or_else(|e| {
                failed_read = Some(e);
                0
            });
            let Some((t0, copied_at_first)) = first else {
                std::thread::sleep(WATCH_INTERVAL);
                continue;
            };
            if committed >= want {
                // Every record copied and its source offset committed: the mirror's work done.
                let cpu = cpu.ask().answer()?;
                let timed = want.saturating_sub(copied_at_first);
                if timed == 0 {
                    // Everything appeared at once (one transaction): time it from the start.
                    let seconds = last_copy.duration_since(flow_started).as_secs_f64();
                    return Ok((seconds, want, cpu.as_secs_f64()));
                }
                let seconds = last_copy.duration_since(t0).as_secs_f64();
                return Ok((seconds, timed, cpu.as_secs_f64()));
            }
            std::thread::sleep(WATCH_INTERVAL);
        }
    })
    .await??;
    let (seconds, timed_records, cpu_end) = measured;
    let peak_rss_bytes = spillway_bench::peak_rss_bytes_of(pid).unwrap_or(0);
    let requests = Requests::read(&a, &b);
    drop(child);
    Ok(Run {
        records: want,
        // The rate over the records copied after the first one was seen.
        seconds: seconds * want as f64 / timed_records.max(1) as f64,
        cpu_seconds: cpu_end - cpu_start.as_secs_f64(),
        peak_rss_bytes,
        requests,
    })
}

/// How often the harness reads a contender's progress.
const WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// The C loop's consumer group on A.
const C_GROUP: &str = "bench-c-copy";

/// The harness's view of a contender's progress: B's high watermarks of the remote topic
/// (copies, and markers under transactions) and the contender's committed offsets on A. Each
/// read is one request to one cluster (a ListOffsets for every partition, an OffsetFetch), made
/// with clients made once per run; neither joins a group. It reads every `WATCH_INTERVAL`
/// while either contender runs (see `run_c`): two ListOffsets a partition per read, and a new
/// client per read before that, kept the mirror's cores and B's broker busier than the C
/// loop's ever were (bench/README.md).
struct Watch {
    committed: BaseConsumer,
    watermarks: BaseConsumer,
    group: &'static str,
    partitions: i32,
}

impl Watch {
    fn new(
        a: &ProxiedDevBroker,
        group: &'static str,
        b: &ProxiedDevBroker,
        partitions: i32,
    ) -> Result<Watch> {
        Ok(Watch {
            committed: ClientConfig::new()
                .set("bootstrap.servers", a.broker().bootstrap())
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .create()?,
            watermarks: ClientConfig::new()
                .set("bootstrap.servers", b.broker().bootstrap())
                .create()?,
            group,
            partitions,
        })
    }

    fn partition_list(&self, topic: &str, offset: Offset) -> Result<TopicPartitionList> {
        let mut list = TopicPartitionList::new();
        for p in 0..self.partitions {
            list.add_partition_offset(topic, p, offset)?;
        }
        Ok(list)
    }

    /// The sum of B's high watermarks of the remote topic.
    fn copies(&self) -> Result<u64> {
        // A timestamp of "end" asks for each partition's latest offset, all in one request.
        let latest = self
            .watermarks
            .offsets_for_times(self.partition_list(REMOTE, Offset::End)?, TIMEOUT)?;
        sum_of_offsets(&latest).with_context(|| format!("reading B's watermarks of {REMOTE}"))
    }

    /// The sum of the group's committed offsets on A.
    fn committed(&self) -> Result<u64> {
        let list = self.partition_list(TOPIC, Offset::Invalid)?;
        let committed = self.committed.committed_offsets(list, TIMEOUT)?;
        sum_of_offsets(&committed)
            .with_context(|| format!("reading {}'s committed offsets on A", self.group))
    }

    /// Reads on a thread of its own, as for the mirror, until stopped.
    fn in_background(self) -> Watching {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                // Only the load matters here: the C loop reports its own progress.
                let _ = self.copies();
                let _ = self.committed();
                std::thread::sleep(WATCH_INTERVAL);
            }
            self
        });
        Watching { stop, thread }
    }
}

/// A [`Watch`] reading in the background.
struct Watching {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Watch>,
}

impl Watching {
    fn stop(self) -> Result<Watch> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the harness's watch panicked"))
    }
}

/// How long one read of a contender's progress may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The sum of a list's offsets; a partition with an error is an error, one without an offset
/// (nothing committed yet) counts 0.
fn sum_of_offsets(list: &TopicPartitionList) -> Result<u64> {
    let mut sum = 0;
    for e in list.elements() {
        if let Err(error) = e.error() {
            bail!("partition {}: {error}", e.partition());
        }
        if let Offset::Offset(o) = e.offset() {
            sum += o.max(0) as u64;
        }
    }
    Ok(sum)
}

#[tokio::main]
async fn main() -> Result<()> {
    // As the `spillway` binary does.
    spillway_actors::allocator::use_jemalloc();
    let args = Args::parse();
    if let Some(properties) = args.mirror_process {
        report_cpu_when_asked();
        let mut config = spillway::telemetry::TelemetryConfig::from_env()?;
        config.traces = None;
        let mut telemetry = spillway::telemetry::init(config)?;
        let result = spillway::mirror::run(&properties, None).await;
        telemetry.shutdown();
        return result;
    }
    let c = CReference::build()?;
    let dir = tempfile::tempdir()?;
    let mut results: BTreeMap<Contender, Rounds> = BTreeMap::new();
    let forward = [
        Contender::CLoop,
        Contender::AtLeastOnce,
        Contender::ExactlyOnce,
    ];
    println!(
        "mirror_replication: {} records of {} B, {} partitions, {} rounds; exactly once with transaction.boundary={}",
        args.records, args.value_size, args.partitions, args.rounds, args.transaction_boundary
    );
    for round in 0..args.rounds {
        let mut order = forward.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for contender in order {
            let run = match contender {
                Contender::CLoop => run_c(&c, &args).await,
                Contender::AtLeastOnce => run_mirror(&args, false, dir.path()).await,
                Contender::ExactlyOnce => run_mirror(&args, true, dir.path()).await,
            }
            .with_context(|| format!("round {}: {}", round + 1, contender.label()))?;
            println!(
                "  round {} {:<38} {:>6.2} us CPU/record {:>8.0} rec/s  ({})",
                round + 1,
                contender.label(),
                run.cpu_seconds * 1e6 / run.records as f64,
                run.records as f64 / run.seconds.max(1e-9),
                run.requests.per_thousand(run.records)
            );
            results.entry(contender).or_default().add(
                run.records,
                run.seconds,
                run.cpu_seconds,
                run.peak_rss_bytes,
            );
        }
    }
    println!();
    for (contender, rounds) in &results {
        println!("{:<38} {}", contender.label(), rounds.line());
    }
    let reference = &results[&Contender::CLoop];
    let mut missed = Vec::new();
    for (contender, goal) in [
        (Contender::AtLeastOnce, args.max_at_least_once_ratio),
        (Contender::ExactlyOnce, args.max_exactly_once_ratio),
    ] {
        let rounds = &results[&contender];
        let cpu = rounds.cpu_us_median() / reference.cpu_us_median();
        let rate = rounds.rate_median() / reference.rate_median();
        println!(
            "{}: CPU per record {cpu:.2}x the C loop's (goal <= {goal}), rate {rate:.2}x",
            contender.label()
        );
        if cpu > goal {
            missed.push(format!("{}: {cpu:.2}x > {goal}", contender.label()));
        }
    }
    if !missed.is_empty() {
        bail!("goal missed: {}", missed.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the mirror process: answers each line on its standard input with a
    /// report, after a log line of its own.
    fn answering_child(reports: &[&str]) -> Child {
        let script: String = reports
            .iter()
            .map(|r| format!("read q; echo 'INFO busy' >&2; echo '{CPU_REPORT}{r}' >&2; "))
            .collect();
        stand_in(&script)
    }

    /// A shell running `script` with the mirror process's pipes.
    fn stand_in(script: &str) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh runs")
    }

    fn reading(child: &mut Child) -> CpuReports {
        let reports = CpuReports::of(child).expect("stdin piped");
        let stderr = child.stderr.take().expect("stderr piped");
        // The stand-in's flow never starts: nothing is asked through `started`.
        let (started, _) = mpsc::channel();
        follow_log(stderr, reports.clone(), started);
        reports
    }

    #[test]
    fn each_question_gets_the_report_that_answers_it() {
        let mut child = answering_child(&["1500", "2750"]);
        let reports = reading(&mut child);
        assert_eq!(
            reports.ask().answer().expect("answered"),
            Duration::from_micros(1500)
        );
        assert_eq!(
            reports.ask().answer().expect("answered"),
            Duration::from_micros(2750)
        );
        child.wait().expect("the stand-in exits");
    }

    #[test]
    fn the_window_opens_once_at_the_connectors_first_replicating_line() {
        // The mirror's own lines, as its log writes them (`spillway::mirror::flow`).
        let script = "echo 'INFO spillway::mirror: flow started flow=A->B' >&2; \
             echo 'WARN mirror step failed; tried again later flow=A->B error=flow A->B: not replicating yet: x' >&2; \
             echo 'INFO spillway::mirror::flow: replicating flow=A->B connector=mirror-A-B topics=bench' >&2; \
             read q; echo 'mirror cpu_us=42' >&2; \
             echo 'INFO spillway::mirror::flow: replicating flow=A->B connector=mirror-A-B topics=bench,more' >&2";
        let mut child = stand_in(script);
        let reports = CpuReports::of(&mut child).expect("stdin piped");
        let (started, opened) = mpsc::channel();
        follow_log(child.stderr.take().expect("stderr"), reports, started);
        let asked = opened
            .recv_timeout(WAIT)
            .expect("asked at the connector's start");
        assert_eq!(asked.answer().expect("answered"), Duration::from_micros(42));
        child.wait().expect("the stand-in exits");
        // The log is over and the reader gone: a second question would be waiting here.
        assert!(
            opened.recv().is_err(),
            "asked again at a later reconfiguration"
        );
    }

    #[test]
    fn a_report_that_is_not_a_number_is_an_error_naming_it() {
        let mut child = answering_child(&["soon"]);
        let reports = reading(&mut child);
        let error = reports.ask().answer().expect_err("not a number");
        assert!(
            format!("{error:#}").contains("\"soon\""),
            "the error names the report: {error:#}"
        );
        child.wait().expect("the stand-in exits");
    }

    /// The harness's reads are a neighbour of the contender it watches, so each costs one
    /// request: the earlier per-partition watermarks cost two ListOffsets a partition.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_of_a_contenders_progress_is_one_request_per_cluster() {
        const LIST_OFFSETS: i16 = 2;
        const OFFSET_FETCH: i16 = 9;
        let a = ProxiedDevBroker::start(1, &[(TOPIC, 4)]).expect("cluster A");
        let b = ProxiedDevBroker::start(1, &[(REMOTE, 4)]).expect("cluster B");
        let produced = TestProducer::new(&b.broker().bootstrap(), "none")
            .send(REMOTE, numbered_records(40, 10, 4))
            .await;
        assert_eq!(produced.len(), 40);
        let watch = Watch::new(&a, C_GROUP, &b, 4).expect("clients made");
        let (copies, committed) = tokio::task::spawn_blocking(move || {
            // The first reads also find the leaders and the coordinator.
            watch.copies().expect("watermarks read");
            watch.committed().expect("commits read");
            a.broker().start_request_tracking();
            b.broker().start_request_tracking();
            let copies = watch.copies().expect("watermarks read");
            let committed = watch.committed().expect("commits read");
            let on_a = a.broker().request_counts();
            let on_b = b.broker().request_counts();
            assert_eq!(on_b.get(&LIST_OFFSETS), Some(&1), "requests on B: {on_b:?}");
            assert_eq!(on_a.get(&OFFSET_FETCH), Some(&1), "requests on A: {on_a:?}");
            assert_eq!(on_a.values().sum::<u64>(), 1, "requests on A: {on_a:?}");
            (copies, committed)
        })
        .await
        .expect("reads ran");
        assert_eq!(copies, 40, "every record on B counted once");
        assert_eq!(committed, 0, "nothing committed by the group");
    }
}
