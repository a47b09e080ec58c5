//! Group commit (`WritePool::group_commit`, on by default) on real SQLite files, and the rule it
//! keeps: every outcome with groups on is one the same requests could have had with groups off.
//! Each transaction commits on its own; what is shared is the fsync of the WAL, and `commit()`
//! returns only once an fsync that started after its `COMMIT` completed.
//!
//! Every ordering here is made by the test: the fsync held (`hold_fsync`, a test seam), a
//! transaction held open, a handler paused on a channel. The findings of the issue that asked
//! for this design each have a test: another request's deferred foreign key or trigger
//! rollback fails only that request; a write answered is never one that did not commit, nor
//! the reverse; a lock held across `commit()` and a slow next writer delay nobody's
//! acknowledgement; `acquire_timeout` bounds the wait; a runtime shut down with a commit
//! waiting for its fsync ends cleanly; statements that would commit outside the write path
//! (a raw `COMMIT`/`ROLLBACK`, after a trigger's `RAISE(ROLLBACK)`) are refused; a rollback
//! fires SQLite's rollback hook.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::{HttpClient, TestDb, commit_in_background, poll_until, serve};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::{Mutex as AsyncMutex, mpsc};
use tower_sqlite_retry::write::WriterConnection;
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
    CREATE TABLE IF NOT EXISTS parents (id INTEGER PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS children (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        parent INTEGER NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED
    );
    INSERT OR IGNORE INTO parents (id) VALUES (1);
    CREATE TRIGGER IF NOT EXISTS no_bad_items BEFORE INSERT ON items
        WHEN NEW.name LIKE 'bad%'
        BEGIN SELECT RAISE(ROLLBACK, 'bad items are refused'); END;
";

/// WAL at `FULL` (sqlx's default `synchronous`, and its default `foreign_keys = ON`).
fn full(db: &TestDb) -> SqliteConnectOptions {
    db.options(Duration::from_secs(5))
        .synchronous(SqliteSynchronous::Full)
}

async fn pool_of(options: SqliteConnectOptions, acquire: Duration) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(acquire)
        .connect_with(options)
        .await
        .expect("pool");
    sqlx::raw_sql(SCHEMA).execute(&pool).await.expect("schema");
    pool
}

async fn insert(tx: &mut SqliteConnection, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(tx)
        .await
        .map(drop)
}

async fn names(pool: &SqlitePool, table: &str) -> Vec<String> {
    let sql = format!("SELECT name FROM {table} ORDER BY id");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .expect("names")
}

/// One transaction committed, so that the pool knows its database (and its shared fsync).
async fn warm(writes: &WritePool, name: &str) {
    let mut tx = writes.begin().await.unwrap();
    insert(&mut tx, name).await.unwrap();
    tx.commit().await.unwrap();
}

async fn synchronous_in_a_transaction(writes: &WritePool) -> i64 {
    let mut tx = writes.begin().await.unwrap();
    let level: i64 = sqlx::query_scalar("SELECT synchronous FROM pragma_synchronous")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    level
}

/// A transaction committed while the fsync is held is in the file (its `COMMIT` returned),
/// and its `commit()` does not return until an fsync ran; then it is `Ok`.
#[tokio::test]
async fn a_commit_returns_only_after_an_fsync_that_started_after_it() {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    let before = writes.stats().unwrap();
    assert_eq!(
        (before.syncs, before.synced),
        (0, 0),
        "a writer alone: its COMMIT fsynced itself, nothing shared"
    );

    assert!(
        tower_sqlite_retry::__private::hold_fsync(&writes, true),
        "group commit shares the fsync here"
    );
    let commit = commit_in_background(&writes, &pool, "a").await;
    // Held: no fsync can have run since, so the commit cannot have returned.
    assert!(!commit.is_finished(), "acknowledged before its fsync");
    assert_eq!(writes.stats().unwrap().syncs, 0);

    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    commit.await.unwrap().unwrap();
    let after = writes.stats().unwrap();
    assert_eq!((after.syncs, after.synced), (1, 1));
}

