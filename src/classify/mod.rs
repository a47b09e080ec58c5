//! What is retryable, and what each database error answers: the [`Retryable`] marker, the
//! classifiers, and one table per database.
//!
//! Every binding (sqlx 0.9, sqlx 0.8, rusqlite, libsql) hands its driver's code to the same
//! tables, so that one code gets one answer whatever the driver. Decisions are taken on codes:
//! messages change between versions, are localised by some servers, and repeat one wording
//! for unrelated codes. The exceptions are texts SQLite itself fixes, where the code alone
//! cannot tell (below). [`DbError`](crate::DbError) answers with the last column; an
//! application's own error type finds the marker with [`classify_error_chain`].
//!
//! # SQLite
//!
//! By extended result code (the primary code in the low byte: `517` = `5 | 2 << 8`).
//!
//! | code | what happened | replay | `DbError` |
//! |---|---|---|---|
//! | `5` SQLITE_BUSY, `261` _RECOVERY, `517` _SNAPSHOT, `773` _TIMEOUT | another connection holds the lock, or the transaction's WAL snapshot is stale: only a re-run of the whole transaction cures it | yes | `503` |
//! | `5` with a message SQLite sets for the connection's own statements: `cannot commit transaction - SQL statements in progress`, `cannot open savepoint - ...`, `cannot release savepoint - ...` (and `unable to close ...`, `unable to delete/modify user-function ...` / `collation sequence ...`) | this connection's own write statement is still running (an `INSERT ... RETURNING` not read to the end): a replay meets it again. sqlx never runs two statements at once on a connection; rusqlite and libsql can | no | `500` |
//! | `262` SQLITE_LOCKED_SHAREDCACHE | another connection of the shared cache holds a table lock | yes | `503` |
//! | `6` SQLITE_LOCKED with `database is deadlocked` | the victim of an unlock-notify deadlock | yes | `503` |
//! | `6` otherwise, `518` _VTAB | a lock held by the same connection | no | `500` |
//! | `15` SQLITE_PROTOCOL | a WAL lock race SQLite gave up on | yes | `503` |
//! | `2067` CONSTRAINT_UNIQUE, `1555` _PRIMARYKEY, `2579` _ROWID, `787` _FOREIGNKEY | conflict with other rows | no | `409` |
//! | `1299` CONSTRAINT_NOTNULL, `275` _CHECK | the request's own content | no | `422` |
//! | `3091` CONSTRAINT_DATATYPE (STRICT tables), `2835` _PINNED | the server's binding, or its own trigger | no | `500` |
//! | other `19` (plain, `1811` _TRIGGER's `RAISE()`, `531` _COMMITHOOK, `1043` _FUNCTION, `2323` _VTAB) | a rule of the application's own, kind unknown | no | `409` |
//! | everything else (I/O, `FULL`, `CORRUPT`, `READONLY`, `ERROR`, ...) | | no | `500` |
//!
//! Sources: result codes <https://www.sqlite.org/rescode.html>; `SQLITE_BUSY` in WAL mode and
//! inside transactions <https://www.sqlite.org/wal.html#sometimes_queries_return_sqlite_busy_in_wal_mode>
//! and <https://www.sqlite.org/lang_transaction.html>; the deadlock message
//! <https://www.sqlite.org/unlock_notify.html>; STRICT tables
//! <https://www.sqlite.org/stricttables.html>; the same-connection messages are SQLite's own
//! (`vdbe.c`, `OP_AutoCommit` and `OP_Savepoint`; `main.c`), the same from 3.7.11 to 3.51.
//!
//! # PostgreSQL
//!
//! By SQLSTATE.
//!
//! | SQLSTATE | what happened | replay | `DbError` |
//! |---|---|---|---|
//! | `40001` serialization_failure | a `SERIALIZABLE` / `REPEATABLE READ` transaction lost a conflict; PostgreSQL aborted it and asks for a re-run | yes | `503` |
//! | `40P01` deadlock_detected | the deadlock detector's victim, aborted | yes | `503` |
//! | `55P03` lock_not_available | `NOWAIT` or `lock_timeout`: the application asked not to wait ([`classify_postgres_code`] shows how to replay it anyway) | no | `500` |
//! | `23505` unique, `23503` foreign_key, `23P01` exclusion, `23001` restrict, other class `23` | conflict with other rows | no | `409` |
//! | `23502` not_null, `23514` check | the request's own content | no | `422` |
//! | everything else (class `22` data exceptions such as `22P02`, `57014`, `53300`, ...) | | no | `500` |
//!
//! Sources: <https://www.postgresql.org/docs/current/errcodes-appendix.html>,
//! <https://www.postgresql.org/docs/current/mvcc-serialization-failure-handling.html>.
//!
//! # MySQL and MariaDB
//!
//! By server error number (the SQLSTATE is too coarse: `40001` for a deadlock, `HY000` for a
//! lock wait timeout and hundreds of unrelated errors).
//!
//! | number | what happened | replay | `DbError` |
//! |---|---|---|---|
//! | `1213` ER_LOCK_DEADLOCK | InnoDB's deadlock victim (and Galera's certification failure), rolled back | yes | `503` |
//! | `1205` ER_LOCK_WAIT_TIMEOUT | a lock wait outlasted `innodb_lock_wait_timeout` (50 s); the handler's `?` rolls the rest back | yes | `503` |
//! | `1020` ER_CHECKREAD | MariaDB's snapshot isolation (`innodb_snapshot_isolation`, on by default from 11.6.2): the row changed since the transaction's snapshot; the transaction is rolled back | yes | `503` |
//! | `3101` ER_TRANSACTION_ROLLBACK_DURING_COMMIT | MySQL Group Replication's certification failure: the whole transaction is rolled back at commit | yes | `503` |
//! | `3572` ER_LOCK_NOWAIT | `NOWAIT`: asked not to wait (MariaDB reports `NOWAIT` as `1205`) | no | `500` |
//! | `1062` ER_DUP_ENTRY, `1022`, `1169`, `1586`, `1859` (duplicate keys); `1452`, `1451`, `1216`, `1217`, `1834` (foreign keys) | conflict with other rows | no | `409` |
//! | `1048` ER_BAD_NULL_ERROR, `1364` ER_NO_DEFAULT_FOR_FIELD; `3819` (MySQL) / `4025` with SQLSTATE `23000` (MariaDB) CHECK | the request's own content | no | `422` |
//! | everything else (strict mode's `1366`, `1264`, `1406`; `1180`, `1052`, ...) | | no | `500` |
//!
//! Sources: MariaDB's `innodb_snapshot_isolation`
//! <https://mariadb.com/docs/server/server-usage/storage-engines/innodb/innodb-system-variables#innodb_snapshot_isolation>,
//! error 1020 <https://mariadb.com/docs/server/reference/error-codes/mariadb-error-codes-1000-to-1099/e1020>
//! and MDEV-35235 (the rollback is signalled as for a deadlock)
//! <https://jira.mariadb.org/browse/MDEV-35235>; MySQL Group Replication
//! <https://dev.mysql.com/doc/refman/8.4/en/group-replication-summary.html> ("the
//! transaction ordered second aborts, and thus is rolled back on the originating server");
//! InnoDB deadlocks and error handling <https://dev.mysql.com/doc/refman/8.4/en/innodb-deadlocks.html>,
//! <https://dev.mysql.com/doc/refman/8.4/en/innodb-error-handling.html>; the error references
//! <https://dev.mysql.com/doc/mysql-errors/8.4/en/server-error-reference.html>,
//! <https://mariadb.com/docs/server/reference/error-codes>.
//!
//! # Why these statuses (RFC 9110)
//!
//! - `409 Conflict` (§15.5.10) is "a conflict with the current state of the target
//!   resource": a unique, primary key, foreign key or exclusion violation depends on *other*
//!   rows, and the same request can succeed once they change.
//! - `422 Unprocessable Content` (§15.5.21): the server understood the request, but its content
//!   breaks a rule (NOT NULL, CHECK) whatever the state; only a different request passes. A
//!   handler whose own code fills the column (so that the violation is its bug) maps it to
//!   `500` itself.
//! - `500 Internal Server Error` (§15.6.1) for a value of a type the schema refuses: with
//!   typed bindings the handler's code, not the client, decides what type is bound.
//! - `503 Service Unavailable` (§15.6.4) for contention, replayed by the layer, which adds
//!   `Retry-After` when it gives up.
//!
//! # Recognising sqlx's SQLite errors
//!
//! This crate never depends on a SQLite driver for sqlx (that would bring a `libsqlite3-sys`,
//! and with it a second SQLite, into the application's build), so it cannot name sqlx's
//! `SqliteError`. PostgreSQL's and MySQL's errors are recognised by downcast (their drivers
//! are pure Rust); SQLite's by the name its derived `Debug` prints first and a code of one to
//! four digits, so that another driver's numeric codes are never read as SQLite's. The tests
//! pin that shape on real errors of sqlx 0.8 and 0.9.

