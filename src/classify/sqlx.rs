//! The sqlx 0.9 binding (feature `sqlx`): turns a `sqlx::Error` into a [`Coded`] for the
//! tables.
//!
//! It depends on sqlx-core only (through the `sqlx` facade with no features), never on sqlx's
//! SQLite driver, so it cannot downcast to `SqliteError`: PostgreSQL and MySQL errors are
//! recognised first, by downcast, when their features are on, and what remains is SQLite's if
//! its code is one to four digits (see [`super::sqlite`] for why that rule is sound). The
//! `sqlx08` binding is the same code against sqlx 0.8's types.

use sqlx::error::{DatabaseError, ErrorKind};

use super::sqlite::sqlx_sqlite_code;
use super::{Backend, Coded, Retryable};

/// Whether a sqlx 0.9 error is worth replaying the whole request for, and why.
///
/// Returns the marker to insert into the response extensions, or `None` for errors that a
/// replay would only repeat (constraints, I/O, corruption, same-connection locks, ...).
///
/// The error's database decides which table applies: SQLite's always (no feature needed beyond
/// `sqlx`: the SQLite driver is the application's, bundled or not), PostgreSQL's with the
/// `postgres` feature, MySQL's with `mysql`. An error from a database whose feature is off is
/// never retryable. Whatever the database:
///
/// | condition | retry |
/// |---|---|
/// | [`sqlx::Error::PoolTimedOut`] | yes |
/// | `PoolClosed`, `WorkerCrashed`, `Io`, `Tls`, `Protocol`, `RowNotFound`, decoding, ... | no |
///
/// The tables, shared with every other driver: SQLite's extended result codes in
/// [`classify_sqlite_code`](crate::classify_sqlite_code) (`SQLITE_BUSY` and its extended codes,
/// `SQLITE_LOCKED_SHAREDCACHE`, `SQLITE_PROTOCOL`, the unlock-notify deadlock victim),
/// PostgreSQL's SQLSTATEs in [`classify_postgres_code`](crate::classify_postgres_code) (`40001`,
/// `40P01`; not `55P03`, and why), MySQL's error numbers in
/// [`classify_mysql_code`](crate::classify_mysql_code) (`1213`, `1205`, and why).
///
/// ```
/// use tower_sqlite_retry::classify;
///
/// let marker = classify(&sqlx::Error::PoolTimedOut).unwrap();
/// assert_eq!(marker.name(), "POOL_TIMED_OUT");
/// assert!(classify(&sqlx::Error::RowNotFound).is_none());
/// ```
///
/// A service that also wants PostgreSQL's `55P03` lock_not_available replayed (see
/// [`classify_postgres_code`](crate::classify_postgres_code) for why it is not by default):
///
/// ```
/// use tower_sqlite_retry::{Retryable, classify};
///
/// fn classify_with_lock_timeouts(e: &sqlx::Error) -> Option<Retryable> {
///     classify(e).or_else(|| {
///         let code = e.as_database_error()?.code()?;
///         (code == "55P03").then(|| Retryable::new("55P03", "lock_not_available"))
///     })
/// }
/// # assert!(classify_with_lock_timeouts(&sqlx::Error::PoolTimedOut).is_some());
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub fn classify(error: &sqlx::Error) -> Option<Retryable> {
    classify_error(error)
}

/// Whether a sqlx 0.9 error is a constraint violation (unique, foreign key, not null, check,
/// exclusion): a conflict the client caused, answered `409` by [`DbError`](crate::DbError)
/// and never replayed.
///
/// sqlx's [`ErrorKind`] decides for every database (PostgreSQL class `23`: `23505`, `23503`,
/// `23502`, `23514`, `23P01`; MySQL/MariaDB `1062` and the other duplicate-key numbers,
/// `1451`/`1452`, `1048`, `3819`, MariaDB `4025`; SQLite's unique, primary key, foreign key,
/// not null and check codes); besides, any SQLite primary code 19 (`SQLITE_CONSTRAINT_*`) and
/// any PostgreSQL class `23` SQLSTATE (`23001` restrict_violation, ...) count. MySQL's SQLSTATE
/// `23000` alone does not: it also covers errors the client did not cause (`1052`, an
/// ambiguous column).
///
/// ```
/// # use tower_sqlite_retry::is_constraint_violation;
/// assert!(!is_constraint_violation(&sqlx::Error::PoolTimedOut));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub fn is_constraint_violation(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    matches!(
        db.kind(),
        ErrorKind::UniqueViolation
            | ErrorKind::ForeignKeyViolation
            | ErrorKind::NotNullViolation
            | ErrorKind::CheckViolation
            | ErrorKind::ExclusionViolation
    ) || coded(db.as_ref()).is_constraint()
}

super::sqlx_binding!();
