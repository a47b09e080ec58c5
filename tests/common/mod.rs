//! Shared test helpers: real SQLite files, a real HTTP server on loopback, a real client, and
//! deterministic contention: a held `BEGIN IMMEDIATE` ([`TestDb::hold_write_lock`]) makes a
//! victim with busy timeout 0 fail with `SQLITE_BUSY` at once, with no timing involved.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};

/// A SQLite database in a file of its own, deleted with the value.
pub struct TestDb {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("test.db");
        Self { _dir: dir, path }
    }

    pub fn options(&self, busy_timeout: Duration) -> SqliteConnectOptions {
        options(&self.path, busy_timeout)
    }

    /// A pool in WAL mode with this many connections and busy timeout; creates the `items`
    /// table (`seq` unique).
    pub async fn pool(&self, connections: u32, busy_timeout: Duration) -> SqlitePool {
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(self.options(busy_timeout))
            .await
            .expect("pool");
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS items (
                id INTEGER PRIMARY KEY,
                seq INTEGER NOT NULL UNIQUE,
                name TEXT NOT NULL
            )",
        )
        .execute(&pool)
        .await
        .expect("schema");
        pool
    }

    /// A lone connection (busy timeout 0), for holding locks.
    pub async fn connection(&self) -> SqliteConnection {
        SqliteConnection::connect_with(&self.options(Duration::ZERO))
            .await
            .expect("connection")
    }

    /// Holds the write lock (`BEGIN IMMEDIATE`) on a connection of its own until released.
    /// The holder itself waits (busy timeout 5 s) for any transient lock, so taking the lock
    /// never fails on a loaded machine; only the victims have a busy timeout of 0.
    pub async fn hold_write_lock(&self) -> WriteLock {
        let mut conn = SqliteConnection::connect_with(&self.options(Duration::from_secs(5)))
            .await
            .expect("connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .expect("BEGIN IMMEDIATE");
        WriteLock { conn }
    }
}

pub fn options(path: &Path, busy_timeout: Duration) -> SqliteConnectOptions {
    SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .expect("url")
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(busy_timeout)
}

pub struct WriteLock {
    conn: SqliteConnection,
}

impl WriteLock {
    /// Runs `sql` (a write) in the held transaction, then commits: every transaction whose
    /// snapshot was taken before now then fails `SQLITE_BUSY_SNAPSHOT` when it tries to write.
    pub async fn release_after(mut self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut self.conn)
            .await
            .expect("the lock holder's write");
        self.release().await;
    }

    pub async fn release(mut self) {
        sqlx::query("COMMIT")
            .execute(&mut self.conn)
            .await
            .expect("COMMIT");
    }
}

mod server;
pub use server::{Server, serve};

/// A pooled HTTP/1 client over loopback.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Body>,
    base: String,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl HttpClient {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    pub async fn send(&self, req: Request<Body>) -> Reply {
        let (mut parts, body) = req.into_parts();
        parts.uri = format!("{}{}", self.base, parts.uri).parse().expect("uri");
        let res = self
            .client
            .request(Request::from_parts(parts, body))
            .await
            .expect("request");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    pub async fn post(&self, path: &str, body: impl Into<Bytes>) -> Reply {
        self.send(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body.into()))
                .unwrap(),
        )
        .await
    }
}

/// The bodies `DbError` answers with: the only text its responses ever carry.
pub const DB_ERROR_BODIES: [&str; 4] = [
    "service busy, retry later",
    "conflict",
    "invalid input",
    "internal error",
];

/// Asserts that a response body carries no database detail: it is exactly one of `DbError`'s
/// bodies. (A list of forbidden words cannot be complete: it let
/// `UNIQUE constraint failed: items.seq` through.)
pub fn assert_no_db_detail(body: &str) {
    assert!(
        DB_ERROR_BODIES.contains(&body),
        "response body is not one of DbError's, it may leak database detail: {body:?}"
    );
}

/// The URL of a real database server from the environment variable `var`
/// (`TSR_POSTGRES_URL`, `TSR_MYSQL_URL`), or `None` after saying that the test is skipped
/// ([`skipped`]).
pub fn server_url(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            skipped(test, &format!("set {var} to run"));
            None
        }
    }
}

/// A child process of this test binary running one of its entry points: `name`, the full
/// path of an `#[ignore]`d test that is not a test on its own (a server to kill, another
/// process's writer), run alone with `--ignored --exact`. Its harness output says whether it
/// ran: see [`ChildRan`].
pub fn child_test(name: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().expect("this binary"));
    command.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    command
}

