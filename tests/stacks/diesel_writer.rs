//! `DieselWriteThread` held to the write path's contracts, on whichever Diesel the including
//! package links: the Diesel stack (`diesel/`, Diesel 2.3) and the packages that pin the
//! manifest's floor (`diesel-2_2/`, Diesel 2.2.12) and the newest release (`diesel-2_4/`).
//! Each includes this file (`#[path = "../../diesel_writer.rs"] mod contract;`); it needs
//! only Diesel's SQLite backend, axum, hyper, tokio and this crate, and no schema of the
//! package's own.
//!
//! - every wait ends by the caller's deadline: another connection's lock (held by the test,
//!   for longer than the test) does not hold a request past its deadline, nor the requests
//!   queued behind it, whose closures never run;
//! - nothing a closure does wedges the writer connection or its Diesel transaction manager:
//!   a trigger's `RAISE(ROLLBACK)`, a raw `COMMIT` then an error, `SQLITE_FULL`, a level of
//!   Diesel's manager left open, a panic; after each, another connection takes the write lock
//!   at once and the next closure commits;
//! - a closure that ended its transaction, or met its own lock through a connection of its
//!   own, is not replayed;
//! - the file is known by SQLite's name for it (a `file:` URI writer shares the file's turn);
//!   no runtime is needed to open it; a request's second closure waits for its first.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_sqlite_retry::write::{DieselWriteThread, WriteQueue, WriteThreadOptions};
use tower_sqlite_retry::{DbError, Jitter, RetryPolicy, SqliteRetryLayer};

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS blobs (id INTEGER PRIMARY KEY, data BLOB NOT NULL);
     CREATE TRIGGER IF NOT EXISTS refuse_boom BEFORE INSERT ON items WHEN new.name = 'boom'
     BEGIN SELECT RAISE(ROLLBACK, 'boom refused'); END;";

/// Bounds what must happen while the test holds a lock: a hang fails the test instead.
const HANG: Duration = Duration::from_secs(60);

/// A file of its own, deleted with the value.
pub struct Db {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Db {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("contract.db");
        Self { _dir: dir, path }
    }

    fn url(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// A writer whose `busy_timeout` outlasts any test: only the deadline can end its waits.
async fn patient_writer(db: &Db) -> DieselWriteThread {
    DieselWriteThread::open_with(
        &db.path,
        WriteThreadOptions::default().busy_timeout(Duration::from_secs(600)),
        |conn| conn.batch_execute(SCHEMA),
    )
    .expect("open the writer")
}

async fn insert(writes: &DieselWriteThread, name: &str) -> Result<usize, DieselError> {
    let name = name.to_owned();
    writes
        .transaction(move |conn| {
            diesel::sql_query("INSERT INTO items (name) VALUES (?)")
                .bind::<diesel::sql_types::Text, _>(name)
                .execute(conn)
        })
        .await
}

/// The names in the file, in order, read through a connection of their own.
fn names(path: &Path) -> Vec<String> {
    let mut conn = SqliteConnection::establish(path.to_str().unwrap()).unwrap();
    let joined: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
        "(SELECT coalesce(group_concat(name, '|'), '') FROM (SELECT name FROM items ORDER BY id))",
    ))
    .get_result(&mut conn)
    .unwrap();
    if joined.is_empty() {
        Vec::new()
    } else {
        joined.split('|').map(str::to_owned).collect()
    }
}

/// Another connection holding the file's write lock, as another process would.
struct OtherWriter(SqliteConnection);

impl OtherWriter {
    fn hold(db: &Db) -> Self {
        let mut conn = SqliteConnection::establish(db.url()).unwrap();
        conn.batch_execute("PRAGMA busy_timeout = 30000; BEGIN IMMEDIATE")
            .unwrap();
        Self(conn)
    }

    fn release(mut self) {
        self.0.batch_execute("COMMIT").unwrap();
    }
}

