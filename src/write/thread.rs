//! The write path for rusqlite: each write transaction runs on the database's writer thread.
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
//!   that committed while one ran shares the next. Each closure is its own SQLite transaction:
//!   all-or-nothing, and blind to another's failure. After a failed sync of the WAL the file is
//!   refused every write until the process restarts, as on the sqlx path (`mod.rs`, "Group
//!   commit").
//! - **Deadline and cancellation**: a closure whose request's deadline passes, or whose caller
//!   stopped waiting (the request dropped), before its turn never runs; one that started runs
//!   to its end, and its transaction is counted whether or not anyone hears of it.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::attempt::{RequestState, current_request};
use crate::recorder::{self, WriteStage};

use super::failed::GroupCommitFailed;
use super::group::{report_stop, stop_reason};
use super::stats::WriteStats;
use super::turn::{Queue, Turn};
use super::wal::Wal;

/// A closure on its way to the writer thread, typed away.
type Job = Box<dyn FnOnce(&mut Writer) + Send>;

/// What a committed closure's caller is told once its fsync ran.
type Deliver = Box<dyn FnOnce(Result<(), GroupCommitFailed>) + Send>;

/// The writer thread of one SQLite database file, for rusqlite: write transactions run on it,
/// one after the other, each a closure given the transaction (`BEGIN IMMEDIATE` already run).
///
/// With sqlx every statement is a round trip to the connection's worker thread, and the turn
/// passes between writers through a wake-up of the next handler's task. Here the handler's
/// transaction body goes, as a closure, to the thread that owns the writer connection, which
/// runs the closures in the order they came, each in its own `BEGIN IMMEDIATE` … `COMMIT`: the
/// turn passes from one to the next on that thread, with nothing in between. As on the sqlx
/// write path ([`WritePool`](crate::write)):
///
/// - **The turn is the file's**: taken for each closure, shared with every `WritePool` and
///   `WriteQueue` on the file in this process, first come first served; [`stats`](Self::stats),
///   the slow-transaction report and the metrics count each closure as a transaction.
/// - **The fence**: a request whose `COMMIT` went through is never replayed.
/// - **Group commit** (WAL at `FULL`, on by default): the connection runs at `NORMAL`, and a
///   closure's value comes back once an fsync of the WAL that started after its `COMMIT`
///   completed; the fsyncs run on a thread of their own, shared by every closure that committed
///   while one ran. Each closure is its own SQLite transaction, all-or-nothing and blind to
///   another's failure. After a failed sync of the WAL the file is refused every write until
///   the process restarts (the [write module's](crate::write#group-commit) "Group commit").
/// - **Deadline and cancellation**: a closure whose request's deadline passes, or whose caller
///   stopped waiting, before its turn never runs; one that began runs to its end, and is
///   counted whether or not anyone hears of it.
///
/// Cloning is cheap: every clone hands its closures to the same thread. The threads end once
/// the last clone is dropped and the closures sent before have run (and their fsync).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_sqlite_retry::write::WriteThread;
///
/// # let dir = tempfile::tempdir()?;
/// let writes = WriteThread::open(dir.path().join("app.db"))?;
/// writes
///     .transaction(|tx| tx.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)"))
///     .await?;
/// let item = String::from("book");
/// let id = writes
///     .transaction(move |tx| {
///         tx.execute("INSERT INTO orders (item) VALUES (?1)", [&item])?;
///         Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
///     })
///     .await?; // Ok once committed and durable
/// assert_eq!(id, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct WriteThread {
    jobs: mpsc::Sender<Job>,
    queue: Arc<Queue>,
    path: PathBuf,
    /// Group commit's fsync thread, for the test seam.
    fsync: Option<Arc<Fsync>>,
}

/// How [`WriteThread::open_with`] opens and runs the writer connection.
#[derive(Clone, Debug)]
pub struct WriteThreadOptions {
    busy_timeout: Duration,
    group_commit: bool,
    full: bool,
    slow: Option<Duration>,
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
}

