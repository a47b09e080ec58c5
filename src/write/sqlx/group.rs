//! Group commit's mechanism: the shared fsync, its waiters, and the writer connection's level.
//! What it promises and why (a transaction's outcome is its own, `commit()` is `Ok` only once
//! an fsync that started after its `COMMIT` completed, what differs from `FULL` and only on a
//! power loss, the refusal after a failed sync) is written once, in the write module's docs
//! (`write/mod.rs`, "Group commit"); the descriptor it syncs is `durable/wal.rs`'s.
//!
//! ```text
//!  writer connection, synchronous = NORMAL           the shared fsync (one task at a time)
//!   A: BEGIN IMMEDIATE … COMMIT ─► A waits ─┐         ┌─ takes every waiter: [A]
//!   B: BEGIN IMMEDIATE … COMMIT ─► B waits ─┼──────►  │  fsync the WAL, answer A
//!   C: BEGIN IMMEDIATE … COMMIT ─► C waits ─┘         └─ takes every waiter: [B, C]
//!                                                        fsync the WAL, answer B and C
//! ```
//!
//! A transaction joins the waiters with no `await` between its `COMMIT`'s answer and
//! [`Syncs::committed`] (the commit's order is `transaction.rs`'s `Committed`), so the fsync it
//! is answered by started after its `COMMIT`. A writer alone (nobody waiting for the turn, no
//! fsync under way or waited for) runs at the pool's own level and its `COMMIT` fsyncs itself,
//! with no hand-off ([`Syncs::level_for`]); the writer connection's level changes only when the
//! load does, and only its turn's holder changes it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::oneshot;

use super::driver::Driver;
use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::turn::{Queue, Turn};
use crate::write::durable::report::{MAX_UNANSWERED, report_stop, report_sync, stop_reason};
use crate::write::durable::wal::{SyncError, Wal};

/// The shared fsync of one writer connection's WAL: transactions committed at `NORMAL` wait
/// here for an fsync that started after their `COMMIT` returned.
pub(crate) struct Syncs<D: Driver> {
    /// The WAL's path, for the messages and for opening it.
    path: PathBuf,
    queue: Arc<Queue>,
    /// The pool's own `synchronous` level (`FULL` or `EXTRA`).
    level: u8,
    /// The level the writer connection is at now: the pool's, or `NORMAL` (see
    /// [`level_for`](Self::level_for)).
    now: AtomicU8,
    state: Mutex<State>,
    /// Told when the sync task ends (for [`drained`](Syncs::drained)).
    idle: tokio::sync::Notify,
    /// Writer connections attached (the test seam `writer_connections_opened`).
    attached: AtomicU64,
    _driver: std::marker::PhantomData<fn() -> D>,
}

/// `PRAGMA synchronous = NORMAL`.
pub(crate) const NORMAL: u8 = 1;

/// Who waits, and whether a sync task runs.
#[derive(Default)]
struct State {
    /// Transactions whose `COMMIT` returned, waiting for an fsync that starts after it.
    waiting: Vec<oneshot::Sender<Synced>>,
    /// How many the running fsync covers.
    in_flight: usize,
    /// A task runs the fsyncs (it takes `waiting` whole before each).
    running: bool,
    /// Test seam: no fsync starts while held.
    held: bool,
    /// The WAL's descriptor, opened with the writer connection (`None`: it could not be
    /// opened, and nothing is shared until a writer connection opens it).
    wal: Option<Arc<Wal>>,
    /// Why group commit stopped for good (a sync of the WAL failed): nothing is shared any
    /// more, and every transaction that still waits is told this.
    stopped: Option<Arc<str>>,
}

/// What a waiting transaction is told: `Err` carries what failed.
type Synced = Result<(), Arc<str>>;

