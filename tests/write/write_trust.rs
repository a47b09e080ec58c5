//! The write path as trustworthy as sqlx's own `Transaction`, in every way a handler ends: a
//! commit cancelled half-way, an early return, a second transaction after a dropped one, a
//! commit in a task the handler spawns, a write through the pool inside an open transaction,
//! a `BEGIN IMMEDIATE` that outlives the deadline, in-memory databases, a savepoint left open.
//!
//! Each test makes its situation deterministic: a reader's open transaction in rollback-journal
//! mode keeps a `COMMIT` waiting, a held `BEGIN IMMEDIATE` keeps a `BEGIN` waiting, a channel
//! says when a handler reached a point. None asserts a wall-clock bound: where a wait must end
//! "early", it must end *before the test releases what it waits for*.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use common::{HttpClient, TestDb, serve};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::mpsc;
use tower_sqlite_retry::write::WriterConnection;
use tower_sqlite_retry::{DbError, Jitter, RetryPolicy, SqliteRetryLayer, WritePool, in_request};

/// Options on `db`'s file in rollback-journal mode (`DELETE`): a reader's open transaction
/// keeps a writer's `COMMIT` waiting (in WAL it would not).
fn rollback_journal(db: &TestDb, busy_timeout: Duration) -> SqliteConnectOptions {
    db.options(busy_timeout)
        .journal_mode(SqliteJournalMode::Delete)
}

/// A pool of `connections` with these options, opened up front, with the `items` table.
async fn pool_of(options: SqliteConnectOptions, connections: u32) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("pool");
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS items (
            id INTEGER PRIMARY KEY,
            seq INTEGER NOT NULL UNIQUE,
            name TEXT NOT NULL
        )",
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

