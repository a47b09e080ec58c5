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
/// [module docs](crate::write) for why, for the rules, and for an example.
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
    /// the write lock. Each still commits on its own, with exactly the outcome it would have
    /// alone, and `commit()` is `Ok` only once an fsync of the WAL that started after its
    /// `COMMIT` completed; a failed fsync fails it with
    /// [`GroupCommitFailed`](crate::write::GroupCommitFailed), and refuses the file's later
    /// writes. Nothing changes where there is no fsync to share (`NORMAL`, a rollback
    /// journal, `WriterConnection::FromPool`, in memory, a writer alone).
    ///
    /// The whole story (what a client can tell, and only after a power loss; the fsync's
    /// care; what the operator does after a failed one; why it is on) is the
    /// [write module's](crate::write#group-commit), written once.
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
