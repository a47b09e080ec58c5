//! What a database's write turn says of itself: how many writers wait for it, how long each
//! waited and held it, how busy it is (the share of wall time it is held: at 1.0 the database
//! is at its write limit); and the slow-transaction WARN.
//!
//! The counts live here, beside the turn they count (`Queue::stats`); the metrics and the
//! WARN are emitted after the turn went on, outside the serialized section.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use super::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::recorder;
use crate::route::Route;

/// What time is measured from: nanoseconds since this instant fit a `u64` for 584 years.
static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

fn nanos_since_base(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*BASE).as_nanos()).unwrap_or(u64::MAX)
}

/// How often the slow-transaction WARN may be written, per database: the rest are counted and
/// the next WARN says how many.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// The default slow-transaction threshold: a write transaction that holds the turn this long
/// has every other writer of the database wait as long.
pub(crate) const SLOW_DEFAULT: Duration = Duration::from_millis(250);

/// The counts of one database's turn.
pub(crate) struct TurnCounts {
    /// The `database` label: the file's name, or `memory`.
    database: Arc<str>,
    waiting: AtomicUsize,
    transactions: AtomicU64,
    /// Group commit: fsyncs run, and the transactions they made durable.
    syncs: AtomicU64,
    synced: AtomicU64,
    /// Group commit: syncs of the WAL that failed (at most one per pool: it then stops).
    sync_errors: AtomicU64,
    /// Time the turn was held by the transactions that gave it back, in nanoseconds.
    busy: AtomicU64,
    /// When the current holder took the turn (nanoseconds since `BASE`, plus one), 0 if free.
    held_since: AtomicU64,
    /// The earliest the next slow-transaction WARN may be written (nanoseconds since `BASE`).
    next_warn: AtomicU64,
    /// Slow transactions not written since the last WARN.
    suppressed: AtomicU64,
    /// Waits for the file's turn while another process held it, ended (granted or given up),
    /// and their time in nanoseconds.
    process_waits: AtomicU64,
    process_waited: AtomicU64,
}

impl TurnCounts {
    pub(crate) fn new(database: Arc<str>) -> Self {
        Self {
            database,
            waiting: AtomicUsize::new(0),
            transactions: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            sync_errors: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            held_since: AtomicU64::new(0),
            next_warn: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            process_waits: AtomicU64::new(0),
            process_waited: AtomicU64::new(0),
        }
    }

    pub(crate) fn database(&self) -> &Arc<str> {
        &self.database
    }

