//! The write path: queue the *transaction*, not the request.
//!
//! # Why
//!
//! SQLite has one writer. Two ways of living with that are common, and both cost more than
//! they need to:
//!
//! - a deferred transaction (`pool.begin()`) that reads and then writes fails with
//!   `SQLITE_BUSY` at once when another connection wrote in between; the layer replays the
//!   whole request, redoing everything the handler did before and after its transaction;
//! - `BEGIN IMMEDIATE` takes the write lock first, so it never fails that way; but writers
//!   waiting for the lock wait *inside* SQLite's busy handler, which polls with sleeps (the
//!   slowest writer waits over a second under load), and each of them holds a pool connection
//!   while it waits, so readers run out of connections.
//!
//! [`WritePool`] keeps `BEGIN IMMEDIATE` and moves the wait in front of it: a write transaction
//! first waits for its **turn** in an in-process FIFO queue of its database file, and only then
//! takes a pool connection and begins `IMMEDIATE`. The turn goes back when the transaction
//! commits or rolls back. So
//!
//! - only the transaction is serialized: authentication, parsing and the work after the commit
//!   run in parallel with other writers;
//! - waiting writers hold no connection (readers keep the pool) and never sleep-poll in
//!   SQLite: the next writer is woken the moment the previous one committed, in arrival order;
//! - writers in **other processes** are still excluded by SQLite (`busy_timeout`) and, past it,
//!   covered by the layer's replay: the `SQLITE_BUSY` of `BEGIN IMMEDIATE` is retryable.
//!
//! # The commit fences the request
//!
//! Under [`SqliteRetryLayer`](crate::SqliteRetryLayer), [`WriteTransaction::commit`] fences
//! the request (as [`Attempt::fence`](crate::Attempt::fence) does): a retryable failure after
//! the commit is answered as it is, never replayed, because a replay would write twice. Code
//! below the handler needs no [`Attempt`](crate::Attempt) for this: the layer makes its
//! request the current one while the handler runs, and the commit finds it there. (A task the
//! handler spawns is not the request's: its commits do not fence.)
//!
//! # Rules
//!
//! - **One turn per file**: every `WritePool` on one database file in this process shares one
//!   queue, whatever the pool (the file's canonical path is the key).
//! - **The wait is bounded**: by the request's deadline under the layer, and by the pool's
//!   `acquire_timeout` in any case; past it [`begin`](WritePool::begin) fails with
//!   [`sqlx::Error::PoolTimedOut`] (retryable, as a pool time-out always was).
//! - **Dropped without commit**: the transaction rolls back and the turn goes back at once; a
//!   handler that fails with `?` gives the turn back before the layer's backoff starts.
//! - **One write transaction at a time per request**: a second [`begin`](WritePool::begin) on
//!   the same file while the request holds a write transaction would wait for itself, so it
//!   fails at once with [`sqlx::Error::InvalidArgument`] instead. Sequential transactions (the
//!   first committed or dropped) are fine; for a nested one, use a savepoint on the open one
//!   (`sqlx::Connection::begin(&mut *tx)`). Without the layer there is no request to tell, and
//!   such a wait ends at the pool's `acquire_timeout`.
//! - Reads need no turn: read from [`WritePool::pool`] (or `&*db`), as before.
//!
//! Pair it with WAL (`journal_mode(Wal)`), a `busy_timeout` of a few seconds (for writers in
//! other processes), and `synchronous(Normal)`.
//!
//! # Example
//!
//! The one-line change is the state's type: `SqlitePool` becomes [`WritePool`]. `db.begin()`
//! keeps its spelling (and now begins `IMMEDIATE`, in turn); reads use `&*db`.
//!
//! ```
//! use axum::{Json, Router, extract::State, routing::post};
//! use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
//! use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};
//!
//! async fn create_order(
//!     State(db): State<WritePool>,
//!     Json(item): Json<String>,
//! ) -> Result<Json<(i64, i64)>, DbError> {
//!     // Work before the transaction runs in parallel with other writers.
//!     let item = item.trim().to_owned();
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
//!     let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
//!         .fetch_one(&*db) // reads take no turn
//!         .await?;
//!     Ok(Json((next, count)))
//! }
//!
//! fn app(db: WritePool) -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .layer(SqliteRetryLayer::new(RetryPolicy::default()))
//!         .with_state(db)
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
//! let app = app(WritePool::new(pool));
//! # let req = http::Request::post("/orders")
//! #     .header("content-type", "application/json")
//! #     .body(axum::body::Body::from("\"tea\""))?;
//! # let res = app.oneshot(req).await?;
//! # assert_eq!(res.status(), 200);
//! # Ok(())
//! # }
//! ```

mod turn;

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;

use sqlx::Transaction;
use sqlx_sqlite::{Sqlite, SqliteConnection, SqlitePool};
use tokio::time::Instant;

#[allow(unused_imports)] // the stand-in's `fence`/`deadline` (inherent in the real one)
use crate::current::StandIn as _;
use crate::current::{RequestState, current_request};
use turn::{Queue, Turn};

