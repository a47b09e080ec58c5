//! PostgreSQL, against the real server named by `TSR_POSTGRES_URL` (for example
//! `postgres://postgres@127.0.0.1:5432/test`), over real HTTP on loopback: a request whose
//! transaction meets `40001` serialization_failure (write skew under `SERIALIZABLE`) or
//! `40P01` deadlock_detected (rows locked in opposite orders) is replayed by the layer and
//! succeeds; without the layer it fails with `503`. The classifier is fed real driver errors.
//!
//! Without `TSR_POSTGRES_URL` every test prints that it is skipped and passes. Each test works
//! on tables of its own (unique names, dropped at the end), so tests run in parallel and reruns
//! on the same server do not collide. The recipes are driven by channels between the handler
//! and the test, never by sleeps.
#![cfg(feature = "postgres")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use http::StatusCode;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::sync::mpsc;
use tower_sqlite_retry::{
    Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer, classify, is_constraint_violation,
};
use tracing_subscriber::layer::SubscriberExt;

use common::{
    EventCapture, HttpClient, assert_no_db_detail, is_stale_table, serve, server_url, unique_table,
};

const VAR: &str = "TSR_POSTGRES_URL";

fn fast_policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .jitter(Jitter::Full)
}

fn sql(text: String) -> AssertSqlSafe<String> {
    AssertSqlSafe(text)
}

/// The server's pool and a table of this test's own, created by `schema` (`{t}` stands for
/// the table's name); `None` (skipped) without `TSR_POSTGRES_URL`.
struct Fixture {
    url: String,
    pool: PgPool,
    table: String,
}

impl Fixture {
    async fn new(test: &str, prefix: &str, schema: &str) -> Option<Self> {
        let url = server_url(VAR, test)?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{VAR}={url}: {e}"));
        sweep_stale_tables(&pool).await;
        let table = unique_table(prefix);
        sqlx::query(sql(format!("DROP TABLE IF EXISTS {table}")))
            .execute(&pool)
            .await
            .unwrap();
        for statement in schema.split(';').filter(|s| !s.trim().is_empty()) {
            sqlx::query(sql(statement.replace("{t}", &table)))
                .execute(&pool)
                .await
                .unwrap();
        }
        Some(Self { url, pool, table })
    }

    /// A connection of its own, outside the pool the app uses: the "other client".
    async fn connection(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.unwrap()
    }

    async fn drop_table(self) {
        sqlx::query(sql(format!("DROP TABLE IF EXISTS {}", self.table)))
            .execute(&self.pool)
            .await
            .unwrap();
        self.pool.close().await;
    }
}

/// Drops the tables that failed runs of these tests left behind (see `is_stale_table`).
async fn sweep_stale_tables(pool: &PgPool) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables \
         WHERE schemaname = current_schema() AND tablename LIKE 'tsr\\_pg\\_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for name in names.into_iter().filter(|n| is_stale_table(n)) {
        // Best effort: a table still locked by a dead session's transaction waits for later.
        let _ = sqlx::raw_sql(sql(format!(
            "SET lock_timeout = '1s'; DROP TABLE IF EXISTS {name}; RESET lock_timeout"
        )))
        .execute(pool)
        .await;
    }
}

/// What each attempt of a handler met: its number and the retryable code, if any.
type Calls = Arc<Mutex<Vec<(u32, Option<String>)>>>;

fn record(calls: &Calls, attempt: &Attempt, result: &Result<impl Sized, sqlx::Error>) {
    let code = result
        .as_ref()
        .err()
        .map(|e| classify(e).map_or_else(|| format!("other: {e}"), |r| r.code().to_owned()));
    calls.lock().unwrap().push((attempt.number(), code));
}

/// The channels of a paused first attempt: it says when it is ready, then waits for the go.
#[derive(Clone)]
struct Pause {
    ready: mpsc::UnboundedSender<()>,
    go: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>>,
}

