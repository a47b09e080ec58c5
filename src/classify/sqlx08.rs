//! The sqlx 0.8 binding (feature `sqlx-0_8`): turns a sqlx 0.8 error into a [`Coded`] for the
//! tables.
//!
//! The same code as the sqlx 0.8 binding (`sqlx.rs`, whose module documentation says why it
//! works as it does), against sqlx 0.8's types: sqlx-core 0.8 through the facade with no
//! features, PostgreSQL's and MySQL's pure-Rust drivers when their features are on. Keep the
//! two files alike. sqlx 0.8's SQLite driver gives the extended result code in decimal, as
//! 0.9's does (`SqliteError::code`).
//!
//! In an application on sqlx 0.8 the crate is named `sqlx`; here it is `sqlx_0_8`, as in the
//! examples below.

use sqlx_0_8 as sqlx;

use sqlx::error::{DatabaseError, ErrorKind};

use super::sqlite::sqlx_sqlite_code;
use super::{Backend, Coded, Retryable};

/// Whether a sqlx 0.8 error is worth replaying the whole request for, and why.
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
/// | `sqlx::Error::PoolTimedOut` | yes |
/// | `PoolClosed`, `WorkerCrashed`, `Io`, `Tls`, `Protocol`, `RowNotFound`, decoding, ... | no |
///
/// The tables, shared with every other driver: SQLite's extended result codes in
/// [`classify_sqlite_code`](crate::classify_sqlite_code) (`SQLITE_BUSY` and its extended codes,
/// `SQLITE_LOCKED_SHAREDCACHE`, `SQLITE_PROTOCOL`, the unlock-notify deadlock victim),
/// PostgreSQL's SQLSTATEs in [`classify_postgres_code`](crate::classify_postgres_code) (`40001`,
/// `40P01`; not `55P03`, and why), MySQL's error numbers in
/// [`classify_mysql_code`](crate::classify_mysql_code) (`1213`, `1205`, and why).
///
/// This is `classify` for sqlx 0.8 (see there for an example that adds
/// `55P03`): the same tables, the same answers.
///
/// ```
/// use sqlx_0_8 as sqlx; // in an application on sqlx 0.8, just `sqlx`
/// use tower_sqlite_retry::classify_sqlx_0_8;
///
/// let marker = classify_sqlx_0_8(&sqlx::Error::PoolTimedOut).unwrap();
/// assert_eq!(marker.name(), "POOL_TIMED_OUT");
/// assert!(classify_sqlx_0_8(&sqlx::Error::RowNotFound).is_none());
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-0_8")))]
pub fn classify_sqlx_0_8(error: &sqlx::Error) -> Option<Retryable> {
    classify_error(error)
}

/// Whether a sqlx 0.8 error is a constraint violation (unique, foreign key, not null, check,
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
/// # use sqlx_0_8 as sqlx;
/// # use tower_sqlite_retry::is_constraint_violation_sqlx_0_8;
/// assert!(!is_constraint_violation_sqlx_0_8(&sqlx::Error::PoolTimedOut));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-0_8")))]
pub fn is_constraint_violation_sqlx_0_8(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    // sqlx 0.8 has no `ErrorKind::ExclusionViolation`; PostgreSQL's `23P01` is class `23`.
    matches!(
        db.kind(),
        ErrorKind::UniqueViolation
            | ErrorKind::ForeignKeyViolation
            | ErrorKind::NotNullViolation
            | ErrorKind::CheckViolation
    ) || coded(db.as_ref()).is_constraint()
}

super::sqlx_binding!();
