//! 32 concurrent HTTP clients on loopback, each sending 15 POSTs whose handler runs a deferred
//! read-then-write transaction, mixed with GETs, against a pool of 8 connections with sqlx's
//! default busy timeout. With `RetryPolicy::default()`: zero failures and exactly-once
//! commits. Without the layer: failures (the control that proves the scenario is real).
//!
//! That contention is made certain, not hoped for: the runs start while another connection
//! holds the write lock, and once a POST has read (its transaction's snapshot taken) that
//! connection commits a write and lets go. The POST's write then meets `SQLITE_BUSY_SNAPSHOT`
//! whatever the busy timeout (the WAL snapshot upgrade), so without the layer at least one
//! POST fails, and with it at least one is replayed; the rest of the load adds what contention
//! the machine's scheduling makes.

use crate::common;

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::join_all;
use http::StatusCode;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer};

use common::{HttpClient, TestDb, serve};

const CLIENTS: usize = 32;
const POSTS_PER_CLIENT: usize = 15;

/// The pool, and how many POSTs have read (their snapshot taken, their write next).
type AppState = (SqlitePool, Arc<AtomicUsize>);

async fn create(
    State((pool, reads)): State<AppState>,
    Json(name): Json<String>,
) -> Result<Json<i64>, DbError> {
    let mut tx = pool.begin().await?;
    let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
        .fetch_one(&mut *tx)
        .await?;
    reads.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
        .bind(next)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Json(next))
}

async fn list(State((pool, _)): State<AppState>) -> Result<Json<Vec<i64>>, DbError> {
    let seqs = sqlx::query_scalar("SELECT seq FROM items ORDER BY seq DESC LIMIT 20")
        .fetch_all(&pool)
        .await?;
    Ok(Json(seqs))
}

struct Run {
    posts_ok: usize,
    posts_failed: usize,
    gets_failed: usize,
    rows: i64,
    distinct_names: i64,
    returned_seqs: HashSet<i64>,
    /// The layer's replays (0 without it).
    retries: u64,
}

async fn run(with_layer: bool) -> Run {
    run_with(
        with_layer.then(RetryPolicy::default),
        CLIENTS,
        POSTS_PER_CLIENT,
        3,
    )
    .await
}

/// `clients` concurrent clients, each sending `posts` POSTs and a GET after every
/// `get_every`-th one.
async fn run_with(
    policy: Option<RetryPolicy>,
    clients: usize,
    posts: usize,
    get_every: usize,
) -> Run {
    let db = TestDb::new();
    // sqlx's default busy timeout (5 s): not set here on purpose.
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", db.path.display()))
        .unwrap()
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, name TEXT NOT NULL UNIQUE)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE marker (x INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    let layer = policy.map(SqliteRetryLayer::new);
    let mut app = Router::new()
        .route("/items", post(create).get(list))
        .route("/health", get(|| async { "ok" }));
    if let Some(layer) = &layer {
        app = app.layer(layer.clone());
    }
    let server = serve(app.with_state((pool.clone(), reads.clone()))).await;
    // Held until a POST has read: that POST's write then meets BUSY_SNAPSHOT (module docs).
    let lock = db.hold_write_lock().await;
    let release = async {
        common::poll_until("a POST has read", async || reads.load(Ordering::SeqCst) > 0).await;
        lock.release_after("INSERT INTO marker VALUES (1)").await;
    };

    let clients = (0..clients).map(|c| {
        let client = HttpClient::new(server.addr);
        async move {
            let (mut ok, mut failed, mut get_failed, mut seqs) = (0, 0, 0, Vec::new());
            for i in 0..posts {
                let reply = client.post("/items", format!("\"c{c}-{i}\"")).await;
                if reply.status == StatusCode::OK {
                    ok += 1;
                    seqs.push(reply.text().parse::<i64>().unwrap());
                } else {
                    failed += 1;
                }
                if i % get_every == 0 && client.get("/items").await.status != StatusCode::OK {
                    get_failed += 1;
                }
            }
            (ok, failed, get_failed, seqs)
        }
    });
    let (results, ()) = tokio::join!(join_all(clients), release);
    let mut run = Run {
        posts_ok: 0,
        posts_failed: 0,
        gets_failed: 0,
        rows: 0,
        distinct_names: 0,
        returned_seqs: HashSet::new(),
        retries: layer.map_or(0, |layer| layer.metrics().snapshot().retries),
    };
    for (ok, failed, get_failed, seqs) in results {
        run.posts_ok += ok;
        run.posts_failed += failed;
        run.gets_failed += get_failed;
        run.returned_seqs.extend(seqs);
    }
    run.rows = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&pool)
        .await
        .unwrap();
    run.distinct_names = sqlx::query_scalar("SELECT COUNT(DISTINCT name) FROM items")
        .fetch_one(&pool)
        .await
        .unwrap();
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_clients_zero_failures_with_the_layer() {
    let run = run(true).await;
    eprintln!(
        "with the layer: {} ok, {} failed POSTs, {} failed GETs",
        run.posts_ok, run.posts_failed, run.gets_failed
    );
    assert!(run.retries > 0, "the contention the lock made was replayed");
    assert_eq!(run.posts_failed, 0, "failed POSTs with the layer");
    assert_eq!(run.gets_failed, 0, "failed GETs with the layer");
    assert_eq!(run.posts_ok, CLIENTS * POSTS_PER_CLIENT);
    assert_eq!(
        run.rows as usize, run.posts_ok,
        "committed rows == successes"
    );
    assert_eq!(run.distinct_names, run.rows, "no duplicates");
    assert_eq!(
        run.returned_seqs.len(),
        run.posts_ok,
        "no sequence handed out twice"
    );
}

/// Without the layer, at least the POST that read under the held lock fails (how many more
/// depends on how the machine schedules the clients); what never depends on it: a failed
/// request committed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_layer_failures_commit_nothing() {
    let run = run(false).await;
    eprintln!(
        "without the layer: {} ok, {} failed POSTs",
        run.posts_ok, run.posts_failed
    );
    assert!(
        run.posts_failed > 0,
        "the control: the scenario's contention is real"
    );
    assert_eq!(
        run.posts_ok + run.posts_failed,
        CLIENTS * POSTS_PER_CLIENT,
        "every POST answered"
    );
    assert_eq!(run.rows as usize, run.posts_ok, "failures commit nothing");
    assert_eq!(run.distinct_names, run.rows, "no duplicates");
}

/// Exactly once under load: 2,000 read-then-write requests at 128-way concurrency.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_under_128_way_load() {
    let (clients, posts) = (128, 2000 / 128 + 1);
    let run = run_with(Some(RetryPolicy::default()), clients, posts, 4).await;
    eprintln!(
        "128 clients: {} ok, {} failed POSTs, {} failed GETs, {} rows",
        run.posts_ok, run.posts_failed, run.gets_failed, run.rows
    );
    assert_eq!(run.posts_failed, 0, "no 5xx");
    assert_eq!(run.gets_failed, 0);
    assert_eq!(run.posts_ok, clients * posts);
    assert_eq!(
        run.rows as usize, run.posts_ok,
        "committed rows == 2xx responses"
    );
    assert_eq!(run.distinct_names, run.rows, "no duplicates");
    assert_eq!(run.returned_seqs.len(), run.posts_ok);
}
