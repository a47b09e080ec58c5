//! Which write turns a request holds: the one place that says it. The write path's `Turn`
//! names its request here when it takes a database's turn for it and un-names it when the
//! request lets go; the write path asks it before a request queues for a turn (a second
//! `begin` of the same database would wait for itself), and the classifiers ask whether the
//! current request holds any (a `SQLITE_BUSY` it meets then is its own lock).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The turns one request holds now, by queue (a database's write queue, named by its
/// address). A request rarely holds more than one: a `Vec` under a lock that is never held
/// across an await.
#[derive(Debug, Default)]
pub(crate) struct TurnsHeld {
    queues: Mutex<Vec<usize>>,
}

impl TurnsHeld {
    fn queues(&self) -> MutexGuard<'_, Vec<usize>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request holds the turn of `queue` from now on.
    pub(crate) fn name(&self, queue: usize) {
        self.queues().push(queue);
    }

    /// The request no longer holds the turn of `queue` (once per `name`).
    pub(crate) fn unname(&self, queue: usize) {
        let mut queues = self.queues();
        if let Some(at) = queues.iter().position(|&q| q == queue) {
            queues.swap_remove(at);
        }
    }

    /// Whether the request holds the turn of `queue` now.
    pub(crate) fn holds(&self, queue: usize) -> bool {
        self.queues().contains(&queue)
    }

    /// Whether the request holds the turn of any database now.
    #[cfg_attr(not(driver), allow(dead_code, reason = "the classifiers ask it"))]
    pub(crate) fn any(&self) -> bool {
        !self.queues().is_empty()
    }
}

/// How the write path says whether a writer waits for a write turn of any database in this
/// process now; registered by the write path when it makes its first queue. The fact lives in
/// the write path's queues; the request core only carries the question to them, so that the
/// layer (whose read limit asks it) and the write path never import each other.
static WRITERS_WAITING: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// The write path registers its answer to [`writers_waiting`] (once; later calls change
/// nothing).
#[allow(
    dead_code,
    reason = "the write path registers it; the model check has no layer"
)]
pub(crate) fn register_writers_waiting(probe: fn() -> bool) {
    let _ = WRITERS_WAITING.set(probe);
}

/// Whether a writer waits for a write turn of any database in this process now: what the
/// layer's read limit asks before a read runs. `false` while no write path was ever used.
#[allow(dead_code, reason = "the layer asks it; the model check has no layer")]
pub(crate) fn writers_waiting() -> bool {
    WRITERS_WAITING.get().is_some_and(|probe| probe())
}