impl WriteThread {
    /// Opens the database file at `path` (created if missing) in WAL mode at
    /// `synchronous = FULL`, with group commit, on a writer thread of its own: see
    /// [`open_with`](Self::open_with).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, rusqlite::Error> {
        Self::open_with(path, WriteThreadOptions::default(), |_| Ok(()))
    }

    /// Opens the database file at `path` for writing: a connection in WAL mode, `setup` run on
    /// it (pragmas such as `foreign_keys`; it must not change `journal_mode` or `synchronous`,
    /// which are the writer's), then moved to a thread of its own, which runs every closure
    /// given to [`transaction`](Self::transaction). Reads go through the application's own
    /// connections, as before. Call it within a tokio runtime: a closure that must wait for a
    /// turn held elsewhere in the process (an sqlx `WritePool` on the same file) waits on it.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: WriteThreadOptions,
        setup: impl FnOnce(&mut Connection) -> Result<(), rusqlite::Error>,
    ) -> Result<Self, rusqlite::Error> {
        let path = path.as_ref().to_owned();
        let mut conn = Connection::open(&path)?;
        conn.busy_timeout(options.busy_timeout)?;
        conn.execute_batch("PRAGMA journal_mode = WAL")?;
        setup(&mut conn)?;
        // The file SQLite opened ("" in memory: no file, no WAL, nothing to share), and
        // whether it is in WAL mode now (a file system without shared memory refuses it).
        let no_params: &[&dyn rusqlite::types::ToSql] = &[];
        let file: String = conn.query_row(
            "SELECT file FROM pragma_database_list WHERE name = 'main'",
            no_params,
            |row| row.get(0),
        )?;
        let mode: String = conn.query_row("PRAGMA journal_mode", no_params, |row| row.get(0))?;
        let wal = mode.eq_ignore_ascii_case("wal");
        let shared = options.group_commit && options.full && wal && !file.is_empty();
        conn.execute_batch(if options.full && !shared {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        })?;
        let queue = if file.is_empty() {
            Queue::of_private(Arc::new(()))
        } else {
            Queue::of_file(Path::new(&file))
        };
        let fsync = if shared {
            let mut wal_path = std::ffi::OsString::from(&file);
            wal_path.push("-wal");
            let wal_path = PathBuf::from(wal_path);
            let wal = Wal::open(&wal_path).map_err(|e| {
                failure(
                    libsqlite3_sys::SQLITE_IOERR,
                    format!(
                        "the WAL ({}) could not be opened for group commit's fsync: {e}",
                        wal_path.display()
                    ),
                )
            })?;
            Some(Arc::new(Fsync {
                state: Mutex::default(),
                wake: Condvar::new(),
                wal,
                path: wal_path,
                queue: Arc::clone(&queue),
            }))
        } else {
            None
        };
        let (jobs, received) = mpsc::channel::<Job>();
        let writer = Writer {
            conn,
            queue: Arc::clone(&queue),
            runtime: tokio::runtime::Handle::try_current().ok(),
            fsync: fsync.clone(),
            slow: options.slow,
        };
        let name = format!("tsr-writer:{}", queue.database());
        if let Some(fsync) = fsync.clone() {
            let closing = Arc::clone(&fsync);
            std::thread::Builder::new()
                .name(format!("tsr-fsync:{}", queue.database()))
                .spawn(move || fsync.run())
                .map_err(|e| failure(libsqlite3_sys::SQLITE_MISUSE, format!("no thread: {e}")))?;
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    writer.serve(received);
                    // The writer is gone: the fsync thread answers whatever waits, and ends.
                    closing.close();
                })
                .map_err(|e| failure(libsqlite3_sys::SQLITE_MISUSE, format!("no thread: {e}")))?;
        } else {
            std::thread::Builder::new()
                .name(name)
                .spawn(move || writer.serve(received))
                .map_err(|e| failure(libsqlite3_sys::SQLITE_MISUSE, format!("no thread: {e}")))?;
        }
        Ok(Self {
            jobs,
            queue,
            path,
            fsync,
        })
    }

    /// Runs `f` in a write transaction on the writer thread: in this database's turn, after
    /// `BEGIN IMMEDIATE`, then `COMMIT` if `f` returned `Ok` (`ROLLBACK` if it returned `Err`).
    /// The value once committed and, with group commit, durable; otherwise the error: `f`'s,
    /// or the transaction's as a `rusqlite::Error`, which `DbError` and the classifiers take
    /// as any other:
    ///
    /// - the turn not reached within the request's deadline: `SQLITE_BUSY` (retryable: the
    ///   layer replays the request while its deadline allows); `f` never ran;
    /// - the fsync of the WAL failed, or an earlier one did (the file is refused):
    ///   `SQLITE_IOERR_FSYNC`, never retryable (committed, not known durable);
    /// - `f` ended the transaction itself (a raw `COMMIT` or `ROLLBACK`), a second
    ///   transaction begun while the request holds this database's turn, or the writer thread
    ///   gone: `SQLITE_MISUSE`.
    ///
    /// A `COMMIT` that went through fences the current request (it is never replayed). If the
    /// caller stops waiting (its future dropped) before `f` began, `f` never runs; once it
    /// began, it runs to its end, and its transaction is counted.
    pub async fn transaction<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<rusqlite::Error> + Send + 'static,
    {
        let request = current_request();
        if self.queue.is_held_by(request.as_ref()) {
            return Err(E::from(failure(
                libsqlite3_sys::SQLITE_MISUSE,
                "this request holds a write transaction on this database already: a second \
                 one would wait for itself"
                    .to_owned(),
            )));
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        let (answer, answered) = oneshot::channel::<Result<T, E>>();
        let job: Job = Box::new(move |writer: &mut Writer| {
            writer.run(request, deadline, f, answer);
        });
        if self.jobs.send(job).is_err() {
            return Err(E::from(gone()));
        }
        match answered.await {
            Ok(result) => result,
            Err(_) => Err(E::from(gone())),
        }
    }

    /// The turn's counts now (this file's: every writer on it in this process).
    pub fn stats(&self) -> WriteStats {
        self.queue.stats()
    }

    /// The database file this writer writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Test seam (`crate::__private::hold_thread_fsync`): while `held`, no fsync starts
    /// (closures commit, and wait for it). `false` if the fsync is not shared.
    pub(crate) fn hold_fsync(&self, held: bool) -> bool {
        let Some(fsync) = &self.fsync else {
            return false;
        };
        fsync.lock().held = held;
        fsync.wake.notify_one();
        true
    }
}

