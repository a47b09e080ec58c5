//! Which write turns a request holds: the one place that says it. The write path's `Turn`
//! names its request here when it takes a database's turn for it and un-names it when the
//! request lets go; the write path asks it before a request queues for a turn (a second
//! `begin` of the same database would wait for itself), and the classifiers ask whether the
//! current request holds any (a `SQLITE_BUSY` it meets then is its own lock).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The turns one request holds now, by queue (a database's write queue, named by its nonzero
/// address). A request nearly always holds one at most: it sits in `first`, an atomic, so that
/// naming and un-naming it allocate nothing and take no lock; a second database's turn held
/// at the same time goes to `more` (asked, uncontended, when `first` does not answer).
#[derive(Debug, Default)]
pub(crate) struct TurnsHeld {
    /// One held turn's queue, or 0.
    first: AtomicUsize,
    /// Any other held turns' queues (rare: one request writing to two databases at once).
    more: Mutex<Vec<usize>>,
}

impl TurnsHeld {
    fn more(&self) -> MutexGuard<'_, Vec<usize>> {
        self.more.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request holds the turn of `queue` from now on.
    pub(crate) fn name(&self, queue: usize) {
        debug_assert_ne!(queue, 0, "a queue's address is never 0");
        if self
            .first
            .compare_exchange(0, queue, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.more().push(queue);
        }
    }

    /// The request no longer holds the turn of `queue` (once per `name`).
    pub(crate) fn unname(&self, queue: usize) {
        if self
            .first
            .compare_exchange(queue, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            let mut more = self.more();
            if let Some(at) = more.iter().position(|&q| q == queue) {
                more.swap_remove(at);
            }
        }
    }

    /// Whether the request holds the turn of `queue` now.
    pub(crate) fn holds(&self, queue: usize) -> bool {
        self.first.load(Ordering::Acquire) == queue || self.more().contains(&queue)
    }

    /// Whether the request holds the turn of any database now.
    #[cfg_attr(not(driver), allow(dead_code, reason = "the classifiers ask it"))]
    pub(crate) fn any(&self) -> bool {
        self.first.load(Ordering::Acquire) != 0 || !self.more().is_empty()
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