    /// Whether a writer waits for the turn now.
    pub(crate) fn has_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// A writer starts waiting for the turn; it stops when the guard drops (granted, past its
    /// bound, or cancelled).
    pub(crate) fn waiting_for_turn(&self) -> Waiting<'_> {
        self.start_waiting();
        Waiting { counts: self }
    }

    /// A writer of this process (a pool's or the writer thread's) starts waiting for the file's turn,
    /// which another process holds: counted, with its time, when the guard drops (granted,
    /// past its bound, or cancelled).
    pub(crate) fn waiting_for_other_process(&self) -> OtherProcess<'_> {
        OtherProcess {
            counts: self,
            since: Instant::now(),
        }
    }

    /// One more writer waiting (the gauge, the process-wide count the read limit asks): each
    /// call is matched by one [`stop_waiting`](Self::stop_waiting), by a guard's `Drop`.
    pub(crate) fn start_waiting(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        WAITING_ANYWHERE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        recorder::write_waiting(&self.database, 1);
    }

    /// One writer fewer waiting.
    pub(crate) fn stop_waiting(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        WAITING_ANYWHERE.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        recorder::write_waiting(&self.database, -1);
    }

    /// The turn was taken, after `waited`: when, for [`given_back`](Self::given_back).
    pub(crate) fn taken(&self, route: Option<&Route>, waited: Duration) -> Instant {
        let now = Instant::now();
        self.held_since
            .store(nanos_since_base(now).saturating_add(1), Ordering::Relaxed);
        recorder::write_wait(route, &self.database, waited);
        now
    }

    /// The turn, taken at `taken`, is being given back: how long it was held. Called before
    /// the turn goes to the next in line (which sets `held_since` again).
    pub(crate) fn given_back(&self, taken: Instant) -> Duration {
        let held = taken.elapsed();
        self.held_since.store(0, Ordering::Relaxed);
        self.busy.fetch_add(
            u64::try_from(held.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.transactions.fetch_add(1, Ordering::Relaxed);
        held
    }

    /// Group commit ran an fsync that made `transactions` committed transactions durable: its
    /// number (1 for the first), which names the group in the events.
    pub(crate) fn synced(&self, transactions: usize) -> u64 {
        self.synced
            .fetch_add(transactions as u64, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Group commit stopped for a pool of this database: a sync of its WAL failed.
    pub(crate) fn sync_failed(&self) {
        self.sync_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// After the turn went on: the metrics of a transaction that waited `waited` and held the
    /// turn `held`, and the WARN if it held it past `slow`.
    pub(crate) fn report(
        &self,
        route: Option<&Route>,
        waited: Duration,
        held: Duration,
        slow: Option<Duration>,
    ) {
        recorder::write_held(route, &self.database, held);
        if let Some(threshold) = slow.filter(|t| held >= *t) {
            self.slow(route, waited, held, threshold);
        }
    }

    /// A transaction has held the turn `held` so far, past `threshold`, and still runs: said
    /// while it runs (the writer thread's callers ask, `thread/mod.rs`), at WARN, within the
    /// same limit as the slow-transaction WARN at its end.
    #[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
    pub(crate) fn report_running(
        &self,
        route: Option<&Route>,
        held: Duration,
        threshold: Duration,
    ) {
        let Some(suppressed) = self.may_warn() else {
            return;
        };
        tracing::event!(
            target: "tower_sqlite_retry",
            tracing::Level::WARN,
            http.request.method = route.map(|r| r.method.as_str()),
            http.route = route.and_then(Route::path),
            db.namespace = &*self.database,
            db.write.held_ms = held.as_secs_f64() * 1000.0,
            db.write.threshold_ms = threshold.as_secs_f64() * 1000.0,
            db.write.suppressed = suppressed,
            "slow write transaction: it has held the database's write turn past the threshold \
             and still runs; every other writer waits"
        );
    }

    /// Whether a slow-transaction WARN may be written now (at most one per [`WARN_EVERY`] per
    /// database): how many were left out since the last, if so; counted left out if not.
    fn may_warn(&self) -> Option<u64> {
        let now = nanos_since_base(Instant::now());
        let next = self.next_warn.load(Ordering::Relaxed);
        let every = u64::try_from(WARN_EVERY.as_nanos()).unwrap_or(u64::MAX);
        let ours = now >= next
            && self
                .next_warn
                .compare_exchange(
                    next,
                    now.saturating_add(every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if !ours {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }

    /// The slow-transaction WARN, at most one per [`WARN_EVERY`] per database; it counts the
    /// ones left out since the last. No user data: the route template, the method, times.
    fn slow(&self, route: Option<&Route>, waited: Duration, held: Duration, threshold: Duration) {
        let Some(suppressed) = self.may_warn() else {
            return;
        };
        tracing::event!(
            target: "tower_sqlite_retry",
            tracing::Level::WARN,
            http.request.method = route.map(|r| r.method.as_str()),
            http.route = route.and_then(Route::path),
            db.namespace = &*self.database,
            db.write.held_ms = held.as_secs_f64() * 1000.0,
            db.write.wait_ms = waited.as_secs_f64() * 1000.0,
            db.write.threshold_ms = threshold.as_secs_f64() * 1000.0,
            db.write.suppressed = suppressed,
            "slow write transaction: it held the database's write turn past the threshold, \
             and every other writer waited"
        );
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> WriteStats {
        let at = Instant::now();
        let since = self.held_since.load(Ordering::Relaxed);
        let current = match since {
            0 => 0,
            since => nanos_since_base(at).saturating_sub(since - 1),
        };
        WriteStats {
            waiting: self.waiting.load(Ordering::Relaxed),
            held: since != 0,
            transactions: self.transactions.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            synced: self.synced.load(Ordering::Relaxed),
            sync_errors: self.sync_errors.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy.load(Ordering::Relaxed).saturating_add(current)),
            process_waits: self.process_waits.load(Ordering::Relaxed),
            process_waited: Duration::from_nanos(self.process_waited.load(Ordering::Relaxed)),
            at,
        }
    }
}

/// Writers waiting for a turn, every database of the process together, kept by the same guard
/// as each database's own count: what the layer's read limit asks before every `GET`, so one
/// load, never the registry's lock. (std's atomic even in the model check, which does not
/// explore the read limit: a process-wide static would outlive its schedules.)
static WAITING_ANYWHERE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether a writer of any database of the process waits for its turn now.
pub(crate) fn writers_waiting_anywhere() -> bool {
    WAITING_ANYWHERE.load(std::sync::atomic::Ordering::Relaxed) > 0
}

/// A writer waiting to write: counted until dropped.
pub(crate) struct Waiting<'a> {
    counts: &'a TurnCounts,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.counts.stop_waiting();
    }
}

/// A wait for the file's turn held by another process ([`TurnCounts::waiting_for_other_process`]):
/// counted, with its time, when dropped.
pub(crate) struct OtherProcess<'a> {
    counts: &'a TurnCounts,
    since: Instant,
}

impl Drop for OtherProcess<'_> {
    fn drop(&mut self) {
        let waited = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counts
            .process_waited
            .fetch_add(waited, Ordering::Relaxed);
        self.counts.process_waits.fetch_add(1, Ordering::Relaxed);
    }
}

/// A database's write turn, as it stands: the single writer's load.
///
/// From `WritePool::stats` (feature `sqlite-write`) or [`WriteQueue::stats`](crate::write::WriteQueue::stats).
/// Two readings give the turn's **utilization** over the time between them
/// ([`utilization_since`](Self::utilization_since)): the share of that time a write
/// transaction held the turn. At 1.0 the database is at its write limit: writers only wait
/// longer from there.
///
/// ```
/// use std::time::Duration;
/// use tower_sqlite_retry::write::WriteQueue;
///
/// # let dir = std::env::temp_dir();
/// let queue = WriteQueue::for_file(dir.join("stats-example.db"));
/// let before = queue.stats();
/// // ... serve for a while ...
/// let now = queue.stats();
/// assert_eq!(now.waiting, 0);
/// // One process alone on the file: it never waited for another's turn.
/// assert_eq!(now.process_waits, 0);
/// assert!(now.utilization_since(&before) <= 1.0);
/// ```
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct WriteStats {
    /// Write transactions waiting for the turn now: the queue's length.
    pub waiting: usize,
    /// Whether a write transaction holds the turn now.
    pub held: bool,
    /// Write transactions that held the turn and gave it back, since the queue was made.
    pub transactions: u64,
    /// Group commit: the fsyncs of the WAL it ran, since the queue was made (0 without group
    /// commit, or when it has no fsync to share).
    pub syncs: u64,
    /// Group commit: the committed transactions those fsyncs made durable (`synced / syncs` is
    /// the mean group).
    pub synced: u64,
    /// Group commit: syncs of the WAL that failed (the shared fsync, a checkpoint's, or a
    /// `COMMIT`'s on the writer connection), since the queue was made. Each stopped group
    /// commit for its pool: not 0 means the disk refused a write (see the write path's docs,
    /// "When the disk refuses a write").
    pub sync_errors: u64,
    /// The time the turn was held in all since the queue was made, the current holder's so far
    /// included.
    pub busy: Duration,
    /// Several processes on one file (Unix): the times a writer of this process found the
    /// file's turn held by another process and waited for it, since the queue was made, each
    /// counted when its wait ended (granted, or given up at its deadline). 0 while this process
    /// writes the file alone. See the write path's docs, "Several processes".
    pub process_waits: u64,
    /// The time those waits took in all: `process_waited / process_waits` is what a hand-over
    /// from another process cost a writer here, on average.
    pub process_waited: Duration,
    /// When this was read.
    pub at: Instant,
}

impl WriteStats {
    /// The share of the wall time from `earlier` to this reading during which the turn was held
    /// (0.0 when no time passed). The counts are read one by one, so under load it may stray a
    /// little above 1.0.
    pub fn utilization_since(&self, earlier: &WriteStats) -> f64 {
        let wall = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        if wall == 0.0 {
            return 0.0;
        }
        self.busy.saturating_sub(earlier.busy).as_secs_f64() / wall
    }
}

impl fmt::Debug for WriteStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteStats")
            .field("waiting", &self.waiting)
            .field("held", &self.held)
            .field("transactions", &self.transactions)
            .field("syncs", &self.syncs)
            .field("synced", &self.synced)
            .field("sync_errors", &self.sync_errors)
            .field("busy", &self.busy)
            .field("process_waits", &self.process_waits)
            .field("process_waited", &self.process_waited)
            .finish_non_exhaustive()
    }
}
