//! A model check of the write path with `shuttle`: the crate's own `src/write/core/turn.rs`,
//! and `src/write/sqlx/`'s `pool.rs`, `transaction.rs`, `session.rs`, `checkpoint.rs`, `group.rs`, `gate.rs` and `driver.rs`, included as they are, over a driver that
//! models sqlx's SQLite worker (`Model` below), under thousands of schedules chosen at random
//! and by PCT.
//!
//! The model of the worker is sqlx's protocol, step for step (`sqlx-sqlite`'s
//! `connection/worker.rs`): one thread per connection runs its commands in order; `BEGIN`,
//! `COMMIT` and `ROLLBACK` are answered through a rendezvous (the worker learns whether the
//! answer was read); a `BEGIN` whose answer nobody read is rolled back at once; a `COMMIT` or
//! acknowledged `ROLLBACK` whose answer nobody read arms "skip the next unacknowledged
//! rollback" (the one sqlx's `Transaction::drop` sends); the transaction depth is the worker's.
//! Its database keeps committed rows, pending rows per savepoint level, and one write lock
//! (`BEGIN IMMEDIATE` on a locked database fails at once, as with a busy timeout of 0).
//!
//! Each schedule runs three requests at once on one `WritePool` (its own writer connection or
//! the pool's, chosen per schedule; with its own, group commit on in half the schedules, its
//! shared fsync modelled as a task that makes durable what was committed when it started; the
//! WAL at `NORMAL` in a third of the schedules, where nothing is shared),
//! each a script chosen at random: commit; commit after a
//! dropped savepoint; return early; roll back; begin a second transaction after dropping the
//! first; begin a second while the first is open; and **cancel** the `begin`, the `commit` or
//! the `rollback` after 0 to 4 polls (at every await they have, the commit's hand-over to the
//! next writer included). Checked:
//!
//! - no `BEGIN IMMEDIATE` ever meets another transaction's lock (the turn passes only after
//!   the previous transaction ended on its connection);
//! - a `commit()` that returned `Ok` has its rows in the database, and its request is fenced;
//!   a transaction rolled back, dropped or failed has none there, nor has a dropped savepoint;
//!   a cancelled commit's rows are there only if its request was fenced;
//! - a second `begin` after a dropped transaction begins; one while a transaction is open
//!   fails at once with `invalid`;
//! - the writer connection's `wal_autocheckpoint` at each of its `COMMIT`s is the backstop
//!   exactly where its fsync was shared (its checkpoints then the background checkpointer's),
//!   SQLite's own threshold everywhere else (a begin cancelled between the two statements that
//!   set its level and its checkpoint must leave both to be set again);
//! - at `FULL`, a `commit()` is `Ok` only once its row is durable at that moment (its own
//!   `COMMIT`, or, with group commit, a shared fsync that started after its `COMMIT`); a commit
//!   cancelled while it waits for the fsync is fenced; one fsync in eight fails, and its
//!   waiters' `commit()`s fail, their rows committed and fenced, never `Ok`; no transaction
//!   is ever left waiting (shuttle fails a schedule in which every task waits);
//! - a handler that sets its own commit hook on its transaction's connection (then commits or
//!   rolls back, or is cancelled anywhere in its commit or rollback) leaves the writer
//!   connection with the write path's gate again, which never refuses the write path's own
//!   `COMMIT`;
//! - afterwards, the next transaction (a savepoint dropped in it, then a row) commits with
//!   exactly its row, every connection left is at depth 0 with nothing armed, and the
//!   database's lock is free.
//!
//! The last test runs the same schedules with the drop protocol this one replaced (an
//! acknowledged rollback after a cancelled commit) and requires the checker to find it
//! handing on a connection with the skip armed.

#![allow(dead_code, unreachable_pub)]

use std::any::Any;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::oneshot;
use shuttle::rand::{Rng, thread_rng};

/// The crate's `attempt` module as the write path sees it: a request's fence and deadline, and
/// the current request (here a label of the shuttle task that runs the request).
mod attempt {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::route::Route;

    pub(crate) use crate::turns::{TurnsHeld, register_writers_waiting};

    pub(crate) struct RequestState {
        fenced: AtomicBool,
        route: Route,
        turns: TurnsHeld,
    }

    impl RequestState {
        pub(crate) fn new() -> Self {
            Self {
                fenced: AtomicBool::new(false),
                route: Route {
                    method: http::Method::POST,
                },
                turns: TurnsHeld::default(),
            }
        }

        pub(crate) fn route(&self) -> &Route {
            &self.route
        }

        pub(crate) fn turns(&self) -> &TurnsHeld {
            &self.turns
        }

        pub(crate) fn fence(&self) {
            self.fenced.store(true, Ordering::SeqCst);
        }

        pub(crate) fn is_fenced(&self) -> bool {
            self.fenced.load(Ordering::SeqCst)
        }

        /// No deadline: the model has no timers (a deadline is a cancellation, which the
        /// scripts make at every await).
        pub(crate) fn deadline(&self) -> Option<tokio::time::Instant> {
            None
        }
    }

    #[derive(Clone)]
    struct Current(Arc<RequestState>);

    impl std::fmt::Debug for Current {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Current")
        }
    }

    /// Makes `request` the current one of the running task.
    pub(crate) fn enter(request: Arc<RequestState>) {
        let me = shuttle::current::get_current_task().expect("in a task");
        shuttle::current::set_label_for_task(me, Current(request));
    }

    pub(crate) fn current_request() -> Option<Arc<RequestState>> {
        let me = shuttle::current::get_current_task()?;
        shuttle::current::get_label_for_task::<Current>(me).map(|c| c.0)
    }
}

