//! `WriteThread` (rusqlite): write transactions as closures on the database's writer thread,
//! on real SQLite files. Many concurrent writers, the file's turn shared with sqlx's
//! `WritePool`, outcomes kept apart within a group, a closure that never runs when its caller
//! left or its deadline passed while it waited (the turn held by the test, not a sleep), the
//! fence at commit over real HTTP, and group commit's fsync shared.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use common::{HttpClient, TestDb, poll_until, serve};
use tower_sqlite_retry::write::{WriteQueue, WriteThread, WriteThreadOptions};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)";

async fn writer(db: &TestDb) -> WriteThread {
    let writes = WriteThread::open(&db.path).expect("open the writer");
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

/// The names in the file, read through a connection of their own (not the writer's).
fn names(db: &TestDb) -> Vec<String> {
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    let mut statement = conn.prepare("SELECT name FROM items ORDER BY id").unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// 32 tasks write 25 rows each at once, with a second `WriteThread` and an sqlx `WritePool` on
/// the same file writing too (busy_timeout 0 on the pool: a lock met would fail it, so the
/// turn, not SQLite's busy handler, keeps them apart): nothing fails, nothing is lost or
/// doubled, and the fsyncs were shared (fewer than one per transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writers_share_the_turn_and_the_fsync_and_lose_nothing() {
    let db = TestDb::new();
    let first = writer(&db).await;
    let second = WriteThread::open(&db.path).unwrap();
    let pool = db.pool(4, Duration::ZERO).await;
    let sqlx_writes = WritePool::new(pool.clone());
    let mut tasks = Vec::new();
    for task in 0..32 {
        let writes = if task % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                insert(&writes, &format!("t{task}-{i}")).await?;
            }
            Ok::<_, rusqlite::Error>(())
        }));
    }
    for i in 0..25 {
        let mut tx = sqlx_writes.begin().await.expect("the sqlx writer's turn");
        sqlx::query("INSERT INTO items (name) VALUES (?)")
            .bind(format!("sqlx-{i}"))
            .execute(&mut *tx)
            .await
            .expect("the sqlx writer meets no lock");
        tx.commit().await.expect("the sqlx writer commits");
    }
    for task in tasks {
        task.await.unwrap().expect("no write failed");
    }
    let names = names(&db);
    assert_eq!(names.len(), 32 * 25 + 25, "every write is there, once");
    let stats = first.stats();
    assert!(stats.transactions >= 32 * 25 + 25, "{stats:?}");
    assert!(
        stats.syncs > 0 && stats.synced > stats.syncs,
        "the fsyncs were shared: {stats:?}"
    );
}

/// One task writing closure after closure, alone, at `NORMAL` (where its caller polls for the
/// answer instead of parking, `hand_off.rs`): every answer is its own closure's, on both
/// runtimes. Then the same caller dropped after 0, 1, 2, … polls, each time: a closure runs at
/// most once, its row is there exactly when it ran, and the next write goes through.
async fn alone_back_to_back_and_dropped_at_every_poll() {
    let db = TestDb::new();
    let writes = WriteThread::open_with(
        &db.path,
        WriteThreadOptions::default().synchronous_normal(),
        |_| Ok(()),
    )
    .expect("open the writer");
    writes
        .transaction(|tx| tx.execute_batch(SCHEMA))
        .await
        .expect("schema");
    for i in 0..400 {
        let name = format!("loop-{i}");
        let id = insert(&writes, &name).await.expect("a write alone");
        let conn = rusqlite::Connection::open(&db.path).unwrap();
        let stored: String = conn
            .query_row("SELECT name FROM items WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(stored, name, "the answer is its own closure's");
    }
    let ran = Arc::new(AtomicUsize::new(0));
    for polls in 0..60 {
        let ran_here = Arc::clone(&ran);
        let mut write = Box::pin(writes.transaction(move |tx| {
            tx.execute(
                "INSERT INTO items (name) VALUES (?1)",
                [format!("dropped-{polls}")],
            )?;
            ran_here.fetch_add(1, Ordering::SeqCst);
            Ok::<_, rusqlite::Error>(())
        }));
        for _ in 0..polls {
            if futures::poll!(write.as_mut()).is_ready() {
                break;
            }
        }
        drop(write);
        // FIFO: once this one is answered, the dropped one has run or never will.
        insert(&writes, &format!("after-{polls}"))
            .await
            .expect("the next write goes through");
    }
    let names = names(&db);
    let dropped = names.iter().filter(|n| n.starts_with("dropped-")).count();
    assert_eq!(
        dropped,
        ran.load(Ordering::SeqCst),
        "a row exactly for each closure that ran"
    );
    assert_eq!(names.len(), 400 + 60 + dropped, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_writing_alone_gets_its_own_answers_and_may_leave_at_any_poll() {
    alone_back_to_back_and_dropped_at_every_poll().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_task_writing_alone_on_one_thread_gets_its_own_answers_and_may_leave_at_any_poll() {
    alone_back_to_back_and_dropped_at_every_poll().await;
}

/// A closure that fails rolls back: nothing of it is in the file, and the next one commits.
/// One that ends the transaction itself (a raw `COMMIT`) is told so (`SQLITE_MISUSE`).
#[tokio::test]
async fn a_failed_closure_rolls_back_and_a_raw_commit_is_told() {
    let db = TestDb::new();
    let writes = writer(&db).await;
    let failed = writes
        .transaction(|tx| {
            tx.execute("INSERT INTO items (name) VALUES ('rolled back')", [])?;
            // a UNIQUE violation, as a handler meets one
            tx.execute("INSERT INTO items (name) VALUES ('rolled back')", [])?;
            Ok::<_, rusqlite::Error>(())
        })
        .await;
    let error = failed.expect_err("a constraint violation");
    assert_eq!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ConstraintViolation),
        "{error}"
    );
    insert(&writes, "next").await.expect("the next commits");
    let raw = writes
        .transaction(|tx| {
            tx.execute("INSERT INTO items (name) VALUES ('raw')", [])?;
            tx.execute_batch("COMMIT")?;
            Ok::<_, rusqlite::Error>(())
        })
        .await;
    let error = raw.expect_err("a raw COMMIT inside the closure is told");
    assert_eq!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ApiMisuse),
        "{error}"
    );
    assert!(
        error.to_string().contains("ended inside the closure"),
        "{error}"
    );
    insert(&writes, "after").await.expect("the writer goes on");
    assert_eq!(names(&db), ["next", "raw", "after"]);
}

