//! The sqlx path: `WritePool` and `WriteTransaction`, one implementation generic over the
//! driver (sqlx 0.9 here, sqlx 0.8 in the companion crate), from the bottom up:
//!
//! - `driver.rs`: the seam, what the write path needs of a sqlx version; `gate.rs`: the writer
//!   connection's commit hook (only the write path commits);
//! - `group.rs`: group commit's shared fsync (`Syncs`); `checkpoint.rs`: the WAL's checkpoints
//!   off the turn;
//! - `pool.rs`: which database a pool writes to, and where its connections come from;
//!   `session.rs`: the connection, the turn and their pool held together, settled by one
//!   protocol; `transaction.rs`: a write transaction's lifecycle, one state enum;
//! - `wrappers.rs`: the public types' delegations, written once as two doc-hidden macros, and
//!   `v0_9.rs`, their expansion for sqlx 0.9 (feature `sqlite-write`).

pub(crate) mod checkpoint;
pub(crate) mod driver;
pub(crate) mod gate;
pub(crate) mod group;
pub(crate) mod pool;
pub(crate) mod session;
pub(crate) mod transaction;
#[cfg(feature = "sqlite-write")]
pub(crate) mod v0_9;
mod wrappers;
