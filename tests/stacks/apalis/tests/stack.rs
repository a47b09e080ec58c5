//! apalis 1.x and its SQLite storage (apalis-sqlite 1.0, sqlx 0.9) under the crate's
//! [`Operation`]: what a job runner does with `database is locked`, with and without it.
//!
//! Every busy error here is made, not waited for: a connection of its own holds
//! `BEGIN IMMEDIATE` on a real SQLite file (WAL), and the pool that meets it has
//! `busy_timeout` 0, so its write fails at once with `SQLITE_BUSY` ("database is locked").
//! The lock is released only once the failure has been seen (a channel the failing code sends
//! to), never after a sleep.
//!
//! - **A job** (its handler's write transaction): without the crate, apalis records the job
//!   failed, and runs it again only through its own re-fetch (`max_attempts`, no backoff); with
//!   `Operation::layer()` on the worker the job is replayed in place and completes once. A
//!   worker stopped while a job waits in the layer's backoff never finishes; retried inside the
//!   handler (`Operation::run`), the job completes and the worker stops.
//! - **The storage's own poll loop** (registration, fetch, results, heartbeat): the busy error
//!   kills the backend and ends `run()`, dropping the jobs in flight; no layer reaches it, and
//!   no setting of the storage changes it. Two places can: a fetcher of one's own (apalis'
//!   custom backend over apalis-sqlite's public queries) driven by `Operation::backoff()`, and
//!   the `Monitor`'s restart decision, made by the same backoff.
//!
//! The job's table and apalis' queue are two files, so that the lock a test holds on one meets
//! only the code that test is about.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_core::backend::finalize::DurableError;
use apalis_sqlite::{Config, SqliteStorage};
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::mpsc;
use tower_sqlite_retry::classify::RetryDriverErrors;
use tower_sqlite_retry::{Backoff, Operation, RetryPolicy, classify_error_chain};

/// What no test may exceed while it waits for something (a failure, a worker to end).
const BOUND: Duration = Duration::from_secs(10);

/// The job: charge an amount once.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Charge {
    id: i64,
    amount: i64,
}

fn options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
}

/// A pool on `path` whose writes meet a held lock with `busy_timeout` (0: at once).
async fn pool(path: &Path, busy_timeout: Duration) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options(path).busy_timeout(busy_timeout))
        .await
        .unwrap()
}

/// The write lock of a database file, held by a connection of its own (`BEGIN IMMEDIATE`)
/// until [`release`](Self::release).
struct WriteLock(SqliteConnection);

impl WriteLock {
    async fn take(path: &Path) -> Self {
        let mut conn = options(path).connect().await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        Self(conn)
    }

    async fn release(mut self) {
        sqlx::query("ROLLBACK").execute(&mut self.0).await.unwrap();
        self.0.close().await.unwrap();
    }
}

/// apalis' queue on `pool`: its tables (`setup`), and a storage.
async fn queue(pool: &SqlitePool, config: Config) -> SqliteStorage<Charge> {
    SqliteStorage::setup(pool).await.unwrap();
    SqliteStorage::new(pool).with_config(config)
}

