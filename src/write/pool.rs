//! `WritePool` and `WriteTransaction`: the write path for sqlx 0.9.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Transaction;
use sqlx_sqlite::{Sqlite, SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};

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
/// [`writer_connections`](Self::writer_connections).
///
/// Cloning is cheap (the pools and the queue are shared). See the [module docs](super) for why
/// and for an example.
#[derive(Clone)]
pub struct WritePool {
    pool: SqlitePool,
    /// The connections write transactions begin on; `None`: the application pool's.
    writers: Option<SqlitePool>,
    queue: Arc<Queue>,
}

/// The number of writer connections [`WritePool::new`] gives a pool.
const DEFAULT_WRITERS: u32 = 1;

impl WritePool {
    /// The write path over `pool`, with a writer connection of its own (see
    /// [`writer_connections`](Self::writer_connections)). Every `WritePool` on the same
    /// database file (whatever the pool) shares one queue in this process.
    ///
    /// Nothing is opened here: the writer connections open when the first write transaction
    /// needs one.
    pub fn new(pool: SqlitePool) -> Self {
        let queue = Queue::of(pool.connect_options().get_filename());
        let writers = Some(writer_pool(&pool, DEFAULT_WRITERS));
        Self {
            pool,
            writers,
            queue,
        }
    }

    /// The number of connections of its own this `WritePool` begins write transactions on
    /// (default 1); `0`: none, write transactions take a connection from the application's
    /// pool (as readers do), in their turn.
    ///
    /// The writer connections are opened, when first needed, with the application pool's
    /// connect options (the file, `busy_timeout`, journal mode, pragmas) and pool options
    /// (`acquire_timeout`, `after_connect` and the other hooks), but never closed for being
    /// idle or old, and not pinged before each use. A writer connection is one more SQLite
    /// connection on the file: one file handle, its own page cache.
    ///
    /// One is the right number unless measured otherwise: only the turn's holder uses a
    /// writer connection. A second lets the next writer begin while sqlx is still giving the
    /// previous one back to its pool (it pings every connection it takes back), but writers
    /// then alternate between the two, and SQLite drops a connection's page cache whenever
    /// another connection wrote: on `benches/writepath.rs` two were slower than one
    /// (BENCHMARKS.md).
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
    /// // One writer connection (the least memory), beside the 8 of the pool for reads.
    /// let db = WritePool::new(pool).writer_connections(1);
    /// let mut tx = db.begin().await?;
    /// sqlx::query("CREATE TABLE t (x)").execute(&mut *tx).await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn writer_connections(mut self, connections: u32) -> Self {
        self.writers = (connections > 0).then(|| writer_pool(&self.pool, connections));
        self
    }

    /// Waits for this database's write turn, then begins `IMMEDIATE` on a writer connection.
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
        let writers = self.writers.as_ref().unwrap_or(&self.pool);
        let tx = writers.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTransaction {
            tx: Some(tx),
            turn: Some(turn),
            request,
            rollback_bound: acquire_timeout,
        })
    }

    /// The pool, for reads (they take no turn) and anything else.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The pool back (the writer connections close once no clone of this `WritePool` and no
    /// write transaction of it is left).
    pub fn into_pool(self) -> SqlitePool {
        self.pool
    }

    /// The database file whose writers this queue serializes (its canonical path).
    pub fn path(&self) -> &Path {
        self.queue.path()
    }

    /// Closes the writer connections and the application's pool (as [`SqlitePool::close`]
    /// does: waits for the connections in use to come back, then closes them).
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(writers) = &self.writers {
            writers.close().await;
        }
    }
}

/// The writer pool of `pool`: its connect and pool options, `connections` at most, lazily
/// opened, never closed for idleness or age, not pinged before use.
fn writer_pool(pool: &SqlitePool, connections: u32) -> SqlitePool {
    let options: SqliteConnectOptions = (*pool.connect_options()).clone();
    let pool_options: SqlitePoolOptions = pool.options().clone();
    pool_options
        .max_connections(connections)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .test_before_acquire(false)
        .connect_lazy_with(options)
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
            .field("writers", &self.writers)
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
    /// How long a dropped transaction's rollback may keep the turn.
    rollback_bound: Duration,
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
        let turn = self.turn.take();
        let Some(tx) = self.tx.take() else {
            // Committed or rolled back (or that was cancelled): the turn goes back now.
            drop(turn);
            return;
        };
        // Not committed: roll back, and give the turn back once the rollback has run, so that
        // the next writer (on the other writer connection) does not meet this transaction's
        // write lock and wait in SQLite's sleeping busy handler. Bounded: a rollback that does
        // not come back in time gives the turn back anyway (SQLite's `busy_timeout` then
        // covers the gap). Without a runtime (dropped outside one), sqlx queues the rollback
        // on the connection as it drops, and the turn goes back at once.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let bound = self.rollback_bound;
                runtime.spawn(async move {
                    let _ = tokio::time::timeout(bound, tx.rollback()).await;
                    drop(turn);
                });
            }
            Err(_) => {
                drop(tx);
                drop(turn);
            }
        }
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