/// Another connection can take the write lock at once (busy timeout 0): nobody left a write
/// transaction open on the file.
async fn assert_file_writable(db: &TestDb, options: SqliteConnectOptions) {
    let _ = db;
    let mut other = SqliteConnection::connect_with(&options.busy_timeout(Duration::ZERO))
        .await
        .expect("connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("the file is writable by another connection");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
}

/// A connection that tells when a `COMMIT` on its file waits for a reader (rollback-journal
/// mode): the committing connection then holds the `PENDING` lock, and a new read here (busy
/// timeout 0) is refused `SQLITE_BUSY`, which it is not before (the writer holds `RESERVED`
/// until its `COMMIT`). A condition polled, not a time guessed. Opened before the writer's
/// transaction (opening one runs statements of its own).
struct CommitProbe(SqliteConnection);

impl CommitProbe {
    async fn open(options: &SqliteConnectOptions) -> Self {
        let options = options.clone().busy_timeout(Duration::ZERO);
        Self(
            SqliteConnection::connect_with(&options)
                .await
                .expect("the probe"),
        )
    }

    /// Returns once a `COMMIT` waits for a reader.
    async fn commit_waits(&mut self) {
        let start = std::time::Instant::now();
        loop {
            // (read to its end: a statement left unfinished would hold a read lock itself)
            let read: Result<Vec<i64>, _> = sqlx::query_scalar("SELECT COUNT(*) FROM items")
                .fetch_all(&mut self.0)
                .await;
            if read.is_err() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no COMMIT waited for the reader in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A reader's open read transaction (rollback-journal mode): a writer's `COMMIT` waits in its
/// busy handler until [`release`](Reader::release).
struct Reader(SqliteConnection);

impl Reader {
    async fn hold(options: &SqliteConnectOptions) -> Self {
        let mut conn = SqliteConnection::connect_with(options)
            .await
            .expect("reader");
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

/// A `commit()` cancelled while its `COMMIT` waits (the client went away, a timeout) makes sqlx's
/// worker expect the acknowledgement-less rollback sqlx's own `Transaction` would send on drop.
/// The write path must send exactly that, so that the connection is handed on clean: the next
/// transaction's dropped savepoint is rolled back, and its `commit()` is `Ok` only with its rows
/// in the file. With the writer connection and with a connection from the pool (where a plain
/// `pool.begin()` dropped on an error path must still roll back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_commit_hands_on_a_clean_connection() {
    for own in [true, false] {
        let db = TestDb::new();
        let options = rollback_journal(&db, Duration::from_secs(10));
        let pool = pool_of(options.clone(), 1).await;
        let writes = WritePool::new(pool.clone()).writer(if own {
            WriterConnection::Own
        } else {
            WriterConnection::FromPool
        });

        let mut probe = CommitProbe::open(&options).await;
        let reader = Reader::hold(&options).await;
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, 1, "cancelled commit").await.unwrap();
        // (boxed: dropping it below cancels it; a stack pin would only stop polling it)
        let mut commit = Box::pin(tx.commit());
        let answered = tokio::select! {
            answered = &mut commit => Some(answered),
            () = probe.commit_waits() => None,
        };
        assert!(answered.is_none(), "the COMMIT waits for the reader");
        drop(commit); // cancelled while its COMMIT waits
        drop(probe);
        reader.release().await; // the COMMIT now goes through, unacknowledged

        let mut tx = writes.begin().await.unwrap();
        {
            let mut savepoint = Connection::begin(&mut *tx).await.unwrap();
            insert(&mut savepoint, 2, "dropped savepoint")
                .await
                .unwrap();
            // dropped: rolled back to the savepoint, as sqlx does
        }
        insert(&mut tx, 3, "committed").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            names(&pool).await,
            ["cancelled commit", "committed"],
            "own writer connection: {own}"
        );

        // A plain transaction on the pool, dropped on an error path, rolls back.
        {
            let mut plain = pool.begin().await.unwrap();
            insert(&mut plain, 4, "dropped plain").await.unwrap();
        }
        assert_eq!(count(&pool).await, 2, "own writer connection: {own}");
        assert_file_writable(&db, options.clone()).await;
        writes.close().await;
    }
}

/// A handler whose commit is cancelled after its `COMMIT` was sent, and which then fails
/// retryably, is not replayed: the commit may have reached the file, so it fenced the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_commit_fences_the_request() {
    #[derive(Clone)]
    struct S {
        db: WritePool,
        calls: Arc<AtomicU32>,
        cancelled: mpsc::UnboundedSender<()>,
        options: SqliteConnectOptions,
    }
    async fn handler(State(s): State<S>) -> Result<StatusCode, DbError> {
        let n = s.calls.fetch_add(1, Ordering::SeqCst);
        let mut probe = CommitProbe::open(&s.options).await;
        let mut tx = s.db.begin().await?;
        insert(&mut tx, i64::from(n) + 1, "once").await?;
        let answered = tokio::select! {
            answered = tx.commit() => Some(answered),
            () = probe.commit_waits() => None,
        };
        if answered.is_none() {
            s.cancelled.send(()).unwrap();
            return Err(sqlx::Error::PoolTimedOut.into());
        }
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let options = rollback_journal(&db, Duration::from_secs(10));
    let (cancelled, mut on_cancel) = mpsc::unbounded_channel();
    let state = S {
        db: WritePool::new(pool_of(options.clone(), 2).await),
        calls: Arc::default(),
        cancelled,
        options: options.clone(),
    };
    let app = Router::new()
        .route("/", post(handler))
        .layer(fast_replays(3))
        .with_state(state.clone());
    let server = serve(app).await;
    let reader = Reader::hold(&options).await;
    let client = HttpClient::new(server.addr);
    let reply = tokio::spawn(async move { client.post("/", "").await });
    on_cancel.recv().await.unwrap();
    reader.release().await;
    let reply = reply.await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed after a commit was sent"
    );
    assert_eq!(count(state.db.pool()).await, 1);
}

/// Replays at once, up to `attempts`.
fn fast_replays(attempts: u32) -> SqliteRetryLayer {
    SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(attempts)
            .base_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(2))
            .jitter(Jitter::Full),
    )
}

/// Handlers that return early after `begin()` (validation, `?`) and handlers that commit, from
/// eight clients at once over real HTTP: no request is ever refused because another one's
/// transaction was being rolled back (a request's identity is never reused while a turn still
/// names it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn early_returns_never_make_other_requests_fail() {
    async fn early(State(db): State<WritePool>) -> Result<StatusCode, DbError> {
        let _tx = db.begin().await?;
        Ok(StatusCode::UNPROCESSABLE_ENTITY) // validation failed: the transaction drops
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
    let pool = pool_of(db.options(Duration::from_secs(5)), 4).await;
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
        let client = HttpClient::new(server.addr);
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for i in 0..60i64 {
                let early = client.post("/early", "").await;
                if early.status != StatusCode::UNPROCESSABLE_ENTITY {
                    failures.push(early.status);
                }
                let seq = c * 1000 + i;
                let committed = client.post("/commit", seq.to_string()).await;
                if committed.status != StatusCode::CREATED {
                    failures.push(committed.status);
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

/// A request that dropped its first write transaction may begin a second at once: the
/// dropped one's rollback is waited for, not mistaken for this request's open transaction.
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
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().max_attempts(1),
        ))
        .with_state(WritePool::new(pool.clone()));
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    for seq in 0..50 {
        let reply = client.post("/", seq.to_string()).await;
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "request {seq}: {}",
            reply.text()
        );
    }
    assert_eq!(names(&pool).await, vec!["second"; 50]);
}

