//! The write path of [`tower-sqlite-retry`](tower_sqlite_retry) for **sqlx 0.8**: queue the
//! SQLite write *transaction*, not the request.
//!
//! [`WritePool`] is the same type as `tower_sqlite_retry::WritePool` (which serves sqlx 0.9),
//! for applications still on sqlx 0.8. The one-line change is the state's type: `SqlitePool`
//! becomes [`WritePool`]; `db.begin()` keeps its spelling and now
//!
//! - waits for the database file's **turn**: an in-process FIFO queue shared with every
//!   `WritePool`, `tower_sqlite_retry::WritePool` and `WriteQueue` on that file, bounded by
//!   the request's deadline (under `SqliteRetryLayer`) and the pool's `acquire_timeout`; a
//!   waiting writer holds no connection and never sleep-polls in SQLite's busy handler;
//! - then begins `BEGIN IMMEDIATE` on a **writer connection** the `WritePool` keeps for
//!   itself (opened on first use with the pool's connect options and `after_connect`, handed
//!   from one writer to the next with no ping or pool round trip), so only the transaction is
//!   serialized and the handler's work before and after it runs in parallel;
//! - and [`WriteTransaction::commit`] commits, gives the turn back and **fences** the current
//!   request: a retryable failure after the commit is answered as it is, never replayed, even
//!   when the commit happens in store code below the handler that has no `Attempt`.
//!
//! Dropping a [`WriteTransaction`] rolls back and gives the turn back once the rollback ran.
//! Writers in other processes are still excluded by SQLite (`busy_timeout`) and, past it,
//! covered by the layer's replay. Reads stay on the pool (`&*db`, or [`WritePool::pool`]).
//!
//! Pair it with WAL, a `busy_timeout` of a few seconds and `synchronous = NORMAL`; see the
//! `tower-sqlite-retry` README for the layer and the rest of the stack.
//!
//! # Example
//!
//! ```
//! use axum::{Json, Router, extract::State, routing::post};
//! use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
//! use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};
//! use tower_sqlite_retry_sqlx08::WritePool;
//!
//! async fn create_order(
//!     State(db): State<WritePool>,
//!     Json(item): Json<String>,
//! ) -> Result<Json<i64>, DbError> {
//!     let mut tx = db.begin().await?; // waits for the turn, then BEGIN IMMEDIATE
//!     let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM orders")
//!         .fetch_one(&mut *tx)
//!         .await?;
//!     sqlx::query("INSERT INTO orders (seq, item) VALUES (?, ?)")
//!         .bind(next)
//!         .bind(&item)
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit().await?; // commits, gives the turn back, fences the request
//!     Ok(Json(next))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use tower::ServiceExt;
//! # let dir = tempfile::tempdir()?;
//! let options = SqliteConnectOptions::new()
//!     .filename(dir.path().join("shop.db"))
//!     .create_if_missing(true)
//!     .journal_mode(SqliteJournalMode::Wal)
//!     .busy_timeout(std::time::Duration::from_secs(5));
//! let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
//! sqlx::query("CREATE TABLE orders (seq INTEGER PRIMARY KEY, item TEXT NOT NULL)")
//!     .execute(&pool)
//!     .await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(SqliteRetryLayer::new(RetryPolicy::default()))
//!     .with_state(WritePool::new(pool));
//! # let req = http::Request::post("/orders")
//! #     .header("content-type", "application/json")
//! #     .body(axum::body::Body::from("\"tea\""))?;
//! # let res = app.oneshot(req).await?;
//! # assert_eq!(res.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! # Rules
//!
//! The same as `tower_sqlite_retry::WritePool`'s: one turn per database file (its canonical
//! path), one write transaction at a time per request (a second `begin` while the request
//! holds one fails at once with `Error::InvalidArgument`; use a savepoint,
//! `sqlx::Connection::begin(&mut *tx)`), and the wait ends with `Error::PoolTimedOut`
//! (retryable) at the request's deadline or the pool's `acquire_timeout`.
//!
//! A store that hands `&self.db` to functions generic over sqlx's `Executor` keeps its
//! `SqlitePool` for those and holds a `WritePool` beside it for its transactions
//! (`WritePool::new(pool.clone())`); a helper that took `&mut Transaction<'_, Sqlite>` takes
//! `&mut SqliteConnection` instead, and its callers keep passing `&mut tx`.

