//! The crate root's old paths of items that moved under their modules: hidden from the docs,
//! deprecated, kept for one release. Each note names the new path. Functions and type
//! aliases carry their own deprecation; items deprecated where they are defined (the
//! per-driver classifiers) are re-exported as they are.

#![allow(deprecated)]

use crate::classify::Retryable;

/// For each entry: documents the item as moved to `crate::$path` and deprecates it with
/// `$note` (the compiler's warning names the new path).
macro_rules! moved {
    ($($path:literal, $note:literal => $item:item)*) => {
        $(
            #[doc = concat!("Moved: [`", $path, "`](crate::", $path, ").")]
            #[deprecated(since = "0.1.0", note = $note)]
            $item
        )*
    };
}

moved! {
    "policy::Admission", "moved: use `tower_sqlite_retry::policy::Admission`"
        => pub type Admission = crate::policy::Admission;
    "policy::AdmissionLimit", "moved: use `tower_sqlite_retry::policy::AdmissionLimit`"
        => pub type AdmissionLimit = crate::policy::AdmissionLimit;
    "policy::InvalidPolicy", "moved: use `tower_sqlite_retry::policy::InvalidPolicy`"
        => pub type InvalidPolicy = crate::policy::InvalidPolicy;
    "future::InRequest", "moved: use `tower_sqlite_retry::future::InRequest`"
        => pub type InRequest<F> = crate::future::InRequest<F>;
    "metrics::Outcome", "moved: use `tower_sqlite_retry::metrics::Outcome`"
        => pub type Outcome = crate::metrics::Outcome;
    "metrics::RetryOutcome", "moved: use `tower_sqlite_retry::metrics::RetryOutcome`"
        => pub type RetryOutcome = crate::metrics::RetryOutcome;
    "metrics::MetricsSnapshot", "moved: use `tower_sqlite_retry::metrics::MetricsSnapshot`"
        => pub type MetricsSnapshot = crate::metrics::MetricsSnapshot;
    "metrics::HISTOGRAM_BUCKETS", "moved: use `tower_sqlite_retry::metrics::HISTOGRAM_BUCKETS`"
        => pub const HISTOGRAM_BUCKETS: usize = crate::metrics::HISTOGRAM_BUCKETS;
    "body::ReplayBody", "moved: use `tower_sqlite_retry::body::ReplayBody`"
        => pub type ReplayBody<B> = crate::body::ReplayBody<B>;
    "write::WriteQueue", "moved: use `tower_sqlite_retry::write::WriteQueue`"
        => pub type WriteQueue = crate::write::WriteQueue;
    "write::WriteTurn", "moved: use `tower_sqlite_retry::write::WriteTurn`"
        => pub type WriteTurn = crate::write::WriteTurn;
    "write::TurnError", "moved: use `tower_sqlite_retry::write::TurnError`"
        => pub type TurnError = crate::write::TurnError;
    "write::WriteStats", "moved: use `tower_sqlite_retry::write::WriteStats`"
        => pub type WriteStats = crate::write::WriteStats;
    "classify::classify_sqlite_code", "moved: use `tower_sqlite_retry::classify::classify_sqlite_code`"
        => pub fn classify_sqlite_code(code: i32, message: &str) -> Option<Retryable> { crate::classify::classify_sqlite_code(code, message) }
    "classify::classify_postgres_code", "moved: use `tower_sqlite_retry::classify::classify_postgres_code`"
        => pub fn classify_postgres_code(sqlstate: &str) -> Option<Retryable> { crate::classify::classify_postgres_code(sqlstate) }
    "classify::classify_mysql_code", "moved: use `tower_sqlite_retry::classify::classify_mysql_code`"
        => pub fn classify_mysql_code(number: u16) -> Option<Retryable> { crate::classify::classify_mysql_code(number) }
    "classify::sqlite_code_name", "moved: use `tower_sqlite_retry::classify::sqlite_code_name`, or `DriverError::code_name`"
        => pub fn sqlite_code_name(code: i32) -> &'static str { crate::classify::sqlite_code_name(code) }
    "classify::postgres_code_name", "moved: use `tower_sqlite_retry::classify::postgres_code_name`, or `DriverError::code_name`"
        => pub fn postgres_code_name(sqlstate: &str) -> &'static str { crate::classify::postgres_code_name(sqlstate) }
    "classify::mysql_code_name", "moved: use `tower_sqlite_retry::classify::mysql_code_name`, or `DriverError::code_name`"
        => pub fn mysql_code_name(number: u16) -> &'static str { crate::classify::mysql_code_name(number) }
}

/// Replaced by [`DriverError::is_constraint_violation`](crate::DriverError::is_constraint_violation).
#[deprecated(
    since = "0.1.0",
    note = "use `DriverError::is_constraint_violation` (`use tower_sqlite_retry::DriverError;`), \
            or `classify::is_constraint_violation`: one for every driver"
)]
pub fn is_constraint_violation<E: crate::DriverError + ?Sized>(error: &E) -> bool {
    error.is_constraint_violation()
}

#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
pub use crate::classify::SqlxErrors;
#[cfg(feature = "libsql")]
pub use crate::classify::{LibsqlErrors, classify_libsql, is_constraint_violation_libsql};
#[cfg(feature = "rusqlite")]
pub use crate::classify::{RusqliteErrors, classify_rusqlite, is_constraint_violation_rusqlite};
#[cfg(feature = "sqlx-0_8")]
pub use crate::classify::{classify_sqlx_0_8, is_constraint_violation_sqlx_0_8};
