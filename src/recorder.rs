//! The `metrics` facade's emitter: what the layer and the write path record, compiled out
//! without the `metrics` feature. The names, buckets and their documentation are public in
//! [`metrics::recorder`](crate::metrics::recorder).

use std::time::Duration;

use http::Method;

use crate::attempt::Outcome;

/// Counter: requests the layer finished. Labels `http_route`, `http_request_method`,
/// `outcome`, and `error_type` when the request ended on a retryable error.
#[cfg(feature = "metrics")]
pub const REQUESTS: &str = "tower_sqlite_retry_requests_total";

/// Counter: replays started. Labels `http_route`, `http_request_method`, `error_type`.
#[cfg(feature = "metrics")]
pub const REPLAYS: &str = "tower_sqlite_retry_replays_total";

/// Histogram: attempts per finished request. Labels `http_route`, `http_request_method`.
#[cfg(feature = "metrics")]
pub const ATTEMPTS: &str = "tower_sqlite_retry_attempts";

/// Histogram: seconds a finished request slept in backoff. Labels `http_route`,
/// `http_request_method`.
#[cfg(feature = "metrics")]
pub const BACKOFF: &str = "tower_sqlite_retry_backoff_seconds";

/// Histogram: seconds an attempt waited in the queues (a writer-admission slot, the replay
/// gate), one sample per attempt that passed one, the waits that ended at the deadline or in
/// a cancel included. Labels
/// `http_route`, `http_request_method`.
#[cfg(feature = "metrics")]
pub const QUEUE_WAIT: &str = "tower_sqlite_retry_queue_wait_seconds";

/// Gauge: an operation's admission limit (tries it lets run at once) now; 0 while it has
/// none. Label `operation`.
#[cfg(feature = "metrics")]
pub const ADMISSION_LIMIT: &str = "tower_sqlite_retry_admission_limit";

/// Gauge: request-body bytes held for replay now, every layer together. No labels.
#[cfg(feature = "metrics")]
pub const BUFFERED_BYTES: &str = "tower_sqlite_retry_buffered_bytes";

/// Histogram: seconds a write transaction of the write path waited for its database's turn (0
/// when it was free). Labels `http_route`, `http_request_method`, `database`.
#[cfg(feature = "metrics")]
pub const WRITE_WAIT: &str = "tower_sqlite_retry_write_wait_seconds";

/// Histogram: seconds a write transaction of the write path held its database's turn, from
/// `BEGIN` to the turn going on. Labels `http_route`, `http_request_method`, `database`. Its
/// sum's rate, summed by `database`, is the writer's utilization.
#[cfg(feature = "metrics")]
pub const WRITE_HELD: &str = "tower_sqlite_retry_write_held_seconds";

/// Histogram: write transactions made durable by one shared fsync of the WAL (group commit,
/// `WritePool::group_commit`). Label `database`.
#[cfg(feature = "metrics")]
pub const WRITE_GROUP_MEMBERS: &str = "tower_sqlite_retry_write_group_members";

/// Histogram: seconds one shared fsync of the WAL took (group commit; outside the write lock).
/// Label `database`.
#[cfg(feature = "metrics")]
pub const WRITE_GROUP_HELD: &str = "tower_sqlite_retry_write_group_held_seconds";

/// Counter: syncs of the WAL that failed while group commit shared its fsync (the shared
/// fsync, a checkpoint's, a `COMMIT`'s on the writer connection); after one, the database
/// file is refused writes until the process restarts (the disk refused a write: see the write
/// path's docs). Label `database`.
#[cfg(feature = "metrics")]
pub const WRITE_SYNC_ERRORS: &str = "tower_sqlite_retry_write_sync_errors_total";

/// Counter: write transactions that failed, by the step that failed. Labels `database`,
/// `stage` (`turn`, `begin`, `commit`, `sync`, `rollback`: see the module docs).
#[cfg(feature = "metrics")]
pub const WRITE_ERRORS: &str = "tower_sqlite_retry_write_errors_total";