/// The cancel-safe pattern, `tokio::spawn(in_request(store.put(..))).await`: the spawned task's
/// commit fences the request (a retryable failure after it is not replayed), and its wait for
/// the turn ends at the request's deadline.
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
        Err(sqlx::Error::PoolTimedOut.into()) // a retryable failure after the commit
    }
    let db = TestDb::new();
    let state = S {
        db: WritePool::new(pool_of(db.options(Duration::from_secs(5)), 2).await),
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/", post(handler))
        .layer(fast_replays(3))
        .with_state(state.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed after a spawned commit"
    );
    assert_eq!(count(state.db.pool()).await, 1);
}

/// A spawned task's wait for the turn ends at the request's deadline (1 s), not at the pool's
/// `acquire_timeout` (60 s): the answer comes while another writer still holds the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_task_waits_for_the_turn_no_longer_than_the_deadline() {
    async fn handler(State(db): State<WritePool>) -> Result<StatusCode, DbError> {
        let put = async move {
            let tx = db.begin().await?;
            tx.commit().await
        };
        tokio::spawn(in_request(put)).await.expect("task")?;
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(db.options(Duration::from_secs(5)))
        .await
        .unwrap();
    let writes = WritePool::new(pool);
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().deadline(Duration::from_secs(1)),
        ))
        .with_state(writes.clone());
    let server = serve(app).await;
    let held = writes.begin().await.unwrap(); // the turn, held by the test
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        HttpClient::new(server.addr).post("/", ""),
    )
    .await
    .expect("answered while the turn is still held");
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    held.rollback().await.unwrap();
}

/// A write through the pool inside the request's own open write transaction waits for the
/// transaction's lock and fails `SQLITE_BUSY`: a replay would only do the same again, so the
/// request is answered at once (500), not replayed until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_write_inside_the_open_transaction_is_not_replayed() {
    #[derive(Clone)]
    struct S {
        db: WritePool,
        calls: Arc<AtomicU32>,
    }
    async fn handler(State(s): State<S>) -> Result<StatusCode, DbError> {
        s.calls.fetch_add(1, Ordering::SeqCst);
        let mut tx = s.db.begin().await?;
        insert(&mut tx, 1, "in the transaction").await?;
        // The mistake: a write through the pool, not through `&mut *tx`.
        sqlx::query("INSERT INTO items (seq, name) VALUES (2, 'through the pool')")
            .execute(s.db.pool())
            .await?;
        tx.commit().await?;
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let state = S {
        db: WritePool::new(pool_of(db.options(Duration::from_millis(200)), 2).await),
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default()
                .deadline(Duration::from_secs(20))
                .base_delay(Duration::from_millis(1))
                .max_delay(Duration::from_millis(2)),
        ))
        .with_state(state.clone());
    let server = serve(app).await;
    let reply = HttpClient::new(server.addr).post("/", "").await;
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "replayed a self-inflicted SQLITE_BUSY"
    );
    assert_eq!(count(state.db.pool()).await, 0);
}

/// The request's deadline bounds the turn holder's `BEGIN IMMEDIATE` too: with another
/// connection holding the write lock and a `busy_timeout` of 60 s, a request with a 1 s
/// deadline is answered while the lock is still held; once it is released, the next request
/// begins on a clean connection.
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
    let pool = pool_of(db.options(Duration::from_secs(60)), 2).await;
    let app = Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().deadline(Duration::from_secs(1)),
        ))
        .with_state(WritePool::new(pool.clone()));
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let lock = db.hold_write_lock().await;
    let reply = tokio::time::timeout(Duration::from_secs(30), client.post("/", "1"))
        .await
        .expect("answered while another connection still holds the lock");
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    lock.release().await;
    let reply = client.post("/", "2").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    assert_eq!(names(&pool).await, ["after the lock"]);
    assert_file_writable(&db, db.options(Duration::ZERO)).await;
}