impl std::fmt::Debug for WriteThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteThread")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A `rusqlite::Error` as SQLite would give it, with a message of the crate's.
fn failure(code: c_int, message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(libsqlite3_sys::Error::new(code), Some(message))
}

fn gone() -> rusqlite::Error {
    failure(
        libsqlite3_sys::SQLITE_MISUSE,
        "the writer thread is gone (it panicked, or the process is ending)".to_owned(),
    )
}

fn not_durable(failed: GroupCommitFailed) -> rusqlite::Error {
    failure(libsqlite3_sys::SQLITE_IOERR_FSYNC, failed.to_string())
}

/// The writer thread's side: the connection, and what each closure needs.
struct Writer {
    conn: Connection,
    queue: Arc<Queue>,
    /// For a closure that must wait for a turn held elsewhere in the process.
    runtime: Option<tokio::runtime::Handle>,
    /// Group commit's fsync thread, when the fsync is shared.
    fsync: Option<Arc<Fsync>>,
    slow: Option<Duration>,
}

impl Writer {
    /// Runs the closures in the order they were sent, until every sender is gone.
    fn serve(mut self, jobs: mpsc::Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            job(&mut self);
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
    fn run<T, E, F>(
        &mut self,
        request: Option<Arc<RequestState>>,
        deadline: Option<Instant>,
        f: F,
        answer: oneshot::Sender<Result<T, E>>,
    ) where
        F: FnOnce(&mut Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<rusqlite::Error> + Send + 'static,
    {
        // Nobody waits any more: it never runs.
        if answer.is_closed() {
            return;
        }
        let past = |d: Instant| Instant::now() >= d;
        let timed_out = || {
            E::from(failure(
                libsqlite3_sys::SQLITE_BUSY,
                "the write turn was not reached within the request's deadline".to_owned(),
            ))
        };
        let database = Arc::clone(self.queue.database());
        let failed = |stage: WriteStage| recorder::write_error(Some(&database), stage);
        if deadline.is_some_and(past) {
            failed(WriteStage::Turn);
            let _ = answer.send(Err(timed_out()));
            return;
        }
        let Some(turn) = self.turn(request.clone(), deadline) else {
            failed(WriteStage::Turn);
            let _ = answer.send(Err(timed_out()));
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
            let _ = answer.send(Err(timed_out()));
            return;
        }
        if let Some(why) = self.queue.refused() {
            drop(turn);
            failed(WriteStage::Begin);
            let refused = GroupCommitFailed::refused(why.to_string());
            let _ = answer.send(Err(E::from(not_durable(refused))));
            return;
        }
        let mut tx = match self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
        {
            Ok(tx) => tx,
            Err(error) => {
                drop(turn);
                failed(WriteStage::Begin);
                let _ = answer.send(Err(E::from(error)));
                return;
            }
        };
        let value = match f(&mut tx) {
            Ok(value) => value,
            Err(error) => {
                // `Transaction`'s drop rolls back (whatever `f` left open).
                drop(tx);
                drop(turn);
                let _ = answer.send(Err(error));
                return;
            }
        };
        if tx.is_autocommit() {
            // `f` ended the transaction itself: what it wrote may have committed, outside the
            // write path.
            drop(tx);
            if let Some(request) = &request {
                request.fence();
            }
            drop(turn);
            failed(WriteStage::Commit);
            let _ = answer.send(Err(E::from(failure(
                libsqlite3_sys::SQLITE_MISUSE,
                "the transaction was ended inside the closure (a raw COMMIT or ROLLBACK): \
                 its writes may have committed outside the write path"
                    .to_owned(),
            ))));
            return;
        }
        match tx.commit() {
            Ok(()) => {
                if let Some(request) = &request {
                    request.fence();
                }
                // The next closure may run: this one's commit is done, its turn over.
                drop(turn);
                match &self.fsync {
                    Some(fsync) => fsync.committed(Box::new(move |durable| {
                        if durable.is_err() {
                            recorder::write_error(Some(&database), WriteStage::Sync);
                        }
                        let _ = answer.send(
                            durable
                                .map(|()| value)
                                .map_err(|failed| E::from(not_durable(failed))),
                        );
                    })),
                    None => {
                        let answered = match self.queue.refused() {
                            Some(why) => {
                                recorder::write_error(Some(&database), WriteStage::Sync);
                                Err(E::from(not_durable(GroupCommitFailed::refused(
                                    why.to_string(),
                                ))))
                            }
                            None => Ok(value),
                        };
                        let _ = answer.send(answered);
                    }
                }
            }
            Err(error) => {
                if let Some(fsync) = &self.fsync
                    && let rusqlite::Error::SqliteFailure(code, _) = &error
                    && code.extended_code & 0xff == libsqlite3_sys::SQLITE_IOERR
                {
                    fsync.stop(
                        "a COMMIT on the writer connection failed with an I/O error (SQLITE_IOERR)",
                    );
                }
                drop(turn);
                failed(WriteStage::Commit);
                let _ = answer.send(Err(E::from(error)));
            }
        }
    }
}

/// Group commit's fsync thread: takes every committed closure waiting, fsyncs the WAL once,
/// answers them all.
struct Fsync {
    state: Mutex<FsyncState>,
    wake: Condvar,
    wal: Wal,
    path: PathBuf,
    queue: Arc<Queue>,
}

#[derive(Default)]
struct FsyncState {
    waiting: Vec<Deliver>,
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
    fn committed(&self, deliver: Deliver) {
        let mut state = self.lock();
        if let Some(why) = state.stopped.clone() {
            drop(state);
            deliver(Err(GroupCommitFailed::new(why.to_string())));
            return;
        }
        state.waiting.push(deliver);
        drop(state);
        self.wake.notify_one();
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
                std::mem::take(&mut state.waiting)
            };
            let started = std::time::Instant::now();
            let synced = self.wal.sync();
            let took = started.elapsed();
            let members = batch.len();
            let group = self.queue.counts().synced(members);
            crate::recorder::write_group(self.queue.database(), members, took);
            tracing::debug!(
                db.namespace = %self.queue.database(),
                db.write.group = group,
                db.write.transactions = members,
                db.write.fsync_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                db.write.fsync_ok = synced.is_ok(),
                "group commit: an fsync of the WAL ran for the transactions waiting"
            );
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
        }
    }
}
