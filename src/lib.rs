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
//! With an error type of your own, ask the driver's error ([`DriverError::retryable`])
//! and insert the [`Retryable`] it returns into your response's extensions, or let
//! [`tag_retryable`] find the driver's error in your error's `source()` chain. A plain tower
//! service whose `Error` is not `Infallible` has its errors classified instead
//! ([`SqliteRetryLayer::classify_errors`], [`classify::RetryDriverErrors`]).
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
//! The root holds what the examples write; everything else is under its module.
//!
//! - [`SqliteRetryLayer`] and the [`SqliteRetry`] service it builds; [`future`], the state
//!   machine that buffers, waits, calls, backs off and replays; [`body`], the body each attempt
//!   gets ([`body::ReplayBody`]) and how it is kept.
//! - [`RetryPolicy`]: attempts, backoff and [`Jitter`], the deadline, the body caps, the replay
//!   gate, writer admission (a learned limit on the attempts in flight of each route that meets
//!   contention), an optional retry budget; the rest of the settings in [`policy`].
//! - Classification: the sealed [`DriverError`] trait (sqlx 0.9 and 0.8,
//!   rusqlite, libSQL: whether an error is retryable, a constraint violation, its code and
//!   name), [`tag_retryable`] and [`classify_error_chain`] for an application's own error
//!   type, [`ClassifyError`] for service errors; the tables, and the functions that take raw
//!   codes, in [`classify`](mod@classify).
//! - Outside HTTP ([`operation`]): an [`Operation`] gives a loop its [`Backoff`], retries an
//!   async function ([`Operation::run`], [`OperationError`]) and gives `tower::retry` its
//!   policy ([`Operation::layer`]), with the layer's policy, classification and observability.
//! - Per request: [`Attempt`] (the request extension on every attempt, with the fence);
//!   [`in_request`] carries the request into a spawned task.
//! - Observability: tracing (target `tower_sqlite_retry`, span `sqlite_retry`), the layer's
//!   counters ([`SqliteRetryLayer::metrics`], [`RetryMetrics`], the rest in [`metrics`]:
//!   the response extension [`metrics::RetryOutcome`] says how a request ended), and, with the
//!   `metrics` feature, counters and histograms through the `metrics` facade (`metrics::recorder`,
//!   the metrics' names).
//! - The write path ([`write`](mod@write)): `WritePool` and `WriteTransaction` (feature `sqlite-write`),
//!   and the turn on its own for other drivers.
//!
//! `docs/semver.md` in the repository says what 1.0 will freeze.
//!
//! # Cargo features
//!
//! | feature | what it adds |
//! |---|---|
//! | `sqlx` (default) | sqlx 0.9 errors: `DriverError for sqlx::Error`, `DbError: From<sqlx::Error>`; needs no SQLite C library |
//! | `sqlx-0_8` | the same for sqlx 0.8 |
//! | `rusqlite` | rusqlite 0.14 to 0.43 (`DriverError`, `From<rusqlite::Error>`) |
//! | `libsql` | libSQL 0.10, local and embedded-replica databases (`DriverError`, `From<libsql::Error>`) |
//! | `diesel` | Diesel 2.2 to 2.4 (`DriverError`, `From<diesel::result::Error>`): `SQLITE_BUSY` known by SQLite's fixed message, Diesel keeping no code |
//! | `postgres` | PostgreSQL SQLSTATEs, in whichever sqlx versions are on |
//! | `mysql` | MySQL/MariaDB error numbers, in whichever sqlx versions are on |
//! | `metrics` | metrics through the [`metrics`](https://docs.rs/metrics) facade |
//! | `sqlite-write` | the write path for sqlx 0.9 and SQLite ([`WritePool`](write/index.html)): the transaction queues for its turn per database file, begins `IMMEDIATE` and fences the request at commit; no SQLite library chosen |
//! | `diesel-write` | the same writer thread for Diesel's `SqliteConnection` (`write::DieselWriteThread`; Diesel's `sqlite` backend) |
//! | `rusqlite-write` | the write path for rusqlite (`write::WriteThread`): each write transaction, a closure, runs on the database's writer thread, in the file's turn, with group commit; rusqlite as `rusqlite` takes it |
//!
//! # Semver and dependencies
//!
//! Some dependencies are public, their types in this crate's API: `http`, `http-body` and
//! `bytes` (1.x); `tower-layer` and `tower-service` (0.3); `tower` 0.5 (the retry
//! [`Budget`](tower::retry::budget::Budget) a policy takes, `BoxError`); `tracing` 0.1 (the
//! `Level` of [`RetryPolicy::replay_event_level`]); and, with their features, `axum` 0.8,
//! sqlx 0.9 and 0.8, rusqlite (0.14 to 0.43), libsql 0.10 and diesel 2 (`From` impls and classifiers),
//! sqlx-sqlite 0.9 (`sqlite-write`: `WritePool` takes and gives sqlx's SQLite types),
//! rusqlite (`rusqlite-write`: `WriteThread` gives its closures rusqlite's `Transaction`).
//! Moving to a new breaking version of any of them is a breaking release of this crate. CI
//! checks the list with `cargo-check-external-types`. The minimum supported Rust version is
//! 1.94 (that of sqlx 0.9), checked in CI; raising it is a minor release.
//!
//! The [README] has the rest: where the layer sits among other layers, a demonstration under
//! load and the dependency line for each stack; the repository's `docs/` the write path and the
//! SQLite settings to pair it with (`docs/write-path.md`), and moving to PostgreSQL or MySQL
//! (`docs/postgres-mysql.md`).
//!
//! [README]: https://github.com/tower-sqlite-retry/tower-sqlite-retry#readme
#![cfg_attr(docsrs, feature(doc_cfg))]

