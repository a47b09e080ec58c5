//! Durability under a power loss, on a simulated disk with a volatile write cache.
//!
//! `tests/write/write_crash.rs` kills the process: what it wrote is the kernel's and survives. A power
//! loss also drops what the kernel had not written back: only what an fsync made durable is
//! left. The child processes here run under an `LD_PRELOAD` shim (`tests/power_loss/shim.c`,
//! built with `cc` at run time; without one the tests print `SKIPPED:` and pass) that keeps,
//! for every file of the database's directory, a "durable shadow" updated only by
//! `fsync`/`fdatasync`. After the SIGKILL, the test copies each shadow over its file (a file
//! without one is deleted, as is `-shm`) and opens the database afresh: SQLite recovers what a
//! machine that lost power would have found. The shim, the simulated disk, the children and
//! the fault commands are the power-loss harness (`tests/power_loss/harness.rs`), shared with
//! the sqlx 0.8 and Diesel packages' power-loss tests; the workloads and what must survive
//! are here.
//!
//! - `every_acknowledged_write_survives_power_loss_with_group_commit`: the write path with
//!   group commit, at `FULL`, under 64 HTTP clients, killed at a random moment (seeded; the
//!   seed is printed, `TSR_POWER_LOSS_SEED` replays it), several rounds on one file: every
//!   write answered `201` before the kill is in the recovered file.
//! - `control_normal_loses_acknowledged_writes`: the same flow at `NORMAL` (no fsync of the
//!   WAL before a checkpoint), deterministic: acknowledged writes are lost. It proves the
//!   simulator drops what was never synced.
//! - Fault injection (the shim's `.ctl/` commands, Linux's errseq semantics for writeback
//!   errors): a `commit()` waiting for a shared fsync is never `Ok` when the WAL's writeback
//!   failed, even when another descriptor heard the error first, nor when its own fsync failed.
//! - `a_wal_no_longer_at_its_path_is_not_synced` (no shim): a WAL whose directory was renamed
//!   is not the file recovery reads; a commit waiting for its fsync is not `Ok`.
//!
//! The children are this test binary itself, run with `TSR_POWER_LOSS_CHILD` set: the tests
//! `power_loss_child` and `fault_child` then do the child's part (without it they return).
#![cfg(target_os = "linux")]

#[path = "../power_loss/harness.rs"]
mod harness;

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::commit_in_background;
use harness::{DB, Disk, FaultChild, assert_refused, names_the_disk, shim, shim_command};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

/// What the child does: `serve:<config>:<dir>` or `fault:<scenario>:<dir>`.
const CHILD: &str = "TSR_POWER_LOSS_CHILD";
/// The children's entry points, by their full names in this test binary.
const SERVE_CHILD: &str = "power_loss::power_loss_child";
const FAULT_CHILD: &str = "power_loss::fault_child";
/// The fault child, for the harness.
const FAULT: FaultChild = FaultChild {
    var: CHILD,
    entry: FAULT_CHILD,
    timeout: Duration::from_secs(120),
};
/// Kill rounds of the group commit test (each a fresh child on the same file).
const ROUNDS: u32 = 6;
/// Concurrent HTTP clients in the group commit test.
const CLIENTS: i64 = 64;
/// Requests per client and round, at most (each loop is bounded in count as well as time).
const MAX_REQUESTS: i64 = 1_000_000;
/// Writes of the control, one after the other (well under the 1,000-page autocheckpoint).
const CONTROL_WRITES: i64 = 20;
/// `EIO` on Linux.
const EIO: i32 = 5;

// ---------------------------------------------------------------------------------------------
// The database (the shim and the simulated disk are the harness')
// ---------------------------------------------------------------------------------------------

fn options(path: &Path, synchronous: SqliteSynchronous) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(5))
}

/// Creates the database and its table from this process, then makes it durable.
async fn create(disk: &Disk) {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options(&disk.db(), SqliteSynchronous::Full))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, client_id INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    disk.settle();
}

