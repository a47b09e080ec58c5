//! The sqlx 0.8 write path over real HTTP (axum behind `SqliteRetryLayer`, loopback) on real
//! SQLite files: writers queue for their turn, the commit fences the request (from store code
//! below the handler too), the turn always comes back, and the queue is shared with the main
//! crate's `WriteQueue` on the same file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tower_sqlite_retry::write::WriteQueue;
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};
use tower_sqlite_retry_sqlx08::WritePool;

/// A fresh database file in a temporary directory, with the `items` table.
struct TestDb {
    dir: tempfile::TempDir,
    /// One connection open for the test's whole life: the last connection to close removes
    /// the WAL's files, and the next one to open recreates them under an exclusive lock,
    /// which a connection opened at the same moment with a busy timeout of 0 would meet.
    keeper: Option<SqlitePool>,
}

impl TestDb {
    async fn new() -> Self {
        let mut db = Self {
            dir: tempfile::tempdir().expect("tempdir"),
            keeper: None,
        };
        let pool = db.pool(1, Duration::from_secs(5)).await;
        sqlx::query(
            "CREATE TABLE items (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, \
             name TEXT NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("schema");
        db.keeper = Some(pool);
        db
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("app.db")
    }

    /// A pool of `connections` (WAL, the given busy timeout), all opened up front: a
    /// connection opened later, while another holds a lock, would meet it in its set-up
    /// pragmas (with a busy timeout of 0, `database is locked`).
    async fn pool(&self, connections: u32, busy_timeout: Duration) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(self.path())
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(busy_timeout);
        SqlitePoolOptions::new()
            .max_connections(connections)
            .min_connections(connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .expect("pool")
    }
}

/// Store code below the handler: read, then write the next `seq`, and commit. It has no
/// `Attempt`; its commit fences the request all the same.
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

async fn count(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(pool)
        .await
        .expect("count")
}

struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(app: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    Server { addr, task }
}

async fn post_json(
    client: &Client<HttpConnector, Body>,
    addr: SocketAddr,
    path: &str,
    body: String,
) -> (StatusCode, String) {
    let request = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("request");
    let response = client.request(request).await.expect("response");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Many writers at once over HTTP, through two pools on one file, with a busy timeout of 0 and
/// no replay: two write transactions that overlapped would fail at once. None fails, and every
/// write is there exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_writers_never_fail_and_nothing_is_lost_or_doubled() {
    async fn handler(
        State(db): State<WritePool>,
        Json(name): Json<String>,
    ) -> Result<Json<i64>, DbError> {
        Ok(Json(append(&db, &name).await?))
    }
    let db = TestDb::new().await;
    let a = WritePool::new(db.pool(4, Duration::ZERO).await);
    let b = WritePool::new(db.pool(4, Duration::ZERO).await);
    let app = |db: WritePool| {
        Router::new()
            .route("/append", post(handler))
            .layer(SqliteRetryLayer::new(
                RetryPolicy::default().max_attempts(1),
            ))
            .with_state(db)
    };
    let servers = [serve(app(a.clone())).await, serve(app(b.clone())).await];
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (client, addr) = (client.clone(), servers[i % 2].addr);
        tasks.push(tokio::spawn(async move {
            post_json(&client, addr, "/append", format!("\"w{i}\"")).await
        }));
    }
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM items ORDER BY seq")
        .fetch_all(a.pool())
        .await
        .unwrap();
    assert_eq!(seqs, (1..=200).collect::<Vec<i64>>());
    assert!(a.path().is_some());
    assert_eq!(a.path(), b.path(), "one file, one queue");
}

/// The commit, in store code with no `Attempt`, fences the request: a retryable failure after
/// it (a pool time-out on the read after commit, here made up) is answered `503` and not
/// replayed, so the write is there once. The same failure before the commit is replayed.
#[tokio::test]
async fn the_commit_fences_the_request_from_store_code() {
    #[derive(Clone)]
    struct App {
        db: WritePool,
        calls: Arc<AtomicU32>,
        fail_after_commit: bool,
    }
    async fn handler(State(app): State<App>) -> Result<Json<i64>, DbError> {
        let call = app.calls.fetch_add(1, Ordering::SeqCst);
        if !app.fail_after_commit && call == 0 {
            return Err(sqlx::Error::PoolTimedOut.into()); // before any commit: replayed
        }
        let seq = append(&app.db, "once").await?;
        if app.fail_after_commit {
            return Err(sqlx::Error::PoolTimedOut.into()); // after the commit: never replayed
        }
        Ok(Json(seq))
    }
    for fail_after_commit in [true, false] {
        let db = TestDb::new().await;
        let state = App {
            db: WritePool::new(db.pool(2, Duration::from_secs(5)).await),
            calls: Arc::new(AtomicU32::new(0)),
            fail_after_commit,
        };
        let app = Router::new()
            .route("/", post(handler))
            .layer(SqliteRetryLayer::new(
                RetryPolicy::default().base_delay(Duration::from_millis(1)),
            ))
            .with_state(state.clone());
        let server = serve(app).await;
        let (status, body) = post_json(&client(), server.addr, "/", String::new()).await;
        let calls = state.calls.load(Ordering::SeqCst);
        if fail_after_commit {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert_eq!(calls, 1, "a committed request is never run again");
        } else {
            assert_eq!((status, calls), (StatusCode::OK, 2), "{body}");
        }
        assert_eq!(count(state.db.pool()).await, 1);
    }
}

