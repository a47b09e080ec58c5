//! The sqlx 0.8 write path as trustworthy as sqlx's own `Transaction`, in every way a handler
//! ends: the main crate's `tests/write/write_trust.rs`, against sqlx 0.8's worker. The situations
//! are made deterministic the same way: a reader's open transaction in rollback-journal mode
//! keeps a `COMMIT` waiting, a held `BEGIN IMMEDIATE` keeps a `BEGIN` waiting, a channel says
//! when a handler reached a point; no wall-clock bound is asserted.

use std::net::SocketAddr;
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
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::mpsc;
use tower_sqlite_retry::{DbError, Jitter, RetryPolicy, SqliteRetryLayer, in_request};
use tower_sqlite_retry_sqlx08::{WritePool, WriterConnection};

struct TestDb {
    dir: tempfile::TempDir,
}

impl TestDb {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn options(&self, journal: SqliteJournalMode, busy_timeout: Duration) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(self.dir.path().join("app.db"))
            .create_if_missing(true)
            .journal_mode(journal)
            .busy_timeout(busy_timeout)
    }
}

/// A pool of `connections`, opened up front, with the `items` table.
async fn pool_of(options: SqliteConnectOptions, connections: u32) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("pool");
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, \
         name TEXT NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("schema");
    pool
}

async fn insert(conn: &mut SqliteConnection, seq: i64, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
        .bind(seq)
        .bind(name)
        .execute(conn)
        .await
        .map(drop)
}

async fn names(pool: &SqlitePool) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM items ORDER BY seq")
        .fetch_all(pool)
        .await
        .expect("names")
}

async fn count(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Another connection takes the write lock at once (busy timeout 0).
async fn assert_file_writable(options: SqliteConnectOptions) {
    let mut other = SqliteConnection::connect_with(&options.busy_timeout(Duration::ZERO))
        .await
        .expect("connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("the file is writable by another connection");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
}

/// A reader's open read transaction (rollback-journal mode): a writer's `COMMIT` waits.
struct Reader(SqliteConnection);

impl Reader {
    async fn hold(options: &SqliteConnectOptions) -> Self {
        let mut conn = SqliteConnection::connect_with(options).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        Self(conn)
    }

    async fn release(mut self) {
        sqlx::query("COMMIT").execute(&mut self.0).await.unwrap();
    }
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server { addr, task }
}

async fn send(
    client: &Client<HttpConnector, Body>,
    addr: SocketAddr,
    path: &str,
    body: String,
) -> (StatusCode, String) {
    let request = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = client.request(request).await.expect("response");
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn fast_replays(attempts: u32) -> SqliteRetryLayer {
    SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(attempts)
            .base_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(2))
            .jitter(Jitter::Full),
    )
}

/// A `commit()` cancelled while its `COMMIT` waits leaves nothing armed on the connection: the
/// next transaction's dropped savepoint is rolled back and its `commit()` is `Ok` only with its
/// rows in the file; a plain `pool.begin()` dropped afterwards rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_commit_hands_on_a_clean_connection() {
    for own in [true, false] {
        let db = TestDb::new();
        let options = db.options(SqliteJournalMode::Delete, Duration::from_secs(10));
        let pool = pool_of(options.clone(), 1).await;
        let writes = WritePool::new(pool.clone()).writer(if own {
            WriterConnection::Own
        } else {
            WriterConnection::FromPool
        });

        let reader = Reader::hold(&options).await;
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, 1, "cancelled commit").await.unwrap();
        let cancelled = tokio::time::timeout(Duration::from_millis(300), tx.commit()).await;
        assert!(cancelled.is_err(), "the COMMIT waits for the reader");
        reader.release().await;

        let mut tx = writes.begin().await.unwrap();
        {
            let mut savepoint = Connection::begin(&mut *tx).await.unwrap();
            insert(&mut savepoint, 2, "dropped savepoint")
                .await
                .unwrap();
        }
        insert(&mut tx, 3, "committed").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            names(&pool).await,
            ["cancelled commit", "committed"],
            "own writer connection: {own}"
        );
        {
            let mut plain = pool.begin().await.unwrap();
            insert(&mut plain, 4, "dropped plain").await.unwrap();
        }
        assert_eq!(count(&pool).await, 2, "own writer connection: {own}");
        assert_file_writable(options.clone()).await;
        writes.close().await;
    }
}