/// The bound on commits waiting for one fsync (issue 40, finding 6): while the fsync stalls
/// (held here), 512 transactions commit and wait unanswered; the next one begins at the
/// pool's own level, `FULL`, and its `COMMIT` syncs itself in the turn (so on a disk that
/// really stalls, it would hold the turn and every later writer waits, as without groups).
/// Then all 513 are answered `Ok`, and later transactions share again.
#[tokio::test]
async fn past_the_bound_a_stalled_fsync_holds_writers_back() {
    const BOUND: usize = 512; // `MAX_UNANSWERED` in `src/write/durable/report.rs`
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    assert!(tower_sqlite_retry::__private::hold_fsync(&writes, true));
    let mut commits = Vec::new();
    for i in 0..BOUND {
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, &format!("w{i}")).await.unwrap();
        commits.push(tokio::spawn(tx.commit()));
        // Each has joined the waiters once it gave the turn back.
        poll_until("the turn given back", async || {
            writes
                .stats()
                .is_some_and(|s| s.transactions as usize > i + 1)
        })
        .await;
    }
    assert!(
        commits.iter().all(|c| !c.is_finished()),
        "held: none answered"
    );
    // The 513th: at `FULL`, its `COMMIT` its own fsync; answered while the others wait.
    assert_eq!(
        synchronous_in_a_transaction(&writes).await,
        2,
        "FULL past the bound"
    );
    assert!(commits.iter().all(|c| !c.is_finished()));
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    for commit in commits {
        commit.await.unwrap().unwrap();
    }
    assert_eq!(writes.stats().unwrap().synced, BOUND as u64);
    // Below the bound again: a transaction begun while the fsync is held shares it.
    tower_sqlite_retry::__private::hold_fsync(&writes, true);
    let mut tx = writes.begin().await.unwrap();
    let level: i64 = sqlx::query_scalar("SELECT synchronous FROM pragma_synchronous")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(level, 1, "NORMAL: shared again");
    tx.rollback().await.unwrap();
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
}

/// Transactions that commit while the fsync waits share the next one: three commits, one
/// fsync. Each commits on its own (its row is in the file before the fsync).
#[tokio::test]
async fn transactions_that_commit_while_an_fsync_waits_share_the_next() {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    tower_sqlite_retry::__private::hold_fsync(&writes, true);
    let mut commits = Vec::new();
    for name in ["a", "b", "c"] {
        commits.push(commit_in_background(&writes, &pool, name).await);
    }
    assert!(commits.iter().all(|c| !c.is_finished()));
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    for commit in commits {
        commit.await.unwrap().unwrap();
    }
    let stats = writes.stats().unwrap();
    assert_eq!(
        (stats.transactions, stats.syncs, stats.synced),
        (4, 1, 3),
        "one fsync for the three"
    );
}

/// The writer connection goes to `NORMAL` only while a shared fsync replaces the `COMMIT`'s:
/// WAL at `FULL` or `EXTRA`, with another writer waiting or an fsync under way (here: held).
/// A writer alone runs at the pool's level. Without groups, at `NORMAL`, or in a
/// rollback-journal mode, it keeps the pool's level and nothing is shared.
#[tokio::test]
async fn the_writer_connection_runs_at_normal_only_while_the_fsync_is_shared() {
    let cases = [
        (SqliteJournalMode::Wal, SqliteSynchronous::Full, true, true),
        (SqliteJournalMode::Wal, SqliteSynchronous::Extra, true, true),
        (
            SqliteJournalMode::Wal,
            SqliteSynchronous::Full,
            false,
            false,
        ),
        (
            SqliteJournalMode::Wal,
            SqliteSynchronous::Normal,
            true,
            false,
        ),
        (
            SqliteJournalMode::Delete,
            SqliteSynchronous::Full,
            true,
            false,
        ),
    ];
    for (journal, level, groups, shared) in cases {
        let db = TestDb::new();
        let options = db
            .options(Duration::from_secs(5))
            .journal_mode(journal)
            .synchronous(level);
        let pool = pool_of(options, Duration::from_secs(30)).await;
        let mut writes = WritePool::new(pool.clone());
        if !groups {
            writes = writes.group_commit(false);
        }
        let what = format!("{journal:?} {level:?} groups {groups}");
        assert_eq!(
            synchronous_in_a_transaction(&writes).await,
            level as i64,
            "{what}: a writer alone"
        );
        assert_eq!(
            tower_sqlite_retry::__private::hold_fsync(&writes, true),
            shared,
            "{what}"
        );
        let mut tx = writes.begin().await.unwrap();
        let inside: i64 = sqlx::query_scalar("SELECT synchronous FROM pragma_synchronous")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let expected = if shared { 1 } else { level as i64 };
        assert_eq!(inside, expected, "{what}: the fsync shared");
        let commit = tokio::spawn(tx.commit());
        tower_sqlite_retry::__private::hold_fsync(&writes, false);
        commit.await.unwrap().unwrap();
        // And back at the pool's level once alone again.
        assert_eq!(
            synchronous_in_a_transaction(&writes).await,
            level as i64,
            "{what}: alone again"
        );
        let stats = writes.stats().unwrap();
        assert_eq!(stats.syncs, u64::from(shared), "{what}");
        // The pool's own connections keep their level.
        let pooled: i64 = sqlx::query_scalar("SELECT synchronous FROM pragma_synchronous")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(pooled, level as i64, "{what}: the pool's connections");
    }
}

