//! CPU time of each thread of another process, from `/proc/PID/task/*/stat`, to tell when the
//! dev broker rather than a client sets a rate.
//!
//! The dev broker serves every broker of a cluster from one thread (`rdk:mock`, inside the
//! launcher's Python process). Its share path costs, per fetch, a walk of the partition's whole
//! unread log times the records acquired (librdkafka `rdkafka_mock_handlers.c`,
//! `rd_kafka_mock_sgrp_write_acquired_records`), so on a backlog that thread is busy all the
//! time and the drain goes at its pace whichever client asks. A rate ratio measured while it
//! was saturated compares the broker with itself.

use std::collections::BTreeMap;
use std::path::Path;

use crate::c_reference::{max, median, min};

/// Each thread's name and CPU time (user + system) in seconds at one moment, by thread id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadCpu(BTreeMap<u32, (String, f64)>);

impl ThreadCpu {
    /// The threads of process `pid` now. Threads that end while they are read are left out.
    pub fn read(pid: u32) -> std::io::Result<ThreadCpu> {
        Self::read_dir(&Path::new("/proc").join(pid.to_string()).join("task"))
    }

    fn read_dir(tasks: &Path) -> std::io::Result<ThreadCpu> {
        let ticks = clock_ticks_per_second();
        let mut threads = BTreeMap::new();
        for entry in std::fs::read_dir(tasks)? {
            let entry = entry?;
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((name, cpu_ticks)) = parse_stat(&stat) {
                threads.insert(tid, (name, cpu_ticks as f64 / ticks));
            }
        }
        Ok(ThreadCpu(threads))
    }