/// The job's row in apalis' queue: status, attempts, last result.
async fn job_row(pool: &SqlitePool) -> (String, i64, Option<String>) {
    sqlx::query_as("SELECT status, attempts, last_result FROM Jobs")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn recv(rx: &mut mpsc::UnboundedReceiver<String>, what: &str) -> String {
    tokio::time::timeout(BOUND, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} within {BOUND:?}"))
        .unwrap_or_else(|| panic!("no {what}: its sender is gone (the worker has ended)"))
}

// ---------------------------------------------------------------------------------------------
// A job whose write transaction meets `database is locked`
// ---------------------------------------------------------------------------------------------

/// What the job's handler is given (`Data`): the application's database and what the test
/// watches.
#[derive(Clone)]
struct App {
    /// `app.db`, `busy_timeout` 0.
    db: SqlitePool,
    /// The handler's runs, every try included.
    tries: Arc<AtomicU32>,
    /// Each failed try's error, as it happens.
    failed: mpsc::UnboundedSender<String>,
}

/// The job's side effect, in one transaction committed as its last step: a retry re-runs the
/// whole of it, and a failed try leaves nothing behind.
async fn charge(job: Charge, app: Data<App>) -> Result<(), BoxDynError> {
    Ok(try_charge(&app, &job).await?)
}

/// One try of the job's transaction, counted, its failure sent to the test.
async fn try_charge(app: &App, job: &Charge) -> Result<(), sqlx::Error> {
    app.tries.fetch_add(1, Ordering::SeqCst);
    let result = async {
        let mut tx = app.db.begin().await?;
        sqlx::query("INSERT INTO ledger (job, amount) VALUES (?, ?)")
            .bind(job.id)
            .bind(job.amount)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = &result {
        let _ = app.failed.send(e.to_string());
    }
    result
}

/// The setting of a job test: `app.db` with its ledger, apalis' queue with one job, which
/// apalis may run `max_attempts` times (1 but where apalis' own re-runs are the subject).
struct JobSetup {
    _dir: tempfile::TempDir,
    app_path: std::path::PathBuf,
    app: App,
    failed: mpsc::UnboundedReceiver<String>,
    queue_pool: SqlitePool,
    storage: SqliteStorage<Charge>,
    /// The worker's events, by name, in order.
    events: Arc<Mutex<Vec<String>>>,
}

async fn job_setup(max_attempts: usize, config: Config) -> JobSetup {
    let dir = tempfile::tempdir().unwrap();
    let app_path = dir.path().join("app.db");
    let db = pool(&app_path, Duration::ZERO).await;
    sqlx::query("CREATE TABLE ledger (job INTEGER NOT NULL, amount INTEGER NOT NULL)")
        .execute(&db)
        .await
        .unwrap();
    // apalis' own pool keeps sqlx's default busy_timeout (5 s): the queue is not contended.
    let queue_pool = pool(&dir.path().join("queue.db"), Duration::from_secs(5)).await;
    let mut storage = queue(&queue_pool, config).await;
    storage
        .push_task(
            TaskBuilder::new(Charge { id: 7, amount: 100 })
                .max_attempts(max_attempts)
                .build(),
        )
        .await
        .unwrap();
    let (tx, failed) = mpsc::unbounded_channel();
    JobSetup {
        _dir: dir,
        app_path,
        app: App {
            db,
            tries: Arc::default(),
            failed: tx,
        },
        failed,
        queue_pool,
        storage,
        events: Arc::default(),
    }
}

/// An event listener that writes the worker's events down and stops the worker after `stop_after`
/// job results (a success or an error).
fn listener(
    events: &Arc<Mutex<Vec<String>>>,
    stop_after: usize,
) -> impl Fn(&WorkerContext, &Event) + Send + Sync + 'static {
    let events = Arc::clone(events);
    move |worker, event| {
        let name = match event {
            Event::Success(_) => "Success".to_owned(),
            Event::Error(e) => format!("Error({e})"),
            other => format!("{other:?}"),
        };
        let results = {
            let mut events = events.lock().unwrap();
            events.push(name);
            events
                .iter()
                .filter(|e| *e == "Success" || e.starts_with("Error("))
                .count()
        };
        // (not under the lock: stopping emits an event, which comes back here)
        if matches!(event, Event::Success(_) | Event::Error(_)) && results == stop_after {
            worker.stop().unwrap();
        }
    }
}

async fn ledger(app: &App) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE job = 7")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Control: without the crate's layer, the first `database is locked` fails the job, and apalis
/// records it `Failed` (its `attempts` 1 of `max_attempts` 1, the error in `last_result`); the
/// lock released after that changes nothing: no row is written.
#[tokio::test]
async fn job_busy_without_layer_fails() {
    let mut s = job_setup(1, Config::default().queue("charges")).await;
    let lock = WriteLock::take(&s.app_path).await;
    let worker = WorkerBuilder::new("no-layer")
        .backend(s.storage)
        .data(s.app.clone())
        .on_event(listener(&s.events, 1))
        .build(charge);
    let run = tokio::spawn(worker.run());

    let first = recv(&mut s.failed, "failed try").await;
    assert!(first.contains("database is locked"), "{first}");
    lock.release().await;
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the worker stops after the job's result")
        .unwrap()
        .unwrap();

    assert_eq!(s.app.tries.load(Ordering::SeqCst), 1);
    assert_eq!(ledger(&s.app).await, 0, "a failed try commits nothing");
    let (status, attempts, last_result) = job_row(&s.queue_pool).await;
    assert_eq!((status.as_str(), attempts), ("Failed", 1));
    assert!(
        last_result
            .as_deref()
            .unwrap()
            .contains("database is locked"),
        "{last_result:?}"
    );
    let events = s.events.lock().unwrap().clone();
    assert!(
        events.iter().any(|e| e.contains("database is locked")),
        "{events:?}"
    );
}

/// Control, apalis' own mechanism: a job allowed more than one attempt is fetched again once
/// its failure is acknowledged (`fetch_next.sql`: `status = 'Failed' AND attempts <
/// max_attempts`, its `run_at` unchanged: no backoff), until its attempts are used up. With the
/// lock held throughout, all three attempts fail and the job stays `Failed`.
///
/// When that happens depends on the worker's interleaving: the failure is acknowledged (and
/// the job fetched again) at once, or, when the result came in while a fetch was in flight, at
/// the next heartbeat: the storage drains its results only from `poll_ready` in its `Ready`
/// state (persistence/mod.rs:285-294), and nothing wakes an idle worker but its heartbeat
/// timer. The heartbeat here is 1 s (default 30 s) to keep the test short.
#[tokio::test]
async fn job_busy_without_layer_is_rerun_by_apalis_without_delay() {
    let config = Config::default()
        .queue("charges")
        .heartbeat_interval(Duration::from_secs(1));
    let mut s = job_setup(3, config).await;
    let lock = WriteLock::take(&s.app_path).await;
    let worker = WorkerBuilder::new("apalis-reruns")
        .backend(s.storage)
        .data(s.app.clone())
        .on_event(listener(&s.events, 3))
        .build(charge);
    let started = Instant::now();
    let run = tokio::spawn(worker.run());

    for _ in 0..3 {
        let failure = recv(&mut s.failed, "failed try").await;
        assert!(failure.contains("database is locked"), "{failure}");
    }
    let three_tries = started.elapsed();
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the worker stops after the third result")
        .unwrap()
        .unwrap();
    lock.release().await;

    assert_eq!(s.app.tries.load(Ordering::SeqCst), 3);
    assert_eq!(ledger(&s.app).await, 0);
    let (status, attempts, _) = job_row(&s.queue_pool).await;
    assert_eq!((status.as_str(), attempts), ("Failed", 3));
    let events = s.events.lock().unwrap().clone();
    let errors = events.iter().filter(|e| e.starts_with("Error(")).count();
    assert_eq!(errors, 3, "{events:?}");
    println!("apalis ran the job 3 times in {three_tries:?}");
}

/// With `Operation::layer()` on the worker, the same job completes, once: the busy try is
/// replayed in place (the retry sits inside apalis' persistence layer, which sees only the
/// final result), the row is in the ledger exactly once, and the operation counts the retries
/// and one success after retry.
#[tokio::test]
async fn job_busy_with_layer_completes_once() {
    let mut s = job_setup(1, Config::default().queue("charges")).await;
    let op = Operation::new("charge", RetryPolicy::default()).classify_with(RetryDriverErrors);
    let lock = WriteLock::take(&s.app_path).await;
    let worker = WorkerBuilder::new("with-layer")
        .backend(s.storage)
        .data(s.app.clone())
        .on_event(listener(&s.events, 1))
        .layer(op.layer())
        .build(charge);
    let run = tokio::spawn(worker.run());

    let first = recv(&mut s.failed, "failed try").await;
    assert!(first.contains("database is locked"), "{first}");
    lock.release().await;
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the worker stops after the job's result")
        .unwrap()
        .unwrap();

    let tries = s.app.tries.load(Ordering::SeqCst);
    assert!(tries >= 2, "the job failed once, then ran again: {tries}");
    assert_eq!(ledger(&s.app).await, 1, "the side effect, exactly once");
    let events = s.events.lock().unwrap().clone();
    assert_eq!(
        events.iter().filter(|e| e.starts_with("Error(")).count(),
        0,
        "apalis never saw the failure: {events:?}"
    );
    assert_eq!(events.iter().filter(|e| *e == "Success").count(), 1);

    let m = op.metrics().snapshot();
    assert!(m.retries > 0, "{m:?}");
    assert_eq!(m.retries, u64::from(tries - 1), "{m:?}");
    assert_eq!(m.succeeded_after_retry, 1, "{m:?}");
    assert_eq!(m.first_try, 0, "{m:?}");
    assert_eq!(m.exhausted + m.deadline + m.non_retryable + m.cancelled, 0);

    // apalis' record: done, its result Ok. Its `attempts` counts every try the layer made
    // (apalis' lifecycle layer, inside the retry, counts each call on the task's shared counter),
    // above the job's `max_attempts` of 1, which only bounds apalis' own re-fetching.
    let (status, attempts, last_result) = job_row(&s.queue_pool).await;
    assert_eq!(status, "Done");
    assert_eq!(attempts, i64::from(tries));
    assert!(
        last_result.as_deref().unwrap().contains("Ok"),
        "{last_result:?}"
    );
}

/// Keeps the worker's context when it starts (to stop it from the test).
fn keep_worker(
    slot: &Arc<Mutex<Option<WorkerContext>>>,
) -> impl Fn(&WorkerContext, &Event) + use<> {
    let slot = Arc::clone(slot);
    move |worker, event| {
        if let Event::Start = event {
            *slot.lock().unwrap() = Some(worker.clone());
        }
    }
}

/// A worker stopped while a job waits in the layer's backoff never finishes: the retry asks the
/// service below it, apalis' lifecycle service, to be ready, and on a worker shutting down that
/// one answers `Pending` for good, without a wake-up (apalis-core worker/lifecycle.rs:80-85),
/// while the worker's shutdown waits for the job (worker/call_all.rs:162-166,
/// worker/handle.rs:38-42). Here the lock is released right after the stop: the retry would
/// succeed at once, and never runs.
#[tokio::test]
async fn stop_during_a_layer_retry_never_finishes() {
    let mut s = job_setup(1, Config::default().queue("charges")).await;
    let op = Operation::new("charge", RetryPolicy::default()).classify_with(RetryDriverErrors);
    let slot = Arc::new(Mutex::new(None));
    let lock = WriteLock::take(&s.app_path).await;
    let worker = WorkerBuilder::new("stopped-in-retry")
        .backend(s.storage)
        .data(s.app.clone())
        .on_event(keep_worker(&slot))
        .layer(op.layer())
        .build(charge);
    let run = tokio::spawn(worker.run());

    let first = recv(&mut s.failed, "failed try").await;
    assert!(first.contains("database is locked"), "{first}");
    let worker = slot.lock().unwrap().clone().expect("started");
    worker.stop().unwrap();
    // The try under way when the stop came (if any) fails too: the lock is still held.
    let tries = s.app.tries.load(Ordering::SeqCst);
    lock.release().await;

    // A retry that ran would succeed within milliseconds (the policy's first delays are 2 and
    // 4 ms at most).
    let mut run = run;
    let finished = tokio::time::timeout(Duration::from_millis(500), &mut run).await;
    assert!(finished.is_err(), "the stopped worker never finishes");
    assert!(s.app.tries.load(Ordering::SeqCst) <= tries + 1);
    assert_eq!(ledger(&s.app).await, 0, "the retry never ran");
    assert_eq!(op.metrics().snapshot().succeeded_after_retry, 0);
    run.abort();
}

/// The same stop, with the job's transaction retried inside its handler (`Operation::run`): the
/// retry needs nothing of the worker, the job completes, once, and the stopped worker finishes.
#[tokio::test]
async fn stop_during_a_run_retry_finishes() {
    let mut s = job_setup(1, Config::default().queue("charges")).await;
    let op = Operation::new("charge", RetryPolicy::default());
    let slot = Arc::new(Mutex::new(None));
    let lock = WriteLock::take(&s.app_path).await;
    let worker = WorkerBuilder::new("stopped-in-run")
        .backend(s.storage)
        .data(s.app.clone())
        .data(op.clone())
        .on_event(keep_worker(&slot))
        .build(
            |job: Charge, app: Data<App>, op: Data<Operation>| async move {
                op.run(|_attempt| try_charge(&app, &job))
                    .await
                    // no error: no admission slot within the deadline, as a pool time-out
                    .map_err(|e| e.into_inner().unwrap_or(sqlx::Error::PoolTimedOut))
            },
        );
    let run = tokio::spawn(worker.run());

    let first = recv(&mut s.failed, "failed try").await;
    assert!(first.contains("database is locked"), "{first}");
    let worker = slot.lock().unwrap().clone().expect("started");
    worker.stop().unwrap();
    lock.release().await;
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the stopped worker finishes its job, then itself")
        .unwrap()
        .unwrap();

    let tries = s.app.tries.load(Ordering::SeqCst);
    assert!(tries >= 2, "{tries}");
    assert_eq!(ledger(&s.app).await, 1);
    let m = op.metrics().snapshot();
    assert_eq!(m.retries, u64::from(tries - 1), "{m:?}");
    assert_eq!(m.succeeded_after_retry, 1, "{m:?}");
    let (status, attempts, _) = job_row(&s.queue_pool).await;
    // one apalis attempt: the retries were the handler's own
    assert_eq!((status.as_str(), attempts), ("Done", 1));
}

// ---------------------------------------------------------------------------------------------
// apalis-sqlite's own poll loop meeting `database is locked`
// ---------------------------------------------------------------------------------------------

/// The queue's pool with `busy_timeout` 0 (with sqlx's default of 5 s the same happens, once a
/// lock has been held for 5 s), and a storage that writes nothing between its fetches: no
/// lock events, no results (so the only write of its loop after registration is the fetch,
/// `fetch_next.sql`, an `UPDATE ... RETURNING`), and its heartbeat every 30 s.
async fn busy_queue(dir: &Path) -> (SqlitePool, SqliteStorage<Charge>) {
    let pool = pool(&dir.join("queue.db"), Duration::ZERO).await;
    let config = Config::default()
        .queue("charges")
        .lock_tasks(false)
        .persist_results(false);
    let storage = queue(&pool, config).await;
    (pool, storage)
}

/// Sends the held lock (and the worker, to stop it) out of the handler, to keep the lock held
/// after the handler returns.
#[derive(Clone)]
struct LockTaker {
    path: Arc<Path>,
    taken: mpsc::UnboundedSender<(WriteLock, WorkerContext)>,
}

/// The first job takes the queue file's write lock and keeps it (through the channel): the
/// storage's next fetch meets it.
async fn take_queue_lock(
    _job: Charge,
    taker: Data<LockTaker>,
    worker: WorkerContext,
) -> Result<(), BoxDynError> {
    let lock = WriteLock::take(&taker.path).await;
    taker
        .taken
        .send((lock, worker))
        .map_err(|_| "the test is gone")?;
    Ok(())
}

/// apalis-sqlite's error inside a worker's backend error: apalis-core boxes it in its
/// `DurableError` (the storage's decoding wrapper), which has no `source()`, so only a downcast
/// reaches it.
fn sqlite_error(error: &WorkerError) -> Option<&apalis_sqlite::Error> {
    let WorkerError::BackendError(boxed) = error else {
        return None;
    };
    match boxed.downcast_ref::<DurableError<apalis_sqlite::Error, serde_json::Error>>()? {
        DurableError::PollNextError(e) => Some(e),
        _ => None,
    }
}

fn event_name(event: &Result<Event, WorkerError>) -> String {
    match event {
        Ok(Event::Success(_)) => "Success".to_owned(),
        Ok(other) => format!("{other:?}"),
        Err(WorkerError::BackendError(_)) => "BackendError".to_owned(),
        Err(other) => format!("{other}"),
    }
}

/// The storage's fetch meets `database is locked`: apalis-core's `Persisted::poll_next` turns
/// the backend `Dead` (persistence/mod.rs:348-351), the worker's stream yields the error as a
/// `WorkerError::BackendError`, and the backend fetches nothing ever after: no retry, no
/// backoff. The stream does not end by itself either: it waits, shutting down, for someone to
/// stop the worker (worker/stream.rs:92-98, worker/handle.rs:38-42), then says `Exit`. The
/// error is retryable by the crate's classifier, but no layer sees it; `inspect_err` (a
/// `BackendExt` hook) sees it, once, and can do nothing about it.
#[tokio::test]
async fn fetch_busy_kills_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let (_pool, mut storage) = busy_queue(dir.path()).await;
    storage.push(Charge { id: 1, amount: 1 }).await.unwrap();
    let (tx, mut taken) = mpsc::unbounded_channel();
    let taker = LockTaker {
        path: dir.path().join("queue.db").into(),
        taken: tx,
    };
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let inspect = {
        let seen = Arc::clone(&seen);
        move |e: &apalis_sqlite::Error| seen.lock().unwrap().push(e.to_string())
    };
    let worker = WorkerBuilder::new("busy-fetch")
        .backend(storage.inspect_err(inspect))
        .data(taker)
        .build(take_queue_lock);

    let mut stream = std::pin::pin!(worker.stream());
    let mut events = Vec::new();
    tokio::time::timeout(BOUND, async {
        // The job's success and the fetch's error, in either order: the fetch that meets the
        // lock may be the one that runs while the job does (the storage fetches its next batch
        // as soon as the last task of a batch is handed out) or the one after the job.
        while events.len() < 3 {
            events.push(stream.next().await.unwrap());
        }
    })
    .await
    .expect("the fetch fails at once");
    let mut names: Vec<String> = events.iter().map(event_name).collect();
    names[1..].sort();
    assert_eq!(names, ["Start", "BackendError", "Success"]);
    let (lock, worker) = taken.try_recv().expect("the job took the lock");

    let worker_error = events
        .into_iter()
        .find_map(Result::err)
        .expect("the worker's error");
    assert!(
        worker_error.to_string().contains("database is locked"),
        "{worker_error}"
    );
    // apalis-sqlite's error, and SQLite's in its `source()` chain: retryable ...
    let sqlite = sqlite_error(&worker_error).expect("apalis-sqlite's error inside");
    let retryable = classify_error_chain(sqlite).expect("SQLITE_BUSY in the chain");
    assert_eq!(retryable.name(), "SQLITE_BUSY");
    // ... but out of reach of a chain walk from what apalis returns: `BackendError` has no
    // `source()`, nor has apalis-core's `DurableError` in its box (finalize.rs:21-28).
    assert!(classify_error_chain(&worker_error).is_none());
    let WorkerError::BackendError(boxed) = &worker_error else {
        unreachable!()
    };
    assert!(classify_error_chain(boxed.as_ref()).is_none());
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(seen.lock().unwrap()[0].contains("database is locked"));

    // Released, the lock no longer matters: the backend is dead and the stream only waits.
    lock.release().await;
    let next = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(
        next.is_err(),
        "the stream waits: {:?}",
        next.map(|e| e.map(|e| event_name(&e)))
    );
    worker.stop().unwrap();
    let rest: Vec<String> = tokio::time::timeout(BOUND, stream.map(|e| event_name(&e)).collect())
        .await
        .expect("stopped, the stream ends");
    assert_eq!(rest, ["Exit"]);
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the backend never polled again"
    );
}