/// Gauge: write transactions waiting for their database's turn now. Label `database`.
#[cfg(feature = "metrics")]
pub const WRITE_WAITING: &str = "tower_sqlite_retry_write_waiting";

/// Suggested bucket bounds for [`ATTEMPTS`]: every count up to 6, then wider, up to the
/// example app's 32-attempt write route.
#[cfg(feature = "metrics")]
pub const ATTEMPTS_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 13.0, 16.0, 20.0, 32.0,
];

/// Suggested bucket bounds for [`BACKOFF`], [`QUEUE_WAIT`], [`WRITE_WAIT`] and
/// [`WRITE_HELD`], in seconds: from half a millisecond (a first backoff is about 2 ms by
/// default, a write transaction takes 0.1 to 1 ms) to the default 10 s deadline.
#[cfg(feature = "metrics")]
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[cfg(feature = "metrics")]
mod emit {
    use std::sync::Arc;
    use std::time::Duration;

    use http::Method;
    use metrics::{Label, Unit};

    use super::{
        ADMISSION_LIMIT, ATTEMPTS, BACKOFF, BUFFERED_BYTES, QUEUE_WAIT, REPLAYS, REQUESTS,
        WRITE_ERRORS, WRITE_GROUP_HELD, WRITE_GROUP_MEMBERS, WRITE_HELD, WRITE_SYNC_ERRORS,
        WRITE_WAIT, WRITE_WAITING, WriteStage,
    };
    use crate::route::Route;

    const ROUTE: &str = "http_route";
    const METHOD: &str = "http_request_method";
    const OUTCOME: &str = "outcome";
    const ERROR_TYPE: &str = "error_type";
    const DATABASE: &str = "database";
    const STAGE: &str = "stage";
    const OPERATION: &str = "operation";
    /// `http_route` when no route template is known; `database` when no database is.
    const NO_ROUTE: &str = "_unknown";

    pub(crate) fn describe() {
        {
            metrics::describe_counter!(
                REQUESTS,
                Unit::Count,
                "Requests the retry layer finished, by outcome (and error_type when they ended \
                 on a retryable error)."
            );
            metrics::describe_counter!(
                REPLAYS,
                Unit::Count,
                "Replays started (attempts after the first), by the retryable error that \
                 caused each."
            );
            metrics::describe_histogram!(
                ATTEMPTS,
                Unit::Count,
                "Attempts per finished request, the first included."
            );
            metrics::describe_histogram!(
                BACKOFF,
                Unit::Seconds,
                "Time a finished request slept in backoff between its attempts."
            );
            metrics::describe_histogram!(
                QUEUE_WAIT,
                Unit::Seconds,
                "Time an attempt waited for a writer-admission slot and the replay gate, one sample \
                 per queued attempt (waits ended by the deadline or a cancel included)."
            );
            metrics::describe_gauge!(
                ADMISSION_LIMIT,
                Unit::Count,
                "An operation's admission limit: tries it lets run at once (0: none, it has not \
                 met contention or its limit went away after a quiet time)."
            );
            metrics::describe_gauge!(
                BUFFERED_BYTES,
                Unit::Bytes,
                "Request-body bytes held for replay, all retry layers together."
            );
            metrics::describe_histogram!(
                WRITE_WAIT,
                Unit::Seconds,
                "Time a write transaction waited for its database's write turn (0 when free)."
            );
            metrics::describe_histogram!(
                WRITE_HELD,
                Unit::Seconds,
                "Time a write transaction held its database's write turn; the rate of the sum, \
                 by database, is the writer's utilization (1.0: the database at its write limit)."
            );
            metrics::describe_histogram!(
                WRITE_GROUP_MEMBERS,
                Unit::Count,
                "Write transactions made durable by one shared fsync of the WAL (group commit)."
            );
            metrics::describe_histogram!(
                WRITE_GROUP_HELD,
                Unit::Seconds,
                "Time one shared fsync of the WAL took (group commit)."
            );
            metrics::describe_counter!(
                WRITE_SYNC_ERRORS,
                Unit::Count,
                "Syncs of the WAL that failed while group commit shared its fsync; each stopped \
                 group commit for its pool (the disk refused a write)."
            );
            metrics::describe_counter!(
                WRITE_ERRORS,
                Unit::Count,
                "Write transactions that failed, by the step that failed (stage: turn, begin, \
                 commit, sync, rollback)."
            );
            metrics::describe_gauge!(
                WRITE_WAITING,
                Unit::Count,
                "Write transactions waiting for their database's write turn now."
            );
        }
    }

