//! The write path (`WritePool`) over real HTTP on real SQLite files: writers queue for their
//! turn per file, the commit fences the request, the turn always goes back, the deadline
//! bounds the wait, and a writer in another process is waited out.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use common::{HttpClient, Pause, TestDb, serve};
use http::{Request, StatusCode};
use sqlx::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;
use tower::ServiceExt;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer, WritePool};

/// A pool of `connections` on `db` (WAL, the given busy timeout), all opened up front, with
/// the `items` table.
async fn pool(db: &TestDb, connections: u32, busy_timeout: Duration) -> SqlitePool {
    pool_with(db, connections, busy_timeout, Duration::from_secs(30)).await
}

async fn pool_with(
    db: &TestDb,
    connections: u32,
    busy_timeout: Duration,
    acquire_timeout: Duration,
) -> SqlitePool {
    let schema = db.pool(1, Duration::from_secs(5)).await;
    schema.close().await;
    SqlitePoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        .acquire_timeout(acquire_timeout)
        .connect_with(db.options(busy_timeout))
        .await
        .expect("pool")
}

async fn count(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Read, then write: the next `seq` (unique) after the largest. Two writers that overlapped
/// would read the same largest `seq` and one would fail on the unique constraint.
async fn append(db: &WritePool, name: &str) -> Result<i64, sqlx::Error> {
    let mut tx = db.begin().await?;
    let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
        .bind(seq)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(seq)
}

async fn append_handler(
    State(db): State<WritePool>,
    Json(name): Json<String>,
) -> Result<Json<i64>, DbError> {
    Ok(Json(append(&db, &name).await?))
}

/// Many writers at once, through two pools on one file (one queue), with a busy timeout of 0
/// and no replay: any two write transactions that overlapped would fail at once. None fails,
/// and every write is there exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_writers_never_fail_and_nothing_is_lost_or_doubled() {
    let db = TestDb::new();
    let a = WritePool::new(pool(&db, 4, Duration::ZERO).await);
    let b = WritePool::new(pool(&db, 4, Duration::ZERO).await);
    let no_replay = SqliteRetryLayer::new(RetryPolicy::default().max_attempts(1));
    let app = |db: WritePool| {
        Router::new()
            .route("/append", post(append_handler))
            .layer(no_replay.clone())
            .with_state(db)
    };
    let (server_a, server_b) = (serve(app(a.clone())).await, serve(app(b.clone())).await);
    let clients = [
        HttpClient::new(server_a.addr),
        HttpClient::new(server_b.addr),
    ];
    let mut tasks = Vec::new();
    for i in 0..200 {
        let client = clients[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            client.post("/append", format!("\"w{i}\"")).await
        }));
    }
    for t in tasks {
        let reply = t.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM items ORDER BY seq")
        .fetch_all(a.pool())
        .await
        .unwrap();
    assert_eq!(seqs, (1..=200).collect::<Vec<i64>>());
    let names: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT name) FROM items")
        .fetch_one(a.pool())
        .await
        .unwrap();
    assert_eq!(names, 200);
    assert!(a.path().is_some());
    assert_eq!(a.path(), b.path(), "one file, one queue");
}

/// A policy that replays at once, up to three attempts.
fn replaying() -> SqliteRetryLayer {
    SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(3)
            .base_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(2))
            .jitter(Jitter::Full),
    )
}

#[derive(Clone)]
struct Counted {
    db: WritePool,
    calls: Arc<AtomicU32>,
}

/// Commits, then fails retryably (a pool time-out after the commit, say): the commit fenced
/// the request, so it is not replayed and the row is written once.
#[tokio::test]
async fn a_commit_fences_the_request() {
    async fn commit_then_fail(
        State(s): State<Counted>,
        Json(name): Json<String>,
    ) -> Result<Json<i64>, DbError> {
        s.calls.fetch_add(1, Ordering::SeqCst);
        append(&s.db, &name).await?;
        Err(sqlx::Error::PoolTimedOut.into())
    }
    let db = TestDb::new();
    let state = Counted {
        db: WritePool::new(pool(&db, 2, Duration::from_secs(5)).await),
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/", post(commit_then_fail))
        .layer(replaying())
        .with_state(state.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "\"once\"").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed after commit"
    );
    assert_eq!(count(state.db.pool()).await, 1);
}

