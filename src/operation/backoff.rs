//! [`Backoff`]: the schedule as a value the caller drives.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use std::sync::Arc;

use super::admit::{
    AdmitError, MAX_ADMISSION_WAIT, Place, Slot, block_on_for, new_chain, owner, task_or_thread,
};
use super::{Operation, report};
use crate::admission::{Entry, RouteLimit};
use crate::classify::{ClassifyError, Retryable};
use crate::decide::{After, Decision, Verdict, decide};
use crate::metrics::Outcome;

/// The retry schedule of one [`Operation`], driven by the caller: given an error, the delay
/// before the next try, or `None`.
///
/// `None` means stop: the error is not retryable (by the operation's classifier, the same
/// tables as the layer's), or the policy's attempts, deadline or budget are used up. Past a
/// `None`, the next error starts a new streak (a loop is never stuck on `None`).
///
/// - **The loop owns the timing**: no runtime, no sleep in here; the caller sleeps the delay,
///   with whatever clock it has ([`std::thread::sleep`], `tokio::time::sleep`).
/// - **A streak** is the run of consecutive errors since the last [`reset`](Self::reset): the
///   policy's `max_attempts` and `deadline` bound one streak (the deadline counts from its
///   first error), and the budget pays for each retry. Call `reset()` after every success.
/// - **The cap is explicit and holds**: each delay is `min(cap, base · 2^(n-1))` with the
///   policy's jitter, capped again after it ([`RetryPolicy::max_delay`]); saturating at any
///   attempt count (the billionth consecutive error waits the cap, as the tenth does).
///   `max_attempts(u32::MAX)` puts no limit on a streak's attempts (the deadline still
///   bounds it: `deadline(Duration::MAX)` for none).
/// - **Free on success**: `reset()` reads no clock and allocates nothing (without the
///   `metrics` feature; with it, the facade's labels: six small allocations).
///
/// A dispatcher that polls a SQLite queue:
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use std::time::Duration;
/// use tower_sqlite_retry::{Operation, RetryPolicy};
///
/// async fn claim(db: &sqlx::SqlitePool) -> Result<Option<i64>, sqlx::Error> {
///     // ... read the oldest pending item, mark it taken ...
/// #   let _ = db; Ok(None)
/// }
///
/// async fn dispatcher(db: sqlx::SqlitePool, op: Operation) -> Result<(), Box<dyn std::error::Error>> {
///     let mut backoff = op.backoff();
///     # for _ in 0..3 {
///     // once claims collided, they take turns: the slot is held until `slot` is dropped
///     let slot = backoff.admit().await?;
///     match claim(&db).await {
///         Ok(_item) => {
///             backoff.reset();
///             drop(slot); // ... then process it, without the slot
///         }
///         Err(e) => match backoff.next_delay(&e) {
///             Some(delay) => tokio::time::sleep(delay).await,
///             // not retryable (a WARN, counted `non_retryable`), or the streak is over:
///             // keep polling at the cap (or return `e`)
///             None => {
///                 drop(slot);
///                 tokio::time::sleep(backoff.cap()).await;
///             }
///         },
///     }
///     # }
///     # Ok(())
/// }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// #     let policy = RetryPolicy::default().max_delay(Duration::from_millis(500));
/// #     // built once, cloned into each worker
/// #     let op = Operation::new("claim", policy);
/// #     dispatcher(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap(), op.clone()).await.unwrap()
/// # });
/// ```
///
/// [`RetryPolicy::max_delay`]: crate::RetryPolicy::max_delay
pub struct Backoff<C = crate::classify::RetryErrorChain> {
    operation: Operation<C>,
    /// The number of the try running now (1 after a reset), saturating.
    attempt: u32,
    /// When the streak's clock started: its first error (a loop's backoff), or the call (the
    /// wrapper); `None` until then.
    started: Option<Instant>,
    /// The previous delay (for decorrelated jitter).
    previous: Duration,
    /// The delays given in this streak, together.
    slept: Duration,
    /// Why the last retry was given.
    reason: Option<Retryable>,
    /// How the streak ended, once it has (recorded once).
    ended: Option<Outcome>,
    /// Whether a streak is under way that must be recorded if this value is dropped: set by a
    /// call of the wrapper from its start, and by a loop's first error.
    armed: bool,
    /// A loop's backoff (a WARN when it gives up) or a call's (as the layer: ERROR when the
    /// attempts or the deadline run out).
    in_loop: bool,
    /// Drawn from at the first retry (a success never touches it).
    rng: Option<fastrand::Rng>,
    /// The limit whose slot the try running now holds (set by [`admit`](Self::admit), taken
    /// by the try's end): where the try's collision, or its absence, is counted. Not the slot:
    /// the caller's [`Slot`] (or `run`'s scope) holds that.
    pub(super) slotted: Option<Arc<RouteLimit>>,
    /// A loop's place in the queue between a retry's decision and the retry (made at its
    /// first slot).
    place: Option<Arc<Place>>,
}

