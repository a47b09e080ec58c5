//! The writer thread (rusqlite's `WriteThread`) held to the write path's contracts, each as a
//! user meets it, on real SQLite files: every wait ends by the caller's deadline (another
//! connection's lock held by the test, not a sleep), nothing a closure does wedges the writer
//! connection, the queue is bounded, visible and freed when its callers leave, a second closure
//! of one request waits for the first, a closure's own `SQLITE_BUSY` is not replayed, the file
//! is known by SQLite's name for it, and no runtime is needed to open it. (The Diesel writer's
//! own: `tests/stacks/diesel_writer.rs`.)

use crate::common;

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use common::{HttpClient, TestDb, poll_until, serve};
use tower_sqlite_retry::write::{WriteQueue, WriteThread, WriteThreadOptions};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS blobs (id INTEGER PRIMARY KEY, data BLOB NOT NULL);
     CREATE TRIGGER IF NOT EXISTS refuse_boom BEFORE INSERT ON items WHEN new.name = 'boom'
     BEGIN SELECT RAISE(ROLLBACK, 'boom refused'); END;";

/// A writer whose `busy_timeout` is far longer than any test: a wait for another connection's
/// lock that the deadline does not end would outlast the test's own bound.
async fn patient_writer(db: &TestDb) -> WriteThread {
    let writes = WriteThread::open_with(
        &db.path,
        WriteThreadOptions::default().busy_timeout(Duration::from_secs(600)),
        |_| Ok(()),
    )
    .expect("open the writer");
    writes
        .transaction(|tx| tx.execute_batch(SCHEMA))
        .await
        .expect("schema");
    writes
}

async fn insert(writes: &WriteThread, name: &str) -> Result<i64, rusqlite::Error> {
    let name = name.to_owned();
    writes
        .transaction(move |tx| {
            tx.execute("INSERT INTO items (name) VALUES (?1)", [&name])?;
            Ok(tx.last_insert_rowid())
        })
        .await
}

fn names(db: &TestDb) -> Vec<String> {
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    let mut statement = conn.prepare("SELECT name FROM items ORDER BY id").unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Another connection holding the file's write lock (`BEGIN IMMEDIATE`), as another process
/// would, until released.
struct OtherWriter(rusqlite::Connection);

impl OtherWriter {
    fn hold(db: &TestDb) -> Self {
        let conn = rusqlite::Connection::open(&db.path).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        Self(conn)
    }

    fn release(self) {
        self.0.execute_batch("COMMIT").unwrap();
    }
}

/// Whether another connection can take the file's write lock now, without waiting.
fn lock_is_free(db: &TestDb) -> bool {
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    let free = conn.execute_batch("BEGIN IMMEDIATE").is_ok();
    let _ = conn.execute_batch("ROLLBACK");
    free
}

#[derive(Clone)]
struct App {
    writes: WriteThread,
    /// Closures that began (past `BEGIN IMMEDIATE`).
    ran: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

async fn create(State(app): State<App>, name: String) -> Result<String, DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let ran = Arc::clone(&app.ran);
    let id = app
        .writes
        .transaction(move |tx| {
            ran.fetch_add(1, Ordering::SeqCst);
            tx.execute("INSERT INTO items (name) VALUES (?1)", [&name])?;
            Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
        })
        .await?;
    Ok(id.to_string())
}

fn app(writes: WriteThread, policy: RetryPolicy) -> (Router, App) {
    let state = App {
        writes,
        ran: Arc::default(),
        calls: Arc::default(),
    };
    let router = Router::new()
        .route("/items", post(create))
        .layer(SqliteRetryLayer::new(policy))
        .with_state(state.clone());
    (router, state)
}

/// Bounds a request that must be answered while the test holds a lock: a hang (a wait the
/// deadline did not end) fails the test instead of hanging it.
const HANG: Duration = Duration::from_secs(60);

/// Over real HTTP, under the layer: while another connection holds the file's write lock (for
/// longer than the test), a request with a 300 ms deadline is answered `503`, while the lock
/// is still held: SQLite's busy handler on the writer connection gave up at the deadline, not
/// at its `busy_timeout` (10 minutes here). Its closure never began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_ends_a_wait_for_another_connections_lock() {
    let db = TestDb::new();
    let writes = patient_writer(&db).await;
    let policy = common::fast_policy(3).deadline(Duration::from_millis(300));
    let (router, state) = app(writes.clone(), policy);
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    let other = OtherWriter::hold(&db);
    let reply = tokio::time::timeout(HANG, client.post("/items", "late"))
        .await
        .expect("answered while another connection still holds the lock");
    assert_eq!(reply.status.as_u16(), 503, "{}", reply.text());
    common::assert_no_db_detail(&reply.text());
    assert_eq!(state.ran.load(Ordering::SeqCst), 0, "no closure began");
    other.release();
    let reply = client.post("/items", "on time").await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(names(&db), ["on time"]);
}

