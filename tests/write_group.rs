//! Group commit (`WritePool::group_commit`) on real SQLite files: members queued behind a
//! member share one `COMMIT`, nothing is acknowledged before it, a member's rollback, drop or
//! error leaves the others alone, and a group's failure fails every member waiting.
//!
//! Every grouping here is made by the test, not by timing: a member holds the group (its
//! transaction open, or paused on a channel) while the next ones queue in the pool's line.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use common::{TestDb, poll_until};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::{Barrier, mpsc};
use tower_sqlite_retry::write::{GroupCommit, GroupCommitFailed};
use tower_sqlite_retry::{WritePool, WriteTransaction};

async fn pool_of(options: SqliteConnectOptions, connections: u32) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("pool");
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, \
         data BLOB)",
    )
    .execute(&pool)
    .await
    .expect("schema");
    pool
}

fn grouped(pool: &SqlitePool) -> WritePool {
    WritePool::new(pool.clone()).group_commit(Some(GroupCommit::default()))
}

async fn insert(tx: &mut SqliteConnection, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(tx)
        .await
        .map(drop)
}

async fn names(pool: &SqlitePool) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM items ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("names")
}

/// Waits until `n` writers wait for the turn (in the pool's line).
async fn waiting(writes: &WritePool, n: usize) {
    poll_until(format!("{n} writers waiting"), async || {
        writes.stats().is_some_and(|s| s.waiting == n)
    })
    .await;
}

/// A member in a task of its own: begins, says so, waits for the go, inserts, commits.
struct Paused {
    began: mpsc::UnboundedReceiver<()>,
    go: mpsc::UnboundedSender<()>,
    done: tokio::task::JoinHandle<Result<(), sqlx::Error>>,
}

fn paused(writes: &WritePool, name: &'static str) -> Paused {
    let (began_tx, began) = mpsc::unbounded_channel();
    let (go, mut go_rx) = mpsc::unbounded_channel();
    let writes = writes.clone();
    let done = tokio::spawn(async move {
        let mut tx = writes.begin().await?;
        began_tx.send(()).unwrap();
        go_rx.recv().await.unwrap();
        insert(&mut tx, name).await?;
        tx.commit().await
    });
    Paused { began, go, done }
}

#[tokio::test]
async fn a_lone_transaction_commits_at_once() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = grouped(&pool);
    let mut tx = writes.begin().await.unwrap();
    insert(&mut tx, "alone").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(names(&pool).await, ["alone"]);
    let stats = writes.stats().unwrap();
    assert_eq!((stats.transactions, stats.commits), (1, 1));
}

/// A holds the group; B and C queue in line. A's commit hands the group on and waits: its row
/// is not in the file while B and C run; C, with nobody behind it, commits all three.
#[tokio::test]
async fn members_queued_behind_a_member_share_its_commit() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = grouped(&pool);
    let mut a = writes.begin().await.unwrap();
    insert(&mut a, "a").await.unwrap();
    let mut b = paused(&writes, "b");
    waiting(&writes, 1).await;
    let mut c = paused(&writes, "c");
    waiting(&writes, 2).await;

    let a_done = tokio::spawn(a.commit());
    b.began.recv().await.unwrap(); // B was handed the group: A waits for its outcome
    assert!(!a_done.is_finished());
    assert_eq!(
        names(&pool).await,
        Vec::<String>::new(),
        "nothing committed yet"
    );
    b.go.send(()).unwrap();
    c.began.recv().await.unwrap(); // C was handed the group
    assert!(
        names(&pool).await.is_empty(),
        "nothing committed before the group's COMMIT"
    );
    c.go.send(()).unwrap();
    c.done.await.unwrap().unwrap();
    b.done.await.unwrap().unwrap();
    a_done.await.unwrap().unwrap();
    assert_eq!(names(&pool).await, ["a", "b", "c"]);
    let stats = writes.stats().unwrap();
    assert_eq!(
        (stats.transactions, stats.commits),
        (3, 1),
        "one COMMIT for three"
    );
}

/// A member's rollback, or its drop (an early return), undoes its own work only.
#[tokio::test]
async fn a_member_rolled_back_or_dropped_leaves_the_others() {
    for drop_it in [false, true] {
        let db = TestDb::new();
        let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
        let writes = grouped(&pool);
        let mut a = writes.begin().await.unwrap();
        insert(&mut a, "a").await.unwrap();
        let (began_tx, mut began) = mpsc::unbounded_channel();
        let undone = tokio::spawn({
            let writes = writes.clone();
            async move {
                let mut tx = writes.begin().await.unwrap();
                insert(&mut tx, "undone").await.unwrap();
                {
                    // A savepoint of the member's own, dropped: as in sqlx.
                    let mut inner = Connection::begin(&mut *tx).await.unwrap();
                    insert(&mut inner, "inner").await.unwrap();
                }
                began_tx.send(()).unwrap();
                if drop_it {
                    drop(tx);
                } else {
                    tx.rollback().await.unwrap();
                }
            }
        });
        waiting(&writes, 1).await;
        let mut c = paused(&writes, "c");
        waiting(&writes, 2).await;
        let a_done = tokio::spawn(a.commit());
        began.recv().await.unwrap();
        undone.await.unwrap();
        c.began.recv().await.unwrap();
        c.go.send(()).unwrap();
        c.done.await.unwrap().unwrap();
        a_done.await.unwrap().unwrap();
        assert_eq!(names(&pool).await, ["a", "c"], "dropped: {drop_it}");
    }
}