/// Finding 7: the wait for the turn ends at the pool's `acquire_timeout`, groups or not.
#[tokio::test]
async fn acquire_timeout_bounds_the_wait_for_the_turn() {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_millis(300)).await;
    let writes = WritePool::new(pool.clone());
    let held = writes.begin().await.unwrap(); // held open until the end
    let started = std::time::Instant::now();
    let waited = tokio::time::timeout(Duration::from_secs(60), writes.begin())
        .await
        .expect("the wait ended by itself");
    assert!(matches!(waited, Err(sqlx::Error::PoolTimedOut)));
    // Not before its bound (the bound is a floor here, not a speed claim).
    assert!(started.elapsed() >= Duration::from_millis(300));
    held.rollback().await.unwrap();
}

/// Findings 5 and 6: X holds a lock across its `commit()`; Y, the next writer, takes that lock
/// inside its transaction, and Y's work does not go on until the test says so. X's commit
/// waits for neither (its acknowledgement is its own `COMMIT` and an fsync), so Y then gets
/// the lock, and both commit.
#[tokio::test]
async fn a_commit_never_waits_for_the_next_writers_work() {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    let lock = Arc::new(AsyncMutex::new(()));
    let guard = lock.clone().lock_owned().await;
    let mut x = writes.begin().await.unwrap();
    insert(&mut x, "x").await.unwrap();

    let (go_tx, mut go) = mpsc::unbounded_channel::<()>();
    let y = tokio::spawn({
        let (writes, lock) = (writes.clone(), lock.clone());
        async move {
            let mut tx = writes.begin().await?;
            insert(&mut tx, "y").await?;
            go.recv().await; // Y's own work: as long as the test likes
            let _held = lock.lock().await; // the lock X holds across its commit
            tx.commit().await
        }
    });
    poll_until("Y waits for the turn", async || {
        writes.stats().unwrap().waiting == 1
    })
    .await;
    // X commits while Y waits for the turn, then gets it and holds it, paused. A group that
    // X's acknowledgement waited on would never end here: the timeout only turns a hang
    // into a failure.
    tokio::time::timeout(Duration::from_secs(60), x.commit())
        .await
        .expect("X's commit waited for Y's work")
        .unwrap();
    drop(guard);
    go_tx.send(()).unwrap();
    y.await.unwrap().unwrap();
    assert_eq!(names(&pool, "items").await, ["warm", "x", "y"]);
}

/// A `commit()` cancelled while it waits for its fsync: the transaction is committed (its
/// `COMMIT` returned), and the fsync still runs for the others.
#[tokio::test]
async fn a_commit_cancelled_while_it_waits_for_its_fsync_stays_committed() {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    tower_sqlite_retry::__private::hold_fsync(&writes, true);
    let commit = commit_in_background(&writes, &pool, "cancelled").await;
    commit.abort();
    assert!(commit.await.unwrap_err().is_cancelled());
    let mut next = writes.begin().await.unwrap();
    insert(&mut next, "next").await.unwrap();
    let next = tokio::spawn(next.commit());
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    next.await.unwrap().unwrap();
    assert_eq!(names(&pool, "items").await, ["warm", "cancelled", "next"]);
}

