//! The layer's settings: [`RetryPolicy`] (attempts, backoff and [`Jitter`], the deadline,
//! the body caps, the replay gate, writer [`Admission`], a retry budget), [`InvalidPolicy`]
//! (why a policy cannot work) and [`AdmissionLimit`] (what admission limits now).

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use tower::retry::budget::{Budget, TpsBudget};

pub use crate::admission::{Admission, AdmissionLimit};

/// How a computed backoff delay is randomised.
///
/// Whatever the kind, the delay never exceeds [`RetryPolicy::max_delay`]: the cap is applied
/// **after** jitter.
///
/// With `d = min(cap, base · 2^(n-1))` for retry `n`:
///
/// | kind | delay |
/// |---|---|
/// | `None` | `d` |
/// | `Full` | uniform in `[0, d]` |
/// | `Equal` | `d/2` + uniform in `[0, d/2]` |
/// | `Decorrelated` | `min(cap, uniform in [base, 3 · previous])` (AWS "decorrelated jitter") |
///
/// New kinds may be added in a minor release: a `match` on it needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: every client waits the same time (and collides again in lock step).
    None,
    /// Uniform in `[0, d]`: the widest spread.
    #[default]
    Full,
    /// Half fixed, half random: never retries at once, still spread.
    Equal,
    /// Each delay drawn from `[base, 3 · previous]`, then capped.
    Decorrelated,
}

/// The retry policy of a [`SqliteRetryLayer`](crate::SqliteRetryLayer): how many attempts, how
/// long to wait between them, how long in total, and how much request body may be buffered for
/// replay.
///
/// Build it from [`RetryPolicy::default()`] with setters that take and return `self`; the layer
/// validates it ([`RetryPolicy::validate`]) when it is built. Like tower-http's layers, it has
/// setters only: its `Debug` output shows every setting, and
/// [`SqliteRetryLayer::policy`](crate::SqliteRetryLayer::policy) gives a layer's policy back.
///
/// ```
/// use std::time::Duration;
/// use tower_sqlite_retry::{Jitter, RetryPolicy};
///
/// let policy = RetryPolicy::default()
///     .max_attempts(8)
///     .base_delay(Duration::from_millis(5))
///     .max_delay(Duration::from_millis(200))
///     .jitter(Jitter::Full)
///     .deadline(Duration::from_secs(5));
/// assert!(policy.validate().is_ok());
/// ```
///
/// # Defaults
///
/// | setting | default | behaviour |
/// |---|---|---|
/// | `max_attempts` | 500 | a safety cap: the deadline bounds a request (a deadline's worth of backoff is about 200 attempts); see [`RetryPolicy::max_attempts`] |
/// | `base_delay` | 2 ms | the first backoff, before jitter; it doubles for each later replay |
/// | `max_delay` | 100 ms | caps each backoff, after jitter (a request holding a writer-admission slot, while others queue behind it, backs off at most 4 × `base_delay` for its first sixteen attempts: see [`Admission`]) |
/// | `jitter` | [`Jitter::Full`] | each backoff uniform in `[0, d]`, so replays spread out |
/// | `deadline` | 10 s | total time per request once its body is in, handler time included (the upload gets as long again, then passes through without retries); it bounds every wait (admission, the replay gate, the inner service's readiness), and no backoff that would end past it is started |
/// | `max_body_bytes` | 1 MiB | the replay buffer of one request; a larger body passes through without retries |
/// | `max_buffered_bytes` | 16 MiB | the replay buffers of all requests in flight together; a body that would cross it passes through without retries |
/// | `replay_gate` | 1 | replays (attempt ≥ 2) pass a shared semaphore one at a time: SQLite has one writer ([`no_replay_gate`](RetryPolicy::no_replay_gate) lifts it) |
/// | `budget` | none | the replay gate already bounds how many replays run at once (see [`RetryPolicy::budget`]) |
/// | `admission` | [`Admission::Adaptive`] | a route that fails retryably gets a learned limit on its attempts in flight; routes that never do are never queued |
/// | `replay_event_level` | DEBUG | the per-replay event; giving up is logged at WARN/ERROR whatever this says |
///
/// The contention benchmarks chose these values (8 to 1,024 clients running deferred
/// read-then-write transactions over real HTTP, against the configurations an expert would use
/// instead); the measurements behind each one are in the repository's `BENCHMARKS.md`.
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) base_delay: Duration,
    pub(crate) max_delay: Duration,
    pub(crate) jitter: Jitter,
    pub(crate) deadline: Duration,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) replay_gate: Option<usize>,
    pub(crate) budget: Option<Arc<dyn Budget + Send + Sync>>,
    pub(crate) replay_event_level: tracing::Level,
    pub(crate) admission: Admission,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("base_delay", &self.base_delay)
            .field("max_delay", &self.max_delay)
            .field("jitter", &self.jitter)
            .field("deadline", &self.deadline)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("replay_gate", &self.replay_gate)
            .field("budget", &self.budget.as_ref().map(|_| "<budget>"))
            .field("replay_event_level", &self.replay_event_level)
            .field("admission", &self.admission)
            .finish()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 500,
            base_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(100),
            jitter: Jitter::Full,
            deadline: Duration::from_secs(10),
            max_body_bytes: 1024 * 1024,
            max_buffered_bytes: 16 * 1024 * 1024,
            replay_gate: Some(1),
            budget: None,
            replay_event_level: tracing::Level::DEBUG,
            admission: Admission::Adaptive,
        }
    }
}

