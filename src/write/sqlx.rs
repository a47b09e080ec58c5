//! `WritePool` and `WriteTransaction`: the write path for sqlx 0.9, on the one implementation
//! (`pool.rs`, `transaction.rs`) that the companion crate serves sqlx 0.8 with.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
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
use super::pool::WriterConnection;
use super::stats::WriteStats;
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
/// [`writer_connection`](Self::writer_connection).
///
/// Cloning is cheap (the pools, the writer connection and the queue are shared). See the
/// [module docs](super) for why, for the rules, and for an example.
#[derive(Clone)]
pub struct WritePool {
    inner: pool::WritePool<Sqlx>,
}

impl WritePool {
    /// The write path over `pool`, with a writer connection of its own (see
    /// [`writer_connection`](Self::writer_connection)). Every `WritePool` on the same
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

    /// Which connection write transactions begin on: one of this `WritePool`'s own
    /// ([`WriterConnection::Own`], the default) or one from the application's pool, taken as
    /// readers take theirs, in their turn ([`WriterConnection::FromPool`]).
    ///
    /// The writer connection is opened, when first needed, with the application pool's
    /// connect options (the file, `busy_timeout`, journal mode, pragmas) and pool options
    /// (`acquire_timeout`, `after_connect`), and then kept by the `WritePool` itself, outside
    /// any pool: between two writers it is not pinged, not recycled for being idle or old,
    /// and hands over from one writer to the next with no round trip. It is one more SQLite
    /// connection on the file: one file handle, its own page cache (which stays warm while no
    /// other connection writes). One is always enough: only the turn's holder uses it. An
    /// in-memory database has none (a second connection would open another database).
    ///
    /// A connection that fails (anything but a database error, or a transaction it could not
    /// end) is closed, and the next writer opens a new one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    /// use tower_sqlite_retry::WritePool;
    /// use tower_sqlite_retry::write::WriterConnection;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let options = SqliteConnectOptions::new()
    ///     .filename(dir.path().join("app.db"))
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal);
    /// let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
    /// // Write transactions take their connection from the pool of 8, as reads do.
    /// let db = WritePool::new(pool).writer(WriterConnection::FromPool);
    /// let mut tx = db.begin().await?;
    /// sqlx::query("CREATE TABLE t (x)").execute(&mut *tx).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn writer(self, writer: WriterConnection) -> Self {
        Self {
            inner: self.inner.writer(writer),
        }
    }

    /// Deprecated: [`writer`](Self::writer) with [`WriterConnection::Own`] (`true`) or
    /// [`WriterConnection::FromPool`] (`false`).
    #[deprecated(
        since = "0.1.0",
        note = "use `.writer(WriterConnection::Own)` or `.writer(WriterConnection::FromPool)`"
    )]
    pub fn writer_connection(self, own: bool) -> Self {
        self.writer(if own {
            WriterConnection::Own
        } else {
            WriterConnection::FromPool
        })
    }

    /// Reports write transactions that hold the turn `slow` or longer (`None`: none); 250 ms
    /// by default. The report is a WARN (target `tower_sqlite_retry`, `slow write
    /// transaction`) naming the route and method, with the time held and waited; at most one
    /// a second per database, each saying how many were left out since the last. It carries
    /// no user data. A transaction that holds the turn has every other writer wait as long:
    /// this is the database's slow-transaction log.
    pub fn slow_transaction(self, slow: Option<Duration>) -> Self {
        Self {
            inner: self.inner.slow_transaction(slow),
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
    /// a rollback-journal mode, with `writer_connection(false)` or an in-memory database.
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

    /// Test seam: while `held`, group commit starts no fsync, and every transaction shares
    /// it, so that transactions commit and then wait for it. `false` if this pool shares no fsync. Not a public API.
    #[doc(hidden)]
    pub fn hold_fsync(&self, held: bool) -> bool {
        self.inner.hold_fsync(held)
    }

    /// The database's write turn now: writers waiting, transactions, time held; two readings
    /// give its utilization ([`WriteStats::utilization_since`]). `None` until the first write
    /// transaction asked SQLite which database the pool writes to.
    pub fn stats(&self) -> Option<WriteStats> {
        self.inner.stats()
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

    /// The pool, for reads (they take no turn) and anything else.
    pub fn pool(&self) -> &SqlitePool {
        self.inner.pool()
    }

    /// The pool back (the writer connection closes once no clone of this `WritePool` and no
    /// write transaction of it is left).
    pub fn into_pool(self) -> SqlitePool {
        self.inner.pool().clone()
    }

    /// The database file whose writers this queue serializes (its canonical path), once the
    /// first write transaction asked SQLite; `None` before, and for an in-memory database.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path()
    }

    /// Closes the application's pool and then the writer connection (as
    /// [`SqlitePool::close`] does: waits for the connections in use to come back, then closes
    /// them).
    pub async fn close(&self) {
        self.inner.close().await;
    }
}

/// Reads go to the pool as before: `.fetch_one(&*db)`.
impl Deref for WritePool {
    type Target = SqlitePool;

    fn deref(&self) -> &SqlitePool {
        self.inner.pool()
    }
}

impl From<SqlitePool> for WritePool {
    fn from(pool: SqlitePool) -> Self {
        Self::new(pool)
    }
}

impl fmt::Debug for WritePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
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

impl WriteTransaction {
    /// Commits, gives the turn back, and, once committed, fences the current request: a
    /// retryable failure after this point is answered as it is, never replayed.
    ///
    /// `Ok` only when the `COMMIT` was, leaving the connection with no transaction open. A
    /// failed commit fences nothing (nothing was committed), rolls back, and gives the turn
    /// back too. A savepoint of this transaction still open (a nested transaction forgotten
    /// with `mem::forget`) would turn the `COMMIT` into a `RELEASE`: it fails with
    /// [`sqlx::Error::InvalidArgument`] instead, after a rollback of the whole transaction.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.inner.commit().await
    }

    /// Rolls back and gives the turn back.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.inner.rollback().await
    }
}

impl Deref for WriteTransaction {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.inner
    }
}

impl DerefMut for WriteTransaction {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.inner
    }
}

impl fmt::Debug for WriteTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
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
