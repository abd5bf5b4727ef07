//! Broker-fault chaos for the runtime's robustness test and soak (issue 15 item 7): a driver that
//! keeps breaking the dev broker (and the proxy in front of it) in the ways a production cluster
//! breaks — brokers restarting, leaders and coordinators moving, retriable errors, dropped
//! connections — while connectors drain, and a tally of what a file sink wrote.
//!
//! The same driver serves the short test in CI and the long soak in `bench/`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{DevBroker, KafkaProxy};

/// Kafka API keys the driver injects errors into.
pub mod api {
    pub const PRODUCE: i16 = 0;
    pub const FIND_COORDINATOR: i16 = 10;
    pub const SHARE_GROUP_HEARTBEAT: i16 = 76;
    pub const SHARE_FETCH: i16 = 78;
    pub const SHARE_ACKNOWLEDGE: i16 = 79;
}

/// Retriable error codes, per API, that a real broker answers during restarts and moves.
const RETRIABLE: &[(i16, &[i16])] = &[
    // NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS
    (api::PRODUCE, &[6, 19]),
    // COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS
    (api::FIND_COORDINATOR, &[15, 14]),
    // COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS
    (api::SHARE_GROUP_HEARTBEAT, &[15, 16, 14]),
    // SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH
    (api::SHARE_FETCH, &[122, 123]),
    (api::SHARE_ACKNOWLEDGE, &[122, 123]),
];

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// A broker goes down for a while and comes back.
    BrokerBounce,
    /// A partition's leader moves to another broker.
    LeaderMove,
    /// A group's coordinator moves to another broker.
    CoordinatorMove,
    /// The next requests of one API fail with retriable errors.
    RetriableErrors,
    /// Every client connection through the proxy is cut.
    ConnectionKill,
}

const KINDS: [FaultKind; 5] = [
    FaultKind::BrokerBounce,
    FaultKind::LeaderMove,
    FaultKind::CoordinatorMove,
    FaultKind::RetriableErrors,
    FaultKind::ConnectionKill,
];

/// What the chaos driver breaks.
pub struct ChaosTarget {
    pub broker: Arc<DevBroker>,
    /// Connections are cut through the proxy; without one that fault is skipped.
    pub proxy: Option<Arc<KafkaProxy>>,
    pub topic: String,
    pub partitions: i32,
    /// Groups whose coordinator moves.
    pub groups: Vec<String>,
    /// How long a bounced broker stays down.
    pub down_for: Duration,
}

/// A running chaos driver: one fault every `interval`, cycling through every kind so each is
/// hit, with brokers, partitions, groups and codes varied deterministically from a seed.
pub struct Chaos {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<String>>>,
    counts: Arc<Mutex<BTreeMap<FaultKind, u64>>>,
    thread: Option<JoinHandle<()>>,
}

impl Chaos {
    pub fn start(target: ChaosTarget, interval: Duration, seed: u64) -> Chaos {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let thread = {
            let (stop, log, counts) = (stop.clone(), log.clone(), counts.clone());
            std::thread::spawn(move || {
                let mut rng = seed.max(1);
                let mut round = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let kind = KINDS[round % KINDS.len()];
                    round += 1;
                    if let Some(what) = inject(&target, kind, &mut rng, &stop) {
                        *counts.lock().expect("counts").entry(kind).or_insert(0) += 1;
                        log.lock().expect("log").push(what);
                    }
                    sleep_unless_stopped(interval, &stop);
                }
                // Leave the cluster whole: every broker up, no error left queued.
                for id in 1..=target.broker.broker_count() as i32 {
                    target.broker.broker_up(id);
                }
                for (api_key, _) in RETRIABLE {
                    target.broker.clear_request_errors(*api_key);
                }
            })
        };
        Chaos {
            stop,
            log,
            counts,
            thread: Some(thread),
        }
    }

    /// Stops injecting, brings every broker back up and waits for the driver to finish.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("chaos driver panicked");
        }
    }

    /// What was done, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }

    /// How many faults of each kind were injected.
    pub fn counts(&self) -> BTreeMap<FaultKind, u64> {
        self.counts.lock().expect("counts").clone()
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        self.stop();
    }
}

fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) {
    let end = Instant::now() + total;
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
    }
}

/// xorshift64: deterministic variety without a dependency.
fn next(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

fn pick(rng: &mut u64, n: usize) -> usize {
    (next(rng) % n as u64) as usize
}

fn inject(
    target: &ChaosTarget,
    kind: FaultKind,
    rng: &mut u64,
    stop: &AtomicBool,
) -> Option<String> {
    let brokers = target.broker.broker_count() as usize;
    let broker = 1 + pick(rng, brokers) as i32;
    match kind {
        FaultKind::BrokerBounce => {
            target.broker.broker_down(broker);
            sleep_unless_stopped(target.down_for, stop);
            target.broker.broker_up(broker);
            Some(format!("broker {broker} down for {:?}", target.down_for))
        }
        FaultKind::LeaderMove => {
            let partition = pick(rng, target.partitions as usize) as i32;
            target
                .broker
                .set_partition_leader(&target.topic, partition, broker);
            Some(format!(
                "leader of {}-{partition} moved to broker {broker}",
                target.topic
            ))
        }
        FaultKind::CoordinatorMove => {
            let group = target.groups.get(pick(rng, target.groups.len().max(1)))?;
            target.broker.set_coordinator(group, broker);
            Some(format!("coordinator of {group} moved to broker {broker}"))
        }
        FaultKind::RetriableErrors => {
            let (api_key, codes) = RETRIABLE[pick(rng, RETRIABLE.len())];
            let errors: Vec<i16> = (0..1 + pick(rng, 3))
                .map(|_| codes[pick(rng, codes.len())])
                .collect();
            target.broker.push_request_errors(api_key, &errors);
            Some(format!("API {api_key}: next requests fail with {errors:?}"))
        }
        FaultKind::ConnectionKill => {
            let proxy = target.proxy.as_ref()?;
            let closed = proxy.faults().close_connections();
            Some(format!("{closed} client connections cut"))
        }
    }
}

/// What a file sink wrote, for records made by [`crate::numbered_records`] (each line starts
/// with `v<number>:`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileTally {
    pub lines: u64,
    /// Lines of each record number.
    pub seen: BTreeMap<u64, u64>,
    /// Lines that are not a numbered record.
    pub foreign: u64,
}

impl FileTally {
    /// Reads `path`; a missing file is an empty tally (the sink has not written yet).
    pub fn read(path: &Path) -> std::io::Result<FileTally> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut tally = FileTally::default();
        for line in text.lines() {
            tally.lines += 1;
            let number = line
                .strip_prefix('v')
                .and_then(|rest| rest.split(':').next())
                .and_then(|n| n.parse::<u64>().ok());
            match number {
                Some(n) => *tally.seen.entry(n).or_insert(0) += 1,
                None => tally.foreign += 1,
            }
        }
        Ok(tally)
    }

    pub fn distinct(&self) -> u64 {
        self.seen.len() as u64
    }

    /// Lines beyond the first of each record.
    pub fn duplicates(&self) -> u64 {
        self.seen.values().map(|n| n - 1).sum()
    }

    /// Record numbers below `expected` that never arrived.
    pub fn missing(&self, expected: u64) -> Vec<u64> {
        (0..expected)
            .filter(|n| !self.seen.contains_key(n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_distinct_records_duplicates_and_foreign_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.txt");
        std::fs::write(&path, "v0:...\nv1:..\nv1:..\nnoise\nv3:\n").expect("write");
        let tally = FileTally::read(&path).expect("read");
        assert_eq!(tally.lines, 5);
        assert_eq!(tally.distinct(), 3);
        assert_eq!(tally.duplicates(), 1);
        assert_eq!(tally.foreign, 1);
        assert_eq!(tally.missing(5), vec![2, 4]);
        let absent = FileTally::read(&dir.path().join("none.txt")).expect("absent is empty");
        assert_eq!(absent.lines, 0);
    }

    #[test]
    fn the_seeded_choices_cover_every_option() {
        let mut rng = 7;
        let mut hit = [false; 5];
        for _ in 0..200 {
            hit[pick(&mut rng, 5)] = true;
        }
        assert!(hit.iter().all(|h| *h), "{hit:?}");
    }
}