/// What a child's harness said about the entry point it was to run, read line by line from
/// its output: a child whose filter matched nothing (a renamed test) says `running 0 tests`
/// and exits 0, so its parent must ask.
#[derive(Default)]
pub struct ChildRan {
    started: bool,
    passed: bool,
}

impl ChildRan {
    /// Reads one line of the child's output.
    pub fn line(&mut self, line: &str) {
        if line.trim() == "running 1 test" {
            self.started = true;
        }
        if line.contains("test result: ok. 1 passed") {
            self.passed = true;
        }
    }

    /// All of a finished child's output.
    pub fn output(output: &str) -> Self {
        let mut ran = Self::default();
        output.lines().for_each(|l| ran.line(l));
        ran
    }

    /// Panics unless the child started its one entry point.
    pub fn assert_started(&self, name: &str) {
        assert!(
            self.started,
            "the child ran no test: is `{name}` its full name?"
        );
    }

    /// Panics unless the child ran its one entry point and it passed.
    pub fn assert_passed(&self, name: &str) {
        self.assert_started(name);
        assert!(self.passed, "the child's `{name}` did not pass");
    }
}

/// Says that `test` skipped its check, and why, where someone will see it: a `SKIPPED:` line
/// on stderr (libtest shows it only for a failing test), and a line appended to the file
/// `TSR_SKIP_LOG` names, if set: `.ci/run` counts and prints those lines after each test step
/// (and fails on them with `CI_STRICT=1`).
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let line = format!("SKIPPED: {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TSR_SKIP_LOG") {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        // one write per line, in append mode: lines of parallel tests never interleave
        if let Ok(mut log) = log {
            let _ = log.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// A table name no other test, process or earlier run uses: `prefix`, the process id, a
/// per-process counter and the clock.
pub fn unique_table(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// An event's fields by name.
pub type EventFields = std::collections::BTreeMap<String, String>;

/// The events of target `tower_sqlite_retry`, as (message, fields), for tests that check the
/// tracing schema without a full subscriber. Install with
/// `tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()))`.
#[derive(Clone, Default)]
pub struct EventCapture {
    pub events: std::sync::Arc<std::sync::Mutex<Vec<(String, EventFields)>>>,
}

impl EventCapture {
    /// The fields of every event with this message.
    pub fn with_message(&self, message: &str) -> Vec<EventFields> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m == message)
            .map(|(_, f)| f.clone())
            .collect()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for EventCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Visitor<'a>(&'a mut EventFields);
        impl tracing::field::Visit for Visitor<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.insert(field.name().to_owned(), format!("{value:?}"));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.insert(field.name().to_owned(), value.to_owned());
            }
        }
        if event.metadata().target() != "tower_sqlite_retry" {
            return;
        }
        let mut fields = EventFields::new();
        event.record(&mut Visitor(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        self.events.lock().unwrap().push((message, fields));
    }
}

