//! `WritePool` and `WriteTransaction`: the write path for sqlx 0.9, on the one implementation
//! (`pool.rs`, `transaction.rs`) that the companion crate serves sqlx 0.8 with.

use std::sync::Arc;

use sqlx_core::sql_str::SqlStr;
use sqlx_sqlite::{SqliteConnection, SqlitePool};

use super::gate::CommitGate;
use super::pool;

/// sqlx 0.9's SQLite driver, as the write path uses it.
#[derive(Debug)]
struct Sqlx;

crate::__sqlx_driver! {
    driver: Sqlx,
    begin: SqlStr::from_static("BEGIN IMMEDIATE"),
    extra: {
        async fn guard_commits(
            conn: &mut SqliteConnection,
            gate: Arc<CommitGate>,
        ) -> Result<bool, sqlx::Error> {
            let mut handle = conn.lock_handle().await?;
            handle.set_commit_hook(move || gate.admits());
            Ok(true)
        }

        async fn unguard_commits(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
            conn.lock_handle().await?.remove_commit_hook();
            Ok(())
        }

        async fn set_autocheckpoint(
            conn: &mut SqliteConnection,
            pages: u32,
        ) -> Result<(), sqlx::Error> {
            let sql = format!("PRAGMA wal_autocheckpoint = {pages}");
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(conn).await.map(drop)
        }
    },
}

/// A SQLite pool whose write transactions wait for their turn, one at a time per database,
/// then begin `IMMEDIATE` on a writer connection of their own; the commit gives the turn back
/// and fences the request.
///
/// Reads stay on the application's pool ([`pool`](Self::pool), or `&*db`). Write transactions
/// begin on the `WritePool`'s own **writer connection** (opened when first needed, with the
/// application pool's connect options and its `after_connect` hook), never on the
/// application's: a writer in its turn begins on a warm connection whose page cache no other
/// writer invalidated, and does not compete with readers for one. See
/// [`writer`](Self::writer).
///
/// Cloning is cheap (the pools, the writer connection and the queue are shared). See the
/// [module docs](super) for why, for the rules, and for an example.
#[derive(Clone)]
pub struct WritePool {
    inner: pool::WritePool<Sqlx>,
}