/// This crate's `WritePool` and the main crate's `WriteQueue` on one file share one turn: while
/// a `WriteQueue` turn is held, a `begin` waits; once it is given back, the `begin` goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_is_shared_with_the_main_crates_queue() {
    let db = TestDb::new().await;
    let writes = WritePool::new(db.pool(2, Duration::from_secs(5)).await);
    let queue = WriteQueue::for_file(db.path());
    writes.begin().await.unwrap().rollback().await.unwrap();
    assert_eq!(Some(queue.path()), writes.path());
    let held = queue.turn(Duration::from_secs(5)).await.expect("turn");
    let waiting = tokio::spawn({
        let writes = writes.clone();
        async move { append(&writes, "after the other turn").await }
    });
    // The begin waits for the held turn: counted waiting in the shared queue (a condition
    // polled), and not finished while the turn is held.
    let start = std::time::Instant::now();
    while queue.stats().waiting == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the begin never waited"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(!waiting.is_finished(), "the begin waited for the held turn");
    drop(held);
    assert_eq!(waiting.await.unwrap().unwrap(), 1);
}

/// A transaction dropped without commit keeps the turn until its rollback has run: the next
/// writer, on another `WritePool`'s connection with a busy timeout of 0, never meets its write
/// lock. A failed `COMMIT` (a deferred foreign key still violated) rolls back too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_failed_transactions_roll_back_before_the_next_writer() {
    let db = TestDb::new().await;
    let dropping = WritePool::new(db.pool(2, Duration::ZERO).await);
    let writes = WritePool::new(db.pool(2, Duration::ZERO).await);
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
    for i in 0..100i64 {
        let mut tx = dropping.begin().await.expect("begin");
        sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'dropped')")
            .execute(&mut *tx)
            .await
            .unwrap();
        drop(tx);
        assert_eq!(append(&writes, "after drop").await.unwrap(), 2 * i + 1);

        let mut tx = dropping.begin().await.expect("begin");
        sqlx::query("PRAGMA foreign_keys = ON")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("INSERT INTO children (id, parent) VALUES (?, 42)")
            .bind(i)
            .execute(&mut *tx)
            .await
            .unwrap();
        let failed = tx.commit().await.expect_err("the orphan fails the commit");
        let code = failed
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("787"), "{failed}");
        assert_eq!(
            append(&writes, "after a failed commit").await.unwrap(),
            2 * i + 2
        );
    }
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT COUNT(*) FROM items WHERE seq < 0) + (SELECT COUNT(*) FROM children)",
    )
    .fetch_one(writes.pool())
    .await
    .unwrap();
    assert_eq!(
        left, 0,
        "nothing of the dropped or failed transactions is there"
    );
}

/// A savepoint nests inside the write transaction, and a second `begin` in the same request
/// (which would wait for itself) fails at once instead.
#[tokio::test]
async fn a_savepoint_nests_and_a_second_begin_in_one_request_fails_at_once() {
    use sqlx::Connection as _;
    async fn handler(State(db): State<WritePool>) -> Result<String, DbError> {
        let mut tx = db.begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'outer')")
            .execute(&mut *tx)
            .await?;
        let mut savepoint = (*tx).begin().await?;
        sqlx::query("INSERT INTO items (seq, name) VALUES (2, 'undone')")
            .execute(&mut *savepoint)
            .await?;
        savepoint.rollback().await?;
        let second = match db.begin().await {
            Err(sqlx::Error::InvalidArgument(_)) => "refused",
            Err(_) => "other error",
            Ok(_) => "began",
        };
        tx.commit().await?;
        Ok(second.to_owned())
    }
    let db = TestDb::new().await;
    let writes = WritePool::new(db.pool(2, Duration::from_secs(5)).await);
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(RetryPolicy::default()))
        .with_state(writes.clone());
    let server = serve(app).await;
    let (status, body) = post_json(&client(), server.addr, "/", String::new()).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "refused"));
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM items")
        .fetch_all(writes.pool())
        .await
        .unwrap();
    assert_eq!(seqs, [1]);
}

/// A `begin` cancelled while its `BEGIN IMMEDIATE` waits out another connection's write lock
/// leaves no transaction behind: the next writer begins and commits, and no lock is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_cancelled_while_it_waits_for_the_lock_leaves_no_transaction_behind() {
    let db = TestDb::new().await;
    let writes = WritePool::new(db.pool(2, Duration::from_secs(2)).await);
    let other = db.pool(1, Duration::from_secs(2)).await;
    for (round, wait) in [0u64, 1, 5, 20, 100].into_iter().enumerate() {
        let mut held = other.begin_with("BEGIN IMMEDIATE").await.expect("lock");
        sqlx::query("INSERT INTO items (seq, name) VALUES (-1, 'other')")
            .execute(&mut *held)
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let writes = writes.clone();
            async move { writes.begin().await.map(drop) }
        });
        // It waits in its `BEGIN IMMEDIATE`: it holds the turn (the lock is the other's); then
        // cancelled `wait` ms into that wait.
        let start = std::time::Instant::now();
        while !writes.stats().is_some_and(|s| s.held) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "round {round}: no turn"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert!(
            !waiting.is_finished(),
            "round {round}: the BEGIN still waits"
        );
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled(), "round {round}");
        held.rollback().await.unwrap();
        let seq = tokio::time::timeout(Duration::from_secs(5), append(&writes, "after"))
            .await
            .unwrap_or_else(|_| panic!("round {round}: the next writer waited 5 s"))
            .unwrap_or_else(|e| panic!("round {round}: the next writer failed: {e}"));
        assert_eq!(seq, round as i64 + 1);
        let mut free = other
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("no lock left");
        sqlx::query("SELECT 1").execute(&mut *free).await.unwrap();
        free.rollback().await.unwrap();
    }
}
