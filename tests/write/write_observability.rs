//! The single writer, watched: the turn's counts (`WritePool::stats`, `WriteQueue::stats`), the
//! slow-transaction WARN, and, with the `metrics` feature, the write path's metrics, after real
//! write transactions on a real SQLite file over real HTTP.
//!
//! The runtime is tokio's current-thread one, so that the server, the client and the turn's
//! reports all run on the thread whose subscriber and recorder the tests install. Waits that
//! matter are made by a transaction the test holds, never by timing.

use crate::common;

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::{HttpClient, TestDb, capture_events, poll_until, serve};
use tower_sqlite_retry::write::WriteQueue;
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

/// Begins, inserts, holds the turn for `hold_ms`, commits.
async fn write(
    State(db): State<WritePool>,
    Path((hold_ms, id)): Path<(u64, i64)>,
) -> Result<StatusCode, DbError> {
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'x')")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

fn app(db: WritePool) -> Router {
    Router::new()
        .route("/items/{hold_ms}/{id}", post(write))
        .layer(SqliteRetryLayer::new(RetryPolicy::default()))
        .with_state(db)
}

#[tokio::test]
async fn the_turn_counts_its_waiters_its_transactions_and_its_busy_time() {
    let db = TestDb::new();
    let writes = WritePool::new(db.pool(2, Duration::from_secs(5)).await);
    assert!(writes.stats().is_none(), "no database asked yet");
    let held = writes.begin().await.unwrap();
    let start = writes.stats().expect("asked on the first begin");
    assert!(start.held);
    assert_eq!(start.waiting, 0);

    // Two writers wait behind the held transaction: the queue's length is 2.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let writes = writes.clone();
            tokio::spawn(async move { writes.begin().await.unwrap().commit().await.unwrap() })
        })
        .collect();
    poll_until("two writers waiting", async || {
        writes.stats().unwrap().waiting == 2
    })
    .await;
    // The same counts through the file's `WriteQueue`: one turn per database.
    let queue = WriteQueue::for_file(&db.path);
    assert_eq!(queue.stats().waiting, 2);

    tokio::time::sleep(Duration::from_millis(50)).await; // held at least this long
    held.commit().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let end = writes.stats().unwrap();
    assert_eq!(end.waiting, 0);
    assert!(!end.held);
    assert_eq!(end.transactions - start.transactions, 3);
    assert!(
        end.busy - start.busy >= Duration::from_millis(50),
        "{end:?}"
    );
    let utilization = end.utilization_since(&start);
    assert!(
        (0.0..=1.05).contains(&utilization),
        "utilization {utilization} (busy {:?} over {:?})",
        end.busy - start.busy,
        end.at - start.at
    );
}

/// A write transaction that holds the turn past the threshold is reported at WARN, with its
/// route template and method (never the raw path), at most once a second per database; the
/// next report says how many were left out. A pool with no threshold reports none.
#[tokio::test]
async fn a_slow_transaction_is_warned_at_most_once_a_second_with_its_route() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::from_secs(5)).await;
    let (capture, _guard) = capture_events();
    let slow = WritePool::new(pool.clone()).slow_transaction(Duration::from_millis(20));
    let server = serve(app(slow)).await;
    let client = HttpClient::new(server.addr);
    let start = std::time::Instant::now();
    for id in 0..5 {
        let reply = client.post(&format!("/items/30/{id}"), "").await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    // A second after the last WARN, the next one is written, with the count of those left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let reply = client.post("/items/30/5", "").await;
    assert_eq!(reply.status, StatusCode::CREATED);

    let warns = capture.with_message(
        "slow write transaction: it held the database's write turn past the threshold, and \
         every other writer waited",
    );
    // At most one a second: however slow the machine, the six slow transactions took
    // `elapsed`, in which the limit allows one WARN per started second (six would mean no
    // limit, on any machine that ran them within five seconds).
    let elapsed = start.elapsed();
    let allowed = elapsed.as_secs() as usize + 1;
    assert!(
        warns.len() >= 2 && warns.len() <= allowed,
        "one WARN a second at most ({allowed} in {elapsed:?}), then the next: {warns:?}"
    );
    let mut reported = 0;
    for warn in &warns {
        assert_eq!(warn["http.route"], "/items/{hold_ms}/{id}");
        assert_eq!(warn["http.request.method"], "POST");
        assert_eq!(warn["db.namespace"], "test.db");
        assert!(
            warn["db.write.held_ms"].parse::<f64>().unwrap() >= 20.0,
            "{warn:?}"
        );
        assert_eq!(warn["db.write.threshold_ms"], "20.0");
        reported += 1 + warn["db.write.suppressed"].parse::<u64>().unwrap();
        assert!(
            !warn.values().any(|v| v.contains("/items/30/")),
            "no raw path: {warn:?}"
        );
    }
    assert_eq!(
        reported, 6,
        "every slow transaction written or counted: {warns:?}"
    );

    // The same transactions with no threshold: no WARN.
    drop(server);
    let before = capture.events.lock().unwrap().len();
    let quiet = WritePool::new(pool).no_slow_transaction_report();
    let server = serve(app(quiet)).await;
    let reply = HttpClient::new(server.addr).post("/items/30/6", "").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let after = capture.events.lock().unwrap()[before..].to_vec();
    assert!(
        !after
            .iter()
            .any(|(m, _)| m.starts_with("slow write transaction")),
        "{after:?}"
    );
}