/// Finding 10: a rollback is SQLite's `ROLLBACK`, and fires its rollback hook.
#[tokio::test]
async fn a_rollback_fires_the_rollback_hook() {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    let fired = Arc::new(AtomicUsize::new(0));
    let mut tx = writes.begin().await.unwrap();
    {
        let fired = fired.clone();
        let mut handle = tx.lock_handle().await.unwrap();
        handle.set_rollback_hook(move || {
            fired.fetch_add(1, Ordering::SeqCst);
        });
    }
    insert(&mut tx, "rolled back").await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(names(&pool, "items").await, ["warm"]);
}

/// Finding 9 (and the write path as a whole): a raw `COMMIT` run on the transaction is refused
/// (only the write path commits), nothing of the transaction is in the file, and `commit()`
/// fails saying why. Groups on and off.
#[tokio::test]
async fn a_raw_commit_on_the_transaction_is_refused() {
    for groups in [true, false] {
        let db = TestDb::new();
        let pool = pool_of(full(&db), Duration::from_secs(30)).await;
        let mut writes = WritePool::new(pool.clone());
        if !groups {
            writes = writes.group_commit(false);
        }
        warm(&writes, "warm").await;
        // Twice: the first failure closes the writer connection (its transaction state is not
        // what sqlx counts), and the one opened after it must be guarded too.
        for round in ["first", "second"] {
            let mut tx = writes.begin().await.unwrap();
            insert(&mut tx, "raw").await.unwrap();
            let raw = sqlx::query("COMMIT").execute(&mut *tx).await;
            let code = raw
                .unwrap_err()
                .into_database_error()
                .unwrap()
                .code()
                .map(|c| c.into_owned());
            assert_eq!(
                code.as_deref(),
                Some("531"),
                "{round}: SQLITE_CONSTRAINT_COMMITHOOK"
            );
            // In autocommit mode now: a write is refused too.
            assert!(insert(&mut tx, "after").await.is_err());
            let error = tx.commit().await.unwrap_err();
            assert!(
                matches!(&error, sqlx::Error::InvalidArgument(m) if m.contains("raw COMMIT")),
                "{round}: {error}"
            );
            assert_eq!(names(&pool, "items").await, ["warm"], "groups {groups}");
        }
        // The next transaction runs as usual.
        warm(&writes, "next").await;
        assert_eq!(names(&pool, "items").await, ["warm", "next"]);
    }
}

/// The four modes a handler's own hook is tried in: group commit on and off, `FULL` and
/// `NORMAL`.
async fn hook_modes() -> Vec<(String, TestDb, SqlitePool, WritePool)> {
    let mut modes = Vec::new();
    for groups in [true, false] {
        for level in [SqliteSynchronous::Full, SqliteSynchronous::Normal] {
            let db = TestDb::new();
            let options = db.options(Duration::from_secs(5)).synchronous(level);
            let pool = pool_of(options, Duration::from_secs(30)).await;
            let mut writes = WritePool::new(pool.clone());
            if !groups {
                writes = writes.group_commit(false);
            }
            warm(&writes, "warm").await;
            modes.push((format!("groups {groups}, {level:?}"), db, pool, writes));
        }
    }
    // And on the pool's own connection (`WriterConnection::FromPool`): one, so that every
    // later transaction, and the pool's own autocommit writes, meet the connection the
    // handler's hook was set on.
    let db = TestDb::new();
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(full(&db))
        .await
        .expect("pool");
    sqlx::raw_sql(SCHEMA).execute(&pool).await.expect("schema");
    let writes = WritePool::new(pool.clone()).writer(WriterConnection::FromPool);
    warm(&writes, "warm").await;
    modes.push(("from the pool, FULL".to_owned(), db, pool, writes));
    modes
}

