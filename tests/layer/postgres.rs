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

use crate::common;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use http::StatusCode;
use sqlx::postgres::{PgPool, Postgres};
use sqlx::{Connection, PgConnection};
use tower_sqlite_retry::{Attempt, DbError, DriverError, SqliteRetryLayer};

use common::{
    DbFixture, HttpClient, PausedState, TableState, assert_conflict_never_replayed,
    assert_no_db_detail, assert_one_retry, assert_service_unavailable, capture_events, fast_policy,
    poll_until, post_in_background, record, serve, sql,
};

const VAR: &str = "TSR_POSTGRES_URL";

type Fixture = DbFixture<Postgres>;

/// The server's pool and a table of this test's own, created by `schema` (`{t}` stands for
/// the table's name); `None` (skipped) without `TSR_POSTGRES_URL`.
async fn fixture(test: &str, prefix: &str, schema: &str) -> Option<Fixture> {
    Fixture::new(
        VAR,
        test,
        prefix,
        "SELECT tablename::text FROM pg_tables \
         WHERE schemaname = current_schema() AND tablename LIKE 'tsr\\_pg\\_%'",
        |name| format!("SET lock_timeout = '1s'; DROP TABLE IF EXISTS {name}; RESET lock_timeout"),
        |table| {
            schema
                .split(';')
                .filter(|s| !s.trim().is_empty())
                .map(|statement| statement.replace("{t}", table))
                .collect()
        },
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// 40001: write skew under SERIALIZABLE.

const SKEW_SCHEMA: &str = "CREATE TABLE {t} (k TEXT NOT NULL, v BIGINT NOT NULL)";

/// `SERIALIZABLE`: counts the `x` rows, then inserts a `y` row carrying that count. Attempt 1
/// pauses between the read and the write, so the test can commit the mirror image (read `y`,
/// write `x`) in between: the two transactions form a write skew, and PostgreSQL fails this
/// one with `40001`.
async fn skew(
    State(s): State<PausedState<PgPool>>,
    attempt: Attempt,
) -> Result<impl IntoResponse, DbError> {
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

async fn rows(pool: &PgPool, t: &str) -> Vec<(String, i64)> {
    sqlx::query_as(sql(format!("SELECT k, v FROM {t} ORDER BY k")))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn write_skew_serialization_failure_is_replayed_and_succeeds() {
    let Some(fx) = fixture(
        "write_skew_serialization_failure_is_replayed_and_succeeds",
        "tsr_pg_skew",
        SKEW_SCHEMA,
    )
    .await
    else {
        return;
    };
    let (state, mut ready, go) = fx.paused_state();
    let (capture, _guard) = capture_events();
    let app = Router::new()
        .route("/skew", post(skew))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let (_server, request) = post_in_background(app, "/skew").await;

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
    assert_one_retry(&capture, "40001", "serialization_failure");
    fx.drop_table().await;
}

#[tokio::test]
async fn write_skew_without_the_layer_fails_with_503() {
    let Some(fx) = fixture(
        "write_skew_without_the_layer_fails_with_503",
        "tsr_pg_skew",
        SKEW_SCHEMA,
    )
    .await
    else {
        return;
    };
    let (state, mut ready, go) = fx.paused_state();
    let app = Router::new()
        .route("/skew", post(skew))
        .with_state(state.clone());
    let (_server, request) = post_in_background(app, "/skew").await;

    ready.recv().await.unwrap();
    commit_mirror_image(&mut fx.connection().await, &fx.table).await;
    go.send(()).unwrap();

    let reply = request.await.unwrap();
    assert_service_unavailable(&reply);
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

/// Updates row 1, then row 2, in one transaction. Its `deadlock_timeout` is short (100 ms)
/// and the other client's long, so when both wait on each other this is the transaction that
/// runs the deadlock check, finds the cycle and is cancelled with `40P01`: the victim is
/// known in advance. Attempt 1 pauses after locking row 1 until the other client waits for it.
async fn transfer(
    State(s): State<PausedState<PgPool>>,
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
    poll_until(
        format!("backend {pid} never waited for the lock"),
        async || {
            sqlx::query_scalar("SELECT cardinality(pg_blocking_pids($1)) > 0")
                .bind(pid)
                .fetch_one(pool)
                .await
                .unwrap()
        },
    )
    .await;
}

async fn values(pool: &PgPool, t: &str) -> Vec<(i32, i64)> {
    sqlx::query_as(sql(format!("SELECT id, v FROM {t} ORDER BY id")))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn deadlock_victim_is_replayed_and_succeeds() {
    let Some(fx) = fixture(
        "deadlock_victim_is_replayed_and_succeeds",
        "tsr_pg_deadlock",
        ROWS_SCHEMA,
    )
    .await
    else {
        return;
    };
    let (state, mut ready, go) = fx.paused_state();
    let (capture, _guard) = capture_events();
    let app = Router::new()
        .route("/transfer", post(transfer))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let (_server, request) = post_in_background(app, "/transfer").await;

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
    assert_one_retry(&capture, "40P01", "deadlock_detected");
    fx.drop_table().await;
}

#[tokio::test]
async fn deadlock_without_the_layer_fails_with_503() {
    let Some(fx) = fixture(
        "deadlock_without_the_layer_fails_with_503",
        "tsr_pg_deadlock",
        ROWS_SCHEMA,
    )
    .await
    else {
        return;
    };
    let (state, mut ready, go) = fx.paused_state();
    let app = Router::new()
        .route("/transfer", post(transfer))
        .with_state(state.clone());
    let (_server, request) = post_in_background(app, "/transfer").await;

    ready.recv().await.unwrap();
    let other = lock_in_opposite_order(&fx).await;
    go.send(()).unwrap();
    let mut other = other.await.unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    let reply = request.await.unwrap();
    assert_service_unavailable(&reply);
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
    let Some(fx) = fixture(
        "unique_violation_is_409_and_never_replayed",
        "tsr_pg_unique",
        "CREATE TABLE {t} (seq BIGINT PRIMARY KEY)",
    )
    .await
    else {
        return;
    };
    type S = TableState<PgPool>;
    async fn insert(State(s): State<S>, attempt: Attempt) -> Result<StatusCode, DbError> {
        let result = sqlx::query(sql(format!("INSERT INTO {} (seq) VALUES (1)", s.table)))
            .execute(&s.pool)
            .await;
        record(&s.calls, &attempt, &result);
        result?;
        Ok(StatusCode::CREATED)
    }
    let state = fx.state();
    let app = Router::new()
        .route("/items", post(insert))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    assert_conflict_never_replayed(&client, &state.calls).await;
    fx.drop_table().await;
}

#[tokio::test]
async fn lock_not_available_from_nowait_is_not_replayed() {
    let Some(fx) = fixture(
        "lock_not_available_from_nowait_is_not_replayed",
        "tsr_pg_nowait",
        ROWS_SCHEMA,
    )
    .await
    else {
        return;
    };
    type S = TableState<PgPool>;
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
    let state = fx.state();
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

/// The conflict's event names the constraint PostgreSQL reports (sqlx's
/// `DatabaseError::constraint()`) and its table, with the code: what an operator needs,
/// without the message.
#[tokio::test]
async fn conflict_event_names_the_constraint() {
    let Some(fx) = fixture(
        "conflict_event_names_the_constraint",
        "tsr_pg_names",
        "CREATE TABLE {t} (seq BIGINT PRIMARY KEY, email TEXT UNIQUE)",
    )
    .await
    else {
        return;
    };
    let t = &fx.table;
    let insert = |seq: i64| {
        sqlx::query(sql(format!(
            "INSERT INTO {t} (seq, email) VALUES ({seq}, 'alice@example.com')"
        )))
        .execute(&fx.pool)
    };
    insert(1).await.unwrap();
    let err = insert(2).await.unwrap_err();
    let message = err.as_database_error().unwrap().message().to_owned();

    let (capture, guard) = capture_events();
    let res = DbError::from(err).into_response();
    drop(guard);
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let events = capture.with_message("db error (conflict)");
    assert_eq!(events.len(), 1, "{:?}", capture.events.lock().unwrap());
    assert_eq!(events[0]["db.response.status_code"], "23505");
    assert_eq!(events[0]["db.error.name"], "unique_violation");
    assert_eq!(events[0]["db.constraint"], format!("{t}_email_key"));
    assert_eq!(events[0]["db.table"], *t);
    assert!(
        !events[0].values().any(|v| v.contains(&message)),
        "{events:?}"
    );
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
    let Some(fx) = fixture(
        "classifier_and_db_error_on_real_driver_errors",
        "tsr_pg_classify",
        "CREATE TABLE {t} (seq BIGINT PRIMARY KEY, n BIGINT NOT NULL CHECK (n >= 0), \
         parent BIGINT REFERENCES {t} (seq), span int8range, \
         EXCLUDE USING gist (span WITH &&))",
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
        let marker = err
            .retryable()
            .unwrap_or_else(|| panic!("{sqlstate}: {err}"));
        assert_eq!((marker.code(), marker.name()), (sqlstate, name));
        let res = DbError::from(err).into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{sqlstate}");
        assert!(res.headers().get("retry-after").is_none());
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
        assert!(err.retryable().is_none(), "{sqlstate}");
        assert!(!err.is_constraint_violation(), "{sqlstate}");
        let status = DbError::from(err).status();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{sqlstate}");
    }
    // Class 23, raised, and the real thing: 409 for a conflict with other rows, 422 for the
    // request's own content.
    for (sqlstate, status) in [
        ("23505", StatusCode::CONFLICT),
        ("23503", StatusCode::CONFLICT),
        ("23P01", StatusCode::CONFLICT),
        ("23001", StatusCode::CONFLICT),
        ("23000", StatusCode::CONFLICT),
        ("23502", StatusCode::UNPROCESSABLE_ENTITY),
        ("23514", StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let err = raise(&fx.pool, sqlstate).await;
        assert!(err.retryable().is_none(), "{sqlstate}");
        assert!(err.is_constraint_violation(), "{sqlstate}");
        assert_eq!(DbError::from(err).status(), status, "{sqlstate}");
    }
    let t = &fx.table;
    sqlx::query(sql(format!(
        "INSERT INTO {t} (seq, n, span) VALUES (1, 1, '[1,10)')"
    )))
    .execute(&fx.pool)
    .await
    .unwrap();
    for (statement, code, status) in [
        (
            format!("INSERT INTO {t} (seq, n) VALUES (1, 1)"),
            "23505",
            StatusCode::CONFLICT,
        ),
        (
            format!("INSERT INTO {t} (seq, n, parent) VALUES (2, 1, 99)"),
            "23503",
            StatusCode::CONFLICT,
        ),
        (
            format!("INSERT INTO {t} (seq, n, span) VALUES (3, 1, '[5,20)')"),
            "23P01",
            StatusCode::CONFLICT,
        ),
        (
            format!("INSERT INTO {t} (seq, n) VALUES (4, -1)"),
            "23514",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            format!("INSERT INTO {t} (seq, n) VALUES (5, NULL)"),
            "23502",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let err = sqlx::query(sql(statement.clone()))
            .execute(&fx.pool)
            .await
            .unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some(code),
            "{statement}"
        );
        assert!(err.retryable().is_none(), "{statement}");
        assert!(err.is_constraint_violation(), "{statement}: {err}");
        assert_eq!(DbError::from(err).status(), status, "{statement}");
    }
    // A value of the wrong type is no constraint (class 22): the server's own binding, 500.
    let err = sqlx::query(sql(format!("INSERT INTO {t} (seq, n) VALUES ('abc', 1)")))
        .execute(&fx.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("22P02")
    );
    assert!(!err.is_constraint_violation());
    assert_eq!(
        DbError::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let err = sqlx::query("SELECT * FROM tsr_no_such_table_anywhere")
        .execute(&fx.pool)
        .await
        .unwrap_err();
    assert!(err.retryable().is_none());
    assert_eq!(
        DbError::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    fx.drop_table().await;
}