/// Whether another connection can take the write lock now, without waiting.
fn lock_is_free(db: &Db) -> bool {
    let mut conn = SqliteConnection::establish(db.url()).unwrap();
    let free = conn.batch_execute("BEGIN IMMEDIATE").is_ok();
    let _ = conn.batch_execute("ROLLBACK");
    free
}

async fn poll_until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..15_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{what}: not within 30 s");
}

fn fast_policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .jitter(Jitter::Full)
}

/// Serves `app` on loopback; the server stops with the returned handle.
async fn serve(app: Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, task)
}

async fn send(addr: std::net::SocketAddr, path: &str, body: String) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let request = http::Request::post(format!("http://{addr}{path}"))
        .body(Body::from(body))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[derive(Clone)]
struct App {
    writes: DieselWriteThread,
    path: PathBuf,
    /// Closures that began (past `BEGIN IMMEDIATE`), and handler calls.
    ran: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

async fn create(State(app): State<App>, name: String) -> Result<String, DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let ran = Arc::clone(&app.ran);
    let inserted = app
        .writes
        .transaction(move |conn| {
            ran.fetch_add(1, Ordering::SeqCst);
            diesel::sql_query("INSERT INTO items (name) VALUES (?)")
                .bind::<diesel::sql_types::Text, _>(name)
                .execute(conn)
        })
        .await?;
    Ok(inserted.to_string())
}

/// Commits with a raw `COMMIT`, then fails retryably (`database is locked`).
async fn raw_commit_then_busy(State(app): State<App>) -> Result<(), DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    app.writes
        .transaction(|conn| {
            conn.batch_execute("INSERT INTO items (name) VALUES ('raw'); COMMIT")?;
            Err::<(), _>(busy())
        })
        .await?;
    Ok(())
}

/// Writes through a connection of its own inside the closure: it meets its own lock.
async fn write_through_another_connection(State(app): State<App>) -> Result<(), DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let url = app.path.to_str().unwrap().to_owned();
    app.writes
        .transaction(move |_conn| {
            let mut other = SqliteConnection::establish(&url)
                .map_err(|e| DieselError::QueryBuilderError(e.to_string().into()))?;
            other.batch_execute("INSERT INTO items (name) VALUES ('other')")
        })
        .await?;
    Ok(())
}

/// Two closures of one request in flight at once: the second sent while the first holds the
/// turn.
async fn two_at_once(State(app): State<App>) -> Result<String, DbError> {
    let (started, began) = tokio::sync::oneshot::channel::<()>();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let first = app.writes.transaction(move |conn| {
        let _ = started.send(());
        let _ = wait.recv_timeout(HANG);
        conn.batch_execute("INSERT INTO items (name) VALUES ('first')")
    });
    let second = async {
        began.await.expect("the first began");
        let mut second = pin!(app.writes.transaction(|conn| {
            conn.batch_execute("INSERT INTO items (name) VALUES ('second')")
        }));
        let sent = futures_poll_once(second.as_mut()).await;
        let _ = go.send(());
        match sent {
            Some(done) => done,
            None => second.await,
        }
    };
    let (first, second) = tokio::join!(first, second);
    first?;
    second?;
    Ok("both".to_owned())
}

/// Polls a future once: its output if ready.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

fn busy() -> DieselError {
    DieselError::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new("database is locked".to_owned()),
    )
}

async fn app(
    db: &Db,
    policy: RetryPolicy,
) -> (App, std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let state = App {
        writes: patient_writer(db).await,
        path: db.path.clone(),
        ran: Arc::default(),
        calls: Arc::default(),
    };
    let router = Router::new()
        .route("/items", post(create))
        .route("/raw", post(raw_commit_then_busy))
        .route("/second-connection", post(write_through_another_connection))
        .route("/both", post(two_at_once))
        .layer(SqliteRetryLayer::new(policy))
        .with_state(state.clone());
    let (addr, server) = serve(router).await;
    (state, addr, server)
}