impl<C> Backoff<C> {
    pub(super) fn of(operation: Operation<C>, in_loop: bool) -> Self {
        Self {
            operation,
            attempt: 1,
            started: None,
            previous: Duration::ZERO,
            slept: Duration::ZERO,
            reason: None,
            ended: None,
            armed: false,
            in_loop,
            rng: None,
            slotted: None,
            place: None,
        }
    }

    /// Waits for a slot of the operation's admission, for the try about to run: hold the
    /// returned [`Slot`] through the try and its backoff, and drop it after (before the work
    /// a success leads to). From the operation's first retryable error on (with the policy's
    /// `Admission::Adaptive`, the default), its tries run at most the learned limit at once,
    /// first come first served, a streak's retry ahead of every first try; the limit follows
    /// AIMD on how many of them collide, and goes away after a quiet time with no collision.
    /// Returns at once, holding nothing, while there is no limit, and when this task (or
    /// thread) already holds a slot of the operation: a try never waits for a slot its own
    /// call chain holds.
    ///
    /// The wait is bounded by the streak's deadline (the policy's deadline from now for a
    /// first try; [`MAX_ADMISSION_WAIT`](super::MAX_ADMISSION_WAIT) without one). Past it, the
    /// try must not run: [`AdmitError::TimedOut`], and the streak ends (`deadline`, counted and
    /// logged at WARN as any give-up of a loop).
    ///
    /// Needs a tokio runtime (its timer bounds the wait): outside one it returns
    /// [`AdmitError::NoRuntime`] at once, whatever the contention; a thread calls
    /// [`admit_blocking`](Self::admit_blocking) instead.
    pub async fn admit(&mut self) -> Result<Slot, AdmitError> {
        if self.operation.retry_policy().admission == crate::policy::Admission::Off {
            return Ok(Slot::none());
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(AdmitError::NoRuntime {
                operation: self.operation.name().to_owned(),
            });
        }
        let (limit, acquire, most) = match self.enter() {
            Ok(slot) => return Ok(slot),
            Err(queued) => queued,
        };
        let waited = Instant::now();
        let got = tokio::time::timeout(most, acquire).await.ok();
        self.admitted(limit, got, waited.elapsed())
    }

    /// [`admit`](Self::admit) for a call of [`Operation::run`]: the same, without the runtime
    /// check (`run` sleeps on tokio's timer in any case). `Err` at the deadline.
    pub(super) async fn admit_call(&mut self, chain: &mut Option<u64>) -> Result<Slot, ()> {
        if self.operation.retry_policy().admission == crate::policy::Admission::Off {
            return Ok(Slot::none());
        }
        let (limit, acquire, most) = match self.enter_as(|| *chain.insert(new_chain())) {
            Ok(slot) => return Ok(slot),
            Err(queued) => queued,
        };
        let waited = Instant::now();
        let got = tokio::time::timeout(most, acquire).await.ok();
        self.admitted(limit, got, waited.elapsed()).map_err(|_| ())
    }

    /// A slot for a call's retry, only if one is free now (a call that began before its
    /// operation had a limit joins it at its next try, never waiting: it holds its last error
    /// meanwhile, which a wait would keep across an await).
    pub(super) fn admit_if_free(&mut self, chain: &mut Option<u64>) -> Slot {
        if self.operation.retry_policy().admission == crate::policy::Admission::Off {
            return Slot::none();
        }
        match self.enter_as(|| *chain.get_or_insert_with(new_chain)) {
            Ok(slot) => slot,
            // the wait is dropped at once: out of the queue
            Err(_) => Slot::none(),
        }
    }

