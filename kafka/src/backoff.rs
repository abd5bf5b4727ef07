//! The one retry backoff of the Kafka clients: exponential with ±20% jitter, as Kafka's
//! `ExponentialBackoff` (`retry.backoff.ms` .. `retry.backoff.max.ms`, jitter 0.2), so that
//! many members retrying after the same broker event do not hit it in lockstep.

use std::time::Duration;

use rand::Rng;

const JITTER: f64 = 0.2;

/// Exponential backoff between `min` and `max`; [`Backoff::next_wait`] grows it, [`Backoff::reset`]
/// starts over after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempts: u32,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            attempts: 0,
        }
    }

    /// The wait before the next attempt: `min * 2^attempts`, capped at `max`, ±20%.
    pub fn next_wait(&mut self) -> Duration {
        let base = self
            .min
            .saturating_mul(1u32 << self.attempts.min(16))
            .min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        let factor = rand::thread_rng().gen_range(1.0 - JITTER..=1.0 + JITTER);
        base.mul_f64(factor)
    }

    pub fn reset(&mut self) {
        self.attempts = 0;
    }

    /// Whether the last attempt failed (a wait was taken since the last reset).
    pub fn is_failing(&self) -> bool {
        self.attempts > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_starts_over_after_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = b.next_wait();
        assert!(first >= Duration::from_millis(80) && first <= Duration::from_millis(120));
        let second = b.next_wait();
        assert!(second >= Duration::from_millis(160) && second <= Duration::from_millis(240));
        let (third, fourth) = (b.next_wait(), b.next_wait());
        assert!(third <= Duration::from_millis(480) && fourth <= Duration::from_millis(960));
        for _ in 0..30 {
            let w = b.next_wait();
            assert!(w >= Duration::from_millis(800) && w <= Duration::from_millis(1200));
        }
        assert!(b.is_failing());
        b.reset();
        assert!(!b.is_failing());
        assert!(b.next_wait() <= Duration::from_millis(120));
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let waits: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).next_wait())
            .collect();
        assert!(waits.len() > 1, "every wait was the same: {waits:?}");
    }
}
