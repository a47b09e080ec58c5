//! The read limit (`SqliteRetryLayer::limit_reads_while_writers_wait`, `ReadLimit`): while a writer waits for a write
//! turn, at most `n` `GET`/`HEAD` handlers under the layer run at once; a read held back runs
//! anyway after its `max_wait`; writes, and reads while no writer waits, are never held back.
//! On by default (a read per core but one, at least one); `no_read_limit()` turns it off.
//!
//! Real SQLite files, real `WritePool`s, real HTTP over loopback. Every wait is made by a
//! transaction or a handler the test holds (a writer waits behind a transaction the test keeps
//! open; a read stays in its handler until the test lets it go), never by timing: where a read
//! must *not* get in, its `max_wait` is an hour. Which writers count is process-wide (any
//! database's turn), so the tests of this file take turns ([`serial`]).

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use common::{HttpClient, TestDb, poll_until, serve};
use tokio::sync::{Semaphore, watch};
use tower_sqlite_retry::policy::ReadLimit;
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};

/// Requests the layer held back: each opens its `sqlite_retry` span the moment it must wait
/// for a place (a request that gets in at once opens none, and no request of these tests is
/// replayed), so a count of those spans says that a read is waiting, not that it happened to
/// be slow. Counted by the process's subscriber (this file is a crate of its own), installed
/// by [`Case::new`] before any request.
static HELD_BACK: AtomicUsize = AtomicUsize::new(0);

struct CountHeldBack;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountHeldBack {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() == "sqlite_retry" {
            HELD_BACK.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn count_held_back() {
    use tracing_subscriber::layer::SubscriberExt;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountHeldBack))
            .expect("the process's subscriber");
    });
}

fn held_back() -> usize {
    HELD_BACK.load(Ordering::SeqCst)
}

/// The tests of this file one at a time: the read limit asks whether a writer waits for *any*
/// database's turn in the process.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Clone)]
struct App {
    writes: WritePool,
    /// Handlers that are in (entered and not yet answered).
    inside: Arc<AtomicUsize>,
    /// Handlers that ever got in.
    entered: Arc<AtomicUsize>,
    /// What a held handler waits for before it answers.
    release: Arc<Semaphore>,
}

impl App {
    async fn new(db: &TestDb) -> Self {
        Self {
            writes: WritePool::new(db.pool(4, Duration::from_secs(5)).await),
            inside: Arc::default(),
            entered: Arc::default(),
            release: Arc::new(Semaphore::new(0)),
        }
    }

    fn router(&self, layer: SqliteRetryLayer) -> Router {
        Router::new()
            .route("/read", get(read))
            .route("/peek", post(read))
            .route("/write/{seq}", post(write))
            .layer(layer)
            .with_state(self.clone())
    }

    fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }
}

/// Reads the table, then stays in until the test releases it.
async fn read(State(app): State<App>) -> Result<String, DbError> {
    app.entered.fetch_add(1, Ordering::SeqCst);
    app.inside.fetch_add(1, Ordering::SeqCst);
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&*app.writes)
        .await?;
    app.release.acquire().await.expect("open").forget();
    app.inside.fetch_sub(1, Ordering::SeqCst);
    Ok(count.to_string())
}

/// One write transaction through the write path: the row `seq`.
async fn insert(writes: &WritePool, seq: i64) -> Result<(), sqlx::Error> {
    let mut tx = writes.begin().await?;
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'w')")
        .bind(seq)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

async fn write(State(app): State<App>, Path(seq): Path<i64>) -> Result<StatusCode, DbError> {
    insert(&app.writes, seq).await?;
    Ok(StatusCode::CREATED)
}

/// The storm's write, on a `WritePool` state.
async fn store(State(w): State<WritePool>, Path(seq): Path<i64>) -> Result<StatusCode, DbError> {
    insert(&w, seq).await?;
    Ok(StatusCode::CREATED)
}

/// A layer with `policy` and a read limit of `n` reads, each waiting at most `wait`.
fn limited(policy: RetryPolicy, n: usize, wait: Duration) -> SqliteRetryLayer {
    let reads = NonZeroUsize::new(n).expect("a read limit of at least one");
    SqliteRetryLayer::new(policy)
        .limit_reads_while_writers_wait(ReadLimit::new(reads).max_wait(wait))
}

/// A default layer with a read limit of `n` reads, each waiting at most `wait`.
fn limit(n: usize, wait: Duration) -> SqliteRetryLayer {
    limited(RetryPolicy::default(), n, wait)
}

