//! The writer thread: the write path for synchronous drivers (rusqlite: `on_rusqlite.rs`,
//! Diesel: `on_diesel.rs`), each write transaction a closure run on the database's writer
//! thread. This file is the part every driver shares: the channel, the turn, the fence, the
//! deadline and cancellation, group commit's fsync thread; a driver's part runs `BEGIN
//! IMMEDIATE`, the closure and `COMMIT` and says what came of it (`Ran`).
//!
//! ```text
//!  handler tasks                 writer thread (owns the connection)        fsync thread
//!  transaction(f1) ─┐            ┌─ f1: turn, BEGIN IMMEDIATE, f1, COMMIT ─┐
//!  transaction(f2) ─┼─ FIFO ───► ├─ f2: turn, BEGIN IMMEDIATE, f2, COMMIT ─┼─► fsync the WAL,
//!  transaction(f3) ─┘  channel   └─ f3: …                                  ┘   answer f1, f2
//! ```
//!
//! With sqlx, every statement of a transaction is a round trip between the handler's task and
//! the connection's worker thread, and the turn passes from one writer to the next through a
//! wake-up of the next handler's task: most of a turn is those hops, not SQLite's work
//! (BENCHMARKS.md). A synchronous driver has no such hops to make: the handler's transaction
//! body, a closure, goes to the thread that owns the database's writer connection, which runs
//! the closures one after the other, each in its own `BEGIN IMMEDIATE` … `COMMIT`, so that the
//! turn passes from one to the next on that thread with nothing in between.
//!
//! What stays as on the sqlx write path:
//! - **The turn** is the file's (`turn.rs`): the writer thread takes it for each closure, so
//!   sqlx `WritePool`s and `WriteQueue`s on the same file take turns with it, first come first
//!   served, and `WriteStats`, the slow-transaction report and the metrics count each closure
//!   as one transaction.
//! - **The fence**: a request whose `COMMIT` went through is never replayed.
//! - **Group commit** (WAL, `synchronous = FULL`, on by default): the writer connection runs at
//!   `NORMAL`, and a closure's result is handed back only once an fsync of the WAL that started
//!   after its `COMMIT` completed; the fsyncs run on a thread of their own, and every closure
//!   that committed while one ran shares the next. A closure that commits alone (no other
//!   closure sent, no fsync under way or waiting) has nothing to share it with: the writer
//!   thread syncs the WAL itself, as SQLite's `COMMIT` at `FULL` would, without the hand-off
//!   to the fsync thread and back. Each closure is its own SQLite transaction:
//!   all-or-nothing, and blind to another's failure. After a failed sync of the WAL the file is
//!   refused every write until the process restarts, as on the sqlx path (`mod.rs`, "Group
//!   commit").
//! - **Deadline and cancellation**: a closure whose request's deadline passes, or whose caller
//!   stopped waiting (the request dropped), before its turn never runs; one that started runs
//!   to its end, and its transaction is counted whether or not anyone hears of it.
//! - **A bound on commits waiting for one fsync** (`MAX_UNANSWERED`, 512, as on the sqlx
//!   path): while that many committed closures wait unanswered (those the fsync under way
//!   runs for and those queued for the next), the writer thread begins no other, before it
//!   takes the turn, until the fsync answers some. A disk that stalls so holds writers back
//!   instead of letting every closure commit (visible to readers) without an answer. (The
//!   sqlx path lets the next transaction commit at `FULL` in the turn instead, which on a
//!   stalled disk waits just the same; here the level would have to change per driver.)
//!
//! A task that writes in a loop, one closure at a time, would pay two wake-ups of a sleeping
//! thread per transaction (the writer thread's, then the caller's worker's): `hand_off.rs`
//! replaces them with short waits that do not sleep, only while closures come back to back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::attempt::{RequestState, current_request};
use crate::recorder::{self, WriteStage};

use super::failed::GroupCommitFailed;
use super::group::{MAX_UNANSWERED, report_stop, report_sync, stop_reason};
use super::stats::WriteStats;
use super::turn::{Queue, Turn};
use super::wal::Wal;

