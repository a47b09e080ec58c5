//! Several processes writing one SQLite file through the write path: each is this test binary
//! run again as a child (`processes_child`, its job in `TSR_PROCESSES_JOB`), on a real file.
//!
//! - read-then-write increments from three processes at once (`WritePool`s and a
//!   `WriteThread`): the counter ends exact, every acknowledged increment is there once, and the
//!   file passes `integrity_check`;
//! - a process SIGKILLed while it holds the file's turn (a transaction open, on either write
//!   path) blocks no other: the kernel lets go of its locks, the waiting process writes, and
//!   nothing it acknowledged is lost;
//! - while another process holds the file's turn, requests with a deadline are answered at
//!   their deadline, on both write paths;
//! - a writer waiting for another process is counted waiting, and its wait is told in
//!   `stats()` once it ends, on both write paths.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use common::{ChildRan, HttpClient, serve};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::write::WriteThread;
use tower_sqlite_retry::{DbError, SqliteRetryLayer, WritePool};

const JOB: &str = "TSR_PROCESSES_JOB";
const CHILD: &str = "processes::processes_child";

fn options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
}

async fn write_pool(path: &Path) -> WritePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(options(path))
        .await
        .unwrap();
    WritePool::new(pool)
}

/// The schema: one counter, and a row per acknowledged increment.
fn create(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE counter (n INTEGER NOT NULL);
         INSERT INTO counter VALUES (0);
         CREATE TABLE log (id INTEGER PRIMARY KEY, process INTEGER NOT NULL, name TEXT);",
    )
    .unwrap();
}

fn counted(path: &Path) -> (i64, i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let n = conn
        .query_row("SELECT n FROM counter", [], |r| r.get(0))
        .unwrap();
    let logged = conn
        .query_row("SELECT count(*) FROM log", [], |r| r.get(0))
        .unwrap();
    (n, logged)
}

