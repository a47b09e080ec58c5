//! `WriteQueue` and `WriteTurn`: the turn on its own, for any driver.

use std::error::Error;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::attempt::current_request;
use crate::recorder::WriteStage;

use crate::write::core::bound::bound;
use crate::write::core::stats::{SLOW_DEFAULT, WriteStats};
use crate::write::core::turn::{Queue, Turn};

/// The write turn of one database file, for drivers the write path has no pool type for
/// (sqlx 0.8, rusqlite, libSQL): wait for a [`WriteTurn`], begin `IMMEDIATE` with your driver,
/// and say [`committed`](WriteTurn::committed) after the commit.
///
/// It is the queue `WritePool` uses: every `WriteQueue` and `WritePool` on one file in this
/// process share it.
///
/// ```ignore
/// // sqlx 0.8 (`sqlx08` here), in a handler or a store below it:
/// let turn = writes.turn(Duration::from_secs(30)).await?; // writes: WriteQueue
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// sqlx08::query("UPDATE ...").execute(&mut *tx).await?;
/// tx.commit().await?;
/// turn.committed(); // gives the turn back and fences the request
/// ```
#[derive(Clone)]
pub struct WriteQueue {
    queue: Arc<Queue>,
    slow: Option<Duration>,
}

impl WriteQueue {
    /// The queue of the database file at `path` (a file not created yet keeps its queue once
    /// it is).
    pub fn for_file(path: impl AsRef<Path>) -> Self {
        Self {
            queue: Queue::of_file(path.as_ref()),
            slow: Some(SLOW_DEFAULT),
        }
    }

    /// Reports (a WARN, at most one a second per database) a turn held `slow` or longer;
    /// 250 ms by default ([`no_slow_transaction_report`](Self::no_slow_transaction_report):
    /// never). See [`WritePool::slow_transaction`][slow].
    ///
    #[cfg_attr(
        feature = "sqlite-write",
        doc = "[slow]: crate::WritePool::slow_transaction"
    )]
    #[cfg_attr(
        not(feature = "sqlite-write"),
        doc = "[slow]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.slow_transaction"
    )]
    pub fn slow_transaction(mut self, slow: Duration) -> Self {
        self.slow = Some(slow);
        self
    }

    /// No report of turns held long (see [`slow_transaction`](Self::slow_transaction)).
    pub fn no_slow_transaction_report(mut self) -> Self {
        self.slow = None;
        self
    }

    /// The turn's counts now: writers waiting, transactions, time held (see [`WriteStats`]).
    pub fn stats(&self) -> WriteStats {
        self.queue.stats()
    }

    /// The file's canonical path.
    pub fn path(&self) -> &Path {
        self.queue
            .path()
            .expect("a file's queue has the file's path")
    }

    /// Waits for the turn, in arrival order, for at most `limit` and never past the current
    /// request's deadline (under the layer, or in a task wrapped in
    /// [`in_request`](crate::in_request)).
    ///
    /// Fails at once with [`TurnError::HeldByThisRequest`] if the current request already
    /// holds this file's turn (it would wait for itself).
    pub async fn turn(&self, limit: Duration) -> Result<WriteTurn, TurnError> {
        let request = current_request();
        let failed = |error| {
            crate::recorder::write_error(Some(self.queue.database()), WriteStage::Turn);
            Err(error)
        };
        if self.queue.is_held_by(request.as_ref()) {
            return failed(TurnError::HeldByThisRequest);
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        match self
            .queue
            .take(request, self.slow, || bound(deadline, limit))
            .await
        {
            Some(turn) => Ok(WriteTurn { turn }),
            None => failed(TurnError::TimedOut),
        }
    }
}

impl fmt::Debug for WriteQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteQueue")
            .field("queue", &self.queue)
            .finish()
    }
}

/// The turn to write to one database file, held until [`committed`](Self::committed) or
/// dropped (after a rollback, or a failure): either gives it to the next in line.
pub struct WriteTurn {
    turn: Turn,
}

impl WriteTurn {
    /// The transaction committed: fences the current request (no replay after this point)
    /// and gives the turn back.
    pub fn committed(self) {
        if let Some(request) = self.turn.request() {
            request.fence();
        }
    }
}

impl fmt::Debug for WriteTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTurn")
            .field("turn", &self.turn)
            .finish()
    }
}

/// Why [`WriteQueue::turn`] returned no turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnError {
    /// The limit or the request's deadline passed first. Worth a retry, as a pool time-out is.
    TimedOut,
    /// The current request already holds this file's turn: commit or drop its transaction
    /// first.
    HeldByThisRequest,
}

impl fmt::Display for TurnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TurnError::TimedOut => "timed out waiting for the database's write turn",
            TurnError::HeldByThisRequest => {
                "this request already holds the database's write turn: commit or drop its \
                 write transaction before beginning another"
            }
        })
    }
}

impl Error for TurnError {}
