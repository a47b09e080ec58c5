//! What is retryable: the [`Retryable`] marker and the classifier for `sqlx` errors (SQLite,
//! PostgreSQL, MySQL/MariaDB).

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
/// The error's backend decides which table applies; each backend is recognised only when its
/// cargo feature is on (`sqlite`, the default; `postgres`; `mysql`). An error from a backend
/// whose feature is off is never retryable. Whatever the backend:
///
/// | condition | retry |
/// |---|---|
/// | [`sqlx::Error::PoolTimedOut`] | yes |
/// | `PoolClosed`, `WorkerCrashed`, `Io`, `Tls`, `Protocol`, `RowNotFound`, decoding, ... | no |
///
/// SQLite (feature `sqlite`; extended result codes, primary code = `code & 0xff`; see
/// [`classify_sqlite_code`]):
///
/// | condition | retry |
/// |---|---|
/// | primary 5: `SQLITE_BUSY` 5, `_RECOVERY` 261, `_SNAPSHOT` 517, `_TIMEOUT` 773 | yes |
/// | `SQLITE_LOCKED_SHAREDCACHE` 262 | yes |
/// | `SQLITE_LOCKED` 6 with message `database is deadlocked` (unlock-notify deadlock victim) | yes |
/// | `SQLITE_PROTOCOL` 15 | yes |
/// | `SQLITE_LOCKED` 6 otherwise, `SQLITE_LOCKED_VTAB` 518 | no |
/// | everything else (constraints, I/O, `FULL`, `CORRUPT`, `READONLY`, ...) | no |
///
/// PostgreSQL (feature `postgres`; the SQLSTATE, see [`classify_postgres_code`]). PostgreSQL
/// aborts the whole transaction on both retryable codes and asks the client to run it again:
///
/// | SQLSTATE | retry |
/// |---|---|
/// | `40001` serialization_failure (`SERIALIZABLE` / `REPEATABLE READ` conflicts) | yes |
/// | `40P01` deadlock_detected (the deadlock detector's victim) | yes |
/// | `55P03` lock_not_available (`NOWAIT`, `lock_timeout`) | **no**: see below |
/// | everything else (class `23` constraints, `40002`, `40003`, `57014` query_canceled, `53300` too_many_connections, ...) | no |
///
/// MySQL and MariaDB (feature `mysql`; the error number, not the SQLSTATE, see
/// [`classify_mysql_code`]):
///
/// | error number | retry |
/// |---|---|
/// | `1213` ER_LOCK_DEADLOCK (InnoDB rolled the whole transaction back) | yes |
/// | `1205` ER_LOCK_WAIT_TIMEOUT (`innodb_lock_wait_timeout`, 50 s by default) | yes |
/// | `3572` ER_LOCK_NOWAIT (`NOWAIT`) | no, as `55P03` |
/// | everything else (`1062` ER_DUP_ENTRY and other constraints, `1020` ER_CHECKREAD, ...) | no |
///
/// # Why `55P03` lock_not_available is not retried
///
/// PostgreSQL raises it only when the application asked not to wait: `SELECT ... FOR UPDATE
/// NOWAIT`, `LOCK ... NOWAIT`, or a `lock_timeout` (off by default). That is a deliberate
/// choice to fail fast, often "someone else is already working on this row"; replaying the
/// request with backoff would quietly turn it into waiting after all, up to the policy's
/// deadline. A service that does want those replayed says so itself:
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
///
/// `1205` is retried although it looks alike, because MySQL's lock wait timeout is on by
/// default (50 s): it is contention that lasted too long, not a request to fail fast. Note that
/// InnoDB rolls back only the *statement* on `1205` (unless `innodb_rollback_on_timeout` is
/// on): the replay is safe because the handler's `?` drops the `sqlx` transaction, which rolls
/// the rest back. A handler that catches `1205` and commits anyway must not ask for a replay.
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

