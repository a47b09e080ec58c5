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

use super::{Backend, ClassifyError, Coded, Constraint, Retryable};

/// Whether a libsql error is worth replaying the whole request for, and why: the extended
/// result code of an `Error::SqliteFailure` (local databases) or `Error::RemoteSqliteFailure`
/// (embedded replicas), through SQLite's table
/// ([`classify_sqlite_code`](crate::classify_sqlite_code)). Every other error is `None`.
///
/// ```
/// use tower_sqlite_retry::classify_libsql;
///
/// let busy = libsql::Error::SqliteFailure(5, "database is locked".into());
/// assert_eq!(classify_libsql(&busy).unwrap().name(), "SQLITE_BUSY");
/// assert!(classify_libsql(&libsql::Error::QueryReturnedNoRows).is_none());
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
pub fn classify_libsql(error: &libsql::Error) -> Option<Retryable> {
    coded(error)?.classify()
}

/// Whether a libsql error is a constraint violation (any `SQLITE_CONSTRAINT_*`): never
/// replayed, and answered by [`DbError`](crate::DbError) per kind: `409` for unique, primary
/// key and foreign key violations, `422` for NOT NULL and CHECK, `500` for DATATYPE (see the
/// [`classify`](mod@crate::classify) module's SQLite table).
///
/// ```
/// use tower_sqlite_retry::is_constraint_violation_libsql;
///
/// let unique = libsql::Error::SqliteFailure(2067, "UNIQUE constraint failed: t.x".into());
/// assert!(is_constraint_violation_libsql(&unique));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
pub fn is_constraint_violation_libsql(error: &libsql::Error) -> bool {
    constraint(error).is_some()
}

/// An error classifier for services whose error is, or boxes, a `libsql::Error`: runs
/// [`classify_libsql`] on it.
///
/// ```
/// use tower_sqlite_retry::{ClassifyError, LibsqlErrors};
///
/// let boxed: tower::BoxError = Box::new(libsql::Error::SqliteFailure(517, String::new()));
/// assert_eq!(LibsqlErrors.classify_error(&boxed).unwrap().code(), "517");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct LibsqlErrors;

impl ClassifyError<libsql::Error> for LibsqlErrors {
    fn classify_error(&self, error: &libsql::Error) -> Option<Retryable> {
        classify_libsql(error)
    }
}

impl ClassifyError<tower::BoxError> for LibsqlErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        error
            .downcast_ref::<libsql::Error>()
            .and_then(classify_libsql)
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

/// What [`DbError`](crate::DbError)'s tracing events say of a libsql error that carries a
/// SQLite code.
pub(super) fn database_detail(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<super::Detail> {
    Some(coded(error.downcast_ref::<libsql::Error>()?)?.detail())
}
