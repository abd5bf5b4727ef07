//! SIGTERM is a clean stop: `spillway standalone` draining a topic into a file (the file sink)
//! while records are still being produced is sent SIGTERM, again and again, and restarted each
//! time. Every stop exits 0
//! within `task.shutdown.graceful.timeout.ms` plus the process's own start and exit, and in the
//! end the file holds every record exactly once: in-flight batches were finished and committed,
//! and the group left, before each exit. Once in share mode, once in classic mode.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use spillway_tests::{DeliveryReport, DevBroker, TestProducer, TestRecord};

const RECORDS: usize = 60_000;
/// Produced in chunks of this many, one chunk every [`CHUNK_EVERY`] (4,000 records/s), so the
/// stream is still flowing while the process is bounced.
const CHUNK: usize = 400;
const CHUNK_EVERY: Duration = Duration::from_millis(100);
const PARTITIONS: i32 = 6;
const BOUNCES: usize = 3;
/// The worker's `task.shutdown.graceful.timeout.ms`.
const GRACEFUL_MS: u64 = 5_000;
/// Beyond the graceful timeout, what a debug build on two shared cores may take to exit.
const EXIT_MARGIN: Duration = Duration::from_secs(10);

/// A `spillway` process; SIGKILLed if dropped before it stopped.
struct Process(Child);

impl Process {
    /// `spillway standalone` on the given files.
    fn start(worker: &Path, connector: &Path) -> Process {
        Process(
            Command::new(env!("CARGO_BIN_EXE_spillway"))
                .arg("standalone")
                .arg(worker)
                .arg(connector)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spillway standalone starts"),
        )
    }

    /// Sends SIGTERM and waits for the exit; returns it and how long it took.
    fn terminate(&mut self) -> (ExitStatus, Duration) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM to {} failed", self.0.id());
        let started = Instant::now();
        let limit = Duration::from_millis(GRACEFUL_MS) + EXIT_MARGIN;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return (status, started.elapsed());
            }
            assert!(
                started.elapsed() < limit,
                "spillway did not exit within {limit:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Records `start..start + CHUNK`, valued `r<index>`, spread over the partitions.
fn chunk(start: usize) -> Vec<TestRecord> {
    (start..(start + CHUNK).min(RECORDS))
        .map(|i| TestRecord {
            partition: Some((i % PARTITIONS as usize) as i32),
            key: Some(i.to_string().into_bytes()),
            value: Some(format!("r{i}").into_bytes()),
            ..TestRecord::default()
        })
        .collect()
}

/// Bounces the file sink (`tasks` tasks) `BOUNCES` times with SIGTERM, lets the last run
/// finish, and checks the file; `mode` adds connector properties.
async fn bounce(name: &str, tasks: u32, mode: &str) {
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    // Anything left acquired by a stop would come back only after 30 s: a clean stop leaves
    // nothing, and the run below would not finish in time otherwise.
    broker.set_share_record_lock_duration(30_000);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(3_000);
    broker.create_topic(name, PARTITIONS);
    // One producer that stays open: on the dev broker a closing connection ends every share
    // session on the broker (and would release the records the sink holds).
    let producer = TestProducer::new(&broker.bootstrap(), "none");
    let first = producer.send(name, chunk(0)).await;
    let topic = name.to_owned();
    let producing = tokio::spawn(async move {
        let mut produced = first;
        for start in (CHUNK..RECORDS).step_by(CHUNK) {
            tokio::time::sleep(CHUNK_EVERY).await;
            produced.extend(producer.send(&topic, chunk(start)).await);
        }
        produced
    });

    let dir = tempfile::tempdir().expect("tempdir");
    let out: PathBuf = dir.path().join("out.txt");
    let worker = dir.path().join("worker.properties");
    std::fs::write(
        &worker,
        format!(
            "bootstrap.servers={}\n\
             key.converter=org.apache.kafka.connect.storage.StringConverter\n\
             value.converter=org.apache.kafka.connect.storage.StringConverter\n\
             task.shutdown.graceful.timeout.ms={GRACEFUL_MS}\ntask.poll.timeout.ms=100\nrest.port=0\n",
            broker.bootstrap()
        ),
    )
    .expect("worker properties");
    let connector = dir.path().join("sink.properties");
    std::fs::write(
        &connector,
        format!(
            "name={name}\nconnector.class=FileStreamSink\ntasks.max={tasks}\ntopics={name}\n\
             file={}\nconsumer.override.max.poll.records=200\n{mode}",
            out.display()
        ),
    )
    .expect("connector properties");

    let mut rng = rand::thread_rng();
    let mut mid_stream = 0;
    for bounce in 0..BOUNCES {
        let mut process = Process::start(&worker, &connector);
        let before = lines(&out).len();
        // Let it start and write for a while, then stop it wherever it is.
        let deadline = Instant::now() + Duration::from_secs(60);
        while lines(&out).len() < before + 1_000 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..1_500))).await;
        let at_stop = lines(&out).len();
        let still_producing = !producing.is_finished();
        let (status, took) = process.terminate();
        eprintln!(
            "{name}: bounce {bounce}: SIGTERM at {at_stop} lines, exit {status} after {took:?}"
        );
        assert!(status.success(), "bounce {bounce}: exited with {status}");
        if still_producing || at_stop < RECORDS {
            mid_stream += 1;
        }
    }
    assert!(
        mid_stream == BOUNCES,
        "only {mid_stream} of {BOUNCES} SIGTERMs came mid-stream"
    );
    let expected: Vec<(String, i32, i64)> = producing
        .await
        .expect("the producer")
        .iter()
        .map(|p| (p.topic.clone(), p.partition, p.offset))
        .collect();
    let mut last = Process::start(&worker, &connector);
    let deadline = Instant::now() + Duration::from_secs(240);
    while lines(&out).len() < RECORDS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few seconds more, to catch duplicates arriving late.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, _) = last.terminate();
    assert!(status.success(), "the last run exited with {status}");

    let delivered = lines(&out).into_iter().map(|line| {
        let i: usize = line
            .strip_prefix('r')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected line '{line}' in the output"));
        expected[i].clone()
    });
    let report = DeliveryReport::compare(expected.clone(), delivered);
    eprintln!("{name}: {}", report.summary());
    assert!(report.exactly_once(), "{}", report.summary());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_bounces_in_share_mode_deliver_every_record_exactly_once() {
    bounce(
        "bounce-share",
        2,
        "consumer.override.group.protocol=share\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_bounces_in_classic_mode_deliver_every_record_exactly_once() {
    // One task: two tasks of one consumer group re-read what the first processed when the
    // second joins (eager rebalance: commits refused with REBALANCE_IN_PROGRESS while batches
    // are in flight), a startup duplicate this test is not about; see docs/runtime.md.
    bounce(
        "bounce-classic",
        1,
        "consumer.override.session.timeout.ms=6000\nconsumer.override.heartbeat.interval.ms=1000\n",
    )
    .await;
}

#[test]
fn the_dev_broker_stops_on_sigterm_and_exits_zero() {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["dev-broker", "--topic", "t:1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spillway dev-broker starts");
    // It prints the bootstrap list once its brokers listen.
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the bootstrap line");
    assert!(line.contains("127.0.0.1:"), "{line}");
    let mut process = Process(child);
    let (status, took) = process.terminate();
    assert!(status.success(), "exited with {status} after {took:?}");
}
