//! Distributed mode's membership against the dev broker's classic group coordinator: several
//! workers' members in one process join one group with protocol type `connect`, the elected
//! leader assigns connectors and tasks, a member that dies (stops heartbeating) has its work
//! held for `scheduled.rebalance.max.delay.ms` and then moved, and a member that joins takes a
//! share without the others stopping the rest.
//!
//! The dev broker (librdkafka's mock) makes every rebalance of a running group wait about the
//! session timeout minus one second before it elects a leader (Kafka waits only until every
//! member rejoined), so rebalances here take seconds; nothing below depends on that wait.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_kafka::cluster::Cluster;
use spillway_kafka::worker_group::{
    Allocation, MemberEvent, TaskId, WorkerGroupConfig, WorkerGroupMember, WorkerHost,
};
use spillway_tests::DevBroker;

const DELAY: Duration = Duration::from_secs(4);
const PATIENCE: Duration = Duration::from_secs(60);

/// A worker whose config topic holds `connectors` connectors of 3 tasks each.
struct FixedHost {
    url: String,
    work: Allocation,
}

impl WorkerHost for FixedHost {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn config_offset(&self) -> i64 {
        7
    }
    fn max_tasks(&self) -> Option<u64> {
        None
    }
    fn configured_work(&self, at_least: i64) -> Option<(i64, Allocation)> {
        (at_least <= 7).then(|| (7, self.work.clone()))
    }
}

fn work(connectors: usize) -> Allocation {
    let mut a = Allocation::default();
    for c in 0..connectors {
        for t in 0..3 {
            a.tasks.insert(TaskId::new(format!("c{c}"), t));
        }
        a.connectors.insert(format!("c{c}"));
    }
    a
}

/// What one member's worker saw.
#[derive(Default, Debug)]
struct Seen {
    running: Allocation,
    leader: bool,
    /// Every assignment: (revoked count, delay ms, when it arrived).
    assignments: Vec<(usize, u64, Instant)>,
    /// Whether it ever had to stop work it was running.
    revoked_anything: bool,
    failed: Option<String>,
}

struct TestMember {
    member: Option<WorkerGroupMember>,
    seen: Arc<Mutex<Seen>>,
}

/// Logs go to the test's output (RUST_LOG picks the level).
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

async fn start_member(bootstrap: &str, name: &str, group: &str, connectors: usize) -> TestMember {
    logs();
    let cluster = Cluster::connect(bootstrap, name, Duration::from_secs(10))
        .await
        .expect("cluster");
    let mut config = WorkerGroupConfig::new(group);
    config.session_timeout = Duration::from_secs(4);
    config.heartbeat_interval = Duration::from_millis(500);
    config.rebalance_timeout = Duration::from_secs(20);
    config.scheduled_rebalance_max_delay = DELAY;
    let host = Arc::new(FixedHost {
        url: format!("http://{name}:8083"),
        work: work(connectors),
    });
    let (member, mut events) = WorkerGroupMember::start(cluster, config, host);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let mut s = out.lock().unwrap();
            match event {
                MemberEvent::Assigned {
                    assignment,
                    running,
                    leader,
                    applied,
                    ..
                } => {
                    s.revoked_anything |= !assignment.revoked.is_empty();
                    s.assignments.push((
                        assignment.revoked.len(),
                        assignment.delay_ms,
                        Instant::now(),
                    ));
                    s.running = running;
                    s.leader = leader;
                    let _ = applied.send(());
                }
                MemberEvent::Lost { .. } => s.running = Allocation::default(),
                MemberEvent::Failed(e) => s.failed = Some(e.to_string()),
            }
        }
    });
    TestMember {
        member: Some(member),
        seen,
    }
}

impl TestMember {
    fn running(&self) -> Allocation {
        let s = self.seen.lock().unwrap();
        assert!(s.failed.is_none(), "member failed: {:?}", s.failed);
        s.running.clone()
    }
    fn is_leader(&self) -> bool {
        self.seen.lock().unwrap().leader
    }
}

