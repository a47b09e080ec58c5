//! `WritePool` and `WriteTransaction`: the write path for sqlx 0.9.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx_core::sql_str::SqlStr;
use sqlx_core::transaction::TransactionManager;
use sqlx_sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions,
    SqliteTransactionManager,
};

use super::queue::{bound, holder_of};
use super::turn::{Queue, Turn};
#[allow(unused_imports)] // the stand-in's `fence`/`deadline` (inherent in the real one)
use crate::attempt::{RequestState, current_request};

/// A SQLite pool whose write transactions wait for their turn, one at a time per database
/// file, then begin `IMMEDIATE` on a writer connection of their own; the commit gives the turn
/// back and fences the request.
///
/// Reads stay on the application's pool ([`pool`](Self::pool), or `&*db`). Write transactions
/// begin on the `WritePool`'s own **writer connection** (opened when first needed, with the
/// application pool's connect options and its `after_connect` hook), never on the
/// application's: a writer in its turn begins on a warm connection whose page cache no other
/// writer invalidated, and does not compete with readers for one. See
/// [`writer_connection`](Self::writer_connection).
///
/// Cloning is cheap (the pools, the writer connection and the queue are shared). See the
/// [module docs](super) for why and for an example.
#[derive(Clone)]
pub struct WritePool {
    pool: SqlitePool,
    /// The connection write transactions begin on; `None`: the application pool's.
    writer: Option<Arc<Writer>>,
    queue: Arc<Queue>,
}

impl WritePool {
    /// The write path over `pool`, with a writer connection of its own (see
    /// [`writer_connection`](Self::writer_connection)). Every `WritePool` on the same
    /// database file (whatever the pool) shares one queue in this process.
    ///
    /// Nothing is opened here: the writer connection opens when the first write transaction
    /// needs it.
    pub fn new(pool: SqlitePool) -> Self {
        let queue = Queue::of(pool.connect_options().get_filename());
        let writer = Some(Arc::new(Writer::of(&pool)));
        Self {
            pool,
            writer,
            queue,
        }
    }

    /// Whether write transactions begin on a connection of this `WritePool`'s own (`true`, the
    /// default) or take one from the application's pool, as readers do, in their turn
    /// (`false`).
    ///
    /// The writer connection is opened, when first needed, with the application pool's
    /// connect options (the file, `busy_timeout`, journal mode, pragmas) and pool options
    /// (`acquire_timeout`, `after_connect`), and then kept by the `WritePool` itself, outside
    /// any pool: between two writers it is not pinged, not recycled for being idle or old,
    /// and hands over from one writer to the next with no round trip. It is one more SQLite
    /// connection on the file: one file handle, its own page cache (which stays warm while no
    /// other connection writes). One is always enough: only the turn's holder uses it.
    ///
    /// A connection that fails (anything but a database error, or a transaction it could not
    /// end) is closed, and the next writer opens a new one.
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
    ///     .journal_mode(SqliteJournalMode::Wal);
    /// let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
    /// // Write transactions take their connection from the pool of 8, as reads do.
    /// let db = WritePool::new(pool).writer_connection(false);
    /// let mut tx = db.begin().await?;
    /// sqlx::query("CREATE TABLE t (x)").execute(&mut *tx).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn writer_connection(mut self, own: bool) -> Self {
        self.writer = own.then(|| Arc::new(Writer::of(&self.pool)));
        self
    }

    /// Waits for this database's write turn, then begins `IMMEDIATE` on the writer connection.
    ///
    /// The wait is bounded by the current request's deadline (under the layer) and by the
    /// pool's `acquire_timeout`; past the bound it fails with [`sqlx::Error::PoolTimedOut`].
    /// A second call while the current request already holds a write transaction on this file
    /// fails at once with [`sqlx::Error::InvalidArgument`] (it would wait for itself). Once the
    /// application's pool is closed it fails with [`sqlx::Error::PoolClosed`].
    ///
    /// The turn is held until [`WriteTransaction::commit`], [`WriteTransaction::rollback`],
    /// or the transaction is dropped (then until its rollback has run).
    pub async fn begin(&self) -> Result<WriteTransaction, sqlx::Error> {
        // Read while the layer polls the handler (the first poll of this future): a spawned
        // task has no current request.
        let request = current_request();
        let holder = holder_of(request.as_ref());
        if self.queue.is_held_by(holder) {
            return Err(sqlx::Error::InvalidArgument(format!(
                "this request already holds the write turn of {}: commit or drop its write \
                 transaction before beginning another (or use a savepoint on it)",
                self.queue.path().display()
            )));
        }
        if self.pool.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        let acquire_timeout = self.pool.options().get_acquire_timeout();
        let turn = self
            .queue
            .take(holder, || bound(deadline, acquire_timeout))
            .await
            .ok_or(sqlx::Error::PoolTimedOut)?;
        // Only now a connection: waiting writers never hold one. A failure here gives the turn
        // back (it drops with `turn`).
        let conn = match &self.writer {
            Some(writer) => Conn::Own(writer.take().await?, Arc::clone(writer)),
            None => Conn::Pooled(self.pool.acquire().await?),
        };
        // NOTE: from here the transaction owns the connection and the turn, so that a `begin`
        // dropped half-way (its request cancelled while `BEGIN IMMEDIATE` waits out another
        // process's lock) rolls back through `Drop`, after the `BEGIN` on the connection's
        // worker, before the turn goes on.
        let mut tx = WriteTransaction {
            conn: Some(conn),
            turn: Some(turn),
            request,
            rollback_bound: acquire_timeout,
        };
        const IMMEDIATE: SqlStr = SqlStr::from_static("BEGIN IMMEDIATE");
        let conn = tx.conn.as_mut().expect("just set");
        if let Err(error) = SqliteTransactionManager::begin(conn, Some(IMMEDIATE)).await {
            // A database error (another process's write lock past `busy_timeout`) leaves the
            // connection as it was; any other failure closes it.
            tx.end(matches!(error, sqlx::Error::Database(_)));
            return Err(error);
        }
        Ok(tx)
    }

    /// The pool, for reads (they take no turn) and anything else.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The pool back (the writer connection closes once no clone of this `WritePool` and no
    /// write transaction of it is left).
    pub fn into_pool(self) -> SqlitePool {
        self.pool
    }

    /// The database file whose writers this queue serializes (its canonical path).
    pub fn path(&self) -> &Path {
        self.queue.path()
    }

    /// Closes the writer connection and the application's pool (as [`SqlitePool::close`]
    /// does: waits for the connections in use to come back, then closes them).
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(writer) = &self.writer {
            writer.close().await;
        }
    }
}