/// A `tracing` event of target `tower_sqlite_retry` at a level known only at run time (a
/// policy's `replay_event_level`): `tracing::event!` needs a constant level, so each level is
/// its own callsite. Used by the layer's and the operations' retry events.
macro_rules! event_at_level {
    ($level:expr, $($event:tt)+) => {
        match $level {
            l if l == ::tracing::Level::TRACE => {
                ::tracing::event!(target: "tower_sqlite_retry", ::tracing::Level::TRACE, $($event)+)
            }
            l if l == ::tracing::Level::DEBUG => {
                ::tracing::event!(target: "tower_sqlite_retry", ::tracing::Level::DEBUG, $($event)+)
            }
            l if l == ::tracing::Level::INFO => {
                ::tracing::event!(target: "tower_sqlite_retry", ::tracing::Level::INFO, $($event)+)
            }
            l if l == ::tracing::Level::WARN => {
                ::tracing::event!(target: "tower_sqlite_retry", ::tracing::Level::WARN, $($event)+)
            }
            _ => ::tracing::event!(target: "tower_sqlite_retry", ::tracing::Level::ERROR, $($event)+),
        }
    };
}

mod admission;
mod attempt;
pub mod body;
pub mod classify;
mod decide;
pub mod future;
pub mod metrics;
pub mod operation;
pub mod policy;
mod recorder;
mod route;
mod service;
mod shared;
pub mod write;

// What a user writes in the README's examples, and the types its signatures need; the rest is
// under its module (`policy`, `metrics`, `classify`, `write`, `body`, `future`).
pub use attempt::{Attempt, in_request};
pub use classify::db_error::DbError;
pub use classify::{
    ClassifyError, DriverError, NeverRetryErrors, Retryable, classify_error_chain, tag_retryable,
};
pub use metrics::RetryMetrics;
pub use operation::{Backoff, Operation, OperationError};
pub use policy::{Jitter, RetryPolicy};
pub use service::{SqliteRetry, SqliteRetryLayer};
#[cfg(feature = "sqlite-write")]
pub use write::{WritePool, WriteTransaction};

/// Not a public API: what the companion crate `tower-sqlite-retry-sqlx08` (which pins this
/// crate's exact version) builds sqlx 0.8's `WritePool` on, and the test seams of this crate's
/// own tests. Anything here may change in any release; `docs/semver.md` says so.
#[doc(hidden)]
pub mod __private {
    pub use crate::write::shared::*;

    /// While `held`, group commit starts no fsync: transactions commit, then wait for it.
    /// `false` if the pool shares no fsync (group commit off, not WAL, not `FULL`, or before
    /// its first write transaction).
    #[cfg(feature = "sqlite-write")]
    pub fn hold_fsync(pool: &crate::WritePool, held: bool) -> bool {
        pool.hold_fsync(held)
    }

