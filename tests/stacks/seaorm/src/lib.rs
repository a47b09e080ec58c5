//! A test-only package: see `tests/stack.rs` and `../harness.rs`. Its `handler` module is the
//! SeaORM example of `docs/stacks.md`, word for word (`tests/stack.rs` checks it), so that what
//! the docs show is compiled and run.

/// The entity, as `sea-orm-cli generate entity` writes it for `../harness.rs`'s `SCHEMA`.
pub mod item;

/// The handlers, and `DbErr` to `DbError`.
pub mod handler;