/// The writer connection of one `WritePool` (and its clones).
struct Writer {
    /// Opens the connection with the application pool's options and hooks (a pool of one,
    /// never pinged); the connection is then detached from it and kept in `idle`.
    opener: SqlitePool,
    /// The connection between two write transactions (`None` before the first, while one
    /// runs, or after a failure closed it). Only the turn's holder takes it, so the lock is
    /// never contended; it is never held across an await.
    idle: Mutex<Option<SqliteConnection>>,
}

impl Writer {
    fn of(pool: &SqlitePool) -> Self {
        let options: SqliteConnectOptions = (*pool.connect_options()).clone();
        let pool_options: SqlitePoolOptions = pool.options().clone();
        let opener = pool_options
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Self {
            opener,
            idle: Mutex::new(None),
        }
    }

    /// The connection, opened if there is none.
    async fn take(&self) -> Result<SqliteConnection, sqlx::Error> {
        if let Some(conn) = self.idle().take() {
            return Ok(conn);
        }
        if self.opener.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        // `detach`: the opener forgets it (and could open another), so that it is never
        // pinged or recycled.
        Ok(self.opener.acquire().await?.detach())
    }

    /// The connection back, for the next writer (closed instead once the `WritePool` is).
    fn put(&self, conn: SqliteConnection) {
        if !self.opener.is_closed() {
            *self.idle() = Some(conn);
        }
    }

    async fn close(&self) {
        self.opener.close().await;
        let idle = self.idle().take();
        if let Some(conn) = idle {
            let _ = sqlx::Connection::close(conn).await;
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Option<SqliteConnection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("open", &self.idle().is_some())
            .finish_non_exhaustive()
    }
}

/// The connection a write transaction runs on, and where it goes back.
enum Conn {
    /// The application pool's (`writer_connection(false)`).
    Pooled(PoolConnection<Sqlite>),
    /// The `WritePool`'s own, back to its `Writer`.
    Own(SqliteConnection, Arc<Writer>),
}

impl Conn {
    /// Back where it came from, if `reusable` and no transaction is left open on it; closed
    /// otherwise (the next writer opens a new one).
    fn give_back(self, reusable: bool) {
        let clean = reusable && SqliteTransactionManager::get_transaction_depth(&self) == 0;
        match self {
            Conn::Pooled(conn) if clean => drop(conn),
            Conn::Pooled(conn) => drop(conn.detach()),
            Conn::Own(conn, writer) if clean => writer.put(conn),
            Conn::Own(conn, _) => drop(conn),
        }
    }
}

impl Deref for Conn {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Own(conn, _) => conn,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Own(conn, _) => conn,
        }
    }
}

