//! What is retryable, and what each database error answers: the [`Retryable`] marker, the
//! classifiers, and one table per database.
//!
//! Every binding (sqlx 0.9, sqlx 0.8, rusqlite, libsql) hands its driver's code to the same
//! tables, so that one code gets one answer whatever the driver. Diesel keeps no code: its
//! binding reads Diesel's error kinds, and `SQLITE_BUSY` by the one text SQLite gives it
//! (`database is locked`; see `docs/stacks.md`). Decisions are taken on codes:
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

// Layout: this file holds the marker, the error classifiers (`NeverRetryErrors`, `RetryDriverErrors`)
// and the dispatch: every binding turns its driver's error into a `Coded` (which database,
// which code, the message) and the tables decide on that. The tables need no driver:
// `sqlite` (shared by every SQLite binding), `postgres`, `mysql`. The bindings, each behind
// its feature: `sqlx` (0.9), `sqlx08` (0.8), `rusqlite`, `libsql`; `diesel` (no code: Diesel's
// kinds, and SQLite's busy text); `chain` walks an error's `source()` chain through all of them.

mod chain;
#[cfg(driver)]
mod coded;
pub(crate) mod db_error;
#[cfg(feature = "diesel")]
pub(crate) mod diesel;
mod driver;
#[cfg(feature = "libsql")]
mod libsql;
mod marker;
mod mysql;
mod postgres;
#[cfg(feature = "rusqlite")]
mod rusqlite;
mod sqlite;
#[cfg(any(feature = "rusqlite", feature = "libsql"))]
mod sqlite_binding;
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
mod sqlx_binding;

#[cfg(feature = "sqlx")]
mod sqlx;
#[cfg(feature = "sqlx-0_8")]
mod sqlx08;

pub use self::chain::{RetryDriverErrors, RetryErrorChain, classify_error_chain, tag_retryable};
pub use self::driver::DriverError;
pub use self::marker::{ClassifyError, NeverRetryErrors, Retryable};
#[cfg_attr(
    not(driver),
    allow(
        unused_imports,
        reason = "DbError reads a violation's kind only with a driver"
    )
)]
pub(crate) use self::marker::{Constraint, Detail};
pub use self::mysql::{classify_mysql_code, mysql_code_name};
pub use self::postgres::{classify_postgres_code, postgres_code_name};
pub use self::sqlite::{classify_sqlite_code, sqlite_code_name};

#[cfg(feature = "diesel")]
pub(crate) use self::diesel::constraint as diesel_constraint;
#[cfg(feature = "libsql")]
pub(crate) use self::libsql::constraint as libsql_constraint;
#[cfg(feature = "rusqlite")]
pub(crate) use self::rusqlite::constraint as rusqlite_constraint;
#[cfg(feature = "sqlx")]
pub(crate) use self::sqlx::constraint as sqlx_constraint;
#[cfg(feature = "sqlx-0_8")]
pub(crate) use self::sqlx08::constraint as sqlx08_constraint;

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
    #[cfg(feature = "diesel")]
    if let Some(detail) = self::diesel::database_detail(error) {
        return Some(detail);
    }
    let _ = error;
    None
}

/// How the verdict on the error [`DbError`](crate::DbError) holds was reached, when not by a
/// database code: `Some("message")` for Diesel's `SQLITE_BUSY`, known by SQLite's fixed text
/// (Diesel keeps no code); `None` for every other error.
pub(crate) fn classified_by(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'static str> {
    #[cfg(feature = "diesel")]
    if let Some(by) = self::diesel::classified_by(error) {
        return Some(by);
    }
    let _ = error;
    None
}

/// Whether `error` (of a type the asker cannot name) is a [`DbError`](crate::DbError) tagged
/// retryable for SQLite's `SQLITE_BUSY` (any of its extended codes): what the writer thread
/// asks of a closure's error, beside its driver's own type.
#[cfg_attr(
    not(any(feature = "rusqlite-write", feature = "diesel-write")),
    allow(dead_code, reason = "the writer thread asks it")
)]
pub(crate) fn is_sqlite_busy(error: &dyn std::any::Any) -> bool {
    error
        .downcast_ref::<crate::DbError>()
        .and_then(crate::DbError::retryable)
        .is_some_and(|marker| marker.name().starts_with("SQLITE_BUSY"))
}
