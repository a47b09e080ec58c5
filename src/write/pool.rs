//! `WritePool` and `WriteTransaction`: the write path for sqlx 0.9.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;

use sqlx::Transaction;
use sqlx_sqlite::{Sqlite, SqliteConnection, SqlitePool};

use super::queue::{bound, holder_of};
use super::turn::{Queue, Turn};
#[allow(unused_imports)] // the stand-in's `fence`/`deadline` (inherent in the real one)
use crate::attempt::{RequestState, current_request};

/// A SQLite pool whose write transactions wait for their turn, one at a time per database
/// file, before they take a connection; the commit gives the turn back and fences the request.
///
/// Cloning is cheap (the pool and the queue are shared). See the [module docs](super) for why
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
        let holder = holder_of(request.as_ref());
        if self.queue.is_held_by(holder) {
            return Err(sqlx::Error::InvalidArgument(format!(
                "this request already holds the write turn of {}: commit or drop its write \
                 transaction before beginning another (or use a savepoint on it)",
                self.queue.path().display()
            )));
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