fn lock(mutex: &Mutex<State>) -> MutexGuard<'_, State> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: Driver> Syncs<D> {
    /// The shared fsync of `database`'s WAL (`database`: the main file, as SQLite names it).
    /// Its descriptor is opened by [`attach`](Self::attach).
    pub(crate) fn new(database: &Path, queue: Arc<Queue>, level: u8) -> Arc<Self> {
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        Arc::new(Self {
            path: PathBuf::from(wal),
            queue,
            level,
            now: AtomicU8::new(level),
            state: Mutex::default(),
            idle: tokio::sync::Notify::new(),
            attached: AtomicU64::new(0),
            _driver: std::marker::PhantomData,
        })
    }

    /// A writer connection was opened (at the pool's level): the WAL's descriptor, opened
    /// read-write with the first one, is kept for as long as the file at the WAL's path is
    /// the one it has open (`durable/wal.rs`), through any number of writer connections: a descriptor
    /// opened later would not hear a writeback error the kept one has yet to report. Only
    /// once the WAL at the path is another file (SQLite deleted it when its last connection
    /// closed, and made it again) is it opened afresh. Call it once the connection has read
    /// the database (SQLite opened the WAL).
    pub(crate) fn attach(&self) {
        self.attached.fetch_add(1, Ordering::Relaxed);
        self.now.store(self.level, Ordering::Release);
        let kept = lock(&self.state).wal.clone();
        if kept.is_some_and(|wal| wal.is_at_path()) {
            return;
        }
        let opened = D::open_wal(&self.path);
        let mut state = lock(&self.state);
        match opened {
            Ok(wal) => state.wal = Some(Arc::new(wal)),
            Err(error) => {
                state.wal = None;
                tracing::warn!(
                    db.namespace = %self.queue.database(),
                    error.message = %error,
                    "group commit: the WAL ({}) could not be opened for syncing; every COMMIT \
                     syncs on its own until the next writer connection opens it",
                    self.path.display()
                );
            }
        }
    }

    /// The level a transaction about to begin runs at: `NORMAL` (its fsync shared) when
    /// another writer waits for the turn or an fsync is under way or waited for; otherwise the
    /// pool's own, and its `COMMIT` fsyncs as it would without group commit (a lone writer
    /// pays no hand-off). The pool's own too once group commit stopped, without a WAL
    /// descriptor, and past [`MAX_UNANSWERED`]. `Some` when the writer connection must change
    /// to it first.
    ///
    /// Asked by the turn's holder alone, which `_held` proves: the level it reads and swaps
    /// (`now`) is the writer connection's, and only the turn's holder has that connection, so
    /// no other transaction changes it between this answer and its `PRAGMA`.
    pub(crate) fn level_for(&self, _held: &Turn) -> (u8, Option<u8>) {
        let others_wait = self.queue.counts().has_waiting();
        let shared = {
            let state = lock(&self.state);
            let busy = !state.waiting.is_empty() || state.running || state.held;
            (others_wait || busy)
                && state.stopped.is_none()
                && state.wal.is_some()
                && state.waiting.len() + state.in_flight < MAX_UNANSWERED
        };
        let level = if shared { NORMAL } else { self.level };
        let change = (self.now.swap(level, Ordering::AcqRel) != level).then_some(level);
        (level, change)
    }

    /// The turn of the database whose WAL this is.
    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// The WAL header's checkpoint sequence number (it changes each time the WAL restarts),
    /// read through the kept descriptor; `None` if it cannot be read.
    pub(crate) fn wal_sequence(&self) -> Option<u32> {
        let wal = lock(&self.state).wal.clone()?;
        wal.checkpoint_sequence()
    }

    /// The writer connection's level is not known (being set, or setting it failed or was
    /// cancelled): set it next time.
    pub(crate) fn forget_level(&self) {
        self.now.store(u8::MAX, Ordering::Release);
    }

    /// The writer connection is at `level` (set, with what goes with it).
    pub(crate) fn known_level(&self, level: u8) {
        self.now.store(level, Ordering::Release);
    }

    /// A transaction's `COMMIT` returned: its place in the next fsync. Called with no await
    /// between the `COMMIT`'s answer and this, so that the fsync it waits for starts after.
    /// Once group commit stopped, told so at once.
    pub(crate) fn committed(self: &Arc<Self>) -> Pending<D> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = lock(&self.state);
            if let Some(why) = &state.stopped {
                let _ = tx.send(Err(Arc::clone(why)));
                false
            } else {
                state.waiting.push(tx);
                !state.held && !std::mem::replace(&mut state.running, true)
            }
        };
        if start {
            self.start();
        }
        Pending {
            told: rx,
            syncs: Arc::clone(self),
        }
    }

    /// A sync of the WAL failed (the shared fsync, the checkpointer's, or a `COMMIT` on the
    /// writer connection): nothing is acknowledged through the shared fsync from now on. Every
    /// transaction waiting is told `why`, later ones too; transactions begin at the pool's own
    /// level (each `COMMIT` SQLite's own); an ERROR event and the counter say so, once.
    /// Returns what the waiters are told.
    pub(crate) fn stop(&self, why: &str) -> Arc<str> {
        let (first, waiting, stopped) = {
            let mut state = lock(&self.state);
            let first = state.stopped.is_none();
            if first {
                state.stopped = Some(stop_reason(why));
            }
            let stopped = state.stopped.clone().expect("set above");
            (first, std::mem::take(&mut state.waiting), stopped)
        };
        // The file's, not this pool's: every pool on it, now and later, is refused (before
        // anyone waiting is told, so that no later commit reads "not refused").
        self.queue.refuse(&stopped);
        for waiter in waiting {
            let _ = waiter.send(Err(Arc::clone(&stopped)));
        }
        if first {
            report_stop(&self.queue, &self.path, why);
        }
        stopped
    }

    /// Once no committed transaction waits for an fsync and none runs: what `close` waits for,
    /// so that every commit that went through is answered truthfully before the pool's
    /// connections close (the last to close removes the WAL, which an fsync still to run would
    /// then find gone). (While the test seam holds the fsync, until it lets go.)
    pub(crate) async fn drained(&self) {
        loop {
            let ended = self.idle.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            {
                let state = lock(&self.state);
                if !state.running && state.waiting.is_empty() {
                    return;
                }
            }
            ended.await;
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
    /// How many writer connections were attached (the test seam).
    pub(crate) fn attached(&self) -> u64 {
        self.attached.load(Ordering::Relaxed)
    }

    pub(crate) fn hold(self: &Arc<Self>, held: bool) {
        let start = {
            let mut state = lock(&self.state);
            state.held = held;
            !held && !state.waiting.is_empty() && !std::mem::replace(&mut state.running, true)
        };
        if start {
            self.start();
        }
        self.idle.notify_waiters();
    }
}

/// A sync with no descriptor to sync through (the writer connection's could not be opened):
/// never "synced".
fn no_descriptor() -> SyncError {
    SyncError::Moved("its descriptor could not be opened with the writer connection".to_owned())
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
            let wal = {
                let mut state = lock(&syncs.state);
                if state.waiting.is_empty() || state.held {
                    state.running = false;
                    state.in_flight = 0;
                    self.done = true;
                    drop(state);
                    syncs.idle.notify_waiters();
                    return;
                }
                self.batch = std::mem::take(&mut state.waiting);
                state.in_flight = self.batch.len();
                state.wal.clone()
            };
            let started = Instant::now();
            let synced = match wal {
                Some(wal) => D::sync_wal(wal).await,
                None => Err(no_descriptor()),
            };
            let took = started.elapsed();
            let group = report_sync(&syncs.queue, self.batch.len(), took, synced.is_ok());
            match &synced {
                Err(error) if error.is_the_disks() => {
                    syncs.stop(&format!("group {group}: {error}"));
                }
                _ => {}
            }
            // NOTE: read after the fsync: a failure heard elsewhere meanwhile (the
            // checkpointer's, a `COMMIT`'s) fails this group too.
            let told: Synced = match (lock(&syncs.state).stopped.clone(), &synced) {
                (Some(why), _) => Err(why),
                // Not run to its end: this group is not known durable; the next fsync, for
                // the next group, may well be.
                (None, Err(error)) => Err(Arc::from(format!("group {group}: {error}"))),
                (None, Ok(())) => Ok(()),
            };
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
            state.in_flight = 0;
            std::mem::take(&mut state.waiting)
        };
        // The senders dropped: their transactions are told the fsync never ran.
        drop(waiting);
        self.batch.clear();
        self.syncs.idle.notify_waiters();
    }
}