/// Waits until `check` holds for the members' running work, or fails with what they run.
async fn wait_for(
    members: &BTreeMap<&str, &TestMember>,
    what: &str,
    check: impl Fn(&BTreeMap<&str, Allocation>) -> bool,
) {
    let started = Instant::now();
    loop {
        let running: BTreeMap<&str, Allocation> =
            members.iter().map(|(n, m)| (*n, m.running())).collect();
        if check(&running) {
            return;
        }
        if started.elapsed() > PATIENCE {
            panic!("{what}: not within {PATIENCE:?}; members run {running:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each task runs exactly once across `running`, and together they run all of `expected`.
fn covers_once(running: &BTreeMap<&str, Allocation>, expected: &Allocation) -> bool {
    let mut all = Allocation::default();
    let mut count = 0;
    for a in running.values() {
        all.add_all(a);
        count += a.len();
    }
    all == *expected && count == expected.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_share_tasks_hold_a_dead_workers_work_for_the_delay_and_admit_a_newcomer() {
    let broker = DevBroker::start(1);
    let bootstrap = broker.bootstrap();
    let group = "spillway-workers";
    let expected = work(2);

    let a = start_member(&bootstrap, "a", group, 2).await;
    let b = start_member(&bootstrap, "b", group, 2).await;
    let c = start_member(&bootstrap, "c", group, 2).await;
    let all = BTreeMap::from([("a", &a), ("b", &b), ("c", &c)]);
    wait_for(&all, "three workers run two tasks each", |r| {
        covers_once(r, &expected) && r.values().all(|x| x.tasks.len() == 2)
    })
    .await;
    let leaders: Vec<&str> = all
        .iter()
        .filter(|(_, m)| m.is_leader())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(leaders.len(), 1, "one leader: {leaders:?}");

    // A worker other than the leader dies: it stops heartbeating without leaving.
    let leader = leaders[0].to_owned();
    drop(all);
    let mut live = vec![("a", a), ("b", b), ("c", c)];
    let victim = live
        .iter()
        .position(|(n, _)| *n != leader)
        .expect("a non-leader");
    let (_, mut dead) = live.remove(victim);
    let before: BTreeMap<&str, Allocation> = live.iter().map(|(n, m)| (*n, m.running())).collect();
    let dead_work = dead.running();
    let died_at = Instant::now();
    dead.member.take().unwrap().abandon();

    let live_view: BTreeMap<&str, &TestMember> = live.iter().map(|(n, m)| (*n, m)).collect();
    wait_for(
        &live_view,
        "the dead worker's tasks run on the survivors",
        |r| covers_once(r, &expected),
    )
    .await;
    let moved_at = Instant::now();
    for (name, member) in &live {
        let s = member.seen.lock().unwrap();
        assert!(
            !s.revoked_anything,
            "{name} had to stop work: {:?}",
            s.assignments
        );
        let held_since = s
            .assignments
            .iter()
            .find(|(_, delay, at)| *delay > 0 && *at > died_at)
            .map(|(_, _, at)| *at)
            .unwrap_or_else(|| {
                panic!(
                    "{name} was never told that work is held: {:?}",
                    s.assignments
                )
            });
        // The leader decided to hold just before this member heard of it; the margin covers
        // that SyncGroup round trip.
        let held_for = moved_at.duration_since(held_since);
        assert!(
            held_for + Duration::from_millis(500) >= DELAY,
            "the dead worker's work ({dead_work:?}) moved {held_for:?} after it was held, before the delay of {DELAY:?}"
        );
        assert!(s.running.tasks.is_superset(&before[name].tasks));
    }
    drop(dead);

    // A newcomer joins: it gets a share, the others only give up what they must.
    let before: BTreeMap<&str, Allocation> = live.iter().map(|(n, m)| (*n, m.running())).collect();
    let d = start_member(&bootstrap, "d", group, 2).await;
    let mut with_d: BTreeMap<&str, &TestMember> = live.iter().map(|(n, m)| (*n, m)).collect();
    with_d.insert("d", &d);
    wait_for(&with_d, "the newcomer takes two tasks", |r| {
        covers_once(r, &expected) && r.values().all(|x| x.tasks.len() == 2)
    })
    .await;
    for (name, member) in &live {
        let now = member.running();
        assert!(
            before[name].tasks.is_superset(&now.tasks),
            "{name} was given work back and forth"
        );
        assert_eq!(now.tasks.len(), 2, "{name} kept a share");
    }

    // Leaving (LeaveGroup) starts the rebalance at once; the held work still waits the delay.
    let left_work = d.running();
    d.member.unwrap().leave().await;
    let live_view: BTreeMap<&str, &TestMember> = live.iter().map(|(n, m)| (*n, m)).collect();
    wait_for(&live_view, "the departed worker's tasks move back", |r| {
        covers_once(r, &expected)
    })
    .await;
    assert!(!left_work.is_empty());
    for (_, m) in live {
        m.member.unwrap().leave().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_stops_the_member_naming_the_error_and_the_fix() {
    logs();
    let broker = DevBroker::start(1);
    let bootstrap = broker.bootstrap();
    let cluster = Cluster::connect(&bootstrap, "refused", Duration::from_secs(10))
        .await
        .unwrap();
    let mut config = WorkerGroupConfig::new("refused-workers");
    config.session_timeout = Duration::from_secs(4);
    config.heartbeat_interval = Duration::from_millis(300);
    let host = Arc::new(FixedHost {
        url: "http://refused:8083".into(),
        work: work(1),
    });
    let (member, mut events) = WorkerGroupMember::start(cluster, config, host);
    let next = |events: &mut tokio::sync::mpsc::UnboundedReceiver<MemberEvent>| {
        let event = events.try_recv();
        event.ok()
    };
    let started = Instant::now();
    loop {
        if let Some(MemberEvent::Assigned { applied, .. }) = next(&mut events) {
            let _ = applied.send(());
            break;
        }
        assert!(started.elapsed() < PATIENCE, "no assignment");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The principal loses its ACL on the group: the next heartbeat is refused (injected: the
    // dev broker has no ACLs). Retrying cannot help, so the member stops and says what to do.
    const HEARTBEAT: i16 = 12;
    const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    broker.push_request_errors(HEARTBEAT, &[GROUP_AUTHORIZATION_FAILED]);
    let event = tokio::time::timeout(PATIENCE, events.recv())
        .await
        .expect("an answer")
        .expect("an event");
    match event {
        MemberEvent::Failed(e) => {
            let text = e.to_string();
            assert!(
                text.contains("GroupAuthorizationFailed")
                    && text.contains("refused-workers")
                    && text.contains("grant the worker's principal READ on the group"),
                "{text}"
            );
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    member.abandon();
}
