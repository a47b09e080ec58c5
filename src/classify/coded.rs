//! A database error as the tables see it, whatever the binding that produced it ([`Coded`]),
//! and the one fact of SQLite's table only the request knows
//! ([`classify_sqlite_in_request`]).

use std::borrow::Cow;
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
use std::fmt;

use super::marker::{Constraint, Detail, Retryable};
use super::mysql::{classify_mysql_code, mysql_code_name};
use super::postgres::{classify_postgres_code, postgres_code_name};
use super::sqlite::{classify_sqlite_code, sqlite_code_name};
use super::{mysql, postgres, sqlite};

/// Whether a sqlx database error is sqlx's `SqliteError` (0.8 or 0.9). The type cannot be named
/// here without depending on sqlx's SQLite driver, and with it on a `libsqlite3-sys` (see the
/// module's documentation), so it is recognised by the name its derived `Debug` prints first
/// (`SqliteError { code: 5, message: ... }`); only that prefix is formatted. The tests pin it on
/// real errors of both sqlx versions, so a sqlx release that changes it fails them.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
pub(super) fn is_sqlx_sqlite_error(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> bool {
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

/// A database error as the tables see it, whatever the binding that produced it: which
/// database, its code, and the message (only ever compared for SQLite's
/// `database is deadlocked`).
#[cfg(driver)]
pub(crate) struct Coded<'a> {
    pub(crate) backend: Backend<'a>,
    pub(crate) message: &'a str,
}

/// Which database an error came from, and its code in that database's terms.
#[cfg(driver)]
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

#[cfg(driver)]
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
#[cfg(driver)]
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
