//! What is retryable: the [`Retryable`] marker and the classifier for `sqlx` errors.

use std::borrow::Cow;
use std::fmt;

/// The response extension that asks the layer to replay the request, and says why.
///
/// [`DbError`](crate::DbError) inserts it for retryable database errors. A handler with its
/// own error type inserts it from [`classify`]:
///
/// ```
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
///                 if let Some(marker) = tower_sqlite_retry::classify(&e) {
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

/// Whether a `sqlx` error is worth replaying the whole request for, and why.
///
/// Returns the marker to insert into the response extensions, or `None` for errors that a
/// replay would only repeat (constraints, I/O, corruption, same-connection locks, ...).
///
/// SQLite (extended result codes, primary code = `code & 0xff`):
///
/// | condition | retry |
/// |---|---|
/// | primary 5: `SQLITE_BUSY` 5, `_RECOVERY` 261, `_SNAPSHOT` 517, `_TIMEOUT` 773 | yes |
/// | `SQLITE_LOCKED_SHAREDCACHE` 262 | yes |
/// | `SQLITE_LOCKED` 6 with message `database is deadlocked` (unlock-notify deadlock victim) | yes |
/// | `SQLITE_PROTOCOL` 15 | yes |
/// | [`sqlx::Error::PoolTimedOut`] | yes |
/// | `SQLITE_LOCKED` 6 otherwise, `SQLITE_LOCKED_VTAB` 518 | no |
/// | everything else (constraints, I/O, `FULL`, `CORRUPT`, `READONLY`, `PoolClosed`, ...) | no |
///
/// ```
/// use tower_sqlite_retry::classify;
///
/// let marker = classify(&sqlx::Error::PoolTimedOut).unwrap();
/// assert_eq!(marker.name(), "POOL_TIMED_OUT");
/// assert!(classify(&sqlx::Error::RowNotFound).is_none());
/// ```
pub fn classify(error: &sqlx::Error) -> Option<Retryable> {
    match error {
        sqlx::Error::PoolTimedOut => Some(Retryable::new("pool_timed_out", "POOL_TIMED_OUT")),
        sqlx::Error::Database(db) => classify_database(db.as_ref()),
        _ => None,
    }
}

fn classify_database(db: &dyn sqlx::error::DatabaseError) -> Option<Retryable> {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        let code: i32 = db.code()?.parse().ok()?;
        return classify_sqlite_code(code, db.message());
    }
    let _ = db;
    None
}

/// Classifies a SQLite extended result code (and, for `SQLITE_LOCKED`, its message).
///
/// For users who hold a raw code rather than a `sqlx::Error`:
///
/// ```
/// use tower_sqlite_retry::classify_sqlite_code;
///
/// assert_eq!(classify_sqlite_code(517, "").unwrap().name(), "SQLITE_BUSY_SNAPSHOT");
/// assert!(classify_sqlite_code(6, "database is deadlocked").is_some());
/// assert!(classify_sqlite_code(6, "database table is locked").is_none());
/// assert!(classify_sqlite_code(2067, "UNIQUE constraint failed").is_none());
/// ```
pub fn classify_sqlite_code(code: i32, message: &str) -> Option<Retryable> {
    let retry = match code & 0xff {
        5 | 15 => true,
        // SQLITE_LOCKED_SHAREDCACHE: another connection of the shared cache holds the lock.
        6 if code == 262 => true,
        // sqlx's unlock-notify reports a deadlock victim as plain SQLITE_LOCKED with this
        // message (from sqlite3_unlock_notify); the only text this crate ever looks at.
        6 if code == 6 => message == "database is deadlocked",
        _ => false,
    };
    retry.then(|| {
        Retryable::new(
            Cow::Owned(code.to_string()),
            Cow::Borrowed(sqlite_code_name(code)),
        )
    })
}