    /// The route label. Its value is shared (one allocation) by the metrics of one call.
    fn route(route: Option<&str>) -> Label {
        match route {
            Some(route) => Label::new(ROUTE, Arc::<str>::from(route)),
            None => Label::from_static_parts(ROUTE, NO_ROUTE),
        }
    }

    /// The method label: the nine methods of RFC 9110 and RFC 5789, `_OTHER` for the rest.
    fn method(method: &Method) -> Label {
        let name = match method.as_str() {
            "GET" => "GET",
            "HEAD" => "HEAD",
            "POST" => "POST",
            "PUT" => "PUT",
            "DELETE" => "DELETE",
            "CONNECT" => "CONNECT",
            "OPTIONS" => "OPTIONS",
            "TRACE" => "TRACE",
            "PATCH" => "PATCH",
            _ => "_OTHER",
        };
        Label::from_static_parts(METHOD, name)
    }

    pub(crate) fn request_finished(finished: super::Finished<'_>) {
        let super::Finished {
            route: route_,
            method: method_,
            outcome,
            error_type,
            attempts,
            backoff,
        } = finished;
        let route = route(route_);
        let method = method(method_);
        let mut labels = Vec::with_capacity(4);
        labels.push(route.clone());
        labels.push(method.clone());
        labels.push(Label::from_static_parts(OUTCOME, outcome.as_str()));
        if let Some(error_type) = error_type {
            labels.push(Label::new(ERROR_TYPE, error_type.to_owned()));
        }
        metrics::counter!(REQUESTS, labels).increment(1);
        metrics::histogram!(ATTEMPTS, vec![route.clone(), method.clone()])
            .record(f64::from(attempts));
        metrics::histogram!(BACKOFF, vec![route, method]).record(backoff);
    }

    pub(crate) fn replay(route_: Option<&str>, method_: &Method, error_type: &str) {
        let labels = vec![
            route(route_),
            method(method_),
            Label::new(ERROR_TYPE, error_type.to_owned()),
        ];
        metrics::counter!(REPLAYS, labels).increment(1);
    }

    pub(crate) fn queue_wait(route_: Option<&str>, method_: &Method, waited: Duration) {
        metrics::histogram!(QUEUE_WAIT, vec![route(route_), method(method_)]).record(waited);
    }

    /// An operation outside HTTP (`crate::operation`) finished: the layer's metrics, labelled
    /// `operation` where a request has `http_route` and `http_request_method`.
    pub(crate) fn operation_finished(finished: super::OperationFinished<'_>) {
        let super::OperationFinished {
            operation,
            outcome,
            error_type,
            attempts,
            backoff,
        } = finished;
        let name = Label::new(OPERATION, operation.to_owned());
        let mut labels = Vec::with_capacity(3);
        labels.push(name.clone());
        labels.push(Label::from_static_parts(OUTCOME, outcome.as_str()));
        if let Some(error_type) = error_type {
            labels.push(Label::new(ERROR_TYPE, error_type.to_owned()));
        }
        metrics::counter!(REQUESTS, labels).increment(1);
        metrics::histogram!(ATTEMPTS, vec![name.clone()]).record(f64::from(attempts));
        metrics::histogram!(BACKOFF, vec![name]).record(backoff);
    }