/// A closure whose caller stopped waiting while it waited for the turn (held here, through
/// the file's `WriteQueue`) never runs; the writer goes on with the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_whose_caller_left_while_it_waited_never_runs() {
    let db = TestDb::new();
    let writes = writer(&db).await;
    let queue = WriteQueue::for_file(&db.path);
    let held = queue.turn(Duration::from_secs(5)).await.expect("the turn");
    let ran = Arc::new(AtomicBool::new(false));
    let waiting = {
        let writes = writes.clone();
        let ran = Arc::clone(&ran);
        tokio::spawn(async move {
            writes
                .transaction(move |tx| {
                    ran.store(true, Ordering::SeqCst);
                    tx.execute("INSERT INTO items (name) VALUES ('never')", [])
                })
                .await
        })
    };
    poll_until("the writer thread waits for the turn", async || {
        writes.stats().waiting == 1
    })
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    held.committed();
    insert(&writes, "next").await.expect("the next runs");
    assert!(
        !ran.load(Ordering::SeqCst),
        "the closure ran after its caller left"
    );
    assert_eq!(names(&db), ["next"]);
}

#[derive(Clone)]
struct App {
    writes: WriteThread,
    calls: Arc<AtomicUsize>,
    ran: Arc<AtomicUsize>,
}

/// Inserts the posted name; a name starting with `busy-after` then fails as a retryable
/// error would (after the commit: the request is fenced, never replayed).
async fn write(State(app): State<App>, name: String) -> Result<String, DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let ran = Arc::clone(&app.ran);
    let stored = name.clone();
    let id = app
        .writes
        .transaction(move |tx| {
            ran.fetch_add(1, Ordering::SeqCst);
            tx.execute("INSERT INTO items (name) VALUES (?1)", [&stored])?;
            Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
        })
        .await?;
    if name.starts_with("busy-after") {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked".to_owned()),
        );
        return Err(DbError::from(busy));
    }
    Ok(id.to_string())
}

fn app(writes: WriteThread, policy: RetryPolicy) -> (Router, App) {
    let state = App {
        writes,
        calls: Arc::default(),
        ran: Arc::default(),
    };
    let router = Router::new()
        .route("/items", post(write))
        .layer(SqliteRetryLayer::new(policy))
        .with_state(state.clone());
    (router, state)
}

/// Over real HTTP, under the layer: a write whose handler fails retryably after its commit is
/// not replayed (the commit fenced the request: one call, one row, and the client told 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_closure_fences_its_request() {
    let db = TestDb::new();
    let writes = writer(&db).await;
    let (router, state) = app(writes, common::fast_policy(5));
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    let reply = client.post("/items", "busy-after-commit").await;
    assert_eq!(reply.status.as_u16(), 503, "{}", reply.text());
    common::assert_no_db_detail(&reply.text());
    assert_eq!(state.calls.load(Ordering::SeqCst), 1, "never replayed");
    assert_eq!(names(&db), ["busy-after-commit"]);
    let reply = client.post("/items", "plain").await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
}

