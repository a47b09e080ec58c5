//! Replay over real HTTP against real SQLite files: deterministic BUSY and BUSY_SNAPSHOT,
//! exhaustion, constraints.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use http::StatusCode;
use sqlx::SqlitePool;
use tokio::sync::{mpsc, watch};
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer};

use common::{HttpClient, TestDb, assert_no_db_detail, serve};

fn fast_policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .jitter(Jitter::Full)
}

/// Each attempt's number and database error code.
type CallLog = Arc<Mutex<Vec<(u32, Option<String>)>>>;

#[derive(Clone)]
struct BusyState {
    pool: SqlitePool,
    calls: CallLog,
    failed: mpsc::UnboundedSender<u32>,
    released: watch::Receiver<bool>,
}

/// A write-only deferred transaction; records each attempt and its error code. Attempts
/// after the first wait until the test has released its lock, so the scenario does not
/// depend on timing.
async fn insert(
    State(s): State<BusyState>,
    attempt: Attempt,
    body: String,
) -> Result<StatusCode, DbError> {
    if attempt.is_replay() {
        let mut released = s.released.clone();
        released.wait_for(|r| *r).await.unwrap();
    }
    let result = async {
        let mut tx = s.pool.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, ?)")
            .bind(&body)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
    .await;
    let code = result.as_ref().err().and_then(|e| {
        e.as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
    });
    s.calls.lock().unwrap().push((attempt.number(), code));
    if let Err(e) = result {
        let _ = s.failed.send(attempt.number());
        return Err(e.into());
    }
    Ok(StatusCode::CREATED)
}

async fn busy_app(
    db: &TestDb,
    policy: RetryPolicy,
) -> (
    Router,
    BusyState,
    mpsc::UnboundedReceiver<u32>,
    watch::Sender<bool>,
) {
    let pool = db.pool(4, Duration::ZERO).await;
    let (failed, failed_rx) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let state = BusyState {
        pool,
        calls: Arc::default(),
        failed,
        released,
    };
    let app = Router::new()
        .route("/items", post(insert))
        .layer(SqliteRetryLayer::new(policy))
        .with_state(state.clone());
    (app, state, failed_rx, release)
}

#[tokio::test]
async fn busy_then_released_succeeds_on_attempt_two() {
    let db = TestDb::new();
    let (app, state, mut failed, release) = busy_app(&db, fast_policy(5)).await;
    let server = serve(app).await;
    let lock = db.hold_write_lock().await;

    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/items", "a").await });
    assert_eq!(failed.recv().await, Some(1), "attempt 1 must fail");
    lock.release().await;
    release.send(true).unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    let calls = state.calls.lock().unwrap().clone();
    assert_eq!(calls, vec![(1, Some("5".to_string())), (2, None)]);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&state.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn never_released_is_exhausted_after_max_attempts() {
    let db = TestDb::new();
    let (app, state, _failed, release) = busy_app(&db, fast_policy(4)).await;
    release.send(true).unwrap(); // replays run at once; the lock is what stays
    let server = serve(app).await;
    let lock = db.hold_write_lock().await;

    let reply = HttpClient::new(server.addr).post("/items", "a").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let after: u32 = reply.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&after), "Retry-After {after}: 1 to 3 s");
    assert_no_db_detail(&reply.text());
    let calls = state.calls.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        4,
        "exactly max_attempts handler calls: {calls:?}"
    );
    assert!(calls.iter().all(|(_, c)| c.as_deref() == Some("5")));
    assert_eq!(
        calls.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    lock.release().await;
}

#[tokio::test]
async fn without_the_layer_busy_fails_at_once() {
    let db = TestDb::new();
    let (_, state, _failed, release) = busy_app(&db, fast_policy(4)).await;
    release.send(true).unwrap();
    let app = Router::new()
        .route("/items", post(insert))
        .with_state(state.clone());
    let server = serve(app).await;
    let lock = db.hold_write_lock().await;
    let reply = HttpClient::new(server.addr).post("/items", "a").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(state.calls.lock().unwrap().len(), 1);
    lock.release().await;
}

#[derive(Clone)]
struct SnapshotState {
    pool: SqlitePool,
    codes: Arc<Mutex<Vec<Option<String>>>>,
    read_done: mpsc::UnboundedSender<()>,
    go_on: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>>,
}

/// Deferred read-then-write. On attempt 1 it pauses between the read and the write so the
/// test can commit a write from another connection: the write then meets BUSY_SNAPSHOT.
async fn read_then_write(
    State(s): State<SnapshotState>,
    attempt: Attempt,
    Json(name): Json<String>,
) -> Result<Json<i64>, DbError> {
    let result: Result<i64, sqlx::Error> = async {
        let mut tx = s.pool.begin().await?;
        let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
            .fetch_one(&mut *tx)
            .await?;
        if attempt.number() == 1 {
            s.read_done.send(()).unwrap();
            s.go_on.lock().await.recv().await.unwrap();
        }
        sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
            .bind(next)
            .bind(&name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(next)
    }
    .await;
    s.codes
        .lock()
        .unwrap()
        .push(result.as_ref().err().and_then(|e| {
            e.as_database_error()
                .and_then(|d| d.code())
                .map(|c| c.into_owned())
        }));
    Ok(Json(result?))
}

#[tokio::test]
async fn read_then_write_hit_by_busy_snapshot_is_replayed() {
    let db = TestDb::new();
    let pool = db.pool(4, Duration::from_secs(5)).await;
    let (read_done, mut read_rx) = mpsc::unbounded_channel();
    let (go, go_rx) = mpsc::unbounded_channel();
    let state = SnapshotState {
        pool: pool.clone(),
        codes: Arc::default(),
        read_done,
        go_on: Arc::new(tokio::sync::Mutex::new(go_rx)),
    };
    let app = Router::new()
        .route("/items", post(read_then_write))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/items", "\"mine\"").await });

    read_rx.recv().await.unwrap();
    sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'other')")
        .execute(&pool)
        .await
        .unwrap();
    go.send(()).unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.text(), "2");
    assert_eq!(
        state.codes.lock().unwrap().clone(),
        vec![Some("517".to_string()), None]
    );
    let names: Vec<(i64, String)> = sqlx::query_as("SELECT seq, name FROM items ORDER BY seq")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(names, vec![(1, "other".into()), (2, "mine".into())]);
}

#[tokio::test]
async fn constraint_violation_is_never_replayed() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::from_secs(5)).await;
    let calls = Arc::new(Mutex::new(0u32));
    let c = calls.clone();
    let app = Router::new()
        .route(
            "/items",
            post(move |State(pool): State<SqlitePool>| {
                let c = c.clone();
                async move {
                    *c.lock().unwrap() += 1;
                    sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'dup')")
                        .execute(&pool)
                        .await?;
                    Ok::<_, DbError>(StatusCode::CREATED)
                }
            }),
        )
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(pool);
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    assert_eq!(client.post("/items", "").await.status, StatusCode::CREATED);
    let reply = client.post("/items", "").await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_no_db_detail(&reply.text());
    assert_eq!(*calls.lock().unwrap(), 2, "one call per request, no replay");
}