/// The group's `COMMIT` fails (rollback-journal mode: a reader's open transaction keeps it
/// from writing, past the busy timeout): every member fails, the waiting one with
/// `GroupCommitFailed` carrying the retryable classification; nothing is in the file, and the
/// next writer begins afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_fails_every_member() {
    let db = TestDb::new();
    let options = db
        .options(Duration::from_millis(200))
        .journal_mode(SqliteJournalMode::Delete);
    let pool = pool_of(options.clone(), 2).await;
    let writes = grouped(&pool);
    let mut reader = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN").execute(&mut reader).await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&mut reader)
        .await
        .unwrap();

    let mut a = writes.begin().await.unwrap();
    insert(&mut a, "a").await.unwrap();
    let mut b = paused(&writes, "b");
    waiting(&writes, 1).await;
    let a_done = tokio::spawn(a.commit());
    b.began.recv().await.unwrap();
    b.go.send(()).unwrap();
    let b_result = b.done.await.unwrap();
    let a_result = a_done.await.unwrap();
    let b_error = b_result.expect_err("the COMMIT met the reader");
    assert!(
        tower_sqlite_retry::classify(&b_error).is_some(),
        "the COMMIT's own error is retryable: {b_error}"
    );
    let a_error = a_result.expect_err("the group failed");
    let sqlx::Error::Io(io) = &a_error else {
        panic!("a member is told with GroupCommitFailed: {a_error:?}")
    };
    let failed = io
        .get_ref()
        .and_then(|e| e.downcast_ref::<GroupCommitFailed>())
        .expect("GroupCommitFailed");
    assert!(failed.retryable().is_some(), "{failed:?}");
    assert!(tower_sqlite_retry::classify(&a_error).is_some());

    sqlx::query("COMMIT").execute(&mut reader).await.unwrap();
    assert!(names(&pool).await.is_empty());
    let mut next = writes.begin().await.unwrap();
    insert(&mut next, "next").await.unwrap();
    next.commit().await.unwrap();
    assert_eq!(names(&pool).await, ["next"]);
}

/// A member meets `SQLITE_FULL` mid-group (`max_page_count`): whatever SQLite rolled back (the
/// statement, or the whole transaction), no member is told `Ok` for a row that is not in the
/// file, and the next writer begins afresh.
#[tokio::test]
async fn sqlite_full_mid_group_never_acknowledges_what_is_not_there() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = grouped(&pool);
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut a = writes.begin().await.unwrap();
    sqlx::query(common::sql(format!(
        "PRAGMA max_page_count = {}",
        pages + 2
    )))
    .execute(&mut *a)
    .await
    .unwrap();
    insert(&mut a, "a").await.unwrap();
    let (full_tx, mut full) = mpsc::unbounded_channel();
    let big = tokio::spawn({
        let writes = writes.clone();
        async move {
            let mut tx = writes.begin().await?;
            let result =
                sqlx::query("INSERT INTO items (name, data) VALUES ('big', zeroblob(1000000))")
                    .execute(&mut *tx)
                    .await;
            full_tx.send(result.is_err()).unwrap();
            result?;
            tx.commit().await
        }
    });
    waiting(&writes, 1).await;
    let a_result = a.commit().await;
    assert!(full.recv().await.unwrap(), "the big insert met SQLITE_FULL");
    assert!(big.await.unwrap().is_err());
    let present = names(&pool).await;
    assert_eq!(
        a_result.is_ok(),
        present.contains(&"a".to_owned()),
        "{a_result:?} {present:?}"
    );
    assert!(!present.contains(&"big".to_owned()));

    sqlx::query("PRAGMA max_page_count = 1000000")
        .execute(&pool)
        .await
        .unwrap();
    let mut next = writes.begin().await.unwrap();
    insert(&mut next, "next").await.unwrap();
    next.commit().await.unwrap();
    assert!(names(&pool).await.contains(&"next".to_owned()));
}

/// A member whose `commit()` is cancelled while it waits for the group is committed with it
/// all the same (its work is in the group).
#[tokio::test]
async fn a_member_cancelled_while_it_waits_for_the_group_is_committed_with_it() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = grouped(&pool);
    let mut a = writes.begin().await.unwrap();
    insert(&mut a, "a").await.unwrap();
    let mut b = paused(&writes, "b");
    waiting(&writes, 1).await;
    let a_commit = tokio::spawn(a.commit());
    b.began.recv().await.unwrap();
    a_commit.abort(); // A's client went away while it waited for the group
    assert!(a_commit.await.unwrap_err().is_cancelled());
    b.go.send(()).unwrap();
    b.done.await.unwrap().unwrap();
    assert_eq!(names(&pool).await, ["a", "b"]);
}

