//! The sqlx 0.8 stack (feature `sqlx-0_8`): the main package's sqlx scenario
//! (`tests/stacks/sqlx_stack.rs`: a real `SQLITE_BUSY` replayed over HTTP, a unique violation
//! answered `409` without replay), compiled here against sqlx 0.8, which this package calls
//! `sqlx`.

#[path = "../../harness.rs"]
mod harness;
#[path = "../../sqlx_stack.rs"]
mod sqlx_stack;