/// The crate's `route` as the write path's counts see it: a request's method and template.
mod route {
    pub(crate) struct Route {
        pub(crate) method: http::Method,
    }

    impl Route {
        pub(crate) fn path(&self) -> Option<&str> {
            Some("/model")
        }
    }
}

/// The crate's `recorder` without the `metrics` feature: nothing is emitted.
mod recorder {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::route::Route;

    /// Where a write transaction failed (the crate's label values; here, nothing).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum WriteStage {
        Turn,
        Begin,
        Commit,
        Sync,
        Rollback,
    }

    pub(crate) fn write_wait(_: Option<&Route>, _: &Arc<str>, _: Duration) {}
    pub(crate) fn write_error(_: Option<&Arc<str>>, _: WriteStage) {}
    pub(crate) fn write_held(_: Option<&Route>, _: &Arc<str>, _: Duration) {}
    pub(crate) fn write_waiting(_: &Arc<str>, _: i8) {}
    pub(crate) fn write_group(_: &Arc<str>, _: usize, _: Duration) {}
    pub(crate) fn write_sync_failed(_: &Arc<str>) {}
}

/// The crate's `classify` as the write path sees it: a retryable error's marker.
mod classify {
    #[derive(Clone, Debug)]
    pub struct Retryable;

    impl Retryable {
        pub fn name(&self) -> &str {
            "MODEL_BUSY"
        }
    }
}

// Which turns a request holds: the request core's own file.
#[path = "../src/attempt/turns.rs"]
mod turns;

// The write path's files, as they are, in the crate's own tree (`crate::write::..`).
#[path = "../src/write"]
mod write {
    pub mod core {
        pub mod bound;
        pub mod failed;
        pub mod file_turn;
        pub mod stats;
        pub mod turn;

        /// What the turn's holder and counts synchronize with: shuttle's, so that the scheduler
        /// sees them.
        pub mod sync {
            pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
        }
    }
    pub mod durable {
        pub mod report;
        pub mod wal;
    }
    pub mod sqlx {
        pub mod checkpoint;
        pub mod driver;
        pub mod gate;
        pub mod group;
        pub mod pool;
        pub mod session;
        pub mod transaction;
    }
}

use attempt::RequestState;
use driver::Driver;
use pool::WritePool;
use transaction::Transaction;
use write::core::failed;
use write::durable::wal;
use write::sqlx::{driver, gate, pool, transaction};

// ---------------------------------------------------------------------------------------------
// The model of sqlx's SQLite worker and of a database.

#[derive(Clone, Debug, PartialEq)]
enum ModelError {
    /// `BEGIN IMMEDIATE` met another connection's lock.
    Busy,
    /// A custom `BEGIN` inside a transaction (sqlx's `InvalidSavePointStatement`).
    InvalidSavePoint,
    WorkerCrashed,
    TimedOut,
    Closed,
    Invalid(String),
    /// Group commit's fsync failed.
    Group(String),
}

/// One database: committed rows, one write lock, every connection opened on it.
struct Db {
    id: usize,
    committed: Mutex<BTreeSet<u32>>,
    /// What an fsync made durable: the rows committed when it started (or when a `COMMIT` at
    /// `FULL` returned).
    durable: Mutex<BTreeSet<u32>>,
    /// Rows whose `commit()` returned `Ok` before they were durable.
    acknowledged_early: Mutex<Vec<u32>>,
    /// A sync of the WAL failed: the frames it was to make durable may never reach the disk,
    /// and recovery stops at the first that does not, so nothing committed since is durable
    /// either, however many later fsyncs (the shared one's, a `COMMIT`'s own) succeed.
    failed: std::sync::atomic::AtomicBool,
    /// The connection holding the write lock.
    lock: Mutex<Option<usize>>,
    /// `BEGIN IMMEDIATE`s that met the lock.
    busy: AtomicUsize,
    connections: Mutex<Vec<Arc<ConnState>>>,
    /// The drop protocol under test: sqlx's (`false`), or the one this design replaced
    /// (`true`: an acknowledged rollback after a cancelled commit, for the last test).
    old_protocol: bool,
    /// Background checkpoints under way (`checkpoint.rs`): never more than one.
    checkpointing: AtomicUsize,
    /// The tasks the write path spawned (`Driver::spawn`), awaited before the checks: a
    /// checkpoint takes the turn between transactions, and may still hold it when the
    /// schedule's last writer is done.
    tasks: Mutex<Vec<shuttle::future::JoinHandle<()>>>,
    /// The WAL at `NORMAL` (a third of the schedules): no fsync to share (group commit changes
    /// nothing), a `COMMIT` is not durable when it returns (nor meant to be), and the writer
    /// connection checkpoints as SQLite does.
    normal: bool,
}

/// What a connection's worker shares with its handle.
struct ConnState {
    id: usize,
    db: usize,
    old_protocol: bool,
    depth: AtomicUsize,
    /// sqlx's `ignore_next_start_rollback`.
    armed: AtomicBool,
    /// The handle was dropped: the connection closes once its worker ran what was queued.
    dropped: AtomicBool,
    closed: AtomicBool,
    /// A `WritePool`'s own writer connection (detached from its pool).
    writer: AtomicBool,
    /// `PRAGMA wal_autocheckpoint`: the database's threshold (one page), until set.
    autocheckpoint: AtomicU32,
    /// A handler's own commit hook is the connection's (it replaced the write path's gate).
    handler_hook: AtomicBool,
}

