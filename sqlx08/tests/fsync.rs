//! A failed fsync of the WAL on the sqlx 0.8 write path: the main crate's fault-injection tests
//! (`tests/write/power_loss.rs`), against sqlx 0.8's driver.
//!
//! The group commit and the refusal after a failed sync are the main crate's one
//! implementation, but the calls that run the `COMMIT`, the shared fsync and the checkpoint on
//! the writer connection are this crate's (`__sqlx_driver!` expanded against sqlx 0.8): a
//! failure that sqlx 0.8 reported differently, or a sync this crate's driver skipped, would not
//! show in the main crate's tests.
//!
//! The child process runs under the main crate's `LD_PRELOAD` shim
//! (`../tests/power_loss/shim.c`, built with `cc` at run time; without one the tests print
//! `SKIPPED:` and pass), which keeps a durable shadow of each file of the database's directory,
//! updated only by `fsync`/`fdatasync`, and makes the WAL's next fsync fail on command
//! (`.ctl/fail-next-fsync:<file>`). Once the child has exited, the test copies each shadow over
//! its file (the power loss) and opens the database afresh: every write the child was told was
//! durable must be there. The shim, the simulated disk, the child and the power loss are the
//! main crate's power-loss harness (`../tests/power_loss/harness.rs`, included from the
//! checkout: outside this package, so these tests build in the main crate's checkout only);
//! the scenarios, on sqlx 0.8, are here.
//!
//! - `after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit`: two commits
//!   waiting for a shared fsync that fails are not `Ok`, and later writes are refused.
//! - `after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write`: the same with a second
//!   pool on the file, whose fsync never failed: it refuses too.
//!
//! The child is this test binary itself, run with `TSR_SQLX08_FAULT_CHILD` set: the test
//! `fault_child` then does the child's part (without it, it returns).
#![cfg(target_os = "linux")]

#[path = "../../tests/power_loss/harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::{DB, FaultChild, assert_refused, names_the_disk, shim_command};

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry_sqlx08::WritePool;

/// What the child does: `fault:<scenario>:<dir>`.
const CHILD: &str = "TSR_SQLX08_FAULT_CHILD";
/// The child's entry point, by its full name in this test binary.
const FAULT_CHILD: &str = "fault_child";
/// The fault child, for the harness.
const FAULT: FaultChild = FaultChild {
    var: CHILD,
    entry: FAULT_CHILD,
    timeout: Duration::from_secs(120),
};

// ---------------------------------------------------------------------------------------------
// The database (the shim and the simulated disk are the harness')
// ---------------------------------------------------------------------------------------------

/// WAL at `FULL` with a busy timeout of 5 s: the settings under which group commit shares
/// the WAL's fsync.
fn options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
}

// ---------------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------------

/// The child side: `fault:<scenario>:<dir>`. Not a test on its own: run by
/// `harness::run_fault_child`; a no-op without its variable.
#[test]
#[ignore = "a child process's entry point, run by the fsync-error tests"]
fn fault_child() {
    let Some([scenario, dir]) = harness::child_job(CHILD, "fault") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match scenario.as_str() {
            "failed-fsync" => failed_fsync(&dir).await,
            "failed-fsync-two-pools" => failed_fsync_two_pools(&dir).await,
            other => panic!("unknown scenario {other}"),
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The scenarios (in the child, under the shim)
// ---------------------------------------------------------------------------------------------

/// A sqlx 0.8 pool on `dir/db.sqlite` with the `items` table.
async fn pool(dir: &Path) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options(&dir.join(DB)))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// A pool at `FULL` on `dir/db.sqlite`, its write path (group commit on, the default) after a
/// first write, with the shared fsync held. The first write's fsync was not held: it is
/// acknowledged, and must survive the power loss.
async fn held_write_pool(dir: &Path) -> (SqlitePool, WritePool) {
    let pool = pool(dir).await;
    let writes = WritePool::new(pool.clone());
    transaction(&writes, "first")
        .await
        .expect("the first write transaction");
    println!("fault: acked first");
    assert!(
        tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, true),
        "the write path shares the WAL's fsync (WAL, FULL, group commit on)"
    );
    (pool, writes)
}

/// One write transaction inserting `name`: `Ok`, or the step that failed and why.
async fn transaction(writes: &WritePool, name: &str) -> Result<(), String> {
    let mut tx = writes.begin().await.map_err(|e| format!("begin: {e}"))?;
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(|e| format!("insert: {e}"))?;
    tx.commit().await.map_err(|e| format!("commit: {e}"))
}