/// The database at `path` as a fresh process finds it (SQLite recovers it): client id → rows.
async fn rows(path: &Path) -> BTreeMap<i64, i64> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options(path, SqliteSynchronous::Full))
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

/// What a process crash alone (no power loss) would leave: the files as they are, recovered
/// from a copy.
async fn rows_after_a_crash(disk: &Disk) -> BTreeMap<i64, i64> {
    let copy = disk.crash_copy();
    rows(&copy.path().join(DB)).await
}

// ---------------------------------------------------------------------------------------------
// The serving child
// ---------------------------------------------------------------------------------------------

/// One write transaction: read, then insert the client's id.
async fn write(
    State(db): State<WritePool>,
    UrlPath(id): UrlPath<i64>,
) -> Result<StatusCode, DbError> {
    let mut tx = db.begin().await?;
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO items (client_id) VALUES (?)")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

/// [`write`] on the rusqlite writer thread.
async fn thread_write(
    State(db): State<tower_sqlite_retry::write::WriteThread>,
    UrlPath(id): UrlPath<i64>,
) -> Result<StatusCode, DbError> {
    db.transaction(move |tx| {
        let _: i64 = tx.query_row("SELECT COUNT(*) FROM items", [], |row| row.get(0))?;
        tx.execute("INSERT INTO items (client_id) VALUES (?1)", [id])?;
        Ok::<_, rusqlite::Error>(())
    })
    .await?;
    Ok(StatusCode::CREATED)
}

/// The serving child: `serve:<config>:<dir>`, until killed. Not a test on its own: run by the
/// power-loss tests (`harness::child_command`); a no-op without its variable.
#[test]
#[ignore = "a child process's entry point, run by the power-loss tests"]
fn power_loss_child() {
    let Some([config, dir]) = harness::child_job(CHILD, "serve") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        if config == "thread-full" {
            // The rusqlite writer thread, group commit on (its default), at FULL.
            let writes = tower_sqlite_retry::write::WriteThread::open(dir.join(DB)).unwrap();
            let router = Router::new()
                .route("/items/{id}", post(thread_write))
                .layer(SqliteRetryLayer::new(RetryPolicy::default()))
                .with_state(writes);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            println!("listening {}", listener.local_addr().unwrap());
            axum::serve(listener, router).await.unwrap();
            return;
        }
        let (synchronous, group) = match config.as_str() {
            // Group commit on (the default): the writer connection at NORMAL while the fsync is
            // shared, the shared fsync being the crate's own.
            "group-full" => (SqliteSynchronous::Full, true),
            // Every COMMIT on its own, at NORMAL: nothing syncs the WAL before a checkpoint.
            "alone-normal" => (SqliteSynchronous::Normal, false),
            other => panic!("unknown config {other}"),
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options(&dir.join(DB), synchronous))
            .await
            .unwrap();
        let writes = WritePool::new(pool);
        let writes = if group {
            writes
        } else {
            writes.group_commit(false)
        };
        let router = Router::new()
            .route("/items/{id}", post(write))
            .layer(SqliteRetryLayer::new(RetryPolicy::default()))
            .with_state(writes);
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
    // The child is killed and waited for by `wait` (and on the failure paths below).
    #[allow(clippy::zombie_processes)]
    fn start(config: &str, disk: &Disk, shim: &Path, fsync_delay_us: u64) -> Self {
        let job = format!("serve:{config}:{}", disk.dir.display());
        let mut command =
            harness::child_command(CHILD, SERVE_CHILD, &job, disk, shim, fsync_delay_us);
        command.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().expect("spawn the child server");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the address, then drains the child's stdout until it dies.
        std::thread::spawn(move || {
            let mut ran = harness::ChildRan::default();
            for line in out.lines() {
                let Ok(line) = line else { break };
                ran.line(&line);
                // The harness writes `test power_loss_child ... ` before it, on the same line.
                if let Some((_, addr)) = line.trim().split_once("listening ") {
                    ran.assert_started(SERVE_CHILD, &line);
                    let _ = tx.send(addr.parse::<SocketAddr>().unwrap());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => Self { child, addr },
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child server did not listen within 60 s (or exited)");
            }
        }
    }

    /// SIGKILL: no destructor, no graceful shutdown, nothing flushed.
    fn kill(&mut self) {
        self.child.kill().unwrap();
    }

    fn wait(mut self) {
        self.child.wait().unwrap();
    }
}

/// What the clients of one round saw.
#[derive(Default)]
struct Book {
    sent: BTreeSet<i64>,
    acked: BTreeSet<i64>,
    refused: Vec<(i64, StatusCode)>,
}

/// `clients` HTTP clients writing unique ids (from `base`) as fast as answered, until `stop`.
fn spawn_clients(
    addr: SocketAddr,
    clients: i64,
    base: i64,
    book: &Arc<Mutex<Book>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|c| {
            let (book, stop) = (book.clone(), stop.clone());
            let client: Client<HttpConnector, Body> =
                Client::builder(TokioExecutor::new()).build_http();
            tokio::spawn(async move {
                for n in 0..MAX_REQUESTS {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = base + c * MAX_REQUESTS + n;
                    book.lock().unwrap().sent.insert(id);
                    let request = http::Request::post(format!("http://{addr}/items/{id}"))
                        .body(Body::empty())
                        .unwrap();
                    // A request cut by the kill has no answer: it may or may not be there.
                    let reply =
                        tokio::time::timeout(Duration::from_secs(5), client.request(request));
                    match reply.await {
                        Ok(Ok(reply)) => {
                            let mut book = book.lock().unwrap();
                            // Every 201 counts, those read after the kill included: the
                            // server wrote them before it died (nothing runs after SIGKILL),
                            // so each was acknowledged before the power loss; they are the
                            // writes acknowledged closest to it, the ones most at risk.
                            if reply.status() == StatusCode::CREATED {
                                book.acked.insert(id);
                            } else {
                                book.refused.push((id, reply.status()));
                            }
                        }
                        Ok(Err(_)) | Err(_) => break,
                    }
                }
            })
        })
        .collect()
}

/// Group commit at `FULL`, 64 clients, SIGKILL and power loss at a random moment, several
/// rounds on one file: every write acknowledged before the kill is in the recovered file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_power_loss_with_group_commit() {
    survives_power_loss(
        "every_acknowledged_write_survives_power_loss_with_group_commit",
        "group-full",
    )
    .await;
}

/// The same on the rusqlite writer thread (`WriteThread`, group commit on, `FULL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_power_loss_on_the_writer_thread() {
    survives_power_loss(
        "every_acknowledged_write_survives_power_loss_on_the_writer_thread",
        "thread-full",
    )
    .await;
}