    /// [`admit`](Self::admit) for a thread (rusqlite, Diesel, any synchronous driver): the
    /// same queue, bounds and counting; the thread parks while it waits. Needs no runtime.
    pub fn admit_blocking(&mut self) -> Result<Slot, AdmitError> {
        self.admit_blocking_as(owner)
    }

    /// [`admit_blocking`](Self::admit_blocking) for the call chain `owner` gives.
    pub(super) fn admit_blocking_as(
        &mut self,
        owner: impl FnOnce() -> u64,
    ) -> Result<Slot, AdmitError> {
        if self.operation.retry_policy().admission == crate::policy::Admission::Off {
            return Ok(Slot::none());
        }
        let (limit, acquire, most) = match self.enter_as(owner) {
            Ok(slot) => return Ok(slot),
            Err(queued) => queued,
        };
        let waited = std::time::Instant::now();
        let got = block_on_for(acquire, most);
        self.admitted(limit, got, waited.elapsed())
    }

    /// The slot at once (none needed, free, or this call chain's own), or the queue's wait,
    /// its limit and how long it may last.
    #[allow(clippy::type_complexity)]
    fn enter(&mut self) -> Result<Slot, (Arc<RouteLimit>, crate::admission::Acquire, Duration)> {
        self.enter_as(owner)
    }

    /// [`enter`](Self::enter) for the call chain `owner` gives (asked only with a limit).
    #[allow(clippy::type_complexity)]
    pub(super) fn enter_as(
        &mut self,
        owner: impl FnOnce() -> u64,
    ) -> Result<Slot, (Arc<RouteLimit>, crate::admission::Acquire, Duration)> {
        if self.ended.is_some() {
            // A streak that ended: the next try is a first try again (its wait counts from
            // now, behind the queue).
            self.clear();
        }
        let retry = self.armed && self.attempt > 1;
        if retry
            && let Some(place) = &self.place
            && let Some((admitted, limit)) = place.take()
        {
            // the slot this streak's last try dropped: the retry keeps its place
            self.slotted = Some(Arc::clone(&limit));
            return Ok(Slot::held(admitted, limit).in_place(place));
        }
        let Some(limit) = self.operation.limit() else {
            return Ok(Slot::none());
        };
        let owner = owner();
        // a call's new chain also runs within its task's (or thread's): a loop's slot there
        // covers it
        let within = task_or_thread();
        match limit.enter(owner, within, retry) {
            Entry::Nested => Ok(Slot::none()),
            Entry::Admitted(admitted) => {
                self.slotted = Some(Arc::clone(&limit));
                Ok(self.placed(Slot::held(admitted, limit)))
            }
            Entry::Queued(acquire) => {
                let now = Instant::now();
                // a streak's retry: its deadline; a first try: the policy's from now
                let start = match self.started {
                    Some(started) if self.armed => started,
                    _ => now,
                };
                let most = match start.checked_add(self.operation.retry_policy().deadline) {
                    Some(end) => end.saturating_duration_since(now),
                    None => MAX_ADMISSION_WAIT,
                };
                Err((limit, acquire, most))
            }
        }
    }

    /// The end of a wait in the queue: the slot, or the streak's end at its deadline.
    fn admitted(
        &mut self,
        limit: Arc<RouteLimit>,
        got: Option<crate::admission::Admitted>,
        waited: Duration,
    ) -> Result<Slot, AdmitError> {
        self.operation.queued(waited);
        match got {
            Some(admitted) => {
                self.slotted = Some(Arc::clone(&limit));
                Ok(self.placed(Slot::held(admitted, limit)))
            }
            None => {
                self.timed_out();
                Err(AdmitError::TimedOut {
                    operation: self.operation.name().to_owned(),
                    waited,
                })
            }
        }
    }

    /// A loop's slot, linked to the streak's place (a call's scope holds its own).
    fn placed(&mut self, slot: Slot) -> Slot {
        if !self.in_loop {
            return slot;
        }
        let place = self.place.get_or_insert_with(Arc::default);
        slot.in_place(place)
    }