/// A handler whose commit was cancelled after its `COMMIT` was sent, and which then fails
/// retryably, is not replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_commit_fences_the_request() {
    #[derive(Clone)]
    struct S {
        db: WritePool,
        calls: Arc<AtomicU32>,
        cancelled: mpsc::UnboundedSender<()>,
    }
    async fn handler(State(s): State<S>) -> Result<StatusCode, DbError> {
        let n = s.calls.fetch_add(1, Ordering::SeqCst);
        let mut tx = s.db.begin().await?;
        insert(&mut tx, i64::from(n) + 1, "once").await?;
        if tokio::time::timeout(Duration::from_millis(300), tx.commit())
            .await
            .is_err()
        {
            s.cancelled.send(()).unwrap();
            return Err(sqlx::Error::PoolTimedOut.into());
        }
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let options = db.options(SqliteJournalMode::Delete, Duration::from_secs(10));
    let (cancelled, mut on_cancel) = mpsc::unbounded_channel();
    let state = S {
        db: WritePool::new(pool_of(options.clone(), 2).await),
        calls: Arc::default(),
        cancelled,
    };
    let app = Router::new()
        .route("/", post(handler))
        .layer(fast_replays(3))
        .with_state(state.clone());
    let server = serve(app).await;
    let reader = Reader::hold(&options).await;
    let addr = server.addr;
    let reply = tokio::spawn(async move { send(&client(), addr, "/", String::new()).await });
    on_cancel.recv().await.unwrap();
    reader.release().await;
    let (status, _) = reply.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed after a commit was sent"
    );
    assert_eq!(count(state.db.pool()).await, 1);
}

