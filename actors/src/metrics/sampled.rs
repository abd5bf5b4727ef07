//! Kafka's sampled statistics: averages and maxima over two windows of 30 s
//! ([`Windowed`], shared with the kafka sink's mirror metrics), and per-second rates of
//! totals, computed when a reader collects.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use spillway_core::windowed::{Windowed, SAMPLE_WINDOW};

/// Rates are computed from totals remembered at least this far apart.
const RATE_STEP: Duration = Duration::from_secs(1);

/// Per-second rates of totals, over about the last 30 s.
#[derive(Debug, Default)]
pub struct Rates {
    history: Mutex<HashMap<&'static str, VecDeque<(Instant, u64)>>>,
}

impl Rates {
    /// The rate of `total` (a counter named `name`) as seen at `now`.
    pub fn rate(&self, name: &'static str, total: u64, now: Instant) -> f64 {
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let seen = history.entry(name).or_default();
        if seen
            .back()
            .is_none_or(|(at, _)| now.duration_since(*at) >= RATE_STEP)
        {
            seen.push_back((now, total));
        }
        // Keep one sample older than the window as the base of the rate.
        while seen.len() > 2 && now.duration_since(seen[1].0) >= SAMPLE_WINDOW {
            seen.pop_front();
        }
        let (at, base) = seen[0];
        let elapsed = now.duration_since(at).as_secs_f64();
        if elapsed < 0.001 {
            return 0.0;
        }
        total.saturating_sub(base) as f64 / elapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_over_the_window() {
        let r = Rates::default();
        let t0 = Instant::now();
        assert_eq!(r.rate("x", 100, t0), 0.0, "one sample: no rate yet");
        let rate = r.rate("x", 300, t0 + Duration::from_secs(2));
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        // After the window, old samples drop out and the rate follows the recent slope.
        for s in 3..=40 {
            r.rate("x", 300 + (s - 2) * 10, t0 + Duration::from_secs(s));
        }
        let rate = r.rate("x", 300 + 39 * 10, t0 + Duration::from_secs(41));
        assert!((rate - 10.0).abs() < 1e-9, "{rate}");
    }
}