    /// A try of an operation outside HTTP waited for its admission slot.
    pub(crate) fn operation_queue_wait(operation: &str, waited: Duration) {
        let labels = vec![Label::new(OPERATION, operation.to_owned())];
        metrics::histogram!(QUEUE_WAIT, labels).record(waited);
    }

    /// An operation's admission limit moved (0: it has none).
    pub(crate) fn operation_admission_limit(operation: &str, limit: u32) {
        let labels = vec![Label::new(OPERATION, operation.to_owned())];
        metrics::gauge!(ADMISSION_LIMIT, labels).set(f64::from(limit));
    }

    /// A retry of an operation outside HTTP.
    pub(crate) fn operation_retry(operation: &str, error_type: &str) {
        let labels = vec![
            Label::new(OPERATION, operation.to_owned()),
            Label::new(ERROR_TYPE, error_type.to_owned()),
        ];
        metrics::counter!(REPLAYS, labels).increment(1);
    }

    /// The route and method labels of a write transaction: its request's, or `_unknown` and
    /// `_OTHER` outside a request (the write path used without the layer).
    fn write_labels(route_: Option<&Route>) -> [Label; 2] {
        match route_ {
            Some(r) => [route(r.path()), method(&r.method)],
            None => [
                Label::from_static_parts(ROUTE, NO_ROUTE),
                Label::from_static_parts(METHOD, "_OTHER"),
            ],
        }
    }

    pub(crate) fn write_wait(route_: Option<&Route>, database: &Arc<str>, waited: Duration) {
        let [route, method] = write_labels(route_);
        let labels = vec![route, method, Label::new(DATABASE, Arc::clone(database))];
        metrics::histogram!(WRITE_WAIT, labels).record(waited);
    }

    pub(crate) fn write_held(route_: Option<&Route>, database: &Arc<str>, held: Duration) {
        let [route, method] = write_labels(route_);
        let labels = vec![route, method, Label::new(DATABASE, Arc::clone(database))];
        metrics::histogram!(WRITE_HELD, labels).record(held);
    }

    pub(crate) fn write_group(database: &Arc<str>, members: usize, held: Duration) {
        let labels = vec![Label::new(DATABASE, Arc::clone(database))];
        metrics::histogram!(WRITE_GROUP_MEMBERS, labels.clone()).record(members as f64);
        metrics::histogram!(WRITE_GROUP_HELD, labels).record(held);
    }

    pub(crate) fn write_error(database: Option<&Arc<str>>, stage: WriteStage) {
        let database = match database {
            Some(database) => Label::new(DATABASE, Arc::clone(database)),
            None => Label::from_static_parts(DATABASE, NO_ROUTE),
        };
        let labels = vec![database, Label::from_static_parts(STAGE, stage.as_str())];
        metrics::counter!(WRITE_ERRORS, labels).increment(1);
    }

    pub(crate) fn write_sync_failed(database: &Arc<str>) {
        let labels = vec![Label::new(DATABASE, Arc::clone(database))];
        metrics::counter!(WRITE_SYNC_ERRORS, labels).increment(1);
    }

    pub(crate) fn write_waiting(database: &Arc<str>, delta: i8) {
        let gauge = metrics::gauge!(
            WRITE_WAITING,
            vec![Label::new(DATABASE, Arc::clone(database))]
        );
        if delta > 0 {
            gauge.increment(f64::from(delta));
        } else {
            gauge.decrement(f64::from(-delta));
        }
    }

    pub(crate) fn buffered_bytes(delta: isize) {
        let gauge = metrics::gauge!(BUFFERED_BYTES);
        // Exact in an f64 up to 2^53 bytes.
        let amount = delta.unsigned_abs() as f64;
        match delta {
            0 => {}
            1.. => gauge.increment(amount),
            _ => gauge.decrement(amount),
        }
    }
}