/// Reads go to the pool as before: `.fetch_one(&*db)`.
impl Deref for WritePool {
    type Target = SqlitePool;

    fn deref(&self) -> &SqlitePool {
        &self.pool
    }
}

impl From<SqlitePool> for WritePool {
    fn from(pool: SqlitePool) -> Self {
        Self::new(pool)
    }
}

impl fmt::Debug for WritePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WritePool")
            .field("pool", &self.pool)
            .field("writer", &self.writer)
            .field("queue", &self.queue)
            .finish()
    }
}

/// A write transaction begun `IMMEDIATE` in its turn ([`WritePool::begin`]).
///
/// It derefs to the connection, as sqlx's transaction does: `.execute(&mut *tx)`, and
/// `sqlx::Connection::begin(&mut *tx)` for a savepoint. [`commit`](Self::commit) commits,
/// gives the turn back and fences the request; dropping it rolls back and gives the turn back.
pub struct WriteTransaction {
    /// `Some` until commit or rollback has ended the transaction.
    conn: Option<Conn>,
    /// `Some` until the transaction is over and its connection given back.
    turn: Option<Turn>,
    request: Option<Arc<RequestState>>,
    /// How long a dropped transaction's rollback may keep the turn.
    rollback_bound: Duration,
}

impl WriteTransaction {
    /// Commits, gives the turn back, and, once committed, fences the current request: a
    /// retryable failure after this point is answered as it is, never replayed.
    ///
    /// A failed commit fences nothing (nothing was committed), rolls back, and gives the turn
    /// back too.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        // NOTE: the connection stays in `self` across the await: if this future is dropped
        // half-way, `Drop` rolls back (a no-op when the COMMIT already ran) before the turn
        // goes on.
        let conn = self.conn.as_mut().expect("transaction open until commit");
        let committed = SqliteTransactionManager::commit(conn).await;
        let reusable = match &committed {
            Ok(()) => {
                if let Some(request) = &self.request {
                    request.fence();
                }
                true
            }
            // The transaction may still be open (a `COMMIT` that met `SQLITE_BUSY`).
            Err(_) => SqliteTransactionManager::rollback(conn).await.is_ok(),
        };
        self.end(reusable);
        committed
    }

    /// Rolls back and gives the turn back.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        let conn = self.conn.as_mut().expect("transaction open until rollback");
        let rolled_back = SqliteTransactionManager::rollback(conn).await;
        self.end(rolled_back.is_ok());
        rolled_back
    }

    /// The transaction is over: the connection goes back, then the turn.
    fn end(&mut self, reusable: bool) {
        if let Some(conn) = self.conn.take() {
            conn.give_back(reusable);
        }
        drop(self.turn.take());
    }
}

impl Drop for WriteTransaction {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            // Committed or rolled back: the turn went back with it.
            drop(self.turn.take());
            return;
        };
        let turn = self.turn.take();
        // Not committed: roll back, and give the turn back once the rollback has run, so that
        // the next writer (on another `WritePool`'s writer connection, or the pool's) does not
        // meet this transaction's write lock and wait in SQLite's sleeping busy handler.
        // Bounded: a rollback that does not come back in time closes the connection and gives
        // the turn back anyway (SQLite's `busy_timeout` then covers the gap). Without a
        // runtime (dropped outside one), the rollback is queued on the connection, which
        // closes, and the turn goes back at once.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let bound = self.rollback_bound;
                runtime.spawn(async move {
                    let rolled_back =
                        tokio::time::timeout(bound, SqliteTransactionManager::rollback(&mut conn))
                            .await;
                    conn.give_back(matches!(rolled_back, Ok(Ok(()))));
                    drop(turn);
                });
            }
            Err(_) => {
                SqliteTransactionManager::start_rollback(&mut conn);
                conn.give_back(false);
                drop(turn);
            }
        }
    }
}

impl Deref for WriteTransaction {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        self.conn.as_ref().expect("transaction open until commit")
    }
}

impl DerefMut for WriteTransaction {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("transaction open until commit")
    }
}

impl fmt::Debug for WriteTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTransaction")
            .field("turn", &self.turn)
            .field("in_request", &self.request.is_some())
            .finish_non_exhaustive()
    }
}
