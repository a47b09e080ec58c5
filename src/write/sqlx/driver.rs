//! What the write path needs of a SQLite driver: the one seam between the write path's single
//! implementation and each sqlx version (0.9 here, 0.8 in the companion crate
//! `tower-sqlite-retry-sqlx08`, a model of sqlx's worker in the model check).

use std::any::Any;
use std::future::Future;
use std::io;
use std::ops::DerefMut;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::gate::CommitGate;
use crate::classify::Retryable;
use crate::write::core::failed::GroupCommitFailed;
use crate::write::durable::wal::{SyncError, Wal};

/// The query [`Driver::durability`] runs: the journal mode and the `synchronous` level.
pub const DURABILITY_SQL: &str = "SELECT (SELECT journal_mode FROM pragma_journal_mode), \
     (SELECT synchronous FROM pragma_synchronous)";

/// The query [`Driver::autocheckpoint`] runs.
pub const AUTOCHECKPOINT_SQL: &str = "PRAGMA wal_autocheckpoint";

/// The writer connection's own automatic checkpoint while its fsync is shared: a backstop
/// only, the background checkpointer does the rest (see `checkpoint.rs`).
pub(crate) const BACKSTOP_PAGES: u32 = 10_000;

/// The statement [`Driver::checkpoint`] runs off the turn: copies what it can, waits for
/// nobody.
pub const CHECKPOINT_SQL: &str = "PRAGMA wal_checkpoint(PASSIVE)";

/// The statement [`Driver::checkpoint`] runs in the turn: copies the rest, waits (up to
/// [`CHECKPOINTER_BUSY_SQL`]'s bound) for readers of the WAL's frames, and restarts the WAL.
pub const RESTART_SQL: &str = "PRAGMA wal_checkpoint(RESTART)";

/// Run once on the checkpointer's own connection: a `RESTART` checkpoint, which runs in the
/// turn, waits at most this long for a reader (a longer one keeps the WAL from restarting
/// until the next checkpoint, instead of holding every writer back).
pub const CHECKPOINTER_BUSY_SQL: &str = "PRAGMA busy_timeout = 5";

/// The statement [`Driver::set_synchronous`] runs for `level` (0 `OFF` … 3 `EXTRA`).
pub fn synchronous_pragma(level: u8) -> &'static str {
    match level {
        0 => "PRAGMA synchronous = OFF",
        1 => "PRAGMA synchronous = NORMAL",
        2 => "PRAGMA synchronous = FULL",
        _ => "PRAGMA synchronous = EXTRA",
    }
}