/// A job the worker is running when its backend meets `database is locked` (its fetch, the
/// write of a job's result or its heartbeat, whichever comes first: all end the backend the
/// same way, through `Persisted::poll_next` or `Persisted::poll_ready`): `run()` returns the
/// error at once and drops the jobs in flight; they stay claimed by the dead worker (neither
/// done nor failed), for apalis' orphan recovery to find once that worker has missed its
/// heartbeats. (No lock events, so that no write of the loop comes before both jobs have
/// started; a heartbeat of 1 s, as a result that came in during a fetch waits for it.)
#[tokio::test]
async fn backend_busy_drops_jobs_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let pool = pool(&path, Duration::ZERO).await;
    let config = Config::default()
        .queue("charges")
        .lock_tasks(false)
        .heartbeat_interval(Duration::from_secs(1));
    let mut storage = queue(&pool, config).await;
    storage.push(Charge { id: 1, amount: 1 }).await.unwrap();
    storage.push(Charge { id: 2, amount: 2 }).await.unwrap();
    let (tx, mut taken) = mpsc::unbounded_channel();
    let taker = LockTaker {
        path: path.into(),
        taken: tx,
    };

    /// Set when job 2's handler starts, and when it is dropped before it finished.
    #[derive(Clone, Default)]
    struct InFlight {
        started: Arc<AtomicU32>,
        dropped: Arc<AtomicU32>,
    }
    struct DropGuard(Arc<AtomicU32>);
    impl Drop for DropGuard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let in_flight = InFlight::default();
    let worker = WorkerBuilder::new("busy-in-flight")
        .backend(storage)
        .data(taker)
        .data(in_flight.clone())
        .build(
            |job: Charge,
             taker: Data<LockTaker>,
             in_flight: Data<InFlight>,
             worker: WorkerContext| async move {
                if job.id == 1 {
                    return take_queue_lock(job, taker, worker).await;
                }
                // job 2: runs until it is dropped
                in_flight.started.fetch_add(1, Ordering::SeqCst);
                let _guard = DropGuard(Arc::clone(&in_flight.dropped));
                std::future::pending::<()>().await;
                Ok(())
            },
        );

    let error = tokio::time::timeout(BOUND, worker.run())
        .await
        .expect("run() returns by itself")
        .unwrap_err();
    // Job 1 took the lock; it may have been dropped mid-run too (its lock with it), if the
    // loop's write met the lock before job 1 had handed it over.
    if let Ok((lock, _)) = taken.try_recv() {
        lock.release().await;
    }
    assert!(
        matches!(&error, WorkerError::BackendError(e) if e.to_string().contains("database is locked")),
        "{error}"
    );
    assert_eq!(in_flight.started.load(Ordering::SeqCst), 1);
    assert_eq!(
        in_flight.dropped.load(Ordering::SeqCst),
        1,
        "job 2 dropped mid-run"
    );
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT json_extract(CAST(job AS TEXT), '$.id'), status, lock_by FROM Jobs ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (id, status, lock_by) in &rows {
        assert_eq!(status, "Queued", "job {id}: claimed, never acknowledged");
        assert_eq!(lock_by.as_deref(), Some("busy-in-flight"), "job {id}");
    }
    assert_eq!(rows.len(), 2);
}

