//! Checkpoints off the turn (`src/write/sqlx/checkpoint.rs`): while group commit shares the fsync
//! (WAL at `FULL`, the defaults, writers queued), a `WritePool`'s writer connection leaves the
//! WAL's checkpoints to a connection of its own, in the background, so that no `COMMIT`
//! holding the turn copies the WAL into the database; its own automatic checkpoint stays as a
//! backstop. A writer alone, a connection the application configured otherwise, a pool
//! without group commit, and a WAL at `NORMAL` keep SQLite's own schedule.
//!
//! Real SQLite files in WAL mode; what the tests read is SQLite's own answer
//! (`PRAGMA wal_autocheckpoint` on the writer connection, through the transaction) and the
//! checkpointer's DEBUG event, on a current-thread runtime so that the spawned checkpoint
//! reports to the test's subscriber.

mod common;

use std::time::Duration;

use common::{TestDb, capture_events, poll_until};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::WritePool;

const EVENT: &str = "checkpoint of the WAL, off the writers' transactions";

async fn write_pool(options: SqliteConnectOptions) -> WritePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("pool");
    sqlx::query("CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT)")
        .execute(&pool)
        .await
        .expect("schema");
    WritePool::new(pool)
}

/// The writer connection's `wal_autocheckpoint`, read in a write transaction (which runs on
/// it).
async fn writer_autocheckpoint(writes: &WritePool) -> i64 {
    let mut tx = writes.begin().await.unwrap();
    let pages: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    pages
}

/// The writer connection's `wal_autocheckpoint` while its fsync is shared: read in a
/// transaction begun while the fsync is held (every transaction then shares it), rolled back.
async fn shared_autocheckpoint(writes: &WritePool) -> i64 {
    assert!(
        tower_sqlite_retry::__private::hold_fsync(writes, true),
        "the pool shares its fsync"
    );
    let mut tx = writes.begin().await.unwrap();
    let pages: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    tower_sqlite_retry::__private::hold_fsync(writes, false);
    pages
}