/// A store the handler calls, generic over its backend as real ones are: it never sees an
/// `Attempt`, and its commit still fences the request.
trait Store: Clone + Send + Sync + 'static {
    fn put(&self, name: &str) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

#[derive(Clone)]
struct SqliteStore {
    db: WritePool,
}

impl Store for SqliteStore {
    async fn put(&self, name: &str) -> Result<i64, sqlx::Error> {
        append(&self.db, name).await
    }
}

#[tokio::test]
async fn a_store_function_below_the_handler_fences() {
    #[derive(Clone)]
    struct App<S> {
        store: S,
        calls: Arc<AtomicU32>,
    }
    async fn put_then_fail<S: Store>(
        State(app): State<App<S>>,
        attempt: Attempt,
        Json(name): Json<String>,
    ) -> Result<Json<i64>, DbError> {
        app.calls.fetch_add(1, Ordering::SeqCst);
        app.store.put(&name).await?;
        // The handler itself never fenced: the store's commit did.
        assert!(attempt.is_fenced());
        Err(sqlx::Error::PoolTimedOut.into())
    }
    let db = TestDb::new();
    let store = SqliteStore {
        db: WritePool::new(pool(&db, 2, Duration::from_secs(5)).await),
    };
    let app = App {
        store: store.clone(),
        calls: Arc::default(),
    };
    let router = Router::new()
        .route("/", post(put_then_fail::<SqliteStore>))
        .layer(replaying())
        .with_state(app.clone());
    let server = serve(router).await;
    let reply = HttpClient::new(server.addr).post("/", "\"once\"").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.calls.load(Ordering::SeqCst), 1, "replayed after commit");
    assert_eq!(count(store.db.pool()).await, 1);
}

/// A write transaction dropped without commit rolls back and gives the turn back: the next
/// writer (outside any request, bounded only by a short `acquire_timeout`) gets it.
#[tokio::test]
async fn dropping_without_commit_gives_the_turn_back() {
    async fn abandon(State(db): State<WritePool>) -> Result<&'static str, DbError> {
        let mut tx = db.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'abandoned')")
            .execute(&mut *tx)
            .await?;
        drop(tx);
        Ok("dropped")
    }
    let db = TestDb::new();
    let writes =
        WritePool::new(pool_with(&db, 2, Duration::from_secs(5), Duration::from_millis(500)).await);
    let app = Router::new()
        .route("/", post(abandon))
        .layer(replaying())
        .with_state(writes.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(count(writes.pool()).await, 0, "rolled back");
    let seq = append(&writes, "next").await.expect("the turn came back");
    assert_eq!(seq, 1);
}

/// A failed attempt gives the turn back before its backoff: while the request waits out an
/// hour of backoff, another writer gets the turn.
#[tokio::test]
async fn a_failed_attempt_gives_the_turn_back_before_its_backoff() {
    #[derive(Clone)]
    struct S {
        db: WritePool,
        failed: tokio::sync::mpsc::UnboundedSender<()>,
    }
    async fn fail(State(s): State<S>) -> Result<&'static str, DbError> {
        let mut tx = s.db.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'failed')")
            .execute(&mut *tx)
            .await?;
        s.failed.send(()).unwrap();
        Err(sqlx::Error::PoolTimedOut.into())
    }
    let db = TestDb::new();
    let writes =
        WritePool::new(pool_with(&db, 2, Duration::from_secs(5), Duration::from_millis(500)).await);
    let (failed, mut failed_rx) = tokio::sync::mpsc::unbounded_channel();
    let hour = Duration::from_secs(3600);
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(2)
            .base_delay(hour)
            .max_delay(hour)
            .jitter(Jitter::None)
            .deadline(hour * 3),
    );
    let app = Router::new()
        .route("/", post(fail))
        .layer(layer)
        .with_state(S {
            db: writes.clone(),
            failed,
        });
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let stuck = tokio::spawn(async move { client.post("/", "").await });
    failed_rx.recv().await.unwrap();
    // The handler has returned (or is returning) its error: its attempt is over, its turn must
    // come back although the request sleeps for an hour.
    let seq = append(&writes, "during the backoff")
        .await
        .expect("the turn came back");
    assert_eq!(seq, 1, "the failed attempt's row was rolled back");
    assert!(!stuck.is_finished(), "the request is still in its backoff");
    stuck.abort();
}