/// One increment on the sqlx write path: read the counter, then write it (read-then-write in
/// one transaction), and log it.
async fn increment_pool(writes: &WritePool) -> Result<(), sqlx::Error> {
    let mut tx = writes.begin().await?;
    let n: i64 = sqlx::query_scalar("SELECT n FROM counter")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("UPDATE counter SET n = ?")
        .bind(n + 1)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO log (process) VALUES (?)")
        .bind(i64::from(std::process::id()))
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// The same on the writer thread.
async fn increment_thread(writes: &WriteThread) -> Result<(), rusqlite::Error> {
    writes
        .transaction(|tx| {
            let n: i64 = tx.query_row("SELECT n FROM counter", [], |r| r.get(0))?;
            tx.execute("UPDATE counter SET n = ?1", [n + 1])?;
            tx.execute(
                "INSERT INTO log (process) VALUES (?1)",
                [i64::from(std::process::id())],
            )?;
            Ok(())
        })
        .await
}

/// A child's entry point (not a test on its own): `<kind>:<db>:<writers>:<increments>`.
/// `pool` and `thread` increment (`writers` tasks, `increments` each) and say how many were
/// acknowledged; `hold-pool` and `hold-thread` open a write transaction, say so, and hold it
/// until killed.
#[test]
#[ignore = "a child process's entry point, run by the tests of several processes"]
fn processes_child() {
    let Ok(job) = std::env::var(JOB) else {
        return;
    };
    let [kind, db, writers, increments]: [&str; 4] = job
        .splitn(4, ':')
        .collect::<Vec<_>>()
        .try_into()
        .expect("kind:db:writers:increments");
    let path = PathBuf::from(db);
    let (writers, increments): (usize, usize) =
        (writers.parse().unwrap(), increments.parse().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match kind {
            "pool" | "thread" => {
                let pool = (kind == "pool").then_some(write_pool(&path).await);
                let thread = (kind == "thread").then(|| WriteThread::open(&path).unwrap());
                println!("started");
                let tasks: Vec<_> = (0..writers)
                    .map(|_| {
                        let (pool, thread) = (pool.clone(), thread.clone());
                        tokio::spawn(async move {
                            for _ in 0..increments {
                                match (&pool, &thread) {
                                    (Some(pool), _) => increment_pool(pool).await.unwrap(),
                                    (_, Some(thread)) => increment_thread(thread).await.unwrap(),
                                    _ => unreachable!(),
                                }
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                println!("acked {}", writers * increments);
            }
            "hold-pool" => {
                let writes = write_pool(&path).await;
                let mut tx = writes.begin().await.unwrap();
                sqlx::query("INSERT INTO log (process, name) VALUES (0, 'held')")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                println!("holding");
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            "hold-thread" => {
                let writes = WriteThread::open(&path).unwrap();
                writes
                    .transaction(|tx| {
                        tx.execute("INSERT INTO log (process, name) VALUES (0, 'held')", [])?;
                        println!("holding");
                        std::thread::sleep(Duration::from_secs(3600));
                        Ok::<_, rusqlite::Error>(())
                    })
                    .await
                    .unwrap();
            }
            other => panic!("unknown job {other}"),
        }
    });
}

/// A child process and what it says, line by line.
struct Process {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// What its harness said so far (of every line read).
    ran: ChildRan,
}

impl Process {
    fn start(kind: &str, db: &Path, writers: usize, increments: usize) -> Self {
        let mut command = common::child_test(CHILD);
        command
            .env(
                JOB,
                format!("{kind}:{}:{writers}:{increments}", db.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().expect("spawn a child");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            ran: ChildRan::default(),
        }
    }

    /// Waits for a line ending with `what` (the harness writes `test ... ` before the first).
    fn said(&mut self, what: &str) {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the child did not say {what:?} within 60 s"));
            self.ran.line(&line);
            if line.trim_end().ends_with(what) {
                return;
            }
        }
    }

    /// Waits for the child to end (within `HANG`): how many increments it acknowledged.
    fn acked(&mut self) -> usize {
        let deadline = std::time::Instant::now() + HANG;
        let mut acked = None;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    self.ran.line(&line);
                    if let Some((_, n)) = line.split_once("acked ") {
                        acked = Some(n.trim().parse().unwrap());
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if std::time::Instant::now() > deadline {
                        let _ = self.child.kill();
                        panic!("a child did not finish within {HANG:?}");
                    }
                }
            }
        }
        assert!(self.child.wait().unwrap().success(), "a child failed");
        self.ran.assert_passed(CHILD);
        acked.expect("the child said how many it acknowledged")
    }

    /// SIGKILL: nothing runs after it in the child.
    fn kill(self) {
        // (`Drop`.)
    }
}

impl Drop for Process {
    /// Killed and waited for, whatever way the test ends: a child left running (a failed test's
    /// holder) would keep the test binary's output open.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const HANG: Duration = Duration::from_secs(120);

/// Three processes (two `WritePool`s and a `WriteThread`) of 8 writers each increment one
/// counter 25 times per writer, read-then-write, at once: the counter ends exact, every
/// acknowledged increment is logged once, and the file is intact.
#[test]
fn writers_of_several_processes_count_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    create(&db);
    let children: Vec<_> = ["pool", "thread", "pool"]
        .iter()
        .map(|kind| Process::start(kind, &db, 8, 25))
        .collect();
    let acked: usize = children.into_iter().map(|mut c| c.acked()).sum();
    assert_eq!(acked, 3 * 8 * 25);
    let (n, logged) = counted(&db);
    assert_eq!(n, acked as i64, "the counter lost or doubled an increment");
    assert_eq!(logged, acked as i64);
}

/// A process SIGKILLed while it holds the file's turn, its transaction open (on the sqlx write
/// path, then on the writer thread), blocks no other: a process that started writing behind it
/// writes once it is gone, and ends with every increment it acknowledged; the killed one's
/// uncommitted row is not there.
#[test]
fn a_process_killed_holding_the_turn_blocks_no_other() {
    for holder in ["hold-pool", "hold-thread"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("shared.db");
        create(&db);
        let mut held = Process::start(holder, &db, 0, 0);
        held.said("holding");
        let mut writer = Process::start("pool", &db, 4, 10);
        writer.said("started");
        held.kill();
        let acked = writer.acked();
        let (n, logged) = counted(&db);
        assert_eq!((n, logged), (acked as i64, acked as i64), "{holder}");
    }
}

#[derive(Clone)]
struct Apps {
    pool: WritePool,
    thread: WriteThread,
}

async fn via_pool(State(apps): State<Apps>) -> Result<(), DbError> {
    Ok(increment_pool(&apps.pool).await?)
}

async fn via_thread(State(apps): State<Apps>) -> Result<(), DbError> {
    Ok(increment_thread(&apps.thread).await?)
}

/// While another process holds the file's turn (a write transaction open), requests with a
/// 300 ms deadline are answered `503` while it still holds it, on the sqlx write path and on
/// the writer thread; once it is gone, both write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_ends_by_the_deadline_while_another_process_holds_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    create(&db);
    let apps = Apps {
        pool: write_pool(&db).await,
        thread: WriteThread::open(&db).unwrap(),
    };
    let router = Router::new()
        .route("/pool", post(via_pool))
        .route("/thread", post(via_thread))
        .layer(SqliteRetryLayer::new(
            common::fast_policy(3).deadline(Duration::from_millis(300)),
        ))
        .with_state(apps);
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    let mut held = Process::start("hold-pool", &db, 0, 0);
    held.said("holding");
    for path in ["/pool", "/thread"] {
        let reply = tokio::time::timeout(HANG, client.post(path, ""))
            .await
            .expect("answered while the other process holds the turn");
        assert_eq!(reply.status.as_u16(), 503, "{path}: {}", reply.text());
    }
    held.kill();
    for path in ["/pool", "/thread"] {
        let reply = client.post(path, "").await;
        assert_eq!(reply.status.as_u16(), 200, "{path}: {}", reply.text());
    }
    assert_eq!(counted(&db), (2, 2));
}

/// The file's write stats once one writer waits (polled for that state, no timing assumed; at
/// most 60 s), or the last reading.
async fn one_waiting(writes: &WriteThread) -> tower_sqlite_retry::write::WriteStats {
    let mut stats = writes.stats();
    for _ in 0..6000 {
        if stats.waiting == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        stats = writes.stats();
    }
    stats
}

/// While another process holds the file's turn, a writer of this process that waits for it is
/// counted waiting (`stats().waiting`, the gauge, the read limit), on the sqlx write path
/// (which holds this process's turn meanwhile) and on the writer thread; once the other process
/// is gone it writes, and the wait is counted in `process_waits` with its time. A writer
/// dropped while it waits (its request cancelled) is counted so too, and wedges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_another_process_is_counted_and_told() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    create(&db);
    let pool = write_pool(&db).await;
    let thread = WriteThread::open(&db).unwrap();
    // (One queue for the file in this process: the pool's and the thread's stats are one.)
    increment_pool(&pool).await.unwrap();
    increment_thread(&thread).await.unwrap();
    let before = thread.stats();
    assert_eq!((before.process_waits, before.waiting), (0, 0), "{before:?}");
    for (round, via) in ["pool", "thread"].into_iter().enumerate() {
        let mut held = Process::start("hold-pool", &db, 0, 0);
        held.said("holding");
        let started = std::time::Instant::now();
        let writer = {
            let (pool, thread) = (pool.clone(), thread.clone());
            tokio::spawn(async move {
                match via {
                    "pool" => increment_pool(&pool).await.map_err(DbError::from),
                    _ => increment_thread(&thread).await.map_err(DbError::from),
                }
            })
        };
        let waiting = one_waiting(&thread).await;
        assert_eq!(
            waiting.waiting, 1,
            "{via}: the wait is counted: {waiting:?}"
        );
        assert!(!waiting.held, "{via}: {waiting:?}");
        assert_eq!(waiting.process_waits, round as u64, "{via}: not ended yet");
        held.kill();
        writer.await.unwrap().unwrap();
        let after = thread.stats();
        assert_eq!(after.waiting, 0, "{via}: {after:?}");
        assert_eq!(after.process_waits, round as u64 + 1, "{via}: {after:?}");
        assert!(
            after.process_waited > waiting.process_waited
                && after.process_waited - waiting.process_waited <= started.elapsed(),
            "{via}: {after:?}"
        );
    }
    // A writer dropped while it waits for the other process (its request cancelled): no longer
    // counted waiting, its wait counted once, and this process's turn is not wedged.
    let mut held = Process::start("hold-pool", &db, 0, 0);
    held.said("holding");
    let before = thread.stats();
    let writer = {
        let pool = pool.clone();
        tokio::spawn(async move { increment_pool(&pool).await })
    };
    let waiting = one_waiting(&thread).await;
    assert_eq!(waiting.waiting, 1, "cancelled: {waiting:?}");
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    let after = thread.stats();
    assert_eq!(after.waiting, 0, "cancelled: {after:?}");
    assert_eq!(after.process_waits, before.process_waits + 1, "{after:?}");
    held.kill();
    increment_pool(&pool).await.unwrap();
    increment_thread(&thread).await.unwrap();
    assert_eq!(counted(&db), (6, 6));
}