    /// While `held`, the writer thread's group commit starts no fsync: closures commit, then
    /// wait for it. `false` if it shares no fsync.
    #[cfg(feature = "rusqlite-write")]
    pub fn hold_thread_fsync(writes: &crate::write::WriteThread, held: bool) -> bool {
        writes.hold_fsync(held)
    }

    /// `hold_thread_fsync` for Diesel's writer thread.
    #[cfg(feature = "diesel-write")]
    pub fn hold_diesel_thread_fsync(writes: &crate::write::DieselWriteThread, held: bool) -> bool {
        writes.hold_fsync(held)
    }

    /// How many writer connections group commit saw opened (0 where it shares no fsync).
    #[cfg(feature = "sqlite-write")]
    pub fn writer_connections_opened(pool: &crate::WritePool) -> u64 {
        pool.writer_connections_opened()
    }
}

// The README's Rust blocks run as doctests (they are axum handlers on sqlx 0.9: with the
// `sqlx` and `axum` features); the README itself is for people (and a forge).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "sqlx", feature = "axum"))]
pub struct ReadmeDoctests;

// `docs/outside-http.md`'s Rust blocks run as doctests too (one of them uses the write path).
#[doc = include_str!("../docs/outside-http.md")]
#[cfg(all(doctest, feature = "sqlx", feature = "sqlite-write"))]
pub struct OutsideHttpDoctests;

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
        assert_send::<body::ReplayBody<Body>>();
        assert_send::<body::ReplayBody<hyper::body::Incoming>>();
        assert_send::<Attempt>();
        assert_send::<future::InRequest<std::future::Ready<()>>>();
        assert_sync::<future::InRequest<std::future::Ready<()>>>();
        assert_sync::<Attempt>();
        assert_send::<RetryMetrics>();
        assert_sync::<RetryMetrics>();
        assert_send::<Operation>();
        assert_sync::<Operation>();
        assert_send::<Backoff>();
        assert_sync::<Backoff>();
        assert_send::<operation::OperationPolicy>();
        assert_sync::<operation::OperationPolicy>();
        assert_send::<OperationError<sqlx::Error>>();
        assert_send::<operation::Slot>();
        assert_sync::<operation::Slot>();
        assert_send::<operation::AdmitError>();
        assert_sync::<OperationError<sqlx::Error>>();
        fn run_is_send(op: &Operation, db: sqlx::SqlitePool) -> impl Send + '_ {
            op.run(move |_| {
                let db = db.clone();
                async move { sqlx::query("SELECT 1").execute(&db).await }
            })
        }
        let _ = run_is_send;
        // `tower::retry` over an operation's policy, on a Send + Sync service
        type Retried = tower::retry::Retry<operation::OperationPolicy, Inner>;
        assert_send::<Retried>();
        assert_sync::<Retried>();
        let _ = |_: Request<Body>| ();
    }

    /// Diesel's writer thread, likewise.
    #[cfg(feature = "diesel-write")]
    #[allow(dead_code)]
    fn diesel_write_thread_traits() {
        assert_send::<write::DieselWriteThread>();
        assert_sync::<write::DieselWriteThread>();
        fn transaction_is_send(writes: &write::DieselWriteThread) -> impl Send + '_ {
            use diesel::connection::SimpleConnection;
            writes.transaction(|conn| conn.batch_execute("SELECT 1"))
        }
        let _ = transaction_is_send;
    }

    /// The rusqlite write path: the writer and its options cross threads, and so does the
    /// future of a transaction (a handler's future must be `Send`).
    #[cfg(feature = "rusqlite-write")]
    #[allow(dead_code)]
    fn write_thread_traits() {
        assert_send::<write::WriteThread>();
        assert_sync::<write::WriteThread>();
        assert_send::<write::WriteThreadOptions>();
        assert_sync::<write::WriteThreadOptions>();
        fn transaction_is_send(writes: &write::WriteThread) -> impl Send + '_ {
            writes.transaction(|tx| tx.execute_batch("SELECT 1"))
        }
        let _ = transaction_is_send;
    }
}