/// Describes every metric (name, unit, help text) to the recorder installed now, once per
/// process. Called when a layer is built.
#[inline]
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    emit::describe();
}

/// A request the layer finished, as its metrics see it.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Finished<'a> {
    pub(crate) route: Option<&'a str>,
    pub(crate) method: &'a Method,
    pub(crate) outcome: Outcome,
    /// The retryable error's name, when the request ended on one.
    pub(crate) error_type: Option<&'a str>,
    pub(crate) attempts: u32,
    /// The time it spent in backoff.
    pub(crate) backoff: Duration,
}

/// A request the layer finished: counts it by outcome, records its attempts and the time it
/// spent in backoff.
#[inline]
pub(crate) fn request_finished(finished: Finished<'_>) {
    #[cfg(feature = "metrics")]
    emit::request_finished(finished);
    #[cfg(not(feature = "metrics"))]
    let _ = finished;
}

/// A replay decided, after a retryable error named `error_type`.
#[inline]
pub(crate) fn replay(route: Option<&str>, method: &Method, error_type: &str) {
    #[cfg(feature = "metrics")]
    emit::replay(route, method, error_type);
    #[cfg(not(feature = "metrics"))]
    let _ = (route, method, error_type);
}

/// An operation outside HTTP finished, as its metrics see it.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct OperationFinished<'a> {
    pub(crate) operation: &'a str,
    pub(crate) outcome: Outcome,
    /// The retryable error's name, when the operation ended on one.
    pub(crate) error_type: Option<&'a str>,
    pub(crate) attempts: u32,
    /// The time it spent in backoff.
    pub(crate) backoff: Duration,
}

/// An operation outside HTTP finished (a call, a tower request, a loop's streak).
#[inline]
pub(crate) fn operation_finished(finished: OperationFinished<'_>) {
    #[cfg(feature = "metrics")]
    emit::operation_finished(finished);
    #[cfg(not(feature = "metrics"))]
    let _ = finished;
}

/// A try of an operation outside HTTP waited `waited` for its admission slot.
#[inline]
pub(crate) fn operation_queue_wait(operation: &str, waited: Duration) {
    #[cfg(feature = "metrics")]
    emit::operation_queue_wait(operation, waited);
    #[cfg(not(feature = "metrics"))]
    let _ = (operation, waited);
}

/// A retry of an operation outside HTTP, after a retryable error named `error_type`.
#[inline]
pub(crate) fn operation_retry(operation: &str, error_type: &str) {
    #[cfg(feature = "metrics")]
    emit::operation_retry(operation, error_type);
    #[cfg(not(feature = "metrics"))]
    let _ = (operation, error_type);
}

/// An operation's admission limit is now `limit` (0: none).
#[inline]
pub(crate) fn operation_admission_limit(operation: &str, limit: u32) {
    #[cfg(feature = "metrics")]
    emit::operation_admission_limit(operation, limit);
    #[cfg(not(feature = "metrics"))]
    let _ = (operation, limit);
}

/// The time an attempt waited for admission and the replay gate, once per queued attempt.
#[inline]
pub(crate) fn queue_wait(route: Option<&str>, method: &Method, waited: Duration) {
    #[cfg(feature = "metrics")]
    emit::queue_wait(route, method, waited);
    #[cfg(not(feature = "metrics"))]
    let _ = (route, method, waited);
}

/// A write transaction took `database`'s turn after waiting `waited`.
#[inline]
pub(crate) fn write_wait(
    route: Option<&crate::route::Route>,
    database: &std::sync::Arc<str>,
    waited: Duration,
) {
    #[cfg(feature = "metrics")]
    emit::write_wait(route, database, waited);
    #[cfg(not(feature = "metrics"))]
    let _ = (route, database, waited);
}

