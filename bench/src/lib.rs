//! Helpers shared by the benchmarks in `src/bin/`: process measurements (peak RSS, CPU time)
//! and the report format. Every benchmark prints ratios against a reference measured in the
//! same run on the same dev broker, never absolute pass/fail thresholds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use spillway_actors::Worker;
use spillway_tests::DevBroker;

pub mod c_reference;
pub mod thread_cpu;

/// Runs this benchmark binary again with `args` (a child role), with its stderr shown, and
/// reads the JSON summary it prints on stdout. Children measure their own peak RSS and CPU.
pub async fn run_child<T: serde::de::DeserializeOwned>(args: &[String]) -> Result<T> {
    // `output()` would capture stderr too (tokio pipes both whatever was set), hiding the
    // child's progress and errors: spawn with stdout piped only.
    let child = child_command(args)?.spawn()?;
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!("child process {:?} failed: {}", args.first(), output.status);
    }
    last_json_line(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("reading the summary of child process {:?}", args.first()))
}

/// The last line of a child's stdout that reads as a `T`: its summary, which a wrapper tool
/// ([`CHILD_WRAPPER_ENV`]) may follow with lines of its own.
pub fn last_json_line<T: serde::de::DeserializeOwned>(stdout: &str) -> Result<T> {
    stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line.trim()).ok())
        .context("no summary line (JSON) in the child's output")
}

/// This benchmark binary run again with `args`, stdout piped (the child's summary) and stderr
/// shown. `SPILLWAY_BENCH_CHILD_WRAPPER` (e.g. `heaptrack -o /tmp/child`) runs the child
/// under that command, to profile what a child measures; the figures then include the tool's
/// own cost.
pub fn child_command(args: &[String]) -> Result<tokio::process::Command> {
    let exe = std::env::current_exe()?;
    let wrapper = std::env::var(CHILD_WRAPPER_ENV).unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(tool) => {
            let mut command = tokio::process::Command::new(tool);
            command.args(words).arg(exe);
            command
        }
        None => tokio::process::Command::new(exe),
    };
    command
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    Ok(command)
}

/// See [`child_command`].
pub const CHILD_WRAPPER_ENV: &str = "SPILLWAY_BENCH_CHILD_WRAPPER";

/// Peak resident set size of this process in bytes (VmHWM), from /proc.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("self", "VmHWM:").map(|kib| kib * 1024)
}

/// Peak resident set size of process `pid` in bytes (VmHWM), from /proc.
pub fn peak_rss_bytes_of(pid: u32) -> Option<u64> {
    proc_status_kib(&pid.to_string(), "VmHWM:").map(|kib| kib * 1024)
}

/// Resident set size of this process now in bytes (VmRSS), from /proc.
pub fn rss_bytes() -> Option<u64> {
    proc_status_kib("self", "VmRSS:").map(|kib| kib * 1024)
}