mod hand_off;
#[cfg(feature = "diesel-write")]
pub(crate) mod on_diesel;
#[cfg(feature = "rusqlite-write")]
pub(crate) mod on_rusqlite;

/// A closure on its way to the writer thread, typed away.
type Job<C> = Box<dyn FnOnce(&mut Writer<C>) + Send>;

/// A connection the writer thread owns.
pub(super) trait Owned: Send + 'static {
    /// After a closure panicked: the connection made clean (no transaction left open on it,
    /// as the driver counts it and as SQLite does); `false` if it could not be, and the writer
    /// thread then ends.
    fn recover(&mut self) -> bool;
}

/// What a committed closure's caller is told once its fsync ran.
type Deliver = Box<dyn FnOnce(Result<(), GroupCommitFailed>) + Send>;

/// What a closure's transaction came to on the writer thread: the driver's part of the work
/// (`BEGIN IMMEDIATE`, the closure, `COMMIT` or `ROLLBACK`) tells the writer's part (the turn,
/// the fence, the fsync, the answer).
pub(super) enum Ran<T, E> {
    /// Committed.
    Committed(T),
    /// Nothing committed: the closure's error (rolled back), or the transaction's, counted at
    /// `stage` (`None`: the closure's own); `disk` when the `COMMIT` met an I/O error (a sync
    /// of the WAL in it failed).
    Failed {
        error: E,
        stage: Option<WriteStage>,
        disk: bool,
    },
    /// The closure ended the transaction itself (a raw `COMMIT` or `ROLLBACK`): what it wrote
    /// may have committed, outside the write path.
    EndedInside(E),
}

/// The errors the writer thread gives, in the driver's type.
pub(super) struct Errors<E> {
    /// The turn not reached within the request's deadline (retryable).
    pub(super) timed_out: fn() -> E,
    /// Committed, not known durable; or refused (never retryable).
    pub(super) not_durable: fn(GroupCommitFailed) -> E,
    /// A misuse, or the writer thread gone.
    pub(super) misuse: fn(&str) -> E,
}

/// How the writer thread opens and runs its connection (`WriteThread::open_with`,
/// `DieselWriteThread::open_with`).
#[derive(Clone, Debug)]
pub struct WriteThreadOptions {
    pub(super) busy_timeout: Duration,
    pub(super) group_commit: bool,
    pub(super) full: bool,
    pub(super) slow: Option<Duration>,
}

impl Default for WriteThreadOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            group_commit: true,
            full: true,
            slow: Some(super::stats::SLOW_DEFAULT),
        }
    }
}

impl WriteThreadOptions {
    /// SQLite's `busy_timeout` on the writer connection (5 s by default): how long a `BEGIN
    /// IMMEDIATE` waits for another process's write lock.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Group commit (on by default): closures that commit while an fsync of the WAL runs share
    /// the next one; each closure's result is handed back once an fsync that started after its
    /// `COMMIT` completed. Off: every `COMMIT` syncs on its own, in the turn.
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }

    /// `synchronous = NORMAL` instead of `FULL` (the default, SQLite's): no commit waits for
    /// an fsync, and a power loss may take the last commits (a crash takes none). Nothing is
    /// shared then: group commit changes nothing.
    pub fn synchronous_normal(mut self) -> Self {
        self.full = false;
        self
    }

    /// A transaction that holds the turn this long or longer is reported (a WARN and a
    /// counter; 250 ms by default), as `WritePool::slow_transaction`.
    pub fn slow_transaction(mut self, slow: Duration) -> Self {
        self.slow = Some(slow);
        self
    }

    /// Whether the fsync is shared, for a connection in `wal` mode on `file` ("" in memory).
    pub(super) fn shares_fsync(&self, wal: bool, file: &str) -> bool {
        self.group_commit && self.full && wal && !file.is_empty()
    }

    /// The `PRAGMA` the writer connection runs at, given whether the fsync is shared.
    pub(super) fn synchronous_pragma(&self, shared: bool) -> &'static str {
        if self.full && !shared {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        }
    }
}

