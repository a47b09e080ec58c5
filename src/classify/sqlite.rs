//! SQLite's table: which extended result codes are contention, shared by every SQLite binding
//! (sqlx 0.9, sqlx 0.8, rusqlite).
//!
//! SQLite reports an *extended* result code: the primary code in the low byte (`5`
//! `SQLITE_BUSY`) and the detail above it (`517` = `5 | 2 << 8`, `SQLITE_BUSY_SNAPSHOT`). The
//! table decides on the primary code, except for `SQLITE_LOCKED`, where only some extended codes
//! are contention:
//!
//! - `SQLITE_BUSY` and its extended codes: another connection holds the lock, or the
//!   transaction's WAL snapshot is stale (`517`). `busy_timeout` does not help inside a
//!   transaction; only a rollback and a re-run of the whole transaction does, which is what a
//!   replay of the request is. Except when the connection itself is the cause: SQLite answers
//!   plain `SQLITE_BUSY` (`5`) with a fixed message of its own when a `COMMIT`, a `SAVEPOINT`
//!   or a `RELEASE` meets a write statement still in progress *on the same connection* (an
//!   `INSERT ... RETURNING` whose rows are not all read), and when a function or collation is
//!   replaced while statements run (listed below). A replay runs the same code
//!   and meets it again, so these are not retried. sqlx never lets two statements run at once
//!   on one connection, so its users cannot meet them; rusqlite and libsql users can.
//! - `SQLITE_LOCKED_SHAREDCACHE` (`262`): another connection of the same shared cache holds a
//!   table lock; it goes away when that connection's transaction ends.
//! - plain `SQLITE_LOCKED` (`6`) only as the victim of an unlock-notify deadlock, whose message
//!   SQLite itself sets to `database is deadlocked`. Otherwise `6` is a lock held by *the same*
//!   connection (a statement still reading the table being dropped): a replay meets it again.
//! - `SQLITE_PROTOCOL` (`15`): a WAL lock race that SQLite gave up on after its own retries.
//!
//! Everything else (constraints, I/O, `FULL`, `CORRUPT`, `READONLY`, ...) a replay would only
//! repeat. Any primary code `19` (`SQLITE_CONSTRAINT_*`) is a constraint violation, answered by
//! [`DbError`](crate::DbError) per kind: `409` for UNIQUE, PRIMARY KEY, ROWID, FOREIGN KEY
//! (and the kinds the code does not tell), `422` for NOT NULL and CHECK, `500` for DATATYPE and
//! PINNED.
//!
//! # Recognising a SQLite error without the SQLite driver
//!
//! This crate never depends on a SQLite driver for sqlx (that would put a `libsqlite3-sys`,
//! and with it a second SQLite, into the application's graph), so it cannot downcast a sqlx
//! error to `SqliteError`. It recognises one by two things instead: the type's name, which its
//! derived `Debug` prints first (`SqliteError { code: 5, ... }`, in sqlx 0.8 and 0.9: pinned by
//! the tests on real errors), so that a third-party or custom `DatabaseError` with numeric
//! codes is never read as SQLite's (its `1285` is not `SQLITE_BUSY`, nor a code whose low byte
//! is 19 a constraint); and its code ([`sqlx_sqlite_code`]):
//!
//! - sqlx's SQLite driver (0.8 and 0.9) gives the extended result code in decimal;
//! - every SQLite result code is below 10,000, so it has one to four digits: the largest,
//!   `SQLITE_IOERR_CODEC`, is `10 | 36 << 8` = 9226 in SQLite 3.51 and 3.54 (libsqlite3-sys
//!   0.37 and 0.40); a five-digit code would need `SQLITE_IOERR` to grow four more extended
//!   codes, and `SQLITE_BUSY` (3 today) or `SQLITE_CONSTRAINT` (12) to grow to 40;
//! - the other databases' codes are SQLSTATEs, exactly five characters (`40001`, `HY000`);
//! - and PostgreSQL and MySQL errors are recognised by downcast before this rule is consulted
//!   whenever their features are on.
//!
//! A five-digit code is never read as SQLite's: PostgreSQL's `22021` would otherwise pass for
//! `SQLITE_BUSY` (`22021 & 0xff` is `5`).