fn proc_status_kib(process: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time (user + system) this process has used so far, all its threads (ended ones
/// included), in microseconds as `getrusage` counts it: what the C reference reports of
/// itself, so both contenders are read alike. `/proc`'s figure comes in 10 ms ticks, a few
/// percent of a run's CPU.
pub fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid rusage for getrusage to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return proc_cpu_time("self");
    }
    // SAFETY: filled by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

fn proc_cpu_time(process: &str) -> Duration {
    // /proc/<pid>/stat fields 14 and 15 are utime and stime in clock ticks.
    let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // The kernel's USER_HZ is 100 on every Linux ABI we run on.
    Duration::from_millis(ticks * 10)
}

/// A megabyte figure for reports.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub use spillway_core::config::config_map as config;

/// The most a dev-broker partition keeps: librdkafka's mock cluster deletes a partition's
/// oldest batches beyond 5 MiB (or 100,000 batches) (`rdkafka_mock.c`,
/// `rd_kafka_mock_partition_new`), so records produced past that are gone before a drain.
pub const DEV_BROKER_PARTITION_BYTES: u64 = 5 * 1024 * 1024;

/// What a produced record takes in a dev-broker partition beyond its value: key, record and
/// batch overhead. Measured: 600,000 records of 100 B over 8 partitions left 40,710 in each
/// (about 129 B a record); rounded up so that a run this passes fits.
pub const STORED_RECORD_OVERHEAD: u64 = 32;

/// Refuses a run whose records would not all stay on the dev broker: `records` of
/// `value_bytes` spread evenly over `partitions`. The error says how many fit.
pub fn fits_dev_broker(records: u64, partitions: i32, value_bytes: usize) -> Result<()> {
    let partitions = partitions.max(1) as u64;
    let stored = value_bytes as u64 + STORED_RECORD_OVERHEAD;
    let per_partition = records.div_ceil(partitions);
    if per_partition * stored <= DEV_BROKER_PARTITION_BYTES {
        return Ok(());
    }
    let most = partitions * (DEV_BROKER_PARTITION_BYTES / stored);
    bail!(
        "{records} records of {value_bytes} B over {partitions} partitions put about {:.1} MiB in \
         each partition, and the dev broker keeps at most {:.0} MiB a partition, deleting the \
         oldest records (librdkafka rdkafka_mock.c): ask for at most {most} records, or more \
         partitions",
        mib(per_partition * stored),
        mib(DEV_BROKER_PARTITION_BYTES)
    )
}

/// Starts a dev cluster with `topic` for a share benchmark; `preload` is the `malloc` the dev
/// broker runs with (see [`BrokerAllocator`]), glibc's when `None`.
pub fn start_broker(
    brokers: u32,
    topic: &str,
    partitions: i32,
    preload: Option<&Path>,
) -> Result<DevBroker> {
    let broker = DevBroker::try_start_preloaded(brokers, &[(topic, partitions)], preload)?;
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    Ok(broker)
}

/// The `malloc` the dev broker (librdkafka's mock, inside the launcher's Python) runs with.
///
/// The mock keeps one 48-byte lock state per acquired offset in a linked list, and walks those
/// lists for every record it hands out: its CPU per record, the share benchmarks' ceiling, is
/// mostly the time per list node. Under glibc's `malloc` the states share their bins with the
/// mock's other small allocations, so how densely they sit depends on the order of the clients'
/// requests and moves from drain to drain (bench/README.md, "The mock's allocator, traced").
/// jemalloc keeps each size class in slabs of its own, which puts the states side by side for
/// every client, so that a rate comparison measures the clients rather than the mock's heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BrokerAllocator {
    /// glibc's own `malloc`.
    Glibc,
    /// `libjemalloc.so.2`, preloaded into the launcher alone.
    Jemalloc,
}

impl BrokerAllocator {
    /// The library to preload into the dev broker for this allocator; `None` for glibc's. An
    /// error names the package to install when jemalloc is asked for and missing.
    pub fn preload(self) -> Result<Option<PathBuf>> {
        match self {
            BrokerAllocator::Glibc => Ok(None),
            BrokerAllocator::Jemalloc => {
                let listed = std::process::Command::new("ldconfig")
                    .arg("-p")
                    .output()
                    .or_else(|_| {
                        std::process::Command::new("/sbin/ldconfig")
                            .arg("-p")
                            .output()
                    })
                    .context("running `ldconfig -p` to find libjemalloc.so.2")?;
                let listed = String::from_utf8_lossy(&listed.stdout);
                match library_path(&listed, JEMALLOC_LIBRARY) {
                    Some(path) => Ok(Some(path)),
                    None => bail!(
                        "the dev broker's allocator `jemalloc` needs {JEMALLOC_LIBRARY}, which \
                         `ldconfig -p` does not list: install it (Debian/Ubuntu: apt-get install \
                         libjemalloc2), or pass --broker-allocator glibc to measure on glibc's \
                         malloc, whose heap layout moves the dev broker's cost from drain to drain"
                    ),
                }
            }
        }
    }