    /// No slot within the deadline: the try does not run, and the streak (a first try's:
    /// one of no attempt) ends at its deadline.
    pub(super) fn timed_out(&mut self) {
        let now = Instant::now();
        if !self.armed {
            self.armed = true;
            self.operation.deposit();
        }
        let started = *self.started.get_or_insert(now);
        self.attempt = self.attempt.saturating_sub(1);
        self.end(Outcome::Deadline, now.saturating_duration_since(started));
    }

    /// Counts how the try that ran under a slot ended, in its limit's window.
    fn record(&mut self, collided: bool) {
        if let Some(limit) = self.slotted.take()
            && let Some(moved) = limit.record(collided)
        {
            self.operation.limit_moved(moved);
        }
    }

    /// Starts the clock of a call now (the wrapper's deadline counts from its call).
    pub(super) fn start_call(&mut self, now: Instant) {
        self.started = Some(now);
        self.armed = true;
        self.operation.deposit();
    }

    /// When the clock started, if it has.
    pub(super) fn started_at(&self) -> Option<Instant> {
        self.started
    }

    /// Starts the clock without starting a call (a tower service's own policy, whose clone
    /// for the request starts the call).
    pub(super) fn set_started(&mut self, now: Instant) {
        self.started = Some(now);
    }

    /// Whether a call (or a streak) is under way.
    pub(super) fn is_call(&self) -> bool {
        self.armed
    }

    /// The delay before the next try after `error`, or `None` to stop (not retryable; the
    /// attempts, the deadline or the budget used up). A retry is counted, its event emitted
    /// (at the policy's [`replay_event_level`](crate::RetryPolicy::replay_event_level)), and
    /// the budget pays for it; a stop is logged once (WARN) and counted with its outcome.
    pub fn next_delay<E>(&mut self, error: &E) -> Option<Duration>
    where
        C: ClassifyError<E>,
    {
        let reason = self.operation.classify(error);
        self.after_error(reason, Some(std::any::type_name::<E>()))
    }

    /// [`next_delay`](Self::next_delay) for an error already classified: `Some` with why it is
    /// retryable, `None` for an error that is not.
    pub fn next_delay_for(&mut self, retryable: Option<Retryable>) -> Option<Duration> {
        self.after_error(retryable, None)
    }

    /// After an error (of the type named, in the give-up's event when it is not retryable).
    fn after_error(
        &mut self,
        reason: Option<Retryable>,
        error_type: Option<&'static str>,
    ) -> Option<Duration> {
        if self.ended.is_some() {
            // A streak that ended: this error starts the next one.
            self.clear();
        }
        let now = Instant::now();
        if !self.armed {
            self.armed = true;
            self.operation.deposit();
        }
        let started = *self.started.get_or_insert(now);
        let retryable = reason.is_some();
        // A try holding a slot while others queue behind it backs off briefly at first (they
        // wait out its backoff too), as the layer's requests do.
        let queue_behind = self.slotted.as_ref().is_some_and(|l| l.waiting() > 0);
        self.record(retryable);
        if retryable {
            // the operation meets contention: its tries queue from now on
            self.operation.contended(now);
        }
        let policy = self.operation.retry_policy();
        let verdict = if retryable {
            Verdict::Retryable
        } else {
            Verdict::Final { failed: true }
        };
        let remaining = started
            .checked_add(policy.deadline)
            .map(|end| end.saturating_duration_since(now));
        // `u32::MAX` attempts means no limit: the counter saturates there, and a streak
        // that long (weeks at the smallest delay) goes on at the cap.
        let attempt = match policy.max_attempts {
            u32::MAX => self.attempt.min(u32::MAX - 1),
            _ => self.attempt,
        };
        let after = After {
            attempt,
            max_attempts: policy.max_attempts,
            verdict,
            not_replayable: false,
            fenced: false,
            remaining,
        };
        let cap = match queue_behind {
            true if self.attempt <= crate::future::SHORT_BACKOFF_ATTEMPTS => policy
                .base_delay
                .saturating_mul(crate::future::ADMITTED_BACKOFF_FACTOR),
            _ => policy.max_delay,
        };
        let (attempt, previous) = (self.attempt, self.previous);
        let rng = self.rng.get_or_insert_with(fastrand::Rng::new);
        let decision = decide(after, || policy.delay_with(attempt, previous, cap, rng));
        if retryable {
            self.reason = reason;
        }
        let outcome = match decision {
            Decision::Retry { delay } => {
                if self.operation.withdraw() {
                    self.attempt = self.attempt.saturating_add(1);
                    self.previous = delay;
                    self.slept = self.slept.saturating_add(delay);
                    self.operation.retried(
                        self.attempt,
                        delay,
                        now.saturating_duration_since(started),
                        self.reason.as_ref(),
                    );
                    if let Some(place) = &self.place {
                        // the try's slot, dropped before the retry, waits for it
                        place.retrying();
                    }
                    return Some(delay);
                }
                Outcome::BudgetExhausted
            }
            Decision::Finish(outcome) => outcome,
        };
        // A non-retryable error ends the streak without having been retried: its reason
        // (an earlier retryable error) is not what ended it. It is never a success: counted
        // `non_retryable` even on a first try.
        let outcome = if retryable {
            outcome
        } else {
            self.reason = None;
            Outcome::NonRetryable
        };
        self.end(outcome, now.saturating_duration_since(started));
        if outcome == Outcome::NonRetryable {
            self.operation
                .not_retryable(error_type, self.attempt, self.in_loop);
        }
        None
    }