/// While the writer thread waits for another connection's lock for a closure with no
/// deadline, 50 requests queue behind it: each is answered `503` at its own deadline, by its
/// own timer, while the lock is still held; none of their closures ever runs, and none stays
/// counted waiting. Once the lock is free, the closure without a deadline commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_callers_are_answered_at_their_deadlines_and_never_run() {
    let db = TestDb::new();
    let writes = patient_writer(&db).await;
    let policy = common::fast_policy(2).deadline(Duration::from_millis(200));
    let (router, state) = app(writes.clone(), policy);
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    let other = OtherWriter::hold(&db);
    // No request, no deadline: it waits for the lock as long as `busy_timeout` allows.
    let first = {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, "first").await })
    };
    poll_until(
        "the writer thread holds the turn for the first",
        async || writes.stats().held,
    )
    .await;
    let requests: Vec<_> = (0..50)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.post("/items", format!("queued-{i}")).await })
        })
        .collect();
    for request in requests {
        let reply = tokio::time::timeout(HANG, request)
            .await
            .expect("answered while the lock is still held")
            .unwrap();
        assert_eq!(reply.status.as_u16(), 503, "{}", reply.text());
    }
    assert!(!first.is_finished(), "the first still waits for the lock");
    assert_eq!(writes.stats().waiting, 0, "{:?}", writes.stats());
    other.release();
    first
        .await
        .unwrap()
        .expect("the first commits once the lock is free");
    insert(&writes, "after").await.expect("the writer goes on");
    assert_eq!(
        state.ran.load(Ordering::SeqCst),
        0,
        "a closure whose caller was answered ran"
    );
    assert_eq!(names(&db), ["first", "after"]);
}

