//! Durability under SIGKILL: a child process serves writes over real HTTP (`synchronous =
//! FULL`, WAL), clients write as fast as it answers, and the process is killed with SIGKILL at
//! a random moment, again and again, on the same file. After each kill the file is opened
//! afresh (SQLite recovers it) and checked against what the clients were told: every write
//! acknowledged with `201` is there, and none is there twice. For the write path
//! (`WritePool` under the layer), with and without group commit, and for `BEGIN IMMEDIATE` on
//! a pool (no layer).
//!
//! The child is this test binary itself, run with `TSR_CRASH_SERVE` set: the test
//! `crash_child` then serves until it is killed (without the variable it returns at once).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::post;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

const SERVE: &str = "TSR_CRASH_SERVE";

fn options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
}

#[derive(Clone)]
enum Writes {
    Path(WritePool),
    Immediate(SqlitePool),
    /// The control: acknowledged first, written later (a write-behind that had not flushed
    /// when the process died). Every acknowledged write is lost: the check must see it.
    AcknowledgedFirst(SqlitePool),
}

/// One write transaction: read, then insert the client's id (a replay before the commit would
/// insert it again if the layer got it wrong).
async fn write(
    State(writes): State<Writes>,
    UrlPath(id): UrlPath<i64>,
) -> Result<StatusCode, DbError> {
    match writes {
        Writes::Path(db) => {
            let mut tx = db.begin().await?;
            let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO items (client_id) VALUES (?)")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Writes::Immediate(pool) => {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO items (client_id) VALUES (?)")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Writes::AcknowledgedFirst(pool) => {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                let _ = sqlx::query("INSERT INTO items (client_id) VALUES (?)")
                    .bind(id)
                    .execute(&pool)
                    .await;
            });
        }
    }
    Ok(StatusCode::CREATED)
}

/// The child: serves `config` on `path` until killed. Not a test on its own: run by
/// [`ChildServer::start`]; a no-op without its variable.
#[test]
#[ignore = "a child process's entry point, run by the crash tests"]
fn crash_child() {
    let Ok(spec) = std::env::var(SERVE) else {
        return;
    };
    let (config, path) = spec.split_once(':').expect("CONFIG:PATH");
    let path = PathBuf::from(path);
    let config = config.to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options(&path))
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, client_id INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let router = Router::new().route("/items/{id}", post(write));
        let router = match config.as_str() {
            "write-path" => router
                .layer(SqliteRetryLayer::new(RetryPolicy::default()))
                .with_state(Writes::Path(WritePool::new(pool).group_commit(false))),
            "write-path-group" => router
                .layer(SqliteRetryLayer::new(RetryPolicy::default()))
                .with_state(Writes::Path(WritePool::new(pool).group_commit(true))),
            "immediate" => router.with_state(Writes::Immediate(pool)),
            "acknowledged-first" => router.with_state(Writes::AcknowledgedFirst(pool)),
            other => panic!("unknown config {other}"),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("listening {}", listener.local_addr().unwrap());
        axum::serve(listener, router).await.unwrap();
    });
}

struct ChildServer {
    child: Child,
    addr: SocketAddr,
}

impl ChildServer {
    // The child is killed and waited for by `kill` (and on the failure path below).
    #[allow(clippy::zombie_processes)]
    fn start(config: &str, path: &Path) -> Self {
        let mut child = common::child_test("write_crash::crash_child")
            .env(SERVE, format!("{config}:{}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child server");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut ran = common::ChildRan::default();
        loop {
            line.clear();
            if out.read_line(&mut line).map_or(true, |n| n == 0) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child server exited before it listened");
            }
            ran.line(&line);
            // The harness writes `test crash_child ... ` before it, on the same line.
            if let Some((_, addr)) = line.trim().split_once("listening ") {
                ran.assert_started("write_crash::crash_child");
                let addr = addr.parse().unwrap();
                return Self { child, addr };
            }
        }
    }