/// Over real HTTP, under the layer: while the test holds the file's turn, a request whose
/// deadline passes waits no longer; its closure never runs (the client told 503), and once
/// the turn is free the next request writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_whose_deadline_passed_while_it_waited_never_runs() {
    let db = TestDb::new();
    let writes = writer(&db).await;
    let policy = common::fast_policy(3).deadline(Duration::from_millis(300));
    let (router, state) = app(writes.clone(), policy);
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    let queue = WriteQueue::for_file(&db.path);
    let held = queue.turn(Duration::from_secs(5)).await.expect("the turn");
    // The timeout only turns a hang (a writer waiting past the deadline, with the request
    // waiting on it) into a failure.
    let reply = tokio::time::timeout(Duration::from_secs(60), client.post("/items", "late"))
        .await
        .expect("the request waited for the turn past its deadline");
    assert_eq!(reply.status.as_u16(), 503, "{}", reply.text());
    assert!(state.calls.load(Ordering::SeqCst) >= 1);
    held.committed();
    let reply = client.post("/items", "on time").await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(
        state.ran.load(Ordering::SeqCst),
        1,
        "only the request on time ran its closure"
    );
    assert_eq!(names(&db), ["on time"]);
}

/// Group commit off: each `COMMIT` syncs on its own (no shared fsync counted), and writes
/// commit as with it on.
#[tokio::test]
async fn group_commit_off_syncs_each_commit_itself() {
    let db = TestDb::new();
    let writes = WriteThread::open_with(
        &db.path,
        WriteThreadOptions::default().group_commit(false),
        |_| Ok(()),
    )
    .unwrap();
    writes
        .transaction(|tx| tx.execute_batch(SCHEMA))
        .await
        .unwrap();
    for i in 0..10 {
        insert(&writes, &format!("w{i}")).await.unwrap();
    }
    assert_eq!(names(&db).len(), 10);
    assert_eq!(writes.stats().syncs, 0, "{:?}", writes.stats());
}

/// Group commit's promise: a closure's result comes back only once an fsync that started
/// after its `COMMIT` completed. With the fsync held, a committed closure (its row in the
/// file, its turn given back) is not answered; once the fsync runs, it is, `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_closure_is_answered_only_after_its_fsync() {
    let db = TestDb::new();
    let writes = writer(&db).await;
    assert!(
        tower_sqlite_retry::__private::hold_thread_fsync(&writes, true),
        "the fsync is shared (WAL, FULL, group commit on)"
    );
    let before = writes.stats().transactions;
    let mut waiting = {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, "held").await })
    };
    poll_until("the closure committed and gave the turn back", async || {
        names(&db) == ["held"] && writes.stats().transactions > before
    })
    .await;
    // Not answered while the fsync is held: a window that can only miss a broken
    // acknowledgement (never fail a sound one), as nothing answers it meanwhile.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut waiting)
            .await
            .is_err(),
        "answered before its fsync"
    );
    tower_sqlite_retry::__private::hold_thread_fsync(&writes, false);
    waiting
        .await
        .unwrap()
        .expect("answered Ok once its fsync ran");
}

/// The bound on commits waiting for one fsync: while the fsync stalls (held here), 512
/// closures commit and wait unanswered; the 513th does not begin (its row is not in the file)
/// until the fsync answers them. Then all 513 are answered `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_a_stalled_fsync_holds_the_writer_back() {
    const BOUND: usize = 512; // `MAX_UNANSWERED` in `src/write/durable/report.rs`
    let db = TestDb::new();
    let writes = writer(&db).await;
    assert!(tower_sqlite_retry::__private::hold_thread_fsync(
        &writes, true
    ));
    let before = writes.stats().transactions;
    let spawn = |name: String| {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, &name).await })
    };
    let mut waiting: Vec<_> = (0..BOUND).map(|i| spawn(format!("w{i}"))).collect();
    poll_until("512 closures committed", async || {
        writes.stats().transactions >= before + BOUND as u64
    })
    .await;
    assert_eq!(names(&db).len(), BOUND);
    let mut past = spawn("past".to_owned());
    // Not begun while the fsync is held: a window that can only miss a closure that began
    // (never fail a sound writer), as nothing lets it begin meanwhile.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut past)
            .await
            .is_err(),
        "answered past the bound"
    );
    assert_eq!(names(&db).len(), BOUND, "the 513th began past the bound");
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "held: none answered"
    );
    tower_sqlite_retry::__private::hold_thread_fsync(&writes, false);
    waiting.push(past);
    for w in waiting {
        w.await.unwrap().expect("answered Ok once the fsync ran");
    }
    assert_eq!(names(&db).len(), BOUND + 1);
}

/// A closure that panics fails its own transaction only (rolled back, its caller told), as a
/// panicking handler fails its own request: the writer thread goes on with the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_that_panics_fails_alone() {
    let db = TestDb::new();
    let writes = writer(&db).await;
    let panicked = writes
        .transaction(|tx| -> Result<(), rusqlite::Error> {
            tx.execute("INSERT INTO items (name) VALUES ('panicked')", [])?;
            panic!("a bug in the closure");
        })
        .await;
    let error = panicked.expect_err("the caller is told");
    assert!(error.to_string().contains("panicked"), "{error}");
    insert(&writes, "next")
        .await
        .expect("the writer thread goes on");
    assert_eq!(names(&db), ["next"]);
}
