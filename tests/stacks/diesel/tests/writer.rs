//! `DieselWriteThread`: the writer thread on Diesel's `SqliteConnection`, on real files. Many
//! writers lose nothing and share the fsync; the file's turn is shared with `WriteQueue`; a
//! closure that fails rolls back, one that ends the transaction itself is told so; a closure
//! whose caller left while it waited for the turn never runs; a committed closure is answered
//! only after its fsync; over real HTTP under the layer, a committed closure fences its request.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use http::StatusCode;
use tower_sqlite_retry::write::{DieselWriteThread, WriteQueue};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};
use tsr_stack_diesel::schema::items;

#[path = "../../harness.rs"]
mod harness;

async fn writer(dir: &tempfile::TempDir) -> DieselWriteThread {
    let writes = DieselWriteThread::open(dir.path().join("writer.db")).expect("the writer");
    writes
        .transaction(|conn| conn.batch_execute(harness::SCHEMA))
        .await
        .expect("the schema");
    writes
}

async fn insert(writes: &DieselWriteThread, name: &str) -> Result<usize, DieselError> {
    let name = name.to_owned();
    writes
        .transaction(move |conn| {
            diesel::insert_into(items::table)
                .values(items::name.eq(name))
                .execute(conn)
        })
        .await
}

fn names(path: &Path) -> Vec<String> {
    let mut conn = SqliteConnection::establish(path.to_str().unwrap()).unwrap();
    items::table
        .select(items::name)
        .order(items::id)
        .load(&mut conn)
        .unwrap()
}

async fn poll_until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..5_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{what}: not within 10 s");
}

/// 16 tasks write 25 rows each at once: nothing fails, nothing is lost or doubled, and the
/// fsyncs were shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writers_lose_nothing_and_share_the_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let writes = writer(&dir).await;
    let mut tasks = Vec::new();
    for task in 0..16 {
        let writes = writes.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                insert(&writes, &format!("t{task}-{i}")).await?;
            }
            Ok::<_, DieselError>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("no write failed");
    }
    assert_eq!(names(writes.path()).len(), 16 * 25);
    let stats = writes.stats();
    assert!(stats.transactions >= 16 * 25, "{stats:?}");
    assert!(
        stats.syncs > 0 && stats.synced > stats.syncs,
        "the fsyncs were shared: {stats:?}"
    );
}

/// A closure that fails rolls back (a UNIQUE violation after its first insert: neither row is
/// there); one that ends the transaction itself is told so.
#[tokio::test]
async fn a_failed_closure_rolls_back_and_a_raw_commit_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let writes = writer(&dir).await;
    let failed = writes
        .transaction(|conn| {
            conn.batch_execute("INSERT INTO items (name) VALUES ('rolled back')")?;
            conn.batch_execute("INSERT INTO items (name) VALUES ('rolled back')")
        })
        .await;
    assert!(
        matches!(
            failed,
            Err(DieselError::DatabaseError(
                DatabaseErrorKind::UniqueViolation,
                _
            ))
        ),
        "{failed:?}"
    );
    insert(&writes, "next").await.expect("the next commits");
    let raw = writes
        .transaction(|conn| conn.batch_execute("INSERT INTO items (name) VALUES ('raw'); COMMIT"))
        .await;
    let error = raw.expect_err("a raw COMMIT inside the closure is told");
    assert!(
        error.to_string().contains("ended inside the closure"),
        "{error}"
    );
    insert(&writes, "after").await.expect("the writer goes on");
    assert_eq!(names(writes.path()), ["next", "raw", "after"]);
}

/// A closure whose caller left while it waited for the turn (held through the file's
/// `WriteQueue`) never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_whose_caller_left_while_it_waited_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let writes = writer(&dir).await;
    let held = WriteQueue::for_file(writes.path())
        .turn(Duration::from_secs(5))
        .await
        .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let waiting = {
        let (writes, ran) = (writes.clone(), Arc::clone(&ran));
        tokio::spawn(async move {
            writes
                .transaction(move |conn| {
                    ran.store(true, Ordering::SeqCst);
                    conn.batch_execute("INSERT INTO items (name) VALUES ('never')")
                })
                .await
        })
    };
    poll_until("the writer thread waits for the turn", || {
        writes.stats().waiting == 1
    })
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    held.committed();
    insert(&writes, "next").await.unwrap();
    assert!(
        !ran.load(Ordering::SeqCst),
        "the closure ran after its caller left"
    );
    assert_eq!(names(writes.path()), ["next"]);
}

/// A committed closure is answered only once its fsync ran (held here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_closure_is_answered_only_after_its_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let writes = writer(&dir).await;
    assert!(tower_sqlite_retry::__private::hold_diesel_thread_fsync(
        &writes, true
    ));
    let before = writes.stats().transactions;
    let mut waiting = {
        let writes = writes.clone();
        tokio::spawn(async move { insert(&writes, "held").await })
    };
    let path = writes.path().to_owned();
    poll_until("committed, its turn given back", || {
        names(&path) == ["held"] && writes.stats().transactions > before
    })
    .await;
    // A window that can only miss a broken acknowledgement, never fail a sound one.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut waiting)
            .await
            .is_err(),
        "answered before its fsync"
    );
    tower_sqlite_retry::__private::hold_diesel_thread_fsync(&writes, false);
    waiting.await.unwrap().expect("answered once its fsync ran");
}

#[derive(Clone)]
struct App {
    writes: DieselWriteThread,
    calls: Arc<AtomicUsize>,
}

/// Inserts the posted name, then fails as a retryable error would (after the commit).
async fn insert_then_busy(State(app): State<App>, name: String) -> Result<StatusCode, DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    insert(&app.writes, &name).await?;
    Err(DbError::from(DieselError::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new("database is locked".to_owned()),
    )))
}

/// Over real HTTP under the layer: a handler that fails retryably after its closure committed
/// is not replayed (one call, one row, 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_closure_fences_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let writes = writer(&dir).await;
    let app = App {
        writes: writes.clone(),
        calls: Arc::default(),
    };
    let router = Router::new()
        .route("/items", post(insert_then_busy))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().base_delay(Duration::from_millis(1)),
        ))
        .with_state(app.clone());
    let server = harness::serve(router).await;
    let (status, body) = harness::post(&server, "/items", "fenced").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(app.calls.load(Ordering::SeqCst), 1, "never replayed");
    assert_eq!(names(writes.path()), ["fenced"]);
}

/// A closure that panics fails its own transaction only: Diesel's transaction left open by the
/// unwinding closure is rolled back, and the writer thread goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_that_panics_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let writes = writer(&dir).await;
    let panicked = writes
        .transaction(|conn| -> Result<(), DieselError> {
            conn.batch_execute("INSERT INTO items (name) VALUES ('panicked')")?;
            panic!("a bug in the closure");
        })
        .await;
    let error = panicked.expect_err("the caller is told");
    assert!(error.to_string().contains("panicked"), "{error}");
    insert(&writes, "next")
        .await
        .expect("the writer thread goes on");
    insert(&writes, "after").await.expect("and on");
    assert_eq!(names(writes.path()), ["next", "after"]);
}
