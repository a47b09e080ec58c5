//! Another writer on the file: a request waits it out up to its deadline, at a bounded cost.
//!
//! The recommended settings (`docs/write-path.md`, "SQLite settings"), over real HTTP on a
//! real SQLite file: WAL, a busy timeout of 5 s, a deferred read-then-write handler (its write meets the lock at once: SQLite does not call the
//! busy handler for a transaction that already read), the default policy. Another connection
//! holds the write lock (`BEGIN IMMEDIATE` and a write) for 0.3, 1 or 3 s, or another process
//! holds it until told; the request must answer 201 once it is released.
//!
//! The lock is held for real time (that is the scenario), and is released only once the
//! server has met it (a failed attempt seen), so that no test passes without contention. No
//! test asserts how long anything took; the cost bound counts attempts per second of lock.

use crate::common;

use std::io::{BufRead, Write};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::StatusCode;
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tower_sqlite_retry::policy::Admission;
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};

use common::{HttpClient, TestDb, poll_until, serve};

#[derive(Clone)]
struct App {
    pool: SqlitePool,
    calls: Arc<AtomicU32>,
    failed: Arc<AtomicU32>,
}

/// A deferred transaction that reads, then writes.
async fn create(State(app): State<App>) -> Result<StatusCode, DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let result = async {
        let mut tx = app.pool.begin().await?;
        let (next,): (i64,) = sqlx::query_as("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'x')")
            .bind(next)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        app.failed.fetch_add(1, Ordering::SeqCst);
        return Err(e.into());
    }
    Ok(StatusCode::CREATED)
}

struct Setup {
    db: TestDb,
    app: App,
    client: HttpClient,
    _server: common::Server,
}

async fn setup(admission: Admission) -> Setup {
    let db = TestDb::new();
    let pool = db.pool(4, Duration::from_secs(5)).await;
    let app = App {
        pool,
        calls: Arc::default(),
        failed: Arc::default(),
    };
    let layer = SqliteRetryLayer::new(RetryPolicy::default().admission(admission));
    let router = Router::new()
        .route("/items", post(create))
        .layer(layer)
        .with_state(app.clone());
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    Setup {
        db,
        app,
        client,
        _server: server,
    }
}

/// Takes the write lock on a connection of its own: `BEGIN IMMEDIATE` and a write.
async fn take_lock(db: &TestDb) -> SqliteConnection {
    let mut conn = SqliteConnection::connect_with(&db.options(Duration::from_secs(5)))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'other writer')")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// `requests` POSTs meet a lock held `held`; all must answer 201 once it is released.
async fn waits_out(admission: Admission, held: Duration, requests: usize) {
    let s = setup(admission).await;
    // The route meets contention before the test (with admission, it gets a limit).
    let mut lock = take_lock(&s.db).await;
    let sent: Vec<_> = (0..requests)
        .map(|_| {
            let client = s.client.clone();
            tokio::spawn(async move { client.post("/items", "{}").await })
        })
        .collect();
    poll_until("the server met the lock", async || {
        s.app.failed.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(held).await;
    sqlx::query("COMMIT").execute(&mut lock).await.unwrap();
    for reply in sent {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    }
    // A handful of attempts per second of lock, not a busy loop: with `max_delay` 100 ms and
    // full jitter a request waiting alone makes about twenty a second.
    let calls = s.app.calls.load(Ordering::SeqCst);
    eprintln!(
        "{admission:?}, lock held {held:?} after it was met: {calls} attempts for {requests} requests"
    );
    let bound = requests as f64 * (4.0 + 40.0 * held.as_secs_f64());
    assert!(
        f64::from(calls) <= bound,
        "{calls} attempts for {requests} requests and {held:?} of lock (bound {bound})"
    );
}

#[tokio::test]
async fn a_lock_held_300_ms_is_waited_out_on_a_limited_route() {
    waits_out(Admission::Adaptive, Duration::from_millis(300), 2).await;
}

#[tokio::test]
async fn a_lock_held_1_s_is_waited_out_on_a_limited_route() {
    waits_out(Admission::Adaptive, Duration::from_secs(1), 2).await;
}

#[tokio::test]
async fn a_lock_held_3_s_is_waited_out_on_a_limited_route() {
    waits_out(Admission::Adaptive, Duration::from_secs(3), 2).await;
}

#[tokio::test]
async fn a_lock_held_300_ms_is_waited_out_without_admission() {
    waits_out(Admission::Off, Duration::from_millis(300), 1).await;
}

#[tokio::test]
async fn a_lock_held_1_s_is_waited_out_without_admission() {
    waits_out(Admission::Off, Duration::from_secs(1), 1).await;
}

#[tokio::test]
async fn a_lock_held_3_s_is_waited_out_without_admission() {
    waits_out(Admission::Off, Duration::from_secs(3), 1).await;
}

/// The environment variable that makes this test binary the other process.
const CHILD_DB: &str = "TSR_WAITING_OUT_CHILD_DB";

/// The other process (run by [`a_lock_held_by_another_process_is_waited_out`]): takes the
/// write lock on its own connection, says `locked`, commits when it reads a line. Not a test
/// on its own; without the variable it does nothing.
#[tokio::test]
#[ignore = "a child process's entry point, run by a_lock_held_by_another_process_is_waited_out"]
async fn child_process_holding_the_lock() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let opts = common::options(std::path::Path::new(&path), Duration::from_secs(5));
    let mut conn = SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'another process')")
        .execute(&mut conn)
        .await
        .unwrap();
    println!("locked");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
}

#[tokio::test]
async fn a_lock_held_by_another_process_is_waited_out() {
    let s = setup(Admission::Adaptive).await;
    let mut child = common::child_test("waiting_out::child_process_holding_the_lock")
        .env(CHILD_DB, &s.db.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (locked, mut stdout) = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let mut ran = common::ChildRan::default();
        while stdout.read_line(&mut line).unwrap() > 0 {
            ran.line(&line);
            // (the harness writes `test ... ... ` before it, on the same line)
            if line.trim_end().ends_with("locked") {
                ran.assert_started("waiting_out::child_process_holding_the_lock");
                return (true, stdout);
            }
            line.clear();
        }
        (false, stdout)
    })
    .await
    .unwrap();
    assert!(locked, "the child took the lock");
    let client = s.client.clone();
    let reply = tokio::spawn(async move { client.post("/items", "{}").await });
    // Released once the server has failed against it forty times (more than the attempts a
    // request once had in all: the deadline, not a count, must decide), or has answered.
    poll_until("the server met the other process' lock", async || {
        s.app.failed.load(Ordering::SeqCst) >= 40 || reply.is_finished()
    })
    .await;
    writeln!(child.stdin.take().unwrap(), "commit").unwrap();
    let status = tokio::task::spawn_blocking(move || {
        // The child's test harness reports on its way out: read it all.
        std::io::copy(&mut stdout, &mut std::io::sink()).unwrap();
        child.wait()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(status.success(), "the child committed");
    let reply = reply.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    eprintln!(
        "another process: {} attempts",
        s.app.calls.load(Ordering::SeqCst)
    );
    let rows: (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items")
        .fetch_one(&s.app.pool)
        .await
        .unwrap();
    assert_eq!(rows.0, 2, "the other process' row and the request's");
}
