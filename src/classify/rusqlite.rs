//! The rusqlite binding (feature `rusqlite`): turns a `rusqlite::Error` into a [`Coded`] for
//! SQLite's table.
//!
//! rusqlite turns on extended result codes for every connection it opens and reports each
//! failed SQLite call as `Error::SqliteFailure(ffi::Error { code, extended_code }, message)`, a
//! shape that has not changed across the versions this crate accepts (0.14 to 0.43, the
//! manifest's range). The extended code goes to the same table as sqlx's, so a `SQLITE_BUSY`
//! is retried and a `SQLITE_CONSTRAINT_*` is a `409` on either driver. No other variant
//! carries a contention code: `SqlInputError` (a syntax error with its offset) is only made for
//! the primary code `SQLITE_ERROR`, and the rest are rusqlite's own errors (conversions, no
//! rows, ...).
//!
//! The dependency is declared without default features and with no feature of rusqlite's
//! turned on: the application's own rusqlite decides bundled or system SQLite, and the two
//! unify into one rusqlite (there can be only one, `links = "sqlite3"`).

use super::coded::{Backend, Coded};
use super::driver::DriverError;
use super::marker::{Constraint, Detail, Retryable};
use super::sqlite_binding::sqlite_binding;

/// The SQLite code of a rusqlite error, if it carries one.
fn coded(error: &rusqlite::Error) -> Option<Coded<'_>> {
    match error {
        rusqlite::Error::SqliteFailure(failure, message) => Some(Coded {
            backend: Backend::Sqlite(failure.extended_code),
            message: message.as_deref().unwrap_or_default(),
        }),
        _ => None,
    }
}

sqlite_binding! {
    driver: rusqlite,
}