/// Dispatches on the backend that produced the error; each arm exists only with its feature.
/// The code the tracing schema reports for a database error (`db.response.status_code`):
/// SQLite's extended result code, PostgreSQL's SQLSTATE, MySQL's error number.
pub(crate) fn database_code(db: &dyn sqlx::error::DatabaseError) -> String {
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number().to_string();
    }
    db.code().map(|c| c.into_owned()).unwrap_or_default()
}

fn classify_database(db: &dyn sqlx::error::DatabaseError) -> Option<Retryable> {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        let code: i32 = db.code()?.parse().ok()?;
        return classify_sqlite_code(code, db.message());
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return classify_postgres_code(pg.code());
    }
    // `DatabaseError::code()` is MySQL's SQLSTATE, too coarse (`40001` for a deadlock,
    // `HY000` for a lock wait timeout); the error number tells them apart.
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return classify_mysql_code(my.number());
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

/// Classifies a PostgreSQL SQLSTATE: `40001` serialization_failure and `40P01`
/// deadlock_detected are retryable, nothing else (`55P03` lock_not_available included: see
/// [`classify`] for why).
///
/// For users who hold a raw SQLSTATE rather than a `sqlx::Error` (from `tokio-postgres`, say).
/// The marker's [`code`](Retryable::code) is the SQLSTATE, its [`name`](Retryable::name) the
/// condition name of PostgreSQL's manual. Available whatever the features: it needs no driver.
///
/// ```
/// use tower_sqlite_retry::classify_postgres_code;
///
/// let marker = classify_postgres_code("40001").unwrap();
/// assert_eq!((marker.code(), marker.name()), ("40001", "serialization_failure"));
/// assert_eq!(classify_postgres_code("40P01").unwrap().name(), "deadlock_detected");
/// assert!(classify_postgres_code("55P03").is_none()); // lock_not_available
/// assert!(classify_postgres_code("23505").is_none()); // unique_violation
/// ```
pub fn classify_postgres_code(sqlstate: &str) -> Option<Retryable> {
    let code = match sqlstate {
        "40001" => "40001",
        "40P01" => "40P01",
        _ => return None,
    };
    Some(Retryable::new(code, postgres_code_name(code)))
}

/// The condition name of a PostgreSQL SQLSTATE (`"40001"` → `"serialization_failure"`), or of
/// its class (the first two characters) when the code itself is not known here, or
/// `"unknown"`.
///
/// ```
/// # use tower_sqlite_retry::postgres_code_name;
/// assert_eq!(postgres_code_name("40P01"), "deadlock_detected");
/// assert_eq!(postgres_code_name("23505"), "unique_violation");
/// assert_eq!(postgres_code_name("23999"), "integrity_constraint_violation");
/// assert_eq!(postgres_code_name("ZZ123"), "unknown");
/// ```
pub fn postgres_code_name(sqlstate: &str) -> &'static str {
    match sqlstate {
        "40000" => "transaction_rollback",
        "40001" => "serialization_failure",
        "40002" => "transaction_integrity_constraint_violation",
        "40003" => "statement_completion_unknown",
        "40P01" => "deadlock_detected",
        "55000" => "object_not_in_prerequisite_state",
        "55006" => "object_in_use",
        "55P03" => "lock_not_available",
        "23000" => "integrity_constraint_violation",
        "23001" => "restrict_violation",
        "23502" => "not_null_violation",
        "23503" => "foreign_key_violation",
        "23505" => "unique_violation",
        "23514" => "check_violation",
        "23P01" => "exclusion_violation",
        "25001" => "active_sql_transaction",
        "25006" => "read_only_sql_transaction",
        "25P02" => "in_failed_sql_transaction",
        "08000" => "connection_exception",
        "08003" => "connection_does_not_exist",
        "08006" => "connection_failure",
        "22001" => "string_data_right_truncation",
        "22003" => "numeric_value_out_of_range",
        "22012" => "division_by_zero",
        "22P02" => "invalid_text_representation",
        "42601" => "syntax_error",
        "42501" => "insufficient_privilege",
        "42703" => "undefined_column",
        "42P01" => "undefined_table",
        "53000" => "insufficient_resources",
        "53100" => "disk_full",
        "53200" => "out_of_memory",
        "53300" => "too_many_connections",
        "57014" => "query_canceled",
        "57P01" => "admin_shutdown",
        "57P02" => "crash_shutdown",
        "57P03" => "cannot_connect_now",
        "0A000" => "feature_not_supported",
        "P0001" => "raise_exception",
        "XX000" => "internal_error",
        "XX001" => "data_corrupted",
        "XX002" => "index_corrupted",
        _ => match sqlstate.get(..2) {
            Some("08") => "connection_exception",
            Some("22") => "data_exception",
            Some("23") => "integrity_constraint_violation",
            Some("25") => "invalid_transaction_state",
            Some("40") => "transaction_rollback",
            Some("42") => "syntax_error_or_access_rule_violation",
            Some("53") => "insufficient_resources",
            Some("54") => "program_limit_exceeded",
            Some("55") => "object_not_in_prerequisite_state",
            Some("57") => "operator_intervention",
            Some("58") => "system_error",
            Some("XX") => "internal_error",
            _ => "unknown",
        },
    }
}