/// `tasks` writers at once, `each` commits each: they share the fsync.
async fn concurrent_commits(writes: &WritePool, tasks: usize, each: usize) {
    let writers: Vec<_> = (0..tasks)
        .map(|t| {
            let writes = writes.clone();
            tokio::spawn(async move {
                for i in 0..each {
                    let mut tx = writes.begin().await.unwrap();
                    sqlx::query("INSERT INTO items (name) VALUES (?)")
                        .bind(format!("{t}-{i}"))
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
}

#[tokio::test]
async fn while_the_fsync_is_shared_checkpoints_run_in_the_background() {
    let db = TestDb::new();
    let writes = write_pool(
        db.options(Duration::from_secs(5))
            .synchronous(SqliteSynchronous::Full),
    )
    .await;
    // A writer alone syncs in its own `COMMIT`: checkpoints as SQLite schedules them (its
    // default threshold, 1,000 pages).
    assert_eq!(writer_autocheckpoint(&writes).await, 1_000);
    // While the fsync is shared, the writer connection's own is only the backstop.
    assert_eq!(shared_autocheckpoint(&writes).await, 10_000);

    let (events, _guard) = capture_events();
    // The first checkpoint assumes 16 pages a commit, so it comes after 63 commits and
    // measures; the next after about a threshold's worth (1,000 one-page commits).
    concurrent_commits(&writes, 8, 150).await;
    poll_until("two checkpoints ran in the background", async || {
        events.with_message(EVENT).len() >= 2
    })
    .await;
    let checkpoints = events.with_message(EVENT);
    let first = &checkpoints[0];
    let field = |c: &common::EventFields, name: &str| -> u64 { c[name].parse().unwrap() };
    assert!(field(first, "db.write.commits") >= 63, "{first:?}");
    assert!(field(first, "db.write.wal_frames") >= 63, "{first:?}");
    assert!(
        field(first, "db.write.checkpointed") > 0,
        "it copied the WAL into the database: {first:?}"
    );
    let second = &checkpoints[1];
    assert!(
        field(second, "db.write.commits") >= 500,
        "measured, not back to back: {second:?}"
    );

    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(writes.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1_200);
    // Alone again: SQLite's schedule again.
    assert_eq!(writer_autocheckpoint(&writes).await, 1_000);
    writes.close().await;
}

/// Under steady load, with no reader open, the WAL restarts once per threshold: the
/// checkpointer catches up in the turn (a passive checkpoint alone never does while writers
/// append), and its file stays near `wal_autocheckpoint` (1,000 pages here) instead of
/// growing to the writer connection's backstop (10,000 pages). 8,000 commits of a page or
/// more each: without restarts the WAL would hold 8,000 frames or more.
#[tokio::test]
async fn under_steady_load_the_wal_restarts_near_its_threshold() {
    let db = TestDb::new();
    let writes = write_pool(
        db.options(Duration::from_secs(5))
            .synchronous(SqliteSynchronous::Full),
    )
    .await;
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(writes.pool())
        .await
        .unwrap();
    let frame = u64::try_from(page_size).unwrap() + 24;
    let (events, _guard) = capture_events();
    concurrent_commits(&writes, 8, 1_000).await;
    let path = writes.path().expect("a file").to_owned();
    let mut wal = path.into_os_string();
    wal.push("-wal");
    let size = std::fs::metadata(&wal).unwrap().len();
    let frames = size.saturating_sub(32) / frame;
    // Without restarts the file would hold all 8,000 frames or more. How near the threshold it
    // stays depends on how soon the checkpointer gets the turn behind the 8 writers, which is
    // the machine's scheduling: BENCHMARKS.md measures it; here, that it restarts at all.
    eprintln!("the WAL's file holds {frames} frames ({size} bytes) after 8,000 commits");
    assert!(
        frames < 8_000,
        "the WAL's file holds {frames} frames ({size} bytes): it did not restart"
    );
    let checkpoints = events.with_message(EVENT);
    assert!(
        checkpoints
            .iter()
            .any(|c| c["db.write.in_turn"] == "true" && c["db.write.restarted"] == "true"),
        "a checkpoint caught up in the turn and restarted the WAL: {checkpoints:?}"
    );
    // Not back to back: about one per threshold's worth of commits (8,000 commits of a page
    // or more: at most 8 or so).
    assert!(
        checkpoints.len() <= 16,
        "{} checkpoints for 8,000 commits",
        checkpoints.len()
    );
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(writes.pool())
        .await
        .unwrap();
    assert_eq!(rows, 8_000);
    writes.close().await;
}

#[tokio::test]
async fn a_connection_configured_to_checkpoint_itself_is_left_alone() {
    let db = TestDb::new();
    let writes = write_pool(
        db.options(Duration::from_secs(5))
            .synchronous(SqliteSynchronous::Full)
            .pragma("wal_autocheckpoint", "0"),
    )
    .await;
    assert_eq!(writer_autocheckpoint(&writes).await, 0);
    assert_eq!(shared_autocheckpoint(&writes).await, 0);
    // (The backstop not raised while the fsync is shared, 0 and not 10,000, is what says no
    // checkpointer took over: with one, `shared_autocheckpoint` reads 10,000.)
    let database = std::fs::metadata(&db.path).unwrap().len();
    concurrent_commits(&writes, 8, 150).await;
    // Nothing was copied into the database: its file is as the schema left it, every commit
    // still in the WAL (SQLite checkpoints nothing at 0, and nobody else did).
    assert_eq!(std::fs::metadata(&db.path).unwrap().len(), database);
    writes.close().await;
}

#[tokio::test]
async fn without_group_commit_the_writer_connection_checkpoints_as_sqlite_does() {
    let db = TestDb::new();
    let writes = write_pool(
        db.options(Duration::from_secs(5))
            .synchronous(SqliteSynchronous::Full),
    )
    .await
    .group_commit(false);
    // Nothing is shared, so nothing is taken over: after concurrent writers, the pool still
    // has no fsync to share (with group commit on, `hold_fsync` would hold it: the checks
    // above read 10,000 pages through it), and the writer connection keeps SQLite's 1,000.
    concurrent_commits(&writes, 8, 150).await;
    assert!(
        !tower_sqlite_retry::__private::hold_fsync(&writes, true),
        "no shared fsync without group commit"
    );
    assert_eq!(writer_autocheckpoint(&writes).await, 1_000);
    writes.close().await;
}

#[tokio::test]
async fn at_normal_the_writer_connection_checkpoints_as_sqlite_does() {
    // Nothing to share at `NORMAL`, so nothing is taken over: measured, a background
    // checkpointer gained nothing there (an experiment in the git history of BENCHMARKS.md,
    // commit `80535b3`).
    for group_commit in [true, false] {
        let db = TestDb::new();
        let mut writes = write_pool(
            db.options(Duration::from_secs(5))
                .synchronous(SqliteSynchronous::Normal),
        )
        .await;
        if !group_commit {
            writes = writes.group_commit(false);
        }
        assert_eq!(writer_autocheckpoint(&writes).await, 1_000);
        assert!(
            !tower_sqlite_retry::__private::hold_fsync(&writes, true),
            "nothing to share at NORMAL"
        );
        concurrent_commits(&writes, 4, 10).await;
        assert_eq!(writer_autocheckpoint(&writes).await, 1_000);
        writes.close().await;
    }
}

/// `close()` answers every commit that went through before it closes anything (the shared
/// fsync a commit waits for runs, instead of finding the WAL gone once the last connection
/// closed and removed it), and it closes the checkpointer's connection too: afterwards no
/// connection of the pool is open on the file, and SQLite removed the WAL.
#[tokio::test]
async fn close_answers_waiting_commits_and_leaves_no_connection_open() {
    let db = TestDb::new();
    let writes = write_pool(
        db.options(Duration::from_secs(5))
            .synchronous(SqliteSynchronous::Full),
    )
    .await;
    let (events, _guard) = capture_events();
    // Checkpoints ran in the background: the checkpointer has a connection of its own.
    concurrent_commits(&writes, 8, 150).await;
    poll_until("a checkpoint ran in the background", async || {
        !events.with_message(EVENT).is_empty()
    })
    .await;
    // A commit waits for the shared fsync (held), and the pool is closed meanwhile.
    assert!(tower_sqlite_retry::__private::hold_fsync(&writes, true));
    let committing = tokio::spawn({
        let writes = writes.clone();
        async move {
            let mut tx = writes.begin().await.unwrap();
            sqlx::query("INSERT INTO items (name) VALUES ('last')")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await
        }
    });
    poll_until("the last commit waits for its fsync", async || {
        writes
            .stats()
            .is_some_and(|s| !s.held && s.transactions > 1_200)
    })
    .await;
    let closing = tokio::spawn({
        let writes = writes.clone();
        async move { writes.close().await }
    });
    // Close must not return while the commit waits: watched for a while (it never may, so
    // this cannot fail a correct close; a close that does not wait returns within it here).
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(
            !closing.is_finished(),
            "close returned while a commit waited for its fsync"
        );
    }
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    committing
        .await
        .unwrap()
        .expect("the commit went through and its fsync ran: Ok, not a WAL gone");
    closing.await.unwrap();
    let mut wal = db.path.clone().into_os_string();
    wal.push("-wal");
    assert!(
        !std::path::Path::new(&wal).exists(),
        "the last connection closed checkpointed and removed the WAL: none is left open"
    );
}
