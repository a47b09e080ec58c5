//! Group commit: every write transaction commits on its own, and the transactions that commit
//! while an fsync runs share the next one.
//!
//! ```text
//!  writer connection, synchronous = NORMAL           the shared fsync (one task at a time)
//!   A: BEGIN IMMEDIATE … COMMIT ─► A waits ─┐         ┌─ takes every waiter: [A]
//!   B: BEGIN IMMEDIATE … COMMIT ─► B waits ─┼──────►  │  fsync the WAL, answer A
//!   C: BEGIN IMMEDIATE … COMMIT ─► C waits ─┘         └─ takes every waiter: [B, C]
//!                                                        fsync the WAL, answer B and C
//! ```
//!
//! At `synchronous = FULL` (sqlx's default, and SQLite's) every `COMMIT` in WAL mode waits for
//! an fsync of the WAL while it holds the write lock: the fsync, not the transaction, is the
//! database's write limit. With group commit the pool's writer connection runs at `NORMAL`
//! (its `COMMIT` writes the WAL and returns), and a transaction's `commit()` returns only once
//! an fsync of the WAL that *started after* its `COMMIT` returned has completed: what `FULL`
//! promises, with the fsync out of the write lock and shared by every transaction that
//! committed while the previous one ran.
//!
//! **Why not one SQLite transaction per group** (what an earlier release did, each member in a
//! `SAVEPOINT`): a group's members then share one fate. Another member's deferred foreign key,
//! its trigger's `RAISE(ROLLBACK)`, a commit hook's veto, a raw `COMMIT` failed or undid the
//! innocent ones; and an earlier member's acknowledgement waited for every later member's own
//! work (a slow handler, or one waiting for a lock the earlier one held). Here every
//! transaction has exactly the outcome it would have alone, and its acknowledgement waits for
//! nothing but an fsync that is already running or starts at once: no client can tell groups
//! from one transaction at a time, except by the speed.
//!
//! **What differs from `FULL`, and only on a power loss**: a transaction's rows are visible to
//! readers (and to the next writer) from its `COMMIT`, up to one fsync before its writer is
//! answered. A process crash loses nothing (the WAL's pages are the kernel's once written); a
//! power loss in that window loses rows a reader may have seen, but never a row whose writer
//! was told it committed. The WAL is appended in commit order, so a later transaction is never
//! durable without an earlier one.
//!
//! **When there is nothing to share**: at `synchronous = NORMAL` or `OFF` a `COMMIT` does not
//! fsync, and in a rollback-journal mode the fsyncs are the journal's: group commit then
//! changes nothing (the connection is left as it is, and `commit()` returns at its `COMMIT`).
//! Nor for a writer alone: a transaction that begins while no other writer waits for the turn
//! and no fsync is under way or waited for runs at the pool's own level, and its `COMMIT`
//! fsyncs itself, with no hand-off (`level_for`); the writer connection's level changes only
//! when the load does.

use std::io;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::driver::Driver;
use super::failed::GroupCommitFailed;
use super::turn::Queue;

/// Group commit's settings. See [`WritePool::group_commit`](crate::write) (feature
/// `sqlite-write`).
///
/// ```
/// use tower_sqlite_retry::write::GroupCommit;
///
/// let settings = GroupCommit::default();
/// assert_eq!(settings, GroupCommit::default());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommit {
    max_members: NonZeroUsize,
    max_held: Duration,
}

impl Default for GroupCommit {
    fn default() -> Self {
        Self {
            max_members: NonZeroUsize::new(64).expect("non-zero"),
            max_held: Duration::from_millis(10),
        }
    }
}