/// Over real HTTP, under the layer: while another connection holds the write lock (longer than
/// the test), a request with a 300 ms deadline is answered `503` while the lock is still held:
/// the writer connection's busy handler gave up at the deadline, not at its 10 minutes. Then
/// 50 requests queue behind a closure with no deadline that waits for the lock: each is
/// answered `503` at its own deadline, the lock still held, and none of their closures runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_ends_by_the_callers_deadline() {
    let db = Db::new();
    let policy = fast_policy(3).deadline(Duration::from_millis(300));
    let (state, addr, _server) = app(&db, policy).await;
    let other = OtherWriter::hold(&db);
    let (status, body) = tokio::time::timeout(HANG, send(addr, "/items", "late".into()))
        .await
        .expect("answered while another connection still holds the lock");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let first = {
        let writes = state.writes.clone();
        tokio::spawn(async move { insert(&writes, "first").await })
    };
    poll_until("the writer thread holds the turn for the first", || {
        state.writes.stats().held
    })
    .await;
    let queued: Vec<_> = (0..50)
        .map(|i| tokio::spawn(send(addr, "/items", format!("queued-{i}"))))
        .collect();
    for request in queued {
        let (status, body) = tokio::time::timeout(HANG, request)
            .await
            .expect("answered while the lock is still held")
            .unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    }
    assert!(!first.is_finished(), "the first still waits for the lock");
    assert_eq!(state.writes.stats().waiting, 0);
    other.release();
    first
        .await
        .unwrap()
        .expect("the first commits once the lock is free");
    assert_eq!(
        state.ran.load(Ordering::SeqCst),
        0,
        "an answered caller's closure ran"
    );
    assert_eq!(names(&db.path), ["first"]);
}

/// Whatever a closure does to its transaction, the connection (and Diesel's transaction
/// manager) is clean before the next: the caller is told its own error, another connection
/// takes the write lock at once, and the next closure commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_closure_does_wedges_the_writer() {
    let db = Db::new();
    let writes = DieselWriteThread::open_with(&db.path, WriteThreadOptions::default(), |conn| {
        conn.batch_execute(SCHEMA)?;
        // Room for a few rows, not for a mebibyte: `SQLITE_FULL`.
        conn.batch_execute("PRAGMA max_page_count = 64")
    })
    .expect("open the writer");
    let mut next = 0;
    let mut go_on = async |case: &str| {
        assert!(lock_is_free(&db), "{case}: the write lock was left held");
        next += 1;
        insert(&writes, &format!("next-{next}"))
            .await
            .unwrap_or_else(|e| panic!("{case}: the next closure failed: {e}"));
    };

    // A trigger's RAISE(ROLLBACK): SQLite rolls the whole transaction back itself.
    let error = writes
        .transaction(|conn| {
            conn.batch_execute("INSERT INTO items (name) VALUES ('before boom')")?;
            conn.batch_execute("INSERT INTO items (name) VALUES ('boom')")
        })
        .await
        .expect_err("the trigger refuses");
    assert!(error.to_string().contains("boom refused"), "{error}");
    go_on("RAISE(ROLLBACK)").await;

    // A raw COMMIT, then an error.
    let error = writes
        .transaction(|conn| {
            conn.batch_execute("INSERT INTO items (name) VALUES ('raw commit'); COMMIT")?;
            Err::<(), _>(DieselError::RollbackTransaction)
        })
        .await
        .expect_err("its own error");
    assert!(matches!(error, DieselError::RollbackTransaction), "{error}");
    go_on("a raw COMMIT then Err").await;

    // A level of Diesel's manager begun and left open (what a dropped guard of a transaction
    // that never rolls back leaves): the commit would only release it.
    let error = writes
        .transaction(|conn| {
            AnsiTransactionManager::begin_transaction(conn)?;
            conn.batch_execute("INSERT INTO items (name) VALUES ('left open')")
        })
        .await
        .expect_err("told, never committed");
    assert!(error.to_string().contains("left open"), "{error}");
    go_on("a level left open").await;

    // A panic, the transaction open.
    let error = writes
        .transaction(|conn| -> Result<(), DieselError> {
            conn.batch_execute("INSERT INTO items (name) VALUES ('panicked')")?;
            panic!("a bug in the closure");
        })
        .await
        .expect_err("the caller is told");
    assert!(error.to_string().contains("panicked"), "{error}");
    go_on("a panic").await;

    // SQLITE_FULL: a mebibyte past `max_page_count`.
    let error = writes
        .transaction(|conn| {
            conn.batch_execute("INSERT INTO items (name) VALUES ('before full')")?;
            conn.batch_execute("INSERT INTO blobs (data) VALUES (zeroblob(1048576))")
        })
        .await
        .expect_err("the database is full");
    assert!(error.to_string().contains("full"), "{error}");
    go_on("SQLITE_FULL").await;

    assert_eq!(
        names(&db.path),
        [
            "next-1",
            "raw commit",
            "next-2",
            "next-3",
            "next-4",
            "next-5"
        ],
        "only what committed: the raw COMMIT's row, and the closures after each case"
    );
}