/// What a closure may do to its transaction that SQLite or the closure ends before the write
/// path does, or leaves open: after each, the closure's caller is told its own error, another
/// connection can take the write lock at once (nothing was left holding it), and the next
/// closure commits normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_closure_does_wedges_the_writer() {
    let db = TestDb::new();
    let writes = WriteThread::open_with(&db.path, WriteThreadOptions::default(), |conn| {
        // Room for a few rows, not for a mebibyte: `SQLITE_FULL`.
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch("PRAGMA max_page_count = 64")
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
        .transaction(|tx| {
            tx.execute("INSERT INTO items (name) VALUES ('before boom')", [])?;
            tx.execute("INSERT INTO items (name) VALUES ('boom')", [])?;
            Ok::<_, rusqlite::Error>(())
        })
        .await
        .expect_err("the trigger refuses");
    assert!(error.to_string().contains("boom refused"), "{error}");
    go_on("RAISE(ROLLBACK)").await;

    // A raw COMMIT, then an error.
    let error = writes
        .transaction(|tx| {
            tx.execute("INSERT INTO items (name) VALUES ('raw commit')", [])?;
            tx.execute_batch("COMMIT")?;
            Err::<(), _>(rusqlite::Error::InvalidQuery)
        })
        .await
        .expect_err("its own error");
    assert!(matches!(error, rusqlite::Error::InvalidQuery), "{error}");
    go_on("a raw COMMIT then Err").await;

    // The transaction told not to roll back when dropped, then an error.
    let error = writes
        .transaction(|tx| {
            tx.set_drop_behavior(rusqlite::DropBehavior::Ignore);
            tx.execute("INSERT INTO items (name) VALUES ('ignored')", [])?;
            Err::<(), _>(rusqlite::Error::InvalidQuery)
        })
        .await
        .expect_err("its own error");
    assert!(matches!(error, rusqlite::Error::InvalidQuery), "{error}");
    go_on("DropBehavior::Ignore then Err").await;

    // The transaction told to commit when dropped, then an error: it must not commit.
    let _ = writes
        .transaction(|tx| {
            tx.set_drop_behavior(rusqlite::DropBehavior::Commit);
            tx.execute(
                "INSERT INTO items (name) VALUES ('committed by a drop')",
                [],
            )?;
            Err::<(), _>(rusqlite::Error::InvalidQuery)
        })
        .await
        .expect_err("its own error");
    go_on("DropBehavior::Commit then Err").await;

    // A panic with the transaction told not to roll back.
    let error = writes
        .transaction(|tx| -> Result<(), rusqlite::Error> {
            tx.set_drop_behavior(rusqlite::DropBehavior::Ignore);
            tx.execute("INSERT INTO items (name) VALUES ('panicked')", [])?;
            panic!("a bug in the closure");
        })
        .await
        .expect_err("the caller is told");
    assert!(error.to_string().contains("panicked"), "{error}");
    go_on("a panic with DropBehavior::Ignore").await;

    // SQLITE_FULL: a mebibyte past `max_page_count`.
    let error = writes
        .transaction(|tx| {
            tx.execute("INSERT INTO items (name) VALUES ('before full')", [])?;
            tx.execute("INSERT INTO blobs (data) VALUES (zeroblob(1048576))", [])?;
            Ok::<_, rusqlite::Error>(())
        })
        .await
        .expect_err("the database is full");
    assert_eq!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DiskFull),
        "{error}"
    );
    go_on("SQLITE_FULL").await;

    assert_eq!(
        names(&db),
        [
            "next-1",
            "raw commit",
            "next-2",
            "next-3",
            "next-4",
            "next-5",
            "next-6"
        ],
        "only what committed: the raw COMMIT's row, and the closures after each case"
    );
}

#[derive(Clone)]
struct Writes {
    writes: WriteThread,
    path: std::path::PathBuf,
    calls: Arc<AtomicUsize>,
}

/// Commits with a raw `COMMIT`, then fails retryably.
async fn raw_commit_then_busy(State(app): State<Writes>) -> Result<(), DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    app.writes
        .transaction(|tx| {
            tx.execute("INSERT INTO items (name) VALUES ('raw')", [])?;
            tx.execute_batch("COMMIT")?;
            Err::<(), _>(busy())
        })
        .await?;
    Ok(())
}

/// Writes through a connection of its own, inside the closure: it meets the lock its own
/// transaction holds.
async fn write_through_another_connection(State(app): State<Writes>) -> Result<(), DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let path = app.path.clone();
    app.writes
        .transaction(move |_tx| {
            let other = rusqlite::Connection::open(&path)?;
            other.busy_timeout(Duration::ZERO)?;
            other.execute("INSERT INTO items (name) VALUES ('other')", [])?;
            Ok::<_, rusqlite::Error>(())
        })
        .await?;
    Ok(())
}