    /// The thread that spent the most CPU time between `earlier` and this reading: its name
    /// and seconds. A thread born in between counts from zero. `None` without threads.
    pub fn busiest_since(&self, earlier: &ThreadCpu) -> Option<(String, f64)> {
        self.0
            .iter()
            .map(|(tid, (name, now))| {
                let before = earlier.0.get(tid).map_or(0.0, |(_, s)| *s);
                (name.clone(), (now - before).max(0.0))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// The name and utime + stime (clock ticks) of a `/proc/.../stat` line. The name sits in
/// parentheses and may itself hold spaces and parentheses, so the fields are counted from
/// the last `)`.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    // After the name: state (field 3), ..., utime (14), stime (15).
    let mut fields = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((name, utime + stime))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// How often [`while_sampling`] reads the threads.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// What [`while_sampling`] saw of a process's busiest thread. `None`s when the process
/// could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sampled {
    /// Its share of a core while it worked ([`busy_share`]).
    pub busy_share: Option<f64>,
    /// The CPU seconds of the thread that spent the most over the whole run.
    pub busiest_cpu_seconds: Option<f64>,
}

/// Runs `work` while reading the threads of process `pid` every [`SAMPLE_EVERY`]; returns its
/// output and what the busiest thread did meanwhile.
pub async fn while_sampling<F: std::future::Future>(pid: u32, work: F) -> (F::Output, Sampled) {
    let mut shares = Vec::new();
    let first = ThreadCpu::read(pid).ok();
    let mut last = first.clone().map(|t| (t, std::time::Instant::now()));
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    tokio::pin!(work);
    let output = loop {
        tokio::select! {
            output = &mut work => break output,
            _ = ticks.tick() => {
                let Some((before, at)) = &last else { continue };
                let Ok(now) = ThreadCpu::read(pid) else { continue };
                let wall = at.elapsed().as_secs_f64();
                if let Some((_, seconds)) = now.busiest_since(before) {
                    if wall > 0.0 {
                        shares.push(seconds / wall);
                    }
                }
                last = Some((now, std::time::Instant::now()));
            }
        }
    };
    let end = ThreadCpu::read(pid).ok();
    let busiest_cpu_seconds = first
        .zip(end)
        .and_then(|(first, end)| end.busiest_since(&first))
        .map(|(_, seconds)| seconds);
    let sampled = Sampled {
        busy_share: busy_share(&shares),
        busiest_cpu_seconds,
    };
    (output, sampled)
}

/// A thread counts as working in an interval where it used more than this share of a core.
pub const WORKING: f64 = 0.5;

/// The mean of `shares` (a thread's share of a core, interval by interval) from the first to
/// the last interval in which it was [`WORKING`]: how busy it was while it worked, without the
/// idle start and end of a run (a client joining its group, the harness reading results).
/// The highest share when it never worked that hard; `None` without intervals.
pub fn busy_share(shares: &[f64]) -> Option<f64> {
    let first = shares.iter().position(|s| *s > WORKING);
    let last = shares.iter().rposition(|s| *s > WORKING);
    match (first, last) {
        (Some(first), Some(last)) => {
            let working = &shares[first..=last];
            Some(working.iter().sum::<f64>() / working.len() as f64)
        }
        _ => shares.iter().copied().max_by(f64::total_cmp),
    }
}

/// A thread busier than this share of a core while it worked was the drain's ceiling (idle
/// less than a twentieth of the time).
pub const SATURATED: f64 = 0.95;

/// What the dev broker's busiest thread did, round by round, for one contender.
#[derive(Debug, Default)]
pub struct BrokerWork {
    /// Share of a core while it worked.
    pub busy: Vec<f64>,
    /// Its CPU time per record drained, in microseconds.
    pub us_per_record: Vec<f64>,
}

impl BrokerWork {
    /// Adds one drain of `records` records.
    pub fn add(&mut self, sampled: Sampled, records: u64) {
        self.busy.extend(sampled.busy_share);
        self.us_per_record.extend(
            sampled
                .busiest_cpu_seconds
                .map(|s| s * 1e6 / records.max(1) as f64),
        );
    }

    /// "busy median (min-max), median (min-max) us CPU/record", or "not read".
    pub fn line(&self) -> String {
        if self.busy.is_empty() || self.us_per_record.is_empty() {
            return "not read".into();
        }
        let (busy_lo, busy_hi) = (min(&self.busy), max(&self.busy));
        let (us_lo, us_hi) = (min(&self.us_per_record), max(&self.us_per_record));
        format!(
            "busy {:.2} ({busy_lo:.2}-{busy_hi:.2}), {:.1} us CPU/record ({us_lo:.1}-{us_hi:.1})",
            median(&self.busy),
            median(&self.us_per_record)
        )
    }

    /// Said after a missed rate goal when this contender saturated the dev broker's thread
    /// (median busy share over [`SATURATED`]): then no faster client could have drained
    /// faster, and the rate ratio is the ratio of the broker's work per record for the two
    /// contenders, which this names. Empty otherwise.
    pub fn ceiling_against(&self, reference: &BrokerWork) -> String {
        if self.busy.is_empty() || self.us_per_record.is_empty() {
            return String::new();
        }
        let busy = median(&self.busy);
        if busy < SATURATED {
            return String::new();
        }
        let against = if reference.us_per_record.is_empty() {
            String::new()
        } else {
            format!(
                " against {:.1} us for the reference (busy {:.2})",
                median(&reference.us_per_record),
                median(&reference.busy)
            )
        };
        format!(
            "; the dev broker's thread was saturated (busy {busy:.2} of a core) and spent {:.1} us per record{against}: the rate is the broker's work per record, not the client's speed",
            median(&self.us_per_record)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_stat_line_gives_the_name_and_user_plus_system_ticks_even_when_the_name_has_parentheses() {
        let line =
            "4242 (rdk:mock (a) b) R 1 2 3 0 -1 4194368 100 0 0 0 731 269 0 0 20 0 9 0 5 6 7";
        assert_eq!(parse_stat(line), Some(("rdk:mock (a) b".into(), 1000)));
        assert_eq!(parse_stat("4242 (cut short) R 1 2"), None);
        assert_eq!(parse_stat("no name at all"), None);
    }

    #[test]
    fn the_busiest_thread_is_the_one_whose_time_grew_most_and_a_new_thread_counts_from_zero() {
        let reading = |threads: &[(u32, &str, f64)]| {
            ThreadCpu(
                threads
                    .iter()
                    .map(|(tid, name, s)| (*tid, (name.to_string(), *s)))
                    .collect(),
            )
        };
        let before = reading(&[(1, "python", 5.0), (2, "rdk:mock", 1.0)]);
        let after = reading(&[(1, "python", 5.5), (2, "rdk:mock", 3.0), (3, "late", 1.2)]);
        assert_eq!(after.busiest_since(&before), Some(("rdk:mock".into(), 2.0)));
        let born_busy = reading(&[(1, "python", 5.5), (3, "late", 2.5)]);
        assert_eq!(born_busy.busiest_since(&before), Some(("late".into(), 2.5)));
        assert_eq!(ThreadCpu::default().busiest_since(&before), None);
    }

    #[test]
    fn broker_work_is_reported_per_record_and_named_as_the_ceiling_only_when_saturated() {
        let sampled = |busy, seconds| Sampled {
            busy_share: Some(busy),
            busiest_cpu_seconds: Some(seconds),
        };
        let mut ours = BrokerWork::default();
        ours.add(sampled(0.99, 10.0), 200_000);
        ours.add(sampled(0.98, 11.0), 200_000);
        ours.add(sampled(0.99, 10.4), 200_000);
        let mut reference = BrokerWork::default();
        reference.add(sampled(0.92, 8.4), 200_000);
        assert_eq!(
            ours.line(),
            "busy 0.99 (0.98-0.99), 52.0 us CPU/record (50.0-55.0)"
        );
        let said = ours.ceiling_against(&reference);
        assert!(said.contains("busy 0.99 of a core"), "{said}");
        assert!(
            said.contains("52.0 us per record against 42.0 us for the reference (busy 0.92)"),
            "{said}"
        );
        // The reference was not saturated: nothing to say from its side.
        assert_eq!(reference.ceiling_against(&ours), "");
        // Unread samples say nothing and print as such.
        let mut unread = BrokerWork::default();
        unread.add(Sampled::default(), 200_000);
        assert_eq!(unread.line(), "not read");
        assert_eq!(unread.ceiling_against(&reference), "");
    }

    #[test]
    fn the_busy_share_leaves_out_the_idle_start_and_end_of_a_run() {
        let share = busy_share(&[0.0, 0.1, 0.9, 1.0, 0.4, 0.9, 0.2, 0.0]).expect("a share");
        assert!((share - 0.8).abs() < 1e-9, "{share}");
        assert_eq!(busy_share(&[0.9]), Some(0.9));
        assert_eq!(busy_share(&[0.1, 0.3, 0.2]), Some(0.3));
        assert_eq!(busy_share(&[]), None);
    }

    /// Against this very process (one test, so that no other spins beside it): a thread kept
    /// busy is the busiest between two readings, and sampling while it spins gives its share
    /// of a core. Read while it still runs: a finished thread leaves /proc/PID/task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spinning_thread_of_this_process_is_found_and_its_share_of_a_core_sampled() {
        let pid = std::process::id();
        let before = ThreadCpu::read(pid).expect("this process's threads");
        let spinner = std::thread::Builder::new()
            .name("spin-probe".into())
            .spawn(|| {
                let until = Instant::now() + Duration::from_millis(1_500);
                let mut n = 0u64;
                while Instant::now() < until {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
                n
            })
            .expect("a thread");
        let (slept, sampled) =
            while_sampling(pid, tokio::time::sleep(Duration::from_millis(1_000))).await;
        assert_eq!(slept, ());
        let after = ThreadCpu::read(pid).expect("this process's threads");
        tokio::task::spawn_blocking(move || spinner.join().expect("the spinner"))
            .await
            .expect("joined");
        let (name, seconds) = after.busiest_since(&before).expect("a busiest thread");
        assert_eq!(name, "spin-probe");
        assert!(seconds >= 0.1, "the spinner used {seconds} s");
        let share = sampled
            .busy_share
            .expect("this process's threads were read");
        // Most of a core, never much more. Loose below, for a loaded CI machine: a unit slip
        // (ticks taken for seconds) would read a hundred times off.
        assert!((0.15..=1.2).contains(&share), "share of a core: {share}");
        let cpu = sampled.busiest_cpu_seconds.expect("read at both ends");
        assert!(
            (0.15..=1.2).contains(&cpu),
            "CPU seconds over the 1 s run: {cpu}"
        );
    }
}
