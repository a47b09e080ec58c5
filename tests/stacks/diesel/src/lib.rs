//! A test-only package: see `tests/stack.rs` and `../harness.rs`. Its modules (but `schema`)
//! are the Diesel examples of `docs/stacks.md`, word for word (`tests/stack.rs` checks it), so
//! that what the docs show is compiled and run.

/// The schema, as `diesel print-schema` writes it for `../harness.rs`'s `SCHEMA`.
pub mod schema;

/// Synchronous Diesel: a connection behind a mutex.
pub mod handler_sync;

/// deadpool-diesel: the query in `interact`.
pub mod handler_pooled;

/// diesel-async's `SyncConnectionWrapper`.
pub mod handler_async;

/// The write path (`WriteQueue`, `WriteTurn`) with Diesel, synchronous and in `interact`.
pub mod write_path;