use std::borrow::Cow;

use super::marker::{Constraint, Retryable};

/// The messages with which SQLite reports a `SQLITE_BUSY` (`5`) caused by the connection
/// itself, not by another connection (SQLite's `vdbe.c`, `OP_AutoCommit` and `OP_Savepoint`,
/// and `main.c`, 3.51): a replay meets them again. "cannot rollback transaction" is the
/// wording of SQLite before 3.7.11 (a `ROLLBACK` with statements pending), which rusqlite's
/// oldest versions bundle.
pub(crate) const SAME_CONNECTION_BUSY: [&str; 7] = [
    "cannot commit transaction - SQL statements in progress",
    "cannot open savepoint - SQL statements in progress",
    "cannot release savepoint - SQL statements in progress",
    "cannot rollback transaction - SQL statements in progress",
    "unable to close due to unfinalized statements or unfinished backups",
    "unable to delete/modify user-function due to active statements",
    "unable to delete/modify collation sequence due to active statements",
];

/// Classifies a SQLite extended result code (and, for `SQLITE_LOCKED`, its message).
///
/// For users who hold a raw code rather than a driver's error:
///
/// ```
/// use tower_sqlite_retry::classify::classify_sqlite_code;
///
/// assert_eq!(classify_sqlite_code(517, "").unwrap().name(), "SQLITE_BUSY_SNAPSHOT");
/// assert!(classify_sqlite_code(6, "database is deadlocked").is_some());
/// assert!(classify_sqlite_code(6, "database table is locked").is_none());
/// assert!(classify_sqlite_code(2067, "UNIQUE constraint failed").is_none());
/// // The connection's own statement in progress: a replay meets it again.
/// assert!(classify_sqlite_code(5, "cannot commit transaction - SQL statements in progress").is_none());
/// ```
///
/// | condition | retry |
/// |---|---|
/// | primary 5: `SQLITE_BUSY` 5, `_RECOVERY` 261, `_SNAPSHOT` 517, `_TIMEOUT` 773 | yes |
/// | `SQLITE_BUSY` 5 with one of SQLite's same-connection messages (`cannot commit transaction - SQL statements in progress`, `cannot release savepoint - ...`, `cannot open savepoint - ...`, ...) | no |
/// | `SQLITE_LOCKED_SHAREDCACHE` 262 | yes |
/// | `SQLITE_LOCKED` 6 with message `database is deadlocked` (unlock-notify deadlock victim) | yes |
/// | `SQLITE_PROTOCOL` 15 | yes |
/// | `SQLITE_LOCKED` 6 otherwise, `SQLITE_LOCKED_VTAB` 518 | no |
/// | everything else (constraints, I/O, `FULL`, `CORRUPT`, `READONLY`, ...) | no |
pub fn classify_sqlite_code(code: i32, message: &str) -> Option<Retryable> {
    let retry = match code & 0xff {
        // Plain SQLITE_BUSY with a message SQLite itself sets when the connection's own
        // statements are the cause.
        5 if code == 5 => !SAME_CONNECTION_BUSY.contains(&message),
        5 | 15 => true,
        // SQLITE_LOCKED_SHAREDCACHE: another connection of the shared cache holds the lock.
        6 if code == 262 => true,
        // An unlock-notify deadlock victim is plain SQLITE_LOCKED with this message (set by
        // sqlite3_unlock_notify); the only text this crate ever looks at.
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

/// What kind of constraint violation a SQLite extended result code is (primary code 19,
/// `SQLITE_CONSTRAINT_*`), if one.
#[cfg_attr(not(driver), allow(dead_code))]
pub(crate) fn sqlite_constraint(code: i32) -> Option<Constraint> {
    if code & 0xff != 19 {
        return None;
    }
    Some(match code {
        // SQLITE_CONSTRAINT_CHECK, SQLITE_CONSTRAINT_NOTNULL.
        275 | 1299 => Constraint::Invalid,
        // SQLITE_CONSTRAINT_PINNED (an UPDATE trigger deleted the row being updated),
        // SQLITE_CONSTRAINT_DATATYPE (a STRICT table refused the type of a bound value).
        2835 | 3091 => Constraint::Internal,
        // UNIQUE 2067, PRIMARYKEY 1555, ROWID 2579, FOREIGNKEY 787; and the kinds the code does
        // not tell (plain 19, TRIGGER 1811's RAISE(), COMMITHOOK 531, FUNCTION 1043, VTAB 2323:
        // rules of the application's own, as before).
        _ => Constraint::Conflict,
    })
}

/// The extended result code of a sqlx error's `code()`, if it is SQLite's: one to four ASCII
/// digits (see the module's documentation for why that is sound).
#[cfg_attr(not(any(feature = "sqlx", feature = "sqlx-0_8")), allow(dead_code))]
pub(crate) fn sqlx_sqlite_code(code: &str) -> Option<i32> {
    if code.is_empty() || code.len() > 4 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    code.parse().ok().filter(|&c| c > 0)
}

/// The symbolic name of a SQLite result code (`517` → `"SQLITE_BUSY_SNAPSHOT"`), or of its
/// primary code when the extended one is not known here.
///
/// ```
/// # use tower_sqlite_retry::classify::sqlite_code_name;
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
        2835 => "SQLITE_CONSTRAINT_PINNED",
        3091 => "SQLITE_CONSTRAINT_DATATYPE",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        for code in [5, 261, 517, 773, 262, 15] {
            assert!(classify_sqlite_code(code, "").is_some(), "{code}");
        }
        assert!(classify_sqlite_code(6, "database is deadlocked").is_some());
        for code in [
            6, 518, 19, 2067, 787, 1299, 275, 1555, 13, 11, 267, 26, 8, 264, 10, 266, 7, 9, 17, 1,
        ] {
            assert!(classify_sqlite_code(code, "").is_none(), "{code}");
        }
        for message in SAME_CONNECTION_BUSY {
            assert!(classify_sqlite_code(5, message).is_none(), "{message}");
            // Only plain SQLITE_BUSY carries them; an extended code is contention.
            assert!(classify_sqlite_code(517, message).is_some(), "{message}");
        }
        assert!(classify_sqlite_code(5, "database is locked").is_some());
        // The deadlock message only counts for plain SQLITE_LOCKED.
        assert!(classify_sqlite_code(518, "database is deadlocked").is_none());
        assert_eq!(
            classify_sqlite_code(773, "").unwrap().name(),
            "SQLITE_BUSY_TIMEOUT"
        );
        assert_eq!(classify_sqlite_code(517, "").unwrap().code(), "517");
    }

    #[test]
    fn constraints() {
        use Constraint::*;
        for (code, kind) in [
            (19, Conflict),
            (275, Invalid),
            (531, Conflict),
            (787, Conflict),
            (1043, Conflict),
            (1299, Invalid),
            (1555, Conflict),
            (1811, Conflict),
            (2067, Conflict),
            (2323, Conflict),
            (2579, Conflict),
            (2835, Internal),
            (3091, Internal),
        ] {
            assert_eq!(sqlite_constraint(code), Some(kind), "{code}");
        }
        for code in [5, 6, 517, 1, 11, 13] {
            assert_eq!(sqlite_constraint(code), None, "{code}");
        }
    }

    #[test]
    fn recognised_by_one_to_four_digits() {
        for (text, code) in [("5", 5), ("517", 517), ("2067", 2067), ("9226", 9226)] {
            assert_eq!(sqlx_sqlite_code(text), Some(code), "{text}");
        }
        // SQLSTATEs (five characters, digits or not), empty, signs, zero, junk: not SQLite's.
        for text in [
            "22021", "40001", "23505", "40P01", "HY000", "00000", "", "0", "-5", "+5", " 5", "5 ",
            "0x5", "５",
        ] {
            assert_eq!(sqlx_sqlite_code(text), None, "{text:?}");
        }
    }
}