/// Two processes writing one file at once (the turn between processes hands it from one to
/// the other), the sqlx write path in one and the writer thread in the other, each at `FULL`
/// with group commit, 32 clients each; both killed at the same random moment, then the power
/// loss (the shim's sync makes every process's writes of the file durable, as the kernel's
/// page cache does): every write either acknowledged is in the recovered file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_of_two_processes_survives_power_loss() {
    survives_power_loss_of(
        "every_acknowledged_write_of_two_processes_survives_power_loss",
        &["group-full", "thread-full"],
        Disk::shared_by_processes(),
    )
    .await;
}

/// The kill rounds of the tests above, for the child's `config`.
async fn survives_power_loss(test: &str, config: &str) {
    survives_power_loss_of(test, &[config], Disk::new()).await;
}

/// The kill rounds, for one child per config, all on `disk`, the clients split between them.
async fn survives_power_loss_of(test: &str, configs: &[&str], disk: Disk) {
    let Some(shim) = shim(test) else { return };
    let seed = harness::seed();
    eprintln!("{test}: seed {seed} (TSR_POWER_LOSS_SEED={seed} replays the kill times)");
    let mut rng = harness::Rng(seed);
    create(&disk).await;

    let mut rounds = harness::Rounds::default();
    let per_server = CLIENTS / configs.len() as i64;
    for round in 0..ROUNDS {
        // A slower disk every other round: bigger groups.
        let fsync_delay_us = if round % 2 == 0 { 0 } else { 1000 };
        let mut servers: Vec<_> = configs
            .iter()
            .map(|config| ChildServer::start(config, &disk, shim, fsync_delay_us))
            .collect();
        let book = Arc::new(Mutex::new(Book::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let base = i64::from(round + 1) * 1_000 * MAX_REQUESTS;
        let clients: Vec<_> = servers
            .iter()
            .enumerate()
            .flat_map(|(i, server)| {
                let base = base + i as i64 * per_server * MAX_REQUESTS;
                spawn_clients(server.addr, per_server, base, &book, &stop)
            })
            .collect();

        let delay = Duration::from_millis(rng.between((200, 1500)));
        tokio::time::sleep(delay).await;
        // The power goes for every process at once.
        for server in &mut servers {
            server.kill();
        }
        stop.store(true, Ordering::Relaxed);
        for server in servers {
            server.wait();
        }
        let joined =
            tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(clients));
        for client in joined
            .await
            .expect("the clients stop within 60 s of the kill")
        {
            client.unwrap();
        }

        let crashed = rows_after_a_crash(&disk).await;
        let shadowed = disk.power_loss();
        let recovered = rows(&disk.db()).await;
        disk.settle();

        let book = book.lock().unwrap();
        assert!(
            book.refused.is_empty(),
            "round {round}: refused writes: {:?}",
            book.refused
        );
        let found = rounds.check(round, &book.acked, &recovered, &crashed, base, &shadowed);
        let unacked = book.sent.difference(&book.acked);
        let (mut inflight_kept, mut inflight_lost) = (0, 0);
        for id in unacked {
            if recovered.contains_key(id) {
                inflight_kept += 1;
            } else {
                inflight_lost += 1;
            }
        }
        let lost = &found.lost;
        eprintln!(
            "round {round} ({configs:?}, fsync delay {fsync_delay_us} us, kill after {} ms): {} acknowledged, \
             {} of them lost; {} rows of the round after the power loss ({} after a mere crash: \
             {} committed rows lost to the power loss); unacknowledged writes: {inflight_kept} \
             kept, {inflight_lost} lost; shadows: {shadowed:?}",
            delay.as_millis(),
            book.acked.len(),
            lost.len(),
            found.rows,
            found.crash_rows,
            found.crash_rows - found.rows.min(found.crash_rows),
        );
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged with 201 before the kill, lost in the power loss: {} \
             (first: {:?})",
            lost.len(),
            lost.iter().take(10).collect::<Vec<_>>()
        );
    }
    rounds.finish(test, ROUNDS);
}

