//! Exactly-once under crashes: `spillway standalone` replicates 200,000 records with the kafka
//! sink under `delivery.guarantee=exactly_once` while it is killed with SIGKILL at random
//! moments, five times, and restarted; once in share mode (ledger) and once in classic mode
//! (offsets and checkpoints in the transaction). A read_committed share group then finds every
//! source record in the output exactly once (by the source-coordinate headers), and nothing
//! else.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use rand::Rng;
use spillway_tests::{produce, DevBroker, TestRecord};
use support::eos::{assert_exactly_once, read_output, Source};

/// `SPILLWAY_EOS_CRASH_RECORDS` overrides it (the debug build replicates ~1,000 records/s on
/// two shared cores, the release build ~7,000).
const RECORDS: i64 = 200_000;
/// 20,000 records per partition: source, output (with the three source headers) and ledger
/// stay well under the dev broker's 5 MiB per partition.
const PARTITIONS: i32 = 10;
const KILLS: usize = 5;

/// `spillway standalone` on the given files; SIGKILLed when dropped.
struct Standalone(Child);

impl Standalone {
    fn start(worker: &Path, connector: &Path) -> Standalone {
        Standalone(
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

    fn kill_9(mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn share_mode_replicates_exactly_once_through_repeated_kill_9() {
    replicate_through_kills("consumer.override.group.protocol=share\n", 1500..5000).await;
}

/// Classic mode on the dev broker, which keeps no transactional offsets: every restart's
/// consumer starts at the beginning again, and the checkpoints in the ledger are what it
/// resumes from. Kills come later than in share mode: a new member first waits for the group
/// to drop the killed process's members (their session timeout) and rebalance.
#[tokio::test(flavor = "multi_thread")]
async fn classic_mode_replicates_exactly_once_through_repeated_kill_9() {
    replicate_through_kills(
        "consumer.override.session.timeout.ms=6000\nconsumer.override.heartbeat.interval.ms=1000\n",
        5000..12000,
    )
    .await;
}

/// Replicates the source through [`KILLS`] SIGKILLs at random moments (`kill_after_ms` after
/// each start) and checks the output; `mode` adds connector properties.
async fn replicate_through_kills(mode: &str, kill_after_ms: std::ops::Range<u64>) {
    let started = Instant::now();
    let broker = DevBroker::start(1);
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_record_lock_duration(30_000);
    broker.set_share_heartbeat_interval(300);
    broker.set_share_session_timeout(3000);
    broker.set_share_isolation_level(true);
    // A restarted task first acquires the same lowest offsets again, so the records in flight at
    // one kill are often in flight at the next: with Kafka's default limit of 5 deliveries, 5
    // kills could archive them (a broker policy, not a replication fault). Allow far more.
    broker.set_share_max_delivery_attempts(KILLS as i32 * 4);
    for topic in ["src", "out.src", "ledger"] {
        broker.create_topic(topic, PARTITIONS);
    }
    let total: i64 = std::env::var("SPILLWAY_EOS_CRASH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RECORDS);
    let records: Vec<TestRecord> = (0..total)
        .map(|i| TestRecord {
            partition: Some((i % PARTITIONS as i64) as i32),
            key: Some(format!("{i}").into_bytes()),
            value: Some(format!("v{i}").into_bytes()),
            ..TestRecord::default()
        })
        .collect();
    let produced = produce(&broker.bootstrap(), "src", records, "none").await;
    let expected: BTreeSet<Source> = produced
        .iter()
        .map(|p| (p.topic.clone(), p.partition, p.offset))
        .collect();

    let dir = tempfile::tempdir().expect("tempdir");
    let worker = dir.path().join("worker.properties");
    std::fs::write(
        &worker,
        format!(
            "bootstrap.servers={}\ntask.restart.backoff.ms=200\ntask.poll.timeout.ms=100\nrest.port=0\n",
            broker.bootstrap()
        ),
    )
    .expect("worker properties");
    let connector = dir.path().join("mirror.properties");
    std::fs::write(
        &connector,
        format!(
            "name=mirror\nconnector.class=kafka\ntopics=src\ntasks.max=2\n{mode}\
             topic.rename.format=out.${{topic}}\n\
             delivery.guarantee=exactly_once\ndelivery.ledger.topic=ledger\n\
             delivery.ledger.cache.dir={}\n",
            dir.path().join("ledger-cache").display()
        ),
    )
    .expect("connector properties");

    let mut rng = rand::thread_rng();
    for _ in 0..KILLS {
        let process = Standalone::start(&worker, &connector);
        tokio::time::sleep(Duration::from_millis(rng.gen_range(kill_after_ms.clone()))).await;
        process.kill_9();
    }
    let last = Standalone::start(&worker, &connector);
    // Generous: most of the data is replicated by this last run, at debug-build speed.
    let found = read_output(
        &broker.bootstrap(),
        "out.src",
        expected.len(),
        Duration::from_secs(480),
    )
    .await;
    drop(last);

    let mode = if mode.contains("group.protocol=share") {
        "share"
    } else {
        "classic"
    };
    assert_exactly_once(
        &format!("{mode}, {KILLS} kills, {:?}", started.elapsed()),
        &expected,
        &found,
    );
}
