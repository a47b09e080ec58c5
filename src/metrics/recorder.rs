//! Counters, histograms and a gauge emitted through the [`metrics`] facade (cargo feature
//! `metrics`).
//!
//! The layer only *emits*; the application chooses where the values go by installing a
//! recorder ([`metrics-exporter-prometheus`], an OpenTelemetry bridge, StatsD, ...). Without an
//! installed recorder the calls go to the facade's no-op recorder; without the feature they
//! are compiled out.
//!
//! # The metrics
//!
//! | name | type | unit | labels | meaning |
//! |---|---|---|---|---|
//! | `tower_sqlite_retry_requests_total` | counter | requests | `http_route`, `http_request_method`, `outcome`, `error_type`¹ | requests the layer finished, by how they ended (one whose client left first included, as `cancelled`), once even with nested layers |
//! | `tower_sqlite_retry_replays_total` | counter | replays | `http_route`, `http_request_method`, `error_type` | replays started (attempts after the first), by the error that caused each |
//! | `tower_sqlite_retry_attempts` | histogram | attempts | `http_route`, `http_request_method` | attempts per finished request, the first included (1 = no replay) |
//! | `tower_sqlite_retry_backoff_seconds` | histogram | seconds | `http_route`, `http_request_method` | time a finished request spent sleeping in backoff, all its replays together (0 without a replay) |
//! | `tower_sqlite_retry_queue_wait_seconds` | histogram | seconds | `http_route`, `http_request_method` | time an attempt waited in the queues before it started: a writer-admission slot and the replay gate, one sample per attempt that passed one (0 when it passed at once), the waits that ended at the deadline or in a cancel included |
//! | `tower_sqlite_retry_admission_limit` | gauge | count | `operation` | outside HTTP: an operation's admission limit now (tries it lets run at once; 0 while it has none: before its first retryable error, and after a quiet time with none) |
//! | `tower_sqlite_retry_buffered_bytes` | gauge | bytes | none | request-body bytes held for replay right now, every layer of the process together |
//! | `tower_sqlite_retry_write_wait_seconds` | histogram | seconds | `http_route`, `http_request_method`, `database` | the write path: time a write transaction waited for its database's turn (0 when it was free) |
//! | `tower_sqlite_retry_write_held_seconds` | histogram | seconds | `http_route`, `http_request_method`, `database` | the write path: time a write transaction held its database's turn, from `BEGIN` to the turn going on (its commit or rollback included); the rate of its sum, by `database`, is the single writer's **utilization** |
//! | `tower_sqlite_retry_write_waiting` | gauge | count | `database` | the write path: write transactions waiting for their database's turn now (the queue's length) |
//! | `tower_sqlite_retry_write_group_members` | histogram | count | `database` | group commit: write transactions made durable by one shared fsync of the WAL |
//! | `tower_sqlite_retry_write_group_held_seconds` | histogram | seconds | `database` | group commit: time one shared fsync of the WAL took (outside the write lock) |
//! | `tower_sqlite_retry_write_sync_errors_total` | counter | count | `database` | group commit: syncs of the WAL that failed; after one, the database file is refused writes until the process restarts (the disk refused a write) |
//! | `tower_sqlite_retry_write_errors_total` | counter | count | `database`, `stage` | the write path: write transactions that failed, by the step that failed (`turn`, `begin`, `commit`, `sync`, `rollback`) |
//!
//! Operations outside HTTP ([`Operation`](crate::Operation): a loop's backoff, the function
//! wrapper, `tower::retry` with an operation's policy) emit the first four under the same
//! names, labelled `operation` (the name the caller gave) instead of `http_route` and
//! `http_request_method`: one sample of `requests_total`, `attempts` and `backoff_seconds` per
//! call, tower request, or loop streak (from its first error to the success or give-up that
//! ends it; a loop's success without error counts one `first_try`), one `replays_total` per
//! retry. Query them by `operation`: `sum by (operation, outcome)
//! (rate(tower_sqlite_retry_requests_total{operation!=""}[5m]))`.
//!
//! ¹ only when the request ended on a retryable error the layer did not (or could no longer)
//! replay: outcomes `exhausted`, `deadline`, `budget_exhausted`, `not_replayable`, `fenced`.
//!
//! The names are also constants here ([`REQUESTS`], [`REPLAYS`], [`ATTEMPTS`], [`BACKOFF`],
//! [`QUEUE_WAIT`], [`ADMISSION_LIMIT`], [`BUFFERED_BYTES`], [`WRITE_WAIT`], [`WRITE_HELD`], [`WRITE_WAITING`],
//! [`WRITE_GROUP_MEMBERS`], [`WRITE_GROUP_HELD`], [`WRITE_SYNC_ERRORS`], [`WRITE_ERRORS`]), with
//! suggested histogram buckets ([`ATTEMPTS_BUCKETS`], [`SECONDS_BUCKETS`]).
//!
//! The write path's utilization, in PromQL: the share of each second a write transaction held
//! the database's turn (1.0: the database at its write limit; from there writers only wait
//! longer):
//!
//! ```text
//! sum by (database) (rate(tower_sqlite_retry_write_held_seconds_sum[1m]))
//! ```
//!
//! (`WritePool::stats` and `WriteQueue::stats` give the same without a metrics pipeline.) A
//! write transaction outside a request (the write path used without the layer) is labelled
//! `http_route="_unknown"`, `http_request_method="_OTHER"`.
//!
//! # Labels
//!
//! Every label has a bounded set of values:
//!
//! - `http_route`: the route template axum matched ([`MatchedPath`](axum::extract::MatchedPath),
//!   e.g. `/orders/{id}`), never the raw path; `_unknown` when there is none (the layer wraps
//!   the router from outside, or the request fell through to a fallback).
//! - `operation`: outside HTTP, the operation's name as its code gives it
//!   ([`Operation::new`](crate::Operation::new)): a fixed name per call site (`claim`,
//!   `send_email`), never one built from data.
//! - `http_request_method`: `GET`, `HEAD`, `POST`, `PUT`, `DELETE`, `CONNECT`, `OPTIONS`,
//!   `TRACE`, `PATCH`; any other method is `_OTHER` (as OpenTelemetry's `http.request.method`).
//! - `outcome`: one of [`Outcome`](super::Outcome)'s nine names (`first_try`,
//!   `succeeded_after_retry`, `exhausted`, `deadline`, `budget_exhausted`, `not_replayable`,
//!   `fenced`, `non_retryable`, `cancelled`).
//! - `database`: the write path's database, by its file's name (`app.db`; two files of one
//!   name in different directories share it), or `memory` for an in-memory one; `_unknown` on
//!   a write error that came before the pool's first transaction learnt which database it
//!   opens (a closed pool, or a connection that could not be opened). Every write-path metric
//!   has it.
//! - `stage`: the step of a write transaction that failed, one of five:
//!   - `turn`: it got no turn: the wait ended at its bound (the request's deadline, the pool's
//!     `acquire_timeout`, a `WriteQueue::turn` limit), or the request already held the turn;
//!   - `begin`: it got the turn, but not a transaction: the connection could not be had, or
//!     `BEGIN IMMEDIATE` failed (another process's lock past `busy_timeout`, the deadline);
//!     also a closed pool, and a database that could not be asked which file it is;
//!   - `commit`: `COMMIT` failed or was refused (then rolled back: nothing written), or a
//!     savepoint was left open;
//!   - `sync`: committed, but group commit's fsync of the WAL failed for it: not known
//!     durable (answered `500`, never replayed);
//!   - `rollback`: an explicit `rollback()` failed (the connection is given up).
//!
//!   A transaction dropped without `commit()` or `rollback()` (an early return, a cancelled
//!   request) is not a failure here. A write through `WriteQueue` with another driver counts
//!   only `turn`: the rest is that driver's.
//! - `error_type`: the retryable error's name ([`Retryable::name`](crate::Retryable::name):
//!   `SQLITE_BUSY`, `SQLITE_BUSY_SNAPSHOT`, `serialization_failure`, `ER_LOCK_DEADLOCK`,
//!   `pool_timed_out`, ...). The built-in classifiers name a fixed set; a classifier of your
//!   own should too.
//!
//! # Names and units
//!
//! Base units (seconds, bytes) are part of the names, as Prometheus' conventions ask, and every
//! metric is described (`describe_counter!` & co.) with its [`Unit`](metrics::Unit).
//!
//! The counters' names end in `_total`. An exporter that appends `_total` itself would double
//! it, so this was checked against [`metrics-exporter-prometheus`] (0.18): by default it writes
//! names exactly as given, so a counter named without `_total` would be exposed without it,
//! against Prometheus' conventions; with `with_recommended_naming(true)` it appends `_total` (and
//! the unit) only when the name does not already end with it. A name ending in `_total` is
//! therefore exposed as `..._total` exactly once either way. (OpenTelemetry's Prometheus
//! translation also adds `_total` only when it is missing.)
//!
//! # Which layer emits
//!
//! Layers nest without multiplying attempts (an outer layer passes the inner one's answer
//! through), and they do not multiply metrics either: a request is counted, and its attempts
//! and backoff recorded, once, by the layer that handled it. The buffered-bytes gauge counts
//! what each layer holds, so with nested layers a body held by both is counted twice (they
//! share the same memory).
//!
//! Every metric is described (help text and unit) to the recorder installed when a layer is
//! built: install the recorder before building the layers, or the exporter has no help text
//! and no units for them (the values are recorded all the same). Describing again, for each
//! layer, is harmless.
//!
//! [`metrics-exporter-prometheus`]: https://docs.rs/metrics-exporter-prometheus
// The example runs as a doctest only where it can compile: with the feature.
#![cfg_attr(
    feature = "metrics",
    doc = r##"
