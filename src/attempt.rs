//! Request and response extensions: `Attempt` on every attempt, `RetryOutcome` on the answer.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

#[cfg(feature = "axum")]
use axum::extract::FromRequestParts;

use crate::admission::{Admitted, RouteLimit};
use crate::route::Route;

mod in_request;
mod slot;
mod turns;
pub use in_request::{InRequest, in_request};
use slot::{HoldsSlot, SlotState};
pub(crate) use turns::{TurnsHeld, register_writers_waiting, writers_waiting};

/// The synchronization types `slot.rs` uses: std's here, shuttle's in its model test.
mod sync {
    pub(super) use std::sync::atomic::{AtomicBool, Ordering};
    pub(super) use std::sync::{Arc, Mutex, MutexGuard};
}

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
    request: Option<Arc<RequestState>>,
}

/// What the layer and every attempt of one request share: the fence and the admission slot
/// (in [`SlotState`]), the deadline, and (for nested layers) whether an inner layer took the
/// request over and how it ended there.
///
/// Every request the layer handles has one, replayable or not, from the moment its response
/// future is made: the slot, the fence and the claim each live here and nowhere else, so that
/// the fence, the end of the request and the drop of its future give the slot back by one path
/// ([`release_slot`](Self::release_slot)).
pub(crate) struct RequestState {
    /// The retry budget this request deposited into (its address), or 0.
    budget: usize,
    /// The fence and the slot, this request's and (through its outer state) its outer
    /// layers'.
    slot: SlotState<RequestState>,
    claimed: AtomicBool,
    /// The inner layer's result: outcome index + 1 in the high 32 bits (0 = none yet),
    /// attempts in the low 32.
    inner: AtomicU64,
    /// When the request's time is up: set once, when its body is in.
    deadline: OnceLock<Option<Instant>>,
    /// What names the request (method, route template) in tracing, metrics and admission.
    route: Route,
    /// The write turns the request holds now (set by the write path's `Turn`).
    turns: TurnsHeld,
}

impl HoldsSlot for RequestState {
    type Admitted = Admitted;
    type Limit = Arc<RouteLimit>;

    fn slot_state(&self) -> &SlotState<Self> {
        &self.slot
    }
}

impl RequestState {
    /// The state of a new request of the layer `layer` (the address of its shared state),
    /// depositing into the budget `budget` (its address, or 0), taken over from an outer
    /// layer's request `outer`, if any.
    pub(crate) fn new(
        layer: usize,
        budget: usize,
        outer: Option<Arc<RequestState>>,
        route: Route,
    ) -> Self {
        Self {
            budget,
            slot: SlotState::new(layer, outer),
            claimed: AtomicBool::new(false),
            inner: AtomicU64::new(0),
            deadline: OnceLock::new(),
            route,
            turns: TurnsHeld::default(),
        }
    }

    /// The request's method and route template.
    pub(crate) fn route(&self) -> &Route {
        &self.route
    }

    /// The write turns the request holds now.
    pub(crate) fn turns(&self) -> &TurnsHeld {
        &self.turns
    }

    /// Whether the outer layer this request came from already deposited into the same budget
    /// for it (nested layers sharing one budget deposit once per request).
    pub(crate) fn outer_deposited(&self) -> bool {
        self.budget != 0 && self.outer().is_some_and(|o| o.budget == self.budget)
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.slot.is_fenced()
    }

    /// Declares a replay unsafe from here on and gives back the request's slot and those of
    /// the outer layers it was taken over from: its transaction is over.
    pub(crate) fn fence(&self) {
        self.slot.fence();
    }

    /// The request's deadline, once its body is in (`None` before, or when the deadline is
    /// too far to represent).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline.get().copied().flatten()
    }

    /// Starts the request's clock: called once, when its body is in.
    pub(crate) fn start(&self, deadline: Option<Instant>) {
        let _ = self.deadline.set(deadline);
    }

    /// The request state of the outer layer this one was taken over from.
    pub(crate) fn outer(&self) -> Option<&RequestState> {
        self.slot.outer().map(|o| &**o)
    }

    /// An inner layer takes this request over: the layer that made this state must pass its
    /// answer through, whatever it is.
    pub(crate) fn claim(&self) {
        self.claimed.store(true, Ordering::Release);
    }

    pub(crate) fn is_claimed(&self) -> bool {
        self.claimed.load(Ordering::Acquire)
    }

    /// The inner layer that claimed the request reports how it ended.
    pub(crate) fn report(&self, outcome: Outcome, attempts: u32) {
        let packed = ((outcome.index() as u64 + 1) << 32) | u64::from(attempts);
        self.inner.store(packed, Ordering::Release);
    }

    /// What the inner layer reported, if it did.
    pub(crate) fn reported(&self) -> Option<(Outcome, u32)> {
        let packed = self.inner.load(Ordering::Acquire);
        let index = (packed >> 32) as usize;
        let outcome = *Outcome::ALL.get(index.checked_sub(1)?)?;
        Some((outcome, packed as u32))
    }

    /// Whether the request has yet to queue for a slot.
    pub(crate) fn needs_slot(&self) -> bool {
        self.slot.needs_slot()
    }

    /// Keeps the request's admission slot until the fence or the end of the request.
    pub(crate) fn hold(&self, limit: Arc<RouteLimit>, admitted: Admitted) {
        self.slot.hold(limit, admitted);
    }

    /// Gives the admission slot back, if the request still holds it. Idempotent.
    pub(crate) fn release_slot(&self) {
        self.slot.release();
    }

    /// Whether the request holds a slot now, with requests queued behind it.
    pub(crate) fn holds_slot_with_queue(&self) -> bool {
        self.slot.holding().is_some_and(|l| l.waiting() > 0)
    }

    /// Counts how an attempt made under the request's slot ended in its route's window
    /// (`collided`: it failed retryably). Nothing when the request was never admitted.
    pub(crate) fn record(&self, collided: bool) {
        if let Some(limit) = self.slot.limit() {
            limit.record(collided);
        }
    }
}