/// After a write transaction on one of the pool's connections, the pool's own autocommit
/// writes commit: the write path's gate is not left on it (`WriterConnection::FromPool`; a
/// no-op in the other modes, whose writer connection is not the pool's). The write is undone
/// (deleted), so that the caller's list of names is as before.
async fn the_pools_own_writes_commit(mode: &str, pool: &SqlitePool) {
    sqlx::query("INSERT INTO items (name) VALUES ('the pool''s own')")
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{mode}: the pool's own write after a write transaction: {e}"));
    sqlx::query("DELETE FROM items WHERE name = 'the pool''s own'")
        .execute(pool)
        .await
        .unwrap();
}

/// sqlx's `test_query_with_commit_hook`, on a write transaction: a handler's commit hook that
/// vetoes fails its own commit with `constraint failed`, and is called. Then (what sqlx's test
/// does not ask, and the write path must) it ends with its transaction: the next transactions
/// commit, and the write path's guard is back (a raw `COMMIT` is refused again). Issue 40,
/// finding 7.
#[tokio::test]
async fn a_handlers_commit_hook_lasts_only_its_own_transaction() {
    for (mode, _db, pool, writes) in hook_modes().await {
        let called = Arc::new(AtomicUsize::new(0));
        let mut tx = writes.begin().await.unwrap();
        {
            let called = called.clone();
            // A canary, as in sqlx's test: the hook sees its own captured state.
            let state = String::from("test");
            tx.lock_handle().await.unwrap().set_commit_hook(move || {
                called.fetch_add(1, Ordering::SeqCst);
                assert_eq!(state, "test");
                false
            });
        }
        insert(&mut tx, "vetoed").await.unwrap();
        match tx.commit().await {
            Err(sqlx::Error::Database(error)) => {
                assert_eq!(error.message(), "constraint failed", "{mode}");
            }
            other => panic!("{mode}: expected the hook's veto, got {other:?}"),
        }
        assert_eq!(called.load(Ordering::SeqCst), 1, "{mode}");
        for name in ["next", "after"] {
            warm(&writes, name).await;
        }
        the_pools_own_writes_commit(&mode, &pool).await;
        assert_eq!(
            called.load(Ordering::SeqCst),
            1,
            "{mode}: the hook outlived its transaction"
        );
        assert_eq!(
            names(&pool, "items").await,
            ["warm", "next", "after"],
            "{mode}"
        );
        // The guard is back: a raw `COMMIT` is refused.
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, "raw").await.unwrap();
        assert!(
            sqlx::query("COMMIT").execute(&mut *tx).await.is_err(),
            "{mode}"
        );
        assert!(tx.commit().await.is_err(), "{mode}");
        assert_eq!(
            names(&pool, "items").await,
            ["warm", "next", "after"],
            "{mode}"
        );
    }
}

/// A handler's hook that lets its commit through, or one removed, or one set in a transaction
/// that is then rolled back or dropped: each is gone once its transaction ended (sqlx's
/// `test_multiple_set_commit_hook_calls_drop_old_handler`: the old handler is dropped, the
/// value it captured released), and the guard refuses a raw `COMMIT` in the next transaction.
#[tokio::test]
async fn a_handlers_hook_is_dropped_with_its_transaction_however_it_ends() {
    for (mode, _db, pool, writes) in hook_modes().await {
        for end in ["commit", "remove then commit", "rollback", "drop"] {
            let captured = Arc::new(0);
            let mut tx = writes.begin().await.unwrap();
            {
                let captured = captured.clone();
                let mut handle = tx.lock_handle().await.unwrap();
                handle.set_commit_hook(move || {
                    let _ = &captured;
                    true
                });
                if end == "remove then commit" {
                    handle.remove_commit_hook();
                }
            }
            insert(&mut tx, end).await.unwrap();
            match end {
                "rollback" => tx.rollback().await.unwrap(),
                "drop" => drop(tx),
                _ => tx.commit().await.unwrap(),
            }
            poll_until(
                format!("{mode}, {end}: the handler's hook dropped"),
                async || Arc::strong_count(&captured) == 1,
            )
            .await;
            let mut tx = writes.begin().await.unwrap();
            insert(&mut tx, "raw").await.unwrap();
            assert!(
                sqlx::query("COMMIT").execute(&mut *tx).await.is_err(),
                "{mode}, {end}: the guard is back"
            );
            assert!(tx.commit().await.is_err(), "{mode}, {end}");
            the_pools_own_writes_commit(&mode, &pool).await;
        }
        let committed = names(&pool, "items").await;
        assert_eq!(
            committed,
            ["warm", "commit", "remove then commit"],
            "{mode}"
        );
    }
}