/// A connection's commit hook.
enum Hook {
    /// The write path's (`gate.rs`).
    Gate(Arc<gate::CommitGate>),
    /// One a handler set through the connection (`lock_handle()`): lets every commit through.
    Handler,
}

type Answer = (Result<(), ModelError>, oneshot::Sender<()>);

enum Command {
    Begin {
        immediate: bool,
        answer: oneshot::Sender<Answer>,
    },
    Commit(oneshot::Sender<Answer>),
    Rollback(Option<oneshot::Sender<Answer>>),
    Insert(u32, oneshot::Sender<()>),
    Ping(oneshot::Sender<()>),
    /// `PRAGMA synchronous`: `true` for `FULL` (a `COMMIT` is durable when it returns).
    Synchronous(bool, oneshot::Sender<()>),
    /// `set_commit_hook`.
    Hook(Hook, oneshot::Sender<()>),
}

/// A connection: the sending end of its worker's commands.
struct Conn {
    commands: shuttle::sync::mpsc::Sender<Command>,
    state: Arc<ConnState>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.state.dropped.store(true, Ordering::SeqCst);
    }
}

/// A pool's connection (the model's pools do not recycle: it closes when dropped).
struct Pooled(Conn);

impl std::ops::Deref for Pooled {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.0
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.0
    }
}

#[derive(Clone)]
struct Pool(Arc<Db>);

/// Answers through the rendezvous: whether the answer was read.
fn rendezvous(answer: oneshot::Sender<Answer>, value: Result<(), ModelError>) -> bool {
    let (read_tx, read_rx) = oneshot::channel();
    if answer.send((value, read_tx)).is_err() {
        return false;
    }
    shuttle::future::block_on(read_rx).is_ok()
}

/// The worker of one connection: sqlx's command loop.
fn worker(db: Arc<Db>, state: Arc<ConnState>, commands: shuttle::sync::mpsc::Receiver<Command>) {
    let mut levels: Vec<Vec<u32>> = Vec::new();
    let mut ignore_next_start_rollback = false;
    // A connection opens at the database's level: `FULL` (sqlx's default) or `NORMAL`.
    let mut full = !db.normal;
    let mut hook: Option<Hook> = None;
    let unlock = |db: &Db| {
        let mut lock = db.lock.lock().unwrap();
        if *lock == Some(state.id) {
            *lock = None;
        }
    };
    while let Ok(command) = commands.recv() {
        match command {
            Command::Begin { immediate, answer } => {
                let result = if immediate && !levels.is_empty() {
                    Err(ModelError::InvalidSavePoint)
                } else if levels.is_empty() {
                    let mut lock = db.lock.lock().unwrap();
                    if lock.is_some() {
                        db.busy.fetch_add(1, Ordering::SeqCst);
                        Err(ModelError::Busy)
                    } else {
                        *lock = Some(state.id);
                        Ok(())
                    }
                } else {
                    Ok(())
                };
                let ok = result.is_ok();
                if ok {
                    levels.push(Vec::new());
                }
                state.depth.store(levels.len(), Ordering::SeqCst);
                if !rendezvous(answer, result) && ok {
                    // The BEGIN was not acknowledged: roll it back at once.
                    levels.pop();
                    if levels.is_empty() {
                        unlock(&db);
                    }
                    state.depth.store(levels.len(), Ordering::SeqCst);
                }
            }
            Command::Commit(answer) => {
                match levels.len() {
                    0 => {}
                    1 => {
                        if state.writer.load(Ordering::SeqCst) {
                            // The writer connection's own checkpoint is only the backstop
                            // exactly where its fsync is shared (at `NORMAL` in a database at
                            // `FULL`): its checkpoints are then the background checkpointer's.
                            // Elsewhere it checkpoints as SQLite does (one page).
                            let expected = if !full && !db.normal {
                                driver::BACKSTOP_PAGES
                            } else {
                                1
                            };
                            assert_eq!(
                                state.autocheckpoint.load(Ordering::SeqCst),
                                expected,
                                "the writer connection committed at {} with the wrong \
                                 wal_autocheckpoint",
                                if full { "FULL" } else { "NORMAL" }
                            );
                        }
                        // The commit hook: the gate admits only the write path's own `COMMIT`,
                        // and every level-1 commit here is one.
                        if let Some(Hook::Gate(gate)) = &hook {
                            assert!(gate.admits(), "the gate refused the write path's COMMIT");
                        }
                        let rows = levels.pop().unwrap();
                        let mut committed = db.committed.lock().unwrap();
                        committed.extend(rows);
                        if full && !db.failed.load(Ordering::SeqCst) {
                            // The COMMIT's fsync: everything in the WAL so far is durable (but
                            // never after a failed sync: its frames may be missing).
                            db.durable.lock().unwrap().extend(committed.iter().copied());
                        }
                        drop(committed);
                        unlock(&db);
                    }
                    _ => {
                        let rows = levels.pop().unwrap();
                        levels.last_mut().unwrap().extend(rows);
                    }
                }
                state.depth.store(levels.len(), Ordering::SeqCst);
                if !rendezvous(answer, Ok(())) {
                    ignore_next_start_rollback = true;
                }
            }
            Command::Rollback(answer) => {
                if ignore_next_start_rollback && answer.is_none() {
                    ignore_next_start_rollback = false;
                    state.armed.store(false, Ordering::SeqCst);
                    continue;
                }
                if levels.pop().is_some() && levels.is_empty() {
                    unlock(&db);
                }
                state.depth.store(levels.len(), Ordering::SeqCst);
                if let Some(answer) = answer
                    && !rendezvous(answer, Ok(()))
                {
                    ignore_next_start_rollback = true;
                }
            }
            Command::Insert(row, done) => {
                match levels.last_mut() {
                    Some(level) => level.push(row),
                    None => panic!("the model writes only inside transactions"),
                }
                let _ = done.send(());
            }
            Command::Ping(done) => {
                let _ = done.send(());
            }
            Command::Synchronous(level, done) => {
                full = level;
                let _ = done.send(());
            }
            Command::Hook(set, done) => {
                state
                    .handler_hook
                    .store(matches!(set, Hook::Handler), Ordering::SeqCst);
                hook = Some(set);
                let _ = done.send(());
            }
        }
        state
            .armed
            .store(ignore_next_start_rollback, Ordering::SeqCst);
    }
    // Closed: SQLite rolls back whatever is open.
    levels.clear();
    unlock(&db);
    state.depth.store(0, Ordering::SeqCst);
    state.closed.store(true, Ordering::SeqCst);
}

