//! The source-chain classifier: a retryable database error anywhere in an application's own
//! error (an enum with `#[from] sqlx::Error`, an `anyhow::Error`, an `eyre::Report`), without
//! the application naming the driver's error type.

use std::error::Error;

use super::driver::DriverError;
use super::marker::{ClassifyError, Retryable};

/// Whether an error, or any error in its [`source()`](Error::source) chain, is a retryable
/// database error, and why: the marker to insert into the response, or `None`.
///
/// Each link of the chain is tried against every error type this build knows, whatever the
/// features: a [`DbError`](crate::DbError) (its [`retryable`](crate::DbError::retryable)
/// marker), a `sqlx::Error` of sqlx 0.9 (feature `sqlx`) or 0.8 (`sqlx-0_8`), a
/// `rusqlite::Error` (`rusqlite`), a `libsql::Error` (`libsql`), a `diesel::result::Error`
/// (`diesel`; also the one a `diesel::ConnectionError` holds, which its `source()` skips),
/// and the database errors a
/// sqlx error holds (PostgreSQL's and MySQL's with their features, SQLite's always), which is
/// what the chain shows in place of the `sqlx::Error` itself when a wrapper is
/// `#[error(transparent)]` (thiserror then forwards `source()` past the wrapped error). The
/// same tables decide as for every other classifier (see [the tables](mod@crate::classify)). The
/// first link that is a database error the tables know answers; a chain without one is `None`.
///
/// `anyhow::Error` and `eyre::Report` dereference to `dyn Error`: pass `&*report` (or
/// `report.as_ref()`); this crate depends on neither. A rusqlite error wrapped
/// `#[error(transparent)]` shows only its bare code in the chain (`ffi::Error`, without the
/// message SQLite's table needs): give such a variant a message of its own
/// (`#[error("database")]`) so that the `rusqlite::Error` itself is in the chain.
///
/// An application error with a sqlx variant and an anyhow variant, tagged in one line by its
/// `IntoResponse` with [`tag_retryable`]:
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use axum::response::{IntoResponse, Response};
/// use http::StatusCode;
/// use tower_sqlite_retry::{classify_error_chain, tag_retryable};
///
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error("database error")]
///     Db(#[from] sqlx::Error),
///     #[error("no such item")]
///     NotFound,
///     #[error(transparent)]
///     Other(#[from] anyhow::Error),
/// }
///
/// impl IntoResponse for AppError {
///     fn into_response(self) -> Response {
///         let status = match &self {
///             AppError::NotFound => StatusCode::NOT_FOUND,
///             _ if classify_error_chain(&self).is_some() => StatusCode::SERVICE_UNAVAILABLE,
///             _ => StatusCode::INTERNAL_SERVER_ERROR,
///         };
///         let mut res = status.into_response();
///         // The layer replays the request if the chain holds a retryable database error.
///         tag_retryable(&mut res, &self);
///         res
///     }
/// }
///
/// // A handler's store code returns anyhow, with context, around sqlx.
/// fn store() -> anyhow::Result<()> {
///     use anyhow::Context;
///     Err(sqlx::Error::PoolTimedOut).context("saving the item")
/// }
///
/// let err = AppError::from(store().unwrap_err());
/// assert_eq!(classify_error_chain(&err).unwrap().name(), "POOL_TIMED_OUT");
/// let res = err.into_response();
/// assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert!(res.extensions().get::<tower_sqlite_retry::Retryable>().is_some());
///
/// let res = AppError::from(sqlx::Error::RowNotFound).into_response();
/// assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// assert!(res.extensions().get::<tower_sqlite_retry::Retryable>().is_none());
///
/// // An anyhow report itself, as a handler that returns `anyhow::Result` holds it:
/// let report = anyhow::Error::from(sqlx::Error::PoolTimedOut).context("outer");
/// assert!(classify_error_chain(&*report).is_some());
/// ```
pub fn classify_error_chain(error: &(dyn Error + 'static)) -> Option<Retryable> {
    // NOTE: a chain is walked at most `MAX_LINKS` deep: an error that is its own source (or a
    // loop further down) ends the walk there, and the request is always answered. (Not by
    // address: an error and its source can share one, a wrapper and its first field.)
    let mut link = Some(error);
    for _ in 0..MAX_LINKS {
        let Some(error) = link else { break };
        if let Some(verdict) = classify_link(error) {
            return verdict;
        }
        link = error.source();
    }
    None
}

/// How deep [`classify_error_chain`] walks a `source()` chain (real ones are a handful deep).
const MAX_LINKS: usize = 32;

/// Inserts into `response` the [`Retryable`] marker of the first database error in `error`'s
/// chain (see [`classify_error_chain`]), if it is retryable, so that the layer replays the
/// request; returns whether it did. One line in an application's `IntoResponse`:
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// # use tower_sqlite_retry::tag_retryable;
/// let mut res = http::Response::new(());
/// assert!(tag_retryable(&mut res, &sqlx::Error::PoolTimedOut));
/// assert!(res.extensions().get::<tower_sqlite_retry::Retryable>().is_some());
/// ```
pub fn tag_retryable<B>(response: &mut http::Response<B>, error: &(dyn Error + 'static)) -> bool {
    match classify_error_chain(error) {
        Some(marker) => {
            response.extensions_mut().insert(marker);
            true
        }
        None => false,
    }
}

/// `Some(verdict)` when the link is a database error the tables know (retryable or not),
/// `None` when it is something else and the walk goes on.
fn classify_link(error: &(dyn Error + 'static)) -> Option<Option<Retryable>> {
    if let Some(e) = error.downcast_ref::<super::db_error::DbError>() {
        return Some(e.retryable().cloned());
    }
    #[cfg(feature = "sqlx")]
    if let Some(e) = error.downcast_ref::<::sqlx::Error>() {
        return Some(super::driver::DriverError::retryable(e));
    }
    #[cfg(feature = "sqlx-0_8")]
    if let Some(e) = error.downcast_ref::<sqlx_0_8::Error>() {
        return Some(DriverError::retryable(e));
    }
    #[cfg(feature = "rusqlite")]
    if let Some(e) = error.downcast_ref::<::rusqlite::Error>() {
        return Some(DriverError::retryable(e));
    }
    #[cfg(feature = "libsql")]
    if let Some(e) = error.downcast_ref::<::libsql::Error>() {
        return Some(DriverError::retryable(e));
    }
    #[cfg(feature = "diesel")]
    if let Some(e) = error.downcast_ref::<::diesel::result::Error>() {
        return Some(DriverError::retryable(e));
    }
    // Diesel's `ConnectionError` forwards `source()` past the query error it holds (a
    // connection's setup statement that failed): read it here.
    #[cfg(feature = "diesel")]
    if let Some(::diesel::ConnectionError::CouldntSetupConfiguration(e)) =
        error.downcast_ref::<::diesel::ConnectionError>()
    {
        return Some(DriverError::retryable(e));
    }
    // The database error a sqlx error holds, met in place of the sqlx error behind an
    // `#[error(transparent)]` wrapper.
    #[cfg(all(feature = "postgres", feature = "sqlx"))]
    if let Some(e) = error.downcast_ref::<::sqlx::postgres::PgDatabaseError>() {
        return Some(super::postgres::classify_postgres_code(e.code()));
    }
    #[cfg(all(feature = "postgres", feature = "sqlx-0_8"))]
    if let Some(e) = error.downcast_ref::<sqlx_0_8::postgres::PgDatabaseError>() {
        return Some(super::postgres::classify_postgres_code(e.code()));
    }
    #[cfg(all(feature = "mysql", feature = "sqlx"))]
    if let Some(e) = error.downcast_ref::<::sqlx::mysql::MySqlDatabaseError>() {
        return Some(super::mysql::classify_mysql_code(e.number()));
    }
    #[cfg(all(feature = "mysql", feature = "sqlx-0_8"))]
    if let Some(e) = error.downcast_ref::<sqlx_0_8::mysql::MySqlDatabaseError>() {
        return Some(super::mysql::classify_mysql_code(e.number()));
    }
    // sqlx 0.9's `SqliteError` by its type, where this build has it.
    #[cfg(feature = "sqlite-write")]
    if let Some(e) = error.downcast_ref::<sqlx_sqlite::SqliteError>() {
        use ::sqlx::error::DatabaseError;
        let code = e
            .code()
            .as_deref()
            .and_then(super::sqlite::sqlx_sqlite_code)?;
        return Some(super::coded::classify_sqlite_in_request(code, e.message()));
    }
    #[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
    if let Some((code, message)) = sqlx_sqlite_error(error) {
        return Some(super::coded::classify_sqlite_in_request(code, &message));
    }
    None
}

/// The extended result code and the message of sqlx's `SqliteError` (0.8, or 0.9 in a build
/// without `sqlite-write`), which this crate cannot name (see the `sqlite` table's
/// documentation). It is met in a chain behind an application's `#[error(transparent)]`
/// wrapper of a `sqlx::Error` (which forwards `source()` past the sqlx error). Recognised by
/// both of what sqlx prints of it, which must agree: its derived `Debug`,
/// `SqliteError { code: 517, message: "..." }`, whole, and its `Display`, `(code: 517) ...`,
/// with the same code and message. Another type is read as SQLite's only if it prints exactly
/// what sqlx's `SqliteError` prints, both ways.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
fn sqlx_sqlite_error(error: &(dyn Error + 'static)) -> Option<(i32, String)> {
    let debug = format!("{error:?}");
    let rest = debug.strip_prefix("SqliteError { code: ")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: i32 = rest[..digits].parse().ok()?;
    let quoted = rest[digits..]
        .strip_prefix(", message: ")?
        .strip_suffix(" }")?;
    let display = error.to_string();
    let message = display.strip_prefix(&format!("(code: {code}) "))?;
    (format!("{message:?}") == quoted).then(|| (code, message.to_owned()))
}

/// An error classifier for plain tower services whose error is a driver's error, or boxes one
/// anywhere in its `source()` chain ([`classify_error_chain`](super::classify_error_chain)):
/// for [`SqliteRetryLayer::classify_errors`](crate::SqliteRetryLayer::classify_errors).
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use tower_sqlite_retry::ClassifyError;
/// use tower_sqlite_retry::classify::RetryDriverErrors;
///
/// assert!(RetryDriverErrors.classify_error(&sqlx::Error::PoolTimedOut).is_some());
/// let boxed: tower::BoxError = Box::new(sqlx::Error::PoolTimedOut);
/// assert_eq!(RetryDriverErrors.classify_error(&boxed).unwrap().name(), "POOL_TIMED_OUT");
/// let other: tower::BoxError = "not a database error".into();
/// assert!(RetryDriverErrors.classify_error(&other).is_none());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryDriverErrors;

impl<E: DriverError> ClassifyError<E> for RetryDriverErrors {
    fn classify_error(&self, error: &E) -> Option<Retryable> {
        error.retryable()
    }
}

impl ClassifyError<tower::BoxError> for RetryDriverErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        classify_error_chain(error.as_ref())
    }
}

/// The default classifier of an [`Operation`](crate::Operation): a driver's retryable error
/// anywhere in the error's `source()` chain ([`classify_error_chain`]), for any error type
/// that is a `std::error::Error` (a driver's own, an application's enum, `OperationError`).
/// For a boxed error (`tower::BoxError`, a job runner's), use
/// [`RetryDriverErrors`]; for `anyhow::Error`, a closure (`Operation::classify_with`).
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use tower_sqlite_retry::ClassifyError;
/// use tower_sqlite_retry::classify::RetryErrorChain;
///
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error("database")]
///     Db(#[from] sqlx::Error),
/// }
///
/// let timed_out = AppError::from(sqlx::Error::PoolTimedOut);
/// assert!(RetryErrorChain.classify_error(&timed_out).is_some());
/// assert!(RetryErrorChain.classify_error(&AppError::from(sqlx::Error::RowNotFound)).is_none());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryErrorChain;

impl<E: Error + 'static> ClassifyError<E> for RetryErrorChain {
    fn classify_error(&self, error: &E) -> Option<Retryable> {
        classify_error_chain(error)
    }
}