/// One writer thread (and its fsync thread), whatever the driver: the channel its closures
/// go through, the file's turn, and group commit's fsync.
pub(super) struct Core<C> {
    jobs: mpsc::Sender<Job<C>>,
    /// Closures sent and not yet taken by the writer thread.
    queued: Arc<AtomicUsize>,
    /// How quickly closures sent alone are answered (`hand_off.rs`).
    pace: Arc<hand_off::Pace>,
    queue: Arc<Queue>,
    path: PathBuf,
    /// Group commit's fsync thread, for the test seam.
    fsync: Option<Arc<Fsync>>,
}

impl<C> Clone for Core<C> {
    fn clone(&self) -> Self {
        Self {
            jobs: self.jobs.clone(),
            queued: Arc::clone(&self.queued),
            pace: Arc::clone(&self.pace),
            queue: Arc::clone(&self.queue),
            path: self.path.clone(),
            fsync: self.fsync.clone(),
        }
    }
}

impl<C: Owned> Core<C> {
    /// Moves `conn` (set up, at the level `shared` asks for) to a writer thread of its own.
    /// `file`: the database file as SQLite names it ("" in memory); `shared`: group commit
    /// shares the WAL's fsync, on a second thread. `Err`: why not.
    pub(super) fn start(
        conn: C,
        path: PathBuf,
        file: &str,
        shared: bool,
        slow: Option<Duration>,
    ) -> Result<Self, String> {
        let queue = if file.is_empty() {
            Queue::of_private(Arc::new(()))
        } else {
            Queue::of_file(Path::new(file))
        };
        let fsync = if shared {
            let mut wal_path = std::ffi::OsString::from(file);
            wal_path.push("-wal");
            let wal_path = PathBuf::from(wal_path);
            let wal = Wal::open(&wal_path).map_err(|e| {
                format!(
                    "the WAL ({}) could not be opened for group commit's fsync: {e}",
                    wal_path.display()
                )
            })?;
            Some(Arc::new(Fsync {
                state: Mutex::default(),
                wake: Condvar::new(),
                room: Condvar::new(),
                wal,
                path: wal_path,
                queue: Arc::clone(&queue),
            }))
        } else {
            None
        };
        let (jobs, received) = mpsc::channel::<Job<C>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = Writer {
            conn,
            queued: Arc::clone(&queued),
            queue: Arc::clone(&queue),
            runtime: tokio::runtime::Handle::try_current().ok(),
            fsync: fsync.clone(),
            slow,
        };
        let name = format!("tsr-writer:{}", queue.database());
        let no_thread = |e: std::io::Error| format!("no thread for the writer: {e}");
        if let Some(fsync) = fsync.clone() {
            let closing = Arc::clone(&fsync);
            std::thread::Builder::new()
                .name(format!("tsr-fsync:{}", queue.database()))
                .spawn(move || fsync.run())
                .map_err(no_thread)?;
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    writer.serve(received);
                    // The writer is gone: the fsync thread answers whatever waits, and ends.
                    closing.close();
                })
                .map_err(no_thread)?;
        } else {
            std::thread::Builder::new()
                .name(name)
                .spawn(move || writer.serve(received))
                .map_err(no_thread)?;
        }
        Ok(Self {
            jobs,
            queued,
            pace: Arc::new(hand_off::Pace::new()),
            queue,
            path,
            fsync,
        })
    }

    /// Runs `body` (the driver's transaction around the closure) on the writer thread, in the
    /// file's turn: its value once committed and, with group commit, durable.
    pub(super) async fn transaction<T, E>(
        &self,
        body: impl FnOnce(&mut C) -> Ran<T, E> + Send + 'static,
        errors: Errors<E>,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let request = current_request();
        if self.queue.is_held_by(request.as_ref()) {
            return Err((errors.misuse)(
                "this request holds a write transaction on this database already: a second \
                 one would wait for itself",
            ));
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        let (answer, answered) = oneshot::channel::<Result<T, E>>();
        let misuse = errors.misuse;
        let job: Job<C> = Box::new(move |writer: &mut Writer<C>| {
            writer.run(request, deadline, body, errors, answer);
        });
        let sent = std::time::Instant::now();
        let ahead = self.queued.fetch_add(1, Ordering::Relaxed);
        if self.jobs.send(job).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(misuse(GONE));
        }
        match hand_off::answer(answered, &self.pace, sent, ahead == 0).await {
            Some(result) => result,
            None => Err(misuse(GONE)),
        }
    }

    /// The turn's counts now (this file's: every writer on it in this process).
    pub(super) fn stats(&self) -> WriteStats {
        self.queue.stats()
    }

    /// The database file this writer writes.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Test seam (`crate::__private::hold_thread_fsync`): while `held`, no fsync starts
    /// (closures commit, and wait for it). `false` if the fsync is not shared.
    pub(super) fn hold_fsync(&self, held: bool) -> bool {
        let Some(fsync) = &self.fsync else {
            return false;
        };
        fsync.lock().held = held;
        fsync.wake.notify_one();
        true
    }
}