// Layout: this file holds the marker, the error classifiers (`NeverRetryErrors`, `SqlxErrors`)
// and the dispatch: every binding turns its driver's error into a `Coded` (which database,
// which code, the message) and the tables decide on that. The tables need no driver:
// `sqlite` (shared by every SQLite binding), `postgres`, `mysql`. The bindings, each behind
// its feature: `sqlx` (0.9), `sqlx08` (0.8), `rusqlite`, `libsql`; `chain` walks an error's
// `source()` chain through all of them.

use std::borrow::Cow;
use std::fmt;

mod chain;
mod driver;
#[cfg(feature = "libsql")]
mod libsql;
mod mysql;
mod postgres;
#[cfg(feature = "rusqlite")]
mod rusqlite;
mod sqlite;
/// The sqlx bindings' shared code, expanded in `sqlx.rs` and `sqlx08.rs`, where `sqlx` names
/// each version's crate: the same logic against sqlx 0.9's and sqlx 0.8's types.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
macro_rules! sqlx_binding {
    () => {
        /// Whether a sqlx error is worth a replay (the body of `classify` and
        /// `classify_sqlx_0_8`).
        fn classify_error(error: &sqlx::Error) -> Option<Retryable> {
            match error {
                sqlx::Error::PoolTimedOut => Some(super::pool_timed_out()),
                sqlx::Error::Database(db) => coded(db.as_ref()).classify(),
                _ => None,
            }
        }

        /// Which database the error came from, and its code there.
        fn coded(db: &dyn DatabaseError) -> Coded<'_> {
            let message = db.message();
            #[cfg(feature = "postgres")]
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                return Coded {
                    backend: Backend::Postgres(pg.code()),
                    message,
                };
            }
            // `code()` is MySQL's SQLSTATE, too coarse (`40001` for a deadlock, `HY000` for a lock
            // wait timeout); the error number tells them apart.
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return Coded {
                    backend: Backend::MySql {
                        number: my.number(),
                        sqlstate: my.code(),
                    },
                    message,
                };
            }
            // SQLite's table only for sqlx's own SQLite driver: a third-party or custom
            // `DatabaseError` with numeric codes is no SQLite error (1285 is not SQLITE_BUSY).
            let code = db.code();
            let sqlite = code
                .as_deref()
                .and_then(sqlx_sqlite_code)
                .filter(|_| super::is_sqlx_sqlite_error(db.as_error()));
            let backend = match sqlite {
                Some(code) => Backend::Sqlite(code),
                None => Backend::Unknown(code),
            };
            Coded { backend, message }
        }

        /// What kind of constraint violation a sqlx error is, if one: the database's table
        /// decides; for a database whose table is not compiled in, sqlx's `ErrorKind`.
        fn constraint_of(error: &sqlx::Error) -> Option<Constraint> {
            let sqlx::Error::Database(db) = error else {
                return None;
            };
            let coded = coded(db.as_ref());
            match coded.backend {
                Backend::Unknown(_) => kind_constraint(db.kind()),
                _ => coded.constraint(),
            }
        }

        impl super::driver::Sealed for sqlx::Error {}

        impl super::DriverError for sqlx::Error {
            fn retryable(&self) -> Option<Retryable> {
                classify_error(self)
            }

            fn is_constraint_violation(&self) -> bool {
                constraint_of(self).is_some()
            }

            fn code(&self) -> Option<String> {
                let sqlx::Error::Database(db) = self else {
                    return None;
                };
                Some(coded(db.as_ref()).code()).filter(|code| !code.is_empty())
            }

            fn code_name(&self) -> Option<&'static str> {
                let sqlx::Error::Database(db) = self else {
                    return None;
                };
                Some(coded(db.as_ref()).name()).filter(|name| !name.is_empty())
            }
        }

        /// What [`DbError`](crate::DbError)'s tracing events say of a sqlx database error.
        pub(super) fn database_detail(
            error: &(dyn std::error::Error + Send + Sync + 'static),
        ) -> Option<super::Detail> {
            match error.downcast_ref::<sqlx::Error>()? {
                sqlx::Error::Database(db) => {
                    let coded = coded(db.as_ref());
                    Some(super::Detail {
                        code: coded.code(),
                        name: coded.name(),
                        constraint: db.constraint().map(str::to_owned),
                        table: db.table().map(str::to_owned),
                        message: db.message().to_owned(),
                    })
                }
                _ => None,
            }
        }
    };
}
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
use sqlx_binding;

