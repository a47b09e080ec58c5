//! `DbError`: a handler error type that tags retryable failures: a driver's error with the
//! tables' verdict (here, below the source-chain classifier that reads it).

use std::fmt;

#[cfg(feature = "axum")]
use axum::response::{IntoResponse, Response};
use http::StatusCode;

#[cfg(any(driver, feature = "diesel"))]
use super::{Constraint, DriverError};
use super::{Detail, Retryable, classified_by, database_detail};

/// A handler error for database-backed axum services.
///
/// The error of every supported driver converts into it with `?`, each behind its feature:
/// `sqlx::Error` of sqlx 0.9 (`sqlx`, the default), of sqlx 0.8 (`sqlx-0_8`),
/// `rusqlite::Error` (`rusqlite`), `libsql::Error` (`libsql`) and `diesel::result::Error`
/// (`diesel`). All are classified by the same tables, so the answer depends
/// on the database's code, not on the driver (Diesel keeps no code: its error kinds, and
/// SQLite's fixed `database is locked` for `SQLITE_BUSY`). Its `IntoResponse` (feature `axum`) and [`into_http_response`](DbError::into_http_response) answer:
///
/// | error | status | body |
/// |---|---|---|
/// | retryable ([`DriverError::retryable`](crate::DriverError::retryable)) | `503 Service Unavailable` and the [`Retryable`] marker that makes the layer replay the request (when the layer gives up it adds `Retry-After`, unless the handler fenced) | `service busy, retry later` |
/// | unique, primary key, foreign key or exclusion violation (a conflict with other rows) | `409 Conflict` | `conflict` |
/// | NOT NULL or CHECK violation (the request's own content) | `422 Unprocessable Content` | `invalid input` |
/// | anything else (SQLite's DATATYPE included: the server's own binding) | `500 Internal Server Error` | `internal error` |
///
/// The constraint kinds of each database are in the [`classify`](mod@crate::classify)
/// module's tables, with why each status (RFC 9110).
///
/// The body never carries SQL, codes or messages. `tracing` gets them (target
/// `tower_sqlite_retry`), as much as each answer needs and no more of the client's data:
///
/// | answer | event | level | fields |
/// |---|---|---|---|
/// | `503` (replayed by the layer) | `db error (retryable)` | DEBUG | `db.response.status_code`, `db.error.name`; `db.classified_by = "message"` when the verdict came from the database's message rather than its code (Diesel's `SQLITE_BUSY`) |
/// | `409` | `db error (conflict)` | INFO | `db.response.status_code`, `db.error.name`, `db.constraint` and `db.table` (when the driver names them: PostgreSQL) |
/// | `422` | `db error (invalid input)` | INFO | as `409` |
/// | `500` | `db error` | ERROR | `db.response.status_code`, `db.error.name`, `error.message` |
///
/// The database's message is left out of the events of what the client caused: it can quote
/// the client's values (MySQL's `Duplicate entry 'alice@example.com' for key ...`). An
/// application that wants it turns on the event `db error message` (target
/// `tower_sqlite_retry::db_message`, level TRACE; `RUST_LOG=tower_sqlite_retry::db_message=trace`),
/// which carries `db.response.status_code` and `error.message` for every `DbError`.
///
/// # Logs that do not cry wolf
///
/// A replayed attempt's failure is not the client's answer. To log errors only when the answer
/// is final:
///
/// - put tower-http's `TraceLayer` (and any middleware that logs or counts failures by status)
///   **outside** [`SqliteRetryLayer`](crate::SqliteRetryLayer): it then sees one response per
///   request, the one the client gets (inside, it sees every attempt, replayed `503`s
///   included);
/// - in an application's own `IntoResponse`, do not log a retryable error above DEBUG (the one
///   that carries the [`Retryable`] marker, see [`tag_retryable`](crate::tag_retryable)): the
///   layer replays it, and when it gives up it logs `retries exhausted` (ERROR) or
///   `not retried` (WARN) itself, with the code. `DbError` does so: its retryable event is at
///   DEBUG, its ERROR event is only for `500`s, which are never replayed.
///
#[cfg_attr(all(feature = "sqlx", feature = "axum"), doc = "```")]
#[cfg_attr(not(all(feature = "sqlx", feature = "axum")), doc = "```ignore")]
/// use axum::{extract::State, routing::post, Json, Router};
/// use sqlx::SqlitePool;
/// use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};
///
/// async fn create(State(db): State<SqlitePool>, Json(name): Json<String>) -> Result<Json<i64>, DbError> {
///     let mut tx = db.begin().await?;
///     let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
///         .fetch_one(&mut *tx)
///         .await?;
///     sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
///         .bind(next)
///         .bind(name)
///         .execute(&mut *tx)
///         .await?;
///     tx.commit().await?;
///     Ok(Json(next))
/// }
///
/// # fn app(db: SqlitePool) -> Router {
/// Router::new()
///     .route("/items", post(create))
///     .layer(SqliteRetryLayer::new(RetryPolicy::default()))
///     .with_state(db)
/// # }
/// ```
pub struct DbError {
    kind: Kind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug)]