/// The controls' writes: `CONTROL_WRITES` of them, one after the other, each to the next of
/// `servers` in turn, every one answered `201`: the ids acknowledged.
async fn acknowledge_one_by_one(servers: &[ChildServer]) -> BTreeSet<i64> {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let mut acked = BTreeSet::new();
    for id in 1..=CONTROL_WRITES {
        let server = &servers[id as usize % servers.len()];
        let request = http::Request::post(format!("http://{}/items/{id}", server.addr))
            .body(Body::empty())
            .unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(30), client.request(request))
            .await
            .expect("answered within 30 s")
            .expect("answered");
        assert_eq!(reply.status(), StatusCode::CREATED, "write {id}");
        acked.insert(id);
    }
    acked
}

/// The control of the two-process test: the same shared disk, two processes at `NORMAL` with
/// group commit off, writes acknowledged one after the other by each in turn, then SIGKILL and
/// power loss: acknowledged writes are lost (the shared journals make no write durable that no
/// sync reached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_two_processes_at_normal_lose_acknowledged_writes() {
    let test = "control_two_processes_at_normal_lose_acknowledged_writes";
    let Some(shim) = shim(test) else { return };
    let disk = Disk::shared_by_processes();
    create(&disk).await;
    let mut servers = [
        ChildServer::start("alone-normal", &disk, shim, 0),
        ChildServer::start("alone-normal", &disk, shim, 0),
    ];
    let acked = acknowledge_one_by_one(&servers).await;
    for server in &mut servers {
        server.kill();
    }
    for server in servers {
        server.wait();
    }
    let crashed = rows_after_a_crash(&disk).await;
    disk.power_loss();
    let recovered = rows(&disk.db()).await;
    let lost = acked
        .iter()
        .filter(|id| !recovered.contains_key(id))
        .count();
    eprintln!(
        "{test}: {} acknowledged by two processes at NORMAL; {lost} lost to the power loss",
        acked.len()
    );
    assert!(
        acked.iter().all(|id| crashed.contains_key(id)),
        "a process crash loses nothing"
    );
    assert!(
        lost > 0,
        "the simulated power loss lost no acknowledged write of two processes at NORMAL: the \
         shared shim makes durable what no sync reached"
    );
}