/// Classifies a MySQL/MariaDB error number: `1213` ER_LOCK_DEADLOCK and `1205`
/// ER_LOCK_WAIT_TIMEOUT are retryable, nothing else.
///
/// For users who hold a raw error number rather than a `sqlx::Error` (from `mysql_async`,
/// say). The marker's [`code`](Retryable::code) is the number in decimal, its
/// [`name`](Retryable::name) the server's symbol. Available whatever the features.
///
/// ```
/// use tower_sqlite_retry::classify_mysql_code;
///
/// let marker = classify_mysql_code(1213).unwrap();
/// assert_eq!((marker.code(), marker.name()), ("1213", "ER_LOCK_DEADLOCK"));
/// assert_eq!(classify_mysql_code(1205).unwrap().name(), "ER_LOCK_WAIT_TIMEOUT");
/// assert!(classify_mysql_code(1062).is_none()); // ER_DUP_ENTRY
/// assert!(classify_mysql_code(3572).is_none()); // ER_LOCK_NOWAIT
/// ```
pub fn classify_mysql_code(number: u16) -> Option<Retryable> {
    let code = match number {
        1213 => "1213",
        1205 => "1205",
        _ => return None,
    };
    Some(Retryable::new(code, mysql_code_name(number)))
}

/// The symbol of a MySQL/MariaDB server error number (`1213` → `"ER_LOCK_DEADLOCK"`), or
/// `"UNKNOWN"` when it is not known here.
///
/// ```
/// # use tower_sqlite_retry::mysql_code_name;
/// assert_eq!(mysql_code_name(1205), "ER_LOCK_WAIT_TIMEOUT");
/// assert_eq!(mysql_code_name(1062), "ER_DUP_ENTRY");
/// assert_eq!(mysql_code_name(9999), "UNKNOWN");
/// ```
pub fn mysql_code_name(number: u16) -> &'static str {
    match number {
        1205 => "ER_LOCK_WAIT_TIMEOUT",
        1213 => "ER_LOCK_DEADLOCK",
        3572 => "ER_LOCK_NOWAIT",
        1020 => "ER_CHECKREAD",
        1180 => "ER_ERROR_DURING_COMMIT",
        1206 => "ER_LOCK_TABLE_FULL",
        1022 => "ER_DUP_KEY",
        1062 => "ER_DUP_ENTRY",
        1169 => "ER_DUP_UNIQUE",
        1586 => "ER_DUP_ENTRY_WITH_KEY_NAME",
        1859 => "ER_DUP_UNKNOWN_IN_INDEX",
        1216 => "ER_NO_REFERENCED_ROW",
        1217 => "ER_ROW_IS_REFERENCED",
        1451 => "ER_ROW_IS_REFERENCED_2",
        1452 => "ER_NO_REFERENCED_ROW_2",
        1048 => "ER_BAD_NULL_ERROR",
        1364 => "ER_NO_DEFAULT_FOR_FIELD",
        3819 => "ER_CHECK_CONSTRAINT_VIOLATED",
        // MariaDB's number; MySQL uses 4025 for an unrelated error.
        4025 => "ER_CONSTRAINT_FAILED",
        1040 => "ER_CON_COUNT_ERROR",
        1045 => "ER_ACCESS_DENIED_ERROR",
        1064 => "ER_PARSE_ERROR",
        1146 => "ER_NO_SUCH_TABLE",
        1054 => "ER_BAD_FIELD_ERROR",
        1317 => "ER_QUERY_INTERRUPTED",
        1792 => "ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION",
        1969 => "ER_STATEMENT_TIMEOUT",
        3024 => "ER_QUERY_TIMEOUT",
        1105 => "ER_UNKNOWN_ERROR",
        _ => "UNKNOWN",
    }
}