/// The step of a write transaction that failed: the `stage` label of
/// `tower_sqlite_retry_write_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteStage {
    /// No turn: the wait ended at its bound, or the request already held it.
    Turn,
    /// The turn, but no transaction: the connection, or `BEGIN IMMEDIATE`, failed.
    Begin,
    /// `COMMIT` failed or was refused (rolled back), or a savepoint was left open.
    Commit,
    /// Committed, but group commit's fsync failed for it: not known durable.
    Sync,
    /// An explicit rollback failed.
    Rollback,
}

impl WriteStage {
    /// Every stage, in the order of a transaction's life.
    #[cfg_attr(not(all(test, feature = "metrics")), allow(dead_code))]
    pub(crate) const ALL: [WriteStage; 5] = [
        WriteStage::Turn,
        WriteStage::Begin,
        WriteStage::Commit,
        WriteStage::Sync,
        WriteStage::Rollback,
    ];

    /// The label's value.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WriteStage::Turn => "turn",
            WriteStage::Begin => "begin",
            WriteStage::Commit => "commit",
            WriteStage::Sync => "sync",
            WriteStage::Rollback => "rollback",
        }
    }
}

/// A write transaction of `database` (`None`: not known yet) failed at `stage`.
#[inline]
pub(crate) fn write_error(database: Option<&std::sync::Arc<str>>, stage: WriteStage) {
    #[cfg(feature = "metrics")]
    emit::write_error(database, stage);
    #[cfg(not(feature = "metrics"))]
    let _ = (database, stage);
}

/// A write transaction held its database's turn for `held`.
#[inline]
pub(crate) fn write_held(
    route: Option<&crate::route::Route>,
    database: &std::sync::Arc<str>,
    held: Duration,
) {
    #[cfg(feature = "metrics")]
    emit::write_held(route, database, held);
    #[cfg(not(feature = "metrics"))]
    let _ = (route, database, held);
}

