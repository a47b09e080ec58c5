//! `DbError`: a handler error type that tags retryable failures.

use std::fmt;

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::classify::{Retryable, classify, database_code, is_constraint_violation};

/// A handler error for database-backed axum services.
///
/// Any [`sqlx::Error`] converts into it with `?`. Its [`IntoResponse`] answers:
///
/// | error | status | body |
/// |---|---|---|
/// | retryable ([`classify`]) | `503 Service Unavailable` and the [`Retryable`] marker that makes the layer replay the request (when the layer gives up it adds `Retry-After`, unless the handler fenced) | `service busy, retry later` |
/// | constraint violation | `409 Conflict` | `conflict` |
/// | anything else | `500 Internal Server Error` | `internal error` |
///
/// The body never carries SQL, codes or messages: those go to `tracing` (target
/// `tower_sqlite_retry`, event `db error`), where operators can see them.
///
/// ```
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
enum Kind {
    Retryable(Retryable),
    Conflict,
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
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The replay marker, when the error is retryable.
    ///
    /// ```
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

impl From<sqlx::Error> for DbError {
    fn from(error: sqlx::Error) -> Self {
        let kind = if let Some(r) = classify(&error) {
            Kind::Retryable(r)
        } else if is_constraint_violation(&error) {
            Kind::Conflict
        } else {
            Kind::Internal
        };
        Self {
            kind,
            source: Box::new(error),
        }
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

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Retryable(r) => write!(f, "retryable database error {r}: {}", self.source),
            Kind::Conflict => write!(f, "constraint violation: {}", self.source),
            Kind::Internal => write!(f, "database error: {}", self.source),
        }
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

impl IntoResponse for DbError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (code, message) = match self.source.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Database(db)) => {
                (database_code(db.as_ref()), db.message().to_owned())
            }
            _ => (String::new(), self.source.to_string()),
        };
        match &self.kind {
            Kind::Retryable(r) => {
                tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                    db.response.status_code = %r.code(),
                    db.error.name = %r.name(),
                    error.message = %message,
                    "db error (retryable)"
                )
            }
            Kind::Conflict => tracing::event!(target: "tower_sqlite_retry", tracing::Level::INFO,
                db.response.status_code = %code,
                error.message = %message,
                "db error (conflict)"
            ),
            Kind::Internal => tracing::event!(target: "tower_sqlite_retry", tracing::Level::ERROR,
                db.response.status_code = %code,
                error.message = %message,
                "db error"
            ),
        }
        let body = match self.kind {
            Kind::Retryable(_) => "service busy, retry later",
            Kind::Conflict => "conflict",
            Kind::Internal => "internal error",
        };
        let mut res = (status, body).into_response();
        if let Kind::Retryable(r) = self.kind {
            // No `Retry-After` here: the layer adds one where a later try can succeed (never
            // after `Attempt::fence`), spread so that clients turned away together do not come
            // back together.
            res.extensions_mut().insert(r);
        }
        res
    }
}
