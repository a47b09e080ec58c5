//! A storm over real HTTP on the write path, on a multi-threaded runtime: commits, commits
//! after a dropped savepoint, early returns, attempts that fail retryably before their commit
//! (replayed), clients that disconnect while their handler holds a write transaction open, and
//! another connection (as another process would) taking the write lock again and again.
//!
//! Checked afterwards: every `201` has its row, exactly once; no row without a `201` (an
//! early return, a dropped savepoint, a failed attempt and a disconnected client leave none);
//! no request answered anything but what its handler chose (no `5xx` the crate caused); and
//! the file is writable by another connection at once, and intact.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::{HttpClient, TestDb, serve};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::oneshot;
use tower_sqlite_retry::write::WriterConnection;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer, WritePool};

/// Where a disconnecting request's handler says that it holds its transaction open: its
/// client then goes away.
type Holding = Arc<Mutex<HashMap<i64, oneshot::Sender<()>>>>;

#[derive(Clone)]
struct App {
    db: WritePool,
    holding: Holding,
}

async fn insert(conn: &mut SqliteConnection, id: i64, kind: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
        .bind(id)
        .bind(kind)
        .execute(conn)
        .await
        .map(drop)
}

async fn handler(
    State(app): State<App>,
    attempt: Attempt,
    Path((kind, id)): Path<(String, i64)>,
) -> Result<StatusCode, DbError> {
    // Work before the transaction, as real handlers do.
    tokio::task::yield_now().await;
    let mut tx = app.db.begin().await?;
    match kind.as_str() {
        "commit" => insert(&mut tx, id, "commit").await?,
        "savepoint" => {
            {
                let mut savepoint = Connection::begin(&mut *tx).await?;
                insert(&mut savepoint, -id, "dropped savepoint").await?;
            }
            insert(&mut tx, id, "savepoint").await?;
        }
        "early" => {
            insert(&mut tx, id, "early").await?;
            return Ok(StatusCode::UNPROCESSABLE_ENTITY);
        }
        "replay" => {
            insert(&mut tx, id, "replay").await?;
            if attempt.number() == 1 {
                // A retryable failure before the commit: replayed.
                return Err(sqlx::Error::PoolTimedOut.into());
            }
        }
        "disconnect" => {
            insert(&mut tx, id, "disconnect").await?;
            if let Some(holding) = app.holding.lock().unwrap().remove(&id) {
                let _ = holding.send(());
            }
            // Never commits: it ends when the client goes away (or, should it never be told,
            // after a while, without a row).
            tokio::time::sleep(Duration::from_secs(20)).await;
            return Ok(StatusCode::REQUEST_TIMEOUT);
        }
        _ => return Ok(StatusCode::NOT_FOUND),
    }
    tx.commit().await?;
    tokio::task::yield_now().await; // work after it
    Ok(StatusCode::CREATED)
}

const KINDS: [&str; 5] = ["commit", "savepoint", "early", "replay", "disconnect"];

fn expected(kind: &str) -> StatusCode {
    match kind {
        "early" => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::CREATED,
    }
}

async fn storm(own_writer: bool) {
    storm_with(own_writer, false).await;
}