/// Two closures of one request in flight at once: the second sent while the first holds the
/// turn.
async fn two_at_once(State(app): State<Writes>) -> Result<String, DbError> {
    let (started, began) = tokio::sync::oneshot::channel::<()>();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let first = app.writes.transaction(move |tx| {
        let _ = started.send(());
        // Held until the second closure was sent: the first holds the turn meanwhile.
        let _ = wait.recv_timeout(HANG);
        tx.execute("INSERT INTO items (name) VALUES ('first')", [])
    });
    let second = async {
        began.await.expect("the first began");
        let mut second =
            pin!(app.writes.transaction(|tx| {
                tx.execute("INSERT INTO items (name) VALUES ('second')", [])
            }));
        // Sent (its first poll puts it in line, or refuses it); then the first may end.
        let sent = futures::poll!(second.as_mut());
        let _ = go.send(());
        match sent {
            std::task::Poll::Ready(done) => done,
            std::task::Poll::Pending => second.await,
        }
    };
    let (first, second) = tokio::join!(first, second);
    Ok(format!("{} {}", first?, second?))
}

async fn writes_app(db: &TestDb) -> (WriteThread, Arc<AtomicUsize>, common::Server) {
    let writes = patient_writer(db).await;
    let state = Writes {
        writes: writes.clone(),
        path: db.path.clone(),
        calls: Arc::default(),
    };
    let router = Router::new()
        .route("/raw", post(raw_commit_then_busy))
        .route("/second-connection", post(write_through_another_connection))
        .route("/both", post(two_at_once))
        .layer(SqliteRetryLayer::new(common::fast_policy(5)))
        .with_state(state.clone());
    (writes, state.calls, serve(router).await)
}

/// Over real HTTP, under the layer: a closure that committed with a raw `COMMIT` and then
/// failed retryably is not replayed (its request fenced: the row is there once), and one whose
/// write through a second connection of its own met the lock its own transaction holds
/// (`SQLITE_BUSY`) is not replayed either (it would meet it again), and is said at ERROR. One
/// call each. (One thread: the handler, which says it, runs where the test's subscriber is.)
#[tokio::test]
async fn a_closure_that_ended_its_transaction_or_met_its_own_lock_is_not_replayed() {
    let db = TestDb::new();
    let (writes, calls, server) = writes_app(&db).await;
    let client = HttpClient::new(server.addr);
    let (capture, _guard) = common::capture_events();

    let reply = client.post("/raw", "").await;
    assert_eq!(reply.status.as_u16(), 503, "{}", reply.text());
    assert_eq!(calls.swap(0, Ordering::SeqCst), 1, "never replayed");
    assert_eq!(names(&db), ["raw"], "once");

    let reply = client.post("/second-connection", "").await;
    assert_eq!(reply.status.as_u16(), 503, "{}", reply.text());
    assert_eq!(calls.swap(0, Ordering::SeqCst), 1, "never replayed");
    let told = capture
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|(message, _)| message.starts_with("SQLITE_BUSY in a write transaction's closure"))
        .count();
    assert_eq!(told, 1, "said at ERROR, once");
    insert(&writes, "after").await.unwrap();
    assert_eq!(names(&db), ["raw", "after"]);
}

fn busy() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
        Some("database is locked".to_owned()),
    )
}

/// Two closures of one request in flight at once (a handler that joins two writes): the
/// second waits for the first, behind it, instead of being refused; both commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_closure_of_one_request_waits_for_the_first() {
    let db = TestDb::new();
    let (_writes, _calls, server) = writes_app(&db).await;
    let reply = HttpClient::new(server.addr).post("/both", "").await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(names(&db), ["first", "second"]);
}

/// The file is known by SQLite's name for it, not by the spelling the writer was opened with:
/// a writer opened with a `file:` URI takes its turns with an sqlx `WritePool` on the same
/// file (while the pool's transaction is open, the closure waits, counted waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_opened_by_uri_shares_the_files_turn() {
    let db = TestDb::new();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(db.options(Duration::from_secs(5)))
        .await
        .unwrap();
    let pool = WritePool::new(pool);
    let uri = format!("file:{}?mode=rwc", db.path.display());
    let writes = WriteThread::open(&uri).expect("open by URI");
    writes
        .transaction(|tx| tx.execute_batch(SCHEMA))
        .await
        .unwrap();
    let tx = pool.begin().await.expect("the pool's turn");
    let waiting = {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, "by uri").await })
    };
    poll_until("the closure waits for the pool's transaction", async || {
        writes.stats().waiting == 1
    })
    .await;
    assert!(!waiting.is_finished());
    tx.commit().await.unwrap();
    waiting
        .await
        .unwrap()
        .expect("it writes once the turn is free");
    assert_eq!(names(&db), ["by uri"]);
}