impl GroupCommit {
    /// Has no effect: a group is the transactions that committed while an fsync ran, however
    /// many (each commits on its own; only the fsync is shared).
    #[deprecated(
        since = "0.1.0",
        note = "no effect: each transaction commits on its own and only the fsync is shared; \
                use `GroupCommit::default()`"
    )]
    pub fn max_members(mut self, n: NonZeroUsize) -> Self {
        self.max_members = n;
        self
    }

    /// Has no effect: no transaction waits for another's work, only for an fsync that is
    /// running or starts at once.
    #[deprecated(
        since = "0.1.0",
        note = "no effect: no transaction waits for another's work, only for an fsync; use \
                `GroupCommit::default()`"
    )]
    pub fn max_held(mut self, held: Duration) -> Self {
        self.max_held = held;
        self
    }

    /// The value given to the deprecated [`max_members`](Self::max_members).
    #[doc(hidden)]
    #[deprecated(since = "0.1.0", note = "no effect")]
    pub fn get_max_members(&self) -> NonZeroUsize {
        self.max_members
    }

    /// The value given to the deprecated [`max_held`](Self::max_held).
    #[doc(hidden)]
    #[deprecated(since = "0.1.0", note = "no effect")]
    pub fn get_max_held(&self) -> Duration {
        self.max_held
    }
}

/// The shared fsync of one writer connection's WAL: transactions committed at `NORMAL` wait
/// here for an fsync that started after their `COMMIT` returned.
pub(super) struct Syncs<D: Driver> {
    /// The WAL file (shared with every `Pending`: no allocation per commit).
    wal: Arc<Path>,
    queue: Arc<Queue>,
    /// The pool's own `synchronous` level (`FULL` or `EXTRA`).
    level: u8,
    /// The level the writer connection is at now: the pool's, or `NORMAL` (see
    /// [`level_for`](Self::level_for)).
    now: AtomicU8,
    state: Mutex<State>,
    _driver: std::marker::PhantomData<fn() -> D>,
}

/// `PRAGMA synchronous = NORMAL`.
pub(super) const NORMAL: u8 = 1;

/// Who waits, and whether a sync task runs.
#[derive(Default)]
struct State {
    /// Transactions whose `COMMIT` returned, waiting for an fsync that starts after it.
    waiting: Vec<oneshot::Sender<Synced>>,
    /// A task runs the fsyncs (it takes `waiting` whole before each).
    running: bool,
    /// Test seam: no fsync starts while held.
    held: bool,
}

/// What a waiting transaction is told: `Err` carries the fsync's number and error.
type Synced = Result<(), (u64, Arc<io::Error>)>;

fn lock(mutex: &Mutex<State>) -> MutexGuard<'_, State> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: Driver> Syncs<D> {
    /// The shared fsync of `database`'s WAL (`database`: the main file, as SQLite names it).
    pub(super) fn new(database: &Path, queue: Arc<Queue>, level: u8) -> Arc<Self> {
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        Arc::new(Self {
            wal: Arc::from(PathBuf::from(wal)),
            queue,
            level,
            now: AtomicU8::new(level),
            state: Mutex::default(),
            _driver: std::marker::PhantomData,
        })
    }

    /// The level a transaction about to begin runs at: `NORMAL` (its fsync shared) when
    /// another writer waits for the turn or an fsync is under way or waited for; otherwise the
    /// pool's own, and its `COMMIT` fsyncs as it would without group commit (a lone writer
    /// pays no hand-off). `Some` when the writer connection must change to it first.
    pub(super) fn level_for(&self, others_wait: bool) -> (u8, Option<u8>) {
        let idle = !others_wait && {
            let state = lock(&self.state);
            state.waiting.is_empty() && !state.running && !state.held
        };
        let level = if idle { self.level } else { NORMAL };
        let change = (self.now.swap(level, Ordering::AcqRel) != level).then_some(level);
        (level, change)
    }

    /// A writer connection was opened: at the pool's level.
    pub(super) fn opened(&self) {
        self.now.store(self.level, Ordering::Release);
    }

    /// The writer connection's level is not known (being set, or setting it failed or was
    /// cancelled): set it next time.
    pub(super) fn forget_level(&self) {
        self.now.store(u8::MAX, Ordering::Release);
    }

    /// The writer connection is at `level` (set, with what goes with it).
    pub(super) fn known_level(&self, level: u8) {
        self.now.store(level, Ordering::Release);
    }

    /// A transaction's `COMMIT` returned: its place in the next fsync. Called with no await
    /// between the `COMMIT`'s answer and this, so that the fsync it waits for starts after.
    pub(super) fn committed(self: &Arc<Self>) -> Pending {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = lock(&self.state);
            state.waiting.push(tx);
            !state.held && !std::mem::replace(&mut state.running, true)
        };
        if start {
            self.start();
        }
        Pending {
            told: rx,
            wal: Arc::clone(&self.wal),
        }
    }

    /// Starts the task that runs fsyncs until nobody waits (the caller set `running`).
    fn start(self: &Arc<Self>) {
        // NOTE: the guard exists before the task: a task dropped before its first poll (the
        // runtime shutting down) still lets go of `running` and of the waiters.
        let guard = Running {
            syncs: Arc::clone(self),
            batch: Vec::new(),
            done: false,
        };
        // Without a runtime the task is dropped unpolled: the guard's drop lets go of the
        // waiters, who sync for themselves (see `Pending::durable`).
        D::spawn(guard.run());
    }

    /// Test seam: while `held`, no fsync starts, and every transaction shares it (commits at
    /// `NORMAL`, and waits).
    pub(super) fn hold(self: &Arc<Self>, held: bool) {
        let start = {
            let mut state = lock(&self.state);
            state.held = held;
            !held && !state.waiting.is_empty() && !std::mem::replace(&mut state.running, true)
        };
        if start {
            self.start();
        }
    }
}