impl WritePool {
    /// The write path over `pool`, with a writer connection of its own (see
    /// [`writer`](Self::writer)). Every `WritePool` on the same
    /// database file (whatever the pool) shares one queue in this process; an in-memory
    /// database's queue is its pool's alone.
    ///
    /// Nothing is opened here. The first write transaction asks SQLite which database the
    /// pool opens: a file, or an in-memory (or temporary) database, which only the pool's
    /// own connections can reach, and whose write transactions therefore take their
    /// connection from the pool.
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            inner: pool::WritePool::new(pool, true),
        }
    }

    /// Group commit (on by default; `false`: off): write transactions that commit while an
    /// fsync of the WAL runs share the next one, instead of each waiting for its own inside
    /// the write lock.
    ///
    /// Every transaction still commits on its own, in its turn, with exactly the outcome it
    /// would have alone: its own `COMMIT`, its own deferred foreign keys, triggers and commit
    /// hooks, its own errors. What is shared is the fsync: in WAL mode at `synchronous = FULL`
    /// (or `EXTRA`; sqlx's default and SQLite's), the writer connection runs at `NORMAL`, and
    /// `commit()` returns `Ok` only once an fsync of the WAL that started after its `COMMIT`
    /// has completed. The write lock is then held for the transaction's statements only, and
    /// one fsync makes durable every transaction that committed while the previous one ran.
    /// The request is fenced at the `COMMIT`; the wait for the fsync is not cut by the
    /// request's deadline (a `COMMIT` under way is not either), and it waits for nothing but
    /// an fsync that runs or starts at once. If the fsync fails, `commit()` fails with
    /// [`GroupCommitFailed`](crate::write::GroupCommitFailed) (not retryable: the transaction is committed, but not known to be
    /// durable), and an ERROR event says so.
    ///
    /// What a client could tell, and only after a power loss: a transaction's rows are visible
    /// to readers from its `COMMIT`, up to one fsync before its writer is answered; a power
    /// loss in that window loses rows a reader may have seen, never a row whose writer was told
    /// it committed. A process crash loses nothing.
    ///
    /// Nothing changes when there is no fsync to share: at `synchronous = NORMAL` or `OFF`, in
    /// a rollback-journal mode, with `writer(WriterConnection::FromPool)` or an in-memory database.
    ///
    /// A transaction that begins while no other writer waits and no fsync is under way (an
    /// idle service, one client) runs at the pool's own level and its `COMMIT` fsyncs, as
    /// without group commit: nothing to share, no hand-off. Why it is on: at `FULL` the fsync,
    /// not the transaction, is the write limit of an SQLite database (BENCHMARKS.md has the
    /// figures).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    /// use tower_sqlite_retry::WritePool;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let options = SqliteConnectOptions::new()
    ///     .filename(dir.path().join("app.db"))
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal); // synchronous: FULL, sqlx's default
    /// let pool = SqlitePoolOptions::new().connect_with(options).await?;
    /// let db = WritePool::new(pool.clone()); // group commit on
    /// let mut tx = db.begin().await?;
    /// sqlx::query("CREATE TABLE t (x)").execute(&mut *tx).await?;
    /// tx.commit().await?; // Ok once durable (alone: its own COMMIT's fsync)
    ///
    /// let off = WritePool::new(pool).group_commit(false); // every COMMIT fsyncs on its own
    /// # drop(off);
    /// # Ok(())
    /// # }
    /// ```
    pub fn group_commit(self, on: bool) -> Self {
        Self {
            inner: self.inner.group_commit(on),
        }
    }

    /// The test seam in `crate::__private`.
    pub(crate) fn hold_fsync(&self, held: bool) -> bool {
        self.inner.hold_fsync(held)
    }

    /// The test seam in `crate::__private`.
    pub(crate) fn writer_connections_opened(&self) -> u64 {
        self.inner.writer_connections_opened()
    }
}

crate::__write_wrappers! {
    driver: Sqlx,
    pool: WritePool,
    /// A write transaction begun `IMMEDIATE` in its turn ([`WritePool::begin`]).
    ///
    /// It derefs to the connection, as sqlx's transaction does: `.execute(&mut *tx)`, and
    /// `sqlx::Connection::begin(&mut *tx)` for a savepoint. [`commit`](Self::commit) commits,
    /// gives the turn back and fences the request; dropping it (an early return, a `?`, a
    /// cancelled request) rolls back as sqlx's own `Transaction` does and gives the turn back once
    /// the rollback ran. A `commit()` cancelled after its `COMMIT` was sent (the client went away,
    /// a timeout) fences the request too: the `COMMIT` may have gone through.
    transaction: WriteTransaction,
    /// Waits for this database's write turn, then begins `IMMEDIATE` on the writer connection.
    ///
    /// The wait is bounded by the current request's deadline (under the layer, or in a task
    /// wrapped in [`in_request`](crate::in_request)) and by the pool's `acquire_timeout`; the
    /// `BEGIN IMMEDIATE` itself (which waits out another process's lock for up to
    /// `busy_timeout`) by the deadline. Past the bound it fails with
    /// [`sqlx::Error::PoolTimedOut`] (retryable). A second call while the current request
    /// holds a write transaction open on this database fails at once with
    /// [`sqlx::Error::InvalidArgument`] (it would wait for itself); after that transaction was
    /// committed, rolled back or dropped, a second call waits for the turn as any other. Once
    /// the application's pool is closed it fails with [`sqlx::Error::PoolClosed`].
    ///
    /// The turn is held until [`WriteTransaction::commit`], [`WriteTransaction::rollback`],
    /// or the transaction is dropped (then until its rollback has run).
    begin,
    sqlite_pool: SqlitePool,
    connection: SqliteConnection,
    error: sqlx::Error,
}