/// Finding 3: a trigger's `RAISE(ROLLBACK)` rolls back SQLite's whole transaction; a handler
/// that catches the error and writes on is refused (its later row does not land on its own in
/// autocommit mode), and `commit()` fails. Groups on and off. A raw `ROLLBACK` likewise.
#[tokio::test]
async fn writes_after_the_transaction_was_rolled_back_outside_the_write_path_are_refused() {
    for (groups, end) in [(true, "trigger"), (false, "trigger"), (true, "ROLLBACK")] {
        let db = TestDb::new();
        let pool = pool_of(full(&db), Duration::from_secs(30)).await;
        let mut writes = WritePool::new(pool.clone());
        if !groups {
            writes = writes.group_commit(false);
        }
        warm(&writes, "warm").await;
        let mut tx = writes.begin().await.unwrap();
        insert(&mut tx, "first").await.unwrap();
        if end == "trigger" {
            assert!(insert(&mut tx, "bad").await.is_err(), "the trigger refuses");
        } else {
            sqlx::query("ROLLBACK").execute(&mut *tx).await.unwrap();
        }
        let after = insert(&mut tx, "after").await.unwrap_err();
        let code = after
            .into_database_error()
            .unwrap()
            .code()
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("531"), "{end}: refused by the hook");
        assert!(tx.commit().await.is_err());
        assert_eq!(
            names(&pool, "items").await,
            ["warm"],
            "{end}, groups {groups}: nothing of the transaction landed"
        );
        warm(&writes, "next").await;
    }
}

/// A runtime shut down while a commit waits for its fsync (and the fsync task is queued) ends
/// cleanly: the test runs it in a child process (this binary, with `TSR_GROUP_SHUTDOWN` set),
/// which must exit normally and say so.
#[test]
fn a_runtime_shut_down_with_a_commit_waiting_for_its_fsync_ends_cleanly() {
    const CHILD: &str = "TSR_GROUP_SHUTDOWN";
    if std::env::var_os(CHILD).is_some() {
        return shutdown_child();
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "write_group::a_runtime_shut_down_with_a_commit_waiting_for_its_fsync_ends_cleanly",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child failed: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("shut down cleanly"), "{stdout}");
}

fn shutdown_child() {
    let db = TestDb::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pool = runtime.block_on(pool_of(full(&db), Duration::from_secs(30)));
    let writes = WritePool::new(pool.clone());
    runtime.block_on(async {
        warm(&writes, "warm").await;
        tower_sqlite_retry::__private::hold_fsync(&writes, true);
        commit_in_background(&writes, &pool, "waiting").await;
        // The fsync task starts, and the runtime goes away under it.
        tower_sqlite_retry::__private::hold_fsync(&writes, false);
    });
    drop(runtime);
    // Outside any runtime now: a commit here syncs for itself.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = pool_of(full(&db), Duration::from_secs(30)).await;
        let rows = names(&pool, "items").await;
        assert_eq!(rows, ["warm", "waiting"]);
    });
    println!("shut down cleanly");
}

// ---------------------------------------------------------------------------------------------
// Over real HTTP: what a client sees.

#[derive(Clone)]
struct App {
    writes: WritePool,
    /// Requests whose name starts with `pause` wait here after their insert.
    paused: Arc<AsyncMutex<Option<mpsc::UnboundedReceiver<()>>>>,
    began: mpsc::UnboundedSender<String>,
    calls: Arc<AtomicUsize>,
}