/// Whether a table named by [`unique_table`] was left behind by a test process that is gone
/// (a failed run): its process id no longer exists on this machine. Tables of running
/// processes, this one included, are never stale.
pub fn is_stale_table(name: &str) -> bool {
    let mut parts = name.rsplit('_');
    let (Some(_nanos), Some(_counter), Some(pid)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    match pid.parse::<u32>() {
        Ok(pid) => pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists(),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by the tests against real database servers (`tests/layer/postgres.rs`, `tests/layer/mysql.rs`).

/// Replays that come at once: 1 ms base delay, 5 ms cap, full jitter.
pub fn fast_policy(attempts: u32) -> tower_sqlite_retry::RetryPolicy {
    tower_sqlite_retry::RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .jitter(tower_sqlite_retry::Jitter::Full)
}

/// SQL built with `format!` from table names the tests choose themselves.
pub fn sql(text: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(text)
}

/// What each attempt of a handler met: its number and the retryable code, if any.
pub type Calls = std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<String>)>>>;

/// Records in `calls` the attempt's number and what its result met: nothing, the retryable
/// code, or `other: {error}`.
#[cfg(feature = "sqlx")]
pub fn record(
    calls: &Calls,
    attempt: &tower_sqlite_retry::Attempt,
    result: &Result<impl Sized, sqlx::Error>,
) {
    let code = result.as_ref().err().map(|e| {
        tower_sqlite_retry::DriverError::retryable(e)
            .map_or_else(|| format!("other: {e}"), |r| r.code().to_owned())
    });
    calls.lock().unwrap().push((attempt.number(), code));
}

/// The channels of a paused first attempt: it says when it is ready, then waits for the go.
#[derive(Clone)]
pub struct Pause {
    ready: tokio::sync::mpsc::UnboundedSender<()>,
    go: std::sync::Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<()>>>,
}

impl Pause {
    /// The pause, the receiver of its "ready" and the sender of its "go".
    pub fn new() -> (
        Self,
        tokio::sync::mpsc::UnboundedReceiver<()>,
        tokio::sync::mpsc::UnboundedSender<()>,
    ) {
        let (ready, ready_rx) = tokio::sync::mpsc::unbounded_channel();
        let (go_tx, go) = tokio::sync::mpsc::unbounded_channel();
        let pause = Self {
            ready,
            go: std::sync::Arc::new(tokio::sync::Mutex::new(go)),
        };
        (pause, ready_rx, go_tx)
    }

    pub async fn here(&self) {
        self.ready.send(()).unwrap();
        self.go.lock().await.recv().await.unwrap();
    }
}

/// A handler's state: the pool, the test's table and the attempts' log.
#[derive(Clone)]
pub struct TableState<P> {
    pub pool: P,
    pub table: String,
    pub calls: Calls,
}

/// A handler's state whose first attempt pauses (see [`Pause`]).
#[derive(Clone)]
pub struct PausedState<P> {
    pub pool: P,
    pub table: String,
    pub calls: Calls,
    pub pause: Pause,
}

/// The server's pool and a table of this test's own, dropped with [`DbFixture::drop_table`].
pub struct DbFixture<DB: sqlx::Database> {
    pub url: String,
    pub pool: sqlx::Pool<DB>,
    pub table: String,
}

impl<DB: sqlx::Database> DbFixture<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    /// Connects to the server named by the environment variable `var` (`None`, skipped,
    /// without it), sweeps the stale tables named `sweep_like` (a `LIKE` pattern) that
    /// `list_tables` lists and `drop_stale` drops, then creates a table named after `prefix`
    /// with the statements `schema` gives for its name.
    pub async fn new(
        var: &str,
        test: &str,
        prefix: &str,
        list_tables: &'static str,
        drop_stale: impl Fn(&str) -> String,
        schema: impl FnOnce(&str) -> Vec<String>,
    ) -> Option<Self>
    where
        for<'r> String: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
        usize: sqlx::ColumnIndex<DB::Row>,
    {
        let url = server_url(var, test)?;
        let pool = sqlx::pool::PoolOptions::<DB>::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{var}={url}: {e}"));
        sweep_stale_tables(&pool, list_tables, drop_stale).await;
        let table = unique_table(prefix);
        sqlx::query(sql(format!("DROP TABLE IF EXISTS {table}")))
            .execute(&pool)
            .await
            .unwrap();
        for statement in schema(&table) {
            sqlx::query(sql(statement)).execute(&pool).await.unwrap();
        }
        Some(Self { url, pool, table })
    }

    /// A connection of its own, outside the pool the app uses: the "other client".
    pub async fn connection(&self) -> DB::Connection {
        <DB::Connection as sqlx::Connection>::connect(&self.url)
            .await
            .unwrap()
    }

    /// A handler's state on this pool and table, with an empty log.
    pub fn state(&self) -> TableState<sqlx::Pool<DB>> {
        TableState {
            pool: self.pool.clone(),
            table: self.table.clone(),
            calls: Calls::default(),
        }
    }

    /// A handler's state whose first attempt pauses, the receiver of its "ready" and the
    /// sender of its "go".
    pub fn paused_state(
        &self,
    ) -> (
        PausedState<sqlx::Pool<DB>>,
        tokio::sync::mpsc::UnboundedReceiver<()>,
        tokio::sync::mpsc::UnboundedSender<()>,
    ) {
        let (pause, ready, go) = Pause::new();
        let state = PausedState {
            pool: self.pool.clone(),
            table: self.table.clone(),
            calls: Calls::default(),
            pause,
        };
        (state, ready, go)
    }

    pub async fn drop_table(self) {
        sqlx::query(sql(format!("DROP TABLE IF EXISTS {}", self.table)))
            .execute(&self.pool)
            .await
            .unwrap();
        self.pool.close().await;
    }
}

/// Drops the tables that failed runs of these tests left behind (see [`is_stale_table`]):
/// `list_tables` lists the candidates, `drop_stale` gives the statements that drop one.
async fn sweep_stale_tables<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    list_tables: &'static str,
    drop_stale: impl Fn(&str) -> String,
) where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'r> String: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let names: Vec<String> = sqlx::query_scalar(list_tables)
        .fetch_all(pool)
        .await
        .unwrap();
    for name in names.into_iter().filter(|n| is_stale_table(n)) {
        // Best effort: a table still locked by a dead session's transaction waits for later.
        let _ = sqlx::raw_sql(sql(drop_stale(&name))).execute(pool).await;
    }
}