impl RetryPolicy {
    /// Total attempts per request, the first one included: `1` means never retry (and the body
    /// is then never buffered).
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().max_attempts(4); // 1 try + up to 3 replays
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The first backoff delay, before jitter; each later one doubles, up to
    /// [`max_delay`](Self::max_delay) (up to four times this delay for the first sixteen attempts
    /// of a request that holds a writer-admission slot while others queue behind it: see
    /// [`Admission::Adaptive`]).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().base_delay(Duration::from_millis(10));
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// The longest single backoff delay. It holds after jitter: no delay is ever longer.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().max_delay(Duration::from_millis(250));
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How delays are randomised; see [`Jitter`].
    ///
    /// ```
    /// # use tower_sqlite_retry::{Jitter, RetryPolicy};
    /// let policy = RetryPolicy::default().jitter(Jitter::Decorrelated);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The total time the layer spends on a request: every attempt, handler time, backoff and
    /// every wait (the replay gate, the inner service's readiness) included, on the monotonic
    /// clock. It starts when the request is ready for its first attempt: once its body is
    /// buffered, else at once. The upload has a deadline of its own, as long, from the
    /// request's arrival: a body not in by then is passed through to one attempt without
    /// retries (`body_too_slow`), so a stalled client never holds its bytes against
    /// `max_buffered_bytes` for long (tower-http's `RequestBodyTimeoutLayer` outside the layer
    /// answers such clients `408` instead, if you prefer).
    ///
    /// Past it no attempt starts and no wait goes on: the answer is the last retryable failure
    /// (or, when no attempt could start, `503 Service Unavailable` with `Retry-After` and an
    /// empty body), outcome `deadline`. An attempt already running is never cut short: it may
    /// have committed, and answering `503` over a commit would invite the client to do it
    /// twice. To bound the handler too, put tower's `TimeoutLayer` outside the layer.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().deadline(Duration::from_secs(2));
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The largest request body buffered for replay. A larger body (declared by
    /// `Content-Length` or found while reading) is passed through whole, without retries.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().max_body_bytes(64 * 1024);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// The cap on the bytes buffered for replay by all requests in flight through one layer
    /// (and its clones). A request that would cross it is passed through without retries.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().max_buffered_bytes(64 * 1024 * 1024);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn max_buffered_bytes(mut self, bytes: usize) -> Self {
        self.max_buffered_bytes = bytes;
        self
    }

    /// The replay gate: replays (attempt 2 and later) of all requests through one layer pass a
    /// shared semaphore with this many permits (1 by default), held for the attempt. SQLite
    /// has one writer; replays released together only collide again, so the gate turns a
    /// storm into a queue. First attempts never wait on the gate. `0` is refused
    /// ([`validate`](Self::validate)): no replay could ever pass.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// // two replays at a time, for example against a server database
    /// let policy = RetryPolicy::default().replay_gate(2);
    /// assert!(policy.validate().is_ok());
    /// assert!(RetryPolicy::default().replay_gate(0).validate().is_err());
    /// ```
    pub fn replay_gate(mut self, permits: usize) -> Self {
        self.replay_gate = Some(permits);
        self
    }

    /// No replay gate: replays run as freely as first attempts.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().no_replay_gate();
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn no_replay_gate(mut self) -> Self {
        self.replay_gate = None;
        self
    }

