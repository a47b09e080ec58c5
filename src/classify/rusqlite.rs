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
use super::marker::{ClassifyError, Constraint, Detail, Retryable};

/// Whether a rusqlite error is worth replaying the whole request for: deprecated, the same as
/// [`classify`](fn@crate::classify) (and [`DriverError::retryable`](super::DriverError::retryable)), one function for every driver.
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
#[deprecated(
    since = "0.1.0",
    note = "use `tower_sqlite_retry::classify` (or `DriverError::retryable`): one function for every driver"
)]
pub fn classify_rusqlite(error: &rusqlite::Error) -> Option<Retryable> {
    error.retryable()
}

/// Whether a rusqlite error is a constraint violation: deprecated, the same as
/// [`DriverError::is_constraint_violation`](super::DriverError::is_constraint_violation).
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
#[deprecated(
    since = "0.1.0",
    note = "use `DriverError::is_constraint_violation` (or `classify::is_constraint_violation`): one for every driver"
)]
pub fn is_constraint_violation_rusqlite(error: &rusqlite::Error) -> bool {
    error.is_constraint_violation()
}

/// An error classifier for services whose error is, or boxes, a `rusqlite::Error`: deprecated,
/// use [`DriverErrors`](super::DriverErrors), one classifier for every driver.
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
#[derive(Clone, Copy, Debug, Default)]
#[deprecated(
    since = "0.1.0",
    note = "use `classify::DriverErrors`: one classifier for every driver"
)]
pub struct RusqliteErrors;

#[allow(deprecated)]
impl ClassifyError<rusqlite::Error> for RusqliteErrors {
    fn classify_error(&self, error: &rusqlite::Error) -> Option<Retryable> {
        error.retryable()
    }
}

#[allow(deprecated)]
impl ClassifyError<tower::BoxError> for RusqliteErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        error
            .downcast_ref::<rusqlite::Error>()
            .and_then(DriverError::retryable)
    }
}

/// The kind of constraint violation the error is, for [`DbError`](crate::DbError).
pub(crate) fn constraint(error: &rusqlite::Error) -> Option<Constraint> {
    coded(error)?.constraint()
}

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

impl super::driver::Sealed for rusqlite::Error {}

impl DriverError for rusqlite::Error {
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

/// What [`DbError`](crate::DbError)'s tracing events say of a rusqlite error that carries a
/// SQLite code.
pub(super) fn database_detail(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<Detail> {
    Some(coded(error.downcast_ref::<rusqlite::Error>()?)?.detail())
}
