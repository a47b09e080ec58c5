//! A [tower] middleware for database-backed HTTP services that **replays the whole request**
//! when its handler failed with a retryable database error: `SQLITE_BUSY`,
//! `SQLITE_BUSY_SNAPSHOT`, the `LOCKED` cases that are contention, pool time-outs, and, behind
//! features, PostgreSQL serialization failures and deadlocks (`40001`, `40P01`) and MySQL/MariaDB
//! deadlocks, lock wait time-outs and snapshot conflicts (`1213`, `1205`, `1020`, `3101`).
//!
//! A deferred SQLite transaction that reads and then writes meets `SQLITE_BUSY` at once when
//! another connection writes, whatever `busy_timeout` says, and retrying the statement inside
//! the same transaction fails again: only a re-run of the whole transaction cures it. In an
//! HTTP service the whole transaction is the handler, so [`SqliteRetryLayer`] buffers the
//! request body once (within caps) and calls the handler again with a pristine copy of the
//! request, with backoff, until it succeeds or the [`RetryPolicy`] says stop.
//!
//! [tower]: https://docs.rs/tower
//!
//! # Quick start
//!
//! The handler returns [`DbError`], which any `sqlx::Error` (or rusqlite, libSQL, sqlx 0.8
//! error, with their features) converts into with `?`: a retryable error answers `503` with the
//! [`Retryable`] marker that makes the layer replay the request; when the layer gives up, it
//! adds `Retry-After`.
//!
#![cfg_attr(all(feature = "sqlx", feature = "axum"), doc = "```")]
#![cfg_attr(not(all(feature = "sqlx", feature = "axum")), doc = "```ignore")]
//! use axum::{extract::State, routing::post, Json, Router};
//! use sqlx::SqlitePool;
//! use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};
//!
//! async fn create_order(
//!     State(db): State<SqlitePool>,
//!     Json(item): Json<String>,
//! ) -> Result<Json<i64>, DbError> {
//!     let mut tx = db.begin().await?;
//!     let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM orders")
//!         .fetch_one(&mut *tx)
//!         .await?;
//!     sqlx::query("INSERT INTO orders (seq, item) VALUES (?, ?)")
//!         .bind(next)
//!         .bind(item)
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit().await?;
//!     Ok(Json(next))
//! }
//!
//! fn app(db: SqlitePool) -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .layer(SqliteRetryLayer::new(RetryPolicy::default()))
//!         .with_state(db)
//! }
//! # let _ = app;
//! ```
//!
//! With an error type of your own, call `classify` (or the function for your driver) and insert
//! the [`Retryable`] it returns into your response's extensions. A plain tower service whose
//! `Error` is not `Infallible` has its errors classified instead
//! ([`SqliteRetryLayer::classify_errors`], `SqlxErrors`).
//!
//! # When is a replay safe?
//!
//! A replay re-runs the handler from the start, so it is safe only if the failed attempt
//! committed nothing:
//!
//! - **one transaction per request**: every write of the handler inside one transaction that
//!   commits as its last step or rolls back (sqlx rolls back a dropped transaction); or
//! - **idempotent work**: writes that give the same result when done twice.
//!
//! A handler that commits and then does more (a second transaction, an email, a call to
//! another service) declares that point with [`Attempt::fence`]: a retryable failure after it
//! is answered as it is, never replayed.
//!
//! # Where to look
//!
//! - [`SqliteRetryLayer`] and the [`SqliteRetry`] service it builds; [`future::ResponseFuture`],
//!   the state machine that buffers, waits, calls, backs off and replays; [`ReplayBody`], the
//!   body each attempt gets ([`body`] explains how it is kept).
//! - [`RetryPolicy`]: attempts, backoff and [`Jitter`], the deadline, the body caps, the replay
//!   gate, writer [`Admission`] (a learned limit on the attempts in flight of each route that
//!   meets contention), an optional retry budget; [`InvalidPolicy`] says why a policy cannot
//!   work.
//! - Classification: `classify` (a `sqlx::Error`; `classify_sqlx_0_8`, `classify_rusqlite`,
//!   `classify_libsql` for the other drivers, with their features), [`classify_sqlite_code`],
//!   [`classify_postgres_code`], [`classify_mysql_code`] (raw codes), `is_constraint_violation`;
//!   [`ClassifyError`] for service errors.
//! - Per request: [`Attempt`] (the request extension on every attempt, with the fence) and
//!   [`RetryOutcome`] with its [`Outcome`] (the response extension on the answer).
//! - Observability: tracing (target `tower_sqlite_retry`, span `sqlite_retry`), the layer's
//!   counters ([`SqliteRetryLayer::metrics`], [`RetryMetrics`]), and, with the `metrics`
//!   feature, counters and histograms through the `metrics` facade ([the `recorder`
//!   module](recorder/index.html)).
//!
//! # Cargo features
//!
//! | feature | what it adds |
//! |---|---|
//! | `sqlx` (default) | sqlx 0.9 errors: `classify`, `SqlxErrors`, `DbError: From<sqlx::Error>`; needs no SQLite C library |
//! | `sqlx-0_8` | the same for sqlx 0.8 (`classify_sqlx_0_8`) |
//! | `rusqlite` | rusqlite 0.14 to 0.43 (`classify_rusqlite`, `RusqliteErrors`, `From<rusqlite::Error>`) |
//! | `libsql` | libSQL 0.10, local and embedded-replica databases (`classify_libsql`) |
//! | `postgres` | PostgreSQL SQLSTATEs, in whichever sqlx versions are on |
//! | `mysql` | MySQL/MariaDB error numbers, in whichever sqlx versions are on |
//! | `metrics` | metrics through the [`metrics`](https://docs.rs/metrics) facade |
//! | `sqlite-write` | the write path for sqlx 0.9 and SQLite ([`WritePool`](write/index.html)): the transaction queues for its turn per database file, begins `IMMEDIATE` and fences the request at commit; no SQLite library chosen |
//! | `sqlite` | deprecated alias of `sqlx` |
//!
//! # Semver and dependencies
//!
//! Some dependencies are public, their types in this crate's API: `http`, `http-body` and
//! `bytes` (1.x); `tower-layer` and `tower-service` (0.3); `tower` 0.5 (the retry
//! [`Budget`](tower::retry::budget::Budget) a policy takes, `BoxError`); `tracing` 0.1 (the
//! `Level` of [`RetryPolicy::replay_event_level`]); and, with their features, `axum` 0.8,
//! sqlx 0.9 and 0.8, rusqlite (0.14 to 0.43) and libsql 0.10 (`From` impls and classifiers),
//! sqlx-sqlite 0.9 (`sqlite-write`: `WritePool` takes and gives sqlx's SQLite types).
//! Moving to a new breaking version of any of them is a breaking release of this crate. CI
//! checks the list with `cargo-check-external-types`. The minimum supported Rust version is
//! 1.94 (that of sqlx 0.9), checked in CI; raising it is a minor release.
//!
//! The [README] has the rest: where the layer sits among other layers, the SQLite settings to
//! pair it with, a demonstration under load, the dependency line for each stack, and moving to
//! PostgreSQL or MySQL.
//!
//! [README]: https://github.com/tower-sqlite-retry/tower-sqlite-retry#readme
#![cfg_attr(docsrs, feature(doc_cfg))]

