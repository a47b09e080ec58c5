//! PostgreSQL's table: which SQLSTATEs are contention.
//!
//! PostgreSQL aborts the whole transaction on both retryable codes and asks the client to run it
//! again, which is what a replay of the request does:
//!
//! - `40001` serialization_failure: a `SERIALIZABLE` (or `REPEATABLE READ`) transaction lost a
//!   conflict with a concurrent one;
//! - `40P01` deadlock_detected: the deadlock detector chose this transaction as the victim.
//!
//! # Why `55P03` lock_not_available is not retried
//!
//! PostgreSQL raises it only when the application asked not to wait: `SELECT ... FOR UPDATE
//! NOWAIT`, `LOCK ... NOWAIT`, or a `lock_timeout` (off by default). That is a deliberate choice
//! to fail fast, often "someone else is already working on this row"; replaying the request with
//! backoff would quietly turn it into waiting after all, up to the policy's deadline. A service
//! that does want those replayed says so itself (see [`classify_postgres_code`]).
//!
//! The table needs no driver: every binding hands it the SQLSTATE. sqlx's
//! `DatabaseError::code()` *is* the SQLSTATE for PostgreSQL, but MySQL's `code()` is a SQLSTATE
//! too (`40001` for a MySQL deadlock), so a sqlx error is read as PostgreSQL's only after a
//! downcast to `PgDatabaseError` (the `postgres` feature turns on sqlx's pure-Rust PostgreSQL
//! driver, no C library, for that type).

use super::marker::{Constraint, Retryable};

/// Classifies a PostgreSQL SQLSTATE: `40001` serialization_failure and `40P01`
/// deadlock_detected are retryable, nothing else.
///
/// For users who hold a raw SQLSTATE rather than a `sqlx::Error` (from `tokio-postgres`, say).
/// The marker's [`code`](Retryable::code) is the SQLSTATE, its [`name`](Retryable::name) the
/// condition name of PostgreSQL's manual. Available whatever the features: it needs no driver.
///
/// | SQLSTATE | retry |
/// |---|---|
/// | `40001` serialization_failure (`SERIALIZABLE` / `REPEATABLE READ` conflicts) | yes |
/// | `40P01` deadlock_detected (the deadlock detector's victim) | yes |
/// | `55P03` lock_not_available (`NOWAIT`, `lock_timeout`) | **no**: see below |
/// | everything else (class `23` constraints, `40002`, `40003`, `57014` query_canceled, `53300` too_many_connections, ...) | no |
///
/// ```
/// use tower_sqlite_retry::classify::classify_postgres_code;
///
/// let marker = classify_postgres_code("40001").unwrap();
/// assert_eq!((marker.code(), marker.name()), ("40001", "serialization_failure"));
/// assert_eq!(classify_postgres_code("40P01").unwrap().name(), "deadlock_detected");
/// assert!(classify_postgres_code("55P03").is_none()); // lock_not_available
/// assert!(classify_postgres_code("23505").is_none()); // unique_violation
/// ```
///
/// # Why `55P03` lock_not_available is not retried
///
/// PostgreSQL raises it only when the application asked not to wait (`NOWAIT`, or a
/// `lock_timeout`, off by default): a deliberate choice to fail fast, which a replay with
/// backoff would quietly turn into waiting after all. A service that does want those replayed
/// says so itself:
///
/// ```
/// use tower_sqlite_retry::Retryable;
/// use tower_sqlite_retry::classify::classify_postgres_code;
///
/// fn classify_with_lock_timeouts(sqlstate: &str) -> Option<Retryable> {
///     classify_postgres_code(sqlstate)
///         .or_else(|| (sqlstate == "55P03").then(|| Retryable::new("55P03", "lock_not_available")))
/// }
/// assert!(classify_with_lock_timeouts("55P03").is_some());
/// ```
pub fn classify_postgres_code(sqlstate: &str) -> Option<Retryable> {
    let code = match sqlstate {
        "40001" => "40001",
        "40P01" => "40P01",
        _ => return None,
    };
    Some(Retryable::new(code, postgres_code_name(code)))
}

/// What kind of constraint violation a PostgreSQL SQLSTATE is, if one: class `23`
/// (integrity_constraint_violation). `23505` unique, `23503` foreign key, `23P01` exclusion,
/// `23001` restrict and the class's other codes conflict with other rows (409); `23502` not
/// null and `23514` check refuse the request's own content (422). Type errors are class `22`
/// (data_exception), no constraint: `500`.
#[cfg_attr(not(driver), allow(dead_code))]
pub(crate) fn postgres_constraint(sqlstate: &str) -> Option<Constraint> {
    if sqlstate.len() != 5 || !sqlstate.starts_with("23") {
        return None;
    }
    Some(match sqlstate {
        "23502" | "23514" => Constraint::Invalid,
        _ => Constraint::Conflict,
    })
}

/// The condition name of a PostgreSQL SQLSTATE (`"40001"` → `"serialization_failure"`), or of
/// its class (the first two characters) when the code itself is not known here, or
/// `"unknown"`.
///
/// ```
/// # use tower_sqlite_retry::classify::postgres_code_name;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
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
    fn constraints() {
        use Constraint::*;
        for (code, kind) in [
            ("23000", Conflict),
            ("23001", Conflict),
            ("23502", Invalid),
            ("23503", Conflict),
            ("23505", Conflict),
            ("23514", Invalid),
            ("23P01", Conflict),
        ] {
            assert_eq!(postgres_constraint(code), Some(kind), "{code}");
        }
        for code in ["40001", "40002", "2350", "235050", "", "22021", "22P02"] {
            assert_eq!(postgres_constraint(code), None, "{code}");
        }
    }

    #[test]
    fn names_of_retryable_codes_are_the_markers_names() {
        for code in ["40001", "40P01"] {
            assert_eq!(
                classify_postgres_code(code).unwrap().name(),
                postgres_code_name(code)
            );
        }
    }
}