/// The deadline bounds the wait for a turn: with the turn held elsewhere and a pool that would
/// wait an hour for a connection, the request ends at its two-second deadline (paused clock).
#[tokio::test(flavor = "current_thread")]
async fn the_deadline_bounds_the_wait_for_a_turn() {
    let db = TestDb::new();
    let writes =
        WritePool::new(pool_with(&db, 2, Duration::from_secs(5), Duration::from_secs(3600)).await);
    let app = Router::new()
        .route("/append", post(append_handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().deadline(Duration::from_secs(2)),
        ))
        .with_state(writes.clone());
    let held = writes.begin().await.expect("the turn");
    tokio::time::pause();
    let start = tokio::time::Instant::now();
    let res = app
        .oneshot(
            Request::post("/append")
                .header("content-type", "application/json")
                .body(Body::from("\"late\""))
                .unwrap(),
        )
        .await
        .unwrap();
    let waited = start.elapsed();
    tokio::time::resume();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(60),
        "waited {waited:?} (virtual)"
    );
    held.rollback().await.unwrap();
    assert_eq!(count(writes.pool()).await, 0);
}

/// Two write transactions in one handler: a nested one is refused at once (it would wait for
/// the turn its own request holds); a sequential one, after the first committed, goes ahead,
/// and both writes land in order.
#[tokio::test]
async fn nested_and_sequential_transactions_in_one_handler() {
    async fn twice(State(db): State<WritePool>) -> Result<String, DbError> {
        let mut first = db.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'first')")
            .execute(&mut *first)
            .await?;
        let nested = match db.begin().await {
            Err(sqlx::Error::InvalidArgument(_)) => "refused",
            Err(_) => "other error",
            Ok(_) => "began",
        };
        first.commit().await?;
        let mut second = db.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (2, 'second')")
            .execute(&mut *second)
            .await?;
        second.commit().await?;
        Ok(nested.to_owned())
    }
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 3, Duration::from_secs(5)).await);
    let app = Router::new()
        .route("/", post(twice))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().deadline(Duration::from_secs(20)),
        ))
        .with_state(writes.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "refused");
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items ORDER BY seq")
        .fetch_all(writes.pool())
        .await
        .unwrap();
    assert_eq!(names, ["first", "second"]);
}

const CHILD_DB: &str = "TSR_WRITE_PATH_CHILD_DB";

/// Not a test on its own: the writer in another process. Run by
/// `a_writer_in_another_process_is_waited_out` with the database's path in `CHILD_DB`, it
/// holds `BEGIN IMMEDIATE` (with a row written) until its stdin says go, then commits.
#[tokio::test]
#[ignore = "a child process's entry point, run by a_writer_in_another_process_is_waited_out"]
async fn other_process_writer() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect_with(&common::options(
        std::path::Path::new(&path),
        Duration::from_secs(5),
    ))
    .await
    .expect("connect");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .expect("BEGIN IMMEDIATE");
    sqlx::query("INSERT INTO items (seq, name) VALUES (1000, 'other process')")
        .execute(&mut conn)
        .await
        .expect("insert");
    println!("locked");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    sqlx::query("COMMIT")
        .execute(&mut conn)
        .await
        .expect("COMMIT");
}