    /// A retry budget (tower's [`Budget`] trait, for example [`TpsBudget`]): every request
    /// deposits, every replay withdraws, and a replay the budget refuses is not made (the
    /// handler's own response is returned, outcome `budget_exhausted`).
    ///
    /// The budget is shared by every clone of the layer; pass the same `Arc` to several
    /// layers to share it between them. Budgets are per process: several instances of a
    /// service each have their own.
    ///
    /// # Warning: a budget turns contention back into failures
    ///
    /// There is no budget by default. Under SQLite write contention, replays are the cure, not
    /// extra load: measured with the crate's contention test, even a generous budget let
    /// requests fail that the layer without a budget answered. The replay gate bounds what
    /// replays cost instead.
    /// Set a budget where retryable failures mean overload (pool time-outs against a saturated
    /// server), and size it on your own traffic.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// use tower::retry::budget::TpsBudget;
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2));
    /// let policy = RetryPolicy::default().budget(budget);
    /// # let _ = policy;
    /// ```
    pub fn budget(mut self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// A budget of `percent` extra load (`0.2` = 20%) plus `min_per_sec` replays per second,
    /// over a 10 s window: tower's [`TpsBudget`] with Finagle's defaults.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().tps_budget(0.2, 10);
    /// # let _ = policy;
    /// ```
    ///
    /// # Panics
    ///
    /// If `percent` is not within `0.0..=1000.0` (tower's own check).
    pub fn tps_budget(self, percent: f32, min_per_sec: u32) -> Self {
        self.budget(Arc::new(TpsBudget::new(
            Duration::from_secs(10),
            min_per_sec,
            percent,
        )))
    }

    /// No retry budget.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().tps_budget(0.2, 10).no_budget();
    /// # let _ = policy;
    /// ```
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// The level of the `retrying request` event, one per replay (DEBUG by default).
    ///
    /// A replay that succeeds is the layer doing its job: under contention, an event per replay
    /// at WARN floods the logs. The events that say the layer
    /// gave up (`retries exhausted` at ERROR, `not retried` at WARN) keep their levels.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let policy = RetryPolicy::default().replay_event_level(tracing::Level::INFO);
    /// # let _ = policy;
    /// ```
    pub fn replay_event_level(mut self, level: tracing::Level) -> Self {
        self.replay_event_level = level;
        self
    }

    /// Writer admission: how attempts of routes that meet contention are queued (see
    /// [`Admission`]; adaptive by default).
    ///
    /// With [`Admission::Adaptive`], a route that fails retryably gets a limit of one attempt
    /// in flight, raised while its attempts stop colliding and lowered when they collide
    /// again: SQLite's single writer is then fed one transaction at a time, as one write
    /// connection with `BEGIN IMMEDIATE` would, and replays stay the safety net for what still
    /// collides (other processes, checkpoints). Routes that never fail retryably are never
    /// queued. The wait counts against the deadline.
    ///
    /// ```
    /// # use tower_sqlite_retry::RetryPolicy;
    /// # use tower_sqlite_retry::policy::Admission;
    /// let policy = RetryPolicy::default().admission(Admission::Off);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Checks the policy, saying what is wrong with it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_sqlite_retry::RetryPolicy;
    /// let err = RetryPolicy::default().max_attempts(0).validate().unwrap_err();
    /// assert!(err.to_string().contains("max_attempts"));
    ///
    /// let err = RetryPolicy::default()
    ///     .base_delay(Duration::from_secs(1))
    ///     .max_delay(Duration::from_millis(10))
    ///     .validate()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("base_delay"));
    /// ```
    pub fn validate(&self) -> Result<(), InvalidPolicy> {
        let why = if self.max_attempts == 0 {
            "max_attempts is 0: it counts every attempt, the first included; use 1 to never retry"
                .to_string()
        } else if self.base_delay > self.max_delay {
            format!(
                "base_delay ({:?}) is above max_delay ({:?}): the first delay would already exceed the cap",
                self.base_delay, self.max_delay
            )
        } else if self.deadline.is_zero() {
            "deadline is zero: no request could ever finish within it".to_string()
        } else if self.max_attempts > 1 && self.max_body_bytes > self.max_buffered_bytes {
            format!(
                "max_body_bytes ({}) is above max_buffered_bytes ({}): a body at the per-request cap could never be buffered",
                self.max_body_bytes, self.max_buffered_bytes
            )
        } else if self.replay_gate == Some(0) {
            "replay_gate is 0: no replay could ever pass; use no_replay_gate() for no gate"
                .to_string()
        } else {
            return Ok(());
        };
        Err(InvalidPolicy { why })
    }

    /// A random delay before retry number `retry` (1 for the first replay), given the previous
    /// delay (used by [`Jitter::Decorrelated`]): never above `cap` nor
    /// [`max_delay`](Self::max_delay), never panics, whatever the inputs. Drawn from a
    /// thread-local generator.
    pub(crate) fn random_delay(&self, retry: u32, previous: Duration, cap: Duration) -> Duration {
        self.delay_with(retry, previous, cap, &mut fastrand::Rng::new())
    }

    /// [`random_delay`](Self::random_delay) with a given generator (seeded in tests; the
    /// operations' backoff keeps one).
    pub(crate) fn delay_with(
        &self,
        retry: u32,
        previous: Duration,
        cap: Duration,
        rng: &mut fastrand::Rng,
    ) -> Duration {
        let cap = cap.min(self.max_delay);
        let base = self.base_delay.min(cap);
        let exp = exponential(base, cap, retry);
        let jittered = match self.jitter {
            Jitter::None => exp,
            Jitter::Full => uniform(rng, Duration::ZERO, exp),
            Jitter::Equal => {
                let half = exp / 2;
                half.saturating_add(uniform(rng, Duration::ZERO, exp - half))
            }
            Jitter::Decorrelated => {
                let prev = previous.max(base);
                let hi = prev.saturating_mul(3).min(cap);
                uniform(rng, base, hi.max(base))
            }
        };
        jittered.min(cap)
    }
}

