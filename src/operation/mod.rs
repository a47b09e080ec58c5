//! Outside HTTP: the layer's retry for loops, functions and any tower service.
//!
//! `database is locked` hits every loop and function that writes to SQLite, not only HTTP
//! handlers: a dispatcher polling a queue, a job worker, a function wrapped in a retry. They
//! get the layer's [`RetryPolicy`] (the schedule, the deadline, the budget), its classification
//! (by code, anywhere in the `source()` chain; PostgreSQL's and MySQL's codes too) and its
//! observability, in the shapes such code already has. An [`Operation`] names them: its name
//! stands where the layer has the route, in the events and the metrics.
//!
//! | shape | use |
//! |---|---|
//! | a loop that owns its timing (a dispatcher, a poller) | [`Operation::backoff`]: a [`Backoff`] that says how long to wait after an error, or to stop |
//! | an async function (a claim, a transaction) | [`Operation::run`]: retries the closure, returns its value or an [`OperationError`] |
//! | a tower service whose request is `Clone` (a job processor, an internal service, a unary gRPC client) | [`Operation::policy`] / [`Operation::layer`]: `tower::retry` with the operation's schedule |
//!
//! # What is retried
//!
//! Exactly what the layer replays: the operation's classifier decides, by default
//! [`RetryErrorChain`] (a driver's retryable error anywhere
//! in the error's `source()` chain: `SQLITE_BUSY` and its kin, a pool time-out, PostgreSQL's
//! `40001`/`40P01`, MySQL's `1213`/`1205` with their features). Anything else is returned at
//! once, never waited on. [`Operation::classify_with`] takes another classifier (a closure,
//! [`NeverRetryErrors`](crate::NeverRetryErrors), ...).
//!
//! A retry re-runs the closure from its start, so, as for a replayed request, the failed try
//! must have committed nothing: one transaction, begun inside the closure, committed as its
//! last step (sqlx rolls back a dropped transaction).
//!
//! # Admission: tries that collide take turns
//!
//! As the layer's writer admission does for a route, an operation that meets a retryable error
//! gets a learned limit on its tries in flight (with the policy's
//! [`Admission::Adaptive`](crate::policy::Admission), the default): from then on its tries
//! queue for a slot, first come first served (a streak's retry ahead of every first try), and
//! the limit follows AIMD on how many of them collide. Workers that all claim the oldest row
//! of one queue stop colliding with each other. After a quiet time with no collision (the
//! policy's deadline, within 1 to 60 s) the limit goes away, and the operation's tries run at
//! once again until the next retryable error. [`RetryMetrics::admission_limits`] lists it;
//! the `metrics` feature's gauge `tower_sqlite_retry_admission_limit` follows it.
//!
//! A slot is held by a value the caller sees: [`Operation::run`]'s own scope (the call holds
//! one from its first try to its return), or the [`Slot`] that [`Backoff::admit`] returns to
//! a loop (held through the try and its backoff, dropped before the work that follows).
//! A try of a call chain that holds a slot of the operation (a `run` inside another `run`'s
//! closure, a second backoff driven by the task that holds a slot) runs under that slot:
//! no try ever waits for a slot its own call chain holds. Every wait is bounded by the
//! deadline ([`MAX_ADMISSION_WAIT`] without one), and a try whose wait reached it does not
//! run. `Admission::Off` turns admission off. The policy's replay gate is the layer's alone,
//! and a tower service under [`Operation::layer`] has neither: tower's `Retry` owns that
//! loop.
//!
//! `admit()` needs tokio (its timer bounds the wait) and refuses at once outside it;
//! [`Backoff::admit_blocking`] and [`Operation::run_blocking`] serve threads (rusqlite,
//! Diesel) with no runtime.
//!
//! # What giving up means
//!
//! For a function (and a tower request), the policy's `max_attempts` and `deadline` bound the
//! call, as they bound a request. For a loop they bound one **streak** of consecutive errors
//! (from its first error to the [`Backoff::reset`] after the next success): past them the
//! backoff says `None` once, logs a WARN, and the loop decides (a poller usually keeps polling
//! at the cap, [`Backoff::cap`]). An error that is not retryable also says `None`, at once: it
//! is counted `non_retryable` (never `first_try`, a success's counter) and a loop's is logged
//! at WARN (`not retried`, with its type), at most once per [`NOT_RETRIED_WARN_EVERY`] per
//! operation: a permanent error never goes unseen, nor is it retried as contention.
//!
//! # Observability
//!
//! Target `tower_sqlite_retry`, as the layer's, with the field `retry.operation` where the layer
//! has `http.route`:
//!
//! - `retrying operation`, once per retry, at the policy's
//!   [`replay_event_level`](crate::RetryPolicy::replay_event_level) (DEBUG by default):
//!   `retry.attempt` (the try about to run), `retry.delay_ms`, `retry.elapsed_ms`,
//!   `db.response.status_code`, `error.type`;
//! - `retries exhausted` (ERROR: the attempts or the deadline ran out) and `not retried`
//!   (WARN: the budget) when a call gives up; a loop's backoff logs both at WARN (the loop goes
//!   on): `retry.attempts`, `retry.elapsed_ms`, `retry.outcome`, and the error's code and
//!   name; and `not retried` (WARN, rate-limited) for a loop's error that is not retryable:
//!   `retry.outcome` `non_retryable`, `error.type` (the error's Rust type),
//!   `retry.suppressed` (the like give-ups not logged since the last).
//!
//! [`Operation::metrics`] counts as the layer's [`RetryMetrics`] do (an operation is a
//! request: `first_try`, `succeeded_after_retry`, `exhausted`, ...). With the `metrics` feature
//! the same metric names as the layer's are emitted, labelled `operation` instead of
//! `http_route` and `http_request_method`.
//!
//! A success costs no allocation, no lock and no event: a loop's `reset()` reads no clock; a
//! call reads it once, at its start, for its deadline. (While the operation has an admission
//! limit, a try takes its slot under the limit's lock; with the `metrics` feature, each
//! success costs the facade's labels: six small allocations, pinned by
//! `tests/operation_allocations.rs`.)
//!
//! # The write path from a loop
//!
//! A worker whose claim reads and then writes (the oldest pending item, then mark it taken)
//! meets `SQLITE_BUSY` whenever another connection writes between the two: a retry cures it,
//! at the price of the work redone and the wait. With the write path (`WritePool`, feature
//! `sqlite-write`) the claim waits for its turn and begins `IMMEDIATE`, so it never fails that
//! way within the process; wrap it in [`Operation::run`] all the same, for what the write path
//! cannot prevent (another process's writer past `busy_timeout`, a pool time-out). Use:
//!
//! - **a backoff alone** when the writes are short, few or idempotent, or the database is not
//!   SQLite (PostgreSQL's `40001` is cured only by a retry);
//! - **the write path** when several workers or a web service write the same SQLite file at
//!   once: retries then waste no work and the claim order stays first come, first served.
//!
//! `docs/outside-http.md` in the repository has the whole story and the dispatcher
//! demonstration (`cargo run --release --example dispatcher`).

