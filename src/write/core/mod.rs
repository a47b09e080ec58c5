//! The bottom of the write path: the database file's turn, and what is counted of it. Nothing
//! here knows a driver, a connection or SQLite's statements.
//!
//! - `turn.rs`: the turn in this process, a FIFO queue per database file (and the registry that
//!   makes every pool on one file share it); the file's refusal after a failed sync;
//! - `file_turn.rs`: the turn between processes, a lock of the operating system's on a file
//!   beside the database, which the in-process turn's holder takes;
//! - `stats.rs`: how many wait, how long the turn is held (`WriteStats`), the slow-transaction
//!   report;
//! - `bound.rs`: a wait's bound (the deadline, or a limit); `failed.rs`: `GroupCommitFailed`.

pub(crate) mod bound;
pub(crate) mod failed;
pub(crate) mod file_turn;
#[cfg(test)]
mod file_turn_tests;
pub(crate) mod stats;
pub(crate) mod turn;
#[cfg(test)]
mod turn_tests;

/// The synchronization the turn's holder uses: std's here, shuttle's in the model check.
pub(crate) mod sync {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
}