/// A random whole number of seconds in `lo..=hi`, from a thread-local generator (the
/// `Retry-After` spread, so that refused clients do not all come back at once).
pub(crate) fn random_secs(lo: u32, hi: u32) -> u32 {
    fastrand::u32(lo..=hi.max(lo))
}

/// `min(cap, base · 2^(retry-1))` without overflow.
fn exponential(base: Duration, cap: Duration, retry: u32) -> Duration {
    let shift = retry.saturating_sub(1);
    if shift >= 64 {
        return cap;
    }
    let factor = 1u64 << shift;
    let factor = u32::try_from(factor).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(cap, |d| d.min(cap))
}

/// A uniformly drawn duration in `[lo, hi]` (nanosecond resolution, saturating at `u64`).
fn uniform(rng: &mut fastrand::Rng, lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let lo_ns = u64::try_from(lo.as_nanos()).unwrap_or(u64::MAX);
    let hi_ns = u64::try_from(hi.as_nanos()).unwrap_or(u64::MAX);
    if hi_ns <= lo_ns {
        return lo;
    }
    Duration::from_nanos(rng.u64(lo_ns..=hi_ns))
}

/// How many `GET`/`HEAD` requests run at once while writers wait for a database's turn, and
/// for how long a read waits for its place: given to
/// [`SqliteRetryLayer::limit_reads_while_writers_wait`](crate::SqliteRetryLayer::limit_reads_while_writers_wait).
///
/// On SQLite with the [write path](crate::write), every write waits for the one transaction
/// holding the database's turn, and that transaction's statements share the CPU with every
/// read in flight: writes slow down as reads grow (the turn's held time,
/// [`WriteStats`](crate::write::WriteStats), grows with them). The read limit trades reads
/// for writes while writers queue.
///
/// **On by default** ([`ReadLimit::default`]: a read per core but one, at least one, each
/// waiting at most 10 ms);
/// [`SqliteRetryLayer::no_read_limit`](crate::SqliteRetryLayer::no_read_limit) turns
/// it off. Why: with group commit (the write path's default) and readers beside the writers,
/// the limit kept more of the writes (`BENCHMARKS.md` has the measurement). It costs nothing
/// where no writer waits for a turn: a service without the write path never meets it.
///
/// - Reads are never held back while no writer waits: a read-mostly service is not slowed,
///   nor is any service without the write path (PostgreSQL, MySQL, a plain pool): the limit
///   is off for them in effect, whatever the layer says.
/// - A read held back waits first come first served, at most [`max_wait`](Self::max_wait)
///   (10 ms by default), then runs without a place: the limit shares the CPU out, it never
///   starves a read. The request's deadline bounds that wait too.
/// - Which writers: those waiting for the turn of any database in this process (through
///   `WritePool` or [`WriteQueue`](crate::write::WriteQueue)).
/// - With nested layers the outermost one's limit applies: an inner layer never takes a
///   second place for the same request.
/// - A `GET` that writes keeps its place while it waits for the turn; that is safe (the
///   turn's holder never needs a read's place), it only counts against the limit.
///
/// ```
/// # use std::num::NonZeroUsize;
/// # use std::time::Duration;
/// use tower_sqlite_retry::policy::ReadLimit;
/// use tower_sqlite_retry::SqliteRetryLayer;
///
/// // two reads at a time while writers wait, each waiting at most 5 ms for its place
/// let limit = ReadLimit::new(NonZeroUsize::new(2).unwrap()).max_wait(Duration::from_millis(5));
/// let layer = SqliteRetryLayer::default().limit_reads_while_writers_wait(limit);
/// # let _ = layer;
/// // a zero wait is refused: a read held back would never wait for its place
/// assert!(ReadLimit::new(NonZeroUsize::MIN).max_wait(Duration::ZERO).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimit {
    reads: NonZeroUsize,
    wait: Duration,
}