    /// How a report names this allocator, with the library's path when given.
    pub fn describe(self, preload: Option<&Path>) -> String {
        match (self, preload) {
            (BrokerAllocator::Glibc, _) => "glibc".to_string(),
            (BrokerAllocator::Jemalloc, None) => "jemalloc".to_string(),
            (BrokerAllocator::Jemalloc, Some(path)) => format!("jemalloc ({})", path.display()),
        }
    }
}

/// jemalloc's shared library, as Debian's `libjemalloc2` installs it.
pub const JEMALLOC_LIBRARY: &str = "libjemalloc.so.2";

/// The path `ldconfig -p` lists for `library` built for this machine's architecture.
fn library_path(listed: &str, library: &str) -> Option<PathBuf> {
    // ldconfig's name for the architecture, as in "libc.so.6 (libc6,x86-64) => /lib/...".
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x86-64",
        "aarch64" => "AArch64",
        other => other,
    };
    listed.lines().find_map(|line| {
        let (name, path) = line.trim().split_once(" => ")?;
        let (file, flags) = name.split_once(' ')?;
        (file == library && flags.contains(arch)).then(|| PathBuf::from(path.trim()))
    })
}

/// API keys of the share requests the benchmarks count on the dev broker.
pub const SHARE_FETCH: i16 = 78;
pub const SHARE_ACKNOWLEDGE: i16 = 79;

/// Requests of one API key per 1,000 records, from the dev broker's request counts.
pub fn requests_per_thousand(
    counts: &std::collections::BTreeMap<i16, u64>,
    api_key: i16,
    records: u64,
) -> f64 {
    counts.get(&api_key).copied().unwrap_or(0) as f64 * 1000.0 / records.max(1) as f64
}

/// "ShareFetch x, ShareAcknowledge y" per 1,000 records.
pub fn share_requests(counts: &std::collections::BTreeMap<i16, u64>, records: u64) -> String {
    format!(
        "ShareFetch {:.2}, ShareAcknowledge {:.2} per 1,000 records",
        requests_per_thousand(counts, SHARE_FETCH, records),
        requests_per_thousand(counts, SHARE_ACKNOWLEDGE, records)
    )
}

/// A steady-state window of one connector's acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub records: u64,
    pub seconds: f64,
    /// Every record was acknowledged between two samples, so the window is the gap between
    /// them and [`Window::rate`] is a lower bound.
    pub between_samples: bool,
    /// The process's CPU time ([`cpu_time`]) at the last sample that showed no record
    /// acknowledged: what it had spent before its records came (starting, joining), to within
    /// one sample's gap of idling. Set by [`measure`].
    pub cpu_before_records: Option<Duration>,
}