/// A committed transaction's wait for its fsync.
pub(crate) struct Pending<D: Driver> {
    told: oneshot::Receiver<Synced>,
    syncs: Arc<Syncs<D>>,
}

impl<D: Driver> Pending<D> {
    /// Once the transaction is durable: `Ok`, or why not. Not bounded by a deadline (a
    /// `COMMIT` under way is not): an fsync that runs or starts at once. With no task left to
    /// run it (no runtime, or one shutting down), it syncs the WAL's descriptor itself, on a
    /// blocking thread.
    pub(crate) async fn durable(self) -> Result<(), GroupCommitFailed> {
        let Pending { told, syncs } = self;
        let why: Arc<str> = match told.await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(why)) => why,
            Err(_) => match Self::sync_here(&syncs).await {
                Ok(()) => return Ok(()),
                Err(why) => why,
            },
        };
        Err(GroupCommitFailed::new(format!(
            "the WAL ({}): {why}",
            syncs.path.display()
        )))
    }

    /// The sync task is gone: the descriptor synced for this transaction alone, off the
    /// runtime's threads as every fsync here, unless group commit stopped. A sync that cannot
    /// run (the runtime shutting down, which is why the task is gone) leaves the transaction
    /// not known durable, and is not the disk's failure.
    async fn sync_here(syncs: &Syncs<D>) -> Result<(), Arc<str>> {
        let wal = {
            let state = lock(&syncs.state);
            if let Some(why) = &state.stopped {
                return Err(Arc::clone(why));
            }
            state.wal.clone()
        };
        let synced = match wal {
            Some(wal) => D::sync_wal(wal).await,
            None => Err(no_descriptor()),
        };
        synced.map_err(|error| match error.is_the_disks() {
            true => syncs.stop(&error.to_string()),
            false => Arc::from(error.to_string()),
        })
    }
}
