//! `WriteThread`: the writer thread for rusqlite.

use std::any::Any;
use std::os::raw::c_int;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, DropBehavior, Transaction, TransactionBehavior};

use super::{Core, Errors, Owned, Ran, WriteThreadOptions};
use crate::recorder::WriteStage;
use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::stats::WriteStats;

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
/// - **Deadline and cancellation**: the caller is answered at its request's deadline, by a
///   timer of its own, whatever the writer thread is doing; a closure that has not begun by
///   then, or whose caller stopped waiting, never runs (and what it captured is freed at
///   once). SQLite's wait for another process's lock ends at the deadline too. One that began
///   runs to its end, and is counted whether or not anyone hears of it.
/// - **A clean connection**: whatever a closure leaves (its transaction open, ended by a raw
///   `COMMIT`, rolled back by SQLite after `SQLITE_FULL` or a trigger), the connection is
///   rolled back to no transaction before the next; a transaction ended inside its closure
///   fences its request.
/// - **Bounded and visible**: at most 512 closures wait for the writer thread (past that a
///   caller waits for room within its deadline); each is counted waiting for the turn from the
///   moment it is sent. The whole list: `docs/write-path.md`, "Other drivers".
///
/// Cloning is cheap: every clone hands its closures to the same thread. The threads end once
/// the last clone is dropped and the closures sent before have run (and their fsync).
///
/// **Reads beside a flood of writes.** The writer thread does not make writers wait the way
/// SQLite's busy handler or the sqlx write path's turn does: every write request in flight
/// goes on competing with the reads (for the CPU, for the read pool's connections), and where
/// those are the bound, reads get less. Group commit fills its fsyncs with a few writes in
/// flight, so a cap on the write routes' requests at once, with tower's [`ConcurrencyLimitLayer`](https://docs.rs/tower/latest/tower/limit/struct.ConcurrencyLimitLayer.html)
/// (the route's own layer, under this crate's), hands that share to the reads at a small cost
/// in writes. Measured on two cores (`BENCHMARKS.md`, "Beside readers"), 64 writing and 16
/// reading connections, no read limit: without a cap the writes ran 5.9× `BEGIN IMMEDIATE`'s
/// with 3.9× its reads; capped at 16, 4.2× with 10×; at 8, 3.2× with 15×. The layer's read
/// limit (on by default) counts the closures waiting for the writer thread as writers waiting
/// and holds reads back meanwhile, as it does for the sqlx path; beside the writer thread that
/// gains no writes (3.79× against 3.80×) and costs reads (0.87× against 2.29×), so with the cap,
/// turn it off (`no_read_limit()`), as below.
///
#[cfg_attr(feature = "axum", doc = "```")]
#[cfg_attr(not(feature = "axum"), doc = "```ignore")]
/// use axum::{Router, extract::State, routing::{get, post}};
/// use tower::limit::ConcurrencyLimitLayer;
/// use tower_sqlite_retry::{DbError, SqliteRetryLayer, write::WriteThread};
///
/// async fn create(State(writes): State<WriteThread>, item: String) -> Result<String, DbError> {
///     let id = writes
///         .transaction(move |tx| {
///             tx.execute("INSERT INTO orders (item) VALUES (?1)", [&item])?;
///             Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
///         })
///         .await?;
///     Ok(id.to_string())
/// }
///
/// async fn list() -> &'static str {
///     "…" // reads through the application's own connections
/// }
///
/// fn app(writes: WriteThread) -> Router {
///     Router::new()
///         // at most 16 writes at once; reads are not held back
///         .route("/orders", post(create).layer(ConcurrencyLimitLayer::new(16)))
///         .route("/orders/all", get(list))
///         .layer(SqliteRetryLayer::default().no_read_limit())
///         .with_state(writes)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let writes = WriteThread::open(dir.path().join("app.db"))?;
/// # let _router = app(writes);
/// # Ok(())
/// # }
/// ```
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
    core: Core<Connection>,
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
    /// connections, as before. No runtime is needed, here or on the writer thread (a closure
    /// that waits there for a turn held elsewhere in the process waits on the thread itself).
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
        let shared = options.shares_fsync(mode.eq_ignore_ascii_case("wal"), &file);
        conn.execute_batch(options.synchronous_pragma(shared))?;
        let core = Core::start(conn, path, &file, shared, &options)
            .map_err(|why| failure(libsqlite3_sys::SQLITE_IOERR, why))?;
        Ok(Self { core })
    }

    /// Runs `f` in a write transaction on the writer thread: in this database's turn, after
    /// `BEGIN IMMEDIATE`, then `COMMIT` if `f` returned `Ok` (`ROLLBACK` if it returned `Err`).
    /// The value once committed and, with group commit, durable; otherwise the error: `f`'s,
    /// or the transaction's as a `rusqlite::Error`, which `DbError` and the classifiers take
    /// as any other:
    ///
    /// - the request's deadline passed before `f` began (waiting for the writer thread, for
    ///   the turn, or for another process's lock in `BEGIN IMMEDIATE`): `SQLITE_BUSY`
    ///   (retryable: the layer replays the request while its deadline allows); `f` never ran;
    /// - the fsync of the WAL failed, or an earlier one did (the file is refused):
    ///   `SQLITE_IOERR_FSYNC`, never retryable (committed, not known durable);
    /// - `f` returned `Ok` having ended the transaction itself (a raw `COMMIT` or
    ///   `ROLLBACK`), `f` sent while the request holds this database's turn through a
    ///   `WriteTransaction` or a `WriteTurn`, `f` panicked (rolled back), or the writer thread
    ///   gone: `SQLITE_MISUSE`.
    ///
    /// A `COMMIT` that went through fences the current request (it is never replayed), and so
    /// does a transaction that was over before `f` returned its error (it may have committed).
    /// If the caller stops waiting (its future dropped) before `f` began, `f` never runs and is
    /// dropped at once; once it began, it runs to its end, and its transaction is counted. A
    /// request's second closure in flight waits behind its first.
    pub async fn transaction<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Transaction<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<rusqlite::Error> + Send + 'static,
    {
        let body = move |conn: &mut Connection| -> Ran<T, E> {
            let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
                Ok(tx) => tx,
                Err(error) => {
                    return Ran::Failed {
                        error: E::from(error),
                        stage: Some(WriteStage::Begin),
                        disk: false,
                    };
                }
            };
            let done = f(&mut tx);
            // NOTE: whatever drop behaviour the closure set on the transaction, it is the write
            // path's to end: rolled back when dropped (never committed by a drop, never left
            // open), committed only below.
            tx.set_drop_behavior(DropBehavior::Rollback);
            // Over already (a raw `COMMIT` or `ROLLBACK`, or SQLite's own rollback after
            // `SQLITE_FULL`, an I/O error, a trigger's `RAISE(ROLLBACK)`): what it wrote may
            // have committed.
            let ended = tx.is_autocommit();
            let value = match done {
                Ok(value) => value,
                Err(error) if ended => return Ran::EndedInside(error),
                // Dropped: rolled back.
                Err(error) => {
                    return Ran::Failed {
                        error,
                        stage: None,
                        disk: false,
                    };
                }
            };
            if ended {
                return Ran::EndedInside(E::from(failure(
                    libsqlite3_sys::SQLITE_MISUSE,
                    "the transaction was ended inside the closure (a raw COMMIT or ROLLBACK): \
                     its writes may have committed outside the write path"
                        .to_owned(),
                )));
            }
            match tx.commit() {
                Ok(()) => Ran::Committed(value),
                Err(error) => {
                    let disk = matches!(
                        &error,
                        rusqlite::Error::SqliteFailure(code, _)
                            if code.extended_code & 0xff == libsqlite3_sys::SQLITE_IOERR
                    );
                    Ran::Failed {
                        error: E::from(error),
                        stage: Some(WriteStage::Commit),
                        disk,
                    }
                }
            }
        };
        self.core.transaction(body, errors::<E>()).await
    }

    /// The turn's counts now (this file's: every writer on it in this process).
    pub fn stats(&self) -> WriteStats {
        self.core.stats()
    }

    /// The database file this writer writes.
    pub fn path(&self) -> &Path {
        self.core.path()
    }

    /// Test seam (`crate::__private::hold_thread_fsync`).
    pub(crate) fn hold_fsync(&self, held: bool) -> bool {
        self.core.hold_fsync(held)
    }
}

