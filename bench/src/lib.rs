//! Helpers shared by the benchmarks in `src/bin/`: process measurements (peak RSS, CPU time)
//! and the report format. Every benchmark prints ratios against a reference measured in the
//! same run on the same dev broker, never absolute pass/fail thresholds.

use std::time::Duration;

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