use std::borrow::Cow;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx_core::Error;
use sqlx_core::connection::Connection as _;
use sqlx_core::pool::PoolConnection;
use sqlx_core::transaction::TransactionManager;
use sqlx_sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions,
    SqliteTransactionManager,
};
use tower_sqlite_retry::{TurnError, WriteQueue, WriteTurn};

/// A sqlx 0.8 SQLite pool whose write transactions wait for their turn, one at a time per
/// database file, then begin `IMMEDIATE` on a writer connection of their own; the commit
/// gives the turn back and fences the request. See the [crate docs](crate).
///
/// Cloning is cheap (the pool, the writer connection and the queue are shared).
#[derive(Clone)]
pub struct WritePool {
    pool: SqlitePool,
    /// The connection write transactions begin on; `None`: the application pool's.
    writer: Option<Arc<Writer>>,
    queue: WriteQueue,
}

impl WritePool {
    /// The write path over `pool`, with a writer connection of its own. Every `WritePool`
    /// (of this crate or of `tower-sqlite-retry`) and `WriteQueue` on the same database file
    /// shares one queue in this process. Nothing is opened here.
    pub fn new(pool: SqlitePool) -> Self {
        let queue = WriteQueue::for_file(pool.connect_options().get_filename());
        let writer = Some(Arc::new(Writer::of(&pool)));
        Self {
            pool,
            writer,
            queue,
        }
    }

    /// Whether write transactions begin on a connection of this `WritePool`'s own (`true`, the
    /// default: opened when first needed with the pool's options, then kept outside any pool,
    /// never pinged or recycled, and handed from writer to writer) or take one from the
    /// application's pool in their turn (`false`).
    pub fn writer_connection(mut self, own: bool) -> Self {
        self.writer = own.then(|| Arc::new(Writer::of(&self.pool)));
        self
    }

