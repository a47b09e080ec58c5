//! MySQL/MariaDB, against the real server named by `TSR_MYSQL_URL` (for example
//! `mysql://root@127.0.0.1:3306/test`), over real HTTP on loopback: a request whose
//! transaction is the victim of an InnoDB deadlock (`1213`, rows locked in opposite orders) or
//! waits out `innodb_lock_wait_timeout` (`1205`) is replayed by the layer and succeeds; without
//! the layer it fails with `503`. The classifier is fed real driver errors.
//!
//! Without `TSR_MYSQL_URL` every test prints that it is skipped and passes. Each test works on
//! a table of its own (unique name, dropped at the end), so tests run in parallel and reruns on
//! the same server do not collide. The recipes are driven by channels between the handler and
//! the test, never by sleeps.
#![cfg(feature = "mysql")]

use crate::common;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use http::StatusCode;
use sqlx::MySqlConnection;
use sqlx::mysql::{MySql, MySqlPool};
use tokio::sync::{mpsc, watch};
use tower_sqlite_retry::{Attempt, DbError, DriverError, Retryable, SqliteRetryLayer};

use common::{
    Calls, DbFixture, HttpClient, PausedState, TableState, assert_conflict_never_replayed,
    assert_one_retry, assert_service_unavailable, capture_events, fast_policy, poll_until,
    post_in_background, record, serve, sql,
};

const VAR: &str = "TSR_MYSQL_URL";

type Fixture = DbFixture<MySql>;

/// The server's pool and a table of this test's own: `id INT PRIMARY KEY, v BIGINT` with rows
/// `1..=rows` at `v = 0`. `None` (skipped) without `TSR_MYSQL_URL`.
async fn fixture(test: &str, prefix: &str, rows: u32) -> Option<Fixture> {
    Fixture::new(
        VAR,
        test,
        prefix,
        "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'tsr\\_my\\_%'",
        |name| format!("DROP TABLE IF EXISTS {name}"),
        |table| {
            let mut statements = vec![format!(
                "CREATE TABLE {table} (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE = InnoDB"
            )];
            if rows > 0 {
                let values: Vec<String> = (1..=rows).map(|i| format!("({i}, 0)")).collect();
                statements.push(format!(
                    "INSERT INTO {table} (id, v) VALUES {}",
                    values.join(", ")
                ));
            }
            statements
        },
    )
    .await
}