/// Closures waiting for the writer thread are counted waiting for the file's turn (what the
/// read limit and the `write_waiting` gauge read), each from the moment it is sent; and a
/// caller that leaves takes its closure out of line at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_closures_are_counted_waiting_until_they_run_or_leave() {
    let db = TestDb::new();
    let writes = patient_writer(&db).await;
    let other = OtherWriter::hold(&db);
    let first = {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, "first").await })
    };
    poll_until("the first holds the turn", async || writes.stats().held).await;
    let queued: Vec<_> = (0..5)
        .map(|i| {
            let writes = writes.clone();
            tokio::spawn(async move { insert(&writes, &format!("queued-{i}")).await })
        })
        .collect();
    poll_until("five closures counted waiting", async || {
        writes.stats().waiting == 5
    })
    .await;
    let mut queued = queued.into_iter();
    let gone = queued.next().unwrap();
    gone.abort();
    let _ = gone.await;
    assert_eq!(writes.stats().waiting, 4, "its caller left: out of line");
    other.release();
    first.await.unwrap().unwrap();
    for write in queued {
        write.await.unwrap().unwrap();
    }
    assert_eq!(writes.stats().waiting, 0);
    assert_eq!(names(&db).len(), 5, "{:?}", names(&db));
}

/// A closure that holds the turn past the slow threshold is reported while it runs: the WARN
/// comes before the closure ends (the closure waits for the test to have seen it). (One
/// thread: the caller's task, which says it, runs where the test's subscriber is.)
#[tokio::test]
async fn a_slow_closure_is_reported_while_it_runs() {
    let db = TestDb::new();
    let writes = WriteThread::open_with(
        &db.path,
        WriteThreadOptions::default().slow_transaction(Duration::from_millis(20)),
        |conn| conn.execute_batch(SCHEMA),
    )
    .unwrap();
    let (capture, _guard) = common::capture_events();
    let (seen, wait) = std::sync::mpsc::channel::<()>();
    let slow = {
        let writes = writes.clone();
        tokio::spawn(async move {
            writes
                .transaction(move |tx| {
                    // Ends once the test saw the report: a report only at the end never comes.
                    let _ = wait.recv_timeout(HANG);
                    tx.execute("INSERT INTO items (name) VALUES ('slow')", [])
                })
                .await
        })
    };
    let running = "slow write transaction: it has held the database's write turn past the \
                   threshold and still runs; every other writer waits";
    poll_until("the slow closure reported while it runs", async || {
        !capture.with_message(running).is_empty()
    })
    .await;
    assert!(!slow.is_finished());
    seen.send(()).unwrap();
    slow.await.unwrap().unwrap();
    let report = &capture.with_message(running)[0];
    assert_eq!(report["db.namespace"], "test.db");
}

/// A writer opened outside any runtime (before tokio starts) waits for a turn held elsewhere
/// in the process as one opened inside it does: the closure, with no deadline, waits for the
/// turn and commits once it is free, instead of being told the deadline passed.
#[test]
fn a_writer_opened_before_the_runtime_waits_for_the_turn() {
    let db = TestDb::new();
    let writes = WriteThread::open(&db.path).expect("open without a runtime");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        writes
            .transaction(|tx| tx.execute_batch(SCHEMA))
            .await
            .unwrap();
        let queue = WriteQueue::for_file(&db.path);
        let held = queue.turn(Duration::from_secs(5)).await.unwrap();
        let waiting = {
            let writes = writes.clone();
            tokio::spawn(async move { insert(&writes, "waited").await })
        };
        poll_until("the closure waits for the turn", async || {
            writes.stats().waiting == 1
        })
        .await;
        held.committed();
        waiting.await.unwrap().expect("it waited, then wrote");
    });
    assert_eq!(names(&db), ["waited"]);
}