impl Pause {
    fn new() -> (Self, mpsc::UnboundedReceiver<()>, mpsc::UnboundedSender<()>) {
        let (ready, ready_rx) = mpsc::unbounded_channel();
        let (go_tx, go) = mpsc::unbounded_channel();
        let pause = Self {
            ready,
            go: Arc::new(tokio::sync::Mutex::new(go)),
        };
        (pause, ready_rx, go_tx)
    }

    async fn here(&self) {
        self.ready.send(()).unwrap();
        self.go.lock().await.recv().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// 40001: write skew under SERIALIZABLE.

const SKEW_SCHEMA: &str = "CREATE TABLE {t} (k TEXT NOT NULL, v BIGINT NOT NULL)";

#[derive(Clone)]
struct SkewState {
    pool: PgPool,
    table: String,
    calls: Calls,
    pause: Pause,
}

/// `SERIALIZABLE`: counts the `x` rows, then inserts a `y` row carrying that count. Attempt 1
/// pauses between the read and the write, so the test can commit the mirror image (read `y`,
/// write `x`) in between: the two transactions form a write skew, and PostgreSQL fails this
/// one with `40001`.
async fn skew(State(s): State<SkewState>, attempt: Attempt) -> Result<impl IntoResponse, DbError> {
    let t = &s.table;
    let result = async {
        let mut tx = s
            .pool
            .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
            .await?;
        let xs: i64 = sqlx::query_scalar(sql(format!("SELECT COUNT(*) FROM {t} WHERE k = 'x'")))
            .fetch_one(&mut *tx)
            .await?;
        if attempt.number() == 1 {
            s.pause.here().await;
        }
        sqlx::query(sql(format!("INSERT INTO {t} (k, v) VALUES ('y', $1)")))
            .bind(xs)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(xs)
    }
    .await;
    record(&s.calls, &attempt, &result);
    Ok((StatusCode::CREATED, Json(result?)))
}

/// The other client's half of the write skew: reads `y`, writes `x`, commits.
async fn commit_mirror_image(conn: &mut PgConnection, t: &str) {
    let mut tx = conn
        .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .await
        .unwrap();
    let _: i64 = sqlx::query_scalar(sql(format!("SELECT COUNT(*) FROM {t} WHERE k = 'y'")))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sql(format!("INSERT INTO {t} (k, v) VALUES ('x', 0)")))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn skew_setup(
    test: &str,
) -> Option<(
    Fixture,
    SkewState,
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedSender<()>,
)> {
    let fx = Fixture::new(test, "tsr_pg_skew", SKEW_SCHEMA).await?;
    let (pause, ready, go) = Pause::new();
    let state = SkewState {
        pool: fx.pool.clone(),
        table: fx.table.clone(),
        calls: Calls::default(),
        pause,
    };
    Some((fx, state, ready, go))
}

async fn rows(pool: &PgPool, t: &str) -> Vec<(String, i64)> {
    sqlx::query_as(sql(format!("SELECT k, v FROM {t} ORDER BY k")))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn write_skew_serialization_failure_is_replayed_and_succeeds() {
    let Some((fx, state, mut ready, go)) =
        skew_setup("write_skew_serialization_failure_is_replayed_and_succeeds").await
    else {
        return;
    };
    let capture = EventCapture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let app = Router::new()
        .route("/skew", post(skew))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/skew", "").await });

    ready.recv().await.unwrap();
    commit_mirror_image(&mut fx.connection().await, &fx.table).await;
    go.send(()).unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    // The replay saw the other client's committed `x`.
    assert_eq!(reply.text(), "1");
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("40001".to_string())), (2, None)]
    );
    assert_eq!(
        rows(&fx.pool, &fx.table).await,
        vec![("x".into(), 0), ("y".into(), 1)],
        "the failed attempt committed nothing; the replay committed once"
    );
    let retries = capture.with_message("retrying request");
    assert_eq!(retries.len(), 1, "{:?}", capture.events.lock().unwrap());
    assert_eq!(retries[0]["db.response.status_code"], "40001");
    assert_eq!(retries[0]["error.type"], "serialization_failure");
    fx.drop_table().await;
}

