//! The write path from a loop: workers claim queue items through `WritePool` (their turn,
//! then `BEGIN IMMEDIATE`) inside `Operation::run`, outside any HTTP request. Within the
//! process no claim meets `SQLITE_BUSY`; a writer of another connection (standing for
//! another process) past `busy_timeout` is what the operation's retry covers.

use crate::common;

use std::time::Duration;

use common::TestDb;
use sqlx::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;
use tokio::sync::mpsc;
use tower_sqlite_retry::{Operation, WritePool};

async fn queue(db: &TestDb, busy_timeout: Duration) -> WritePool {
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(db.options(busy_timeout))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS queue (
            id INTEGER PRIMARY KEY,
            status TEXT NOT NULL DEFAULT 'pending',
            worker INTEGER
        )",
    )
    .execute(&pool)
    .await
    .unwrap();
    WritePool::new(pool)
}

/// Reads the oldest pending item, then marks it taken (duroxide's claim): the read-then-write
/// that a deferred transaction cannot do under concurrent writers.
async fn claim(db: &WritePool, worker: i64) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let id: Option<i64> =
        sqlx::query_scalar("SELECT id FROM queue WHERE status = 'pending' ORDER BY id LIMIT 1")
            .fetch_optional(&mut *tx)
            .await?;
    if let Some(id) = id {
        let taken = sqlx::query(
            "UPDATE queue SET status = 'taken', worker = ? WHERE id = ? AND status = 'pending'",
        )
        .bind(worker)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        assert_eq!(
            taken.rows_affected(),
            1,
            "the turn excludes every other claim"
        );
    }
    tx.commit().await?;
    Ok(id)
}

/// Eight workers and a producer on one file, every claim through the write path with a busy
/// timeout of 0: no claim fails, none is retried, each item is taken exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_claiming_through_the_write_path_never_fail() {
    const ITEMS: i64 = 400;
    let db = TestDb::new();
    let pool = queue(&db, Duration::ZERO).await;
    let op = Operation::new("claim", common::fast_policy(1_000));
    let producer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            for _ in 0..ITEMS {
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("INSERT INTO queue DEFAULT VALUES")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        })
    };
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (pool, op) = (pool.clone(), op.clone());
            tokio::spawn(async move {
                let mut taken = 0;
                loop {
                    let got = op.run(|_| claim(&pool, worker)).await.unwrap();
                    match got {
                        Some(_) => taken += 1,
                        None if taken_all(&pool, ITEMS).await => return taken,
                        None => tokio::task::yield_now().await,
                    }
                }
            })
        })
        .collect();
    producer.await.unwrap();
    let mut total = 0;
    for worker in workers {
        total += worker.await.unwrap();
    }
    assert_eq!(total, ITEMS);
    let (taken, distinct): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM queue WHERE status = 'taken'")
            .fetch_one(pool.pool())
            .await
            .unwrap();
    assert_eq!((taken, distinct), (ITEMS, ITEMS));
    let snap = op.metrics().snapshot();
    assert_eq!(snap.retries, 0, "{snap:?}");
    assert_eq!(snap.requests, snap.first_try);
}

async fn taken_all(pool: &WritePool, items: i64) -> bool {
    let taken: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM queue WHERE status = 'taken'")
        .fetch_one(pool.pool())
        .await
        .unwrap();
    taken == items
}

/// A writer the turn cannot see (another connection's `BEGIN IMMEDIATE`, as another process
/// would hold it) makes the claim's `BEGIN IMMEDIATE` fail `SQLITE_BUSY` past the busy
/// timeout (0 here): `Operation::run` retries it, and once the lock goes the item is taken
/// once.
#[tokio::test]
async fn the_operation_covers_a_writer_in_another_process() {
    let db = TestDb::new();
    let pool = queue(&db, Duration::ZERO).await;
    sqlx::query("INSERT INTO queue DEFAULT VALUES")
        .execute(pool.pool())
        .await
        .unwrap();
    let lock = db.hold_write_lock().await;
    let op = Operation::new("claim", common::fast_policy(1_000));
    let (failed_tx, mut failed) = mpsc::unbounded_channel();
    let call = op.run(|attempt| {
        let (pool, failed_tx) = (pool.clone(), failed_tx.clone());
        async move {
            let result = claim(&pool, 7).await;
            if let Err(e) = &result {
                let _ = failed_tx.send((attempt, e.to_string()));
            }
            result
        }
    });
    let (claimed, ()) = tokio::join!(call, async {
        for want in 1..=2 {
            let (attempt, error) = failed.recv().await.unwrap();
            assert_eq!(attempt, want);
            assert!(error.contains("database is locked"), "{error}");
        }
        lock.release().await;
    });
    assert_eq!(claimed.unwrap(), Some(1));
    let worker: Option<i64> = sqlx::query_scalar("SELECT worker FROM queue WHERE id = 1")
        .fetch_one(pool.pool())
        .await
        .unwrap();
    assert_eq!(worker, Some(7));
    let snap = op.metrics().snapshot();
    assert_eq!(snap.succeeded_after_retry, 1);
    assert!(snap.retries >= 2);
}