/// One more (`1`) or one fewer (`-1`) write transaction waiting for `database`'s turn.
#[inline]
pub(crate) fn write_waiting(database: &std::sync::Arc<str>, delta: i8) {
    #[cfg(feature = "metrics")]
    emit::write_waiting(database, delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (database, delta);
}

/// Group commit ran an fsync of the WAL for `members` write transactions; it took `held`.
#[inline]
pub(crate) fn write_group(database: &std::sync::Arc<str>, members: usize, held: Duration) {
    #[cfg(feature = "metrics")]
    emit::write_group(database, members, held);
    #[cfg(not(feature = "metrics"))]
    let _ = (database, members, held);
}

/// Group commit stopped for a pool of `database`: a sync of its WAL failed.
#[inline]
pub(crate) fn write_sync_failed(database: &std::sync::Arc<str>) {
    #[cfg(feature = "metrics")]
    emit::write_sync_failed(database);
    #[cfg(not(feature = "metrics"))]
    let _ = database;
}

/// Bytes buffered for replay, all layers together: `delta` more (positive) or fewer.
#[inline]
pub(crate) fn buffered_bytes(delta: isize) {
    #[cfg(feature = "metrics")]
    emit::buffered_bytes(delta);
    #[cfg(not(feature = "metrics"))]
    let _ = delta;
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::time::Duration;

    use http::Method;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use crate::attempt::Outcome;

    /// The labels of every series emitted by `f`, as `name{k=v,...}`, with the values.
    fn emitted(f: impl FnOnce()) -> Vec<(String, DebugValue)> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, f);
        let mut out: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let labels: Vec<_> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (format!("{}{{{}}}", key.name(), labels.join(",")), value)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The docs list every outcome the code emits, and call none of them uncounted.
    #[test]
    fn the_docs_name_every_outcome() {
        let source = include_str!("metrics/recorder.rs");
        let start = source.find("//! - `outcome`:").unwrap();
        let end = start + source[start..].find("//! - `error_type`:").unwrap();
        for outcome in crate::attempt::Outcome::ALL {
            let name = format!("`{}`", outcome.as_str());
            assert!(source[start..end].contains(&name), "{name} missing");
        }
        assert!(!source.contains(concat!("is not", " counted")));
    }

    /// The docs list every stage of the write-errors counter, in the table and the labels.
    #[test]
    fn the_docs_name_every_write_stage() {
        let source = include_str!("metrics/recorder.rs");
        let start = source.find("//! - `stage`:").unwrap();
        let end = start + source[start..].find("//! - `error_type`:").unwrap();
        let row = source
            .lines()
            .find(|l| l.starts_with("//! | `tower_sqlite_retry_write_errors_total`"))
            .unwrap();
        for stage in super::WriteStage::ALL {
            let name = format!("`{}`", stage.as_str());
            assert!(source[start..end].contains(&name), "{name} missing");
            assert!(row.contains(&name), "{name} missing from the table");
        }
    }

    /// Every metric of the write path has the `database` label; a write error before the
    /// database is known is `_unknown`.
    #[test]
    fn write_metrics_carry_the_database() {
        use std::sync::Arc;

        use super::WriteStage;

        let db: Arc<str> = "app.db".into();
        let out = emitted(|| {
            super::write_wait(None, &db, Duration::from_millis(3));
            super::write_held(None, &db, Duration::from_millis(1));
            super::write_waiting(&db, 1);
            super::write_group(&db, 2, Duration::from_millis(1));
            super::write_sync_failed(&db);
            super::write_error(Some(&db), WriteStage::Sync);
            super::write_error(Some(&db), WriteStage::Sync);
            super::write_error(None, WriteStage::Begin);
        });
        let names: Vec<_> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tower_sqlite_retry_write_errors_total{database=_unknown,stage=begin}",
                "tower_sqlite_retry_write_errors_total{database=app.db,stage=sync}",
                "tower_sqlite_retry_write_group_held_seconds{database=app.db}",
                "tower_sqlite_retry_write_group_members{database=app.db}",
                "tower_sqlite_retry_write_held_seconds{http_route=_unknown,http_request_method=_OTHER,database=app.db}",
                "tower_sqlite_retry_write_sync_errors_total{database=app.db}",
                "tower_sqlite_retry_write_wait_seconds{http_route=_unknown,http_request_method=_OTHER,database=app.db}",
                "tower_sqlite_retry_write_waiting{database=app.db}",
            ]
        );
        assert_eq!(out[1].1, DebugValue::Counter(2));
    }

    #[test]
    fn unknown_routes_and_methods_get_fixed_label_values() {
        let purge = Method::from_bytes(b"PURGE").unwrap();
        let lower_get = Method::from_bytes(b"get").unwrap();
        let out = emitted(|| {
            super::replay(None, &purge, "SQLITE_BUSY");
            super::replay(Some("/a/{id}"), &lower_get, "SQLITE_BUSY");
            super::replay(Some("/a/{id}"), &Method::PATCH, "SQLITE_BUSY");
        });
        let names: Vec<_> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tower_sqlite_retry_replays_total{http_route=/a/{id},http_request_method=PATCH,error_type=SQLITE_BUSY}",
                "tower_sqlite_retry_replays_total{http_route=/a/{id},http_request_method=_OTHER,error_type=SQLITE_BUSY}",
                "tower_sqlite_retry_replays_total{http_route=_unknown,http_request_method=_OTHER,error_type=SQLITE_BUSY}",
            ]
        );
    }

    #[test]
    fn error_type_is_a_label_only_when_given() {
        let out = emitted(|| {
            let finished = |outcome, error_type| {
                super::request_finished(super::Finished {
                    route: Some("/a"),
                    method: &Method::POST,
                    outcome,
                    error_type,
                    attempts: 3,
                    backoff: Duration::from_millis(250),
                });
            };
            finished(Outcome::SucceededAfterRetry, None);
            finished(Outcome::Deadline, Some("SQLITE_BUSY_SNAPSHOT"));
        });
        let names: Vec<_> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tower_sqlite_retry_attempts{http_route=/a,http_request_method=POST}",
                "tower_sqlite_retry_backoff_seconds{http_route=/a,http_request_method=POST}",
                "tower_sqlite_retry_requests_total{http_route=/a,http_request_method=POST,outcome=deadline,error_type=SQLITE_BUSY_SNAPSHOT}",
                "tower_sqlite_retry_requests_total{http_route=/a,http_request_method=POST,outcome=succeeded_after_retry}",
            ]
        );
        let histogram =
            |xs: &[f64]| DebugValue::Histogram(xs.iter().map(|x| (*x).into()).collect());
        assert_eq!(out[0].1, histogram(&[3.0, 3.0]));
        assert_eq!(out[1].1, histogram(&[0.25, 0.25]));
    }

    /// An operation outside HTTP: the layer's names, labelled `operation` in place of the
    /// route and method, driven through a real `Operation` (a loop's streak and a give-up).
    #[test]
    fn operations_emit_the_layers_metrics_by_operation() {
        use crate::{Operation, RetryPolicy, Retryable};
        let out = emitted(|| {
            let op = Operation::new("claim", RetryPolicy::default().max_attempts(2));
            let mut backoff = op.backoff();
            let busy = || Some(Retryable::new("5", "SQLITE_BUSY"));
            assert!(backoff.next_delay_for(busy()).is_some());
            backoff.reset();
            assert!(backoff.next_delay_for(busy()).is_some());
            assert!(backoff.next_delay_for(busy()).is_none());
        });
        let names: Vec<_> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tower_sqlite_retry_admission_limit{operation=claim}",
                "tower_sqlite_retry_attempts{operation=claim}",
                "tower_sqlite_retry_backoff_seconds{operation=claim}",
                "tower_sqlite_retry_replays_total{operation=claim,error_type=SQLITE_BUSY}",
                "tower_sqlite_retry_requests_total{operation=claim,outcome=exhausted,error_type=SQLITE_BUSY}",
                "tower_sqlite_retry_requests_total{operation=claim,outcome=succeeded_after_retry}",
            ]
        );
        // the operation met contention: its admission limit (one try at once) is a gauge
        assert_eq!(out[0].1, DebugValue::Gauge(1.0.into()));
        assert_eq!(out[3].1, DebugValue::Counter(2));
        let histogram =
            |xs: &[f64]| DebugValue::Histogram(xs.iter().map(|x| (*x).into()).collect());
        assert_eq!(out[1].1, histogram(&[2.0, 2.0]));
    }

    /// An operation's limit that goes away after its quiet time sets the gauge to 0.
    #[test]
    fn an_operations_limit_gauge_goes_to_zero_when_it_decays() {
        use crate::{Operation, RetryPolicy, Retryable};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let out = emitted(|| {
            runtime.block_on(async {
                let op = Operation::new("claim", RetryPolicy::default());
                let mut backoff = op.backoff();
                assert!(
                    backoff
                        .next_delay_for(Some(Retryable::new("5", "SQLITE_BUSY")))
                        .is_some()
                );
                backoff.reset();
                tokio::time::advance(std::time::Duration::from_secs(10)).await;
                assert!(!backoff.admit().await.unwrap().is_held());
            })
        });
        let gauge = out
            .iter()
            .find(|(n, _)| n == "tower_sqlite_retry_admission_limit{operation=claim}")
            .unwrap();
        assert_eq!(gauge.1, DebugValue::Gauge(0.0.into()));
    }

    #[test]
    fn the_gauge_moves_both_ways() {
        let out = emitted(|| {
            super::buffered_bytes(1000);
            super::buffered_bytes(24);
            super::buffered_bytes(0);
            super::buffered_bytes(-1000);
        });
        assert_eq!(
            out,
            [(
                "tower_sqlite_retry_buffered_bytes{}".to_owned(),
                DebugValue::Gauge(24.0.into())
            )]
        );
    }
}