#[cfg(feature = "sqlx")]
mod sqlx;
#[cfg(feature = "sqlx-0_8")]
mod sqlx08;

pub use self::chain::{classify_error_chain, tag_retryable};
pub use self::driver::{DriverError, DriverErrors, classify, is_constraint_violation};
#[cfg(feature = "libsql")]
#[allow(deprecated)]
pub use self::libsql::{LibsqlErrors, classify_libsql, is_constraint_violation_libsql};
pub use self::mysql::{classify_mysql_code, mysql_code_name};
pub use self::postgres::{classify_postgres_code, postgres_code_name};
#[cfg(feature = "rusqlite")]
#[allow(deprecated)]
pub use self::rusqlite::{RusqliteErrors, classify_rusqlite, is_constraint_violation_rusqlite};
pub use self::sqlite::{classify_sqlite_code, sqlite_code_name};
#[cfg(feature = "sqlx-0_8")]
#[allow(deprecated)]
pub use self::sqlx08::{classify_sqlx_0_8, is_constraint_violation_sqlx_0_8};

#[cfg(feature = "libsql")]
pub(crate) use self::libsql::constraint as libsql_constraint;
#[cfg(feature = "rusqlite")]
pub(crate) use self::rusqlite::constraint as rusqlite_constraint;
#[cfg(feature = "sqlx")]
pub(crate) use self::sqlx::constraint as sqlx_constraint;
#[cfg(feature = "sqlx-0_8")]
pub(crate) use self::sqlx08::constraint as sqlx08_constraint;