impl Db {
    fn open(self: &Arc<Self>) -> Conn {
        let mut connections = self.connections.lock().unwrap();
        let state = Arc::new(ConnState {
            id: connections.len() + 1,
            db: self.id,
            old_protocol: self.old_protocol,
            depth: AtomicUsize::new(0),
            armed: AtomicBool::new(false),
            dropped: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            writer: AtomicBool::new(false),
            autocheckpoint: AtomicU32::new(1),
            handler_hook: AtomicBool::new(false),
        });
        connections.push(Arc::clone(&state));
        let (commands, receiver) = shuttle::sync::mpsc::channel();
        let (db, worker_state) = (Arc::clone(self), Arc::clone(&state));
        shuttle::thread::spawn(move || worker(db, worker_state, receiver));
        Conn { commands, state }
    }
}

/// An acknowledged command: `BEGIN`, `COMMIT`, `ROLLBACK`.
async fn acknowledged(
    conn: &Conn,
    command: impl FnOnce(oneshot::Sender<Answer>) -> Command,
) -> Result<(), ModelError> {
    let (answer, answered) = oneshot::channel();
    conn.commands
        .send(command(answer))
        .map_err(|_| ModelError::WorkerCrashed)?;
    let (value, read) = answered.await.map_err(|_| ModelError::WorkerCrashed)?;
    let _ = read.send(());
    value
}

/// Sets the connection's commit hook (an await of its own: cancellable).
async fn set_hook(conn: &mut Conn, set: Hook) -> Result<(), ModelError> {
    let (done, finished) = oneshot::channel();
    conn.commands
        .send(Command::Hook(set, done))
        .map_err(|_| ModelError::WorkerCrashed)?;
    finished.await.map_err(|_| ModelError::WorkerCrashed)
}

async fn insert(conn: &mut Conn, row: u32) {
    let (done, finished) = oneshot::channel();
    conn.commands.send(Command::Insert(row, done)).unwrap();
    finished.await.unwrap();
}

struct Model;

impl Driver for Model {
    type Connection = Conn;
    type Pooled = Pooled;
    type Pool = Pool;
    type Error = ModelError;

    async fn acquire(pool: &Pool) -> Result<Pooled, ModelError> {
        Ok(Pooled(pool.0.open()))
    }

    fn detach(conn: Pooled) -> Conn {
        conn.0.state.writer.store(true, Ordering::SeqCst);
        conn.0
    }

    fn is_closed(_: &Pool) -> bool {
        false
    }

    fn acquire_timeout(_: &Pool) -> Duration {
        // No timers in the model: a bound that cannot be represented is none.
        Duration::MAX
    }

    fn opener(pool: &Pool) -> Pool {
        pool.clone()
    }

    async fn close_pool(_: &Pool) {}

    fn identity(pool: &Pool) -> Arc<dyn Any + Send + Sync> {
        pool.0.clone()
    }

    async fn main_file(conn: &mut Conn) -> Result<Option<PathBuf>, ModelError> {
        let db = conn.state.db;
        Ok(Some(PathBuf::from(format!(
            "/tower-sqlite-retry-model/{db}.db"
        ))))
    }

