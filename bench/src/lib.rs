//! Helpers shared by the benchmarks in `src/bin/`: process measurements (peak RSS, CPU time)
//! and the report format. Every benchmark prints ratios against a reference measured in the
//! same run on the same dev broker, never absolute pass/fail thresholds.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use spillway_actors::Worker;
use spillway_core::ConfigMap;
use spillway_tests::DevBroker;

/// Runs this benchmark binary again with `args` (a child role), with its stderr shown, and
/// reads the JSON summary it prints on stdout. Children measure their own peak RSS and CPU.
pub async fn run_child<T: serde::de::DeserializeOwned>(args: &[String]) -> Result<T> {
    // `output()` would capture stderr too (tokio pipes both whatever was set), hiding the
    // child's progress and errors: spawn with stdout piped only.
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()?;
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!("child process {:?} failed: {}", args.first(), output.status);
    }
    serde_json::from_slice(&output.stdout)
        .with_context(|| format!("reading the summary of child process {:?}", args.first()))
}

/// Peak resident set size of this process in bytes (VmHWM), from /proc.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:").map(|kib| kib * 1024)
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time (user + system) this process has used so far.
pub fn cpu_time() -> Duration {
    // /proc/self/stat fields 14 and 15 are utime and stime in clock ticks.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
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

pub fn config(pairs: &[(&str, &str)]) -> ConfigMap {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub fn start_broker(brokers: u32, topic: &str, partitions: i32) -> Result<DevBroker> {
    let broker = DevBroker::try_start(brokers, &[(topic, partitions)])?;
    broker.set_share_auto_offset_reset("earliest");
    broker.set_share_heartbeat_interval(300);
    Ok(broker)
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
pub struct Window {
    pub records: u64,
    pub seconds: f64,
}

impl Window {
    pub fn rate(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

/// Waits until connector `name` has acknowledged (ACCEPTed and committed) `total` records. The
/// window opens at the first sample at or after `not_before` that shows acknowledged records.
pub async fn measure(
    worker: &Worker,
    name: &str,
    total: u64,
    not_before: Instant,
    limit: Duration,
) -> Result<Window> {
    let deadline = Instant::now() + limit;
    let mut start: Option<(Instant, u64)> = None;
    loop {
        let now = Instant::now();
        let status = worker.status(name).context("connector not registered")?;
        let accepted = status.totals().accepted;
        if start.is_none() && now >= not_before && accepted > 0 {
            if accepted >= total {
                bail!("{name} acknowledged all {total} records before the window opened");
            }
            start = Some((now, accepted));
        }
        if accepted >= total {
            let (t0, n0) = start.context("window never opened")?;
            return Ok(Window {
                records: accepted - n0,
                seconds: now.duration_since(t0).as_secs_f64(),
            });
        }
        if now > deadline {
            bail!("{name} acknowledged {accepted} of {total} records in {limit:?}: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_grows_when_memory_is_touched() {
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
