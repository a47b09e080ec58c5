//! Cheap counters, readable without a tracing subscriber.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::attempt::Outcome;

/// Number of buckets in [`MetricsSnapshot::attempts_histogram`]; the last one counts that many
/// attempts or more.
pub const HISTOGRAM_BUCKETS: usize = 16;

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    histogram: [AtomicU64; HISTOGRAM_BUCKETS],
    buffered_bytes: AtomicUsize,
    peak_buffered_bytes: AtomicUsize,
}

impl Counters {
    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn finished(&self, outcome: Outcome, attempts: u32) {
        self.outcomes[outcome.index()].fetch_add(1, Relaxed);
        let bucket = (attempts.max(1) as usize - 1).min(HISTOGRAM_BUCKETS - 1);
        self.histogram[bucket].fetch_add(1, Relaxed);
    }

    /// Reserves `n` more buffered bytes if the total stays within `cap`.
    pub(crate) fn try_reserve(&self, n: usize, cap: usize) -> bool {
        let mut cur = self.buffered_bytes.load(Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|next| *next <= cap) else {
                return false;
            };
            match self
                .buffered_bytes
                .compare_exchange_weak(cur, next, Relaxed, Relaxed)
            {
                Ok(_) => {
                    self.peak_buffered_bytes.fetch_max(next, Relaxed);
                    crate::recorder::buffered_bytes(isize::try_from(n).unwrap_or(isize::MAX));
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    pub(crate) fn release(&self, n: usize) {
        self.buffered_bytes.fetch_sub(n, Relaxed);
        crate::recorder::buffered_bytes(isize::try_from(n).map_or(isize::MIN, |n| -n));
    }
}

/// A handle on a layer's counters, shared by every clone of the layer and its services.
///
/// ```
/// use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
///
/// let layer = SqliteRetryLayer::new(RetryPolicy::default());
/// let metrics = layer.metrics();
/// // ... serve requests ...
/// let snap = metrics.snapshot();
/// assert_eq!(snap.requests, 0);
/// ```
#[derive(Clone)]
pub struct RetryMetrics {
    pub(crate) counters: Arc<Counters>,
}

impl fmt::Debug for RetryMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl RetryMetrics {
    /// The counters' values now (each read atomically; together, approximately).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let c = &self.counters;
        let outcome = |o: Outcome| c.outcomes[o.index()].load(Relaxed);
        MetricsSnapshot {
            requests: c.requests.load(Relaxed),
            retries: c.retries.load(Relaxed),
            first_try: outcome(Outcome::FirstTry),
            succeeded_after_retry: outcome(Outcome::SucceededAfterRetry),
            exhausted: outcome(Outcome::Exhausted),
            deadline: outcome(Outcome::Deadline),
            budget_exhausted: outcome(Outcome::BudgetExhausted),
            not_replayable: outcome(Outcome::NotReplayable),
            fenced: outcome(Outcome::Fenced),
            non_retryable: outcome(Outcome::NonRetryable),
            attempts_histogram: std::array::from_fn(|i| c.histogram[i].load(Relaxed)),
            buffered_bytes: c.buffered_bytes.load(Relaxed),
            peak_buffered_bytes: c.peak_buffered_bytes.load(Relaxed),
        }
    }
}

/// The values of a layer's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Requests the layer was called with.
    pub requests: u64,
    /// Replays made (attempts after the first).
    pub retries: u64,
    /// Requests that ended with outcome `first_try`.
    pub first_try: u64,
    /// ... `succeeded_after_retry`.
    pub succeeded_after_retry: u64,
    /// ... `exhausted`.
    pub exhausted: u64,
    /// ... `deadline`.
    pub deadline: u64,
    /// ... `budget_exhausted`.
    pub budget_exhausted: u64,
    /// ... `not_replayable`.
    pub not_replayable: u64,
    /// ... `fenced`.
    pub fenced: u64,
    /// ... `non_retryable`.
    pub non_retryable: u64,
    /// Finished requests by attempts made: index 0 = one attempt, the last bucket =
    /// [`HISTOGRAM_BUCKETS`] or more.
    pub attempts_histogram: [u64; HISTOGRAM_BUCKETS],
    /// Bytes buffered for replay right now, all requests together (a gauge).
    pub buffered_bytes: usize,
    /// The highest `buffered_bytes` seen.
    pub peak_buffered_bytes: usize,
}