#[tokio::test]
async fn write_skew_without_the_layer_fails_with_503() {
    let Some((fx, state, mut ready, go)) =
        skew_setup("write_skew_without_the_layer_fails_with_503").await
    else {
        return;
    };
    let app = Router::new()
        .route("/skew", post(skew))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/skew", "").await });

    ready.recv().await.unwrap();
    commit_mirror_image(&mut fx.connection().await, &fx.table).await;
    go.send(()).unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_no_db_detail(&reply.text());
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("40001".to_string()))]
    );
    assert_eq!(rows(&fx.pool, &fx.table).await, vec![("x".into(), 0)]);
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// 40P01: two transactions lock the same two rows in opposite orders.

const ROWS_SCHEMA: &str = "CREATE TABLE {t} (id INT PRIMARY KEY, v BIGINT NOT NULL);
    INSERT INTO {t} (id, v) VALUES (1, 0), (2, 0)";

#[derive(Clone)]
struct DeadlockState {
    pool: PgPool,
    table: String,
    calls: Calls,
    pause: Pause,
}

/// Updates row 1, then row 2, in one transaction. Its `deadlock_timeout` is short (100 ms)
/// and the other client's long, so when both wait on each other this is the transaction that
/// runs the deadlock check, finds the cycle and is cancelled with `40P01`: the victim is
/// known in advance. Attempt 1 pauses after locking row 1 until the other client waits for it.
async fn transfer(
    State(s): State<DeadlockState>,
    attempt: Attempt,
) -> Result<impl IntoResponse, DbError> {
    let t = &s.table;
    let result = async {
        let mut tx = s.pool.begin().await?;
        sqlx::query("SET LOCAL deadlock_timeout = '100ms'")
            .execute(&mut *tx)
            .await?;
        sqlx::query(sql(format!("UPDATE {t} SET v = v + 1 WHERE id = 1")))
            .execute(&mut *tx)
            .await?;
        if attempt.number() == 1 {
            s.pause.here().await;
        }
        sqlx::query(sql(format!("UPDATE {t} SET v = v + 1 WHERE id = 2")))
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
    .await;
    record(&s.calls, &attempt, &result);
    result?;
    Ok(StatusCode::NO_CONTENT)
}

/// The other client: locks row 2, then asks for row 1 (held by the handler) and waits. Returns
/// the task that finishes that update (once the handler's transaction is gone) and hands the
/// connection back, inside its open transaction.
async fn lock_in_opposite_order(fx: &Fixture) -> tokio::task::JoinHandle<PgConnection> {
    let mut conn = fx.connection().await;
    let t = fx.table.clone();
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query("SET LOCAL deadlock_timeout = '60s'")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(sql(format!("UPDATE {t} SET v = v + 10 WHERE id = 2")))
        .execute(&mut conn)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let blocked = tokio::spawn(async move {
        sqlx::query(sql(format!("UPDATE {t} SET v = v + 10 WHERE id = 1")))
            .execute(&mut conn)
            .await
            .unwrap();
        conn
    });
    wait_until_blocked(&fx.pool, pid).await;
    blocked
}

/// Polls the server until backend `pid` waits for a lock (a condition, not a guess at timing).
async fn wait_until_blocked(pool: &PgPool, pid: i32) {
    let start = Instant::now();
    loop {
        let blocked: bool = sqlx::query_scalar("SELECT cardinality(pg_blocking_pids($1)) > 0")
            .bind(pid)
            .fetch_one(pool)
            .await
            .unwrap();
        if blocked {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "backend {pid} never waited for the lock"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn deadlock_setup(
    test: &str,
) -> Option<(
    Fixture,
    DeadlockState,
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedSender<()>,
)> {
    let fx = Fixture::new(test, "tsr_pg_deadlock", ROWS_SCHEMA).await?;
    let (pause, ready, go) = Pause::new();
    let state = DeadlockState {
        pool: fx.pool.clone(),
        table: fx.table.clone(),
        calls: Calls::default(),
        pause,
    };
    Some((fx, state, ready, go))
}

async fn values(pool: &PgPool, t: &str) -> Vec<(i32, i64)> {
    sqlx::query_as(sql(format!("SELECT id, v FROM {t} ORDER BY id")))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn deadlock_victim_is_replayed_and_succeeds() {
    let Some((fx, state, mut ready, go)) =
        deadlock_setup("deadlock_victim_is_replayed_and_succeeds").await
    else {
        return;
    };
    let capture = EventCapture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let app = Router::new()
        .route("/transfer", post(transfer))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/transfer", "").await });

    ready.recv().await.unwrap();
    let other = lock_in_opposite_order(&fx).await;
    go.send(()).unwrap();
    // The handler's attempt 1 is cancelled; the other client gets row 1 and commits.
    let mut other = other.await.unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("40P01".to_string())), (2, None)]
    );
    // The other client's +10 on both rows, and the handler's +1 once.
    assert_eq!(values(&fx.pool, &fx.table).await, vec![(1, 11), (2, 11)]);
    let retries = capture.with_message("retrying request");
    assert_eq!(retries.len(), 1, "{:?}", capture.events.lock().unwrap());
    assert_eq!(retries[0]["db.response.status_code"], "40P01");
    assert_eq!(retries[0]["error.type"], "deadlock_detected");
    fx.drop_table().await;
}

#[tokio::test]
async fn deadlock_without_the_layer_fails_with_503() {
    let Some((fx, state, mut ready, go)) =
        deadlock_setup("deadlock_without_the_layer_fails_with_503").await
    else {
        return;
    };
    let app = Router::new()
        .route("/transfer", post(transfer))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/transfer", "").await });

    ready.recv().await.unwrap();
    let other = lock_in_opposite_order(&fx).await;
    go.send(()).unwrap();
    let mut other = other.await.unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_no_db_detail(&reply.text());
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("40P01".to_string()))]
    );
    assert_eq!(values(&fx.pool, &fx.table).await, vec![(1, 10), (2, 10)]);
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// What is not replayed: unique violations (409) and lock_not_available (500).

