//! The vocabulary every classifier answers in: the [`Retryable`] marker, the kind of
//! [`Constraint`] a violation is, the [`Detail`] `DbError`'s events carry, and the
//! [`ClassifyError`] trait for service errors. A leaf: it imports nothing of the crate.

use std::borrow::Cow;
use std::fmt;

/// The response extension that asks the layer to replay the request, and says why.
///
/// [`DbError`](crate::DbError) inserts it for retryable database errors. A handler with its
/// own error type inserts it with [`tag_retryable`](crate::tag_retryable), which finds the
/// database error anywhere in the error's `source()` chain (see
/// [`classify_error_chain`](crate::classify_error_chain)), or inserts the marker that
/// [`DriverError::retryable`](crate::DriverError::retryable) returns for its driver's error, or a code table such as
/// [`classify_sqlite_code`](crate::classify::classify_sqlite_code) for any other binding:
///
#[cfg_attr(feature = "sqlx", doc = "```")]
#[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
/// use axum::response::{IntoResponse, Response};
/// use http::StatusCode;
///
/// enum AppError {
///     Db(sqlx::Error),
/// }
///
/// impl IntoResponse for AppError {
///     fn into_response(self) -> Response {
///         match self {
///             AppError::Db(e) => {
///                 let mut res = StatusCode::SERVICE_UNAVAILABLE.into_response();
///                 if let Some(marker) = tower_sqlite_retry::DriverError::retryable(&e) {
///                     res.extensions_mut().insert(marker);
///                 }
///                 res
///             }
///         }
///     }
/// }
/// # let res = AppError::Db(sqlx::Error::PoolTimedOut).into_response();
/// # assert!(res.extensions().get::<tower_sqlite_retry::Retryable>().is_some());
/// ```
///
/// The layer never looks at status codes or message text: only this marker (or, for plain
/// tower services, an error classifier) triggers a replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retryable {
    code: Cow<'static, str>,
    name: Cow<'static, str>,
}

impl Retryable {
    /// A marker with a database code (`"517"`, `"40001"`, `"1213"`) and its name
    /// (`"SQLITE_BUSY_SNAPSHOT"`).
    ///
    /// ```
    /// # use tower_sqlite_retry::Retryable;
    /// let r = Retryable::new("517", "SQLITE_BUSY_SNAPSHOT");
    /// assert_eq!(r.code(), "517");
    /// assert_eq!(r.name(), "SQLITE_BUSY_SNAPSHOT");
    /// ```
    pub fn new(code: impl Into<Cow<'static, str>>, name: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code: code.into(),
            name: name.into(),
        }
    }

    /// The database's code as text: SQLite's extended result code in decimal, a PostgreSQL
    /// SQLSTATE, a MySQL error number, or `"pool_timed_out"`.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The code's symbolic name, for logs and dashboards.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for Retryable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.code)
    }
}

/// The marker for a pool that had no connection to give within its acquire timeout: the same
/// for every pool.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
pub(super) fn pool_timed_out() -> Retryable {
    Retryable::new("pool_timed_out", "POOL_TIMED_OUT")
}

/// What a constraint violation says about the request, and so the status
/// [`DbError`](crate::DbError) answers it with (RFC 9110; see the tables in the module's
/// documentation for each database's codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(driver), allow(dead_code))]
pub(crate) enum Constraint {
    /// UNIQUE, PRIMARY KEY, FOREIGN KEY, EXCLUSION (or a constraint whose kind the code does
    /// not say): the request conflicts with the current state of the data, other rows; the
    /// same request can succeed once that state changes. `409 Conflict` (§15.5.10).
    Conflict,
    /// NOT NULL, CHECK: the request's own content breaks a rule declared on the data, whatever
    /// the state; only a different request can pass. `422 Unprocessable Content` (§15.5.21).
    Invalid,
    /// DATATYPE (and SQLite's `SQLITE_CONSTRAINT_PINNED`): the server's code bound a value of
    /// a type its schema refuses, or broke an invariant of its own; a typed binding decides
    /// the type, not the client. `500 Internal Server Error` (§15.6.1).
    Internal,
}

/// What [`DbError`](crate::DbError)'s tracing events say of a database error.
#[derive(Debug, Default)]
pub(crate) struct Detail {
    /// The database's code (`db.response.status_code`).
    pub(crate) code: String,
    /// The code's symbolic name, `""` when unknown.
    pub(crate) name: &'static str,
    /// The violated constraint's name, when the driver gives it (PostgreSQL).
    pub(crate) constraint: Option<String>,
    /// The table, when the driver gives it (PostgreSQL).
    pub(crate) table: Option<String>,
    /// The database's message: may quote the client's values (MySQL's `Duplicate entry
    /// 'alice@example.com' for key ...`), so never logged above TRACE for what the client
    /// caused.
    pub(crate) message: String,
}

/// Decides whether a tower service's `Err` is worth a replay. Used by
/// [`SqliteRetryLayer::classify_errors`](crate::SqliteRetryLayer::classify_errors) for plain
/// tower services whose `Error` is not `Infallible`; axum handlers use the response marker
/// instead.
///
/// Implemented for closures `Fn(&E) -> Option<Retryable>`, and by [`NeverRetryErrors`]
/// (the default) and [`RetryDriverErrors`](crate::classify::RetryDriverErrors) (any driver's error, or
/// one boxed in a service's error).
pub trait ClassifyError<E> {
    /// `Some` to replay, with the reason; `None` to return the error.
    fn classify_error(&self, error: &E) -> Option<Retryable>;
}

impl<E, F> ClassifyError<E> for F
where
    F: Fn(&E) -> Option<Retryable>,
{
    fn classify_error(&self, error: &E) -> Option<Retryable> {
        self(error)
    }
}

/// The default error classifier: service errors are never replayed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NeverRetryErrors;

impl<E> ClassifyError<E> for NeverRetryErrors {
    fn classify_error(&self, _: &E) -> Option<Retryable> {
        None
    }
}