/// A writer in another process holds the write lock. The request's `BEGIN IMMEDIATE` (busy
/// timeout 0 here, so it cannot simply wait) fails with `SQLITE_BUSY`, which gives the turn
/// back; the layer replays; the replay begins after the other process committed and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_in_another_process_is_waited_out() {
    #[derive(Clone)]
    struct S {
        db: WritePool,
        calls: Arc<AtomicU32>,
        pause: Pause,
    }
    async fn handler(
        State(s): State<S>,
        attempt: Attempt,
        Json(name): Json<String>,
    ) -> Result<Json<i64>, DbError> {
        s.calls.fetch_add(1, Ordering::SeqCst);
        if attempt.is_replay() {
            // Wait until the other process has committed.
            s.pause.here().await;
        }
        Ok(Json(append(&s.db, &name).await?))
    }
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 2, Duration::ZERO).await);
    let mut child = common::child_test("write_path::other_process_writer")
        .env(CHILD_DB, &db.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("child process");
    let mut child_out = BufReader::new(child.stdout.take().unwrap());
    let child_in = child.stdin.take().unwrap();
    // The reader stays open until the child is done (it prints more after "locked").
    let (locked, _child_out) = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let mut ran = common::ChildRan::default();
        loop {
            line.clear();
            if child_out.read_line(&mut line).unwrap() == 0 {
                return (false, child_out);
            }
            ran.line(&line);
            if line.trim_end().ends_with("locked") {
                ran.assert_started("write_path::other_process_writer");
                return (true, child_out);
            }
        }
    })
    .await
    .unwrap();
    assert!(locked, "the other process never held the lock");

    let (pause, mut replaying_now, go) = Pause::new();
    let state = S {
        db: writes.clone(),
        calls: Arc::default(),
        pause,
    };
    let app = Router::new()
        .route("/append", post(handler))
        .layer(replaying())
        .with_state(state.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/append", "\"this process\"").await });
    // The first attempt met the other process's lock; the replay waits for it to commit.
    replaying_now.recv().await.unwrap();
    let mut child_in = child_in;
    writeln!(child_in, "go").unwrap();
    drop(child_in);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
    go.send(()).unwrap();
    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(state.calls.load(Ordering::SeqCst), 2);
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items ORDER BY seq")
        .fetch_all(writes.pool())
        .await
        .unwrap();
    assert_eq!(names, ["other process", "this process"]);
}

/// The turn on its own (`WriteQueue`), for drivers without a pool type here (sqlx 0.8,
/// rusqlite): it is the same queue as `WritePool`'s, and `committed()` fences the request.
#[tokio::test]
async fn write_queue_shares_the_turn_and_its_commit_fences() {
    use tower_sqlite_retry::write::TurnError;
    use tower_sqlite_retry::write::WriteQueue;
    #[derive(Clone)]
    struct S {
        pool: SqlitePool,
        queue: WriteQueue,
        calls: Arc<AtomicU32>,
    }
    async fn commit_then_fail(State(s): State<S>) -> Result<&'static str, DbError> {
        s.calls.fetch_add(1, Ordering::SeqCst);
        let turn = s
            .queue
            .turn(Duration::from_secs(30))
            .await
            .map_err(DbError::internal)?;
        let mut tx = s.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'queued')")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        turn.committed();
        Err(sqlx::Error::PoolTimedOut.into())
    }
    let db = TestDb::new();
    let pool = pool(&db, 2, Duration::from_secs(5)).await;
    let queue = WriteQueue::for_file(&db.path);
    let writes = WritePool::new(pool.clone());

    // One queue: while the write path holds the turn, the queue has none to give.
    let held = writes.begin().await.unwrap();
    assert_eq!(Some(queue.path()), writes.path());
    assert_eq!(
        queue.turn(Duration::ZERO).await.unwrap_err(),
        TurnError::TimedOut
    );
    held.rollback().await.unwrap();

    let state = S {
        pool,
        queue,
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/", post(commit_then_fail))
        .layer(replaying())
        .with_state(state.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed after commit"
    );
    assert_eq!(count(&state.pool).await, 1);
}

/// A handler that panics while it holds a write transaction: unwinding drops the transaction,
/// which rolls back and gives the turn back.
#[tokio::test]
async fn a_handler_that_panics_gives_the_turn_back() {
    async fn panics(State(db): State<WritePool>) -> Result<&'static str, DbError> {
        let mut tx = db.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'panicked')")
            .execute(&mut *tx)
            .await?;
        panic!("handler bug");
    }
    let db = TestDb::new();
    let writes =
        WritePool::new(pool_with(&db, 2, Duration::from_secs(5), Duration::from_millis(500)).await);
    let app = Router::new()
        .route("/", post(panics))
        .layer(replaying())
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        .with_state(writes.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(count(writes.pool()).await, 0, "rolled back");
    let seq = append(&writes, "after the panic")
        .await
        .expect("the turn came back");
    assert_eq!(seq, 1);
}