    fn begin_immediate(
        conn: &mut Conn,
    ) -> impl Future<Output = Result<(), ModelError>> + Send + '_ {
        acknowledged(conn, |answer| Command::Begin {
            immediate: true,
            answer,
        })
    }

    async fn durability(_: &mut Conn) -> Result<(bool, u8), ModelError> {
        // WAL at `FULL`, where group commit shares the fsync, or at `NORMAL`.
        let normal = CURRENT.with(|current| current.borrow().as_ref().is_some_and(|db| db.normal));
        Ok((true, if normal { 1 } else { 2 }))
    }

    async fn autocheckpoint(_: &mut Conn) -> Result<Option<u32>, ModelError> {
        // A threshold of one page: every commit may start a checkpoint (one at a time).
        Ok(Some(1))
    }

    async fn set_autocheckpoint(conn: &mut Conn, pages: u32) -> Result<(), ModelError> {
        // An await of its own in `begin`, after the level's: cancellable between the two.
        shuttle::future::yield_now().await;
        conn.state.autocheckpoint.store(pages, Ordering::SeqCst);
        Ok(())
    }

    async fn checkpoint(conn: &mut Conn, _restart: bool) -> Result<(bool, u64, u64), ModelError> {
        let db = CURRENT.with(|current| current.borrow().clone().expect("a schedule runs"));
        assert!(!conn.state.dropped.load(Ordering::SeqCst));
        let before = db.checkpointing.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two background checkpoints at once");
        // A checkpoint takes time: commits (and their checkpoint requests) happen meanwhile.
        shuttle::future::yield_now().await;
        db.checkpointing.fetch_sub(1, Ordering::SeqCst);
        Ok((true, 1, 1))
    }

    async fn set_synchronous(conn: &mut Conn, level: u8) -> Result<(), ModelError> {
        // Set on the worker, in order with the commands before and after it.
        let (done, finished) = oneshot::channel();
        conn.commands
            .send(Command::Synchronous(level >= 2, done))
            .map_err(|_| ModelError::WorkerCrashed)?;
        finished.await.map_err(|_| ModelError::WorkerCrashed)
    }

    fn open_wal(_: &std::path::Path) -> std::io::Result<wal::Wal> {
        // A descriptor the model never syncs (`sync_wal` below stands in for the fsync).
        wal::Wal::open(std::path::Path::new("/dev/null"))
    }

    async fn sync_wal(_: Arc<wal::Wal>) -> Result<(), wal::SyncError> {
        let db = CURRENT.with(|current| current.borrow().clone().expect("a schedule runs"));
        let snapshot = db.committed.lock().unwrap().clone();
        // The fsync takes time: others commit meanwhile, and are not made durable by it.
        shuttle::future::yield_now().await;
        // One in eight fails (an I/O error): nothing made durable, the waiters told so.
        // One in sixteen never runs to its end (its blocking task panicked, or the runtime
        // shut down): its waiters are not told durable, but the disk refused nothing, so
        // nothing is refused after it.
        if thread_rng().gen_ratio(1, 16) {
            return Err(wal::SyncError::NotRun(
                "the model's fsync task was cancelled".into(),
            ));
        }
        if thread_rng().gen_ratio(1, 8) {
            db.failed.store(true, Ordering::SeqCst);
            return Err(wal::SyncError::Disk(std::io::Error::other(
                "the model's fsync failed",
            )));
        }
        if !db.failed.load(Ordering::SeqCst) {
            db.durable.lock().unwrap().extend(snapshot);
        }
        Ok(())
    }

    fn commit(conn: &mut Conn) -> impl Future<Output = Result<(), ModelError>> + Send + '_ {
        acknowledged(conn, Command::Commit)
    }

    fn rollback(conn: &mut Conn) -> impl Future<Output = Result<(), ModelError>> + Send + '_ {
        acknowledged(conn, |answer| Command::Rollback(Some(answer)))
    }

    fn start_rollback(conn: &mut Conn) {
        if conn.state.old_protocol {
            // The protocol this design replaced: an acknowledged rollback, its answer read in
            // the background. It leaves a skip that a cancelled commit armed in place.
            let (answer, answered) = oneshot::channel::<Answer>();
            let _ = conn.commands.send(Command::Rollback(Some(answer)));
            drop(shuttle::future::spawn(async move {
                if let Ok((_, read)) = answered.await {
                    let _ = read.send(());
                }
            }));
            return;
        }
        let _ = conn.commands.send(Command::Rollback(None));
    }

    fn depth(conn: &Conn) -> usize {
        conn.state.depth.load(Ordering::SeqCst)
    }

    async fn ping(conn: &mut Conn) -> Result<(), ModelError> {
        let (done, finished) = oneshot::channel();
        conn.commands
            .send(Command::Ping(done))
            .map_err(|_| ModelError::WorkerCrashed)?;
        finished.await.map_err(|_| ModelError::WorkerCrashed)
    }

    async fn close(conn: Conn) {
        drop(conn);
    }

    fn timed_out() -> ModelError {
        ModelError::TimedOut
    }

    fn closed() -> ModelError {
        ModelError::Closed
    }

    fn invalid(message: String) -> ModelError {
        ModelError::Invalid(message)
    }

    fn is_database_error(error: &ModelError) -> bool {
        matches!(error, ModelError::Busy)
    }

    fn classify(error: &ModelError) -> Option<classify::Retryable> {
        matches!(error, ModelError::Busy).then_some(classify::Retryable)
    }

    fn group_failed(failure: failed::GroupCommitFailed) -> ModelError {
        ModelError::Group(failure.to_string())
    }

    fn is_io_error(_: &ModelError) -> bool {
        // The model's disk fails only in the shared fsync (`sync_wal`).
        false
    }

    async fn guard_commits(
        conn: &mut Conn,
        gate: Arc<gate::CommitGate>,
    ) -> Result<bool, ModelError> {
        set_hook(conn, Hook::Gate(gate)).await?;
        Ok(true)
    }

    fn spawn(task: impl Future<Output = ()> + Send + 'static) {
        let task = shuttle::future::spawn(task);
        match CURRENT.with(|current| current.borrow().clone()) {
            Some(db) => db.tasks.lock().unwrap().push(task),
            None => drop(task),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Savepoints, as sqlx's own nested `Transaction` makes them on the write transaction's
// connection: `BEGIN` (a `SAVEPOINT` inside), and `start_rollback` when dropped open.

struct Savepoint<'c> {
    conn: &'c mut Conn,
    open: bool,
}

impl<'c> Savepoint<'c> {
    async fn begin(conn: &'c mut Conn) -> Savepoint<'c> {
        acknowledged(conn, |answer| Command::Begin {
            immediate: false,
            answer,
        })
        .await
        .expect("a savepoint begins");
        Savepoint { conn, open: true }
    }
}

impl Drop for Savepoint<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.commands.send(Command::Rollback(None));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation at any await: a future polled at most `polls` times, then dropped.

struct Cancel<F> {
    future: Pin<Box<F>>,
    polls: usize,
}

/// `future`, dropped when it returns pending for the `polls`-th time (never polled: 0).
fn cancel_after<F: Future>(polls: usize, future: F) -> Cancel<F> {
    Cancel {
        future: Box::pin(future),
        polls,
    }
}

impl<F: Future> Future for Cancel<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polls == 0 {
            return Poll::Ready(None);
        }
        match self.future.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending => {
                self.polls -= 1;
                if self.polls == 0 {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The scripts a request runs, and what each says of its rows.

#[derive(Clone, Copy, Debug)]
enum Script {
    Commit,
    CommitAfterDroppedSavepoint,
    ReturnEarly,
    Rollback,
    SecondAfterDropped,
    SecondWhileOpen,
    CancelBegin(usize),
    CancelCommit(usize),
    CancelRollback(usize),
    /// A savepoint whose commit is cancelled and which is then forgotten (`mem::forget`): a
    /// skip may be left armed on the connection, for the next `begin` to clear.
    ForgottenSavepoint(usize),
    /// The handler sets its own commit hook on the transaction's connection, then commits
    /// (`false`) or rolls back (`true`): the write path's gate must be back after either.
    HandlerHook(bool),
}

fn pick() -> Script {
    let polls = thread_rng().gen_range(0..5);
    match thread_rng().gen_range(0..11) {
        0 => Script::Commit,
        1 => Script::CommitAfterDroppedSavepoint,
        2 => Script::ReturnEarly,
        3 => Script::Rollback,
        4 => Script::SecondAfterDropped,
        5 => Script::SecondWhileOpen,
        6 => Script::CancelBegin(polls),
        7 => Script::CancelCommit(polls),
        8 => Script::CancelRollback(polls),
        9 => Script::HandlerHook(thread_rng().gen_bool(0.5)),
        _ => Script::ForgottenSavepoint(polls),
    }
}

/// What became of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// `commit()` returned `Ok`: it must be there.
    Committed,
    /// Rolled back, dropped, failed, a dropped savepoint's: it must not be there.
    Gone,
    /// The commit was cancelled: there only if the request was fenced.
    Unknown,
    /// Either way (released into a transaction that committed, or not).
    Either,
    /// `commit()` failed because the shared fsync did: committed (and fenced), not known to be
    /// durable.
    Unsynced,
}

/// Notes a row whose `commit()` just returned `Ok`: it must be durable now (its own `COMMIT`
/// at `FULL`, or a shared fsync that completed), not only by the end of the schedule, when a
/// later commit's fsync would have made it so anyway.
fn acknowledged_row(row: u32) {
    CURRENT.with(|current| {
        let db = current.borrow().clone().expect("a schedule runs");
        if !db.normal && !db.durable.lock().unwrap().contains(&row) {
            db.acknowledged_early.lock().unwrap().push(row);
        }
    });
}

/// A `commit()`'s result, for a row that must commit: `Ok` (durable now), or the shared fsync
/// failed (committed, not known durable: either way in the file, never `Gone`).
fn must_commit(result: Result<(), ModelError>, row: u32) -> Fate {
    match result {
        Ok(()) => {
            acknowledged_row(row);
            Fate::Committed
        }
        Err(ModelError::Group(_)) => Fate::Unsynced,
        Err(error) => panic!("commit: {error:?}"),
    }
}

/// A transaction, or `None` when the database refuses writes (an earlier sync of its WAL
/// failed: only then).
async fn begin(writes: &WritePool<Model>) -> Option<Transaction<Model>> {
    refused_or(writes.begin().await)
}

/// `begun`, or `None` if it is the refusal that follows a failed sync of the WAL.
fn refused_or(begun: Result<Transaction<Model>, ModelError>) -> Option<Transaction<Model>> {
    match begun {
        Ok(tx) => Some(tx),
        Err(ModelError::Group(why)) if why.contains("write refused") => {
            let failed = CURRENT.with(|current| {
                let db = current.borrow().clone().expect("a schedule runs");
                db.failed.load(Ordering::SeqCst)
            });
            assert!(failed, "refused although no sync failed: {why}");
            None
        }
        Err(error) => panic!("begin: {error:?}"),
    }
}

/// Runs `script` as request `r`; the fates of the rows it wrote (`r * 10 + n`).
async fn run(script: Script, writes: &WritePool<Model>, r: u32) -> Vec<(u32, Fate)> {
    let row = |n: u32| r * 10 + n;
    let mut fates = Vec::new();
    match script {
        Script::Commit => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            insert(&mut tx, row(0)).await;
            let fate = match tx.commit().await {
                Ok(()) => {
                    acknowledged_row(row(0));
                    Fate::Committed
                }
                // The shared fsync failed: the COMMIT went through.
                Err(ModelError::Group(_)) => Fate::Unsynced,
                Err(_) => Fate::Gone,
            };
            fates.push((row(0), fate));
        }
        Script::CommitAfterDroppedSavepoint => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            {
                let savepoint = Savepoint::begin(&mut tx).await;
                insert(savepoint.conn, row(1)).await;
            }
            fates.push((row(1), Fate::Gone));
            insert(&mut tx, row(0)).await;
            fates.push((row(0), must_commit(tx.commit().await, row(0))));
        }
        Script::ReturnEarly => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            insert(&mut tx, row(0)).await;
            fates.push((row(0), Fate::Gone));
        }
        Script::Rollback => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            insert(&mut tx, row(0)).await;
            tx.rollback().await.expect("rollback");
            fates.push((row(0), Fate::Gone));
        }
        Script::SecondAfterDropped => {
            let Some(mut first) = begin(writes).await else {
                return fates;
            };
            insert(&mut first, row(0)).await;
            drop(first);
            fates.push((row(0), Fate::Gone));
            let Some(mut second) = begin(writes).await else {
                return fates; // a second begin after a drop begins, unless refused
            };
            insert(&mut second, row(1)).await;
            fates.push((row(1), must_commit(second.commit().await, row(1))));
        }
        Script::SecondWhileOpen => {
            let Some(mut first) = begin(writes).await else {
                return fates;
            };
            insert(&mut first, row(0)).await;
            match writes.begin().await {
                Err(ModelError::Invalid(_)) => {}
                other => panic!("a second begin while one is open: {:?}", other.map(drop)),
            }
            fates.push((row(0), must_commit(first.commit().await, row(0))));
        }
        Script::CancelBegin(polls) => {
            if let Some(tx) = cancel_after(polls, writes.begin()).await {
                let Some(mut tx) = refused_or(tx) else {
                    return fates;
                };
                insert(&mut tx, row(0)).await;
                fates.push((row(0), must_commit(tx.commit().await, row(0))));
            }
        }
        Script::CancelCommit(polls) => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            insert(&mut tx, row(0)).await;
            let fate = match cancel_after(polls, tx.commit()).await {
                Some(Ok(())) => {
                    acknowledged_row(row(0));
                    Fate::Committed
                }
                Some(Err(ModelError::Group(_))) => Fate::Unsynced,
                Some(Err(_)) => Fate::Gone,
                None => Fate::Unknown,
            };
            fates.push((row(0), fate));
        }
        Script::ForgottenSavepoint(polls) => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            {
                let savepoint = Savepoint::begin(&mut tx).await;
                insert(savepoint.conn, row(1)).await;
                let _ = cancel_after(polls, acknowledged(savepoint.conn, Command::Commit)).await;
                std::mem::forget(savepoint);
            }
            insert(&mut tx, row(0)).await;
            let (fate, committed) = match tx.commit().await {
                Ok(()) => {
                    acknowledged_row(row(0));
                    (Fate::Committed, true)
                }
                Err(ModelError::Group(_)) => (Fate::Unsynced, true),
                Err(_) => (Fate::Gone, false),
            };
            fates.push((row(0), fate));
            fates.push((row(1), if committed { Fate::Either } else { Fate::Gone }));
        }
        Script::HandlerHook(roll_back) => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            set_hook(&mut tx, Hook::Handler)
                .await
                .expect("set_commit_hook");
            insert(&mut tx, row(0)).await;
            if roll_back {
                tx.rollback().await.expect("rollback");
                fates.push((row(0), Fate::Gone));
            } else {
                fates.push((row(0), must_commit(tx.commit().await, row(0))));
            }
        }
        Script::CancelRollback(polls) => {
            let Some(mut tx) = begin(writes).await else {
                return fates;
            };
            insert(&mut tx, row(0)).await;
            let _ = cancel_after(polls, tx.rollback()).await;
            fates.push((row(0), Fate::Gone));
        }
    }
    fates
}