/// The response extension that asks the layer to replay the request, and says why.
///
/// [`DbError`](crate::DbError) inserts it for retryable database errors. A handler with its
/// own error type inserts it with [`tag_retryable`], which finds the database error anywhere in
/// the error's `source()` chain (see [`classify_error_chain`]), or inserts the marker that its
/// driver's classifier returns (`classify` for sqlx 0.9, `classify_sqlx_0_8`,
/// `classify_rusqlite`, `classify_libsql`, or a code table such as [`classify_sqlite_code`]
/// for any other binding):
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

/// Whether a sqlx database error is sqlx's `SqliteError` (0.8 or 0.9). The type cannot be named
/// here without depending on sqlx's SQLite driver, and with it on a `libsqlite3-sys` (see the
/// module's documentation), so it is recognised by the name its derived `Debug` prints first
/// (`SqliteError { code: 5, message: ... }`); only that prefix is formatted. The tests pin it on
/// real errors of both sqlx versions, so a sqlx release that changes it fails them.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
fn is_sqlx_sqlite_error(error: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    /// Compares what is written with `rest`, and stops the formatting as soon as it can tell.
    struct Prefix<'a> {
        rest: &'a [u8],
        matched: bool,
    }
    impl fmt::Write for Prefix<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let n = s.len().min(self.rest.len());
            if s.as_bytes()[..n] != self.rest[..n] {
                return Err(fmt::Error);
            }
            self.rest = &self.rest[n..];
            if self.rest.is_empty() {
                self.matched = true;
                return Err(fmt::Error);
            }
            Ok(())
        }
    }
    let mut prefix = Prefix {
        rest: b"SqliteError {",
        matched: false,
    };
    let _ = fmt::write(&mut prefix, format_args!("{error:?}"));
    prefix.matched
}