/// With the `metrics` feature: the wait for the turn and the time it was held, per route and
/// method (and database), and the queue's length, which goes back to 0.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_write_path_is_measured_per_route() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_sqlite_retry::metrics::recorder;

    let debugging = DebuggingRecorder::new();
    let snapshotter = debugging.snapshotter();
    let _local = metrics::set_default_local_recorder(&debugging);

    let db = TestDb::new();
    let writes = WritePool::new(db.pool(2, Duration::from_secs(5)).await);
    let server = serve(app(writes.clone())).await;
    let client = HttpClient::new(server.addr);
    // One writer waits behind a transaction the test holds; then two more run.
    let held = writes.begin().await.unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/items/0/1", "").await })
    };
    poll_until("a writer waiting", async || {
        writes.stats().unwrap().waiting == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    held.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap().status, StatusCode::CREATED);
    for id in 2..4 {
        assert_eq!(
            client.post(&format!("/items/0/{id}"), "").await.status,
            StatusCode::CREATED
        );
    }

    let snapshot = snapshotter.snapshot().into_vec();
    let series = |name: &str| {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .map(|(key, _, _, value)| {
                let labels: Vec<_> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (labels.join(","), value)
            })
            .collect::<Vec<_>>()
    };
    let samples = |value: &DebugValue| -> Vec<f64> {
        match value {
            DebugValue::Histogram(samples) => samples.iter().map(|s| s.into_inner()).collect(),
            other => panic!("not a histogram: {other:?}"),
        }
    };
    // The request's route; the test's own transaction (no request) is `_unknown`.
    let wait = series(recorder::WRITE_WAIT);
    let route = "http_route=/items/{hold_ms}/{id},http_request_method=POST";
    let waited: Vec<f64> = wait
        .iter()
        .filter(|(labels, _)| *labels == format!("{route},database=test.db"))
        .flat_map(|(_, v)| samples(v))
        .collect();
    assert_eq!(waited.len(), 3, "{wait:?}");
    assert!(
        waited.iter().any(|&w| w >= 0.02),
        "the queued one waited: {waited:?}"
    );
    let held_series = series(recorder::WRITE_HELD);
    let held: Vec<f64> = held_series
        .iter()
        .filter(|(labels, _)| *labels == format!("{route},database=test.db"))
        .flat_map(|(_, v)| samples(v))
        .collect();
    assert_eq!(held.len(), 3, "{held_series:?}");
    assert!(
        held_series.iter().any(|(labels, _)| labels
            == "http_route=_unknown,http_request_method=_OTHER,database=test.db"),
        "{held_series:?}"
    );
    let waiting = series(recorder::WRITE_WAITING);
    assert_eq!(
        waiting,
        [(
            "database=test.db".to_owned(),
            &DebugValue::Gauge(0.0.into())
        )],
        "the queue's length went back to 0"
    );
}