    fn kill(mut self) {
        // SIGKILL on Unix: no destructor, no graceful shutdown, nothing flushed.
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// Kills the child `rounds` times under load; returns (acknowledged, rows) in all. Panics on
/// an acknowledged write missing from the file, or a write there twice.
async fn crash_rounds(config: &str, rounds: u32) -> (usize, usize) {
    let (acked, rows, missing) = crash_rounds_counting(config, rounds).await;
    assert_eq!(missing, 0, "{config}: acknowledged, not in the file");
    (acked, rows)
}

/// [`crash_rounds`], returning the acknowledged writes missing from the file instead of
/// panicking on them: (acknowledged, rows, missing), in all.
async fn crash_rounds_counting(config: &str, rounds: u32) -> (usize, usize, usize) {
    let mut missing_in_all = 0;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let mut next_id = 0i64;
    let mut rng = fastrand::Rng::with_seed(u64::from(rounds) * 7919);
    for round in 0..rounds {
        let server = ChildServer::start(config, &path);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut clients = Vec::new();
        for _ in 0..8 {
            let client: Client<HttpConnector, Body> =
                Client::builder(TokioExecutor::new()).build_http();
            let addr = server.addr;
            let (stop, acknowledged) = (stop.clone(), acknowledged.clone());
            let base = next_id;
            next_id += 1_000_000;
            clients.push(tokio::spawn(async move {
                let mut id = base;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    id += 1;
                    let request = http::Request::post(format!("http://{addr}/items/{id}"))
                        .body(Body::empty())
                        .unwrap();
                    // A request cut by the kill has no answer: it may or may not be there.
                    let reply =
                        tokio::time::timeout(Duration::from_secs(5), client.request(request));
                    match reply.await {
                        Ok(Ok(reply)) if reply.status() == StatusCode::CREATED => {
                            acknowledged.lock().unwrap().insert(id);
                        }
                        Ok(Ok(reply)) => panic!("answered {} to write {id}", reply.status()),
                        Ok(Err(_)) | Err(_) => break,
                    }
                }
            }));
        }
        // Kill it at a random moment under load.
        tokio::time::sleep(Duration::from_millis(rng.u64(50..400))).await;
        server.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for client in clients {
            client.await.unwrap();
        }
        let rows = rows(&path).await;
        let acked = acknowledged.lock().unwrap().clone();
        let missing: Vec<_> = acked.iter().filter(|id| !rows.contains_key(id)).collect();
        let doubled: Vec<_> = rows.iter().filter(|(_, n)| **n > 1).collect();
        if !missing.is_empty() {
            eprintln!(
                "{config}, kill {round}: {} acknowledged, not in the file (first: {:?})",
                missing.len(),
                missing.iter().take(10).collect::<Vec<_>>()
            );
        }
        missing_in_all += missing.len();
        assert!(
            doubled.is_empty(),
            "{config}, kill {round}: in the file twice: {doubled:?}"
        );
    }
    let acked = acknowledged.lock().unwrap().len();
    (acked, rows(&path).await.len(), missing_in_all)
}

/// The file as a fresh process finds it after the kill: client id → rows.
async fn rows(path: &Path) -> BTreeMap<i64, i64> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options(path))
        .await
        .unwrap();
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT client_id, COUNT(*) FROM items GROUP BY client_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill_on_the_write_path() {
    let (acked, rows) = crash_rounds("write-path", 8).await;
    eprintln!("write path: {acked} writes acknowledged, {rows} in the file after 8 kills");
    assert!(acked > 0, "the server acknowledged writes between kills");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill_with_group_commit() {
    let (acked, rows) = crash_rounds("write-path-group", 8).await;
    eprintln!("group commit: {acked} writes acknowledged, {rows} in the file after 8 kills");
    assert!(acked > 0, "the server acknowledged writes between kills");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill_with_begin_immediate() {
    let (acked, rows) = crash_rounds("immediate", 8).await;
    eprintln!("BEGIN IMMEDIATE: {acked} writes acknowledged, {rows} in the file after 8 kills");
    assert!(acked > 0, "the server acknowledged writes between kills");
}

/// The control: a server that acknowledges before it writes loses every acknowledged write to
/// the kill, and the check says so (were it blind, this would find nothing missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_write_acknowledged_before_its_commit_is_lost() {
    let (acked, _, missing) = crash_rounds_counting("acknowledged-first", 1).await;
    eprintln!("acknowledged first: {acked} acknowledged, {missing} of them lost to the kill");
    assert!(acked > 0, "the server acknowledged writes before the kill");
    assert_eq!(
        missing, acked,
        "every acknowledged write was lost, and seen lost"
    );
}