/// The symbolic name of a SQLite result code (`517` → `"SQLITE_BUSY_SNAPSHOT"`), or of its
/// primary code when the extended one is not known here.
///
/// ```
/// # use tower_sqlite_retry::sqlite_code_name;
/// assert_eq!(sqlite_code_name(5), "SQLITE_BUSY");
/// assert_eq!(sqlite_code_name(2067), "SQLITE_CONSTRAINT_UNIQUE");
/// ```
pub fn sqlite_code_name(code: i32) -> &'static str {
    match code {
        5 => "SQLITE_BUSY",
        261 => "SQLITE_BUSY_RECOVERY",
        517 => "SQLITE_BUSY_SNAPSHOT",
        773 => "SQLITE_BUSY_TIMEOUT",
        6 => "SQLITE_LOCKED",
        262 => "SQLITE_LOCKED_SHAREDCACHE",
        518 => "SQLITE_LOCKED_VTAB",
        15 => "SQLITE_PROTOCOL",
        275 => "SQLITE_CONSTRAINT_CHECK",
        531 => "SQLITE_CONSTRAINT_COMMITHOOK",
        787 => "SQLITE_CONSTRAINT_FOREIGNKEY",
        1043 => "SQLITE_CONSTRAINT_FUNCTION",
        1299 => "SQLITE_CONSTRAINT_NOTNULL",
        1555 => "SQLITE_CONSTRAINT_PRIMARYKEY",
        1811 => "SQLITE_CONSTRAINT_TRIGGER",
        2067 => "SQLITE_CONSTRAINT_UNIQUE",
        2323 => "SQLITE_CONSTRAINT_VTAB",
        2579 => "SQLITE_CONSTRAINT_ROWID",
        _ => match code & 0xff {
            0 => "SQLITE_OK",
            1 => "SQLITE_ERROR",
            2 => "SQLITE_INTERNAL",
            3 => "SQLITE_PERM",
            4 => "SQLITE_ABORT",
            5 => "SQLITE_BUSY",
            6 => "SQLITE_LOCKED",
            7 => "SQLITE_NOMEM",
            8 => "SQLITE_READONLY",
            9 => "SQLITE_INTERRUPT",
            10 => "SQLITE_IOERR",
            11 => "SQLITE_CORRUPT",
            12 => "SQLITE_NOTFOUND",
            13 => "SQLITE_FULL",
            14 => "SQLITE_CANTOPEN",
            15 => "SQLITE_PROTOCOL",
            16 => "SQLITE_EMPTY",
            17 => "SQLITE_SCHEMA",
            18 => "SQLITE_TOOBIG",
            19 => "SQLITE_CONSTRAINT",
            20 => "SQLITE_MISMATCH",
            21 => "SQLITE_MISUSE",
            22 => "SQLITE_NOLFS",
            23 => "SQLITE_AUTH",
            24 => "SQLITE_FORMAT",
            25 => "SQLITE_RANGE",
            26 => "SQLITE_NOTADB",
            27 => "SQLITE_NOTICE",
            28 => "SQLITE_WARNING",
            _ => "SQLITE_UNKNOWN",
        },
    }
}

/// Whether a `sqlx` error is a constraint violation (unique, foreign key, not null, check):
/// a conflict the client caused, answered `409` by [`DbError`](crate::DbError) and never
/// replayed.
///
/// ```
/// # use tower_sqlite_retry::is_constraint_violation;
/// assert!(!is_constraint_violation(&sqlx::Error::PoolTimedOut));
/// ```
pub fn is_constraint_violation(error: &sqlx::Error) -> bool {
    use sqlx::error::ErrorKind;
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    if matches!(
        db.kind(),
        ErrorKind::UniqueViolation
            | ErrorKind::ForeignKeyViolation
            | ErrorKind::NotNullViolation
            | ErrorKind::CheckViolation
    ) {
        return true;
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| c & 0xff == 19);
    }
    false
}

/// Decides whether a tower service's `Err` is worth a replay. Used by
/// [`SqliteRetryLayer::classify_errors`](crate::SqliteRetryLayer::classify_errors) for plain
/// tower services whose `Error` is not `Infallible`; axum handlers use the response marker
/// instead.
///
/// Implemented for closures `Fn(&E) -> Option<Retryable>`, and by [`NeverRetryErrors`]
/// (the default) and [`SqlxErrors`].
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

/// An error classifier for services whose error is, or boxes, a [`sqlx::Error`]: runs
/// [`classify`] on it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqlxErrors;

impl ClassifyError<sqlx::Error> for SqlxErrors {
    fn classify_error(&self, error: &sqlx::Error) -> Option<Retryable> {
        classify(error)
    }
}

impl ClassifyError<tower::BoxError> for SqlxErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        error.downcast_ref::<sqlx::Error>().and_then(classify)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_table() {
        for code in [5, 261, 517, 773, 262, 15] {
            assert!(classify_sqlite_code(code, "").is_some(), "{code}");
        }
        assert!(classify_sqlite_code(6, "database is deadlocked").is_some());
        for code in [
            6, 518, 19, 2067, 787, 1299, 275, 1555, 13, 11, 267, 26, 8, 264, 10, 266, 7, 9, 17, 1,
        ] {
            assert!(classify_sqlite_code(code, "").is_none(), "{code}");
        }
        // The deadlock message only counts for plain SQLITE_LOCKED.
        assert!(classify_sqlite_code(518, "database is deadlocked").is_none());
        assert_eq!(
            classify_sqlite_code(773, "").unwrap().name(),
            "SQLITE_BUSY_TIMEOUT"
        );
        assert_eq!(classify_sqlite_code(517, "").unwrap().code(), "517");
    }
}