#[tokio::test]
async fn unique_violation_is_409_and_never_replayed() {
    let Some(fx) = Fixture::new(
        "unique_violation_is_409_and_never_replayed",
        "tsr_pg_unique",
        "CREATE TABLE {t} (seq BIGINT PRIMARY KEY)",
    )
    .await
    else {
        return;
    };
    #[derive(Clone)]
    struct S {
        pool: PgPool,
        table: String,
        calls: Calls,
    }
    async fn insert(State(s): State<S>, attempt: Attempt) -> Result<StatusCode, DbError> {
        let result = sqlx::query(sql(format!("INSERT INTO {} (seq) VALUES (1)", s.table)))
            .execute(&s.pool)
            .await;
        record(&s.calls, &attempt, &result);
        result?;
        Ok(StatusCode::CREATED)
    }
    let state = S {
        pool: fx.pool.clone(),
        table: fx.table.clone(),
        calls: Calls::default(),
    };
    let app = Router::new()
        .route("/items", post(insert))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);

    assert_eq!(client.post("/items", "").await.status, StatusCode::CREATED);
    let reply = client.post("/items", "").await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_no_db_detail(&reply.text());
    let calls = state.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "one call per request: {calls:?}");
    assert!(calls[1].1.as_deref().unwrap().starts_with("other: "));
    fx.drop_table().await;
}