/// A writer waiting for the turn behind a transaction the test holds: `(the transaction, the
/// writer)`. Commit the transaction to let the writer through. (The writer is a task of the
/// test, not a request: its wait is bounded by the pool's `acquire_timeout`, 30 s, whatever
/// the layer's deadline.)
async fn waiting_writer(
    app: &App,
    seq: i64,
) -> (
    tower_sqlite_retry::WriteTransaction,
    tokio::task::JoinHandle<()>,
) {
    let held = app.writes.begin().await.expect("begin");
    let writes = app.writes.clone();
    let writer =
        tokio::spawn(async move { insert(&writes, seq).await.expect("the writer's turn") });
    poll_until("a writer waits for the turn", async || {
        app.writes.stats().is_some_and(|s| s.waiting == 1)
    })
    .await;
    (held, writer)
}

/// One test's database, application and server; the file's tests take turns ([`serial`]).
/// Fields drop in order: the application (its pools) before the file, the turn last.
struct Case {
    app: App,
    client: HttpClient,
    _server: common::Server,
    _db: TestDb,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Case {
    async fn new(layer: SqliteRetryLayer) -> Self {
        count_held_back();
        let serial = serial().await;
        HELD_BACK.store(0, Ordering::SeqCst);
        let db = TestDb::new();
        let app = App::new(&db).await;
        let server = serve(app.router(layer)).await;
        Self {
            client: HttpClient::new(server.addr),
            app,
            _server: server,
            _db: db,
            _serial: serial,
        }
    }
}

/// Three `GET`s all get in at once (under a limit of one: none is held back), then answer.
async fn three_reads_run_at_once(app: &App, client: &HttpClient) {
    let reads: Vec<_> = (0..3).map(|_| spawn_get(client, "/read")).collect();
    poll_until("all three reads in at once", async || app.entered() == 3).await;
    app.release.add_permits(3);
    for read in reads {
        assert_eq!(read.await.unwrap().status, StatusCode::OK);
    }
}

fn spawn_get(client: &HttpClient, path: &str) -> tokio::task::JoinHandle<common::Reply> {
    let client = client.clone();
    let path = path.to_owned();
    tokio::spawn(async move { client.get(&path).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_writer_waits_reads_run_at_most_the_limit_at_once() {
    let case = Case::new(limit(2, HOUR)).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;

    let reads: Vec<_> = (0..3).map(|_| spawn_get(client, "/read")).collect();
    poll_until("two reads in, the third held back", async || {
        app.entered() == 2 && held_back() == 1
    })
    .await;
    // The third waits: it gets in only when one of the two answers. (Its `max_wait` is an
    // hour: it cannot get in any other way.)
    assert_eq!(app.entered(), 2);
    app.release.add_permits(1);
    poll_until("the third read in", async || app.entered() == 3).await;
    assert_eq!(
        app.inside.load(Ordering::SeqCst),
        2,
        "never more than two at once"
    );

    app.release.add_permits(2);
    for read in reads {
        assert_eq!(read.await.unwrap().status, StatusCode::OK);
    }
    held.commit().await.unwrap();
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_no_writer_waits_reads_are_never_held_back() {
    let case = Case::new(limit(1, HOUR)).await;
    let (app, client) = (&case.app, &case.client);
    // The turn held, nobody waiting for it: not a reason to hold reads back.
    let held = app.writes.begin().await.unwrap();

    three_reads_run_at_once(app, client).await;
    held.commit().await.unwrap();
}

/// The read limit asks a process-wide count that each writer's wait keeps; a wait that ends
/// by cancellation (the writer's task aborted while it queued) must leave it as it found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_wait_is_cancelled_no_longer_holds_reads_back() {
    let case = Case::new(limit(1, HOUR)).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    poll_until("nobody waits for the turn", async || {
        app.writes.stats().is_some_and(|s| s.waiting == 0)
    })
    .await;

    three_reads_run_at_once(app, client).await;
    held.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_held_back_runs_anyway_after_its_max_wait() {
    let case = Case::new(limit(1, Duration::from_millis(50))).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;

    // The first read keeps the only permit until the test lets it go (a long poll).
    let first = spawn_get(client, "/read");
    poll_until("the first read in", async || app.entered() == 1).await;
    // The second is held back (without a limit it would get in at once: no span), then gets
    // in without a permit while the first is still in.
    let second = spawn_get(client, "/read");
    poll_until("the second read in beside the first", async || {
        app.entered() == 2
    })
    .await;
    assert_eq!(held_back(), 1, "the second read was held back");
    assert_eq!(app.inside.load(Ordering::SeqCst), 2);
    app.release.add_permits(2);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    held.commit().await.unwrap();
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_are_never_held_back() {
    let case = Case::new(limit(1, HOUR)).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;

    let get = spawn_get(client, "/read");
    poll_until("the read in", async || app.entered() == 1).await;
    // A `POST` (even one that only reads) is not a read for the limit.
    let post = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/peek", "").await })
    };
    poll_until("the POST in beside the read", async || app.entered() == 2).await;
    app.release.add_permits(2);
    assert_eq!(get.await.unwrap().status, StatusCode::OK);
    assert_eq!(post.await.unwrap().status, StatusCode::OK);
    held.commit().await.unwrap();
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_reads_are_held_back_to_one_per_core_but_one_while_writers_wait() {
    let case = Case::new(SqliteRetryLayer::default()).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let places = cores.saturating_sub(1).max(1);

    // A read per core but one gets in at once, and stays in until the test lets it go.
    let mut reads: Vec<_> = (0..places).map(|_| spawn_get(client, "/read")).collect();
    poll_until("the places taken", async || app.entered() == places).await;
    // The next is held back (without a limit it would get in at once, opening no span), and
    // gets in once its `max_wait` (10 ms by default) has passed, without a place, while the
    // others are still in.
    assert_eq!(held_back(), 0);
    reads.push(spawn_get(client, "/read"));
    poll_until("one more in", async || app.entered() == places + 1).await;
    assert_eq!(held_back(), 1, "the read beyond the places was held back");
    assert_eq!(app.inside.load(Ordering::SeqCst), places + 1);

    app.release.add_permits(places + 1);
    for read in reads {
        assert_eq!(read.await.unwrap().status, StatusCode::OK);
    }
    held.commit().await.unwrap();
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_read_limit_reads_run_freely_while_writers_wait() {
    let case = Case::new(SqliteRetryLayer::default().no_read_limit()).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;

    let reads: Vec<_> = (0..4).map(|_| spawn_get(client, "/read")).collect();
    poll_until("all four reads in", async || app.entered() == 4).await;
    app.release.add_permits(4);
    for read in reads {
        assert_eq!(read.await.unwrap().status, StatusCode::OK);
    }
    held.commit().await.unwrap();
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_layers_take_one_permit_per_read() {
    let _serial = serial().await;
    let db = TestDb::new();
    let app = App::new(&db).await;
    // The same layer twice (one read limit of one permit): the inner one must not wait for a
    // second permit of the read that the outer one let in.
    let layer = limit(1, HOUR);
    let router = Router::new()
        .route("/read", get(read).layer(layer.clone()))
        .route("/write/{seq}", post(write))
        .layer(layer)
        .with_state(app.clone());
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);
    let (held, writer) = waiting_writer(&app, 1).await;

    let read = spawn_get(&client, "/read");
    poll_until("the read in through both layers", async || {
        app.entered() == 1
    })
    .await;
    app.release.add_permits(1);
    assert_eq!(read.await.unwrap().status, StatusCode::OK);
    held.commit().await.unwrap();
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_held_back_past_its_deadline_is_answered_503() {
    let layer = limited(
        RetryPolicy::default().deadline(Duration::from_millis(200)),
        1,
        HOUR,
    );
    let case = Case::new(layer).await;
    let (app, client) = (&case.app, &case.client);
    let (held, writer) = waiting_writer(app, 1).await;

    let first = spawn_get(client, "/read");
    poll_until("the first read in", async || app.entered() == 1).await;
    let second = tokio::time::timeout(Duration::from_secs(20), client.get("/read"))
        .await
        .expect("answered at its deadline, not let in");
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(second.headers.contains_key("retry-after"));
    assert_eq!(app.entered(), 1, "the held-back read never ran");
    app.release.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    held.commit().await.unwrap();
    writer.await.unwrap();
}

/// Many threads, real HTTP: readers (some of whose `GET`s also write, so a request holding a
/// read permit queues for the turn), writers, and the smallest limit. Nothing deadlocks, every
/// request is answered, every acknowledged write is in the file exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_reads_and_writes_under_the_smallest_limit_loses_nothing() {
    let _serial = serial().await;
    let db = TestDb::new();
    let writes = WritePool::new(db.pool(4, Duration::from_secs(5)).await);
    let next = Arc::new(AtomicUsize::new(0));
    let router = Router::new()
        .route(
            "/read",
            get(
                async |State(w): State<WritePool>| -> Result<String, DbError> {
                    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
                        .fetch_one(&*w)
                        .await?;
                    Ok(n.to_string())
                },
            ),
        )
        .route("/touch/{seq}", get(store))
        .route("/write/{seq}", post(store))
        .layer(limit(1, HOUR))
        .with_state(writes.clone());
    let server = serve(router).await;
    let client = HttpClient::new(server.addr);

    let (stop_tx, stop) = watch::channel(false);
    let mut clients = Vec::new();
    for c in 0..24 {
        let (client, next, stop) = (client.clone(), next.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let (mut answered, mut touched) = (0, 0);
            while !*stop.borrow() {
                let seq = next.fetch_add(1, Ordering::SeqCst) as i64;
                let reply = match c % 3 {
                    0 => client.post(&format!("/write/{seq}"), "").await,
                    1 if seq % 4 == 0 => {
                        touched += 1;
                        client.get(&format!("/touch/{seq}")).await
                    }
                    _ => client.get("/read").await,
                };
                answered += 1;
                match reply.status {
                    StatusCode::CREATED => acknowledged.push(seq),
                    StatusCode::OK => {}
                    other => panic!("unexpected {other}: {}", reply.text()),
                }
            }
            (answered, touched, acknowledged)
        }));
    }
    poll_until("600 requests made", async || {
        next.load(Ordering::SeqCst) >= 600
    })
    .await;
    stop_tx.send(true).unwrap();
    let mut acknowledged = Vec::new();
    let (mut answered, mut touched) = (0, 0);
    for c in clients {
        let (n, t, mut acks) = tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .expect("every client finishes: nothing deadlocked")
            .unwrap();
        answered += n;
        touched += t;
        acknowledged.append(&mut acks);
    }
    assert!(answered >= 600);
    assert!(
        touched > 0,
        "some reads wrote, holding a read permit while they waited"
    );
    acknowledged.sort_unstable();
    let rows: Vec<i64> = sqlx::query_scalar("SELECT seq FROM items ORDER BY seq")
        .fetch_all(&*writes)
        .await
        .unwrap();
    assert_eq!(
        rows, acknowledged,
        "every acknowledged write, once, and nothing else"
    );
}

/// The writer thread's closures count as writers waiting from the moment they are sent: while
/// one waits in the writer thread's inbox (behind a closure waiting for another connection's
/// lock), reads are held back to the limit, as behind a `WritePool`'s waiting writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closures_queued_for_the_writer_thread_hold_reads_back() {
    use tower_sqlite_retry::write::{WriteThread, WriteThreadOptions};
    let case = Case::new(limit(1, HOUR)).await;
    let (app, client) = (&case.app, &case.client);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("thread.db");
    let writes = WriteThread::open_with(
        &path,
        WriteThreadOptions::default().busy_timeout(HOUR),
        |conn| conn.execute_batch("CREATE TABLE t (x INTEGER)"),
    )
    .unwrap();
    // Another connection holds the thread's file's write lock: its first closure waits for it
    // in `BEGIN IMMEDIATE` (holding the turn), the second waits in the inbox.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let closures: Vec<_> = (0..2)
        .map(|_| {
            let writes = writes.clone();
            tokio::spawn(async move {
                writes
                    .transaction(|tx| tx.execute("INSERT INTO t VALUES (1)", []))
                    .await
            })
        })
        .collect();
    poll_until("a closure waits for the writer thread", async || {
        writes.stats().waiting == 1
    })
    .await;

    let reads: Vec<_> = (0..2).map(|_| spawn_get(client, "/read")).collect();
    poll_until("one read in, the other held back", async || {
        app.entered() == 1 && held_back() == 1
    })
    .await;
    // The held read gets in once the first answers (its `max_wait` is an hour).
    app.release.add_permits(1);
    poll_until("the held read in", async || app.entered() == 2).await;
    app.release.add_permits(1);
    other.execute_batch("COMMIT").unwrap();
    for closure in closures {
        closure.await.unwrap().unwrap();
    }
    for read in reads {
        assert_eq!(read.await.unwrap().status, StatusCode::OK);
    }
}