    /// Waits for this database's write turn, then begins `IMMEDIATE` on the writer connection.
    ///
    /// Fails with [`Error::PoolTimedOut`] past the request's deadline or the pool's
    /// `acquire_timeout`, with [`Error::InvalidArgument`] at once when the current request
    /// already holds a write transaction on this file, and with [`Error::PoolClosed`] once
    /// the pool is closed.
    pub async fn begin(&self) -> Result<WriteTransaction, Error> {
        if self.pool.is_closed() {
            return Err(Error::PoolClosed);
        }
        let acquire_timeout = self.pool.options().get_acquire_timeout();
        let turn = match self.queue.turn(acquire_timeout).await {
            Ok(turn) => turn,
            Err(error @ TurnError::HeldByThisRequest) => {
                return Err(Error::InvalidArgument(format!(
                    "{error} ({}); or use a savepoint on it",
                    self.queue.path().display()
                )));
            }
            Err(_) => return Err(Error::PoolTimedOut),
        };
        // Only now a connection: waiting writers never hold one. A failure here gives the turn
        // back (it drops with `turn`).
        let conn = match &self.writer {
            Some(writer) => Conn::Own(writer.take().await?, Arc::clone(writer)),
            None => Conn::Pooled(self.pool.acquire().await?),
        };
        // NOTE: from here the transaction owns the connection and the turn, so that a `begin`
        // dropped half-way rolls back through `Drop`, after the `BEGIN` on the connection's
        // worker, before the turn goes on.
        let mut tx = WriteTransaction {
            conn: Some(conn),
            turn: Some(turn),
            rollback_bound: acquire_timeout,
        };
        let conn = tx.conn.as_mut().expect("just set");
        let immediate = Some(Cow::Borrowed("BEGIN IMMEDIATE"));
        if let Err(error) = SqliteTransactionManager::begin(conn, immediate).await {
            // A database error (another process's write lock past `busy_timeout`) leaves the
            // connection as it was; any other failure closes it.
            tx.end(matches!(error, Error::Database(_)));
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

    /// The database file whose writers the queue serializes (its canonical path).
    pub fn path(&self) -> &Path {
        self.queue.path()
    }

    /// Closes the writer connection and the pool (as `SqlitePool::close` does).
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(writer) = &self.writer {
            writer.close().await;
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

/// The writer connection of one `WritePool` (and its clones).
struct Writer {
    /// Opens the connection with the application pool's options and hooks (a pool of one,
    /// never pinged); the connection is then detached from it and kept in `idle`.
    opener: SqlitePool,
    /// The connection between two write transactions. Only the turn's holder takes it, so the
    /// lock is never contended; it is never held across an await.
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

    async fn take(&self) -> Result<SqliteConnection, Error> {
        if let Some(conn) = self.idle().take() {
            return Ok(conn);
        }
        if self.opener.is_closed() {
            return Err(Error::PoolClosed);
        }
        Ok(self.opener.acquire().await?.detach())
    }

    fn put(&self, conn: SqliteConnection) {
        if !self.opener.is_closed() {
            *self.idle() = Some(conn);
        }
    }

    async fn close(&self) {
        self.opener.close().await;
        let idle = self.idle().take();
        if let Some(conn) = idle {
            let _ = conn.close().await;
        }
    }

    fn idle(&self) -> MutexGuard<'_, Option<SqliteConnection>> {
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
    Pooled(PoolConnection<Sqlite>),
    Own(SqliteConnection, Arc<Writer>),
}

impl Conn {
    /// Back where it came from, if `reusable` and no transaction is left open on it; closed
    /// otherwise.
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

/// A write transaction begun `IMMEDIATE` in its turn ([`WritePool::begin`]).
///
/// It derefs to the connection: `.execute(&mut *tx)`, and `sqlx::Connection::begin(&mut
/// *tx)` for a savepoint. [`commit`](Self::commit) commits, gives the turn back and fences the
/// request; dropping it rolls back and gives the turn back.
pub struct WriteTransaction {
    /// `Some` until commit or rollback has ended the transaction.
    conn: Option<Conn>,
    /// `Some` until the transaction is over and its connection given back.
    turn: Option<WriteTurn>,
    /// How long a dropped transaction's rollback may keep the turn.
    rollback_bound: Duration,
}

impl WriteTransaction {
    /// Commits, gives the turn back, and, once committed, fences the current request.
    ///
    /// A failed commit fences nothing, rolls back, and gives the turn back too.
    pub async fn commit(mut self) -> Result<(), Error> {
        // NOTE: the connection stays in `self` across the await: if this future is dropped
        // half-way, `Drop` rolls back (a no-op when the COMMIT already ran).
        let conn = self.conn.as_mut().expect("transaction open until commit");
        let committed = SqliteTransactionManager::commit(conn).await;
        match &committed {
            Ok(()) => {
                if let Some(conn) = self.conn.take() {
                    conn.give_back(true);
                }
                if let Some(turn) = self.turn.take() {
                    turn.committed(); // fences the request, then gives the turn back
                }
            }
            Err(_) => {
                let rolled_back = SqliteTransactionManager::rollback(conn).await.is_ok();
                self.end(rolled_back);
            }
        }
        committed
    }

    /// Rolls back and gives the turn back.
    pub async fn rollback(mut self) -> Result<(), Error> {
        let conn = self.conn.as_mut().expect("transaction open until rollback");
        let rolled_back = SqliteTransactionManager::rollback(conn).await;
        self.end(rolled_back.is_ok());
        rolled_back
    }

    /// Over without a commit: the connection goes back, then the turn (no fence).
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
            drop(self.turn.take());
            return;
        };
        let turn = self.turn.take();
        // Not committed: roll back, and give the turn back once the rollback has run, so that
        // the next writer does not meet this transaction's write lock. Bounded; without a
        // runtime the rollback is queued on the connection, which closes.
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
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn the_types_and_the_future_of_begin_are_send() {
        assert_send_sync::<WritePool>();
        assert_send_sync::<WriteTransaction>();
        fn begin_is_send(db: &WritePool) {
            assert_send(&db.begin());
        }
        let _ = begin_is_send;
    }
}