/// A SQLite pool whose write transactions wait for their turn, one at a time per database
/// file, before they take a connection; the commit gives the turn back and fences the request.
///
/// Cloning is cheap (the pool and the queue are shared). See the [module docs](self) for why
/// and for an example.
#[derive(Clone)]
pub struct WritePool {
    pool: SqlitePool,
    queue: Arc<Queue>,
}

impl WritePool {
    /// The write path over `pool`. Every `WritePool` on the same database file (whatever the
    /// pool) shares one queue in this process.
    pub fn new(pool: SqlitePool) -> Self {
        let queue = Queue::of(pool.connect_options().get_filename());
        Self { pool, queue }
    }

    /// Waits for this database's write turn, then takes a connection and begins `IMMEDIATE`.
    ///
    /// The wait is bounded by the current request's deadline (under the layer) and by the
    /// pool's `acquire_timeout`; past the bound it fails with [`sqlx::Error::PoolTimedOut`].
    /// A second call while the current request already holds a write transaction on this file
    /// fails at once with [`sqlx::Error::InvalidArgument`] (it would wait for itself).
    ///
    /// The turn is held until [`WriteTransaction::commit`], [`WriteTransaction::rollback`],
    /// or the transaction is dropped.
    pub async fn begin(&self) -> Result<WriteTransaction, sqlx::Error> {
        // Read while the layer polls the handler (the first poll of this future): a spawned
        // task has no current request.
        let request = current_request();
        let holder = request.as_ref().map_or(0, |r| Arc::as_ptr(r) as usize);
        if self.queue.is_held_by(holder) {
            return Err(sqlx::Error::InvalidArgument(format!(
                "this request already holds the write turn of {}: commit or drop its write \
                 transaction before beginning another (or use a savepoint on it)",
                self.queue.path().display()
            )));
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        let acquire_timeout = self.pool.options().get_acquire_timeout();
        let until = || {
            let pool_bound = Instant::now().checked_add(acquire_timeout);
            match (deadline, pool_bound) {
                (Some(d), Some(p)) => Some(d.min(p)),
                (d, p) => d.or(p),
            }
        };
        let turn = self
            .queue
            .take(holder, until)
            .await
            .ok_or(sqlx::Error::PoolTimedOut)?;
        // Only now a connection: waiting writers never hold one. A failure here gives the turn
        // back (it drops with `turn`).
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTransaction {
            tx: Some(tx),
            turn: Some(turn),
            request,
        })
    }

    /// The pool, for reads (they take no turn) and anything else.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The pool back.
    pub fn into_pool(self) -> SqlitePool {
        self.pool
    }

    /// The database file whose writers this queue serializes (its canonical path).
    pub fn path(&self) -> &Path {
        self.queue.path()
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
            .field("queue", &self.queue)
            .finish()
    }
}

/// A write transaction begun `IMMEDIATE` in its turn ([`WritePool::begin`]).
///
/// It derefs as sqlx's transaction does, to the connection: `.execute(&mut *tx)`.
/// [`commit`](Self::commit) commits, gives the turn back and fences the request; dropping it
/// rolls back and gives the turn back.
pub struct WriteTransaction {
    // Both `Some` until commit or rollback.
    tx: Option<Transaction<'static, Sqlite>>,
    turn: Option<Turn>,
    request: Option<Arc<RequestState>>,
}

impl WriteTransaction {
    /// Commits, gives the turn back, and, once committed, fences the current request: a
    /// retryable failure after this point is answered as it is, never replayed.
    ///
    /// A failed commit fences nothing (nothing was committed; sqlx rolls back) and gives the
    /// turn back too.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        let tx = self.tx.take().expect("transaction open until commit");
        let committed = tx.commit().await;
        if committed.is_ok()
            && let Some(request) = &self.request
        {
            request.fence();
        }
        drop(self.turn.take());
        committed
    }

    /// Rolls back and gives the turn back.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        let tx = self.tx.take().expect("transaction open until rollback");
        let rolled_back = tx.rollback().await;
        drop(self.turn.take());
        rolled_back
    }

    /// sqlx's transaction underneath, for what the deref does not reach.
    pub fn transaction(&mut self) -> &mut Transaction<'static, Sqlite> {
        self.tx.as_mut().expect("transaction open until commit")
    }
}

impl Drop for WriteTransaction {
    fn drop(&mut self) {
        // NOTE: not committed (or the commit was cancelled): sqlx's transaction queues its
        // rollback on the connection's worker as it drops, ahead of anything else on that
        // connection, and the turn goes back right after. The next writer begins on another
        // connection; in the rare case it gets there before the rollback ran, SQLite's
        // `busy_timeout` covers the gap.
        drop(self.tx.take());
        drop(self.turn.take());
    }
}

impl Deref for WriteTransaction {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        self.tx.as_ref().expect("transaction open until commit")
    }
}

impl DerefMut for WriteTransaction {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.tx.as_mut().expect("transaction open until commit")
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
