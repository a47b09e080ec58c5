// The README's examples are handlers on sqlx 0.9: its doc tests need the `sqlx` feature.
#![cfg_attr(any(not(doctest), feature = "sqlx"), doc = include_str!("../README.md"))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempt;
mod body;
mod classify;
mod error;
pub mod future;
mod layer;
mod metrics;
mod policy;
mod service;

pub use attempt::{Attempt, Outcome, RetryOutcome};
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
pub use classify::SqlxErrors;
pub use classify::{
    ClassifyError, NeverRetryErrors, Retryable, classify_mysql_code, classify_postgres_code,
    classify_sqlite_code, mysql_code_name, postgres_code_name, sqlite_code_name,
};
#[cfg(feature = "libsql")]
pub use classify::{LibsqlErrors, classify_libsql, is_constraint_violation_libsql};
#[cfg(feature = "rusqlite")]
pub use classify::{RusqliteErrors, classify_rusqlite, is_constraint_violation_rusqlite};
#[cfg(feature = "sqlx")]
pub use classify::{classify, is_constraint_violation};
#[cfg(feature = "sqlx-0_8")]
pub use classify::{classify_sqlx_0_8, is_constraint_violation_sqlx_0_8};
pub use error::DbError;
pub use layer::SqliteRetryLayer;
pub use metrics::{HISTOGRAM_BUCKETS, MetricsSnapshot, RetryMetrics};
pub use policy::{InvalidPolicy, Jitter, RetryPolicy};
pub use service::SqliteRetry;

#[cfg(test)]
mod traits {
    use super::*;
    use axum::body::Body;
    use http::Request;

    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}

    #[allow(dead_code)]
    fn traits() {
        type Inner = axum::routing::Route;
        assert_send::<SqliteRetryLayer>();
        assert_sync::<SqliteRetryLayer>();
        assert_send::<SqliteRetry<Inner>>();
        assert_sync::<SqliteRetry<Inner>>();
        assert_send::<future::ResponseFuture<Inner, NeverRetryErrors>>();
        assert_send::<Attempt>();
        assert_sync::<Attempt>();
        assert_send::<RetryMetrics>();
        assert_sync::<RetryMetrics>();
        let _ = |_: Request<Body>| ();
    }
}