/// The marker for a pool that had no connection to give within its acquire timeout: the same
/// for every pool.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
fn pool_timed_out() -> Retryable {
    Retryable::new("pool_timed_out", "POOL_TIMED_OUT")
}

/// A database error as the tables see it, whatever the binding that produced it: which
/// database, its code, and the message (only ever compared for SQLite's
/// `database is deadlocked`).
#[cfg(any(
    feature = "sqlx",
    feature = "sqlx-0_8",
    feature = "rusqlite",
    feature = "libsql"
))]
pub(crate) struct Coded<'a> {
    pub(crate) backend: Backend<'a>,
    pub(crate) message: &'a str,
}

/// Which database an error came from, and its code in that database's terms.
#[cfg(any(
    feature = "sqlx",
    feature = "sqlx-0_8",
    feature = "rusqlite",
    feature = "libsql"
))]
// Which variants a build constructs depends on its features (`Postgres` needs `postgres` and a
// sqlx binding, for instance).
#[allow(dead_code)]
pub(crate) enum Backend<'a> {
    /// SQLite's extended result code.
    Sqlite(i32),
    /// PostgreSQL's SQLSTATE.
    Postgres(&'a str),
    /// MySQL's or MariaDB's server error number, and the SQLSTATE the server sent with it
    /// (which tells MariaDB's `4025` from MySQL's).
    MySql {
        number: u16,
        sqlstate: Option<&'a str>,
    },
    /// A database whose table is not compiled in (its feature is off), with the code the
    /// driver gave, if any: never retryable.
    Unknown(Option<Cow<'a, str>>),
}

#[cfg(any(
    feature = "sqlx",
    feature = "sqlx-0_8",
    feature = "rusqlite",
    feature = "libsql"
))]
impl Coded<'_> {
    /// The marker, if the error is worth a replay.
    pub(crate) fn classify(&self) -> Option<Retryable> {
        match &self.backend {
            Backend::Sqlite(code) => classify_sqlite_in_request(*code, self.message),
            Backend::Postgres(sqlstate) => classify_postgres_code(sqlstate),
            Backend::MySql { number, .. } => classify_mysql_code(*number),
            Backend::Unknown(_) => None,
        }
    }

    /// What kind of constraint violation the code is, if one, by the database's table.
    pub(crate) fn constraint(&self) -> Option<Constraint> {
        match &self.backend {
            Backend::Sqlite(code) => sqlite::sqlite_constraint(*code),
            Backend::Postgres(sqlstate) => postgres::postgres_constraint(sqlstate),
            Backend::MySql { number, sqlstate } => mysql::mysql_constraint(*number, *sqlstate),
            Backend::Unknown(_) => None,
        }
    }

    /// The code's symbolic name (`SQLITE_CONSTRAINT_UNIQUE`, `unique_violation`,
    /// `ER_DUP_ENTRY`), or `""` for a database whose table is not compiled in.
    pub(crate) fn name(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(code) => sqlite_code_name(*code),
            Backend::Postgres(sqlstate) => postgres_code_name(sqlstate),
            Backend::MySql { number, .. } => mysql_code_name(*number),
            Backend::Unknown(_) => "",
        }
    }

    /// What [`DbError`](crate::DbError)'s tracing events say of the error, for the bindings
    /// whose driver names no constraint (SQLite's).
    #[cfg_attr(not(any(feature = "rusqlite", feature = "libsql")), allow(dead_code))]
    pub(crate) fn detail(&self) -> Detail {
        Detail {
            code: self.code(),
            name: self.name(),
            constraint: None,
            table: None,
            message: self.message.to_owned(),
        }
    }

    /// The code that the tracing schema reports (`db.response.status_code`): SQLite's extended
    /// result code, PostgreSQL's SQLSTATE, MySQL's error number, or what the driver gave.
    pub(crate) fn code(&self) -> String {
        match &self.backend {
            Backend::Sqlite(code) => code.to_string(),
            Backend::Postgres(sqlstate) => (*sqlstate).to_owned(),
            Backend::MySql { number, .. } => number.to_string(),
            Backend::Unknown(code) => code.as_deref().unwrap_or_default().to_owned(),
        }
    }
}

