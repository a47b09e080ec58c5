//! `WritePool` and `WriteTransaction`: the write path for sqlx 0.9, on the one implementation
//! (`pool.rs`, `transaction.rs`) that the companion crate serves sqlx 0.8 with.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx_core::sql_str::SqlStr;
use sqlx_core::transaction::TransactionManager;
use sqlx_sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions,
    SqliteTransactionManager,
};

use super::driver::Driver;
use super::failed::GroupCommitFailed;
use super::group::GroupCommit;
use super::{pool, transaction};
use crate::classify::Retryable;

/// sqlx 0.9's SQLite driver, as the write path uses it.
#[derive(Debug)]
struct Sqlx;

impl Driver for Sqlx {
    type Connection = SqliteConnection;
    type Pooled = PoolConnection<Sqlite>;
    type Pool = SqlitePool;
    type Error = sqlx::Error;

    async fn acquire(pool: &SqlitePool) -> Result<PoolConnection<Sqlite>, sqlx::Error> {
        pool.acquire().await
    }

    fn detach(conn: PoolConnection<Sqlite>) -> SqliteConnection {
        conn.detach()
    }

    fn is_closed(pool: &SqlitePool) -> bool {
        pool.is_closed()
    }

    fn acquire_timeout(pool: &SqlitePool) -> Duration {
        pool.options().get_acquire_timeout()
    }

    fn opener(pool: &SqlitePool) -> SqlitePool {
        let options: SqliteConnectOptions = (*pool.connect_options()).clone();
        let pool_options: SqlitePoolOptions = pool.options().clone();
        pool_options
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_lazy_with(options)
    }

    async fn close_pool(pool: &SqlitePool) {
        pool.close().await;
    }

    fn identity(pool: &SqlitePool) -> Arc<dyn Any + Send + Sync> {
        pool.connect_options()
    }

    async fn main_file(conn: &mut SqliteConnection) -> Result<Option<PathBuf>, sqlx::Error> {
        let file: String =
            sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                .fetch_one(conn)
                .await?;
        Ok((!file.is_empty()).then(|| PathBuf::from(file)))
    }

    fn begin_immediate(
        conn: &mut SqliteConnection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        const IMMEDIATE: SqlStr = SqlStr::from_static("BEGIN IMMEDIATE");
        SqliteTransactionManager::begin(conn, Some(IMMEDIATE))
    }

    async fn durability(conn: &mut SqliteConnection) -> Result<(bool, u8), sqlx::Error> {
        let (mode, level): (String, i64) = sqlx::query_as(super::driver::DURABILITY_SQL)
            .fetch_one(conn)
            .await?;
        Ok((
            mode.eq_ignore_ascii_case("wal"),
            u8::try_from(level).unwrap_or(u8::MAX),
        ))
    }

    async fn guard_commits(
        conn: &mut SqliteConnection,
        gate: Arc<super::gate::CommitGate>,
    ) -> Result<bool, sqlx::Error> {
        let mut handle = conn.lock_handle().await?;
        handle.set_commit_hook(move || gate.admits());
        Ok(true)
    }

    async fn set_synchronous(conn: &mut SqliteConnection, level: u8) -> Result<(), sqlx::Error> {
        sqlx::query(super::driver::synchronous_pragma(level))
            .execute(conn)
            .await
            .map(drop)
    }

    fn commit(
        conn: &mut SqliteConnection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        SqliteTransactionManager::commit(conn)
    }

    fn rollback(
        conn: &mut SqliteConnection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        SqliteTransactionManager::rollback(conn)
    }

    fn start_rollback(conn: &mut SqliteConnection) {
        SqliteTransactionManager::start_rollback(conn);
    }

    fn depth(conn: &SqliteConnection) -> usize {
        SqliteTransactionManager::get_transaction_depth(conn)
    }

    fn ping(
        conn: &mut SqliteConnection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        sqlx::Connection::ping(conn)
    }

    async fn close(conn: SqliteConnection) {
        let _ = sqlx::Connection::close(conn).await;
    }

    fn timed_out() -> sqlx::Error {
        sqlx::Error::PoolTimedOut
    }

    fn closed() -> sqlx::Error {
        sqlx::Error::PoolClosed
    }

    fn invalid(message: String) -> sqlx::Error {
        sqlx::Error::InvalidArgument(message)
    }

    fn is_database_error(error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Database(_))
    }

    fn classify(error: &sqlx::Error) -> Option<Retryable> {
        crate::classify(error)
    }

    fn group_failed(failure: GroupCommitFailed) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::other(failure))
    }
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

    /// Group commit (on by default; `None`: off): write transactions that commit while an
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
    /// [`GroupCommitFailed`] (not retryable: the transaction is committed, but not known to be
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
    /// let off = WritePool::new(pool).group_commit(None); // every COMMIT fsyncs on its own
    /// # drop(off);
    /// # Ok(())
    /// # }
    /// ```
    pub fn group_commit(self, settings: Option<GroupCommit>) -> Self {
        Self {
            inner: self.inner.group_commit(settings),
        }
    }

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
    pub async fn begin(&self) -> Result<WriteTransaction, sqlx::Error> {
        Ok(WriteTransaction {
            inner: self.inner.begin().await?,
        })
    }
}

/// A write transaction begun `IMMEDIATE` in its turn ([`WritePool::begin`]).
///
/// It derefs to the connection, as sqlx's transaction does: `.execute(&mut *tx)`, and
/// `sqlx::Connection::begin(&mut *tx)` for a savepoint. [`commit`](Self::commit) commits,
/// gives the turn back and fences the request; dropping it (an early return, a `?`, a
/// cancelled request) rolls back as sqlx's own `Transaction` does and gives the turn back once
/// the rollback ran. A `commit()` cancelled after its `COMMIT` was sent (the client went away,
/// a timeout) fences the request too: the `COMMIT` may have gone through.
pub struct WriteTransaction {
    inner: transaction::Transaction<Sqlx>,
}

crate::__write_wrappers! {
    pool: WritePool,
    transaction: WriteTransaction,
    sqlite_pool: SqlitePool,
    connection: SqliteConnection,
    error: sqlx::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn the_types_and_the_futures_are_send() {
        assert_send_sync::<WritePool>();
        assert_send_sync::<WriteTransaction>();
        #[allow(dead_code)]
        async fn futures(db: WritePool) {
            assert_send(&db.begin());
            let tx = db.begin().await.unwrap();
            assert_send(&tx.commit());
            let tx = db.begin().await.unwrap();
            assert_send(&tx.rollback());
            assert_send(&db.close());
        }
    }
}
