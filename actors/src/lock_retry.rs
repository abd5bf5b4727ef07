//! Share mode: retrying a batch's retriable `put` failures while the records are still held.
//!
//! A record a share consumer holds is locked to it until its acquisition lock runs out; a
//! RELEASE (or a lock that runs out) costs one of the record's `group.share.delivery.count.limit`
//! deliveries. So a retriable failure is retried inside the task, after a jittered exponential
//! backoff (Connect's 300 ms doubling up to `errors.retry.delay.max.ms`), for as long as the
//! earliest lock of the records still failing leaves room for one more attempt *and* for the
//! verdicts' commit: `now + wait + last attempt's time + margin ≤ deadline` (when the next wait
//! does not fit, one last attempt is made as late as the lock allows). Only then (or when
//! `errors.retry.timeout` is spent) are they released, and the task asks its consumer not to
//! fetch again for a while ([`delivery_pause`]), so the records are not taken again — spending
//! a delivery — while the target is most likely still down. That pause doubles with the
//! delivery count of the records given up (one lock duration after the first delivery), so
//! that `group.share.delivery.count.limit` deliveries stretch over an outage many lock
//! durations long: with a 3 s lock and the limit 5, about 50 s.
//!
//! A success of any task of the connector ([`TargetHealth`]) ends the other tasks' pauses: the
//! target is back, and a task still waiting would only slow the recovery down.
//!
//! The backoff outlives a batch: while the target keeps failing, the next batch's first
//! attempt also waits for the backoff (as far as its own locks allow); a success resets it.
//!
//! Where the brokers can extend a lock (ShareAcknowledge `RENEW`, KIP-1222, ShareAcknowledge v2
//! in Kafka 4.2) the deadline would move on with each renewal; [`LockExtension`] is that seam.
//! This client speaks the share APIs at v1, so it is [`LockExtension::Unavailable`] and the
//! retries end at the lock deadline less the margin.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_core::config::RetryTimeout;
use spillway_kafka::backoff::Backoff;

/// Connect's first retry backoff.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(300);

/// Whether the task can extend the acquisition locks of the records it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockExtension {
    /// It can (ShareAcknowledge RENEW). The retry window still ends at each record's own
    /// lock deadline: only a renewal that moves those deadlines on lets a retry go past them
    /// (docs/runtime.md, "Lock extension").
    Available,
    /// It cannot: why (logged once, at the first retry that the lock cuts short).
    Unavailable(&'static str),
}

/// What the consumer learns that the sink stage needs for its retries and lock checks,
/// shared by the two actors of one task.
#[derive(Debug, Clone, Default)]
pub struct LockFacts(Arc<LockFactsInner>);

#[derive(Debug, Default)]
struct LockFactsInner {
    /// The acquisition lock duration the brokers reported, in ms (0: not known).
    lock_ms: AtomicU64,
    /// How long the last commit took, in ms.
    commit_ms: AtomicU64,
    /// Why held locks cannot be extended (`None`: they can, or nothing is known yet).
    no_extension: Mutex<Option<&'static str>>,
    extension_known: AtomicBool,
}

impl LockFacts {
    pub fn set_lock_duration(&self, lock: Option<Duration>) {
        if let Some(lock) = lock {
            self.0
                .lock_ms
                .store(lock.as_millis() as u64, Ordering::Relaxed);
        }
    }