/// The control: at `NORMAL` with group commit off, nothing syncs the WAL before a checkpoint;
/// writes acknowledged one after the other, then SIGKILL and power loss: they are lost (all of
/// them, expectedly). Fails if the shim stopped dropping what was never synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_normal_loses_acknowledged_writes() {
    let test = "control_normal_loses_acknowledged_writes";
    let Some(shim) = shim(test) else { return };
    let disk = Disk::new();
    create(&disk).await;
    let mut server = ChildServer::start("alone-normal", &disk, shim, 0);
    let acked = acknowledge_one_by_one(std::slice::from_ref(&server)).await;
    server.kill();
    server.wait();

    let crashed = rows_after_a_crash(&disk).await;
    let shadowed = disk.power_loss();
    let recovered = rows(&disk.db()).await;
    let lost: Vec<_> = acked
        .iter()
        .filter(|id| !recovered.contains_key(id))
        .collect();
    eprintln!(
        "{test}: {} acknowledged at NORMAL; after a mere crash {} are in the file; after the \
         power loss {} are lost; shadows: {shadowed:?}",
        acked.len(),
        acked.iter().filter(|id| crashed.contains_key(id)).count(),
        lost.len()
    );
    assert!(
        acked.iter().all(|id| crashed.contains_key(id)),
        "a process crash loses nothing: every acknowledged write is in the files"
    );
    assert!(
        !lost.is_empty(),
        "the simulated power loss lost no acknowledged write at synchronous = NORMAL: the shim \
         does not drop unsynced writes"
    );
    // ... and lost them because the shim dropped what was not synced, not because it tracked
    // nothing: the WAL the child made has a durable image (what of it was synced: its
    // creation), which a shim not loaded never keeps (the power loss would then take the WAL
    // whole, synced or not).
    assert!(
        shadowed.contains(&format!("{DB}-wal")),
        "the shim kept no durable image of the WAL: is it loaded? {shadowed:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Fault injection: the child runs a scenario under the shim and fails (non-zero) if it fails
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
            "heard-elsewhere" => heard_elsewhere(&dir).await,
            "heard-elsewhere-reopened" => heard_elsewhere_reopened(&dir).await,
            "failed-fsync" => failed_fsync(&dir).await,
            "failed-fsync-two-pools" => failed_fsync_two_pools(&dir).await,
            "thread-failed-fsync" => thread_failed_fsync(&dir).await,
            other => panic!("unknown scenario {other}"),
        }
    });
}