/// Early returns after `begin()` and commits from eight clients at once: no request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn early_returns_never_make_other_requests_fail() {
    async fn early(State(db): State<WritePool>) -> Result<StatusCode, DbError> {
        let _tx = db.begin().await?;
        Ok(StatusCode::UNPROCESSABLE_ENTITY)
    }
    async fn commit(
        State(db): State<WritePool>,
        Json(seq): Json<i64>,
    ) -> Result<StatusCode, DbError> {
        let mut tx = db.begin().await?;
        insert(&mut tx, seq, "committed").await?;
        tx.commit().await?;
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let pool = pool_of(
        db.options(SqliteJournalMode::Wal, Duration::from_secs(5)),
        4,
    )
    .await;
    let app = Router::new()
        .route("/early", post(early))
        .route("/commit", post(commit))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().max_attempts(1),
        ))
        .with_state(WritePool::new(pool.clone()));
    let server = serve(app).await;
    let mut clients = Vec::new();
    for c in 0..8i64 {
        let addr = server.addr;
        clients.push(tokio::spawn(async move {
            let client = client();
            let mut failures = Vec::new();
            for i in 0..60i64 {
                let (status, _) = send(&client, addr, "/early", String::new()).await;
                if status != StatusCode::UNPROCESSABLE_ENTITY {
                    failures.push(status);
                }
                let (status, _) = send(&client, addr, "/commit", (c * 1000 + i).to_string()).await;
                if status != StatusCode::CREATED {
                    failures.push(status);
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} of 960 requests failed: {failures:?}",
        failures.len()
    );
    assert_eq!(count(&pool).await, 480);
}

/// A second transaction after a dropped one, in one request, begins.
#[tokio::test]
async fn a_second_transaction_after_a_dropped_one_begins() {
    async fn handler(
        State(db): State<WritePool>,
        Json(seq): Json<i64>,
    ) -> Result<StatusCode, DbError> {
        let mut first = db.begin().await?;
        insert(&mut first, seq, "dropped").await?;
        drop(first);
        let mut second = db.begin().await?;
        insert(&mut second, seq, "second").await?;
        second.commit().await?;
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let pool = pool_of(
        db.options(SqliteJournalMode::Wal, Duration::from_secs(5)),
        2,
    )
    .await;
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().max_attempts(1),
        ))
        .with_state(WritePool::new(pool.clone()));
    let server = serve(app).await;
    let client = client();
    for seq in 0..50 {
        let (status, body) = send(&client, server.addr, "/", seq.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "request {seq}: {body}");
    }
    assert_eq!(names(&pool).await, vec!["second"; 50]);
}

/// A commit in a task spawned with `in_request` fences the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_a_spawned_task_fences_the_request() {
    #[derive(Clone)]
    struct S {
        db: WritePool,
        calls: Arc<AtomicU32>,
    }
    async fn put(db: WritePool, seq: i64) -> Result<(), sqlx::Error> {
        let mut tx = db.begin().await?;
        insert(&mut tx, seq, "spawned").await?;
        tx.commit().await
    }
    async fn handler(State(s): State<S>) -> Result<StatusCode, DbError> {
        let n = s.calls.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(in_request(put(s.db.clone(), i64::from(n))))
            .await
            .expect("task")?;
        Err(sqlx::Error::PoolTimedOut.into())
    }
    let db = TestDb::new();
    let state = S {
        db: WritePool::new(
            pool_of(
                db.options(SqliteJournalMode::Wal, Duration::from_secs(5)),
                2,
            )
            .await,
        ),
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/", post(handler))
        .layer(fast_replays(3))
        .with_state(state.clone());
    let server = serve(app).await;
    let (status, _) = send(&client(), server.addr, "/", String::new()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed after a spawned commit"
    );
    assert_eq!(count(state.db.pool()).await, 1);
}

/// The deadline bounds the turn holder's `BEGIN IMMEDIATE`: answered while another connection
/// still holds the lock (busy timeout 60 s, deadline 1 s); afterwards the next request begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_bounds_the_holders_begin() {
    async fn handler(
        State(db): State<WritePool>,
        Json(seq): Json<i64>,
    ) -> Result<StatusCode, DbError> {
        let mut tx = db.begin().await?;
        insert(&mut tx, seq, "after the lock").await?;
        tx.commit().await?;
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let options = db.options(SqliteJournalMode::Wal, Duration::from_secs(60));
    let pool = pool_of(options.clone(), 2).await;
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().deadline(Duration::from_secs(1)),
        ))
        .with_state(WritePool::new(pool.clone()));
    let server = serve(app).await;
    let client = client();
    let mut lock = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(30),
        send(&client, server.addr, "/", "1".to_owned()),
    )
    .await
    .expect("answered while another connection still holds the lock");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    sqlx::query("COMMIT").execute(&mut lock).await.unwrap();
    let (status, body) = send(&client, server.addr, "/", "2".to_owned()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(names(&pool).await, ["after the lock"]);
    assert_file_writable(options).await;
}

/// A savepoint left open makes `commit()` an error and a rollback, not a `RELEASE` reported as
/// a commit.
#[tokio::test]
async fn commit_with_a_savepoint_left_open_is_an_error_not_a_silent_ok() {
    let db = TestDb::new();
    let options = db.options(SqliteJournalMode::Wal, Duration::from_secs(5));
    let pool = pool_of(options.clone(), 1).await;
    let writes = WritePool::new(pool.clone());
    let mut tx = writes.begin().await.unwrap();
    insert(&mut tx, 1, "outer").await.unwrap();
    let mut savepoint = Connection::begin(&mut *tx).await.unwrap();
    insert(&mut savepoint, 2, "inner").await.unwrap();
    std::mem::forget(savepoint);
    let error = tx.commit().await.expect_err("a savepoint is still open");
    assert!(
        matches!(error, sqlx::Error::InvalidArgument(_)),
        "{error:?}"
    );
    assert_eq!(count(&pool).await, 0);
    let mut tx = writes.begin().await.unwrap();
    insert(&mut tx, 3, "next").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(names(&pool).await, ["next"]);
    assert_file_writable(options).await;
}