    pub fn lock_duration(&self) -> Option<Duration> {
        match self.0.lock_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    pub fn set_commit_time(&self, took: Duration) {
        self.0
            .commit_ms
            .store(took.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn commit_time(&self) -> Duration {
        Duration::from_millis(self.0.commit_ms.load(Ordering::Relaxed))
    }

    pub fn set_extension(&self, extension: LockExtension) {
        *self
            .0
            .no_extension
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = match extension {
            LockExtension::Available => None,
            LockExtension::Unavailable(why) => Some(why),
        };
        self.0.extension_known.store(true, Ordering::Relaxed);
    }

    pub fn extension(&self) -> LockExtension {
        if !self.0.extension_known.load(Ordering::Relaxed) {
            return LockExtension::Unavailable("the source has not said");
        }
        match *self
            .0
            .no_extension
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            None => LockExtension::Available,
            Some(why) => LockExtension::Unavailable(why),
        }
    }
}

/// Puts that succeeded in any task of one connector, counted: the connector's tasks share one
/// target, so one task's success tells the others, paused between deliveries, that it is
/// back. A paused task ends its pause when the count moved since the pause began.
#[derive(Debug, Clone, Default)]
pub struct TargetHealth(Arc<AtomicU64>);

impl TargetHealth {
    /// A put of this connector succeeded.
    pub fn succeeded(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Successes so far (compare two readings).
    pub fn successes(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The retry state of one task's sink stage: the backoff while its target fails.
#[derive(Debug)]
pub struct RetryState {
    backoff: Backoff,
    /// Not before this instant is the target tried again (`None`: it last succeeded).
    next_attempt: Option<Instant>,
}

/// What to do after an attempt failed retriably.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Wait this long, then put the failing records again.
    Retry(Duration),
    /// Give the records up for this delivery (RELEASE, or the delivery limit's path); fetch
    /// nothing new before `resume` (the backoff's next attempt).
    GiveUp { resume: Instant, why: GiveUpReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUpReason {
    /// The earliest lock of the failing records would run out before another attempt and the
    /// commit after it.
    LockDeadline,
    /// `errors.retry.timeout` is spent.
    RetryTimeout,
}

/// The facts one decision needs.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub now: Instant,
    /// The earliest lock deadline of the records still failing (`None`: no locks, classic).
    pub deadline: Option<Instant>,
    /// How long the last attempt (put and flush) took.
    pub attempt: Duration,
    /// Time kept free before the deadline for the verdicts' commit and what the sink task
    /// itself needs before a lock runs out (its `lock_margin`).
    pub margin: Duration,
    /// When the batch's first attempt started, for `errors.retry.timeout`.
    pub started: Instant,
    pub retry_timeout: RetryTimeout,
}

impl Window {
    /// Whether an attempt that starts after `wait` still ends (with the commit after it)
    /// before the lock deadline.
    pub fn fits(&self, wait: Duration) -> bool {
        match self.deadline {
            None => true,
            Some(deadline) => self.now + wait + self.attempt + self.margin <= deadline,
        }
    }

    /// The longest wait after which an attempt still [`fits`](Self::fits) (zero when none
    /// does; the caller then tries at once or gives up).
    pub fn latest_wait(&self) -> Duration {
        match self.deadline {
            None => Duration::MAX,
            Some(deadline) => deadline
                .saturating_duration_since(self.now)
                .saturating_sub(self.attempt + self.margin),
        }
    }

    fn budget_allows(&self, wait: Duration) -> bool {
        match self.retry_timeout {
            // -1 (the default): no bound but the lock's, as Connect retries a retriable `put`
            // until it succeeds.
            RetryTimeout::Infinite => true,
            // 0: Connect's "no retries"; the records are released after one attempt.
            RetryTimeout::NoRetry => false,
            RetryTimeout::Within(limit) => self.now + wait <= self.started + limit,
        }
    }
}

impl RetryState {
    pub fn new(retry_delay_max: Duration) -> RetryState {
        RetryState {
            backoff: Backoff::new(FIRST_BACKOFF, retry_delay_max.max(FIRST_BACKOFF)),
            next_attempt: None,
        }
    }

    /// Records were given up for this delivery: nothing is tried before `resume`.
    pub fn hold_off_until(&mut self, resume: Instant) {
        self.next_attempt = Some(self.next_attempt.map_or(resume, |at| at.max(resume)));
    }

    /// The target took a put: the next failure starts the backoff over.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
        self.next_attempt = None;
    }

    /// How long a batch's first attempt waits: until the backoff's next attempt, but no
    /// longer than its locks allow (each delivery gets at least one attempt).
    pub fn first_wait(&self, window: &Window) -> Duration {
        match self.next_attempt {
            None => Duration::ZERO,
            Some(at) => at
                .saturating_duration_since(window.now)
                .min(window.latest_wait()),
        }
    }

    /// An attempt failed retriably: retry after the next backoff wait if it fits the lock
    /// and the retry budget, else give up for this delivery.
    pub fn after_failure(&mut self, window: &Window) -> AfterFailure {
        let wait = self.backoff.next_wait();
        let resume = window.now + wait;
        self.next_attempt = Some(resume);
        if !window.budget_allows(wait) {
            return AfterFailure::GiveUp {
                resume,
                why: GiveUpReason::RetryTimeout,
            };
        }
        if window.fits(wait) {
            return AfterFailure::Retry(wait);
        }
        // One last attempt as late as the lock allows, rather than giving up the rest of it:
        // a delivery spent early leaves fewer for a long outage.
        let latest = window.latest_wait();
        if latest >= FIRST_BACKOFF && window.budget_allows(latest) {
            return AfterFailure::Retry(latest);
        }
        AfterFailure::GiveUp {
            resume,
            why: GiveUpReason::LockDeadline,
        }
    }
}

/// How long the consumer fetches nothing after records on their `delivery_count`-th delivery
/// were given up still failing: the lock duration, doubled for each delivery already spent,
/// at most `cap` (`errors.retry.delay.max.ms`) — but never less than the backoff's own wait.
pub fn delivery_pause(
    lock: Duration,
    delivery_count: u16,
    backoff_wait: Duration,
    cap: Duration,
) -> Duration {
    let doublings = u32::from(delivery_count.saturating_sub(1)).min(16);
    lock.saturating_mul(1 << doublings)
        .min(cap)
        .max(backoff_wait)
}

/// The commit margin kept before a lock deadline: the configured one, or twice the last
/// commit's time when that is more (a slow cluster needs more room for the RELEASE).
pub fn commit_margin(configured: Duration, last_commit: Duration) -> Duration {
    configured.max(last_commit.saturating_mul(2))
}

/// A lock duration too short for what the sink task needs before a lock runs out: the
/// message that fails the task, naming both values and the settings to change.
pub fn lock_too_short(
    lock: Duration,
    needed: Duration,
    task_margin: Option<(Duration, &str)>,
) -> Option<String> {
    if lock > needed {
        return None;
    }
    let what = match task_margin {
        Some((margin, setting)) => format!(
            "not longer than the {} ms the sink task keeps free before a lock runs out ({setting}={})",
            needed.as_millis(),
            margin.as_millis()
        ),
        None => format!(
            "not longer than the {} ms a batch needs",
            needed.as_millis()
        ),
    };
    let lower = match task_margin {
        Some((_, setting)) => format!(" or lower {setting}"),
        None => String::new(),
    };
    Some(format!(
        "the share group's acquisition lock is {} ms (the broker's AcquisitionLockTimeoutMs), {what}: every batch would be aborted and released until the broker archives its records; raise the group's share.record.lock.duration.ms (broker default group.share.record.lock.duration.ms){lower}",
        lock.as_millis()
    ))
}

/// A lock duration shorter than what batches measurably take: put and flush of a batch's last
/// attempt plus the last commit, beyond the lock less the task's margin.
pub fn lock_too_short_for_batches(
    lock: Duration,
    put: Duration,
    commit: Duration,
    task_margin: Option<(Duration, &str)>,
) -> Option<String> {
    let margin = task_margin.map_or(Duration::ZERO, |(m, _)| m);
    if put + commit + margin < lock {
        return None;
    }
    let margin_text = match task_margin {
        Some((m, setting)) => format!(" plus {setting}={} ms", m.as_millis()),
        None => String::new(),
    };
    Some(format!(
        "the share group's acquisition lock is {} ms (the broker's AcquisitionLockTimeoutMs) but a batch's put and flush took {} ms and its commit {} ms{margin_text}, twice in a row: its acknowledgements arrive after the lock ran out and the records come back until the broker archives them; raise the group's share.record.lock.duration.ms (broker default group.share.record.lock.duration.ms) or lower max.poll.records (consumer.override.max.poll.records)",
        lock.as_millis(),
        put.as_millis(),
        commit.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(now: Instant, deadline_in: Option<Duration>) -> Window {
        Window {
            now,
            deadline: deadline_in.map(|d| now + d),
            attempt: Duration::from_millis(100),
            margin: Duration::from_millis(1000),
            started: now,
            retry_timeout: RetryTimeout::Infinite,
        }
    }

    #[test]
    fn retries_while_the_lock_leaves_room_for_an_attempt_and_the_commit() {
        let now = Instant::now();
        let mut state = RetryState::new(Duration::from_secs(60));
        // 3 s lock: 100 ms attempt + 1 s margin leave 1.9 s of waiting.
        let w = window(now, Some(Duration::from_secs(3)));
        assert_eq!(w.latest_wait(), Duration::from_millis(1900));
        assert!(w.fits(Duration::from_millis(1900)));
        assert!(!w.fits(Duration::from_millis(1901)));
        // First wait: 300 ms ± 20 %: fits.
        let AfterFailure::Retry(first) = state.after_failure(&w) else {
            panic!("the first retry fits a 3 s lock");
        };
        assert!(first >= Duration::from_millis(240) && first <= Duration::from_millis(360));
        // 1.5 s later 400 ms are left: the second wait (600 ms ± 20 %) does not fit, so the
        // last attempt is made as late as the lock allows.
        let later = Window {
            now: now + Duration::from_millis(1500),
            ..window(now, Some(Duration::from_secs(3)))
        };
        assert_eq!(
            state.after_failure(&later),
            AfterFailure::Retry(Duration::from_millis(400))
        );
        // 1.8 s in, 100 ms are left, less than a first backoff: give up, resume after the
        // backoff's next wait (1.2 s ± 20 %).
        let last = Window {
            now: now + Duration::from_millis(1800),
            ..window(now, Some(Duration::from_secs(3)))
        };
        match state.after_failure(&last) {
            AfterFailure::GiveUp { resume, why } => {
                assert_eq!(why, GiveUpReason::LockDeadline);
                let wait = resume - last.now;
                assert!(wait >= Duration::from_millis(960) && wait <= Duration::from_millis(1440));
            }
            other => panic!("expected to give up at the lock deadline: {other:?}"),
        }
    }

    #[test]
    fn a_passed_deadline_leaves_no_wait_and_no_deadline_leaves_any() {
        let now = Instant::now();
        let gone = Window {
            now: now + Duration::from_secs(5),
            ..window(now, Some(Duration::from_secs(3)))
        };
        assert_eq!(gone.latest_wait(), Duration::ZERO);
        assert!(!gone.fits(Duration::ZERO));
        let classic = window(now, None);
        assert!(classic.fits(Duration::from_secs(3600)));
        let mut state = RetryState::new(Duration::from_secs(60));
        for _ in 0..20 {
            assert!(matches!(
                state.after_failure(&classic),
                AfterFailure::Retry(_)
            ));
        }
    }

    #[test]
    fn the_retry_timeout_ends_the_retries_before_the_lock_does() {
        let now = Instant::now();
        let mut state = RetryState::new(Duration::from_secs(60));
        let w = Window {
            now: now + Duration::from_millis(900),
            started: now,
            retry_timeout: RetryTimeout::Within(Duration::from_secs(1)),
            ..window(now, Some(Duration::from_secs(30)))
        };
        // 300 ms ± 20 % from 900 ms is past the 1 s budget.
        match state.after_failure(&w) {
            AfterFailure::GiveUp { why, .. } => assert_eq!(why, GiveUpReason::RetryTimeout),
            other => panic!("expected the budget to end it: {other:?}"),
        }
    }

    #[test]
    fn a_retry_timeout_of_zero_never_retries_even_with_a_long_lock() {
        let now = Instant::now();
        let mut state = RetryState::new(Duration::from_secs(60));
        let w = Window {
            retry_timeout: RetryTimeout::NoRetry,
            ..window(now, Some(Duration::from_secs(30)))
        };
        match state.after_failure(&w) {
            AfterFailure::GiveUp { why, .. } => assert_eq!(why, GiveUpReason::RetryTimeout),
            other => panic!("errors.retry.timeout=0 means no retries: {other:?}"),
        }
    }

    #[test]
    fn the_backoff_outlives_a_batch_until_a_success_and_caps_at_the_delay_max() {
        let now = Instant::now();
        let mut state = RetryState::new(Duration::from_secs(2));
        let w = window(now, Some(Duration::from_secs(30)));
        assert_eq!(state.first_wait(&w), Duration::ZERO);
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            if let AfterFailure::Retry(wait) = state.after_failure(&w) {
                last = wait;
            }
        }
        assert!(last <= Duration::from_millis(2400), "capped: {last:?}");
        // The next batch waits for the backoff, but only as long as its own locks allow.
        let next = state.first_wait(&w);
        assert!(next >= Duration::from_millis(1600) && next <= Duration::from_millis(2400));
        let short = window(now, Some(Duration::from_millis(1500)));
        assert_eq!(state.first_wait(&short), Duration::from_millis(400));
        state.succeeded();
        assert_eq!(state.first_wait(&w), Duration::ZERO);
    }

    #[test]
    fn the_pause_between_deliveries_doubles_with_the_delivery_count_up_to_the_cap() {
        let lock = Duration::from_secs(3);
        let cap = Duration::from_secs(60);
        let small = Duration::from_millis(300);
        let pauses: Vec<u64> = (1..=6)
            .map(|count| delivery_pause(lock, count, small, cap).as_secs())
            .collect();
        assert_eq!(pauses, vec![3, 6, 12, 24, 48, 60]);
        // Deliveries 1–4 of a limit of 5 span 3 + 6 + 12 = 21 s of pauses plus the holds: a
        // 20 s outage ends before the last allowed delivery.
        assert!(pauses[..3].iter().sum::<u64>() > 20);
        // The backoff's own wait wins when it is longer; the cap when the lock is long.
        assert_eq!(
            delivery_pause(lock, 1, Duration::from_secs(5), cap),
            Duration::from_secs(5)
        );
        assert_eq!(
            delivery_pause(Duration::from_secs(30), 3, small, cap),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn the_commit_margin_grows_with_slow_commits() {
        assert_eq!(
            commit_margin(Duration::from_secs(1), Duration::from_millis(200)),
            Duration::from_secs(1)
        );
        assert_eq!(
            commit_margin(Duration::from_secs(1), Duration::from_millis(800)),
            Duration::from_millis(1600)
        );
    }

    #[test]
    fn a_lock_at_or_below_the_tasks_margin_is_refused_naming_both_values_and_the_settings() {
        let margin = Some((Duration::from_secs(5), "delivery.lock.margin.ms"));
        let message = lock_too_short(Duration::from_secs(4), Duration::from_secs(5), margin)
            .expect("too short");
        assert!(message.contains("4000 ms"), "{message}");
        assert!(
            message.contains("delivery.lock.margin.ms=5000"),
            "{message}"
        );
        assert!(
            message.contains("share.record.lock.duration.ms"),
            "{message}"
        );
        assert!(lock_too_short(Duration::from_secs(6), Duration::from_secs(5), margin).is_none());
        let measured = lock_too_short_for_batches(
            Duration::from_secs(3),
            Duration::from_millis(2500),
            Duration::from_millis(600),
            None,
        )
        .expect("3.1 s of work under a 3 s lock");
        assert!(
            measured.contains("3000 ms") && measured.contains("2500 ms"),
            "{measured}"
        );
        assert!(lock_too_short_for_batches(
            Duration::from_secs(3),
            Duration::from_millis(1000),
            Duration::from_millis(600),
            None
        )
        .is_none());
    }
}