/// SQLite's table, and one fact only the request knows: a `SQLITE_BUSY` met while the request
/// holds a write transaction open (the turn of a `WriteTransaction` or a `WriteTurn`) is the request's own lock, met by a write outside that transaction (through the
/// pool, say). A replay would meet it again, after `busy_timeout` again: not retryable, and
/// said at ERROR, since only the code can fix it.
#[cfg(any(
    feature = "sqlx",
    feature = "sqlx-0_8",
    feature = "rusqlite",
    feature = "libsql"
))]
pub(crate) fn classify_sqlite_in_request(code: i32, message: &str) -> Option<Retryable> {
    let verdict = classify_sqlite_code(code, message);
    if verdict.is_some() && code & 0xff == 5 && crate::attempt::current_request_holds_a_turn() {
        tracing::event!(
            target: "tower_sqlite_retry",
            tracing::Level::ERROR,
            db.response.status_code = code,
            db.response.status_name = sqlite_code_name(code),
            "SQLITE_BUSY while this request holds a write transaction open: a write outside \
             the transaction (through the pool) waited for the transaction's own lock; run it \
             on the transaction (`&mut *tx`). Not replayed: a replay would wait again"
        );
        return None;
    }
    verdict
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

/// What [`DbError`](crate::DbError)'s tracing events say of the error it holds; `None` when
/// the error is no driver's database error.
pub(crate) fn database_detail(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<Detail> {
    #[cfg(feature = "sqlx")]
    if let Some(detail) = self::sqlx::database_detail(error) {
        return Some(detail);
    }
    #[cfg(feature = "sqlx-0_8")]
    if let Some(detail) = self::sqlx08::database_detail(error) {
        return Some(detail);
    }
    #[cfg(feature = "rusqlite")]
    if let Some(detail) = self::rusqlite::database_detail(error) {
        return Some(detail);
    }
    #[cfg(feature = "libsql")]
    if let Some(detail) = self::libsql::database_detail(error) {
        return Some(detail);
    }
    let _ = error;
    None
}

/// Decides whether a tower service's `Err` is worth a replay. Used by
/// [`SqliteRetryLayer::classify_errors`](crate::SqliteRetryLayer::classify_errors) for plain
/// tower services whose `Error` is not `Infallible`; axum handlers use the response marker
/// instead.
///
/// Implemented for closures `Fn(&E) -> Option<Retryable>`, and by [`NeverRetryErrors`]
/// (the default), `SqlxErrors` (features `sqlx`, `sqlx-0_8`), `RusqliteErrors` (feature
/// `rusqlite`) and `LibsqlErrors` (feature `libsql`).
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

/// An error classifier for services whose error is, or boxes, a sqlx error (0.9 or 0.8):
/// deprecated, use [`DriverErrors`], one classifier for every driver (it also finds the
/// driver's error anywhere in a boxed error's `source()` chain).
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlx", feature = "sqlx-0_8"))))]
#[derive(Clone, Copy, Debug, Default)]
#[deprecated(
    since = "0.1.0",
    note = "use `classify::DriverErrors`: one classifier for every driver"
)]
pub struct SqlxErrors;

#[cfg(feature = "sqlx")]
#[allow(deprecated)]
impl ClassifyError<::sqlx::Error> for SqlxErrors {
    fn classify_error(&self, error: &::sqlx::Error) -> Option<Retryable> {
        error.retryable()
    }
}

#[cfg(feature = "sqlx-0_8")]
#[allow(deprecated)]
impl ClassifyError<sqlx_0_8::Error> for SqlxErrors {
    fn classify_error(&self, error: &sqlx_0_8::Error) -> Option<Retryable> {
        error.retryable()
    }
}

#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
#[allow(deprecated)]
impl ClassifyError<tower::BoxError> for SqlxErrors {
    fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
        #[cfg(feature = "sqlx")]
        if let Some(error) = error.downcast_ref::<::sqlx::Error>() {
            return error.retryable();
        }
        #[cfg(feature = "sqlx-0_8")]
        if let Some(error) = error.downcast_ref::<sqlx_0_8::Error>() {
            return error.retryable();
        }
        None
    }
}