thread_local! {
    /// The request whose handler is being polled on this thread, if any.
    static CURRENT: Cell<Option<Arc<RequestState>>> = const { Cell::new(None) };
}

/// Runs `f` with `state` as this thread's current request (the write path reads it with
/// [`current_request`]); the previous one, if any (an outer layer's), is restored after, even
/// if `f` panics.
pub(crate) fn with_current<R>(state: &Arc<RequestState>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<RequestState>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            // The request set here is dropped outside the thread-local's access.
            let _ours = CURRENT.with(|c| c.replace(previous));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(state.clone()))));
    f()
}

/// The request whose handler is being polled on this thread (inside [`with_current`]).
pub(crate) fn current_request() -> Option<Arc<RequestState>> {
    CURRENT.with(|c| {
        let current = c.take();
        let copy = current.clone();
        c.set(current);
        copy
    })
}

/// Whether the request whose code runs now holds a write transaction open (the turn of a
/// `WriteTransaction` or a `WriteTurn`): what the classifiers ask of a `SQLITE_BUSY`.
#[cfg_attr(not(driver), allow(dead_code, reason = "the classifiers ask it"))]
pub(crate) fn current_request_holds_a_turn() -> bool {
    current_request().is_some_and(|request| request.turns.any())
}

impl Attempt {
    pub(crate) fn new(number: u32, max: u32, request: Option<Arc<RequestState>>) -> Self {
        Self {
            number,
            max,
            request,
        }
    }

    /// The per-request state of the layer that made this attempt.
    pub(crate) fn request_state(&self) -> Option<&Arc<RequestState>> {
        self.request.as_ref()
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
    ///
    /// On a route under writer admission it also gives the request's slot back at once (the
    /// slots of outer layers that handed the request over included): its transaction is over,
    /// so the next request in the queue may start while this handler finishes its response.
    /// This holds for a request the layer passes through without retries too (one attempt
    /// allowed, an upgrade, a body over the cap).
    pub fn fence(&self) {
        if let Some(r) = &self.request {
            r.fence();
        }
    }

    /// Whether [`fence`](Self::fence) was called for this request.
    pub fn is_fenced(&self) -> bool {
        self.request.as_ref().is_some_and(|r| r.is_fenced())
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

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for Attempt {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
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
    /// the classifier refused; or the inner service failed before an attempt could start
    /// (an error from its `poll_ready`).
    NonRetryable,
    /// The response future was dropped before it finished: the client went away, or a timeout
    /// outside the layer fired. Never on a response; counted and traced only.
    Cancelled,
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
            Outcome::Cancelled => "cancelled",
        }
    }

    pub(crate) const ALL: [Outcome; 9] = [
        Outcome::FirstTry,
        Outcome::SucceededAfterRetry,
        Outcome::Exhausted,
        Outcome::Deadline,
        Outcome::BudgetExhausted,
        Outcome::NotReplayable,
        Outcome::Fenced,
        Outcome::NonRetryable,
        Outcome::Cancelled,
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

/// The response extension the layer puts on every response it replayed or gave up on:
/// attempts made, total backoff, and the outcome.
///
/// A response answered by its first attempt, as it is (outcome `first_try`), goes back
/// untouched: no extension, no allocation; [`RetryMetrics`](crate::RetryMetrics) counts it.
/// So `None` means "the first attempt's own answer" (or no layer at all).
///
/// Its presence also tells an outer `SqliteRetryLayer` that an inner one already handled
/// retries (besides the claim the inner layer makes on the way in), so nested layers never
/// multiply attempts.
///
/// ```
/// # use tower_sqlite_retry::metrics::{Outcome, RetryOutcome};
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