impl Window {
    pub fn rate(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

/// Follows a connector's acknowledged count, sample by sample, to the window it was measured
/// in. The window opens at the first sample at or after `not_before` that shows acknowledged
/// records and closes at the first that shows them all.
struct WindowTracker {
    total: u64,
    not_before: Instant,
    /// The latest sample at or after `not_before` that showed none acknowledged.
    last_empty: Option<Instant>,
    start: Option<(Instant, u64)>,
}

impl WindowTracker {
    fn new(total: u64, not_before: Instant) -> WindowTracker {
        WindowTracker {
            total,
            not_before,
            last_empty: None,
            start: None,
        }
    }

    /// Takes a sample; the window once it has closed.
    fn sample(&mut self, name: &str, now: Instant, accepted: u64) -> Result<Option<Window>> {
        let total = self.total;
        if self.start.is_none() && now >= self.not_before {
            if accepted == 0 {
                self.last_empty = Some(now);
            } else if accepted >= total {
                // A drain faster than the samples' gap (a classic connector takes 300,000
                // records in about 0.2 s; the gap before the window is 50 ms): the records
                // all came between the last empty sample and this one.
                let Some(empty) = self.last_empty else {
                    bail!(
                        "{name} acknowledged all {total} records before the window opened \
                         (the first sample after it could open already showed them all)"
                    );
                };
                return Ok(Some(Window {
                    records: accepted,
                    seconds: now.duration_since(empty).as_secs_f64(),
                    between_samples: true,
                    cpu_before_records: None,
                }));
            } else {
                self.start = Some((now, accepted));
            }
        }
        if accepted < total {
            return Ok(None);
        }
        let (t0, n0) = self.start.context("window never opened")?;
        Ok(Some(Window {
            records: accepted - n0,
            seconds: now.duration_since(t0).as_secs_f64(),
            between_samples: false,
            cpu_before_records: None,
        }))
    }
}

/// Waits until connector `name` has acknowledged (ACCEPTed and committed) `total` records, and
/// returns the window they were measured in ([`WindowTracker`]).
pub async fn measure(
    worker: &Worker,
    name: &str,
    total: u64,
    not_before: Instant,
    limit: Duration,
) -> Result<Window> {
    let deadline = Instant::now() + limit;
    let mut window = WindowTracker::new(total, not_before);
    let mut cpu_before_records = None;
    loop {
        let now = Instant::now();
        let status = worker.status(name).context("connector not registered")?;
        let accepted = status.totals().accepted;
        if accepted == 0 {
            cpu_before_records = Some(cpu_time());
        }
        if let Some(mut w) = window.sample(name, now, accepted)? {
            w.cpu_before_records = cpu_before_records;
            if w.between_samples {
                eprintln!(
                    "  ({name} acknowledged all {} records between two samples {:.3} s apart: \
                     its rate is a lower bound)",
                    w.records, w.seconds
                );
            }
            return Ok(w);
        }
        if now > deadline {
            bail!("{name} acknowledged {accepted} of {total} records in {limit:?}: {status:?}");
        }
        sleep_cheaply(next_sample(window.start, now, accepted, total)).await;
    }
}

/// Sleeps `pause` at the least cost to the measured process, which pays for the harness's
/// wake-ups. On a multi-threaded runtime the calling thread sleeps itself: one wake-up. A
/// runtime timer cost about four (the caller parks, the thread driving the timers is woken to
/// re-arm it, wakes at the deadline and wakes the caller), and a wake-up costs about 36 µs of
/// CPU on this project's Firecracker machines (bench/README.md, "Fixed costs"). On a
/// current-thread runtime there is no other thread to spare, so the runtime's timer it is.
pub async fn sleep_cheaply(pause: Duration) {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        tokio::task::block_in_place(|| std::thread::sleep(pause));
    } else {
        tokio::time::sleep(pause).await;
    }
}

/// How long to wait before the next status sample: the window's end is only known to the
/// precision of the samples, yet every sample costs the measured process CPU (a thread
/// wake-up, [`sleep_cheaply`]). Before the window opens, samples are
/// 50 ms apart: a window runs between two samples, so opening it later takes records out of
/// it but biases no rate, while a classic connector's 3 s join sampled every 5 ms woke the
/// process 600 times more than the C reference, about a tenth of its CPU per record
/// (bench/README.md). In the window, sleep about half the time the rate so far needs for the
/// rest.
fn next_sample(start: Option<(Instant, u64)>, now: Instant, accepted: u64, total: u64) -> Duration {
    const FINEST: Duration = Duration::from_millis(2);
    const COARSEST: Duration = Duration::from_millis(100);
    const BEFORE_THE_WINDOW: Duration = Duration::from_millis(50);
    let Some((t0, n0)) = start else {
        return BEFORE_THE_WINDOW;
    };
    let done = accepted.saturating_sub(n0);
    let elapsed = now.duration_since(t0).as_secs_f64();
    if done == 0 || elapsed <= 0.0 {
        return FINEST;
    }
    let rate = done as f64 / elapsed;
    let left = total.saturating_sub(accepted) as f64 / rate;
    Duration::from_secs_f64(left / 2.0).clamp(FINEST, COARSEST)
}

/// The system allocator, counting the bytes allocated from [`HeapCounter::start_counting`] on,
/// and at most since the last [`HeapCounter::reset_peak`]: what a process's data takes, apart
/// from what the allocator keeps from the operating system besides (RSS). A benchmark binary
/// installs it with `#[global_allocator]`. Its `malloc` is jemalloc's in every binary that links
/// `spillway_actors` (`spillway_actors::allocator`).
///
/// Until counting starts it only passes calls on: two atomic read-modify-writes per allocation,
/// shared by every thread, were about 2% of a classic connector's CPU, charged to it and not to
/// the C reference it is measured against (bench/README.md).
pub struct HeapCounter;

static COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
// Signed: memory allocated before counting started and freed after takes them below zero.
static HEAP_NOW: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
static HEAP_PEAK: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

impl HeapCounter {
    /// Counts from now on: [`Self::now`] and [`Self::peak`] are relative to this moment.
    pub fn start_counting() {
        COUNTING.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes allocated and not yet freed since counting started.
    pub fn now() -> isize {
        HEAP_NOW.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The most bytes allocated at once since the last reset.
    pub fn peak() -> isize {
        HEAP_PEAK.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts a new peak from what is allocated now.
    pub fn reset_peak() {
        HEAP_PEAK.store(Self::now(), std::sync::atomic::Ordering::Relaxed);
    }

    fn grew(size: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if COUNTING.load(Relaxed) {
            let now = HEAP_NOW.fetch_add(size as isize, Relaxed) + size as isize;
            HEAP_PEAK.fetch_max(now, Relaxed);
        }
    }

    fn shrank(size: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if COUNTING.load(Relaxed) {
            HEAP_NOW.fetch_sub(size as isize, Relaxed);
        }
    }
}

// SAFETY: every call is passed to the system allocator unchanged; only sizes are counted.
unsafe impl std::alloc::GlobalAlloc for HeapCounter {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let ptr = unsafe { std::alloc::System.alloc(layout) };
        if !ptr.is_null() {
            Self::grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        let ptr = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            Self::grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        Self::shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            Self::shrank(layout.size());
            Self::grew(new_size);
        }
        new
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_harness_sleeps_on_either_kind_of_runtime() {
        let pause = Duration::from_millis(20);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a multi-threaded runtime");
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        for runtime in [multi, current] {
            let started = Instant::now();
            // The calling thread's own sleep on the first, the runtime's timer on the second
            // (blocking in place there would panic).
            runtime.block_on(sleep_cheaply(pause));
            assert!(
                started.elapsed() >= pause,
                "woke after {:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn a_run_is_refused_when_its_records_would_not_all_stay_on_the_dev_broker() {
        // The benches' defaults fit: classic 300,000 and share 200,000 records of 100 B over 8.
        fits_dev_broker(300_000, 8, 100).expect("300,000 x 100 B over 8 partitions fits");
        fits_dev_broker(200_000, 8, 100).expect("200,000 x 100 B over 8 partitions fits");
        fits_dev_broker(24_000, 8, 1024).expect("the memory part's records fit");
        // 600,000 did not: the C reference drained 325,680 of them.
        let refused = fits_dev_broker(600_000, 8, 100)
            .expect_err("600,000 x 100 B over 8 partitions does not fit")
            .to_string();
        assert!(
            refused.contains("600000 records of 100 B over 8 partitions"),
            "{refused}"
        );
        assert!(
            refused.contains("ask for at most 317744 records"),
            "{refused}"
        );
        // The figure it names fits; one more record a partition does not.
        fits_dev_broker(317_744, 8, 100).expect("the most it names fits");
        assert!(fits_dev_broker(317_744 + 8, 8, 100).is_err());
        // More partitions make room.
        fits_dev_broker(600_000, 16, 100).expect("600,000 over 16 partitions fits");
    }

    #[test]
    fn the_summary_is_the_last_json_line_whatever_a_wrapper_prints_after_it() {
        let out = "progress\n{\"n\": 1}\n{\"n\": 2}\nheaptrack finished: run heaptrack --analyze\n";
        let summary: serde_json::Value = super::last_json_line(out).expect("found");
        assert_eq!(summary["n"], 2);
        assert!(super::last_json_line::<serde_json::Value>("no summary\n").is_err());
    }

    use super::*;

    #[test]
    fn the_library_is_found_for_this_machines_architecture_only() {
        let listed = "3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibjemalloc.so.2 (libc6) => /usr/lib/i386-linux-gnu/libjemalloc.so.2\n\
            \tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2\n\
            \tlibjemalloc.so.2 (libc6,AArch64) => /lib/aarch64-linux-gnu/libjemalloc.so.2\n\
            \tlibjemalloc.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so\n";
        let expected = match std::env::consts::ARCH {
            "x86_64" => "/lib/x86_64-linux-gnu/libjemalloc.so.2",
            "aarch64" => "/lib/aarch64-linux-gnu/libjemalloc.so.2",
            other => panic!("no ldconfig line in this test for {other}"),
        };
        assert_eq!(
            library_path(listed, JEMALLOC_LIBRARY),
            Some(PathBuf::from(expected))
        );
        assert_eq!(library_path(listed, "libtcmalloc.so.4"), None);
    }

    /// The libraries mapped into process `pid`.
    fn mapped_libraries(pid: u32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_else(|e| panic!("reading /proc/{pid}/maps: {e}"))
    }

    #[test]
    fn the_dev_broker_runs_on_the_allocator_asked_for_and_no_other_process_gets_it() {
        // .ci/run installs libjemalloc2; elsewhere the error names the package.
        let jemalloc = BrokerAllocator::Jemalloc
            .preload()
            .unwrap_or_else(|e| panic!("{e:#}"))
            .expect("jemalloc is preloaded");
        let name = jemalloc.file_name().unwrap().to_string_lossy().into_owned();
        let preloaded = start_broker(1, "allocator", 1, Some(&jemalloc)).expect("dev broker");
        assert!(
            mapped_libraries(preloaded.launcher_pid()).contains(&name),
            "{name} is not mapped into the dev broker launcher"
        );
        // Started after it, so a preload leaking into this process's environment (and from
        // there into the contenders it spawns) would show here.
        let plain = start_broker(1, "allocator", 1, None).expect("dev broker");
        assert!(
            !mapped_libraries(plain.launcher_pid()).contains(&name),
            "{name} is mapped into a dev broker started without it"
        );
        assert_eq!(BrokerAllocator::Glibc.preload().unwrap(), None);
    }

    #[test]
    fn own_cpu_time_counts_every_thread_finer_than_proc_and_agrees_with_it() {
        let before = cpu_time();
        // 200 ms of CPU on a thread that then ends: still counted.
        std::thread::spawn(|| {
            let start = std::time::Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(200) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .join()
        .expect("spins");
        let spent = cpu_time() - before;
        assert!(spent >= Duration::from_millis(150), "{spent:?}");
        // /proc's ticks tell the same total, to within a few ticks.
        let proc_total = proc_cpu_time("self");
        let ours = cpu_time();
        let gap = ours.abs_diff(proc_total);
        assert!(
            gap <= Duration::from_millis(50),
            "{ours:?} against {proc_total:?}"
        );
        // Microseconds, not 10 ms ticks: a reading is rarely a whole number of ticks.
        let readings: Vec<Duration> = (0..5)
            .map(|_| {
                let start = std::time::Instant::now();
                while start.elapsed() < Duration::from_millis(3) {}
                cpu_time()
            })
            .collect();
        assert!(
            readings.iter().any(|d| d.as_micros() % 10_000 != 0),
            "{readings:?}"
        );
    }

    #[test]
    fn a_window_opens_at_the_first_acknowledged_sample_and_closes_at_the_last() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut tracker = WindowTracker::new(1000, at(10));
        // Before `not_before`, records already counted do not open it.
        assert_eq!(tracker.sample("c", at(0), 5).unwrap(), None);
        assert_eq!(tracker.sample("c", at(50), 200).unwrap(), None);
        assert_eq!(tracker.sample("c", at(100), 600).unwrap(), None);
        let window = tracker.sample("c", at(300), 1000).unwrap().unwrap();
        assert_eq!(window.records, 800);
        assert!((window.seconds - 0.25).abs() < 1e-9, "{window:?}");
        assert!(!window.between_samples);
    }

    #[test]
    fn a_drain_between_two_samples_is_measured_over_their_gap() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut tracker = WindowTracker::new(1000, t0);
        assert_eq!(tracker.sample("c", at(0), 0).unwrap(), None);
        assert_eq!(tracker.sample("c", at(50), 0).unwrap(), None);
        let window = tracker.sample("c", at(100), 1000).unwrap().unwrap();
        assert_eq!(window.records, 1000);
        assert!((window.seconds - 0.05).abs() < 1e-9, "{window:?}");
        assert!(window.between_samples);
        assert!((window.rate() - 20_000.0).abs() < 1e-6);
        // With no empty sample to measure from, there is no window to report.
        let mut late = WindowTracker::new(1000, t0);
        let error = late.sample("c", at(0), 1000).unwrap_err().to_string();
        assert!(error.contains("before the window opened"), "{error}");
    }

    #[test]
    fn samples_thin_out_in_a_long_window_and_tighten_at_its_end() {
        let t0 = Instant::now();
        let start = Some((t0, 0));
        // Not open yet: a sample every 50 ms.
        assert_eq!(next_sample(None, t0, 0, 1000), Duration::from_millis(50));
        // 1,000 records/s with 10,000 left: the coarsest period.
        let now = t0 + Duration::from_secs(1);
        assert_eq!(
            next_sample(start, now, 1000, 11_000),
            Duration::from_millis(100)
        );
        // 40 records left at 1,000/s: half of the 40 ms they need.
        assert_eq!(
            next_sample(start, now, 1000, 1040),
            Duration::from_millis(20)
        );
        // 1 left: the finest period.
        assert_eq!(
            next_sample(start, now, 1000, 1001),
            Duration::from_millis(2)
        );
    }

    #[global_allocator]
    static COUNTED: HeapCounter = HeapCounter;

    /// The tests that watch the process's memory run one at a time.
    static MEMORY_WATCHED: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_heap_counter_follows_allocations_and_their_peak() {
        let _alone = MEMORY_WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        // Other tests allocate and free a little meanwhile: a margin for them. The block is
        // small beside the RSS test's, whose peak it must not raise beforehand.
        const BLOCK: isize = 16 << 20;
        const MARGIN: isize = 4 << 20;
        HeapCounter::start_counting();
        HeapCounter::reset_peak();
        let before = HeapCounter::now();
        let block = vec![1u8; BLOCK as usize];
        assert!(HeapCounter::now() + MARGIN >= before + BLOCK);
        drop(block);
        assert!(HeapCounter::peak() + MARGIN >= before + BLOCK);
        assert!(HeapCounter::now() < before + MARGIN);
    }

    #[test]
    fn peak_rss_grows_when_memory_is_touched() {
        let _alone = MEMORY_WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        let before = peak_rss_bytes().expect("VmHWM is readable on Linux");
        let block = vec![1u8; 64 * 1024 * 1024];
        std::hint::black_box(&block);
        let after = peak_rss_bytes().expect("VmHWM is readable on Linux");
        assert!(
            after >= before + 32 * 1024 * 1024,
            "before {before}, after {after}"
        );
    }

    #[test]
    fn cpu_time_advances_with_work() {
        let before = cpu_time();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(cpu_time() > before);
    }
}