mod admit;
mod backoff;
mod policy;
mod report;

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

pub use self::admit::{AdmitError, MAX_ADMISSION_WAIT, Slot};
pub use self::backoff::Backoff;
pub use self::policy::{Delay, OperationLayer, OperationPolicy};
use crate::admission::{Admission, Admissions, OperationLimit, RouteLimit};
use crate::classify::{ClassifyError, RetryErrorChain, Retryable};
use crate::metrics::{Outcome, RetryMetrics, Stats};
use crate::policy::{InvalidPolicy, RetryPolicy};

/// A named operation and its retry policy: the [`Backoff`] of a loop, the wrapper
/// [`run`](Self::run) of a function, the [`OperationPolicy`] of a tower service.
///
/// Cheap to clone (one reference count): clones share the counters
/// ([`metrics`](Self::metrics)) and the policy's budget.
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use std::time::Duration;
/// use tower_sqlite_retry::{Operation, RetryPolicy};
///
/// async fn rename(db: &sqlx::SqlitePool, id: i64, name: &str) -> Result<(), sqlx::Error> {
///     let op = Operation::new("rename", RetryPolicy::default().deadline(Duration::from_secs(2)));
///     op.run(|_attempt| async move {
///         let mut tx = db.begin().await?;
///         sqlx::query("UPDATE items SET name = ? WHERE id = ?")
///             .bind(name)
///             .bind(id)
///             .execute(&mut *tx)
///             .await?;
///         tx.commit().await
///     })
///     .await
///     // no error: the call got no admission slot within its deadline
///     .map_err(|e| e.into_inner().unwrap_or(sqlx::Error::PoolTimedOut))
/// }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// #     let db = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
/// #     sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)").execute(&db).await.unwrap();
/// #     rename(&db, 1, "x").await.unwrap();
/// # });
/// ```
pub struct Operation<C = RetryErrorChain> {
    shared: Arc<Shared>,
    classifier: C,
}