impl std::fmt::Debug for WriteThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteThread")
            .field("path", &self.core.path())
            .finish_non_exhaustive()
    }
}

impl Owned for Connection {
    fn make_clean(&mut self) -> Result<bool, String> {
        // SQLite's own count is the only one: rusqlite keeps none beside it (its
        // `Transaction` is a borrow, gone with the closure).
        if self.is_autocommit() {
            return Ok(false);
        }
        match self.execute_batch("ROLLBACK") {
            Ok(()) if self.is_autocommit() => Ok(true),
            Ok(()) => Err("a transaction is still open after ROLLBACK".to_owned()),
            Err(error) => Err(format!("ROLLBACK failed: {error}")),
        }
    }

    fn set_busy_timeout(&mut self, wait: Duration) -> bool {
        self.busy_timeout(wait).is_ok()
    }

    fn is_busy(error: &dyn Any) -> bool {
        let code = match error.downcast_ref::<rusqlite::Error>() {
            Some(rusqlite::Error::SqliteFailure(error, _)) => error.extended_code,
            _ => return crate::classify::is_sqlite_busy(error),
        };
        code & 0xff == libsqlite3_sys::SQLITE_BUSY
    }
}

/// A `rusqlite::Error` as SQLite would give it, with a message of the crate's.
fn failure(code: c_int, message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(libsqlite3_sys::Error::new(code), Some(message))
}

/// The writer thread's own errors, as rusqlite's with SQLite's codes.
fn errors<E: From<rusqlite::Error>>() -> Errors<E> {
    Errors {
        timed_out: || {
            E::from(failure(
                libsqlite3_sys::SQLITE_BUSY,
                "the write turn was not reached within the request's deadline".to_owned(),
            ))
        },
        not_durable: |failed: GroupCommitFailed| {
            E::from(failure(
                libsqlite3_sys::SQLITE_IOERR_FSYNC,
                failed.to_string(),
            ))
        },
        misuse: |why: &str| E::from(failure(libsqlite3_sys::SQLITE_MISUSE, why.to_owned())),
    }
}