/// The same at the start: the worker's registration (`Persistence::register`, in
/// `Persisted::poll_ready`, persistence/mod.rs:227-234) meets the lock, and `run()` returns the
/// error at once; the pushed job is left `Pending`.
#[tokio::test]
async fn register_busy_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, mut storage) = busy_queue(dir.path()).await;
    storage.push(Charge { id: 1, amount: 1 }).await.unwrap();
    let lock = WriteLock::take(&dir.path().join("queue.db")).await;
    let ran = Arc::new(AtomicU32::new(0));
    let worker = WorkerBuilder::new("busy-register")
        .backend(storage)
        .data(Arc::clone(&ran))
        .build(|_job: Charge, ran: Data<Arc<AtomicU32>>| async move {
            ran.fetch_add(1, Ordering::SeqCst);
        });

    let result = tokio::time::timeout(BOUND, worker.run()).await;
    lock.release().await;
    let error = result.expect("run() returns by itself").unwrap_err();
    assert!(
        matches!(&error, WorkerError::BackendError(e) if e.to_string().contains("database is locked")),
        "{error}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let (status, attempts, _) = job_row(&pool).await;
    assert_eq!((status.as_str(), attempts), ("Pending", 0));
}

/// Where the crate can reach the poll loop: a fetcher of one's own. apalis-core's custom
/// backend (`BackendBuilder`) takes a stream of tasks; this one claims them with apalis-sqlite's
/// public queries (`register_worker`, `fetch_next`: the storage's own SQL) and drives its
/// claims with `Operation::backoff()`: a busy claim waits the backoff's delay and tries again,
/// and the worker never sees the error.
struct Poller {
    pool: SqlitePool,
    config: Config,
    worker: WorkerContext,
    backoff: Backoff,
    registered: bool,
    buffer: std::collections::VecDeque<Task<Charge>>,
    /// Each failed claim's error, as it happens.
    failed: mpsc::UnboundedSender<String>,
}

