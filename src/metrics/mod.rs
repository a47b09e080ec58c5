//! What the layer counts, readable without a tracing subscriber: [`RetryMetrics`] (from
//! [`SqliteRetryLayer::metrics`](crate::SqliteRetryLayer::metrics)) and its
//! [`MetricsSnapshot`]; [`RetryOutcome`], the response extension that says how each request
//! ended, with its [`Outcome`]. With the `metrics` feature the same figures also go through
//! the `metrics` facade (`recorder`, with the feature).

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod recorder;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::admission::{AdmissionLimit, Admissions};
pub use crate::attempt::{Outcome, RetryOutcome};
use crate::body::InFlight;

/// Number of buckets in [`MetricsSnapshot::attempts_histogram`]; the last one counts that many
/// attempts or more.
pub const HISTOGRAM_BUCKETS: usize = 16;

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    queued: AtomicU64,
    /// Requests answered at their one attempt (`first_try`, one attempt): the common case,
    /// counted once here rather than in both `outcomes` and the histogram's first bucket (one
    /// atomic add per request fewer on a line every request of the layer shares).
    first_try_once: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    histogram: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl Counters {
    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn queued(&self) {
        self.queued.fetch_add(1, Relaxed);
    }

    pub(crate) fn finished(&self, outcome: Outcome, attempts: u32) {
        if outcome == Outcome::FirstTry && attempts == 1 {
            self.first_try_once.fetch_add(1, Relaxed);
            return;
        }
        self.outcomes[outcome.index()].fetch_add(1, Relaxed);
        if attempts > 0 {
            let bucket = (attempts as usize - 1).min(HISTOGRAM_BUCKETS - 1);
            self.histogram[bucket].fetch_add(1, Relaxed);
        }
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
    stats: Arc<Stats>,
}

/// What a layer, its clones, their services and its [`RetryMetrics`] handles share: the
/// counters, the buffer account and the admission limits, behind one `Arc`, so that a handle
/// kept in an axum state (cloned with it for every request) costs one reference count.
pub(crate) struct Stats {
    pub(crate) counters: Counters,
    /// Also held by each body copy, for the bytes it gives back when dropped.
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) admissions: Admissions,
}

impl Stats {
    pub(crate) fn new(admissions: Admissions) -> Self {
        Self {
            counters: Counters::default(),
            in_flight: Arc::default(),
            admissions,
        }
    }

    /// A handle on these figures.
    pub(crate) fn handle(self: &Arc<Self>) -> RetryMetrics {
        RetryMetrics {
            stats: self.clone(),
        }
    }
}

impl fmt::Debug for RetryMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl RetryMetrics {
    /// The routes writer admission has limited so far, each with its method, route template
    /// and the attempts in flight it allows now (see [`AdmissionLimit`]), sorted by route
    /// template, then method; empty while no route with a template has failed retryably (or
    /// with [`Admission::Off`](crate::policy::Admission::Off)).
    ///
    /// ```
    /// # use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
    /// let metrics = SqliteRetryLayer::new(RetryPolicy::default()).metrics();
    /// assert!(metrics.admission_limits().is_empty());
    /// ```
    pub fn admission_limits(&self) -> Vec<AdmissionLimit> {
        self.stats.admissions.limits()
    }

    /// The counters' values now (each read atomically; together, approximately).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let c = &self.stats.counters;
        let once = c.first_try_once.load(Relaxed);
        let outcome = |o: Outcome| {
            c.outcomes[o.index()].load(Relaxed) + if o == Outcome::FirstTry { once } else { 0 }
        };
        MetricsSnapshot {
            requests: c.requests.load(Relaxed),
            retries: c.retries.load(Relaxed),
            queued: c.queued.load(Relaxed),
            first_try: outcome(Outcome::FirstTry),
            succeeded_after_retry: outcome(Outcome::SucceededAfterRetry),
            exhausted: outcome(Outcome::Exhausted),
            deadline: outcome(Outcome::Deadline),
            budget_exhausted: outcome(Outcome::BudgetExhausted),
            not_replayable: outcome(Outcome::NotReplayable),
            fenced: outcome(Outcome::Fenced),
            non_retryable: outcome(Outcome::NonRetryable),
            cancelled: outcome(Outcome::Cancelled),
            attempts_histogram: std::array::from_fn(|i| {
                c.histogram[i].load(Relaxed) + if i == 0 { once } else { 0 }
            }),
            buffered_bytes: self.stats.in_flight.bytes(),
            peak_buffered_bytes: self.stats.in_flight.peak(),
        }
    }
}

/// The values of a layer's counters at one moment.
///
/// The counters add up. Once no request is in flight:
///
/// - every request has exactly one outcome: `requests` is the sum of the nine outcome
///   counters (a request whose future was dropped counts as `cancelled`);
/// - `retries` is the number of replays actually started (counted when the replay is handed
///   to the inner service, not when it is decided: a request cancelled during its backoff made
///   no replay), which is the sum over finished requests of `attempts - 1` for a layer that is
///   not the outer one of a nested pair (an outer layer records the inner one's outcome and
///   attempts, and replays nothing itself);
/// - the histogram counts every finished request that made at least one attempt (a request
///   that never reached the inner service, because its deadline passed while it waited for
///   readiness or the inner service failed in `poll_ready`, made none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Requests the layer was called with.
    pub requests: u64,
    /// Replays started (attempts after the first).
    pub retries: u64,
    /// Requests that waited for a writer-admission slot (see
    /// [`RetryPolicy::admission`](crate::RetryPolicy::admission)).
    pub queued: u64,
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
    /// ... `cancelled` (the response future was dropped before it finished).
    pub cancelled: u64,
    /// Finished requests by attempts made: index 0 = one attempt, the last bucket =
    /// [`HISTOGRAM_BUCKETS`] or more (requests that made no attempt are not in it).
    pub attempts_histogram: [u64; HISTOGRAM_BUCKETS],
    /// Bytes buffered for replay right now, all requests together (a gauge).
    pub buffered_bytes: usize,
    /// The highest `buffered_bytes` seen.
    pub peak_buffered_bytes: usize,
}

impl MetricsSnapshot {
    /// Requests that have an outcome: the sum of the outcome counters.
    ///
    /// ```
    /// # use tower_sqlite_retry::metrics::MetricsSnapshot;
    /// let snap = MetricsSnapshot::default();
    /// assert_eq!(snap.requests, snap.finished() + snap.in_flight());
    /// ```
    pub fn finished(&self) -> u64 {
        self.first_try
            + self.succeeded_after_retry
            + self.exhausted
            + self.deadline
            + self.budget_exhausted
            + self.not_replayable
            + self.fenced
            + self.non_retryable
            + self.cancelled
    }

    /// Requests still without an outcome (in flight when the snapshot was taken; the counters
    /// are read one by one, so under load this is approximate).
    pub fn in_flight(&self) -> u64 {
        self.requests.saturating_sub(self.finished())
    }
}