/// Begins on `writes`, inserts `name` into `items (name)`, and commits in a task of its own;
/// returns once the `COMMIT` went through (the row is in the file, read through `pool`) and the
/// transaction gave its turn back (which it does after it joined the wait for the shared
/// fsync, if it shares one), with the task, which may still wait for its fsync.
pub async fn commit_in_background(
    writes: &tower_sqlite_retry::WritePool,
    pool: &sqlx::SqlitePool,
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
    poll_until(format!("{name}'s COMMIT went through"), async || {
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items")
            .fetch_all(pool)
            .await
            .unwrap();
        names.iter().any(|n| n == name)
    })
    .await;
    // The row can be in the file before the commit joined the fsync's waiters: the turn comes
    // back only after it did.
    poll_until(format!("{name}'s turn given back"), async || {
        writes.stats().is_some_and(|s| s.transactions > given_back)
    })
    .await;
    commit
}

/// Polls `check` every 2 ms until it holds (a condition, not a guess at timing); panics with
/// `what` after 30 s.
pub async fn poll_until(what: impl std::fmt::Display, mut check: impl AsyncFnMut() -> bool) {
    let start = std::time::Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An [`EventCapture`] installed as the default subscriber until the guard drops.
pub fn capture_events() -> (EventCapture, tracing::subscriber::DefaultGuard) {
    use tracing_subscriber::layer::SubscriberExt;
    let capture = EventCapture::default();
    let guard = capture_tracing(tracing_subscriber::registry().with(capture.clone()));
    (capture, guard)
}

/// Asserts that exactly one replay was logged, for this code and error type.
pub fn assert_one_retry(capture: &EventCapture, code: &str, error_type: &str) {
    let retries = capture.with_message("retrying request");
    assert_eq!(retries.len(), 1, "{:?}", capture.events.lock().unwrap());
    assert_eq!(retries[0]["db.response.status_code"], code);
    assert_eq!(retries[0]["error.type"], error_type);
}

/// Serves `app` and posts an empty body to `path` in a task of its own.
pub async fn post_in_background(
    app: Router,
    path: &str,
) -> (Server, tokio::task::JoinHandle<Reply>) {
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    let path = path.to_owned();
    let request = tokio::spawn(async move { client.post(&path, "").await });
    (server, request)
}

/// Asserts the answer without the layer: a `503` without database detail, and without
/// `Retry-After` (`DbError` never invites a retry; the layer does, when it gives up).
pub fn assert_service_unavailable(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!reply.headers.contains_key("retry-after"));
    assert_no_db_detail(&reply.text());
}

/// Posts twice to `/items`, whose handler inserts the same key: `201`, then `409` without
/// database detail, and one call per request (no replay), the second failing with an error
/// that is not retryable.
pub async fn assert_conflict_never_replayed(client: &HttpClient, calls: &Calls) {
    assert_eq!(client.post("/items", "").await.status, StatusCode::CREATED);
    let reply = client.post("/items", "").await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_no_db_detail(&reply.text());
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "one call per request: {calls:?}");
    assert!(calls[1].1.as_deref().unwrap().starts_with("other: "));
}

/// A no-op subscriber that keeps every callsite's interest "sometimes": installed once as the
/// process's global default by [`capture_tracing`].
struct KeepCallsitesAlive;

impl tracing::Subscriber for KeepCallsitesAlive {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Sets `subscriber` as this thread's default, so that the test sees every span and event of
/// the code it runs, whatever other tests of this binary do on other threads meanwhile.
///
/// A thread's own subscriber is not enough alone: tracing caches each callsite's interest
/// process-wide, and a callsite registered on another thread while no subscriber wanted it
/// (or in a race with this one's registration) can be cached as "never", and its events are
/// then lost here too. So a global no-op subscriber whose interest is always "sometimes" is
/// installed once (each event then asks the thread's subscriber), and the cache is rebuilt
/// after this thread's subscriber is set (a callsite registered before the global one).
pub fn capture_tracing<S>(subscriber: S) -> tracing::subscriber::DefaultGuard
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        tracing::subscriber::set_global_default(KeepCallsitesAlive)
            .expect("no other global subscriber in the test binaries");
    });
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    guard
}
