//! Shared test helpers: real SQLite files, a real HTTP server on loopback, a real client, and
//! the contention recipes of DESIGN.md.
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
    pub async fn hold_write_lock(&self) -> WriteLock {
        let mut conn = self.connection().await;
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
    pub async fn release(mut self) {
        sqlx::query("COMMIT")
            .execute(&mut self.conn)
            .await
            .expect("COMMIT");
    }
}

/// Serves `app` on a fresh loopback port; the server stops when the handle drops.
pub struct Server {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(app: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    Server { addr, task }
}

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

/// Asserts that a response body carries no database detail.
pub fn assert_no_db_detail(body: &str) {
    let lower = body.to_lowercase();
    for word in [
        "sqlite", "database", "locked", "busy", "insert", "select", "code", "517", "(5)",
    ] {
        if word == "busy" && lower == "service busy, retry later" {
            continue;
        }
        assert!(
            !lower.contains(word),
            "response body leaks {word:?}: {body:?}"
        );
    }
}

/// The URL of a real database server from the environment variable `var`
/// (`TSR_POSTGRES_URL`, `TSR_MYSQL_URL`), or `None` after printing that the test is skipped.
pub fn server_url(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!("{test}: skipped: set {var} to run");
            None
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
