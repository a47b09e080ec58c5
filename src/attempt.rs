//! Request and response extensions: `Attempt` on every attempt, `RetryOutcome` on the answer.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::FromRequestParts;
use http::request::Parts;

/// The request extension on every attempt: which attempt this is (1-based) and how many are
/// allowed.
///
/// Handlers extract it directly (without the layer it reads as attempt 1 of 1):
///
/// ```
/// use tower_sqlite_retry::Attempt;
///
/// async fn handler(attempt: Attempt) -> String {
///     format!("attempt {} of {}", attempt.number(), attempt.max())
/// }
/// ```
///
/// # The side-effect fence
///
/// A replay re-runs the whole handler. Once a handler has done something a replay must not
/// repeat (committed a transaction, sent an email, called another service), it calls
/// [`Attempt::fence`]: a retryable failure after that point is answered as it is, without
/// replay (outcome `fenced`).
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// # use tower_sqlite_retry::{Attempt, DbError};
/// # async fn send_receipt() {}
/// async fn checkout(attempt: Attempt, db: sqlx::SqlitePool) -> Result<(), DbError> {
///     let mut tx = db.begin().await?;
///     // ... read, then write ...
///     tx.commit().await?;
///     attempt.fence(); // committed: never replay this request from here on
///     send_receipt().await;
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct Attempt {
    number: u32,
    max: u32,
    fence: Option<Arc<AtomicBool>>,
}

impl Attempt {
    pub(crate) fn new(number: u32, max: u32, fence: Option<Arc<AtomicBool>>) -> Self {
        Self { number, max, fence }
    }

    /// This attempt's number, 1 for the first.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The most attempts this request may get.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Whether this is a replay (attempt 2 or later).
    pub fn is_replay(&self) -> bool {
        self.number > 1
    }

    /// Declares that a replay of this request is unsafe from here on. Idempotent.
    pub fn fence(&self) {
        if let Some(f) = &self.fence {
            f.store(true, Ordering::Release);
        }
    }

    /// Whether [`fence`](Self::fence) was called for this request.
    pub fn is_fenced(&self) -> bool {
        self.fence
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Acquire))
    }
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("number", &self.number)
            .field("max", &self.max)
            .field("fenced", &self.is_fenced())
            .finish()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Attempt {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Attempt>()
            .cloned()
            .unwrap_or_else(|| Attempt::new(1, 1, None)))
    }
}

/// How a request ended, as seen by the layer (the `retry.outcome` field in tracing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The first attempt was the last: it succeeded or needed no replay.
    FirstTry,
    /// A replay succeeded.
    SucceededAfterRetry,
    /// Every allowed attempt failed retryably.
    Exhausted,
    /// The next backoff would have ended past the deadline.
    Deadline,
    /// The retry budget refused the replay.
    BudgetExhausted,
    /// The request could not be replayed (body over the cap, upgrade, CONNECT).
    NotReplayable,
    /// The handler called [`Attempt::fence`] before failing retryably.
    Fenced,
    /// After at least one replay, the last attempt failed in a way a replay cannot cure: a
    /// `4xx` or `5xx` without the marker (a constraint violation's `409`, say), or an error
    /// the classifier refused.
    NonRetryable,
}

impl Outcome {
    /// The stable name used in tracing (`first_try`, `succeeded_after_retry`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::FirstTry => "first_try",
            Outcome::SucceededAfterRetry => "succeeded_after_retry",
            Outcome::Exhausted => "exhausted",
            Outcome::Deadline => "deadline",
            Outcome::BudgetExhausted => "budget_exhausted",
            Outcome::NotReplayable => "not_replayable",
            Outcome::Fenced => "fenced",
            Outcome::NonRetryable => "non_retryable",
        }
    }

    pub(crate) const ALL: [Outcome; 8] = [
        Outcome::FirstTry,
        Outcome::SucceededAfterRetry,
        Outcome::Exhausted,
        Outcome::Deadline,
        Outcome::BudgetExhausted,
        Outcome::NotReplayable,
        Outcome::Fenced,
        Outcome::NonRetryable,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The response extension the layer puts on every response it returns: attempts made, total
/// backoff, and the outcome.
///
/// Its presence also tells an outer `SqliteRetryLayer` that an inner one already handled
/// retries, so nested layers never multiply attempts.
///
/// ```
/// # use tower_sqlite_retry::{Outcome, RetryOutcome};
/// fn log(res: &http::Response<()>) {
///     if let Some(o) = res.extensions().get::<RetryOutcome>() {
///         println!("{} attempts, {:?} waiting: {}", o.attempts(), o.total_delay(), o.outcome());
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryOutcome {
    pub(crate) attempts: u32,
    pub(crate) total_delay: Duration,
    pub(crate) outcome: Outcome,
}

impl RetryOutcome {
    /// Attempts made, the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The sum of the backoff delays slept.
    pub fn total_delay(&self) -> Duration {
        self.total_delay
    }

    /// How the request ended.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }
}
