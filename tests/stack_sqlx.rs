//! The sqlx 0.9 stack (feature `sqlx`): the README's handler on a real SQLite file, served over
//! real HTTP behind the layer. A write while another connection holds `BEGIN IMMEDIATE` (busy
//! timeout 0) meets `SQLITE_BUSY`, is replayed once the lock is gone, and succeeds on attempt
//! 2; a unique violation is answered `409` and not replayed. The scenario is
//! `tests/stacks/sqlx_stack.rs`, which the sqlx 0.8 package runs too; rusqlite and libsql run
//! the same checks through `tests/stacks/harness.rs`.

#[path = "stacks/harness.rs"]
mod harness;
#[path = "stacks/sqlx_stack.rs"]
mod sqlx_stack;