    /// Records how the streak ended, once.
    fn end(&mut self, outcome: Outcome, elapsed: Duration) {
        if self.ended.is_some() {
            return;
        }
        self.ended = Some(outcome);
        self.armed = false;
        self.slotted = None;
        if let Some(place) = &self.place {
            place.give_back();
        }
        self.operation.finished(report::End {
            outcome,
            attempts: self.attempt,
            elapsed,
            backoff: self.slept,
            reason: self.reason.as_ref(),
            in_loop: self.in_loop,
        });
    }

    /// Ends a call under way with `outcome` (a tower request whose next try never came).
    pub(super) fn abandon(&mut self, outcome: Outcome) {
        if self.armed && self.ended.is_none() {
            let elapsed = self.elapsed();
            // the try the backoff was for was never made
            self.attempt = self.attempt.saturating_sub(1).max(1);
            self.end(outcome, elapsed);
        }
    }

    /// After a success: records it (a first try, or a success after retries) and starts over
    /// (attempt 1, the first delay next). No clock read, no allocation.
    pub fn reset(&mut self) {
        self.record(false);
        if self.ended.is_none() {
            let outcome = if self.attempt > 1 {
                Outcome::SucceededAfterRetry
            } else {
                Outcome::FirstTry
            };
            if !self.armed {
                // a first try that never failed: it still counts as an operation
                self.operation.deposit();
            }
            let elapsed = match (outcome, self.started) {
                (Outcome::SucceededAfterRetry, Some(started)) => started.elapsed(),
                _ => Duration::ZERO,
            };
            self.end(outcome, elapsed);
        }
        self.clear();
    }

    fn clear(&mut self) {
        self.attempt = 1;
        self.started = None;
        self.previous = Duration::ZERO;
        self.slept = Duration::ZERO;
        self.reason = None;
        self.ended = None;
        self.armed = false;
        self.slotted = None;
        if let Some(place) = &self.place {
            place.give_back();
        }
    }

    /// The number of the try that runs next (or now): 1 after a reset, 2 after one retry, ...
    /// Saturates at `u32::MAX`.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The policy's cap on one delay ([`RetryPolicy::max_delay`](crate::RetryPolicy::max_delay)):
    /// what a poller that goes on after a `None` usually waits.
    pub fn cap(&self) -> Duration {
        self.operation.retry_policy().max_delay
    }

    /// Why the last retry was given (the retryable error's code and name), in this streak.
    pub fn reason(&self) -> Option<&Retryable> {
        self.reason.as_ref()
    }

    /// How the streak ended, when the last [`next_delay`](Self::next_delay) said `None`:
    /// `Exhausted`, `Deadline`, `BudgetExhausted`, or `NonRetryable` (`FirstTry` for an error
    /// that was not retryable on the first try).
    pub fn stopped(&self) -> Option<Outcome> {
        self.ended
    }