impl Default for ReadLimit {
    /// The layer's default: a read per core but one, and at least one
    /// ([`available_parallelism`](std::thread::available_parallelism), one if unknown), while
    /// writers wait, each waiting at most 10 ms for its place.
    ///
    /// Why one core fewer than the cores: the transaction holding the turn, which every
    /// waiting writer waits for, needs a core to run on; with a read per core in flight, the
    /// reads take every core and the turn's statements wait for one. On two cores, beside 16
    /// readers, one read at a time kept as many of the writes as two (1.45× `BEGIN
    /// IMMEDIATE`'s against 1.49×, medians of 13 rounds) and kept them steadily (the worst
    /// round 1.24× against 1.08×), with 7.5× its reads or more against 10.8× or more
    /// (`BENCHMARKS.md`, "What happens to the writes beside readers").
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use tower_sqlite_retry::policy::ReadLimit;
    ///
    /// let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    /// let reads = NonZeroUsize::new(cores - 1).unwrap_or(NonZeroUsize::MIN);
    /// assert_eq!(ReadLimit::default(), ReadLimit::new(reads));
    /// ```
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        Self::new(NonZeroUsize::new(cores - 1).unwrap_or(NonZeroUsize::MIN))
    }
}

impl ReadLimit {
    /// At most `reads` reads at once while writers wait; a read waits at most 10 ms for its
    /// place.
    pub fn new(reads: NonZeroUsize) -> Self {
        Self {
            reads,
            wait: Duration::from_millis(10),
        }
    }

    /// The longest a read held back waits for its place; past it, it runs without one. Reads
    /// that keep their place long (a long poll, a slow report) hold the others back at most
    /// this long. Zero is refused ([`validate`](Self::validate)).
    ///
    /// Longer keeps more of the writes where a read costs as much CPU as a write (a password
    /// hash checked on every request): there the default 10 ms let the held-back reads take
    /// most of the CPU, and 50 ms kept 1.4× as many writes (docs/write-path.md, "Readers beside
    /// the writer"). With cheap reads it gained nothing.
    pub fn max_wait(mut self, most: Duration) -> Self {
        self.wait = most;
        self
    }

    /// How many reads run at once while writers wait.
    pub(crate) fn reads(&self) -> NonZeroUsize {
        self.reads
    }

    /// The longest a read held back waits for its place.
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    /// Checks the limit, saying what is wrong with it.
    pub fn validate(&self) -> Result<(), InvalidPolicy> {
        if self.wait.is_zero() {
            return Err(InvalidPolicy {
                why: "the read limit's max_wait is zero: a read held back would never wait \
                      for its place; give the layer no read limit instead"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// A [`RetryPolicy`] that cannot work, and why.
///
/// ```
/// # use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
/// let err = SqliteRetryLayer::try_new(RetryPolicy::default().max_attempts(0)).unwrap_err();
/// println!("{err}"); // invalid retry policy: max_attempts is 0: ...
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPolicy {
    why: String,
}

impl fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid retry policy: {}", self.why)
    }
}

impl std::error::Error for InvalidPolicy {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rng(seed: u64) -> fastrand::Rng {
        fastrand::Rng::with_seed(seed)
    }

    /// The delay before retry `retry` under the policy's own cap.
    fn delay(
        policy: &RetryPolicy,
        retry: u32,
        prev: Duration,
        rng: &mut fastrand::Rng,
    ) -> Duration {
        policy.delay_with(retry, prev, policy.max_delay, rng)
    }

    fn jitter_strategy() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::None),
            Just(Jitter::Full),
            Just(Jitter::Equal),
            Just(Jitter::Decorrelated)
        ]
    }