const GONE: &str = "the write transaction ended without an answer: its closure panicked on the \
     writer thread (rolled back), or the writer thread is gone";

/// The writer thread's side: the connection, and what each closure needs.
struct Writer<C> {
    conn: C,
    /// Closures sent and not yet taken (`Core::queued`): none means a closure that committed
    /// is alone, with nothing to share an fsync with.
    queued: Arc<AtomicUsize>,
    queue: Arc<Queue>,
    /// For a closure that must wait for a turn held elsewhere in the process.
    runtime: Option<tokio::runtime::Handle>,
    /// Group commit's fsync thread, when the fsync is shared.
    fsync: Option<Arc<Fsync>>,
    slow: Option<Duration>,
}

impl<C: Owned> Writer<C> {
    /// Runs the closures in the order they were sent, until every sender is gone. A closure
    /// that panics fails its own transaction only, as a panicking handler fails its own
    /// request: unwound here (its turn given back, its transaction rolled back, its caller
    /// told the writer's error), the connection made clean, and the next closure runs.
    fn serve(mut self, jobs: mpsc::Receiver<Job<C>>) {
        let mut next = hand_off::Next::default();
        let mut took = Duration::ZERO;
        while let Some(job) = next.take(&jobs, took) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let began = std::time::Instant::now();
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut self)));
            took = began.elapsed();
            if ran.is_err() {
                let recovered = self.conn.recover();
                tracing::error!(
                    db.namespace = %self.queue.database(),
                    recovered,
                    "a write transaction's closure panicked on the writer thread: its \
                     transaction was rolled back and its caller failed{}",
                    if recovered {
                        ""
                    } else {
                        "; the connection could not be made clean, and the writer thread ends"
                    }
                );
                if !recovered {
                    return;
                }
            }
        }
    }

    /// The turn, at once when it is free; otherwise waited for (first come, first served)
    /// until `deadline`. `None`: not reached.
    fn turn(&self, request: Option<Arc<RequestState>>, deadline: Option<Instant>) -> Option<Turn> {
        if let Some(turn) = self.queue.try_take(request.clone(), self.slow) {
            return Some(turn);
        }
        let runtime = self.runtime.as_ref()?;
        runtime.block_on(self.queue.take(request, self.slow, || deadline))
    }

    /// One closure, from its turn to its answer.
    fn run<T, E>(
        &mut self,
        request: Option<Arc<RequestState>>,
        deadline: Option<Instant>,
        body: impl FnOnce(&mut C) -> Ran<T, E>,
        errors: Errors<E>,
        answer: oneshot::Sender<Result<T, E>>,
    ) where
        T: Send + 'static,
        E: Send + 'static,
    {
        // Nobody waits any more: it never runs.
        if answer.is_closed() {
            return;
        }
        let past = |d: Instant| Instant::now() >= d;
        let database = Arc::clone(self.queue.database());
        let failed = |stage: WriteStage| recorder::write_error(Some(&database), stage);
        if deadline.is_some_and(past) {
            failed(WriteStage::Turn);
            let _ = answer.send(Err((errors.timed_out)()));
            return;
        }
        // Too many committed closures wait for the fsync: none begins until it answers some.
        if let Some(fsync) = &self.fsync
            && !fsync.room_before(deadline)
        {
            failed(WriteStage::Turn);
            let _ = answer.send(Err((errors.timed_out)()));
            return;
        }
        let Some(turn) = self.turn(request.clone(), deadline) else {
            failed(WriteStage::Turn);
            let _ = answer.send(Err((errors.timed_out)()));
            return;
        };
        // The wait may have been long: a caller gone meanwhile, or a deadline passed, and it
        // does not begin.
        if answer.is_closed() {
            return;
        }
        if deadline.is_some_and(past) {
            drop(turn);
            failed(WriteStage::Turn);
            let _ = answer.send(Err((errors.timed_out)()));
            return;
        }
        if let Some(why) = self.queue.refused() {
            drop(turn);
            failed(WriteStage::Begin);
            let refused = GroupCommitFailed::refused(why.to_string());
            let _ = answer.send(Err((errors.not_durable)(refused)));
            return;
        }
        // NOTE: the turn is held across the whole transaction, and dropped (the next writer
        // may begin) only once it ended.
        match body(&mut self.conn) {
            Ran::Committed(value) => {
                if let Some(request) = &request {
                    request.fence();
                }
                // The next closure may run: this one's commit is done, its turn over.
                drop(turn);
                let not_durable = errors.not_durable;
                let alone = self.queued.load(Ordering::Relaxed) == 0;
                match &self.fsync {
                    Some(fsync) => fsync.committed(
                        Box::new(move |durable| {
                            if durable.is_err() {
                                recorder::write_error(Some(&database), WriteStage::Sync);
                            }
                            let _ = answer.send(durable.map(|()| value).map_err(not_durable));
                        }),
                        alone,
                    ),
                    None => {
                        let answered = match self.queue.refused() {
                            Some(why) => {
                                failed(WriteStage::Sync);
                                Err(not_durable(GroupCommitFailed::refused(why.to_string())))
                            }
                            None => Ok(value),
                        };
                        let _ = answer.send(answered);
                    }
                }
            }
            Ran::Failed { error, stage, disk } => {
                if disk && let Some(fsync) = &self.fsync {
                    fsync.stop(
                        "a COMMIT on the writer connection failed with an I/O error (SQLITE_IOERR)",
                    );
                }
                drop(turn);
                if let Some(stage) = stage {
                    failed(stage);
                }
                let _ = answer.send(Err(error));
            }
            Ran::EndedInside(error) => {
                if let Some(request) = &request {
                    request.fence();
                }
                drop(turn);
                failed(WriteStage::Commit);
                let _ = answer.send(Err(error));
            }
        }
    }
}