    /// The delays given in this streak, together.
    pub fn total_delay(&self) -> Duration {
        self.slept
    }

    /// The operation this backoff belongs to.
    pub fn operation(&self) -> &Operation<C> {
        &self.operation
    }

    pub(super) fn elapsed(&self) -> Duration {
        self.started.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

impl<C> Drop for Backoff<C> {
    fn drop(&mut self) {
        if let Some(place) = &self.place {
            place.give_back();
        }
        if self.armed && self.ended.is_none() {
            let elapsed = self.elapsed();
            self.end(Outcome::Cancelled, elapsed);
        }
    }
}

impl<C> fmt::Debug for Backoff<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("operation", &self.operation.name())
            .field("attempt", &self.attempt)
            .field("total_delay", &self.slept)
            .field("reason", &self.reason)
            .field("stopped", &self.ended)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use proptest::prelude::*;
    use tower::retry::budget::TpsBudget;

    use super::*;
    use crate::{Jitter, RetryPolicy};

    const MS: Duration = Duration::from_millis(1);

    fn busy() -> Option<Retryable> {
        Some(Retryable::new("5", "SQLITE_BUSY"))
    }

    fn backoff(policy: RetryPolicy) -> Backoff {
        Operation::new("test", policy).backoff()
    }

    fn jitter_strategy() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::None),
            Just(Jitter::Full),
            Just(Jitter::Equal),
            Just(Jitter::Decorrelated)
        ]
    }

    proptest! {
        /// Whatever the attempt count (the billionth error, `u32::MAX`), the delay is within
        /// the cap and nothing overflows.
        #[test]
        fn never_above_the_cap_at_any_attempt_count(
            base_us in 0u64..2_000_000,
            extra_us in 0u64..5_000_000,
            jitter in jitter_strategy(),
            attempt in prop_oneof![any::<u32>(), u32::MAX - 50..=u32::MAX],
            errors in 1usize..60,
        ) {
            let cap = Duration::from_micros(base_us + extra_us);
            let policy = RetryPolicy::default()
                .base_delay(Duration::from_micros(base_us))
                .max_delay(cap)
                .jitter(jitter)
                .max_attempts(u32::MAX)
                .deadline(Duration::MAX);
            let mut b = backoff(policy);
            b.attempt = attempt.max(1);
            for _ in 0..errors {
                match b.next_delay_for(busy()) {
                    Some(d) => prop_assert!(d <= cap, "{d:?} > {cap:?}"),
                    None => prop_assert!(false, "stopped: {:?}", b.stopped()),
                }
            }
        }

        /// `reset` starts the schedule over: the first delay after it is drawn as the first
        /// of all, whatever came before.
        #[test]
        fn reset_starts_over(errors in 0usize..200) {
            let policy = RetryPolicy::default()
                .base_delay(3 * MS)
                .max_delay(100 * MS)
                .jitter(Jitter::None)
                .max_attempts(u32::MAX)
                .deadline(Duration::MAX);
            let mut b = backoff(policy);
            for _ in 0..errors {
                prop_assert!(b.next_delay_for(busy()).is_some());
            }
            b.reset();
            prop_assert_eq!(b.attempt(), 1);
            prop_assert_eq!(b.total_delay(), Duration::ZERO);
            prop_assert_eq!(b.next_delay_for(busy()), Some(3 * MS));
            prop_assert_eq!(b.attempt(), 2);
        }
    }

    #[test]
    fn doubles_up_to_the_cap_and_stays_there() {
        let policy = RetryPolicy::default()
            .base_delay(10 * MS)
            .max_delay(50 * MS)
            .jitter(Jitter::None)
            .max_attempts(u32::MAX)
            .deadline(Duration::MAX);
        let mut b = backoff(policy);
        let got: Vec<_> = (0..6).map(|_| b.next_delay_for(busy()).unwrap()).collect();
        assert_eq!(got, [10, 20, 40, 50, 50, 50].map(|n| n * MS));
        // duroxide's `100 * 2^n` overflows a u64 at n = 58: this goes on at the cap
        b.attempt = u32::MAX - 2;
        for _ in 0..5 {
            assert_eq!(b.next_delay_for(busy()), Some(50 * MS));
        }
        assert_eq!(b.attempt(), u32::MAX);
    }

    #[test]
    fn attempts_bound_a_streak() {
        let op = Operation::new("test", RetryPolicy::default().max_attempts(3));
        let mut b = op.backoff();
        assert!(b.next_delay_for(busy()).is_some());
        assert!(b.next_delay_for(busy()).is_some());
        assert_eq!(b.attempt(), 3);
        assert_eq!(b.next_delay_for(busy()), None);
        assert_eq!(b.stopped(), Some(Outcome::Exhausted));
        // the next error starts a new streak: a loop is never stuck on `None`
        assert!(b.next_delay_for(busy()).is_some());
        assert_eq!(b.attempt(), 2);
        b.reset();
        let snap = op.metrics().snapshot();
        assert_eq!((snap.requests, snap.exhausted), (2, 1));
        assert_eq!((snap.succeeded_after_retry, snap.retries), (1, 3));
        assert_eq!(snap.requests, snap.finished());
    }

    #[test]
    fn an_error_that_is_not_retryable_is_never_waited_on() {
        let op = Operation::new("test", RetryPolicy::default());
        let mut b = op.backoff();
        // a permanent error on a first try is a give-up, never a success
        assert_eq!(b.next_delay_for(None), None);
        assert_eq!(b.stopped(), Some(Outcome::NonRetryable));
        assert!(b.next_delay_for(busy()).is_some());
        assert_eq!(b.next_delay_for(None), None);
        assert_eq!(b.stopped(), Some(Outcome::NonRetryable));
        assert_eq!(b.reason(), None);
        let snap = op.metrics().snapshot();
        assert_eq!(
            (snap.first_try, snap.non_retryable, snap.retries),
            (0, 2, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_bounds_a_streak_from_its_first_error() {
        let policy = RetryPolicy::default()
            .base_delay(30 * MS)
            .max_delay(30 * MS)
            .jitter(Jitter::None)
            .deadline(100 * MS);
        let mut b = backoff(policy);
        // a long quiet time before the first error does not count
        tokio::time::advance(Duration::from_secs(3600)).await;
        for _ in 0..3 {
            let delay = b.next_delay_for(busy()).unwrap();
            assert_eq!(delay, 30 * MS);
            tokio::time::advance(delay).await;
        }
        // 90 ms in: a 30 ms delay would end past the deadline
        assert_eq!(b.next_delay_for(busy()), None);
        assert_eq!(b.stopped(), Some(Outcome::Deadline));
    }

    #[test]
    fn the_budget_pays_for_each_retry() {
        // no reserve, no share of the deposits: nothing to withdraw
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 0, 0.0));
        let op = Operation::new("test", RetryPolicy::default().budget(budget));
        let mut b = op.backoff();
        assert_eq!(b.next_delay_for(busy()), None);
        assert_eq!(b.stopped(), Some(Outcome::BudgetExhausted));
        // a generous one allows it
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 100, 1.0));
        let mut b = backoff(RetryPolicy::default().budget(budget));
        assert!(b.next_delay_for(busy()).is_some());
    }

    #[test]
    fn a_streak_dropped_midway_is_cancelled_and_a_quiet_one_is_nothing() {
        let op = Operation::new("test", RetryPolicy::default());
        drop(op.backoff());
        assert_eq!(op.metrics().snapshot().requests, 0);
        let mut b = op.backoff();
        assert!(b.next_delay_for(busy()).is_some());
        drop(b);
        let snap = op.metrics().snapshot();
        assert_eq!((snap.requests, snap.cancelled), (1, 1));
    }

    #[test]
    fn jitter_never_goes_past_the_cap() {
        for jitter in [Jitter::Full, Jitter::Equal, Jitter::Decorrelated] {
            let policy = RetryPolicy::default()
                .base_delay(7 * MS)
                .max_delay(20 * MS)
                .jitter(jitter)
                .max_attempts(u32::MAX)
                .deadline(Duration::MAX);
            let mut b = backoff(policy);
            for _ in 0..10_000 {
                assert!(b.next_delay_for(busy()).unwrap() <= 20 * MS, "{jitter:?}");
            }
        }
    }
}