/// Writes begin on the write path's own writer connections: with every connection of the
/// application's pool held by readers, a write transaction still begins and commits. With
/// `writer(WriterConnection::FromPool)` (writes take the application pool's connections, as before) the
/// same write waits for a pooled connection until the pool's `acquire_timeout`.
#[tokio::test]
async fn readers_holding_every_pooled_connection_do_not_block_a_write() {
    let db = TestDb::new();
    let pool = pool_with(&db, 2, Duration::from_secs(5), Duration::from_millis(300)).await;
    let writes = WritePool::new(pool.clone());
    let shared =
        WritePool::new(pool.clone()).writer(tower_sqlite_retry::write::WriterConnection::FromPool);
    let readers = [pool.acquire().await.unwrap(), pool.acquire().await.unwrap()];
    assert_eq!(pool.num_idle(), 0, "the readers hold the whole pool");

    let seq = append(&writes, "beside the readers")
        .await
        .expect("a write needs no pooled connection");
    assert_eq!(seq, 1);
    assert!(
        matches!(shared.begin().await, Err(sqlx::Error::PoolTimedOut)),
        "with writer(WriterConnection::FromPool), a write needs a pooled connection"
    );

    drop(readers);
    assert_eq!(append(&shared, "shared").await.unwrap(), 2);
    assert_eq!(count(&pool).await, 2);
}

/// A write transaction dropped without commit keeps the turn until its rollback has run: the
/// next writer, on another connection (another `WritePool`'s writer connection on the same
/// file, sharing the turn) with a busy timeout of 0, never meets the dropped transaction's
/// write lock (it would fail with `SQLITE_BUSY` at once, and nothing replays here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_transaction_rolls_back_before_the_next_writer_begins() {
    let db = TestDb::new();
    let dropping = WritePool::new(pool(&db, 2, Duration::ZERO).await);
    let writes = WritePool::new(pool(&db, 2, Duration::ZERO).await);
    for i in 0..200 {
        let mut tx = dropping.begin().await.expect("begin");
        sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'dropped')")
            .execute(&mut *tx)
            .await
            .expect("insert");
        drop(tx);
        let seq = append(&writes, &format!("after drop {i}"))
            .await
            .unwrap_or_else(|e| panic!("writer {i} after a dropped transaction: {e}"));
        assert_eq!(seq, i + 1);
    }
    let dropped: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE seq < 0")
        .fetch_one(writes.pool())
        .await
        .unwrap();
    assert_eq!(dropped, 0, "every dropped transaction rolled back");
}

/// Closing the `WritePool` closes the application's pool and the writer connections; a write
/// after it fails with `PoolClosed` (and does not open a writer connection again).
#[tokio::test]
async fn close_closes_the_writer_connections_too() {
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 2, Duration::from_secs(5)).await);
    assert_eq!(append(&writes, "before close").await.unwrap(), 1);
    writes.close().await;
    assert!(writes.pool().is_closed());
    assert!(matches!(writes.begin().await, Err(sqlx::Error::PoolClosed)));
}

