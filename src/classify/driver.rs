//! One way to ask any driver's error what it means: the sealed [`DriverError`] trait.
//!
//! Each binding (`sqlx.rs`, `sqlx08.rs`, `rusqlite.rs`, `libsql.rs`) implements the trait for
//! its driver's error by turning it into a [`Coded`](super::Coded): the tables decide.
//! `diesel.rs` reads Diesel's error kinds instead (Diesel keeps no code).

use super::marker::Retryable;

/// Keeps [`DriverError`] implemented by this crate only: the tables behind it are this crate's,
/// and new methods can be added without a breaking release.
mod sealed {
    pub trait Sealed {}
}
pub(super) use sealed::Sealed;

/// A database driver's error, as the tables read it: whether a replay of the whole request
/// can cure it, whether it is a constraint violation, and the database's code and its name.
///
/// Implemented (sealed) for `sqlx::Error` (sqlx 0.9, feature `sqlx`; and sqlx 0.8's, feature
/// `sqlx-0_8`), `rusqlite::Error` (feature `rusqlite`), `libsql::Error` (feature
/// `libsql`) and `diesel::result::Error` (feature `diesel`: Diesel keeps no code, so its
/// `SQLITE_BUSY` is known by SQLite's fixed text `database is locked`, and its
/// `SerializationFailure` kind stands for `40001`). Every driver hands its code to the same table, so one code gets one answer
/// whatever the driver: the [module's](super) tables. For another binding, the tables take
/// codes: [`classify_sqlite_code`](super::classify_sqlite_code),
/// [`classify_postgres_code`](super::classify_postgres_code),
/// [`classify_mysql_code`](super::classify_mysql_code).
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use tower_sqlite_retry::DriverError;
///
/// let timed_out = sqlx::Error::PoolTimedOut;
/// assert_eq!(timed_out.retryable().unwrap().name(), "POOL_TIMED_OUT");
/// assert!(!timed_out.is_constraint_violation());
/// // not a database's error: no code
/// assert_eq!(timed_out.code(), None);
/// assert!(sqlx::Error::RowNotFound.retryable().is_none());
/// ```
pub trait DriverError: Sealed {
    /// `Some` with the marker to insert into the response extensions when a replay of the
    /// whole request can cure the error (`SQLITE_BUSY` and its kin, a serialization failure,
    /// a deadlock victim, a pool time-out); `None` when a replay would only repeat it
    /// (constraints, I/O, corruption, same-connection locks, ...).
    ///
    /// The error's database decides which table applies: SQLite's always, PostgreSQL's with
    /// the `postgres` feature, MySQL's with `mysql`. An error from a database whose feature is
    /// off is never retryable. Whatever the database, sqlx's `PoolTimedOut` is retryable;
    /// `PoolClosed`, `WorkerCrashed`, `Io`, `Tls`, `Protocol`, `RowNotFound`, decoding errors
    /// are not.
    ///
    /// A service that also wants PostgreSQL's `55P03` lock_not_available replayed (see
    /// [`classify_postgres_code`](super::classify_postgres_code) for why it is not by
    /// default):
    ///
    #[cfg_attr(feature = "sqlx", doc = "```")]
    #[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
    /// use tower_sqlite_retry::{DriverError, Retryable};
    ///
    /// fn retryable_with_lock_timeouts(e: &sqlx::Error) -> Option<Retryable> {
    ///     e.retryable().or_else(|| {
    ///         let code = e.as_database_error()?.code()?;
    ///         (code == "55P03").then(|| Retryable::new("55P03", "lock_not_available"))
    ///     })
    /// }
    /// # assert!(retryable_with_lock_timeouts(&sqlx::Error::PoolTimedOut).is_some());
    /// ```
    fn retryable(&self) -> Option<Retryable>;

    /// Whether the error is a constraint violation (unique, primary key, foreign key,
    /// exclusion, not null, check, ...): never replayed, and answered by
    /// [`DbError`](crate::DbError) per kind: `409 Conflict` for a conflict with other rows,
    /// `422 Unprocessable Content` for the request's own content (NOT NULL, CHECK), `500` for
    /// SQLite's DATATYPE (the server's binding).
    fn is_constraint_violation(&self) -> bool;

    /// The database's code as text, `None` for an error that is not the database's (an I/O
    /// error, a pool time-out): SQLite's extended result code in decimal (`"517"`), a
    /// PostgreSQL SQLSTATE (`"40001"`), a MySQL error number (`"1213"`), or the code a
    /// database whose feature is off gave.
    fn code(&self) -> Option<String>;

    /// The code's symbolic name (`SQLITE_BUSY_SNAPSHOT`, `serialization_failure`,
    /// `ER_LOCK_DEADLOCK`); `None` when there is no code, or its database's table is not
    /// compiled in.
    fn code_name(&self) -> Option<&'static str>;
}