struct Shared {
    name: Cow<'static, str>,
    policy: RetryPolicy,
    stats: Arc<Stats>,
    /// Admission's learned limit on the operation's tries in flight, from its first retryable
    /// error on (with the policy's `Admission::Adaptive`, the default), until a quiet time.
    limit: Arc<OperationLimit>,
    /// When the operation was made: the clock its limit and its WARNs are timed on.
    epoch: Instant,
    /// The last `not retried` WARN of a loop's non-retryable error (nanoseconds since
    /// `epoch`, plus one: 0 for none yet), and the give-ups not logged since.
    warned_at: AtomicU64,
    suppressed: AtomicU64,
}

/// How long an operation's admission limit outlives its last collision: the policy's
/// deadline, within 1 to 60 seconds.
fn quiet_time(policy: &RetryPolicy) -> Duration {
    policy
        .deadline
        .clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// At most one `not retried` WARN per operation in this time, for a loop's errors that are
/// not retryable (the next one says how many were not logged).
pub const NOT_RETRIED_WARN_EVERY: Duration = Duration::from_secs(10);

impl Operation {
    /// An operation named `name` (in events and metrics, where the layer puts the route) with
    /// this policy and the default classifier, [`RetryErrorChain`].
    ///
    /// # Panics
    ///
    /// If the policy is invalid ([`RetryPolicy::validate`] says why), as
    /// [`SqliteRetryLayer::new`](crate::SqliteRetryLayer::new); [`try_new`](Self::try_new)
    /// returns the reason instead.
    pub fn new(name: impl Into<Cow<'static, str>>, policy: RetryPolicy) -> Self {
        match Self::try_new(name, policy) {
            Ok(operation) => operation,
            Err(e) => panic!("{e}"),
        }
    }

    /// An operation, or why its policy cannot work.
    ///
    /// ```
    /// use tower_sqlite_retry::{Operation, RetryPolicy};
    ///
    /// let err = Operation::try_new("claim", RetryPolicy::default().max_attempts(0)).unwrap_err();
    /// assert!(err.to_string().contains("max_attempts"));
    /// ```
    pub fn try_new(
        name: impl Into<Cow<'static, str>>,
        policy: RetryPolicy,
    ) -> Result<Self, InvalidPolicy> {
        policy.validate()?;
        crate::recorder::describe();
        let name = name.into();
        let limit = Arc::new(OperationLimit::new());
        let admissions = Admissions::of_operation(&name, Arc::clone(&limit));
        Ok(Self {
            shared: Arc::new(Shared {
                name,
                policy,
                stats: Arc::new(Stats::new(admissions)),
                limit,
                epoch: Instant::now(),
                warned_at: AtomicU64::new(0),
                suppressed: AtomicU64::new(0),
            }),
            classifier: RetryErrorChain,
        })
    }
}

impl<C> Operation<C> {
    /// The same operation (its name, policy and counters) with another classifier: a closure
    /// `Fn(&E) -> Option<Retryable>`, [`NeverRetryErrors`](crate::NeverRetryErrors), or any
    /// [`ClassifyError`].
    ///
    /// ```
    /// use tower_sqlite_retry::{Operation, RetryPolicy, Retryable, classify_error_chain};
    ///
    /// // anyhow::Error is no std Error: hand the chain walk its inner error
    /// let op = Operation::new("sync", RetryPolicy::default())
    ///     .classify_with(|e: &anyhow::Error| classify_error_chain(e.as_ref()));
    /// # let _ = op;
    /// ```
    pub fn classify_with<C2>(self, classifier: C2) -> Operation<C2> {
        Operation {
            shared: self.shared,
            classifier,
        }
    }

    /// The operation's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The operation's retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.shared.policy
    }

    /// The operation's counters (shared by its clones, backoffs and policies), as the layer's.
    ///
    /// ```
    /// use tower_sqlite_retry::{Operation, RetryPolicy};
    ///
    /// let op = Operation::new("claim", RetryPolicy::default());
    /// let mut backoff = op.backoff();
    /// backoff.reset(); // a success
    /// assert_eq!(op.metrics().snapshot().first_try, 1);
    /// ```
    pub fn metrics(&self) -> RetryMetrics {
        self.shared.stats.handle()
    }

    fn deposit(&self) {
        if let Some(budget) = &self.shared.policy.budget {
            budget.deposit();
        }
    }

    /// Whether the budget allows a retry (always, without one).
    fn withdraw(&self) -> bool {
        self.shared
            .policy
            .budget
            .as_ref()
            .is_none_or(|budget| budget.withdraw())
    }

    /// The time since the operation was made.
    fn since_epoch(&self) -> Duration {
        self.shared.epoch.elapsed()
    }

    /// The operation's admission limit, while it has one (from its first retryable error to
    /// a quiet time after its last); reads the clock only then.
    fn limit(&self) -> Option<Arc<RouteLimit>> {
        let quiet = quiet_time(&self.shared.policy);
        let lookup = self.shared.limit.get(|| self.since_epoch(), quiet);
        if lookup.decayed {
            report::admission_limit(&self.shared.name, 0);
        }
        lookup.limit
    }

    /// A retryable error at `now`: from now on the operation's tries queue (admission on),
    /// until a quiet time with no other.
    fn contended(&self, now: Instant) {
        if self.shared.policy.admission == Admission::Off {
            return;
        }
        let since = now.saturating_duration_since(self.shared.epoch);
        let (limit, made) = self.shared.limit.collided(since);
        if made {
            report::admission_limit(&self.shared.name, limit.limit());
        }
    }

    /// The learned limit moved.
    fn limit_moved(&self, limit: u32) {
        report::admission_limit(&self.shared.name, limit);
    }

    /// A loop's streak ended on an error that is not retryable: WARN `not retried`, at most
    /// once per [`NOT_RETRIED_WARN_EVERY`] for the operation.
    fn not_retryable(&self, error_type: Option<&'static str>, attempts: u32, in_loop: bool) {
        if !in_loop {
            // a call's error goes back to its caller
            return;
        }
        let now = u64::try_from(self.since_epoch().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let every = u64::try_from(NOT_RETRIED_WARN_EVERY.as_nanos()).unwrap_or(u64::MAX);
        let last = self.shared.warned_at.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= every;
        if !due
            || self
                .shared
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.shared.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.shared.suppressed.swap(0, Ordering::Relaxed);
        report::not_retryable(&self.shared.name, error_type, attempts, suppressed);
    }

    fn classify<E>(&self, error: &E) -> Option<Retryable>
    where
        C: ClassifyError<E>,
    {
        self.classifier.classify_error(error)
    }

    fn retried(
        &self,
        attempt: u32,
        delay: Duration,
        elapsed: Duration,
        reason: Option<&Retryable>,
    ) {
        self.shared.stats.counters.retry();
        report::retrying(
            &self.shared.name,
            self.shared.policy.replay_event_level,
            attempt,
            delay,
            elapsed,
            reason,
        );
    }

    /// A try waited `waited` for its admission slot.
    fn queued(&self, waited: Duration) {
        self.shared.stats.counters.queued();
        report::queued(&self.shared.name, waited);
    }

    fn finished(&self, end: report::End<'_>) {
        let counters = &self.shared.stats.counters;
        counters.request();
        counters.finished(end.outcome, end.attempts);
        report::finished(&self.shared.name, &end);
    }
}

impl<C: Clone> Operation<C> {
    /// A [`Backoff`] for a loop: the schedule of one streak of errors at a time.
    pub fn backoff(&self) -> Backoff<C> {
        Backoff::of(self.clone(), true)
    }

    /// Runs `op` until it succeeds, or its error is not retryable, or the policy's attempts,
    /// deadline or budget are used up; sleeps the backoff between tries (tokio's timer). The
    /// closure is given the number of the try (1 for the first).
    ///
    /// The deadline counts from this call and bounds every wait; no try starts past it, and a
    /// try that has started is never cut short (it may have committed). Dropping the returned
    /// future cancels the try or the wait in progress, and is counted (`cancelled`).
    ///
    /// Admission: once the operation met contention, the call waits for a slot before its
    /// first try and holds it, through its retries and backoffs, until it returns (its own
    /// scope); a call that began before the contention takes a slot at a retry if one is free.
    /// A `run` of the same operation inside the closure (a retried helper called from a
    /// retried caller), and a call made by a task (or thread) that holds a loop's [`Slot`] of
    /// the operation, run under that slot and never wait for it; two calls side by side in one
    /// task (`join!`) take turns. A call whose wait reaches the deadline makes no try: `Err`
    /// with no error ([`OperationError::error`] is `None`), outcome `deadline`.
    ///
    /// `Err` holds the last error, the tries made and the time spent ([`OperationError`]).
    /// The future is `Send` when the closure's futures are, whatever the error type (the
    /// error is never held across a wait). A success allocates nothing (without the `metrics`
    /// feature; with it, the facade's labels).
    pub async fn run<T, E, F, Fut>(&self, mut op: F) -> Result<T, OperationError<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: ClassifyError<E>,
    {
        let mut backoff = Backoff::of(self.clone(), false);
        backoff.start_call(Instant::now());
        // the call's slot, held by this scope until the call returns; its chain (made only
        // when the operation has a limit) lets a nested call find it
        let mut chain = None;
        let mut slot = match backoff.admit_call(&mut chain).await {
            Ok(slot) => slot,
            Err(()) => return Err(OperationError::no_try(&backoff)),
        };
        loop {
            if !slot.is_held() && backoff.attempt() > 1 {
                // the operation met contention after this call began: a free slot, if any
                slot = backoff.admit_if_free(&mut chain);
            }
            backoff.slotted = slot.limit().cloned();
            let attempt = backoff.attempt();
            let delay = match admit::in_chain(chain, op(attempt)).await {
                Ok(value) => {
                    backoff.reset();
                    return Ok(value);
                }
                Err(error) => match backoff.next_delay(&error) {
                    Some(delay) => delay,
                    None => return Err(OperationError::of(error, attempt, &backoff)),
                },
            };
            tokio::time::sleep(delay).await;
        }
    }

    /// [`run`](Self::run) for synchronous code (rusqlite, Diesel, any blocking driver): the
    /// same policy, classification, admission, events and counters, on the calling thread,
    /// which sleeps the backoff (`std::thread::sleep`) and parks while it waits for a slot.
    /// Needs no runtime; do not call it on an async runtime's worker thread (it blocks).
    ///
    #[cfg_attr(feature = "rusqlite", doc = "```")]
    #[cfg_attr(not(feature = "rusqlite"), doc = "```ignore")]
    /// use tower_sqlite_retry::{Operation, RetryPolicy};
    ///
    /// fn rename(db: &mut rusqlite::Connection, id: i64, name: &str) -> rusqlite::Result<()> {
    ///     let op = Operation::new("rename", RetryPolicy::default());
    ///     op.run_blocking(|_attempt| {
    ///         let tx = db.transaction()?;
    ///         tx.execute("UPDATE items SET name = ?1 WHERE id = ?2", (name, id))?;
    ///         tx.commit()
    ///     })
    ///     .map_err(|e| e.into_inner().expect("a try ran"))
    /// }
    /// # let mut db = rusqlite::Connection::open_in_memory().unwrap();
    /// # db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)", ()).unwrap();
    /// # rename(&mut db, 1, "x").unwrap();
    /// ```
    pub fn run_blocking<T, E, F>(&self, mut op: F) -> Result<T, OperationError<E>>
    where
        F: FnMut(u32) -> Result<T, E>,
        C: ClassifyError<E>,
    {
        let mut backoff = Backoff::of(self.clone(), false);
        backoff.start_call(Instant::now());
        let mut chain = None;
        let mut slot = match backoff.admit_blocking_as(|| *chain.insert(admit::new_chain())) {
            Ok(slot) => slot,
            Err(_) => return Err(OperationError::no_try(&backoff)),
        };
        loop {
            if !slot.is_held() && backoff.attempt() > 1 {
                slot = backoff.admit_if_free(&mut chain);
            }
            backoff.slotted = slot.limit().cloned();
            let attempt = backoff.attempt();
            match admit::in_blocking_chain(chain, || op(attempt)) {
                Ok(value) => {
                    backoff.reset();
                    return Ok(value);
                }
                Err(error) => match backoff.next_delay(&error) {
                    Some(delay) => std::thread::sleep(delay),
                    None => return Err(OperationError::of(error, attempt, &backoff)),
                },
            }
        }
    }
}

impl<C: Clone> Clone for Operation<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            classifier: self.classifier.clone(),
        }
    }
}

