//! MySQL's and MariaDB's table: which server error numbers are contention.
//!
//! - `1213` ER_LOCK_DEADLOCK: InnoDB chose this transaction as a deadlock victim and rolled the
//!   whole of it back.
//! - `1205` ER_LOCK_WAIT_TIMEOUT: a row lock was not granted within `innodb_lock_wait_timeout`
//!   (50 s by default).
//! - `1020` ER_CHECKREAD ("Record has changed since last read"): MariaDB's serialization
//!   failure. With `innodb_snapshot_isolation` on (the default from MariaDB 11.6.2, so in 11.8
//!   LTS; earlier series such as 10.11 have the variable, off by default), a `REPEATABLE READ` transaction
//!   that locks or changes a row another transaction changed after its read view was taken
//!   fails with `1020`, and InnoDB rolls the whole transaction back (MDEV-35235 made the SQL
//!   layer report it as rolled back, as for a deadlock). A run of the whole transaction on a
//!   fresh snapshot is the cure, which is what a replay is.
//! - `3101` ER_TRANSACTION_ROLLBACK_DURING_COMMIT: MySQL Group Replication's certification
//!   failure. At commit the group orders conflicting transactions; the one ordered second
//!   "aborts, and thus is rolled back on the originating server": the whole transaction, at
//!   `COMMIT`, nothing of it applied anywhere. MariaDB has no error `3101` (its own numbers
//!   jump from the 19xx to 4000); Galera reports its certification failures as `1213`.
//!
//! Sources (the vendors' manuals):
//! - MariaDB, `innodb_snapshot_isolation`:
//!   <https://mariadb.com/docs/server/server-usage/storage-engines/innodb/innodb-system-variables#innodb_snapshot_isolation>;
//!   error 1020:
//!   <https://mariadb.com/docs/server/reference/error-codes/mariadb-error-codes-1000-to-1099/e1020>;
//!   MDEV-35235 (the rollback is signalled as for a deadlock):
//!   <https://jira.mariadb.org/browse/MDEV-35235>.
//! - MySQL Group Replication, conflict resolution at commit:
//!   <https://dev.mysql.com/doc/refman/8.4/en/group-replication-summary.html>; error 3101:
//!   <https://dev.mysql.com/doc/mysql-errors/8.4/en/server-error-reference.html#error_er_transaction_rollback_during_commit>.
//! - InnoDB deadlocks (1213) and `innodb_rollback_on_timeout` (1205):
//!   <https://dev.mysql.com/doc/refman/8.4/en/innodb-deadlocks.html>,
//!   <https://dev.mysql.com/doc/refman/8.4/en/innodb-error-handling.html>.
//!
//! The error *number* decides, not the SQLSTATE: MySQL's SQLSTATE is too coarse (`40001` for a
//! deadlock, `HY000` for a lock wait timeout and for hundreds of unrelated errors). sqlx's
//! `DatabaseError::code()` gives the SQLSTATE; the number needs `MySqlDatabaseError::number()`,
//! which is why the `mysql` feature turns on sqlx's pure-Rust MySQL driver (no C library).
//!
//! # Why `1205` is retried although `55P03` is not
//!
//! They look alike, but MySQL's lock wait timeout is on by default (50 s): it is contention that
//! lasted too long, not a request to fail fast. `3572` ER_LOCK_NOWAIT (`NOWAIT`) is the one
//! that asked not to wait, and is not retried, as PostgreSQL's `55P03`. Note that InnoDB rolls
//! back only the *statement* on `1205` (unless `innodb_rollback_on_timeout` is on): the replay
//! is safe because the handler's `?` drops the transaction, which rolls the rest back. A handler
//! that catches `1205` and commits anyway must not ask for a replay.

use super::marker::{Constraint, Retryable};

/// Classifies a MySQL/MariaDB error number: `1213` ER_LOCK_DEADLOCK, `1205`
/// ER_LOCK_WAIT_TIMEOUT, `1020` ER_CHECKREAD (MariaDB's snapshot isolation) and `3101`
/// ER_TRANSACTION_ROLLBACK_DURING_COMMIT (Group Replication) are retryable, nothing else.
///
/// For users who hold a raw error number rather than a `sqlx::Error` (from `mysql_async`,
/// say). The marker's [`code`](Retryable::code) is the number in decimal, its
/// [`name`](Retryable::name) the server's symbol. Available whatever the features.
///
/// | error number | retry |
/// |---|---|
/// | `1213` ER_LOCK_DEADLOCK (InnoDB rolled the whole transaction back) | yes |
/// | `1205` ER_LOCK_WAIT_TIMEOUT (`innodb_lock_wait_timeout`, 50 s by default) | yes |
/// | `1020` ER_CHECKREAD (MariaDB `innodb_snapshot_isolation`: the row changed since the snapshot; the transaction is rolled back) | yes |
/// | `3101` ER_TRANSACTION_ROLLBACK_DURING_COMMIT (Group Replication certification failure; the transaction is rolled back) | yes |
/// | `3572` ER_LOCK_NOWAIT (`NOWAIT`) | no, as PostgreSQL's `55P03` |
/// | everything else (`1062` ER_DUP_ENTRY and other constraints, `1180` ER_ERROR_DURING_COMMIT, ...) | no |
///
/// `1205` is retried because MySQL's lock wait timeout is on by default: it is contention that
/// lasted too long, not a request to fail fast. InnoDB rolls back only the *statement* on
/// `1205` (unless `innodb_rollback_on_timeout` is on): the replay is safe because the handler's
/// `?` drops the transaction, which rolls the rest back. A handler that catches `1205` and
/// commits anyway must not ask for a replay.
///
/// ```
/// use tower_sqlite_retry::classify::classify_mysql_code;
///
/// let marker = classify_mysql_code(1213).unwrap();
/// assert_eq!((marker.code(), marker.name()), ("1213", "ER_LOCK_DEADLOCK"));
/// assert_eq!(classify_mysql_code(1205).unwrap().name(), "ER_LOCK_WAIT_TIMEOUT");
/// assert_eq!(classify_mysql_code(1020).unwrap().name(), "ER_CHECKREAD");
/// assert!(classify_mysql_code(1062).is_none()); // ER_DUP_ENTRY
/// assert!(classify_mysql_code(3572).is_none()); // ER_LOCK_NOWAIT
/// ```
pub fn classify_mysql_code(number: u16) -> Option<Retryable> {
    let code = match number {
        1213 => "1213",
        1205 => "1205",
        1020 => "1020",
        3101 => "3101",
        _ => return None,
    };
    Some(Retryable::new(code, mysql_code_name(number)))
}