    fn duration_strategy() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            (0u64..10_000_000_000).prop_map(Duration::from_nanos),
            any::<u64>().prop_map(Duration::from_secs),
        ]
    }

    proptest! {
        #[test]
        fn every_delay_is_within_the_cap(
            base in duration_strategy(),
            cap in duration_strategy(),
            jitter in jitter_strategy(),
            retry in any::<u32>(),
            prev in duration_strategy(),
            seed in any::<u64>(),
        ) {
            let policy = RetryPolicy::default().base_delay(base).max_delay(cap).jitter(jitter);
            let mut rng = rng(seed);
            let d = delay(&policy, retry, prev, &mut rng);
            prop_assert!(d <= cap, "{d:?} > {cap:?}");
        }

        #[test]
        fn delays_follow_a_sequence_within_the_cap(
            base_ms in 0u64..1000,
            cap_ms in 0u64..5000,
            jitter in jitter_strategy(),
            seed in any::<u64>(),
        ) {
            let policy = RetryPolicy::default()
                .base_delay(Duration::from_millis(base_ms))
                .max_delay(Duration::from_millis(cap_ms))
                .jitter(jitter);
            let mut rng = rng(seed);
            let mut prev = Duration::ZERO;
            for retry in 1..100 {
                let d = delay(&policy, retry, prev, &mut rng);
                prop_assert!(d <= Duration::from_millis(cap_ms));
                prev = d;
            }
        }
    }

    #[test]
    fn without_jitter_delays_double_up_to_the_cap() {
        let policy = RetryPolicy::default()
            .base_delay(Duration::from_millis(10))
            .max_delay(Duration::from_millis(50))
            .jitter(Jitter::None);
        let d: Vec<_> = (1..=4)
            .map(|n| policy.random_delay(n, Duration::ZERO, Duration::MAX))
            .collect();
        assert_eq!(d, [10, 20, 40, 50].map(Duration::from_millis));
        // a lower cap (a request holding an admission slot) wins over max_delay
        let capped = policy.random_delay(4, Duration::ZERO, Duration::from_millis(15));
        assert_eq!(capped, Duration::from_millis(15));
    }

    #[test]
    fn retry_after_seconds_stay_in_range() {
        for _ in 0..1000 {
            assert!((1..=3).contains(&random_secs(1, 3)));
        }
        assert_eq!(random_secs(5, 2), 5);
    }

    #[test]
    fn exponential_doubles_then_caps() {
        let ms = Duration::from_millis;
        let got: Vec<_> = (1..=6).map(|n| exponential(ms(25), ms(250), n)).collect();
        assert_eq!(got, [25, 50, 100, 200, 250, 250].map(ms));
        assert_eq!(exponential(ms(25), ms(250), u32::MAX), ms(250));
        assert_eq!(exponential(Duration::MAX, Duration::MAX, 2), Duration::MAX);
    }

    #[test]
    fn equal_jitter_never_below_half() {
        let policy = RetryPolicy::default()
            .base_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(100))
            .jitter(Jitter::Equal);
        let mut rng = rng(7);
        for _ in 0..1000 {
            let d = delay(&policy, 1, Duration::ZERO, &mut rng);
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(100));
        }
    }

    #[test]
    fn full_jitter_spreads() {
        let policy = RetryPolicy::default()
            .base_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(100));
        let mut rng = rng(7);
        let draws: Vec<_> = (0..200)
            .map(|_| delay(&policy, 1, Duration::ZERO, &mut rng))
            .collect();
        assert!(draws.iter().any(|d| *d < Duration::from_millis(20)));
        assert!(draws.iter().any(|d| *d > Duration::from_millis(80)));
    }

    #[test]
    fn invalid_policies_say_why() {
        let cases = [
            (RetryPolicy::default().max_attempts(0), "max_attempts"),
            (
                RetryPolicy::default()
                    .base_delay(Duration::from_secs(2))
                    .max_delay(Duration::from_secs(1)),
                "base_delay",
            ),
            (RetryPolicy::default().deadline(Duration::ZERO), "deadline"),
            (
                RetryPolicy::default()
                    .max_body_bytes(2)
                    .max_buffered_bytes(1),
                "max_buffered_bytes",
            ),
            (RetryPolicy::default().replay_gate(0), "replay_gate"),
        ];
        for (policy, word) in cases {
            let err = policy.validate().unwrap_err().to_string();
            assert!(err.contains(word), "{err}");
        }
        assert!(RetryPolicy::default().validate().is_ok());
        assert!(
            RetryPolicy::default()
                .max_attempts(u32::MAX)
                .deadline(Duration::MAX)
                .validate()
                .is_ok()
        );
    }
}