async fn storm_with(own_writer: bool, group: bool) {
    let db = TestDb::new();
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(db.options(Duration::from_millis(50)))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let holding = Holding::default();
    let app = App {
        db: WritePool::new(pool.clone())
            .writer(if own_writer {
                WriterConnection::Own
            } else {
                WriterConnection::FromPool
            })
            .group_commit(group),
        holding: holding.clone(),
    };
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(200)
            .base_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(20))
            .jitter(Jitter::Full)
            .deadline(Duration::from_secs(20)),
    );
    let metrics = layer.metrics();
    let router = Router::new()
        .route("/{kind}/{id}", post(handler))
        .layer(layer)
        .with_state(app);
    let server = serve(router).await;

    // Another connection takes the write lock again and again (for 1 to 20 ms, or 80, then
    // lets go for as long), as another process would.
    let stop = Arc::new(AtomicBool::new(false));
    let other = tokio::spawn({
        let (stop, options) = (stop.clone(), db.options(Duration::from_secs(5)));
        async move {
            let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
            let mut taken = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // Every tenth hold outlasts the pool's busy timeout (50 ms): a `BEGIN
                // IMMEDIATE` waiting for it fails `SQLITE_BUSY`, and its request is replayed.
                let hold = Duration::from_millis(if taken % 10 == 9 {
                    80
                } else {
                    u64::from(1 + taken % 20)
                });
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                tokio::time::sleep(hold).await;
                sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
                tokio::time::sleep(hold).await;
                taken += 1;
            }
            taken
        }
    });

    // Sixteen clients, sixty requests each, every kind in turn; a disconnecting request goes
    // on a connection of its own, dropped once its handler holds its transaction open.
    let mut clients = Vec::new();
    for c in 0..16i64 {
        let client = HttpClient::new(server.addr);
        let (addr, holding) = (server.addr, holding.clone());
        clients.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..60i64 {
                let id = c * 1000 + i + 1;
                let kind = KINDS[((c + i) % KINDS.len() as i64) as usize];
                if kind == "disconnect" {
                    let client = HttpClient::new(addr);
                    let (told, holding_now) = oneshot::channel();
                    holding.lock().unwrap().insert(id, told);
                    let path = format!("/{kind}/{id}");
                    tokio::select! {
                        reply = client.post(&path, "") => {
                            answers.push((kind, id, Some(reply.status)));
                        }
                        _ = holding_now => answers.push((kind, id, None)),
                    }
                    continue;
                }
                let reply = client.post(&format!("/{kind}/{id}"), "").await;
                answers.push((kind, id, Some(reply.status)));
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let taken = other.await.unwrap();

    let mut wrong = Vec::new();
    let mut acknowledged = BTreeSet::new();
    for &(kind, id, status) in &answers {
        match status {
            Some(status) if status != expected(kind) => wrong.push((kind, id, status)),
            Some(StatusCode::CREATED) => {
                acknowledged.insert(id);
            }
            _ => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} requests answered what their handler did not choose: {wrong:?}",
        wrong.len()
    );
    let rows: BTreeSet<i64> = sqlx::query_scalar("SELECT seq FROM items")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let missing: Vec<_> = acknowledged.difference(&rows).collect();
    let unacknowledged: Vec<_> = rows.difference(&acknowledged).collect();
    assert!(
        missing.is_empty(),
        "acknowledged with 201, not in the file: {missing:?}"
    );
    assert!(
        unacknowledged.is_empty(),
        "in the file without a 201: {unacknowledged:?}"
    );
    let disconnected = answers.iter().filter(|a| a.2.is_none()).count();
    assert_eq!(
        acknowledged.len(),
        960 - disconnected - 192,
        "every commit kind acknowledged"
    );
    assert_eq!(
        disconnected, 192,
        "every disconnecting client left while its handler held"
    );
    assert!(taken > 0, "the other connection took the lock");
    let m = metrics.snapshot();
    eprintln!(
        "own writer connection {own_writer}, group commit {}: {} requests, {} replays, {} \
         cancelled; the other connection took the lock {taken} times",
        group, m.requests, m.retries, m.cancelled
    );
    assert!(m.retries >= 192, "the replay kind was replayed");
    assert_eq!(
        m.cancelled, 192,
        "every disconnected request's handler was dropped"
    );

    // The file: writable by another connection at once, and intact.
    let mut other = SqliteConnection::connect_with(&db.options(Duration::ZERO))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("writable at once");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(check, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_on_the_writer_connection_loses_and_doubles_nothing() {
    storm(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_on_pooled_connections_loses_and_doubles_nothing() {
    storm(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_with_group_commit_loses_and_doubles_nothing() {
    storm_with(true, true).await;
}