#[tokio::test]
async fn lock_not_available_from_nowait_is_not_replayed() {
    let Some(fx) = Fixture::new(
        "lock_not_available_from_nowait_is_not_replayed",
        "tsr_pg_nowait",
        ROWS_SCHEMA,
    )
    .await
    else {
        return;
    };
    #[derive(Clone)]
    struct S {
        pool: PgPool,
        table: String,
        calls: Calls,
    }
    async fn claim(State(s): State<S>, attempt: Attempt) -> Result<StatusCode, DbError> {
        let result = async {
            let mut tx = s.pool.begin().await?;
            sqlx::query(sql(format!(
                "SELECT v FROM {} WHERE id = 1 FOR UPDATE NOWAIT",
                s.table
            )))
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        }
        .await;
        record(&s.calls, &attempt, &result);
        result?;
        Ok(StatusCode::OK)
    }
    let state = S {
        pool: fx.pool.clone(),
        table: fx.table.clone(),
        calls: Calls::default(),
    };
    let app = Router::new()
        .route("/claim", post(claim))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;

    let mut holder = fx.connection().await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query(sql(format!(
        "SELECT v FROM {} WHERE id = 1 FOR UPDATE",
        fx.table
    )))
    .execute(&mut *tx)
    .await
    .unwrap();

    let reply = HttpClient::new(server.addr).post("/claim", "").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_no_db_detail(&reply.text());
    let calls = state.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "NOWAIT asked to fail fast: {calls:?}");
    tx.rollback().await.unwrap();
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// The classifier and DbError, fed errors raised by the real server and decoded by the driver.

async fn raise(pool: &PgPool, sqlstate: &str) -> sqlx::Error {
    sqlx::raw_sql(sql(format!(
        "DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '{sqlstate}'; END $$"
    )))
    .execute(pool)
    .await
    .unwrap_err()
}

#[tokio::test]
async fn classifier_and_db_error_on_real_driver_errors() {
    let Some(fx) = Fixture::new(
        "classifier_and_db_error_on_real_driver_errors",
        "tsr_pg_classify",
        "CREATE TABLE {t} (seq BIGINT PRIMARY KEY, n BIGINT NOT NULL CHECK (n >= 0))",
    )
    .await
    else {
        return;
    };
    for (sqlstate, name) in [
        ("40001", "serialization_failure"),
        ("40P01", "deadlock_detected"),
    ] {
        let err = raise(&fx.pool, sqlstate).await;
        let marker = classify(&err).unwrap_or_else(|| panic!("{sqlstate}: {err}"));
        assert_eq!((marker.code(), marker.name()), (sqlstate, name));
        let res = DbError::from(err).into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{sqlstate}");
        assert_eq!(res.headers()["retry-after"], "1");
        assert!(
            res.extensions()
                .get::<tower_sqlite_retry::Retryable>()
                .is_some()
        );
    }
    for sqlstate in [
        "55P03", "40000", "40002", "40003", "57014", "53300", "XX000",
    ] {
        let err = raise(&fx.pool, sqlstate).await;
        assert!(classify(&err).is_none(), "{sqlstate}");
        assert!(!is_constraint_violation(&err), "{sqlstate}");
        let status = DbError::from(err).status();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{sqlstate}");
    }
    // Class 23, raised, and the real thing.
    for sqlstate in ["23505", "23503", "23502", "23514", "23P01", "23001"] {
        let err = raise(&fx.pool, sqlstate).await;
        assert!(classify(&err).is_none(), "{sqlstate}");
        assert!(is_constraint_violation(&err), "{sqlstate}");
        assert_eq!(
            DbError::from(err).status(),
            StatusCode::CONFLICT,
            "{sqlstate}"
        );
    }
    let t = &fx.table;
    sqlx::query(sql(format!("INSERT INTO {t} (seq, n) VALUES (1, 1)")))
        .execute(&fx.pool)
        .await
        .unwrap();
    for statement in [
        format!("INSERT INTO {t} (seq, n) VALUES (1, 1)"),
        format!("INSERT INTO {t} (seq, n) VALUES (2, -1)"),
        format!("INSERT INTO {t} (seq, n) VALUES (3, NULL)"),
    ] {
        let err = sqlx::query(sql(statement.clone()))
            .execute(&fx.pool)
            .await
            .unwrap_err();
        assert!(classify(&err).is_none(), "{statement}");
        assert!(is_constraint_violation(&err), "{statement}: {err}");
        assert_eq!(DbError::from(err).status(), StatusCode::CONFLICT);
    }
    let err = sqlx::query("SELECT * FROM tsr_no_such_table_anywhere")
        .execute(&fx.pool)
        .await
        .unwrap_err();
    assert!(classify(&err).is_none());
    assert_eq!(
        DbError::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    fx.drop_table().await;
}