/// A member that runs past the group's age bound is committed before the next one joins: the
/// next member opens a group of its own.
#[tokio::test]
async fn a_member_past_the_bound_commits_before_the_next_joins() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = WritePool::new(pool.clone()).group_commit(Some(
        GroupCommit::default().max_held(Duration::from_millis(20)),
    ));
    let mut a = writes.begin().await.unwrap();
    insert(&mut a, "a").await.unwrap();
    let mut b = paused(&writes, "b");
    waiting(&writes, 1).await;
    tokio::time::sleep(Duration::from_millis(30)).await; // past the bound
    a.commit().await.unwrap();
    assert_eq!(names(&pool).await, ["a"], "committed before B joined");
    b.began.recv().await.unwrap();
    b.go.send(()).unwrap();
    b.done.await.unwrap().unwrap();
    let stats = writes.stats().unwrap();
    assert_eq!((stats.transactions, stats.commits), (2, 2));
}

/// `max_members(1)`: every transaction alone.
#[tokio::test]
async fn one_member_groups_commit_every_transaction_alone() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = WritePool::new(pool.clone())
        .group_commit(Some(GroupCommit::default().max_members(NonZeroUsize::MIN)));
    let mut a = writes.begin().await.unwrap();
    insert(&mut a, "a").await.unwrap();
    let mut b = paused(&writes, "b");
    waiting(&writes, 1).await;
    a.commit().await.unwrap();
    assert_eq!(names(&pool).await, ["a"]);
    b.began.recv().await.unwrap();
    b.go.send(()).unwrap();
    b.done.await.unwrap().unwrap();
    assert_eq!(writes.stats().unwrap().commits, 2);
}

/// Many writers at once, with groups: nothing lost or doubled, and they do group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_group_and_lose_nothing() {
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 4).await;
    let writes = grouped(&pool);
    let start = Arc::new(Barrier::new(64));
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (writes, start) = (writes.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for j in 0..20 {
                let mut tx: WriteTransaction = writes.begin().await.unwrap();
                insert(&mut tx, &format!("{i}-{j}")).await.unwrap();
                if j % 7 == 3 {
                    tx.rollback().await.unwrap(); // some roll back
                } else {
                    tx.commit().await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let committed = names(&pool).await.len();
    let expected = 64 * (20 - (0..20).filter(|j| j % 7 == 3).count());
    assert_eq!(committed, expected);
    let stats = writes.stats().unwrap();
    eprintln!("{stats:?}");
    assert_eq!(stats.transactions, 64 * 20);
    assert!(
        stats.commits < stats.transactions,
        "some grouped: {stats:?}"
    );
}

/// A member waiting for its group's outcome waits no longer than its request's deadline: it is
/// answered while the member after it still holds the group, and not replayed (fenced: the
/// group may yet commit it, and does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_for_the_group_ends_at_the_deadline() {
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::post;
    use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};

    #[derive(Clone)]
    struct S {
        writes: WritePool,
        began: mpsc::UnboundedSender<()>,
        go: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>>,
        calls: Arc<AtomicU32>,
    }
    async fn handler(State(s): State<S>) -> Result<StatusCode, DbError> {
        s.calls.fetch_add(1, Ordering::SeqCst);
        let mut tx = s.writes.begin().await?;
        s.began.send(()).unwrap();
        s.go.lock().await.recv().await.unwrap();
        insert(&mut tx, "the request's").await?;
        tx.commit().await?;
        Ok(StatusCode::CREATED)
    }
    let db = TestDb::new();
    let pool = pool_of(db.options(Duration::from_secs(5)), 2).await;
    let writes = grouped(&pool);
    let (began, mut request_began) = mpsc::unbounded_channel();
    let (go, go_rx) = mpsc::unbounded_channel();
    let state = S {
        writes: writes.clone(),
        began,
        go: Arc::new(tokio::sync::Mutex::new(go_rx)),
        calls: Arc::default(),
    };
    let app = axum::Router::new()
        .route("/", post(handler))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().deadline(Duration::from_secs(1)),
        ))
        .with_state(state.clone());
    let server = common::serve(app).await;
    let client = common::HttpClient::new(server.addr);
    let request = tokio::spawn(async move { client.post("/", "").await });
    request_began.recv().await.unwrap(); // the request's member opened the group
    let mut held = paused(&writes, "held open after it");
    waiting(&writes, 1).await;
    go.send(()).unwrap(); // the request's member commits: the group goes to `held`
    held.began.recv().await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), request)
        .await
        .expect("answered while the next member still holds the group")
        .unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        1,
        "not replayed: fenced"
    );
    held.go.send(()).unwrap();
    held.done.await.unwrap().unwrap();
    assert_eq!(names(&pool).await, ["the request's", "held open after it"]);
}
