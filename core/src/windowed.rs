//! Kafka's sampled statistics of a value (a `Sensor` with `Avg`, `Min` and `Max`): over two
//! samples of 30 s (`metrics.sample.window.ms`, `metrics.num.samples`), so they cover the last
//! 30 to 60 s. Connect's `put-batch-avg-time-ms` and MirrorMaker 2's `record-age-ms-max` are
//! such statistics; the runtime and the kafka sink both keep them.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The length of one sample.
pub const SAMPLE_WINDOW: Duration = Duration::from_secs(30);

/// Values summed up where they are recorded (a batch's), then added to a [`Windowed`] at once:
/// one lock per batch instead of one per value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    /// The value recorded last (MirrorMaker 2's plain `record-age-ms`).
    pub last: f64,
}

impl Default for Summary {
    fn default() -> Self {
        Summary {
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            last: 0.0,
        }
    }
}

impl Summary {
    pub fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.last = value;
    }

    fn merge(&mut self, other: &Summary) {
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.last = other.last;
    }
}

/// What a [`Windowed`] reads: of the values in the last one or two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub avg: f64,
    pub min: f64,
    pub max: f64,
}

/// An average, minimum and maximum over Kafka's two 30 s samples.
#[derive(Debug, Default)]
pub struct Windowed {
    samples: Mutex<Samples>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Samples {
    /// The previous sample, then the current one.
    both: [Sample; 2],
    /// The value recorded last, however long ago (Kafka's `Value` stat).
    last: Option<f64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Sample {
    start: Option<Instant>,
    values: Summary,
}

impl Windowed {
    fn lock(&self) -> MutexGuard<'_, Samples> {
        // Each update is a few assignments; a panic elsewhere cannot tear it.
        self.samples.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, value: f64, now: Instant) {
        let mut one = Summary::default();
        one.add(value);
        self.record_all(&one, now);
    }

    /// Adds values summed up elsewhere, as if each had been recorded at `now`.
    pub fn record_all(&self, values: &Summary, now: Instant) {
        if values.count == 0 {
            return;
        }
        let mut samples = self.lock();
        let current = samples.both[1];
        if current
            .start
            .is_none_or(|s| now.duration_since(s) >= SAMPLE_WINDOW)
        {
            samples.both[0] = current;
            samples.both[1] = Sample {
                start: Some(now),
                values: Summary::default(),
            };
        }
        samples.both[1].values.merge(values);
        samples.last = Some(values.last);
    }

    /// The statistics of the values recorded in the last one or two samples; `None` when
    /// there were none (Connect reports NaN then).
    pub fn read(&self, now: Instant) -> Option<Stats> {
        let samples = *self.lock();
        let mut all = Summary::default();
        for s in samples.both.iter().filter(|s| {
            s.start
                .is_some_and(|start| now.duration_since(start) < SAMPLE_WINDOW * 2)
        }) {
            all.merge(&s.values);
        }
        (all.count > 0).then(|| Stats {
            avg: all.sum / all.count as f64,
            min: all.min,
            max: all.max,
        })
    }

    /// The value recorded last, however long ago; `None` before the first.
    pub fn last(&self) -> Option<f64> {
        self.lock().last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windowed_statistics_cover_two_samples_then_age_out() {
        let w = Windowed::default();
        let t0 = Instant::now();
        assert_eq!(w.read(t0), None, "no samples: nothing to report");
        assert_eq!(w.last(), None);
        w.record(10.0, t0);
        w.record(30.0, t0 + Duration::from_secs(1));
        let stats = |avg, min, max| Some(Stats { avg, min, max });
        assert_eq!(w.read(t0 + Duration::from_secs(2)), stats(20.0, 10.0, 30.0));
        // A new sample starts after 30 s; the previous one still counts.
        w.record(2.0, t0 + Duration::from_secs(31));
        assert_eq!(w.read(t0 + Duration::from_secs(32)), stats(14.0, 2.0, 30.0));
        // Both samples are older than two windows; the last value stays.
        assert_eq!(w.read(t0 + Duration::from_secs(95)), None);
        assert_eq!(w.last(), Some(2.0));
    }

    #[test]
    fn values_summed_up_count_as_if_recorded_one_by_one() {
        let (one_by_one, at_once) = (Windowed::default(), Windowed::default());
        let t0 = Instant::now();
        let mut summary = Summary::default();
        for v in [7.0, 3.0, 12.0, 5.0] {
            one_by_one.record(v, t0);
            summary.add(v);
        }
        at_once.record_all(&summary, t0);
        at_once.record_all(&Summary::default(), t0 + Duration::from_secs(1));
        assert_eq!(one_by_one.read(t0), at_once.read(t0));
        assert_eq!(
            at_once.read(t0),
            Some(Stats {
                avg: 6.75,
                min: 3.0,
                max: 12.0
            })
        );
        assert_eq!((one_by_one.last(), at_once.last()), (Some(5.0), Some(5.0)));
    }
}