impl Fixture {
    async fn values(&self) -> Vec<(i32, i64)> {
        sqlx::query_as(sql(format!(
            "SELECT id, v FROM {} WHERE id <= 2 ORDER BY id",
            self.table
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }
}

/// Runs a statement on the text protocol (`BEGIN`, `COMMIT`, `SET`: outside sqlx's own
/// transaction bookkeeping, so the connection can move into a task mid-transaction).
async fn exec(conn: &mut MySqlConnection, statement: String) {
    sqlx::raw_sql(sql(statement.clone()))
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// Polls the server until connection `id` is executing its `UPDATE` of row 1, which cannot
/// finish while the handler's transaction holds that row: a condition, not a guess at timing.
/// (Whether it has queued for the lock yet or is a moment away from it does not matter:
/// whichever request closes the cycle, InnoDB rolls back the lighter transaction, the
/// handler's. `PROCESSLIST` is live; `information_schema.INNODB_TRX` is not: MariaDB refreshes
/// it only when it has not been read for 100 ms, so tests polling it in parallel would never
/// see it change.)
async fn wait_until_blocked(pool: &MySqlPool, id: u64) {
    poll_until(
        format!("connection {id} never waited for the lock"),
        async || {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE ID = ? AND COMMAND <> 'Sleep' AND INFO LIKE 'UPDATE%'",
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
            waiting > 0
        },
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// 1213: two transactions lock the same two rows in opposite orders.

/// Updates row 1, then row 2, in one transaction. Attempt 1 pauses after locking row 1 until
/// the other client waits for it; its update of row 2 then closes the cycle, and InnoDB rolls
/// back the lighter transaction, this one (the other client has changed many more rows), with
/// `1213`.
async fn transfer(
    State(s): State<PausedState<MySqlPool>>,
    attempt: Attempt,
) -> Result<impl IntoResponse, DbError> {
    let t = &s.table;
    let result = async {
        let mut tx = s.pool.begin().await?;
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

/// The other client: changes rows 3.. (so it weighs more and is never the victim), locks
/// row 2, then asks for row 1 (held by the handler) and waits. Returns the task that finishes
/// that update (once the handler's transaction is rolled back) and hands the connection back,
/// inside its open transaction.
async fn lock_in_opposite_order(fx: &Fixture) -> tokio::task::JoinHandle<MySqlConnection> {
    let mut conn = fx.connection().await;
    let t = fx.table.clone();
    exec(&mut conn, "BEGIN".into()).await;
    exec(
        &mut conn,
        format!("UPDATE {t} SET v = v + 10 WHERE id >= 3"),
    )
    .await;
    exec(&mut conn, format!("UPDATE {t} SET v = v + 10 WHERE id = 2")).await;
    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let blocked = tokio::spawn(async move {
        exec(&mut conn, format!("UPDATE {t} SET v = v + 10 WHERE id = 1")).await;
        conn
    });
    wait_until_blocked(&fx.pool, id).await;
    blocked
}

#[tokio::test]
async fn deadlock_victim_is_replayed_and_succeeds() {
    let Some(fx) = fixture(
        "deadlock_victim_is_replayed_and_succeeds",
        "tsr_my_deadlock",
        20,
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
    // The handler's attempt 1 is rolled back; the other client gets row 1 and commits.
    let mut other = other.await.unwrap();
    exec(&mut other, "COMMIT".into()).await;

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("1213".to_string())), (2, None)]
    );
    // The other client's +10 on both rows, and the handler's +1 once.
    assert_eq!(fx.values().await, vec![(1, 11), (2, 11)]);
    assert_one_retry(&capture, "1213", "ER_LOCK_DEADLOCK");
    fx.drop_table().await;
}

#[tokio::test]
async fn deadlock_without_the_layer_fails_with_503() {
    let Some(fx) = fixture(
        "deadlock_without_the_layer_fails_with_503",
        "tsr_my_deadlock",
        20,
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
    exec(&mut other, "COMMIT".into()).await;

    let reply = request.await.unwrap();
    assert_service_unavailable(&reply);
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("1213".to_string()))]
    );
    assert_eq!(fx.values().await, vec![(1, 10), (2, 10)]);
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// 1205: a lock wait that outlasts innodb_lock_wait_timeout (set to its minimum, 1 s).

#[derive(Clone)]
struct TimeoutState {
    pool: MySqlPool,
    table: String,
    calls: Calls,
    failed: mpsc::UnboundedSender<u32>,
    released: watch::Receiver<bool>,
}

/// Updates row 1 with a 1 s lock wait timeout. Attempts after the first wait until the test
/// has released its lock, so the scenario does not depend on timing.
async fn bump(State(s): State<TimeoutState>, attempt: Attempt) -> Result<StatusCode, DbError> {
    if attempt.is_replay() {
        s.released.clone().wait_for(|r| *r).await.unwrap();
    }
    let result = async {
        let mut tx = s.pool.begin().await?;
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
            .execute(&mut *tx)
            .await?;
        sqlx::query(sql(format!(
            "UPDATE {} SET v = v + 1 WHERE id = 1",
            s.table
        )))
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }
    .await;
    record(&s.calls, &attempt, &result);
    if let Err(e) = result {
        let _ = s.failed.send(attempt.number());
        return Err(e.into());
    }
    Ok(StatusCode::NO_CONTENT)
}

#[tokio::test]
async fn lock_wait_timeout_is_replayed_and_succeeds() {
    let Some(fx) = fixture(
        "lock_wait_timeout_is_replayed_and_succeeds",
        "tsr_my_timeout",
        1,
    )
    .await
    else {
        return;
    };
    let (failed, mut failed_rx) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let state = TimeoutState {
        pool: fx.pool.clone(),
        table: fx.table.clone(),
        calls: Calls::default(),
        failed,
        released,
    };
    let app = Router::new()
        .route("/bump", post(bump))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let server = serve(app).await;

    let mut holder = fx.connection().await;
    exec(&mut holder, "BEGIN".into()).await;
    exec(
        &mut holder,
        format!("UPDATE {} SET v = v + 10 WHERE id = 1", fx.table),
    )
    .await;

    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/bump", "").await });
    assert_eq!(failed_rx.recv().await, Some(1), "attempt 1 must time out");
    exec(&mut holder, "COMMIT".into()).await;
    release.send(true).unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("1205".to_string())), (2, None)]
    );
    assert_eq!(fx.values().await, vec![(1, 11)]);
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// 1020: MariaDB's snapshot isolation (`innodb_snapshot_isolation`, on by default from 11.6.2).

/// Turns MariaDB's snapshot isolation on for this session; `false` (the caller skips, after
/// saying so) when the server has no such variable (MySQL, MariaDB before it existed).
async fn snapshot_isolation_on(conn: &mut MySqlConnection, test: &str) -> bool {
    match sqlx::raw_sql("SET SESSION innodb_snapshot_isolation = ON")
        .execute(conn)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            common::skipped(
                test,
                &format!("the server has no innodb_snapshot_isolation ({e})"),
            );
            false
        }
    }
}

/// A read-modify-write increment of row 1 in one `REPEATABLE READ` transaction, with
/// `innodb_snapshot_isolation` on: reads `v` (the read view), writes `v + 1`. With `pause`,
/// attempt 1 waits between the read and the write, for the test to commit a change of the row.
async fn increment(
    pool: &MySqlPool,
    table: &str,
    pause: Option<&common::Pause>,
) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sqlx::raw_sql("SET SESSION innodb_snapshot_isolation = ON")
        .execute(&mut *conn)
        .await?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let v: i64 = sqlx::query_scalar(sql(format!("SELECT v FROM {table} WHERE id = 1")))
        .fetch_one(&mut *tx)
        .await?;
    if let Some(pause) = pause {
        pause.here().await;
    }
    sqlx::query(sql(format!("UPDATE {table} SET v = ? WHERE id = 1")))
        .bind(v + 1)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

async fn counter(
    State(s): State<PausedState<MySqlPool>>,
    attempt: Attempt,
) -> Result<StatusCode, DbError> {
    let pause = (attempt.number() == 1).then_some(&s.pause);
    let result = increment(&s.pool, &s.table, pause).await;
    record(&s.calls, &attempt, &result);
    result?;
    Ok(StatusCode::NO_CONTENT)
}

/// The row changes between attempt 1's read and its write (another client commits `+10`):
/// MariaDB answers `1020` and rolls the transaction back; the layer replays it on a fresh
/// snapshot, which reads 10 and writes 11. Before `1020` was retryable this answered `500` and
/// the increment was lost.
#[tokio::test]
async fn snapshot_isolation_conflict_is_replayed_and_succeeds() {
    const TEST: &str = "snapshot_isolation_conflict_is_replayed_and_succeeds";
    let Some(fx) = fixture(TEST, "tsr_my_snapshot", 1).await else {
        return;
    };
    let mut other = fx.connection().await;
    if !snapshot_isolation_on(&mut other, TEST).await {
        fx.drop_table().await;
        return;
    }
    let (state, mut ready, go) = fx.paused_state();
    let app = Router::new()
        .route("/count", post(counter))
        .layer(SqliteRetryLayer::new(fast_policy(5)))
        .with_state(state.clone());
    let (_server, request) = post_in_background(app, "/count").await;

    ready.recv().await.unwrap();
    exec(
        &mut other,
        format!("UPDATE {} SET v = v + 10 WHERE id = 1", fx.table),
    )
    .await;
    go.send(()).unwrap();

    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert_eq!(
        state.calls.lock().unwrap().clone(),
        vec![(1, Some("1020".to_string())), (2, None)]
    );
    assert_eq!(fx.values().await, vec![(1, 11)]);
    fx.drop_table().await;
}

/// The reproduction: many concurrent read-modify-write increments of one counter, with
/// snapshot isolation on. Every conflict is a `1020`; with the layer each is replayed, so every
/// request succeeds and the counter counts every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_isolation_counter_loses_nothing_under_concurrency() {
    const TEST: &str = "snapshot_isolation_counter_loses_nothing_under_concurrency";
    const REQUESTS: usize = 64;
    let Some(fx) = fixture(TEST, "tsr_my_counter", 1).await else {
        return;
    };
    if !snapshot_isolation_on(&mut fx.connection().await, TEST).await {
        fx.drop_table().await;
        return;
    }
    let state = fx.state();
    async fn count(
        State(s): State<TableState<MySqlPool>>,
        attempt: Attempt,
    ) -> Result<StatusCode, DbError> {
        let result = increment(&s.pool, &s.table, None).await;
        record(&s.calls, &attempt, &result);
        result?;
        Ok(StatusCode::NO_CONTENT)
    }
    let app = Router::new()
        .route("/count", post(count))
        .layer(SqliteRetryLayer::new(fast_policy(30)))
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.post("/count", "").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap().status);
    }
    let calls = state.calls.lock().unwrap().clone();
    let conflicts = calls
        .iter()
        .filter(|(_, code)| code.as_deref() == Some("1020"))
        .count();
    let others: Vec<_> = calls
        .iter()
        .filter(|(_, code)| code.as_deref().is_some_and(|c| c != "1020"))
        .collect();
    eprintln!(
        "{TEST}: {REQUESTS} requests, {} attempts, {conflicts} met 1020",
        calls.len()
    );
    assert!(others.is_empty(), "errors other than 1020: {others:?}");
    assert!(
        statuses.iter().all(|s| *s == StatusCode::NO_CONTENT),
        "every request succeeds: {statuses:?}"
    );
    assert_eq!(
        fx.values().await,
        vec![(1, REQUESTS as i64)],
        "no increment lost"
    );
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// What is not replayed: duplicate keys (409).