/// Over real HTTP, under the layer: a closure that committed with a raw `COMMIT` and then
/// failed retryably is not replayed (the row is there once), nor is one whose write through a
/// connection of its own met the lock its own transaction holds. One call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_that_ended_its_transaction_or_met_its_own_lock_is_not_replayed() {
    let db = Db::new();
    let (state, addr, _server) = app(&db, fast_policy(5)).await;
    let (status, body) = send(addr, "/raw", String::new()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(state.calls.swap(0, Ordering::SeqCst), 1, "never replayed");
    assert_eq!(names(&db.path), ["raw"], "once");
    let (status, body) = send(addr, "/second-connection", String::new()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(state.calls.swap(0, Ordering::SeqCst), 1, "never replayed");
    insert(&state.writes, "after").await.unwrap();
    assert_eq!(names(&db.path), ["raw", "after"]);
}

/// Two closures of one request in flight at once: the second waits for the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_closure_of_one_request_waits_for_the_first() {
    let db = Db::new();
    let (_state, addr, _server) = app(&db, fast_policy(1)).await;
    let (status, body) = send(addr, "/both", String::new()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(names(&db.path), ["first", "second"]);
}

/// A writer opened with a `file:` URI is the file's writer: while the file's turn is held
/// through a `WriteQueue` (the one every `WritePool` on the file shares), its closure waits,
/// counted waiting; then it writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_opened_by_uri_shares_the_files_turn() {
    let db = Db::new();
    let uri = format!("file:{}?mode=rwc", db.path.display());
    let writes = DieselWriteThread::open_with(&uri, WriteThreadOptions::default(), |conn| {
        conn.batch_execute(SCHEMA)
    })
    .expect("open by URI");
    let queue = WriteQueue::for_file(&db.path);
    let held = queue.turn(Duration::from_secs(5)).await.unwrap();
    let waiting = {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, "by uri").await })
    };
    poll_until("the closure waits for the file's turn", || {
        writes.stats().waiting == 1
    })
    .await;
    assert!(!waiting.is_finished());
    held.committed();
    waiting
        .await
        .unwrap()
        .expect("it writes once the turn is free");
    assert_eq!(names(&db.path), ["by uri"]);
}

/// A writer opened before the runtime waits for a turn held elsewhere in the process, instead
/// of being told at once that a deadline it does not have passed.
#[test]
fn a_writer_opened_before_the_runtime_waits_for_the_turn() {
    let db = Db::new();
    let writes = DieselWriteThread::open_with(&db.path, WriteThreadOptions::default(), |conn| {
        conn.batch_execute(SCHEMA)
    })
    .expect("open without a runtime");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let held = WriteQueue::for_file(&db.path)
            .turn(Duration::from_secs(5))
            .await
            .unwrap();
        let waiting = {
            let writes = writes.clone();
            tokio::spawn(async move { insert(&writes, "waited").await })
        };
        poll_until("the closure waits for the turn", || {
            writes.stats().waiting == 1
        })
        .await;
        held.committed();
        waiting.await.unwrap().expect("it waited, then wrote");
    });
    assert_eq!(names(&db.path), ["waited"]);
}
