//! MySQL's and MariaDB's table: which server error numbers are contention.
//!
//! - `1213` ER_LOCK_DEADLOCK: InnoDB chose this transaction as a deadlock victim and rolled the
//!   whole of it back.
//! - `1205` ER_LOCK_WAIT_TIMEOUT: a row lock was not granted within `innodb_lock_wait_timeout`
//!   (50 s by default).
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

use super::Retryable;

/// Classifies a MySQL/MariaDB error number: `1213` ER_LOCK_DEADLOCK and `1205`
/// ER_LOCK_WAIT_TIMEOUT are retryable, nothing else.
///
/// For users who hold a raw error number rather than a `sqlx::Error` (from `mysql_async`,
/// say). The marker's [`code`](Retryable::code) is the number in decimal, its
/// [`name`](Retryable::name) the server's symbol. Available whatever the features.
///
/// | error number | retry |
/// |---|---|
/// | `1213` ER_LOCK_DEADLOCK (InnoDB rolled the whole transaction back) | yes |
/// | `1205` ER_LOCK_WAIT_TIMEOUT (`innodb_lock_wait_timeout`, 50 s by default) | yes |
/// | `3572` ER_LOCK_NOWAIT (`NOWAIT`) | no, as PostgreSQL's `55P03` |
/// | everything else (`1062` ER_DUP_ENTRY and other constraints, `1020` ER_CHECKREAD, ...) | no |
///
/// `1205` is retried because MySQL's lock wait timeout is on by default: it is contention that
/// lasted too long, not a request to fail fast. InnoDB rolls back only the *statement* on
/// `1205` (unless `innodb_rollback_on_timeout` is on): the replay is safe because the handler's
/// `?` drops the transaction, which rolls the rest back. A handler that catches `1205` and
/// commits anyway must not ask for a replay.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
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
        for number in [1213, 1205] {
            assert_eq!(
                classify_mysql_code(number).unwrap().name(),
                mysql_code_name(number)
            );
        }
    }
}
