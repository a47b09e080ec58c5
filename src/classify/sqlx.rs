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
use super::{Backend, Coded, Constraint, Retryable};

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
/// [`classify_mysql_code`](crate::classify_mysql_code) (`1213`, `1205`, `1020`, `3101`, and why).
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

/// Whether a sqlx 0.9 error is a constraint violation (unique, primary key, foreign key,
/// exclusion, not null, check, ...): never replayed, and answered by [`DbError`](crate::DbError)
/// per kind: `409 Conflict` for unique, primary key, foreign key and exclusion violations (a
/// conflict with other rows), `422 Unprocessable Content` for NOT NULL and CHECK (the
/// request's own content), `500` for SQLite's DATATYPE (the server's binding).
///
/// The database's table decides (SQLite's extended result codes, PostgreSQL's class `23`,
/// MySQL's error numbers: see the [`classify`](mod@crate::classify) module's tables); for a
/// database whose feature is off, sqlx's [`ErrorKind`]. MySQL's SQLSTATE `23000` alone does
/// not count: it also covers errors the client did not cause (`1052`, an ambiguous column).
///
/// ```
/// # use tower_sqlite_retry::is_constraint_violation;
/// assert!(!is_constraint_violation(&sqlx::Error::PoolTimedOut));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub fn is_constraint_violation(error: &sqlx::Error) -> bool {
    constraint_of(error).is_some()
}

/// The kind of constraint sqlx's `ErrorKind` says, for a database whose table is not compiled
/// in (its feature is off).
fn kind_constraint(kind: ErrorKind) -> Option<Constraint> {
    match kind {
        ErrorKind::UniqueViolation
        | ErrorKind::ForeignKeyViolation
        | ErrorKind::ExclusionViolation => Some(Constraint::Conflict),
        ErrorKind::NotNullViolation | ErrorKind::CheckViolation => Some(Constraint::Invalid),
        _ => None,
    }
}

/// The kind of constraint violation a sqlx error is, for [`DbError`](crate::DbError).
pub(crate) fn constraint(error: &sqlx::Error) -> Option<Constraint> {
    constraint_of(error)
}

super::sqlx_binding!();
