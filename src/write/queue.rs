//! `WriteQueue` and `WriteTurn`: the turn on its own, for any driver.

use std::error::Error;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

#[allow(unused_imports)] // the stand-in's `fence`/`deadline` (inherent in the real one)
use crate::attempt::{RequestState, current_request};

use super::turn::{Queue, Turn};

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
}

impl WriteQueue {
    /// The queue of the database file at `path` (a file not created yet keeps its queue once
    /// it is).
    pub fn for_file(path: impl AsRef<Path>) -> Self {
        Self {
            queue: Queue::of(path.as_ref()),
        }
    }

    /// The file's canonical path.
    pub fn path(&self) -> &Path {
        self.queue.path()
    }

    /// Waits for the turn, in arrival order, for at most `limit` and never past the current
    /// request's deadline (under the layer).
    ///
    /// Fails at once with [`TurnError::HeldByThisRequest`] if the current request already
    /// holds this file's turn (it would wait for itself).
    pub async fn turn(&self, limit: Duration) -> Result<WriteTurn, TurnError> {
        let request = current_request();
        let holder = holder_of(request.as_ref());
        if self.queue.is_held_by(holder) {
            return Err(TurnError::HeldByThisRequest);
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        let turn = self
            .queue
            .take(holder, || bound(deadline, limit))
            .await
            .ok_or(TurnError::TimedOut)?;
        Ok(WriteTurn {
            turn: Some(turn),
            request,
        })
    }
}

/// The identity of a request in the queue's `holder`: its state's address, 0 for none.
pub(crate) fn holder_of(request: Option<&Arc<RequestState>>) -> usize {
    request.map_or(0, |r| Arc::as_ptr(r) as usize)
}

/// The earlier of `deadline` and `limit` from now.
pub(crate) fn bound(deadline: Option<Instant>, limit: Duration) -> Option<Instant> {
    let limit = Instant::now().checked_add(limit);
    match (deadline, limit) {
        (Some(d), Some(l)) => Some(d.min(l)),
        (d, l) => d.or(l),
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
    turn: Option<Turn>,
    request: Option<Arc<RequestState>>,
}

impl WriteTurn {
    /// The transaction committed: fences the current request (no replay after this point)
    /// and gives the turn back.
    pub fn committed(mut self) {
        if let Some(request) = &self.request {
            request.fence();
        }
        drop(self.turn.take());
    }
}

impl fmt::Debug for WriteTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTurn")
            .field("turn", &self.turn)
            .field("in_request", &self.request.is_some())
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