# Example

With `metrics-exporter-prometheus` installed by the application, the text a `GET /metrics`
handler would answer with:

```
use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::Request;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tower::ServiceExt;
use tower_sqlite_retry::metrics::recorder;
use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The application installs an exporter, before it builds the layers. Buckets make the
    // histograms true Prometheus histograms (summaries otherwise).
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(recorder::ATTEMPTS.to_owned()),
            recorder::ATTEMPTS_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            recorder::SECONDS_BUCKETS,
        )?
        .install_recorder()?;
    // (A long-running service also calls `prometheus.run_upkeep()` every few seconds.)

    let app = Router::new()
        .route("/orders", post(|| async { "created" }))
        .layer(SqliteRetryLayer::new(RetryPolicy::default()));
    let request = Request::post("/orders").body(Body::empty())?;
    app.oneshot(request).await?;

    let text = prometheus.render();
    assert!(text.contains(
        "# TYPE tower_sqlite_retry_requests_total counter\n\
         tower_sqlite_retry_requests_total\
         {http_route=\"/orders\",http_request_method=\"POST\",outcome=\"first_try\"} 1\n"
    ));
    assert!(text.contains(
        "tower_sqlite_retry_attempts_bucket\
         {http_route=\"/orders\",http_request_method=\"POST\",le=\"1\"} 1\n"
    ));
    Ok(())
}
```
"##
)]

pub use crate::recorder::{
    ADMISSION_LIMIT, ATTEMPTS, ATTEMPTS_BUCKETS, BACKOFF, BUFFERED_BYTES, QUEUE_WAIT, REPLAYS,
    REQUESTS, SECONDS_BUCKETS, WRITE_ERRORS, WRITE_GROUP_HELD, WRITE_GROUP_MEMBERS, WRITE_HELD,
    WRITE_SYNC_ERRORS, WRITE_WAIT, WRITE_WAITING,
};