/// Inserts a child of `parent` named `name` (a parent that does not exist is a deferred
/// foreign-key violation, met at `COMMIT`), or an item (`bad…` names fire the trigger's
/// `RAISE(ROLLBACK)`); `pause…` names wait for the test's go after their insert.
async fn write(
    State(app): State<App>,
    UrlPath((table, name, parent)): UrlPath<(String, String, i64)>,
) -> Result<StatusCode, DbError> {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let mut tx = app.writes.begin().await?;
    if table == "children" {
        sqlx::query("INSERT INTO children (name, parent) VALUES (?, ?)")
            .bind(&name)
            .bind(parent)
            .execute(&mut *tx)
            .await?;
    } else {
        insert(&mut tx, &name).await?;
    }
    if name.starts_with("slow") {
        // Work inside the transaction (the workload, not an ordering).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if name.starts_with("pause") {
        let _ = app.began.send(name.clone());
        let mut paused = app.paused.lock().await;
        paused.as_mut().expect("a go channel").recv().await;
    }
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

struct Served {
    _server: common::Server,
    client: HttpClient,
    app: App,
    pool: SqlitePool,
    began: mpsc::UnboundedReceiver<String>,
    go: mpsc::UnboundedSender<()>,
    _db: TestDb,
}

async fn served(policy: RetryPolicy) -> Served {
    let db = TestDb::new();
    let pool = pool_of(full(&db), Duration::from_secs(30)).await;
    let writes = WritePool::new(pool.clone());
    warm(&writes, "warm").await;
    let (go, go_rx) = mpsc::unbounded_channel();
    let (began_tx, began) = mpsc::unbounded_channel();
    let app = App {
        writes,
        paused: Arc::new(AsyncMutex::new(Some(go_rx))),
        began: began_tx,
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let router = Router::new()
        .route("/{table}/{name}/{parent}", post(write))
        .layer(SqliteRetryLayer::new(policy))
        .with_state(app.clone());
    let server = serve(router).await;
    Served {
        client: HttpClient::new(server.addr),
        _server: server,
        app,
        pool,
        began,
        go,
        _db: db,
    }
}

/// An innocent request paused in its transaction while a guilty one queues behind it; then
/// both go on. Returns their statuses.
async fn innocent_then_guilty(s: &mut Served, innocent: &str, guilty: &str) -> (u16, u16) {
    let client = s.client.clone();
    let innocent = format!("/{innocent}");
    let a = tokio::spawn(async move { client.post(&innocent, "").await });
    s.began.recv().await.expect("the innocent request began");
    let client = s.client.clone();
    let guilty = format!("/{guilty}");
    let b = tokio::spawn(async move { client.post(&guilty, "").await });
    poll_until("the guilty request waits for the turn", async || {
        s.app.writes.stats().unwrap().waiting == 1
    })
    .await;
    s.go.send(()).unwrap();
    let a = a.await.unwrap();
    let b = b.await.unwrap();
    common::assert_no_db_detail(&b.text());
    (a.status.as_u16(), b.status.as_u16())
}

/// Finding 1: another request's deferred foreign-key violation fails that request alone
/// (`409`, not replayed); the innocent one, which committed just before it, is `201` and its
/// row is in the file.
#[tokio::test]
async fn a_deferred_foreign_key_fails_only_its_own_request() {
    let mut s = served(RetryPolicy::default()).await;
    let statuses =
        innocent_then_guilty(&mut s, "children/pause-a/1", "children/dangling/999").await;
    assert_eq!(statuses, (201, 409));
    assert_eq!(names(&s.pool, "children").await, ["pause-a"]);
    assert_eq!(s.app.calls.load(Ordering::SeqCst), 2, "nothing replayed");
}

/// Finding 2: a trigger's `RAISE(ROLLBACK)` in another request fails that request alone.
#[tokio::test]
async fn a_trigger_rollback_fails_only_its_own_request() {
    let mut s = served(RetryPolicy::default()).await;
    let statuses = innocent_then_guilty(&mut s, "items/pause-a/0", "items/bad-b/0").await;
    assert_eq!(statuses, (201, 409));
    assert_eq!(names(&s.pool, "items").await, ["warm", "pause-a"]);
    assert_eq!(s.app.calls.load(Ordering::SeqCst), 2, "nothing replayed");
}

/// Finding 4: a request whose deadline passes while its commit waits for the fsync is answered
/// as what it is, committed (`201`), once the fsync ran; never `503` for a row in the file.
#[tokio::test]
async fn a_commit_waiting_for_its_fsync_past_the_deadline_is_answered_committed() {
    // The case needs the request to reach its `COMMIT` before its deadline. Whether a given
    // deadline is long enough is the machine's speed, so it is not assumed: a request whose
    // deadline came first must be answered as what it is (503, nothing written), and the
    // scenario runs again with a deadline twice as long, until the case is reached.
    let mut deadline = Duration::from_millis(300);
    loop {
        let s = served(RetryPolicy::default().deadline(deadline)).await;
        tower_sqlite_retry::__private::hold_fsync(&s.app.writes, true);
        let started = std::time::Instant::now();
        let client = s.client.clone();
        let request = tokio::spawn(async move { client.post("/items/late/0", "").await });
        poll_until(
            "the COMMIT returned, or the request was answered",
            async || {
                request.is_finished() || names(&s.pool, "items").await.contains(&"late".to_owned())
            },
        )
        .await;
        if request.is_finished() {
            let reply = request.await.unwrap();
            assert_eq!(
                reply.status,
                StatusCode::SERVICE_UNAVAILABLE,
                "{}",
                reply.text()
            );
            assert_eq!(names(&s.pool, "items").await, ["warm"], "nothing written");
            assert!(
                deadline < Duration::from_secs(60),
                "no deadline was long enough"
            );
            deadline *= 2;
            continue;
        }
        // Committed, and waiting for the fsync, which is held until the deadline has passed.
        poll_until("the deadline passed", async || {
            started.elapsed() > deadline * 2
        })
        .await;
        assert!(!request.is_finished());
        tower_sqlite_retry::__private::hold_fsync(&s.app.writes, false);
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(names(&s.pool, "items").await, ["warm", "late"]);
        assert_eq!(s.app.calls.load(Ordering::SeqCst), 1);
        return;
    }
}

/// Under load, with groups on: innocent, guilty (a dangling deferred foreign key, or the
/// trigger's rollback) and slow (a pause inside the transaction) requests from 8 clients at
/// once. Every `201` has its row, no row is there without a `201`, none twice; every innocent
/// and slow request is `201`, every guilty one `409`; and the fsyncs were shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_every_request_gets_its_own_outcome() {
    let s = served(RetryPolicy::default().deadline(Duration::from_secs(30))).await;
    let clients = 8;
    let per_client = 40;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = s.client.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..per_client {
                // A fixed mix per index: a quarter guilty, an eighth slow.
                let (path, kind) = match (c * per_client + i) % 8 {
                    0 => (format!("/children/g{c}-{i}/999"), "guilty"),
                    1 => (format!("/items/bad{c}-{i}/0"), "guilty"),
                    2 => (format!("/items/slow{c}-{i}/0"), "slow"),
                    3 | 4 => (format!("/children/c{c}-{i}/1"), "innocent"),
                    _ => (format!("/items/i{c}-{i}/0"), "innocent"),
                };
                let reply = client.post(&path, "").await;
                seen.push((path, kind, reply.status.as_u16()));
            }
            seen
        }));
    }
    let mut created = Vec::new();
    for task in tasks {
        for (path, kind, status) in task.await.unwrap() {
            let expected = if kind == "guilty" { 409 } else { 201 };
            assert_eq!(status, expected, "{path} ({kind})");
            if status == 201 {
                created.push(path.split('/').nth(2).unwrap().to_owned());
            }
        }
    }
    let mut rows = names(&s.pool, "items").await;
    rows.retain(|r| r != "warm");
    rows.extend(names(&s.pool, "children").await);
    rows.sort();
    created.sort();
    assert_eq!(rows, created, "the rows are exactly the 201s, once each");
    // Only transactions whose COMMIT went through waited for a shared fsync (the others
    // alone fsynced their own COMMIT).
    let stats = s.app.writes.stats().unwrap();
    assert!(stats.synced <= created.len() as u64 + 1, "{stats:?}");
}