/// What kind of constraint violation a MySQL/MariaDB error number is, if one (`sqlstate`, the
/// SQLSTATE the server sent, tells MariaDB's `4025` CHECK from MySQL's unrelated `4025`).
///
/// Duplicate keys (`1062`, `1022`, `1169`, `1586`, `1859`) and foreign keys (`1451`, `1452`,
/// `1216`, `1217`, `1834`) conflict with other rows (409); NOT NULL (`1048`, and `1364`, a
/// NOT NULL column without default left out) and CHECK (MySQL `3819`, MariaDB `4025`) refuse
/// the request's own content (422). Type and range errors in strict mode (`1366`, `1264`,
/// `1406`) are no constraint: `500`.
#[cfg_attr(not(any(feature = "sqlx", feature = "sqlx-0_8")), allow(dead_code))]
pub(crate) fn mysql_constraint(number: u16, sqlstate: Option<&str>) -> Option<Constraint> {
    match number {
        1062 | 1022 | 1169 | 1586 | 1859 | 1451 | 1452 | 1216 | 1217 | 1834 => {
            Some(Constraint::Conflict)
        }
        1048 | 1364 | 3819 => Some(Constraint::Invalid),
        4025 if sqlstate == Some("23000") => Some(Constraint::Invalid),
        _ => None,
    }
}

/// The symbol of a MySQL/MariaDB server error number (`1213` → `"ER_LOCK_DEADLOCK"`), or
/// `"UNKNOWN"` when it is not known here.
///
/// ```
/// # use tower_sqlite_retry::classify::mysql_code_name;
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
        3101 => "ER_TRANSACTION_ROLLBACK_DURING_COMMIT",
        1180 => "ER_ERROR_DURING_COMMIT",
        1206 => "ER_LOCK_TABLE_FULL",
        1022 => "ER_DUP_KEY",
        1062 => "ER_DUP_ENTRY",
        1169 => "ER_DUP_UNIQUE",
        1586 => "ER_DUP_ENTRY_WITH_KEY_NAME",
        1859 => "ER_DUP_UNKNOWN_IN_INDEX",
        1216 => "ER_NO_REFERENCED_ROW",
        1217 => "ER_ROW_IS_REFERENCED",
        1834 => "ER_FK_CANNOT_DELETE_PARENT",
        1366 => "ER_TRUNCATED_WRONG_VALUE_FOR_FIELD",
        1264 => "ER_WARN_DATA_OUT_OF_RANGE",
        1406 => "ER_DATA_TOO_LONG",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        for (number, code, name) in [
            (1213, "1213", "ER_LOCK_DEADLOCK"),
            (1205, "1205", "ER_LOCK_WAIT_TIMEOUT"),
            (1020, "1020", "ER_CHECKREAD"),
            (3101, "3101", "ER_TRANSACTION_ROLLBACK_DURING_COMMIT"),
        ] {
            let r = classify_mysql_code(number).unwrap_or_else(|| panic!("{number}"));
            assert_eq!((r.code(), r.name()), (code, name));
            assert_eq!(mysql_code_name(number), name);
        }
        for number in [
            3572, 1180, 1206, 1062, 1022, 1169, 1586, 1859, 1216, 1217, 1451, 1452, 1048, 1364,
            3819, 4025, 1040, 1064, 1146, 1317, 1969, 3024, 1105, 0, 40001, 65535,
        ] {
            assert!(classify_mysql_code(number).is_none(), "{number}");
        }
        assert_eq!(mysql_code_name(3572), "ER_LOCK_NOWAIT");
        assert_eq!(mysql_code_name(0), "UNKNOWN");
    }

    #[test]
    fn constraints() {
        use Constraint::*;
        for (number, kind) in [
            (1062, Conflict),
            (1022, Conflict),
            (1169, Conflict),
            (1586, Conflict),
            (1859, Conflict),
            (1451, Conflict),
            (1452, Conflict),
            (1216, Conflict),
            (1217, Conflict),
            (1834, Conflict),
            (1048, Invalid),
            (1364, Invalid),
            (3819, Invalid),
        ] {
            assert_eq!(
                mysql_constraint(number, Some("23000")),
                Some(kind),
                "{number}"
            );
        }
        assert_eq!(mysql_constraint(4025, Some("23000")), Some(Invalid));
        assert_eq!(mysql_constraint(4025, Some("HY000")), None);
        for number in [1213, 1205, 1020, 1052, 1366, 1264, 1406, 1830, 0] {
            assert_eq!(mysql_constraint(number, Some("23000")), None, "{number}");
        }
    }

    #[test]
    fn names_of_retryable_codes_are_the_markers_names() {
        for number in [1213, 1205, 1020, 3101] {
            assert_eq!(
                classify_mysql_code(number).unwrap().name(),
                mysql_code_name(number)
            );
        }
    }
}