// Without a driver feature, only `DbError::internal` makes one.
#[cfg_attr(not(driver), allow(dead_code))]
enum Kind {
    Retryable(Retryable),
    Conflict,
    Invalid,
    Internal,
}

impl DbError {
    /// Wraps any other error as an internal one (`500`, never replayed).
    ///
    /// ```
    /// # use tower_sqlite_retry::DbError;
    /// let err = DbError::internal(std::io::Error::other("disk on fire"));
    /// assert_eq!(err.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    /// ```
    pub fn internal(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            kind: Kind::Internal,
            source: error.into(),
        }
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self.kind {
            Kind::Retryable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Conflict => StatusCode::CONFLICT,
            Kind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The replay marker, when the error is retryable.
    ///
    #[cfg_attr(feature = "sqlx", doc = "```")]
    #[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
    /// # use tower_sqlite_retry::DbError;
    /// let err = DbError::from(sqlx::Error::PoolTimedOut);
    /// assert_eq!(err.retryable().unwrap().name(), "POOL_TIMED_OUT");
    /// ```
    pub fn retryable(&self) -> Option<&Retryable> {
        match &self.kind {
            Kind::Retryable(r) => Some(r),
            _ => None,
        }
    }

    /// The underlying error (for logs; never sent to the client).
    pub fn source_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.source.as_ref()
    }
}

impl DbError {
    /// A driver's error, classified by the shared tables.
    #[cfg(any(driver, feature = "diesel"))]
    fn classified(
        retryable: Option<Retryable>,
        constraint: Option<Constraint>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let kind = match (retryable, constraint) {
            (Some(r), _) => Kind::Retryable(r),
            (None, Some(Constraint::Conflict)) => Kind::Conflict,
            (None, Some(Constraint::Invalid)) => Kind::Invalid,
            (None, Some(Constraint::Internal) | None) => Kind::Internal,
        };
        Self {
            kind,
            source: Box::new(source),
        }
    }
}

/// sqlx 0.9: [`DriverError::retryable`](crate::DriverError::retryable), then
/// [`is_constraint_violation`](crate::DriverError::is_constraint_violation).
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl From<sqlx::Error> for DbError {
    fn from(error: sqlx::Error) -> Self {
        let retryable = error.retryable();
        let constraint = super::sqlx_constraint(&error);
        Self::classified(retryable, constraint, error)
    }
}

/// sqlx 0.8: [`DriverError::retryable`](crate::DriverError::retryable), then
/// [`is_constraint_violation`](crate::DriverError::is_constraint_violation).
#[cfg(feature = "sqlx-0_8")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx-0_8")))]
impl From<sqlx_0_8::Error> for DbError {
    fn from(error: sqlx_0_8::Error) -> Self {
        let retryable = error.retryable();
        let constraint = super::sqlx08_constraint(&error);
        Self::classified(retryable, constraint, error)
    }
}

/// rusqlite: [`DriverError::retryable`](crate::DriverError::retryable), then
/// [`is_constraint_violation`](crate::DriverError::is_constraint_violation).
#[cfg(feature = "rusqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite")))]
impl From<rusqlite::Error> for DbError {
    fn from(error: rusqlite::Error) -> Self {
        let retryable = error.retryable();
        let constraint = super::rusqlite_constraint(&error);
        Self::classified(retryable, constraint, error)
    }
}

/// libSQL: [`DriverError::retryable`](crate::DriverError::retryable), then
/// [`is_constraint_violation`](crate::DriverError::is_constraint_violation).
#[cfg(feature = "libsql")]
#[cfg_attr(docsrs, doc(cfg(feature = "libsql")))]
impl From<libsql::Error> for DbError {
    fn from(error: libsql::Error) -> Self {
        let retryable = error.retryable();
        let constraint = super::libsql_constraint(&error);
        Self::classified(retryable, constraint, error)
    }
}