/// Polls `check` every 2 ms until it holds (a condition, not a guess at timing); panics with
/// `what` after 30 s.
async fn poll_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Begins on `writes`, inserts `name`, and commits in a task of its own; returns once the
/// `COMMIT` went through (the row is in the file, read through `pool`) and the transaction gave
/// its turn back (which it does after it joined the wait for the shared fsync), with the task,
/// which still waits for its fsync while that is held. Without both conditions, the fault
/// could be injected before the commit waits for the fsync it is meant to fail.
async fn commit_in_background(
    writes: &WritePool,
    pool: &SqlitePool,
    name: &str,
) -> tokio::task::JoinHandle<Result<(), sqlx::Error>> {
    let given_back = writes.stats().map_or(0, |s| s.transactions);
    let mut tx = writes.begin().await.unwrap();
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(&mut *tx)
        .await
        .unwrap();
    let commit = tokio::spawn(tx.commit());
    poll_until(&format!("{name}'s COMMIT went through"), async || {
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items")
            .fetch_all(pool)
            .await
            .unwrap();
        names.iter().any(|n| n == name)
    })
    .await;
    // The row can be in the file before the commit joined the fsync's waiters: the turn comes
    // back only after it did.
    poll_until(&format!("{name}'s turn given back"), async || {
        writes.stats().is_some_and(|s| s.transactions > given_back)
    })
    .await;
    commit
}

/// None of `names` is in the file.
async fn assert_not_in_file(pool: &SqlitePool, names: &[&str]) {
    for name in names {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE name = ?")
            .bind(name)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(n, 0, "{name} was refused: nothing of it written");
    }
}

/// The shared fsync itself fails. Both transactions that committed while it was held waited
/// for it: neither is acknowledged, and every later write is refused.
async fn failed_fsync(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    let t2 = commit_in_background(&writes, &pool, "t2").await;
    assert!(
        !t1.is_finished() && !t2.is_finished(),
        "acknowledged before any fsync (held)"
    );

    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, false);
    let (t1, t2) = (t1.await.unwrap(), t2.await.unwrap());
    println!("fault: t1 (waited for the failed fsync): {t1:?}");
    println!("fault: t2 (waited for the same fsync): {t2:?}");
    let e1 = t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    let e2 = t2.expect_err("t2 acknowledged although the fsync it waited for failed");
    for error in [e1, e2] {
        assert!(
            names_the_disk(&error.to_string()),
            "the error names the disk or the fsync: {error}"
        );
    }

    // Every later write to the file is refused: its frames would follow the ones the failed
    // fsync left off the disk, and a power loss would take it with them.
    for name in ["t3", "t4"] {
        let later = transaction(&writes, name).await;
        println!("fault: {name} (begun after the failure): {later:?}");
        assert_refused(name, later);
    }
    println!("fault: stats: {:?}", writes.stats());
    assert_not_in_file(&pool, &["t3", "t4"]).await;
}

/// The failed fsync with two pools on the file (a store holding a `WritePool` per pool): the
/// refusal is the file's, so the pool whose fsync never failed refuses too, as does the first
/// pool again.
async fn failed_fsync_two_pools(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let other = WritePool::new(self::pool(dir).await);
    transaction(&other, "other-first")
        .await
        .expect("the second pool writes before the failure");
    println!("fault: acked other-first");
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    assert!(!t1.is_finished(), "acknowledged before any fsync (held)");

    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, false);
    let t1 = t1.await.unwrap();
    println!("fault: t1 (waited for the failed fsync): {t1:?}");
    let error = t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    assert!(
        names_the_disk(&error.to_string()),
        "t1's error names the disk or the fsync: {error}"
    );

    for name in ["t3-other", "t4-other"] {
        let later = transaction(&other, name).await;
        println!("fault: {name} (the other pool, begun after the failure): {later:?}");
        assert_refused(name, later);
    }
    let later = transaction(&writes, "t5").await;
    println!("fault: t5 (the first pool again): {later:?}");
    assert_refused("t5", later);
    println!("fault: stats: {:?} {:?}", writes.stats(), other.stats());
    assert_not_in_file(&pool, &["t3-other", "t4-other", "t5"]).await;
}

// ---------------------------------------------------------------------------------------------
// The tests (the parent: the child, then the power loss)
// ---------------------------------------------------------------------------------------------

/// Runs `scenario` in the fault child, then the power loss: every write the child printed as
/// acknowledged (`fault: acked <name>`) must be in the file a fresh process recovers
/// (`harness::fault_test`).
fn fault_test(test: &str, scenario: &str) {
    harness::fault_test(test, &FAULT, scenario, |path| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(names_in(path))
    });
}

/// The `name` of every row of `items`, as a fresh process with sqlx 0.8 finds the file (SQLite
/// recovers it).
async fn names_in(path: &Path) -> BTreeSet<String> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options(path))
        .await
        .unwrap();
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    names.into_iter().collect()
}

/// A shared fsync that fails: the two commits that waited for it are not `Ok` and name the
/// disk, the next two writes are refused and nothing of them is in the file; the write
/// acknowledged before survives the power loss.
#[test]
fn after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit() {
    fault_test(
        "after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit",
        "failed-fsync",
    );
}

/// The same with a second pool on the file: after the first pool's fsync failed, the second
/// pool's writes are refused too (and the first pool's); both pools' writes acknowledged before
/// survive the power loss.
#[test]
fn after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write() {
    fault_test(
        "after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write",
        "failed-fsync-two-pools",
    );
}