/// A savepoint left open (a nested transaction forgotten) would turn `COMMIT` into a
/// `RELEASE`: `commit()` refuses instead, rolls the whole transaction back, and the next writer
/// begins on a clean connection.
#[tokio::test]
async fn commit_with_a_savepoint_left_open_is_an_error_not_a_silent_ok() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 1).await;
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
    assert_file_writable(&db, db.options(Duration::ZERO)).await;
}

/// In-memory databases: the write path writes to the pool's own database, whichever way the
/// pool was opened, and two unrelated in-memory databases never share a turn.
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

/// A transaction dropped where no runtime can run its rollback task (on a thread outside any
/// runtime) still hands its turn on and commits nothing: the task is dropped unpolled, and its
/// guard settles the connection (not handed on as clean) and the turn.
#[test]
fn a_transaction_dropped_outside_a_runtime_hands_the_turn_on() {
    let db = TestDb::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (writes, pool, tx) = runtime.block_on(async {
        let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
        let writes = WritePool::new(pool.clone());
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, 1, "dropped").await.unwrap();
        (writes, pool, tx)
    });
    std::thread::spawn(move || {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "no runtime here"
        );
        drop(tx);
    })
    .join()
    .unwrap();
    runtime.block_on(async {
        let mut tx = tokio::time::timeout(Duration::from_secs(10), writes.begin())
            .await
            .expect("the turn was handed on")
            .unwrap();
        insert(&mut tx, 2, "next").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            names(&pool).await,
            ["next"],
            "the dropped write is not committed"
        );
    });
}

/// Awaits `fut` for at most `polls` polls, each made when it was woken (so each one past the
/// first is a step it took past one of its awaits): its output, or `None` when it was dropped
/// there, pending (cancelled at that await).
struct CancelAfter<F: std::future::Future> {
    fut: std::pin::Pin<Box<F>>,
    polls: u32,
}

impl<F: std::future::Future> std::future::Future for CancelAfter<F> {
    type Output = Option<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if self.polls == 0 {
            return std::task::Poll::Ready(None);
        }
        self.polls -= 1;
        self.fut.as_mut().poll(cx).map(Some)
    }
}

fn cancel_after<F: std::future::Future>(fut: F, polls: u32) -> CancelAfter<F> {
    CancelAfter {
        fut: Box::pin(fut),
        polls,
    }
}

/// With `WriterConnection::FromPool` the commit gate is set on the pool's connection after
/// `BEGIN IMMEDIATE` and taken off at the transaction's end: `begin()` cancelled at each of its
/// awaits, and `commit()` at each of its (the gate's included), hand the pool's one connection
/// back with no gate on it (the pool's own autocommit write commits) and with no transaction
/// left (that write is in the file, and the next transaction commits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_pool_cancelled_at_every_await_leaves_no_gate_behind() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 1).await;
    let writes = WritePool::new(pool.clone()).writer(WriterConnection::FromPool);
    let (mut seq, mut own, mut begins_cancelled, mut commits_cancelled) = (0, 0, 0, 0);
    for begin_polls in 0..24u32 {
        for commit_polls in 0..24u32 {
            match cancel_after(writes.begin(), begin_polls).await {
                None => begins_cancelled += 1,
                Some(begun) => {
                    let mut tx = begun.expect("begin");
                    seq += 1;
                    insert(&mut tx, seq, "cancelled commit").await.unwrap();
                    if cancel_after(tx.commit(), commit_polls).await.is_none() {
                        commits_cancelled += 1;
                    }
                }
            }
            seq += 1;
            own += 1;
            sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'the pool''s own')")
                .bind(seq)
                .execute(&pool)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "begin cancelled after {begin_polls} polls, commit after \
                         {commit_polls}: the pool's own write: {e}"
                    )
                });
            seq += 1;
            let mut tx = writes.begin().await.unwrap();
            insert(&mut tx, seq, "next").await.unwrap();
            tx.commit().await.unwrap_or_else(|e| {
                panic!("after {begin_polls}/{commit_polls} polls: the next transaction: {e}")
            });
            if begin_polls == 0 {
                break; // a begin never polled: one commit count is enough
            }
        }
    }
    eprintln!(
        "from_pool_cancelled_at_every_await: {begins_cancelled} begins and {commits_cancelled} \
         commits cancelled at an await"
    );
    assert!(
        begins_cancelled > 1 && commits_cancelled > 1,
        "cancelled at awaits of both"
    );
    let in_file: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE name = 'the pool''s own'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        in_file, own,
        "every one of the pool's own writes is in the file"
    );
}