impl<C> fmt::Debug for Operation<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation")
            .field("name", &self.shared.name)
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

/// What [`Operation::run`] returns when it gives up: the last error, the tries made and the
/// time spent, and why it stopped.
///
/// Its `source()` is the error, so a retryable error inside is still found by
/// [`classify_error_chain`](crate::classify_error_chain) (a handler under the layer that
/// returns it is replayed as a whole when the layer's policy allows more).
#[derive(Debug)]
pub struct OperationError<E> {
    /// `None`: no try ran (the wait for an admission slot reached the deadline).
    error: Option<E>,
    attempts: u32,
    elapsed: Duration,
    outcome: Outcome,
}

impl<E> OperationError<E> {
    /// A try's error ended the call.
    fn of<C>(error: E, attempts: u32, backoff: &Backoff<C>) -> Self {
        Self {
            error: Some(error),
            attempts,
            elapsed: backoff.elapsed(),
            outcome: backoff.stopped().unwrap_or(Outcome::NonRetryable),
        }
    }

    /// The call's wait for an admission slot reached its deadline: no try ran.
    fn no_try<C>(backoff: &Backoff<C>) -> Self {
        Self {
            error: None,
            attempts: 0,
            elapsed: backoff.elapsed(),
            outcome: Outcome::Deadline,
        }
    }

    /// The last try's error; `None` when no try ran: the call waited for an admission slot
    /// until its deadline (outcome `deadline`, no attempt), so that no try would start past
    /// it.
    pub fn error(&self) -> Option<&E> {
        self.error.as_ref()
    }

    /// The last try's error, by value ([`error`](Self::error)).
    pub fn into_inner(self) -> Option<E> {
        self.error
    }

    /// The tries made, the first included (0 when the call got no admission slot).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The time from the call to the last error.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Why the call stopped: `NonRetryable` (an error that is not retryable, on the first try
    /// or a later one), `Exhausted`, `Deadline` or `BudgetExhausted`.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }
}

impl<E: fmt::Display> fmt::Display for OperationError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Some(error) => write!(
                f,
                "failed after {} attempt{} in {:?} ({}): {}",
                self.attempts,
                if self.attempts == 1 { "" } else { "s" },
                self.elapsed,
                self.outcome,
                error
            ),
            None => write!(
                f,
                "no attempt: no admission slot within the deadline ({:?})",
                self.elapsed
            ),
        }
    }
}

impl<E: Error + 'static> Error for OperationError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.as_ref().map(|e| e as &(dyn Error + 'static))
    }
}