mod admission;
mod attempt;
pub mod body;
pub mod classify;
mod decide;
mod error;
pub mod future;
mod layer;
mod metrics;
mod policy;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod recorder;
#[cfg(not(feature = "metrics"))]
mod recorder;
mod route;
mod service;
pub mod write;

pub use admission::{Admission, AdmissionLimit};
pub use attempt::{Attempt, InRequest, Outcome, RetryOutcome, in_request};
pub use body::ReplayBody;
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
pub use classify::SqlxErrors;
pub use classify::{
    ClassifyError, NeverRetryErrors, Retryable, classify_error_chain, classify_mysql_code,
    classify_postgres_code, classify_sqlite_code, mysql_code_name, postgres_code_name,
    sqlite_code_name, tag_retryable,
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
pub use write::{TurnError, WriteQueue, WriteStats, WriteTurn};
#[cfg(feature = "sqlite-write")]
pub use write::{WritePool, WriteTransaction};

// The README's Rust blocks run as doctests (they are axum handlers on sqlx 0.9: with the
// `sqlx` and `axum` features); the README itself is for people (and a forge).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "sqlx", feature = "axum"))]
pub struct ReadmeDoctests;

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
        assert_send::<future::ResponseFuture<Inner, NeverRetryErrors, Body>>();
        assert_send::<ReplayBody<Body>>();
        assert_send::<ReplayBody<hyper::body::Incoming>>();
        assert_send::<Attempt>();
        assert_send::<InRequest<std::future::Ready<()>>>();
        assert_sync::<InRequest<std::future::Ready<()>>>();
        assert_sync::<Attempt>();
        assert_send::<RetryMetrics>();
        assert_sync::<RetryMetrics>();
        let _ = |_: Request<Body>| ();
    }
}