/// Diesel: [`DriverError::retryable`](crate::DriverError::retryable) (`SQLITE_BUSY` by
/// SQLite's fixed text, `SerializationFailure`), then the constraint kinds: `UniqueViolation`
/// and `ForeignKeyViolation` `409`, `NotNullViolation` and `CheckViolation` `422`.
#[cfg(feature = "diesel")]
#[cfg_attr(docsrs, doc(cfg(feature = "diesel")))]
impl From<diesel::result::Error> for DbError {
    fn from(error: diesel::result::Error) -> Self {
        let retryable = error.retryable();
        let constraint = super::diesel_constraint(&error);
        Self::classified(retryable, constraint, error)
    }
}

impl fmt::Debug for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

/// What kind of failure, and the retryable code: the source's own text is left to
/// [`source()`](std::error::Error::source), so that chain printers (anyhow's `{:#}`,
/// `tracing`'s error fields) show it once.
impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Retryable(r) => write!(f, "retryable database error {r}"),
            Kind::Conflict => f.write_str("constraint violation"),
            Kind::Invalid => f.write_str("constraint violation (invalid input)"),
            Kind::Internal => f.write_str("database error"),
        }
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

impl DbError {
    /// The answer, as an `http::Response` with any body a `&'static str` converts into: what
    /// `IntoResponse` gives under axum, for plain hyper and
    /// tower services. The status says what happened, the body carries no database detail
    /// (that goes to tracing), and a retryable error carries the [`Retryable`] marker.
    ///
    /// ```
    /// # use tower_sqlite_retry::{DbError, Retryable};
    /// let res: http::Response<String> = DbError::internal(std::io::Error::other("x")).into_http_response();
    /// assert_eq!(res.status(), 500);
    /// assert_eq!(res.body(), "internal error");
    /// ```
    pub fn into_http_response<B: From<&'static str>>(self) -> http::Response<B> {
        let status = self.status();
        let detail = database_detail(self.source.as_ref()).unwrap_or_else(|| Detail {
            message: self.source.to_string(),
            ..Detail::default()
        });
        // The database's message may quote the client's values (MySQL's `Duplicate entry
        // 'alice@example.com' for key ...`): it goes to an event of its own, at TRACE, under a
        // target of its own, which an application turns on to see it.
        tracing::event!(target: "tower_sqlite_retry::db_message", tracing::Level::TRACE,
            db.response.status_code = %detail.code,
            error.message = %detail.message,
            "db error message"
        );
        match &self.kind {
            Kind::Retryable(r) => {
                tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                    db.response.status_code = %r.code(),
                    db.error.name = %r.name(),
                    // Only when the verdict came from the message, not a code (Diesel).
                    db.classified_by = classified_by(self.source.as_ref()),
                    "db error (retryable)"
                )
            }
            Kind::Conflict => tracing::event!(target: "tower_sqlite_retry", tracing::Level::INFO,
                db.response.status_code = %detail.code,
                db.error.name = detail.name,
                db.constraint = detail.constraint.as_deref(),
                db.table = detail.table.as_deref(),
                "db error (conflict)"
            ),
            Kind::Invalid => tracing::event!(target: "tower_sqlite_retry", tracing::Level::INFO,
                db.response.status_code = %detail.code,
                db.error.name = detail.name,
                db.constraint = detail.constraint.as_deref(),
                db.table = detail.table.as_deref(),
                "db error (invalid input)"
            ),
            // The server's own failure: the operator needs the message to fix it.
            Kind::Internal => tracing::event!(target: "tower_sqlite_retry", tracing::Level::ERROR,
                db.response.status_code = %detail.code,
                db.error.name = detail.name,
                error.message = %detail.message,
                "db error"
            ),
        }
        let body = match self.kind {
            Kind::Retryable(_) => "service busy, retry later",
            Kind::Conflict => "conflict",
            Kind::Invalid => "invalid input",
            Kind::Internal => "internal error",
        };
        let mut res = http::Response::new(B::from(body));
        *res.status_mut() = status;
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Kind::Retryable(r) = self.kind {
            // No `Retry-After` here: the layer adds one where a later try can succeed (never
            // after `Attempt::fence`), spread so that clients turned away together do not come
            // back together.
            res.extensions_mut().insert(r);
        }
        res
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for DbError {
    fn into_response(self) -> Response {
        self.into_http_response()
    }
}
