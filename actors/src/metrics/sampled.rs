//! Kafka's sampled statistics: averages and maxima over two windows of 30 s, and per-second
//! rates of totals, computed when a reader collects.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Kafka's sampled statistics keep two samples of 30 s (`metrics.sample.window.ms`,
/// `metrics.num.samples`): averages, maxima and rates cover the last 30 to 60 s.
const SAMPLE_WINDOW: Duration = Duration::from_secs(30);
/// Rates are computed from totals remembered at least this far apart.
const RATE_STEP: Duration = Duration::from_secs(1);

/// An average and maximum over Kafka's two 30 s samples.
#[derive(Debug, Default)]
pub struct Windowed {
    samples: Mutex<[Sample; 2]>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Sample {
    start: Option<Instant>,
    count: u64,
    sum: f64,
    max: f64,
}

impl Windowed {
    fn lock(&self) -> MutexGuard<'_, [Sample; 2]> {
        // Each update is a few assignments; a panic elsewhere cannot tear it.
        self.samples.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, value: f64, now: Instant) {
        let mut samples = self.lock();
        let current = samples[1];
        if current
            .start
            .is_none_or(|s| now.duration_since(s) >= SAMPLE_WINDOW)
        {
            samples[0] = current;
            samples[1] = Sample {
                start: Some(now),
                ..Sample::default()
            };
        }
        let s = &mut samples[1];
        s.count += 1;
        s.sum += value;
        s.max = if s.count == 1 {
            value
        } else {
            s.max.max(value)
        };
    }

    /// Average and maximum of the values recorded in the last one or two windows; `None`
    /// when there were none (Connect reports NaN then).
    pub fn read(&self, now: Instant) -> Option<(f64, f64)> {
        let samples = *self.lock();
        let live = samples.iter().filter(|s| {
            s.count > 0
                && s.start
                    .is_some_and(|start| now.duration_since(start) < SAMPLE_WINDOW * 2)
        });
        let (mut count, mut sum, mut max) = (0u64, 0.0, f64::MIN);
        for s in live {
            count += s.count;
            sum += s.sum;
            max = max.max(s.max);
        }
        (count > 0).then(|| (sum / count as f64, max))
    }
}

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
    fn windowed_average_and_maximum_cover_two_samples_then_age_out() {
        let w = Windowed::default();
        let t0 = Instant::now();
        assert_eq!(w.read(t0), None, "no samples: nothing to report");
        w.record(10.0, t0);
        w.record(30.0, t0 + Duration::from_secs(1));
        assert_eq!(w.read(t0 + Duration::from_secs(2)), Some((20.0, 30.0)));
        // A new sample starts after 30 s; the previous one still counts.
        w.record(2.0, t0 + Duration::from_secs(31));
        assert_eq!(w.read(t0 + Duration::from_secs(32)), Some((14.0, 30.0)));
        // Both samples are older than two windows.
        assert_eq!(w.read(t0 + Duration::from_secs(95)), None);
    }

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