/// A savepoint inside a write transaction (`sqlx::Connection::begin(&mut *tx)`): released or
/// rolled back on its own, inside the transaction, which then commits what is left; the next
/// write transaction begins on the same writer connection as usual.
#[tokio::test]
async fn a_savepoint_inside_a_write_transaction_nests_as_with_sqlx() {
    use sqlx::Connection as _;
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 2, Duration::from_secs(5)).await);
    let mut tx = writes.begin().await.expect("begin");
    sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'outer')")
        .execute(&mut *tx)
        .await
        .unwrap();
    {
        let mut kept = (*tx).begin().await.expect("a savepoint");
        sqlx::query("INSERT INTO items (seq, name) VALUES (2, 'kept')")
            .execute(&mut *kept)
            .await
            .unwrap();
        kept.commit().await.expect("RELEASE");
    }
    {
        let mut undone = (*tx).begin().await.expect("a savepoint");
        sqlx::query("INSERT INTO items (seq, name) VALUES (3, 'undone')")
            .execute(&mut *undone)
            .await
            .unwrap();
        undone.rollback().await.expect("ROLLBACK TO");
    }
    tx.commit().await.expect("commit");
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM items ORDER BY seq")
        .fetch_all(writes.pool())
        .await
        .unwrap();
    assert_eq!(seqs, [1, 2]);
    assert_eq!(append(&writes, "next").await.unwrap(), 3);
}

/// A `COMMIT` that fails leaves SQLite's transaction open (here a deferred foreign key that
/// is still violated at commit time): `commit` returns the error, rolls back, and gives the
/// turn back, so the next writer (same writer connection, busy timeout 0) begins a fresh
/// transaction, and nothing of the failed one is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_rolls_back_and_the_next_writer_begins_fresh() {
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 2, Duration::ZERO).await);
    {
        let mut tx = writes.begin().await.unwrap();
        sqlx::query(
            "CREATE TABLE parents (id INTEGER PRIMARY KEY); \
             CREATE TABLE children (id INTEGER PRIMARY KEY, parent INTEGER \
               REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
        )
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    for round in 0..20 {
        let mut tx = writes.begin().await.expect("begin after a failed commit");
        sqlx::query("PRAGMA foreign_keys = ON")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'with the orphan')")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("INSERT INTO children (id, parent) VALUES (?, 42)")
            .bind(round)
            .execute(&mut *tx)
            .await
            .expect("deferred: checked at commit");
        let failed = tx.commit().await.expect_err("the orphan fails the commit");
        let code = failed
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("787"), "{failed}"); // SQLITE_CONSTRAINT_FOREIGNKEY
        assert_eq!(append(&writes, "after").await.unwrap(), round + 1);
    }
    let orphans: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM children")
        .fetch_one(writes.pool())
        .await
        .unwrap();
    let rolled_back: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE seq < 0")
        .fetch_one(writes.pool())
        .await
        .unwrap();
    assert_eq!(
        (orphans, rolled_back),
        (0, 0),
        "the failed transactions left nothing"
    );
}

/// The writer connection is one connection, kept from one writer to the next: SQLite's
/// `last_insert_rowid()`, which is per connection, carries over between write transactions
/// (none of the pool's four connections inserted anything). Clones of the `WritePool` share it.
#[tokio::test]
async fn clones_of_a_write_pool_share_one_writer_connection_from_writer_to_writer() {
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 4, Duration::from_secs(5)).await);
    let clone = writes.clone();
    {
        let mut tx = writes.begin().await.unwrap();
        sqlx::query("INSERT INTO items (id, seq, name) VALUES (77, 1, 'marker')")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    for db in [&writes, &clone, &writes] {
        let mut tx = db.begin().await.unwrap();
        let last: i64 = sqlx::query_scalar("SELECT last_insert_rowid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(last, 77, "the same connection as the marker's insert");
        tx.rollback().await.unwrap();
    }
}

/// A `begin` dropped while its `BEGIN IMMEDIATE` waits out another connection's write lock
/// (the request cancelled, the client gone) leaves no transaction behind: once the other
/// writer is done, the next write transaction begins and commits, and no write lock is left
/// held on the file. Cancelled at several points of the wait (the property holds at any). The
/// cancelled `BEGIN` still runs to its end on the connection's worker once the lock is free;
/// the transaction, which owns the connection from before the `BEGIN`, rolls it back before
/// the turn goes on (as sqlx's own `Transaction::begin` does), so the writer connection is
/// handed on clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_cancelled_while_it_waits_for_the_lock_leaves_no_transaction_behind() {
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 2, Duration::from_secs(2)).await);
    let other = pool(&db, 1, Duration::from_secs(2)).await;
    for (round, wait) in [0u64, 1, 5, 20, 100].into_iter().enumerate() {
        let mut held = other
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("the other lock");
        sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'other')")
            .execute(&mut *held)
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let writes = writes.clone();
            async move { writes.begin().await.map(drop) }
        });
        // It waits in its `BEGIN IMMEDIATE`: it holds the turn (the lock is the other's, so the
        // `BEGIN` cannot end); then cancelled `wait` ms into that wait.
        common::poll_until(
            format!("round {round}: the begin holds the turn"),
            async || writes.stats().is_some_and(|s| s.held),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert!(
            !waiting.is_finished(),
            "round {round}: the BEGIN still waits"
        );
        waiting.abort();
        assert!(
            waiting.await.unwrap_err().is_cancelled(),
            "round {round}: still waiting"
        );
        held.rollback().await.unwrap();

        let seq = tokio::time::timeout(Duration::from_secs(5), append(&writes, "after"))
            .await
            .unwrap_or_else(|_| panic!("round {round}: the next writer waited 5 s"))
            .unwrap_or_else(|e| panic!("round {round}: the next writer failed: {e}"));
        assert_eq!(seq, round as i64 + 1);
        // Nothing holds the write lock now: a writer outside the queue gets it at once.
        let mut free = other
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("no lock left");
        sqlx::query("SELECT 1").execute(&mut *free).await.unwrap();
        free.rollback().await.unwrap();
    }
}

