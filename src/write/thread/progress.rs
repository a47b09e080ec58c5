//! What a caller and the writer thread share of one closure: when it took the turn (for the
//! report of a transaction slow while it runs), and what the writer thread has to say of it.
//!
//! The writer thread notes what it found (a transaction left open, one ended inside its
//! closure, a closure that met its own lock); the caller says it as it hears the answer, in
//! its own context (the request's span, the task's subscriber). If nobody is left to hear it
//! (the caller gone), whoever finds that out says it: each note is said once.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

/// One closure's progress (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Nanoseconds from the closure's sending to its turn, plus one; 0 before.
    started: AtomicU64,
    /// What the writer thread noted ([`Note`]s as bits), not said yet.
    noted: AtomicU8,
}

/// What the writer thread found of a closure.
#[derive(Clone, Copy, Debug)]
#[repr(u8)]
pub(super) enum Note {
    /// Its transaction was left open on the writer connection (rolled back since).
    LeftOpen = 1,
    /// Its transaction was over before the write path ended it (its request fenced).
    EndedInside = 2,
    /// It failed with `SQLITE_BUSY` from a connection of its own (its request fenced).
    OwnLock = 4,
}

impl Progress {
    /// The closure, sent at `sent`, took the turn now.
    pub(super) fn started(&self, sent: std::time::Instant) {
        let after = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.started.store(after + 1, Ordering::Relaxed);
    }

    /// How long the closure sent at `sent` has held the turn, if it took it.
    pub(super) fn held(&self, sent: std::time::Instant) -> Option<Duration> {
        match self.started.load(Ordering::Relaxed) {
            0 => None,
            after => Some(
                sent.elapsed()
                    .saturating_sub(Duration::from_nanos(after - 1)),
            ),
        }
    }

    /// The writer thread found `note` (said later: [`say`](Self::say)).
    pub(super) fn note(&self, note: Note) {
        self.noted.fetch_or(note as u8, Ordering::Relaxed);
    }

    /// Says (once) what was noted of the closure, for `database`.
    pub(super) fn say(&self, database: &str) {
        let noted = self.noted.swap(0, Ordering::Relaxed);
        if noted & Note::LeftOpen as u8 != 0 {
            tracing::event!(
                target: "tower_sqlite_retry",
                tracing::Level::WARN,
                db.namespace = database,
                "a write transaction was left open on the writer connection after its closure: \
                 rolled back, and the driver's transaction state reset; the next transaction \
                 begins clean"
            );
        }
        if noted & Note::EndedInside as u8 != 0 {
            tracing::event!(
                target: "tower_sqlite_retry",
                tracing::Level::WARN,
                db.namespace = database,
                "a write transaction was over before the write path ended it: its closure ended \
                 it (a raw COMMIT or ROLLBACK), or SQLite rolled it back (after SQLITE_FULL, an \
                 I/O error, a trigger's RAISE(ROLLBACK)); what it wrote may have committed, and \
                 its request is not replayed"
            );
        }
        if noted & Note::OwnLock as u8 != 0 {
            tracing::event!(
                target: "tower_sqlite_retry",
                tracing::Level::ERROR,
                db.namespace = database,
                db.response.status_name = "SQLITE_BUSY",
                "SQLITE_BUSY in a write transaction's closure: a write through another \
                 connection waited for the lock that this very transaction holds on the writer \
                 connection; run it on the closure's transaction. Not replayed: a replay would \
                 wait again"
            );
        }
    }
}