impl Poller {
    /// The next task: claims a batch when none is buffered; on an error, the backoff's delay
    /// (or, past the end of a streak, its cap) and again.
    async fn next(&mut self) -> Task<Charge> {
        loop {
            if let Some(task) = self.buffer.pop_front() {
                return task;
            }
            match self.claim().await {
                Ok(()) => {
                    self.backoff.reset();
                    if self.buffer.is_empty() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                Err(e) => {
                    let _ = self.failed.send(e.to_string());
                    let delay = self
                        .backoff
                        .next_delay(&e)
                        .unwrap_or_else(|| self.backoff.cap());
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn claim(&mut self) -> Result<(), apalis_sqlite::Error> {
        use apalis_sqlite::queries::{fetch_next, register_worker};
        if !self.registered {
            let mut tx = self.pool.begin().await?;
            register_worker(&mut *tx, &self.config, &self.worker, "SqliteStorage").await?;
            tx.commit().await?;
            self.registered = true;
        }
        let mut tx = self.pool.begin().await?;
        let tasks = fetch_next(&mut *tx, &self.config, &self.worker).await?;
        tx.commit().await?;
        for task in tasks {
            let task = task
                .try_map_args(|bytes| serde_json::from_slice::<Charge>(&bytes))
                .map_err(apalis_sqlite::Error::JsonError)?;
            self.buffer.push_back(task);
        }
        Ok(())
    }

    fn into_stream(self) -> BoxStream<'static, Result<Option<Task<Charge>>, BoxDynError>> {
        futures::stream::unfold(self, |mut poller| async move {
            let task = poller.next().await;
            Some((Ok(Some(task)), poller))
        })
        .boxed()
    }
}

/// A custom fetcher whose claims are driven by `Operation::backoff()`: with the queue file's
/// lock held, the claims fail (registration first), the backoff retries them, and once the
/// lock is released (after two failures were seen) the job is claimed and run, by a worker
/// that never stopped. The operation counts the retries and one streak that succeeded after
/// them.
#[tokio::test]
async fn custom_fetcher_with_backoff_survives_busy() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, mut storage) = busy_queue(dir.path()).await;
    storage.push(Charge { id: 9, amount: 5 }).await.unwrap();
    let config = Config::default().queue("charges");
    let op = Operation::new(
        "apalis-fetch",
        RetryPolicy::default().max_delay(Duration::from_millis(50)),
    );
    let (tx, mut failed) = mpsc::unbounded_channel();
    let backend = BackendBuilder::new_with_cfg(config)
        .database(pool.clone())
        .fetcher({
            let op = op.clone();
            move |pool: &mut SqlitePool, config: &Config, worker: &WorkerContext| {
                Poller {
                    pool: pool.clone(),
                    config: config.clone(),
                    worker: worker.clone(),
                    backoff: op.backoff(),
                    registered: false,
                    buffer: Default::default(),
                    failed: tx.clone(),
                }
                .into_stream()
            }
        })
        // Jobs are pushed through the storage; this backend's sink takes none.
        .sink(|_, _| {
            futures::sink::drain()
                .sink_map_err(|never: std::convert::Infallible| -> BoxDynError { match never {} })
        })
        .build()
        .unwrap();
    let ran = Arc::new(Mutex::new(Vec::<i64>::new()));
    let worker = WorkerBuilder::new("custom-fetcher")
        .backend(backend)
        .data(Arc::clone(&ran))
        .build(
            |job: Charge, ran: Data<Arc<Mutex<Vec<i64>>>>, worker: WorkerContext| async move {
                ran.lock().unwrap().push(job.id);
                worker.stop()
            },
        );

    let lock = WriteLock::take(&dir.path().join("queue.db")).await;
    let run = tokio::spawn(worker.run());
    for _ in 0..2 {
        let failure = recv(&mut failed, "failed claim").await;
        assert!(failure.contains("database is locked"), "{failure}");
    }
    lock.release().await;
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the worker runs the job, which stops it")
        .unwrap()
        .unwrap();

    assert_eq!(*ran.lock().unwrap(), [9]);
    let failures = 2 + failed.len() as u64; // the two received, and any after them
    let m = op.metrics().snapshot();
    assert!(m.retries >= 2, "{m:?}");
    assert_eq!(m.retries, failures, "one retry per failed claim: {m:?}");
    assert_eq!(m.succeeded_after_retry, 1, "{m:?}");
    assert_eq!(m.exhausted + m.deadline + m.non_retryable, 0, "{m:?}");
    // The claim went through (this worker holds the job); acknowledging it is this backend's
    // business (the custom backend has no persistence layer), not shown here.
    let (status, _, _) = job_row(&pool).await;
    assert_eq!(status, "Queued");
}

/// Where apalis itself hands a worker's error to the application: its `Monitor`, whose
/// `should_restart` decides whether a failed worker runs again (`monitor/mod.rs:251-283`).
/// `Operation::backoff()` decides there (retry while the error is retryable and the streak's
/// attempts and deadline allow), and the delay it gives is slept before the next worker starts
/// (`before_start` on its backend: the callback itself cannot wait). With the queue file's lock
/// held, each worker fails at its registration; once the lock is released (after two failures
/// were seen), the next one runs the job. Each restart is a new worker (a new name: a worker
/// registered less than a heartbeat ago cannot register again), with a fresh storage state.
#[tokio::test]
async fn monitor_restarts_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let (_pool, mut storage) = busy_queue(dir.path()).await;
    storage.push(Charge { id: 4, amount: 1 }).await.unwrap();
    // The worker's error chains to nothing: the classifier reaches the SQLite error by downcast.
    let op = Operation::new(
        "apalis-worker",
        RetryPolicy::default().max_delay(Duration::from_millis(50)),
    )
    .classify_with(|e: &WorkerError| sqlite_error(e).and_then(|e| classify_error_chain(e)));
    let backoff = Arc::new(Mutex::new(op.backoff()));
    let delay = Arc::new(Mutex::new(Duration::ZERO));
    let (tx, mut failed) = mpsc::unbounded_channel();
    // (worker, job) for each job run
    type Ran = Arc<Mutex<Vec<(String, i64)>>>;
    let ran: Ran = Arc::default();

    let factory = {
        let (backoff, delay, ran) = (backoff.clone(), delay.clone(), ran.clone());
        move |restarts: usize| {
            let wait = *delay.lock().unwrap();
            let backoff = Arc::clone(&backoff);
            WorkerBuilder::new(format!("monitored-{restarts}"))
                .backend(storage.clone().before_start(move |_| async move {
                    tokio::time::sleep(wait).await;
                    Ok(())
                }))
                .data(Arc::clone(&ran))
                .on_event(move |_, event| {
                    if let Event::Success(_) = event {
                        backoff.lock().unwrap().reset();
                    }
                })
                .build(
                    |job: Charge, ran: Data<Ran>, worker: WorkerContext| async move {
                        ran.lock().unwrap().push((worker.name().to_owned(), job.id));
                        worker.stop()
                    },
                )
        }
    };
    let monitor = Monitor::new()
        .register(factory)
        .should_restart(move |_worker, error| {
            let _ = tx.send(error.to_string());
            let next = backoff.lock().unwrap().next_delay(error);
            match next {
                Some(wait) => {
                    *delay.lock().unwrap() = wait;
                    true
                }
                None => false,
            }
        });

    let lock = WriteLock::take(&dir.path().join("queue.db")).await;
    let run = tokio::spawn(monitor.run());
    for _ in 0..2 {
        let failure = recv(&mut failed, "failed worker").await;
        assert!(failure.contains("database is locked"), "{failure}");
    }
    lock.release().await;
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the restarted worker runs the job, which stops it")
        .unwrap()
        .unwrap();

    let failures = 2 + failed.len() as u64;
    let ran = ran.lock().unwrap().clone();
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0], (format!("monitored-{failures}"), 4));
    let m = op.metrics().snapshot();
    assert_eq!(
        m.retries, failures,
        "one retry (restart) per failed worker: {m:?}"
    );
    assert_eq!(m.succeeded_after_retry, 1, "{m:?}");
    assert_eq!(m.exhausted + m.deadline + m.non_retryable, 0, "{m:?}");
}