/// Group commit's fsync thread: takes every committed closure waiting, fsyncs the WAL once,
/// answers them all.
struct Fsync {
    state: Mutex<FsyncState>,
    wake: Condvar,
    /// The writer thread waits on it while `MAX_UNANSWERED` commits wait for an answer.
    room: Condvar,
    wal: Wal,
    path: PathBuf,
    queue: Arc<Queue>,
}

#[derive(Default)]
struct FsyncState {
    waiting: Vec<Deliver>,
    /// Committed closures in the fsync under way, not answered yet.
    in_flight: usize,
    /// Why nothing is acknowledged any more (a sync of the WAL failed).
    stopped: Option<Arc<str>>,
    /// The writer thread is gone: answer what waits, then end.
    closing: bool,
    /// Test seam: no fsync starts while held.
    held: bool,
}

impl Fsync {
    fn lock(&self) -> MutexGuard<'_, FsyncState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A closure's `COMMIT` returned: its place in the next fsync (which therefore starts
    /// after it). Told at once once group commit stopped.
    ///
    /// `alone`: no other closure waits for the writer thread. Then, if no fsync is under way
    /// or waiting either, there is nothing to share it with: the writer thread syncs here,
    /// as SQLite's own `COMMIT` at `FULL` would, without the hand-off to the fsync thread and
    /// back (the next closure, if one comes meanwhile, waits for this fsync, as it would for
    /// a `COMMIT` at `FULL`).
    fn committed(&self, deliver: Deliver, alone: bool) {
        let mut state = self.lock();
        if let Some(why) = state.stopped.clone() {
            drop(state);
            deliver(Err(GroupCommitFailed::new(why.to_string())));
            return;
        }
        if alone
            && state.waiting.is_empty()
            && state.in_flight == 0
            && !state.held
            && !state.closing
        {
            state.in_flight = 1;
            drop(state);
            self.sync_for(std::iter::once(deliver));
            return;
        }
        state.waiting.push(deliver);
        drop(state);
        self.wake.notify_one();
    }

    /// Whether a closure may begin: at once while fewer than `MAX_UNANSWERED` committed
    /// closures wait for an answer (or nothing will be acknowledged any more: the closure is
    /// refused after its turn); otherwise once the fsync answered some. `false`: `deadline`
    /// passed first.
    fn room_before(&self, deadline: Option<Instant>) -> bool {
        let mut state = self.lock();
        while state.waiting.len() + state.in_flight >= MAX_UNANSWERED
            && state.stopped.is_none()
            && !state.closing
        {
            state = match deadline {
                None => self.room.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.room
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        true
    }

    /// A sync of the WAL failed: the file is refused, what waits is told why.
    fn stop(&self, why: &str) -> Arc<str> {
        let (first, waiting, stopped) = {
            let mut state = self.lock();
            let first = state.stopped.is_none();
            if first {
                state.stopped = Some(stop_reason(why));
            }
            let stopped = state.stopped.clone().expect("set above");
            (first, std::mem::take(&mut state.waiting), stopped)
        };
        self.queue.refuse(&stopped);
        self.room.notify_all();
        for deliver in waiting {
            deliver(Err(GroupCommitFailed::new(stopped.to_string())));
        }
        if first {
            report_stop(&self.queue, &self.path, why);
        }
        stopped
    }

    fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }

    /// The thread: one fsync for whatever committed since the last one began.
    fn run(&self) {
        loop {
            let batch = {
                let mut state = self.lock();
                while (state.waiting.is_empty() || state.held) && !state.closing {
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.waiting.is_empty() {
                    return;
                }
                let batch = std::mem::take(&mut state.waiting);
                state.in_flight = batch.len();
                batch
            };
            self.sync_for(batch);
        }
    }

    /// One fsync of the WAL for `batch` (counted `in_flight`), each told its outcome; then
    /// room for the writer thread.
    fn sync_for<I>(&self, batch: I)
    where
        I: IntoIterator<Item = Deliver>,
        I::IntoIter: ExactSizeIterator,
    {
        let batch = batch.into_iter();
        let started = std::time::Instant::now();
        let synced = self.wal.sync();
        let took = started.elapsed();
        let group = report_sync(&self.queue, batch.len(), took, synced.is_ok());
        let told: Result<(), Arc<str>> = match synced {
            Err(error) if error.is_the_disks() => {
                Err(self.stop(&format!("group {group}: {error}")))
            }
            Err(error) => Err(Arc::from(format!("group {group}: {error}"))),
            // A sync of the file's WAL that failed elsewhere meanwhile fails this group too.
            Ok(()) => match self.queue.refused() {
                Some(why) => Err(why),
                None => Ok(()),
            },
        };
        for deliver in batch {
            deliver(
                told.clone()
                    .map_err(|why| GroupCommitFailed::new(why.to_string())),
            );
        }
        self.lock().in_flight = 0;
        self.room.notify_all();
    }
}