/// The last handle dropped while committed closures wait for their fsync (held here): the fsync
/// thread answers them before the writer connection closes, so the WAL they were synced from is
/// still there (closing SQLite's last connection deletes it), no disk error is reported, and a
/// writer opened again on the file writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_with_fsyncs_pending_then_reopened_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    // A name of its own: its threads are told apart from other tests' by it.
    let path = dir.path().join("zq7k1.db");
    let writes = WriteThread::open(&path).unwrap();
    writes
        .transaction(|tx| tx.execute_batch(SCHEMA))
        .await
        .unwrap();
    assert!(tower_sqlite_retry::__private::hold_thread_fsync(
        &writes, true
    ));
    let before = writes.stats().transactions;
    let pending: Vec<_> = (0..3)
        .map(|i| {
            let writes = writes.clone();
            tokio::spawn(async move { insert(&writes, &format!("pending-{i}")).await })
        })
        .collect();
    poll_until("three closures committed, unanswered", async || {
        writes.stats().transactions >= before + 3
    })
    .await;
    for write in pending {
        write.abort();
        let _ = write.await;
    }
    let (capture, _guard) = common::capture_events();
    drop(writes);
    poll_until("the writer and fsync threads ended", async || {
        !thread_names().iter().any(|n| n.ends_with(":zq7k1"))
    })
    .await;
    assert!(
        capture.with_message("group commit stopped").is_empty()
            && !capture
                .events
                .lock()
                .unwrap()
                .iter()
                .any(|(m, _)| m.starts_with("group commit stopped")),
        "a disk error that did not happen: {:?}",
        capture.events.lock().unwrap()
    );
    let again = WriteThread::open(&path).unwrap();
    again
        .transaction(|tx| tx.execute("INSERT INTO items (name) VALUES ('again')", []))
        .await
        .expect("the file is not refused");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM items", [], |row| row.get(0))
        .unwrap();
    assert_eq!(
        rows, 4,
        "the three committed before the drop, and the new one"
    );
}

/// This process's threads' names (as the kernel keeps them: 15 bytes at most).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_owned())
        .collect()
}

/// Many callers at once on four threads, each leaving at a point of its own (after 0 to 5
/// polls, or never) while the writer thread works: every closure ran at most once, its row is
/// there exactly when it ran, and afterwards nothing is counted waiting and every later write
/// goes through (no room was lost in the inbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_callers_leaving_anywhere_lose_nothing_and_leave_nothing_counted() {
    let db = TestDb::new();
    let writes = patient_writer(&db).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let (writes, ran) = (writes.clone(), Arc::clone(&ran));
            tokio::spawn(async move {
                for i in 0..40usize {
                    let ran = Arc::clone(&ran);
                    let name = format!("t{task}-{i}");
                    let mut write = pin!(writes.transaction(move |tx| {
                        ran.fetch_add(1, Ordering::SeqCst);
                        tx.execute("INSERT INTO items (name) VALUES (?1)", [&name])
                    }));
                    // A leaving point of its own: after 0 to 5 polls, or never.
                    let polls = (task * 7 + i * 13) % 7;
                    if polls == 6 {
                        write.await.expect("a caller that stays is answered Ok");
                        continue;
                    }
                    for _ in 0..polls {
                        if futures::poll!(write.as_mut()).is_ready() {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // FIFO: once this one is answered, every closure before it has run or never will.
    insert(&writes, "last").await.expect("the writer goes on");
    assert_eq!(writes.stats().waiting, 0, "{:?}", writes.stats());
    let rows = names(&db);
    assert_eq!(
        rows.len(),
        ran.load(Ordering::SeqCst) + 1,
        "a row exactly for each closure that ran"
    );
    let mut unique = rows.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), rows.len(), "none ran twice");
}