/// In-memory databases: the write path writes to the pool's own database, whichever way the
/// pool was opened; unrelated ones never share a turn.
#[tokio::test]
async fn in_memory_pools_are_written_to_their_own_database() {
    let spellings: [(&str, SqliteConnectOptions); 4] = [
        ("new()", SqliteConnectOptions::new()),
        (
            "in_memory(true)",
            SqliteConnectOptions::new().in_memory(true),
        ),
        ("sqlite::memory:", "sqlite::memory:".parse().unwrap()),
        (
            "mode=memory&cache=private",
            "sqlite://?mode=memory&cache=private".parse().unwrap(),
        ),
    ];
    for (name, options) in spellings {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, seq INTEGER UNIQUE, name TEXT)")
            .execute(&pool)
            .await
            .unwrap();
        let writes = WritePool::new(pool.clone());
        let mut tx = writes
            .begin()
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        insert(&mut tx, 1, name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        tx.commit().await.unwrap();
        assert_eq!(names(&pool).await, [name], "{name}");
    }
}

#[tokio::test]
async fn unrelated_in_memory_databases_never_share_a_turn() {
    let memory = || async {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(500))
            .connect_with(SqliteConnectOptions::new().in_memory(true))
            .await
            .unwrap();
        sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, seq INTEGER UNIQUE, name TEXT)")
            .execute(&pool)
            .await
            .unwrap();
        WritePool::new(pool)
    };
    let (a, b) = (memory().await, memory().await);
    let mut held = a.begin().await.unwrap();
    insert(&mut held, 1, "a").await.unwrap();
    let mut other = b.begin().await.expect("b's turn is its own");
    insert(&mut other, 1, "b").await.unwrap();
    other.commit().await.unwrap();
    held.commit().await.unwrap();
    assert_eq!(names(a.pool()).await, ["a"]);
    assert_eq!(names(b.pool()).await, ["b"]);
}

/// Group commit on sqlx 0.8 (on by default): each transaction commits on its own (its row is
/// in the file at its `COMMIT`), and those that commit while an fsync waits share the next one;
/// a dropped transaction leaves nothing.
#[tokio::test]
async fn group_commit_shares_the_fsync() {
    let db = TestDb::new();
    let pool = pool_of(
        db.options(SqliteJournalMode::Wal, Duration::from_secs(5)),
        2,
    )
    .await;
    let writes = WritePool::new(pool.clone());
    let mut warm = writes.begin().await.unwrap();
    insert(&mut warm, 1, "warm").await.unwrap();
    warm.commit().await.unwrap();
    assert!(
        tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, true),
        "WAL at FULL: the fsync is shared"
    );
    let mut commits = Vec::new();
    for (id, name) in [(2, "a"), (3, "b")] {
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, id, name).await.unwrap();
        commits.push(tokio::spawn(tx.commit()));
        let committed = async {
            while !names(&pool).await.contains(&name.to_owned()) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), committed)
            .await
            .unwrap();
    }
    {
        let mut dropped = writes.begin().await.unwrap();
        insert(&mut dropped, 4, "dropped").await.unwrap();
    }
    assert!(
        commits.iter().all(|c| !c.is_finished()),
        "acknowledged before the fsync"
    );
    tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, false);
    for commit in commits {
        commit.await.unwrap().unwrap();
    }
    let mut names = names(&pool).await;
    names.sort();
    assert_eq!(names, ["a", "b", "warm"]);
    let stats = writes.stats().unwrap();
    // The warm-up was alone (its COMMIT fsynced itself); a and b shared one.
    assert_eq!((stats.syncs, stats.synced), (1, 2), "{stats:?}");
}
