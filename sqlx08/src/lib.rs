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
//! It is the same implementation as `tower_sqlite_retry::WritePool`'s, built on that crate's
//! one write path (only sqlx 0.8's calls are this crate's), so the two behave alike: dropping
//! a [`WriteTransaction`] (an early return, a `?`, a cancelled request) rolls back as sqlx's
//! own `Transaction` does and gives the turn back once the rollback ran; a `commit()`
//! cancelled after its `COMMIT` was sent fences the request; a task the handler spawns is the
//! request's when wrapped in `tower_sqlite_retry::in_request`; an in-memory pool is written to
//! its own database. See that crate's `write` module for the rules, what the write path does
//! not cover, and what it costs.
//!
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
//! path), one write transaction open at a time per request (a second `begin` while the request
//! holds one open fails at once with `Error::InvalidArgument`; use a savepoint,
//! `sqlx::Connection::begin(&mut *tx)`), and the wait ends with `Error::PoolTimedOut`
//! (retryable) at the request's deadline or the pool's `acquire_timeout`.
//!
//! A store that hands `&self.db` to functions generic over sqlx's `Executor` keeps its
//! `SqlitePool` for those and holds a `WritePool` beside it for its transactions
//! (`WritePool::new(pool.clone())`); a helper that took `&mut Transaction<'_, Sqlite>` takes
//! `&mut SqliteConnection` instead, and its callers keep passing `&mut tx`.

use std::borrow::Cow;

use sqlx_core::Error;
use sqlx_sqlite::{SqliteConnection, SqlitePool};
use tower_sqlite_retry::__private as shared;
/// Which connection write transactions begin on (the same type as the sqlx 0.9 `WritePool`'s).
pub use tower_sqlite_retry::write::WriterConnection;

/// sqlx 0.8's SQLite driver, as the write path of `tower-sqlite-retry` uses it: everything
/// else (the turn, the transaction's lifecycle, the drop protocol) is that crate's one
/// implementation, shared with its sqlx 0.9 `WritePool`; what sqlx 0.8 is called with is that
/// crate's too (`__sqlx_driver!`), expanded here against sqlx 0.8's crates. sqlx 0.8 has no
/// commit hook.
#[derive(Debug)]
struct Sqlx08;

tower_sqlite_retry::__sqlx_driver! {
    driver: Sqlx08,
    begin: Cow::Borrowed("BEGIN IMMEDIATE"),
    extra: {
        async fn set_autocheckpoint(conn: &mut SqliteConnection, pages: u32) -> Result<(), Error> {
            let sql = format!("PRAGMA wal_autocheckpoint = {pages}");
            sqlx_core::query::query(&sql).execute(conn).await.map(drop)
        }
    },
}

/// A sqlx 0.8 SQLite pool whose write transactions wait for their turn, one at a time per
/// database, then begin `IMMEDIATE` on a writer connection of their own; the commit gives the
/// turn back and fences the request. See the [crate docs](crate).
///
/// Cloning is cheap (the pool, the writer connection and the queue are shared).
#[derive(Clone)]
pub struct WritePool {
    inner: shared::WritePool<Sqlx08>,
}

impl WritePool {
    /// The write path over `pool`, with a writer connection of its own. Every `WritePool`
    /// (of this crate or of `tower-sqlite-retry`) and `WriteQueue` on the same database file
    /// shares one queue in this process; an in-memory database's queue is its pool's alone.
    /// Nothing is opened here: the first write transaction asks SQLite which database the
    /// pool opens (an in-memory one has no writer connection of its own: a second connection
    /// would open another database).
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            inner: shared::WritePool::new(pool, true),
        }
    }

    /// Group commit (on by default; `false`: off): each write transaction commits on its own,
    /// and those that commit while an fsync of the WAL runs share the next one (in WAL mode at
    /// `synchronous = FULL`; nothing changes otherwise); a `commit()` is `Ok` only once an
    /// fsync that started after its `COMMIT` completed. As
    /// `tower_sqlite_retry::WritePool::group_commit`: see there. (sqlx 0.8 has no commit hook:
    /// a statement run after a raw `COMMIT`/`ROLLBACK` on a transaction, or after a trigger's
    /// `RAISE(ROLLBACK)`, is not refused here, as it is with sqlx 0.9.)
    pub fn group_commit(self, on: bool) -> Self {
        Self {
            inner: self.inner.group_commit(on),
        }
    }
}

tower_sqlite_retry::__write_wrappers! {
    driver: Sqlx08,
    pool: WritePool,
    /// A write transaction begun `IMMEDIATE` in its turn ([`WritePool::begin`]).
    ///
    /// It derefs to the connection: `.execute(&mut *tx)`, and `sqlx::Connection::begin(&mut
    /// *tx)` for a savepoint. [`commit`](Self::commit) commits, gives the turn back and fences the
    /// request; dropping it rolls back as sqlx's own `Transaction` does and gives the turn back
    /// once the rollback ran. A `commit()` cancelled after its `COMMIT` was sent fences the
    /// request too: the `COMMIT` may have gone through.
    transaction: WriteTransaction,
    /// Waits for this database's write turn, then begins `IMMEDIATE` on the writer connection.
    ///
    /// Fails with [`Error::PoolTimedOut`] past the request's deadline (which also bounds the
    /// `BEGIN IMMEDIATE` itself) or the pool's `acquire_timeout`, with
    /// [`Error::InvalidArgument`] at once when the current request holds a write transaction
    /// open on this database, and with [`Error::PoolClosed`] once the pool is closed. After
    /// the request's earlier transaction was committed, rolled back or dropped, a second
    /// `begin` waits for the turn as any other.
    begin,
    sqlite_pool: SqlitePool,
    connection: SqliteConnection,
    error: Error,
}

/// Not a public API: the test seams of this crate's own tests. May change in any release.
#[doc(hidden)]
pub mod __private {
    /// While `held`, group commit starts no fsync: transactions commit, then wait for it.
    /// `false` if the pool shares no fsync (group commit off, not WAL, not `FULL`, or before
    /// its first write transaction).
    pub fn hold_fsync(pool: &crate::WritePool, held: bool) -> bool {
        pool.inner.hold_fsync(held)
    }
}