/// Store code shaped like a real CalDAV server's: reads through the store's own `SqlitePool`,
/// transactions through a `WritePool` beside it, and a helper that logs the change on the
/// open transaction, taking `&mut SqliteConnection` (callers pass `&mut tx`).
#[tokio::test]
async fn a_store_keeps_its_pool_for_reads_and_a_write_pool_beside_it() {
    struct Store {
        db: SqlitePool,
        writes: WritePool,
    }
    async fn log_change(tx: &mut sqlx::SqliteConnection, name: &str) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO items (seq, name) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM items), ?)")
            .bind(format!("log {name}"))
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
    impl Store {
        async fn put(&self, name: &str) -> Result<(), sqlx::Error> {
            let mut tx = self.writes.begin().await?;
            sqlx::query("INSERT INTO items (seq, name) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM items), ?)")
                .bind(name)
                .execute(&mut *tx)
                .await?;
            log_change(&mut tx, name).await?;
            tx.commit().await
        }
        async fn count(&self) -> i64 {
            count(&self.db).await
        }
    }
    let db = TestDb::new();
    let pool = pool(&db, 2, Duration::from_secs(5)).await;
    let store = Store {
        writes: WritePool::new(pool.clone()),
        db: pool,
    };
    store.put("a").await.unwrap();
    store.put("b").await.unwrap();
    assert_eq!(store.count().await, 4);
}

/// A commit hands the turn on before its task goes on: on a current-thread runtime (one queue,
/// a deterministic order), when `commit()` returns to a writer that had another queued behind
/// it, that writer has already taken the turn. Without the hand-over the committed task would
/// run on first, and the next writer would still be waiting.
#[tokio::test]
async fn a_commit_lets_the_next_writer_take_the_turn_before_its_task_goes_on() {
    let db = TestDb::new();
    let writes = WritePool::new(pool(&db, 2, Duration::from_secs(5)).await);
    let first = writes.begin().await.unwrap();
    let next = {
        let writes = writes.clone();
        tokio::spawn(async move {
            let tx = writes.begin().await.unwrap();
            tx.commit().await.unwrap();
        })
    };
    common::poll_until("the next writer waits", async || {
        writes.stats().is_some_and(|s| s.waiting == 1)
    })
    .await;
    first.commit().await.unwrap();
    let now = writes.stats().unwrap();
    assert_eq!(
        now.waiting, 0,
        "the next writer took the turn before commit() returned: {now:?}"
    );
    next.await.unwrap();
    // Alone in line, a commit does not yield (nobody to hand over to): nothing waits, and the
    // turn is free when it returns.
    writes.begin().await.unwrap().commit().await.unwrap();
    let after = writes.stats().unwrap();
    assert!(!after.held && after.waiting == 0, "{after:?}");
}