#[tokio::test]
async fn duplicate_entry_is_409_and_never_replayed() {
    let Some(fx) = fixture(
        "duplicate_entry_is_409_and_never_replayed",
        "tsr_my_unique",
        0,
    )
    .await
    else {
        return;
    };
    type S = TableState<MySqlPool>;
    async fn insert(State(s): State<S>, attempt: Attempt) -> Result<StatusCode, DbError> {
        let result = sqlx::query(sql(format!(
            "INSERT INTO {} (id, v) VALUES (1, 0)",
            s.table
        )))
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

/// MySQL's duplicate-key message quotes the value (`Duplicate entry 'alice@example.com' for key
/// ...`): the conflict's event carries the error number and its name, never the message.
#[tokio::test]
async fn duplicate_entry_event_carries_no_client_values() {
    let Some(fx) = fixture(
        "duplicate_entry_event_carries_no_client_values",
        "tsr_my_values",
        0,
    )
    .await
    else {
        return;
    };
    let t = &fx.table;
    sqlx::query(sql(format!(
        "ALTER TABLE {t} ADD COLUMN email VARCHAR(100) NULL, ADD UNIQUE KEY {t}_email (email)"
    )))
    .execute(&fx.pool)
    .await
    .unwrap();
    let insert = |id: i32| {
        sqlx::query(sql(format!(
            "INSERT INTO {t} (id, v, email) VALUES ({id}, 0, 'alice@example.com')"
        )))
        .execute(&fx.pool)
    };
    insert(1).await.unwrap();
    let err = insert(2).await.unwrap_err();
    let message = err.as_database_error().unwrap().message().to_owned();
    assert!(message.contains("alice@example.com"), "{message}");

    let (capture, guard) = capture_events();
    let res = DbError::from(err).into_response();
    drop(guard);
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let events = capture.with_message("db error (conflict)");
    assert_eq!(events.len(), 1, "{:?}", capture.events.lock().unwrap());
    assert_eq!(events[0]["db.response.status_code"], "1062");
    assert_eq!(events[0]["db.error.name"], "ER_DUP_ENTRY");
    for (_, fields) in capture.events.lock().unwrap().iter() {
        for value in fields.values() {
            assert!(
                !value.contains("alice"),
                "client's value logged: {fields:?}"
            );
        }
    }
    fx.drop_table().await;
}

// ---------------------------------------------------------------------------------------------
// The classifier and DbError, fed errors raised by the real server and decoded by the driver.

async fn signal(pool: &MySqlPool, sqlstate: &str, number: u16) -> sqlx::Error {
    sqlx::raw_sql(sql(format!(
        "SIGNAL SQLSTATE '{sqlstate}' SET MYSQL_ERRNO = {number}, \
         MESSAGE_TEXT = 'raised by the test'"
    )))
    .execute(pool)
    .await
    .unwrap_err()
}

#[tokio::test]
async fn classifier_and_db_error_on_real_driver_errors() {
    let Some(fx) = fixture(
        "classifier_and_db_error_on_real_driver_errors",
        "tsr_my_classify",
        1,
    )
    .await
    else {
        return;
    };
    // The number decides, not the SQLSTATE (40001 for a deadlock, HY000 for a timeout).
    for (sqlstate, number, name) in [
        ("40001", 1213, "ER_LOCK_DEADLOCK"),
        ("HY000", 1205, "ER_LOCK_WAIT_TIMEOUT"),
        ("HY000", 1020, "ER_CHECKREAD"),
        ("40000", 3101, "ER_TRANSACTION_ROLLBACK_DURING_COMMIT"),
    ] {
        let err = signal(&fx.pool, sqlstate, number).await;
        let marker = err.retryable().unwrap_or_else(|| panic!("{number}: {err}"));
        assert_eq!(
            (marker.code(), marker.name()),
            (number.to_string().as_str(), name)
        );
        let res = DbError::from(err).into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{number}");
        assert!(res.headers().get("retry-after").is_none());
        assert!(res.extensions().get::<Retryable>().is_some());
    }
    for (sqlstate, number) in [
        ("40001", 1180),
        ("HY000", 3572),
        ("HY000", 1105),
        ("70100", 1317),
    ] {
        let err = signal(&fx.pool, sqlstate, number).await;
        assert!(err.retryable().is_none(), "{number}");
        assert!(!err.is_constraint_violation(), "{number}");
        let status = DbError::from(err).status();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{number}");
    }
    // Constraint violations, the real things: duplicate key (1062) and foreign key (1452):
    // 409; NOT NULL (1048) and CHECK (MariaDB 4025 / MySQL 3819): 422.
    let t = &fx.table;
    for statement in [
        format!("ALTER TABLE {t} ADD CONSTRAINT {t}_v_nonneg CHECK (v >= 0)"),
        format!("ALTER TABLE {t} ADD COLUMN parent INT NULL"),
        format!(
            "ALTER TABLE {t} ADD CONSTRAINT {t}_parent FOREIGN KEY (parent) REFERENCES {t} (id)"
        ),
    ] {
        sqlx::query(sql(statement)).execute(&fx.pool).await.unwrap();
    }
    for (statement, numbers, status) in [
        (
            format!("INSERT INTO {t} (id, v) VALUES (1, 0)"),
            &[1062][..],
            StatusCode::CONFLICT,
        ),
        (
            format!("INSERT INTO {t} (id, v, parent) VALUES (5, 0, 99)"),
            &[1452],
            StatusCode::CONFLICT,
        ),
        (
            format!("INSERT INTO {t} (id, v) VALUES (2, NULL)"),
            &[1048],
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            format!("INSERT INTO {t} (id, v) VALUES (3, -1)"),
            &[4025, 3819],
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let err = sqlx::query(sql(statement.clone()))
            .execute(&fx.pool)
            .await
            .unwrap_err();
        let number = err
            .as_database_error()
            .unwrap()
            .downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .number();
        assert!(numbers.contains(&number), "{statement}: {number}");
        assert!(err.retryable().is_none(), "{statement}");
        assert!(err.is_constraint_violation(), "{statement}: {err}");
        assert_eq!(DbError::from(err).status(), status, "{statement}");
    }
    // A value of the wrong type (strict mode, 1366) is no constraint: the server's own
    // binding, 500.
    let err = sqlx::query(sql(format!("INSERT INTO {t} (id, v) VALUES (4, 'abc')")))
        .execute(&fx.pool)
        .await
        .unwrap_err();
    assert!(!err.is_constraint_violation(), "{err}");
    assert_eq!(
        DbError::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // SQLSTATE 23000 that is not a constraint violation: an ambiguous column (1052).
    let err = sqlx::query(sql(format!("SELECT id FROM {t} a JOIN {t} b")))
        .execute(&fx.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("23000")
    );
    assert!(!err.is_constraint_violation());
    assert_eq!(
        DbError::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    fx.drop_table().await;
}

/// MariaDB reports `NOWAIT` as `1205`, like a lock wait timeout: the server does not tell them
/// apart, so neither can the classifier (MySQL 8 has `3572` ER_LOCK_NOWAIT, not retryable).
#[tokio::test]
async fn nowait_on_mariadb_reports_1205() {
    let Some(fx) = fixture("nowait_on_mariadb_reports_1205", "tsr_my_nowait", 1).await else {
        return;
    };
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&fx.pool)
        .await
        .unwrap();
    let mut holder = fx.connection().await;
    exec(&mut holder, "BEGIN".into()).await;
    exec(
        &mut holder,
        format!("SELECT v FROM {} WHERE id = 1 FOR UPDATE", fx.table),
    )
    .await;
    let mut tx = fx.pool.begin().await.unwrap();
    let err = sqlx::query(sql(format!(
        "SELECT v FROM {} WHERE id = 1 FOR UPDATE NOWAIT",
        fx.table
    )))
    .execute(&mut *tx)
    .await
    .unwrap_err();
    tx.rollback().await.unwrap();
    exec(&mut holder, "ROLLBACK".into()).await;
    let marker = err.retryable();
    if version.contains("MariaDB") {
        assert_eq!(marker.map(|m| m.code().to_owned()).as_deref(), Some("1205"));
    } else {
        assert!(marker.is_none(), "{err}");
    }
    fx.drop_table().await;
}
