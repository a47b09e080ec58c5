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

use super::{Backend, ClassifyError, Coded, Constraint, Retryable};

/// Whether a rusqlite error is worth replaying the whole request for, and why: the extended
/// result code of an `Error::SqliteFailure`, through SQLite's table
/// ([`classify_sqlite_code`](crate::classify_sqlite_code): `SQLITE_BUSY` and its extended
/// codes, `SQLITE_LOCKED_SHAREDCACHE`, `SQLITE_PROTOCOL`, the unlock-notify deadlock victim).
/// Every other error, and every other code, is `None`.
///
/// rusqlite opens connections with a busy timeout of 5 s, which covers statements outside a
/// transaction; inside a deferred transaction (`conn.transaction()`), `SQLITE_BUSY` and
/// `SQLITE_BUSY_SNAPSHOT` come at once whatever the timeout, and only a re-run of the whole
/// transaction cures them: the replay.
///
/// ```
/// use rusqlite::ffi;
/// use tower_sqlite_retry::classify_rusqlite;
///
/// let busy = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_BUSY_SNAPSHOT), None);
/// assert_eq!(classify_rusqlite(&busy).unwrap().name(), "SQLITE_BUSY_SNAPSHOT");
/// assert!(classify_rusqlite(&rusqlite::Error::QueryReturnedNoRows).is_none());
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
pub fn classify_rusqlite(error: &rusqlite::Error) -> Option<Retryable> {
    coded(error)?.classify()
}

/// Whether a rusqlite error is a constraint violation (any `SQLITE_CONSTRAINT_*`): never
/// replayed, and answered by [`DbError`](crate::DbError) per kind: `409` for unique, primary
/// key and foreign key violations, `422` for NOT NULL and CHECK, `500` for DATATYPE (see the
/// [`classify`](mod@crate::classify) module's SQLite table).
///
/// ```
/// use rusqlite::ffi;
/// use tower_sqlite_retry::is_constraint_violation_rusqlite;
///
/// let unique = ffi::Error::new(ffi::SQLITE_CONSTRAINT_UNIQUE);
/// assert!(is_constraint_violation_rusqlite(&rusqlite::Error::SqliteFailure(unique, None)));
/// let busy = ffi::Error::new(ffi::SQLITE_BUSY);
/// assert!(!is_constraint_violation_rusqlite(&rusqlite::Error::SqliteFailure(busy, None)));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
pub fn is_constraint_violation_rusqlite(error: &rusqlite::Error) -> bool {
    constraint(error).is_some()
}

/// An error classifier for services whose error is, or boxes, a `rusqlite::Error`: runs
/// [`classify_rusqlite`] on it.
///
/// ```
/// use rusqlite::ffi;
/// use tower_sqlite_retry::{ClassifyError, RusqliteErrors};
///
/// let busy = rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_BUSY), None);
/// let boxed: tower::BoxError = Box::new(busy);
/// assert_eq!(RusqliteErrors.classify_error(&boxed).unwrap().code(), "5");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct RusqliteErrors;

impl ClassifyError<rusqlite::Error> for RusqliteErrors {
    fn classify_error(&self, error: &rusqlite::Error) -> Option<Retryable> {
        classify_rusqlite(error)
    }
}

impl ClassifyError<tower::BoxError> for RusqliteErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        error
            .downcast_ref::<rusqlite::Error>()
            .and_then(classify_rusqlite)
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

/// What [`DbError`](crate::DbError)'s tracing events say of a rusqlite error that carries a
/// SQLite code.
pub(super) fn database_detail(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<super::Detail> {
    Some(coded(error.downcast_ref::<rusqlite::Error>()?)?.detail())
}