static DATABASES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The database of the schedule running on this thread (shuttle runs a test's schedules
    /// on its thread), for the model's fsync, which is given only a path.
    static CURRENT: std::cell::RefCell<Option<Arc<Db>>> = const { std::cell::RefCell::new(None) };
}

/// One schedule: three requests at once, then the checks.
fn scenario(old_protocol: bool) {
    let db = Arc::new(Db {
        id: DATABASES.fetch_add(1, Ordering::Relaxed),
        committed: Mutex::default(),
        durable: Mutex::default(),
        acknowledged_early: Mutex::default(),
        failed: std::sync::atomic::AtomicBool::new(false),
        lock: Mutex::default(),
        busy: AtomicUsize::new(0),
        connections: Mutex::default(),
        old_protocol,
        checkpointing: AtomicUsize::new(0),
        tasks: Mutex::default(),
        normal: thread_rng().gen_bool(1.0 / 3.0),
    });
    CURRENT.with(|current| *current.borrow_mut() = Some(Arc::clone(&db)));
    let own = thread_rng().gen_bool(0.5);
    // Group commit, in half the schedules (it needs the writer connection: `own`).
    let group = own && thread_rng().gen_bool(0.5);
    let writes = WritePool::<Model>::new(Pool(Arc::clone(&db)), own).group_commit(group);
    let scripts: Vec<Script> = (0..3).map(|_| pick()).collect();
    if std::env::var("MODEL_TRACE").is_ok() {
        eprintln!(
            "scripts {scripts:?} group {group:?} own {own} normal {}",
            db.normal
        );
    }
    let requests: Vec<_> = scripts
        .iter()
        .enumerate()
        .map(|(r, &script)| {
            let writes = writes.clone();
            shuttle::future::spawn(async move {
                let request = Arc::new(RequestState::new());
                attempt::enter(Arc::clone(&request));
                let fates = run(script, &writes, r as u32 + 1).await;
                (request, fates)
            })
        })
        .collect();
    let outcomes: Vec<_> = requests
        .into_iter()
        .map(|r| shuttle::future::block_on(r).expect("request"))
        .collect();

    // The next writer, once everything above is over: a dropped savepoint, then one row.
    let next_written = shuttle::future::block_on(async {
        // (refused only after a failed sync of the WAL)
        let Some(mut tx) = refused_or(writes.begin().await) else {
            return false;
        };
        {
            let savepoint = Savepoint::begin(&mut tx).await;
            insert(savepoint.conn, 1).await;
        }
        insert(&mut tx, 2).await;
        match tx.commit().await {
            Ok(()) => acknowledged_row(2),
            // Committed (a failed shared fsync too: the COMMIT went through).
            Err(ModelError::Group(_)) => {}
            Err(error) => panic!("the next writer commits: {error:?}"),
        }
        true
    });

    // Every background task done (a checkpoint's, a sync's, an abandoned transaction's).
    loop {
        let tasks = std::mem::take(&mut *db.tasks.lock().unwrap());
        if tasks.is_empty() {
            break;
        }
        for task in tasks {
            shuttle::future::block_on(task).expect("a background task");
        }
    }

    let committed = db.committed.lock().unwrap().clone();
    let durable = db.durable.lock().unwrap().clone();
    assert_eq!(
        *db.acknowledged_early.lock().unwrap(),
        Vec::<u32>::new(),
        "{scripts:?}: commit() returned Ok before its row was durable"
    );
    assert_eq!(
        db.busy.load(Ordering::SeqCst),
        0,
        "a BEGIN met another transaction's lock"
    );
    assert!(
        !next_written || committed.contains(&2),
        "{scripts:?}: the next writer's commit was Ok for a row that is not there"
    );
    assert!(
        !committed.contains(&1),
        "{scripts:?}: a dropped savepoint's row is there"
    );
    for (request, fates) in &outcomes {
        for &(row, fate) in fates {
            match fate {
                Fate::Committed => {
                    assert!(
                        committed.contains(&row),
                        "{scripts:?}: row {row} committed Ok, not there"
                    );
                    assert!(request.is_fenced(), "{scripts:?}: committed, not fenced");
                    assert!(
                        !group || db.normal || durable.contains(&row),
                        "{scripts:?}: row {row} committed Ok before an fsync made it durable"
                    );
                }
                Fate::Gone => assert!(
                    !committed.contains(&row),
                    "{scripts:?}: row {row} should be gone"
                ),
                Fate::Either => {}
                Fate::Unsynced => {
                    assert!(
                        committed.contains(&row),
                        "{scripts:?}: row {row} told its fsync failed, not committed"
                    );
                    assert!(request.is_fenced(), "{scripts:?}: committed, not fenced");
                }
                Fate::Unknown => assert!(
                    !committed.contains(&row) || request.is_fenced(),
                    "{scripts:?}: row {row} committed by a cancelled commit, request not fenced"
                ),
            }
        }
    }
    assert_eq!(*db.lock.lock().unwrap(), None, "the write lock is free");
    let stats = writes.stats().expect("the database was asked");
    assert_eq!(stats.waiting, 0, "{scripts:?}: nobody is counted waiting");
    assert!(
        !stats.held,
        "{scripts:?}: nobody is counted holding the turn"
    );
    assert!(stats.transactions >= 1);
    for conn in db.connections.lock().unwrap().iter() {
        // Every connection still in use (the writer connection, if any): a dropped one closes,
        // rolling back whatever it holds.
        if !conn.dropped.load(Ordering::SeqCst) {
            assert_eq!(
                conn.depth.load(Ordering::SeqCst),
                0,
                "{scripts:?}: a connection left in a transaction"
            );
            assert!(
                !conn.armed.load(Ordering::SeqCst),
                "{scripts:?}: a connection left with a rollback skip armed"
            );
            // The writer connection's commit hook is the write path's gate again, however
            // a transaction whose handler set its own ended.
            assert!(
                !(conn.writer.load(Ordering::SeqCst) && conn.handler_hook.load(Ordering::SeqCst)),
                "{scripts:?}: a handler's commit hook outlived its transaction"
            );
        }
    }
}

/// shuttle's runner with stacks large enough for the write path's futures (the default 60 KiB
/// overflows).
fn runner<S: shuttle::scheduler::Scheduler + 'static>(scheduler: S) -> shuttle::Runner<S> {
    let mut config = shuttle::Config::new();
    config.stack_size = 1 << 20;
    shuttle::Runner::new(scheduler, config)
}

#[test]
fn random_schedules_hand_on_clean_connections_and_lose_no_commit() {
    runner(shuttle::scheduler::RandomScheduler::new(10_000)).run(|| scenario(false));
}

#[test]
fn pct_schedules_hand_on_clean_connections_and_lose_no_commit() {
    runner(shuttle::scheduler::PctScheduler::new(3, 10_000)).run(|| scenario(false));
}

#[test]
fn the_model_finds_the_earlier_drop_protocol_arming_a_skip() {
    let found = std::panic::catch_unwind(|| {
        runner(shuttle::scheduler::RandomScheduler::new(4_000)).run(|| scenario(true));
    });
    assert!(found.is_err(), "the checker finds the armed skip");
}