/// A SQLite driver, as the write path uses it. Not a public API: it exists so that one
/// implementation serves sqlx 0.8 and 0.9, and may change in any release.
///
/// The transaction methods are sqlx's `TransactionManager`'s, and keep its protocol: an
/// acknowledged `commit`/`rollback` whose future is dropped after its command reached the
/// connection is followed by exactly one [`start_rollback`](Driver::start_rollback), which the
/// connection then skips (sqlx's worker tracks that answer nobody read).
pub trait Driver: Send + Sync + Sized + 'static {
    /// A connection (`SqliteConnection`).
    type Connection: Send + Sync + 'static;
    /// A connection of a pool, which goes back to it when dropped (`PoolConnection<Sqlite>`).
    type Pooled: DerefMut<Target = Self::Connection> + Send + Sync + 'static;
    /// A pool (`SqlitePool`).
    type Pool: Clone + Send + Sync + 'static;
    /// The driver's error (`sqlx::Error`).
    type Error: Send + 'static;

    /// A connection from `pool`, within its `acquire_timeout`.
    fn acquire(pool: &Self::Pool)
    -> impl Future<Output = Result<Self::Pooled, Self::Error>> + Send;
    /// The connection, no longer the pool's (closed when dropped).
    fn detach(conn: Self::Pooled) -> Self::Connection;
    /// Whether `pool` was closed.
    fn is_closed(pool: &Self::Pool) -> bool;
    /// The pool's `acquire_timeout`.
    fn acquire_timeout(pool: &Self::Pool) -> Duration;
    /// A pool of one connection with `pool`'s connect options and hooks, opening lazily and
    /// never testing or recycling it: what the writer connection is opened from.
    fn opener(pool: &Self::Pool) -> Self::Pool;
    /// Closes `pool` (waits for the connections in use to come back).
    fn close_pool(pool: &Self::Pool) -> impl Future<Output = ()> + Send;
    /// A value every clone of `pool` shares and no other pool does, for as long as it is
    /// alive (sqlx's shared connect options): the identity of a database only this pool can
    /// reach.
    fn identity(pool: &Self::Pool) -> Arc<dyn Any + Send + Sync>;

    /// The file the connection's `main` database is, as SQLite names it, or `None` for an
    /// in-memory or temporary database.
    fn main_file(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<Option<PathBuf>, Self::Error>> + Send;
    /// `BEGIN IMMEDIATE`, as sqlx's `TransactionManager::begin` with that statement.
    fn begin_immediate(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;
    /// Whether the connection's journal mode is WAL, and its `synchronous` level (0 `OFF`, 1
    /// `NORMAL`, 2 `FULL`, 3 `EXTRA`).
    fn durability(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(bool, u8), Self::Error>> + Send;
    /// `PRAGMA synchronous = level` on the connection (1 `NORMAL`, 2 `FULL`, 3 `EXTRA`):
    /// group commit's writer connection.
    fn set_synchronous(
        conn: &mut Self::Connection,
        level: u8,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// The connection's `wal_autocheckpoint`, in pages (0: off); `None` where the driver
    /// leaves checkpoints as they are (the model check).
    fn autocheckpoint(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<Option<u32>, Self::Error>> + Send {
        let _ = conn;
        async { Ok(None) }
    }
    /// `PRAGMA wal_autocheckpoint = pages` on the writer connection (`checkpoint.rs`).
    fn set_autocheckpoint(
        conn: &mut Self::Connection,
        pages: u32,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = (conn, pages);
        async { Ok(()) }
    }
    /// The checkpointer's own connection, from `pool` (the writer connection's opener), no
    /// longer the pool's, with [`CHECKPOINTER_BUSY_SQL`] run on it.
    fn checkpointer(
        pool: &Self::Pool,
    ) -> impl Future<Output = Result<Self::Connection, Self::Error>> + Send {
        async { Ok(Self::detach(Self::acquire(pool).await?)) }
    }
    /// [`CHECKPOINT_SQL`] (or [`RESTART_SQL`]) on the checkpointer's connection: whether it
    /// completed (not stopped by a lock: a `RESTART` that completed restarted the WAL), the
    /// frames in the WAL, and how many of them are checkpointed.
    fn checkpoint(
        conn: &mut Self::Connection,
        restart: bool,
    ) -> impl Future<Output = Result<(bool, u64, u64), Self::Error>> + Send {
        let _ = (conn, restart);
        async { Ok((true, 0, 0)) }
    }
    /// Installs `gate` as the connection's commit hook (see `gate.rs`): `Ok(false)` when the
    /// driver has no commit hook to set (sqlx 0.8).
    fn guard_commits(
        conn: &mut Self::Connection,
        gate: Arc<CommitGate>,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let _ = (conn, gate);
        async { Ok(false) }
    }
    /// Removes whatever commit hook the connection has (the gate, or a handler's own set
    /// through `lock_handle()`): a connection of the pool's goes back to it with none, as it
    /// came (`gate.rs`). A no-op where the driver has no commit hook (sqlx 0.8).
    fn unguard_commits(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = conn;
        async { Ok(()) }
    }
    /// `TransactionManager::commit`.
    fn commit(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;
    /// `TransactionManager::rollback`.
    fn rollback(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;
    /// `TransactionManager::start_rollback`: queues a rollback whose answer nobody reads.
    fn start_rollback(conn: &mut Self::Connection);
    /// `TransactionManager::get_transaction_depth`.
    fn depth(conn: &Self::Connection) -> usize;
    /// An acknowledged no-op (`Connection::ping`): answered once everything queued before it
    /// on the connection has run.
    fn ping(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;
    /// Closes the connection gracefully.
    fn close(conn: Self::Connection) -> impl Future<Output = ()> + Send;

    /// The wait for the turn or the connection ran past its bound (`PoolTimedOut`).
    fn timed_out() -> Self::Error;
    /// The pool is closed (`PoolClosed`).
    fn closed() -> Self::Error;
    /// A misuse the caller can fix (`InvalidArgument`).
    fn invalid(message: String) -> Self::Error;
    /// Whether the error is the database's (it left the connection usable), rather than the
    /// connection's or the driver's.
    fn is_database_error(error: &Self::Error) -> bool;
    /// The marker, if the error is worth a replay (the crate's classifier for this driver).
    fn classify(error: &Self::Error) -> Option<Retryable>;
    /// The error a transaction committed with group commit gets when the fsync it waited for
    /// failed (`Error::Io` around it, where the classifiers look for it).
    fn group_failed(failure: GroupCommitFailed) -> Self::Error;

    /// Opens the WAL group commit syncs, read-write (`durable/wal.rs`).
    fn open_wal(path: &Path) -> io::Result<Wal> {
        Wal::open(path)
    }

    /// fsyncs the WAL (once its identity is checked), off the runtime's threads.
    fn sync_wal(wal: Arc<Wal>) -> impl Future<Output = Result<(), SyncError>> + Send {
        async move {
            tokio::task::spawn_blocking(move || wal.sync())
                .await
                // A panic, or the runtime shutting down: not the disk's doing.
                .unwrap_or_else(|joined| Err(SyncError::NotRun(joined.to_string())))
        }
    }

    /// Whether the error is SQLite's `SQLITE_IOERR` (any of its extended codes): the disk
    /// refused a read or a write (an fsync of the WAL, in a `COMMIT` or a checkpoint). No
    /// default: a driver that answered `false` by omission would skip a durability check.
    fn is_io_error(error: &Self::Error) -> bool;

    /// The write path's one spawn site: runs `task` in the background, or drops it unpolled
    /// when no runtime can run it (none is current, or it is shutting down, which drops the
    /// task at once). Every task the write path spawns owns a guard that settles what it holds
    /// by its `Drop`, so a task that never runs still hands its connection and turn on
    /// (a `Session`, settled by its `Drop`) or lets its waiters go (`group::Running`).
    fn spawn(task: impl Future<Output = ()> + Send + 'static) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(task);
        }
    }
}