/// A pool at `FULL` on `dir/db.sqlite`, its write path (group commit on) after a first write,
/// with the shared fsync held.
async fn held_write_pool(dir: &Path) -> (SqlitePool, WritePool) {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options(&dir.join(DB), SqliteSynchronous::Full))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let writes = WritePool::new(pool.clone());
    transaction(&writes, "first")
        .await
        .expect("the first write transaction");
    println!("fault: acked first");
    assert!(
        tower_sqlite_retry::__private::hold_fsync(&writes, true),
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

/// Scenario a: a writeback error of the WAL that another descriptor hears first. Linux reports
/// it to that descriptor, and once more to each descriptor open when it happened; a descriptor
/// opened after it was heard never sees it. `t1`, committed before the error and waiting for
/// the shared fsync, must not be acknowledged.
async fn heard_elsewhere(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    assert!(!t1.is_finished(), "t1 acknowledged before any fsync (held)");

    shim_command(dir, &format!("writeback-error:{DB}-wal"));
    let wal = dir.join(format!("{DB}-wal"));
    let other = OpenOptions::new().write(true).open(&wal).unwrap();
    let heard = other
        .sync_data()
        .expect_err("the other descriptor hears the writeback error");
    assert_eq!(heard.raw_os_error(), Some(EIO), "{heard}");
    println!("fault: another descriptor heard the WAL's writeback error first: {heard}");

    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    let t1 = t1.await.unwrap();
    println!("fault: t1 (committed before the error, waited for the shared fsync): {t1:?}");
    let error = t1.expect_err(
        "t1 acknowledged as durable although the WAL's writeback failed after its COMMIT",
    );
    assert!(
        names_the_disk(&error.to_string()),
        "t1's error names the disk or the fsync: {error}"
    );

    let t2 = transaction(&writes, "t2").await;
    println!("fault: t2 (begun after the error): {t2:?}");
    let t3 = transaction(&writes, "t3").await;
    println!("fault: t3 (after t2): {t3:?}");
    println!("fault: stats: {:?}", writes.stats());
}

/// Scenario a, with the writer connection closed and opened again between the error and the
/// fsync (a transaction whose raw `COMMIT` the gate refused closes it). The WAL's descriptor
/// is the file's for as long as the WAL is at its path: one opened with the new connection,
/// after another descriptor heard the error, would never hear it, and `t1` would be
/// acknowledged.
async fn heard_elsewhere_reopened(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    assert!(!t1.is_finished(), "t1 acknowledged before any fsync (held)");

    shim_command(dir, &format!("writeback-error:{DB}-wal"));
    let wal = dir.join(format!("{DB}-wal"));
    let other = OpenOptions::new().write(true).open(&wal).unwrap();
    let heard = other
        .sync_data()
        .expect_err("the other descriptor hears the writeback error");
    assert_eq!(heard.raw_os_error(), Some(EIO), "{heard}");

    // A raw `COMMIT`, refused: the transaction's `commit()` fails and its writer connection is
    // closed (its state is not what sqlx counts).
    let mut raw = writes.begin().await.expect("begin");
    sqlx::query("INSERT INTO items (name) VALUES ('raw')")
        .execute(&mut *raw)
        .await
        .unwrap();
    sqlx::query("COMMIT")
        .execute(&mut *raw)
        .await
        .expect_err("a raw COMMIT is refused");
    raw.commit()
        .await
        .expect_err("a transaction ended outside the write path");
    // The next transaction opens a writer connection, and with it (were it not kept) a WAL
    // descriptor of its own.
    let t2 = commit_in_background(&writes, &pool, "t2").await;
    println!(
        "fault: writer connections opened: {}",
        tower_sqlite_retry::__private::writer_connections_opened(&writes)
    );
    assert!(
        tower_sqlite_retry::__private::writer_connections_opened(&writes) >= 2,
        "the writer connection was opened again"
    );

    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    let (t1, t2) = (t1.await.unwrap(), t2.await.unwrap());
    println!("fault: t1 (committed before the error): {t1:?}");
    println!("fault: t2 (committed after the reopen): {t2:?}");
    for (name, outcome) in [("t1", t1), ("t2", t2)] {
        let error = outcome.expect_err(&format!(
            "{name} acknowledged as durable although the WAL's writeback failed before its \
             fsync (heard by another descriptor, before the writer connection reopened)"
        ));
        assert!(
            names_the_disk(&error.to_string()),
            "{name}'s error names the disk or the fsync: {error}"
        );
    }
}

/// Scenario b: the shared fsync itself fails. Both transactions that committed while it was
/// held waited for it: neither is acknowledged.
async fn failed_fsync(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    let t2 = commit_in_background(&writes, &pool, "t2").await;
    assert!(
        !t1.is_finished() && !t2.is_finished(),
        "acknowledged before any fsync (held)"
    );

    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
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

/// Scenario b with two pools on the file (as the docs' `Store::new` pattern makes): the
/// refusal is the file's, so the pool whose fsync never failed refuses too, for transactions
/// begun after the failure and for one that began before it and commits after.
async fn failed_fsync_two_pools(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let other_pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options(&dir.join(DB), SqliteSynchronous::Full))
        .await
        .unwrap();
    let other = WritePool::new(other_pool.clone());
    transaction(&other, "other-first")
        .await
        .expect("the second pool writes before the failure");
    println!("fault: acked other-first");
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    assert!(!t1.is_finished(), "acknowledged before any fsync (held)");
    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    let t1 = t1.await.unwrap();
    println!("fault: t1 (waited for the failed fsync): {t1:?}");
    t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    for name in ["t3-other", "t4-other"] {
        let later = transaction(&other, name).await;
        println!("fault: {name} (the other pool, begun after the failure): {later:?}");
        assert_refused(name, later);
    }
    let later = transaction(&writes, "t5").await;
    println!("fault: t5 (the first pool again): {later:?}");
    assert_refused("t5", later);
    assert_not_in_file(&pool, &["t3-other", "t4-other", "t5"]).await;
}

/// One write through the rusqlite writer thread, inserting `name`: `Ok`, or why not.
async fn thread_transaction(
    writes: &tower_sqlite_retry::write::WriteThread,
    name: &str,
) -> Result<(), rusqlite::Error> {
    let name = name.to_owned();
    writes
        .transaction(move |tx| {
            tx.execute("INSERT INTO items (name) VALUES (?1)", [&name])?;
            Ok(())
        })
        .await
}

/// Scenario b on the rusqlite writer thread (`WriteThread`): a closure that committed while
/// the shared fsync was held, which then fails, is not `Ok` (`SQLITE_IOERR_FSYNC`); every
/// later write to the file is refused, the writer thread's and an sqlx `WritePool`'s on the
/// same file alike (the refusal is the file's).
async fn thread_failed_fsync(dir: &Path) {
    use tower_sqlite_retry::write::WriteThread;
    let writes = WriteThread::open(dir.join(DB)).expect("the writer thread");
    writes
        .transaction(|tx| {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
            )
        })
        .await
        .expect("the schema");
    thread_transaction(&writes, "first")
        .await
        .expect("the first write");
    println!("fault: acked first");
    assert!(
        tower_sqlite_retry::__private::hold_thread_fsync(&writes, true),
        "the writer thread shares the WAL's fsync (WAL, FULL, group commit on)"
    );
    let before = writes.stats().transactions;
    let t1 = {
        let writes = writes.clone();
        tokio::spawn(async move { thread_transaction(&writes, "t1").await })
    };
    common::poll_until("t1 committed, its turn given back", async || {
        writes.stats().transactions > before
    })
    .await;
    assert!(!t1.is_finished(), "t1 acknowledged before any fsync (held)");
    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry::__private::hold_thread_fsync(&writes, false);
    let t1 = t1.await.unwrap();
    println!("fault: t1 (waited for the failed fsync): {t1:?}");
    let error = t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    match &error {
        rusqlite::Error::SqliteFailure(code, _) => {
            assert_eq!(
                code.extended_code,
                rusqlite::ffi::SQLITE_IOERR_FSYNC,
                "{error}"
            )
        }
        other => panic!("t1: SQLITE_IOERR_FSYNC, not {other:?}"),
    }
    assert!(names_the_disk(&error.to_string()), "{error}");
    for name in ["t3", "t4"] {
        let later = thread_transaction(&writes, name)
            .await
            .map_err(|e| e.to_string());
        println!("fault: {name} (begun after the failure): {later:?}");
        assert_refused(name, later);
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options(&dir.join(DB), SqliteSynchronous::Full))
        .await
        .unwrap();
    let sqlx_writes = WritePool::new(pool.clone());
    let later = transaction(&sqlx_writes, "t5-sqlx").await;
    println!("fault: t5-sqlx (an sqlx WritePool on the file): {later:?}");
    assert_refused("t5-sqlx", later);
    assert_not_in_file(&pool, &["t3", "t4", "t5-sqlx"]).await;
}

