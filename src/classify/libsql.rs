//! The libSQL binding (feature `libsql`): turns a `libsql::Error` into a [`Coded`] for
//! SQLite's table.
//!
//! libSQL's local databases report a failed SQLite call as `Error::SqliteFailure(code,
//! message)`, where `code` is `sqlite3_extended_errcode` (libsql's `errors.rs`,
//! `extended_error_code`), and an embedded replica's delegated write as
//! `Error::RemoteSqliteFailure(code, extended_code, message)`: both go to the same table as
//! sqlx's and rusqlite's. Errors of remote databases over HTTP (`Error::Hrana`) carry the
//! server's error as text and a boxed private type: they are never classified (no codes, and
//! this crate does not read message text).
//!
//! The dependency is declared without default features: it brings libsql's error type, not
//! its SQLite fork (`libsql-ffi`), which the application's own libsql features decide.

use super::coded::{Backend, Coded};
use super::driver::DriverError;
use super::marker::{Constraint, Detail, Retryable};
use super::sqlite_binding::sqlite_binding;

/// The SQLite code of a libsql error, if it carries one.
fn coded(error: &libsql::Error) -> Option<Coded<'_>> {
    let (code, message) = match error {
        libsql::Error::SqliteFailure(code, message) => (*code, message),
        libsql::Error::RemoteSqliteFailure(_, extended_code, message) => (*extended_code, message),
        _ => return None,
    };
    Some(Coded {
        backend: Backend::Sqlite(code),
        message,
    })
}

sqlite_binding! {
    driver: libsql,
}