/// The sync task: its hold on `running` and on the waiters it took. Dropped before it ended
/// (the runtime shutting down), it lets go of both: the waiters sync for themselves.
struct Running<D: Driver> {
    syncs: Arc<Syncs<D>>,
    batch: Vec<oneshot::Sender<Synced>>,
    done: bool,
}

impl<D: Driver> Running<D> {
    /// Takes every waiter, fsyncs, tells them; again until nobody waits.
    async fn run(mut self) {
        let syncs = Arc::clone(&self.syncs);
        loop {
            {
                let mut state = lock(&syncs.state);
                if state.waiting.is_empty() || state.held {
                    state.running = false;
                    self.done = true;
                    return;
                }
                self.batch = std::mem::take(&mut state.waiting);
            }
            let started = Instant::now();
            let synced = D::sync_file(syncs.wal.to_path_buf()).await;
            let took = started.elapsed();
            let members = self.batch.len();
            let group = syncs.queue.counts().synced(members);
            crate::recorder::write_group(syncs.queue.database(), members, took);
            tracing::debug!(
                db.namespace = %syncs.queue.database(),
                db.write.group = group,
                db.write.transactions = members,
                db.write.fsync_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                db.write.fsync_ok = synced.is_ok(),
                "group commit: an fsync of the WAL ran for the transactions waiting"
            );
            if let Err(error) = &synced {
                tracing::error!(
                    db.namespace = %syncs.queue.database(),
                    db.write.group = group,
                    db.write.transactions = members,
                    error.message = %error,
                    "group commit: the fsync of the WAL failed; the transactions waiting for it \
                     are answered with an error (committed, but not known to be durable)"
                );
            }
            let told: Synced = synced.map_err(|error| (group, Arc::new(error)));
            for waiter in self.batch.drain(..) {
                let _ = waiter.send(told.clone());
            }
        }
    }
}

impl<D: Driver> Drop for Running<D> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let waiting = {
            let mut state = lock(&self.syncs.state);
            state.running = false;
            std::mem::take(&mut state.waiting)
        };
        // The senders dropped: their transactions sync for themselves.
        drop(waiting);
        self.batch.clear();
    }
}

/// A committed transaction's wait for its fsync.
pub(super) struct Pending {
    told: oneshot::Receiver<Synced>,
    wal: Arc<Path>,
}

impl Pending {
    /// Once the transaction is durable: `Ok`, or the fsync's error. Not bounded by a deadline
    /// (a `COMMIT` under way is not): an fsync that runs or starts at once. With no task left
    /// to run it (the runtime shutting down), it syncs on this thread.
    pub(super) async fn durable(self) -> Result<(), GroupCommitFailed> {
        let told = match self.told.await {
            Ok(told) => told.map_err(|(group, error)| (format!("group {group}: "), error)),
            Err(_) => {
                super::driver::sync_now(&self.wal).map_err(|error| (String::new(), Arc::new(error)))
            }
        };
        told.map_err(|(group, error)| {
            GroupCommitFailed::new(
                None,
                format!(
                    "{group}the fsync of the WAL ({}) failed: {error}",
                    self.wal.display()
                ),
            )
        })
    }
}