/// Runs `scenario` in the fault child, then the power loss: every write the child was told was
/// acknowledged survives it (`harness::fault_test`).
fn fault_test(test: &str, scenario: &str) {
    harness::fault_test(test, &FAULT, scenario, |path| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(names_in(path))
    });
}

/// The `name` of every row of the fault scenarios' `items` table.
async fn names_in(path: &Path) -> BTreeSet<String> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options(path, SqliteSynchronous::Full))
        .await
        .unwrap();
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    names.into_iter().collect()
}

/// Scenario a (see `heard_elsewhere`).
#[test]
fn a_writeback_error_heard_first_by_another_descriptor_is_not_acknowledged() {
    fault_test(
        "a_writeback_error_heard_first_by_another_descriptor_is_not_acknowledged",
        "heard-elsewhere",
    );
}

/// Scenario a, the writer connection reopened (see `heard_elsewhere_reopened`).
#[test]
fn a_writeback_error_heard_elsewhere_is_heard_after_the_writer_connection_reopens() {
    fault_test(
        "a_writeback_error_heard_elsewhere_is_heard_after_the_writer_connection_reopens",
        "heard-elsewhere-reopened",
    );
}

/// Scenario b on the rusqlite writer thread (see `thread_failed_fsync`).
#[test]
fn after_a_failed_fsync_the_writer_thread_acknowledges_nothing() {
    fault_test(
        "after_a_failed_fsync_the_writer_thread_acknowledges_nothing",
        "thread-failed-fsync",
    );
}

/// Scenario b (see `failed_fsync`).
#[test]
fn after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit() {
    fault_test(
        "after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit",
        "failed-fsync",
    );
}

/// Scenario b, with two pools on the file (see `failed_fsync_two_pools`).
#[test]
fn after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write() {
    fault_test(
        "after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write",
        "failed-fsync-two-pools",
    );
}

/// Scenario c, no shim: the database's directory renamed while a commit waits for the shared
/// fsync. The WAL at the path recovery reads is no longer the one written: syncing whatever
/// descriptor is at hand makes nothing durable there, so the commit is not `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_no_longer_at_its_path_is_not_synced() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    std::fs::create_dir(&dir).unwrap();
    let (pool, writes) = held_write_pool(&dir).await;
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    assert!(!t1.is_finished(), "t1 acknowledged before any fsync (held)");

    std::fs::rename(&dir, root.path().join("db-moved")).unwrap();
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    let t1 = t1.await.unwrap();
    eprintln!("a_wal_no_longer_at_its_path_is_not_synced: t1: {t1:?}");
    t1.expect_err("t1 acknowledged as durable although its WAL is no longer at its path");
}
