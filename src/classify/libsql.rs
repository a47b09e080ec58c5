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
use super::marker::{ClassifyError, Constraint, Detail, Retryable};

/// Whether a libsql error is worth replaying the whole request for: deprecated, the same as
/// [`classify`](fn@crate::classify) (and [`DriverError::retryable`](super::DriverError::retryable)), one function for every driver.
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
#[deprecated(
    since = "0.1.0",
    note = "use `tower_sqlite_retry::classify` (or `DriverError::retryable`): one function for every driver"
)]
pub fn classify_libsql(error: &libsql::Error) -> Option<Retryable> {
    error.retryable()
}

/// Whether a libsql error is a constraint violation: deprecated, the same as
/// [`DriverError::is_constraint_violation`](super::DriverError::is_constraint_violation).
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
#[deprecated(
    since = "0.1.0",
    note = "use `DriverError::is_constraint_violation` (or `classify::is_constraint_violation`): one for every driver"
)]
pub fn is_constraint_violation_libsql(error: &libsql::Error) -> bool {
    error.is_constraint_violation()
}

/// An error classifier for services whose error is, or boxes, a `libsql::Error`: deprecated,
/// use [`DriverErrors`](super::DriverErrors), one classifier for every driver.
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
#[derive(Clone, Copy, Debug, Default)]
#[deprecated(
    since = "0.1.0",
    note = "use `classify::DriverErrors`: one classifier for every driver"
)]
pub struct LibsqlErrors;

#[allow(deprecated)]
impl ClassifyError<libsql::Error> for LibsqlErrors {
    fn classify_error(&self, error: &libsql::Error) -> Option<Retryable> {
        error.retryable()
    }
}

#[allow(deprecated)]
impl ClassifyError<tower::BoxError> for LibsqlErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        error
            .downcast_ref::<libsql::Error>()
            .and_then(DriverError::retryable)
    }
}

/// The kind of constraint violation the error is, for [`DbError`](crate::DbError).
pub(crate) fn constraint(error: &libsql::Error) -> Option<Constraint> {
    coded(error)?.constraint()
}

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

impl super::driver::Sealed for libsql::Error {}

impl DriverError for libsql::Error {
    fn retryable(&self) -> Option<Retryable> {
        coded(self)?.classify()
    }

    fn is_constraint_violation(&self) -> bool {
        constraint(self).is_some()
    }

    fn code(&self) -> Option<String> {
        Some(coded(self)?.code())
    }

    fn code_name(&self) -> Option<&'static str> {
        Some(coded(self)?.name()).filter(|name| !name.is_empty())
    }
}

/// What [`DbError`](crate::DbError)'s tracing events say of a libsql error that carries a
/// SQLite code.
pub(super) fn database_detail(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<Detail> {
    Some(coded(error.downcast_ref::<libsql::Error>()?)?.detail())
}