/// Whether a `sqlx` error is a constraint violation (unique, foreign key, not null, check,
/// exclusion): a conflict the client caused, answered `409` by [`DbError`](crate::DbError)
/// and never replayed.
///
/// sqlx's [`ErrorKind`](sqlx::error::ErrorKind) decides for every backend (PostgreSQL class
/// `23`: `23505`, `23503`, `23502`, `23514`, `23P01`; MySQL/MariaDB `1062` and the other
/// duplicate-key numbers, `1451`/`1452`, `1048`, `3819`, MariaDB `4025`); besides, any SQLite
/// primary code 19 (`SQLITE_CONSTRAINT_*`) and any PostgreSQL class `23` SQLSTATE
/// (`23001` restrict_violation, ...) count. MySQL's SQLSTATE `23000` alone does not: it also
/// covers errors the client did not cause (`1052`, an ambiguous column).
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
            | ErrorKind::ExclusionViolation
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
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg.code().starts_with("23");
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

    #[test]
    fn postgres_table() {
        for (code, name) in [
            ("40001", "serialization_failure"),
            ("40P01", "deadlock_detected"),
        ] {
            let r = classify_postgres_code(code).unwrap_or_else(|| panic!("{code}"));
            assert_eq!((r.code(), r.name()), (code, name));
            assert_eq!(postgres_code_name(code), name);
        }
        for code in [
            "55P03", "40000", "40002", "40003", "23505", "23503", "23502", "23514", "23P01",
            "23001", "25P02", "57014", "57P01", "53300", "53100", "08006", "42P01", "XX000",
            "00000", "", "4", "40", "40p01", "400010",
        ] {
            assert!(classify_postgres_code(code).is_none(), "{code:?}");
        }
        assert_eq!(postgres_code_name("55P03"), "lock_not_available");
        assert_eq!(postgres_code_name("40999"), "transaction_rollback");
        assert_eq!(postgres_code_name(""), "unknown");
        assert_eq!(postgres_code_name("4"), "unknown");
    }

    #[test]
    fn mysql_table() {
        for (number, code, name) in [
            (1213, "1213", "ER_LOCK_DEADLOCK"),
            (1205, "1205", "ER_LOCK_WAIT_TIMEOUT"),
        ] {
            let r = classify_mysql_code(number).unwrap_or_else(|| panic!("{number}"));
            assert_eq!((r.code(), r.name()), (code, name));
            assert_eq!(mysql_code_name(number), name);
        }
        for number in [
            3572, 1020, 1180, 1206, 1062, 1022, 1169, 1586, 1859, 1216, 1217, 1451, 1452, 1048,
            1364, 3819, 4025, 1040, 1064, 1146, 1317, 1969, 3024, 1105, 0, 40001, 65535,
        ] {
            assert!(classify_mysql_code(number).is_none(), "{number}");
        }
        assert_eq!(mysql_code_name(3572), "ER_LOCK_NOWAIT");
        assert_eq!(mysql_code_name(0), "UNKNOWN");
    }

    #[test]
    fn names_of_retryable_codes_are_the_markers_names() {
        for code in ["40001", "40P01"] {
            assert_eq!(
                classify_postgres_code(code).unwrap().name(),
                postgres_code_name(code)
            );
        }
        for number in [1213, 1205] {
            assert_eq!(
                classify_mysql_code(number).unwrap().name(),
                mysql_code_name(number)
            );
        }
    }
}
